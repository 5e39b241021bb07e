"""The report document's sections, typed: `document.build_document` fills them, the renderers
(`sections`, `verdict`, `render_*`, the gate) read them, and mypy checks both sides.

Most sections are TypedDicts over the plain dicts `--json` writes; keys carry units and a figure
that could not be measured is None (null). Where the published layout spells a key per metric or
per quantile (`ttft.p50_diff_ms`) or only with an SLO (`goodput_fraction`), the section is a frozen
dataclass holding a mapping instead, and its `to_json` writes the published layout (render_json).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypedDict, cast, runtime_checkable

from replayproxy.report.decision_types import ComparisonDoc, ContractDoc, VerdictDoc


@runtime_checkable
class Published(Protocol):
    """A typed section whose JSON layout differs from its attributes; render_json calls `to_json`."""

    def to_json(self) -> Mapping[str, object]: ...


class SummaryDoc(TypedDict):
    """A distribution (`stats.Summary.to_dict`): the contract's percentiles, mean and count."""

    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None
    mean: float | None
    count: int


class Errors(TypedDict):
    count: int
    rate: float | None
    by_class: dict[str, int]


class Partial(TypedDict):
    """An interrupted run: when it stopped and how many requests it cut off."""

    stopped_after_s: float | None
    cancelled: int


class Concurrency(TypedDict):
    mean: float | None
    peak: int | None


class PercentileCheckDoc(TypedDict):
    slo: str
    value_ms: float | None
    limit_ms: float
    count: int
    met: bool


class SessionGoodputDoc(TypedDict):
    """Sessions meeting a per-session (makespan) clause with every request of them good."""

    sessions_per_s: float | None
    fraction: float | None
    good: int
    of: int


class GoodputDoc(TypedDict):
    requests_per_s: float | None
    fraction: float | None
    good: int
    of: int
    percentile_checks: list[PercentileCheckDoc]
    percentiles_met: bool
    not_applicable: int  # successful requests with no TPOT/ITL to judge
    sessions: SessionGoodputDoc | None  # None unless the SLO has a per-session clause


class GroupDoc(TypedDict):
    """One group of a breakdown (an input-length bucket, an endpoint): its requests and latency."""

    name: str
    requests: int
    errors: int
    ttft_ms: SummaryDoc
    tpot_ms: SummaryDoc
    e2e_ms: SummaryDoc


class WindowDoc(GroupDoc):
    """A 10 s window; `--json` writes its two keys after `errors`."""

    start_s: float
    arrival_rate_per_s: float


class Breakdowns(TypedDict):
    input_length: list[GroupDoc]
    endpoint: list[GroupDoc]
    window_10s: list[WindowDoc]


class TelemetryFigures(TypedDict, total=False):
    """The engine's gauges and counters over a run; a key only where the engine exposed the metric."""

    kv_usage_peak: float  # share of the KV cache, 0..1
    kv_usage_mean: float
    waiting_peak: float
    waiting_time_share: float | None  # None with fewer than two samples
    running_peak: float
    preemptions: float
    preemptions_per_1k_requests: float | None  # None for a run of no requests
    prefix_hit_rate: float


@dataclass(frozen=True, slots=True)
class EngineLatencyDoc:
    """What one engine histogram observed during the run, in ms: the exact mean, and per quantile
    only the bucket holding it (an interpolated value would look exact; `report.telemetry`)."""

    count: float
    mean: float | None
    buckets: dict[int, tuple[float, float | None]]  # 50 -> (lower, upper); upper None past the last bound

    def to_json(self) -> dict[str, object]:
        """Published with a key per quantile: `p50_bucket: [lower, upper]`."""
        return {
            "count": self.count,
            "mean": self.mean,
            **{f"p{q}_bucket": [low, high] for q, (low, high) in self.buckets.items()},
        }


@dataclass(frozen=True, slots=True)
class TelemetryDoc:
    """The engine's own view of one run, from the replayer's telemetry record (`report.telemetry`)."""

    source: str  # the metrics URL polled
    samples: int
    found: dict[str, object]  # canonical name -> the engine's metric it was read from
    figures: TelemetryFigures
    engine_latency_ms: dict[str, EngineLatencyDoc]  # "ttft", "itl", "e2e" where the engine has them

    def to_json(self) -> dict[str, object]:
        """Published flat: the figures, then one `engine_<name>_ms` key per histogram."""
        return {
            "source": self.source,
            "samples": self.samples,
            "found": self.found,
            **self.figures,
            **{f"engine_{name}_ms": latency for name, latency in self.engine_latency_ms.items()},
        }


class GpuSamplesDoc(TypedDict):
    """A run's `--gpu-sampler` lines reduced (`gpu.summarize`); None where not sampled."""

    samples: int
    unparsed: int  # lines that did not parse, counted rather than guessed at
    gpus: int | None
    memory_used_peak_mib: float | None
    utilization_mean_pct: float | None
    command: str


class PrefixCacheDoc(TypedDict):
    """Hits the trace implies at the engine's block size beside the engine's counter (`cache`)."""

    engine_block_size: int | None
    implied_hit_tokens: int | None
    engine_hit_tokens: int | None
    engine_query_tokens: int | None
    engine_over_implied: float | None
    trace_shared_tokens: int | None
    reply_cached_tokens: int | None  # summed over the replies that reported them (usage)
    replies_reporting_cached: int  # how many successful replies did


class ThinkFigures(TypedDict):
    """Think time as replayed against the recorded one, and turns sent before their previous ended."""

    later_turns: int
    overlapping_turns: int
    think_ms: SummaryDoc
    think_error_ms: SummaryDoc
    think_abs_error_ms: SummaryDoc


class Quantiles(TypedDict):
    """The two percentiles a small per-group table shows, and how many values they cover."""

    p50: float | None
    p95: float | None
    count: int


class DepthRow(TypedDict):
    """Requests at one depth bucket of the session graph (`turn`): per-step latency by depth."""

    depth: str  # "0", "1", "2-3", ..., "64+"
    requests: int
    ttft_ms: Quantiles
    e2e_ms: Quantiles


class SessionsDoc(ThinkFigures):
    """Per-session figures of a run of multi-turn sessions (`sessions.session_doc`)."""

    sessions: int
    multi_turn_sessions: int
    turns_per_session: SummaryDoc
    session_s: SummaryDoc  # the makespan: first request's send -> last request's end
    finish_from_schedule_s: SummaryDoc | None  # None when some turn had no scheduled time
    by_depth: list[DepthRow] | None  # None when the result file has no `turn` column


class CachedShareDoc(TypedDict):
    """Per call, the share of its prompt the engine said it served from cache (cached / prompt
    tokens), and, with a baseline trace, the same call's share as recorded beside it."""

    per_call: SummaryDoc  # successful calls that reported cached tokens
    recorded: SummaryDoc | None  # the same calls in the baseline trace; None without one
    difference: SummaryDoc | None  # per call: this run's share - the recorded share


class ShardClockDoc(TypedDict):
    """One shard of a sharded run: its schedule lag and what it measured of its clock
    (replay.clock_offset); None where not measured."""

    shard: str
    lag_p99_ms: float | None
    clock_offset_ms: float | None  # its wall clock minus the reference's (positive: it started early)
    clock_offset_bound_ms: float | None  # the offset is within this of the truth
    clock_reference: str | None
    ready_before_start_s: float | None
    wall_drift_ms: float | None


class RunDoc(TypedDict):
    """One run's figures, in the order `--json` writes them."""

    label: str
    name: str
    repetition: int
    repetitions: int
    kind: str
    paths: list[str]
    target: str
    model: str
    trace_digest: str
    speed: float | None
    shards: int
    token_timing: str
    options: dict[str, object]  # the replay options as the run header recorded them
    requests: int
    succeeded: int
    partial: Partial | None
    errors: Errors
    duration_s: float | None
    offered_requests_per_s: float | None
    requests_per_s: float | None
    output_tokens_per_s: float | None
    input_tokens_per_s: float | None
    timed_requests: int
    concurrency: Concurrency
    input_tokens: SummaryDoc
    output_tokens: SummaryDoc
    output_tokens_from_usage_share: float | None
    ttft_ms: SummaryDoc
    tpot_ms: SummaryDoc
    itl_ms: SummaryDoc
    itl_unit: str
    e2e_ms: SummaryDoc
    schedule_lag_ms: SummaryDoc
    ttft_from_scheduled_ms: SummaryDoc
    e2e_from_scheduled_ms: SummaryDoc
    exact_input_share: float | None
    exact_input_count: int
    exact_output_share: float | None
    exact_output_count: int
    goodput: GoodputDoc | None
    telemetry: TelemetryDoc | None
    gpu: GpuSamplesDoc | None
    trace_prefix_reuse: float | None
    prefix_cache: PrefixCacheDoc | None
    sessions: SessionsDoc | None
    cached_share: CachedShareDoc | None  # None when no call reported cached tokens
    shard_clocks: list[ShardClockDoc]
    breakdowns: Breakdowns


class SloClause(TypedDict):
    metric: str
    percentile: float | None  # None: every request must meet the limit
    limit_ms: float
    text: str


class SloSection(TypedDict):
    spec: str
    clauses: list[SloClause]


class StepDoc(TypedDict):
    """One load of a sweep."""

    speed: float
    concurrency_limit: int | None
    offered_requests_per_s: float | None
    load: str
    slo_crossed: list[str]
    label: str
    requests: int
    requests_per_s: float | None
    output_tokens_per_s: float | None
    mean_concurrency: float | None
    ttft_ms: SummaryDoc
    tpot_ms: SummaryDoc
    e2e_ms: SummaryDoc
    errors: int
    error_rate: float | None
    goodput: GoodputDoc | None


class SweepDoc(TypedDict):
    """Runs of one candidate at rising loads, and where it bent."""

    label: str
    target: str
    model: str
    trace_digest: str
    closed_loop: bool
    steps: list[StepDoc]
    knee_speed: float | None
    broke_at_speed: float | None
    operating_point: StepDoc | None
    saturated_at_lowest_step: bool
    break_reasons: list[str]
    knee: str
    noise: list[str]  # bends not read as saturation: not repeated by a higher load, or client-bound
    max_rate_under_slo: float | None
    best_speed_meeting_slo: float | None
    max_error_rate: float


class FidelityFigureDoc(TypedDict):
    """One figure of a replay against production's own trace; differences relative to production."""

    figure: str  # TTFT, TPOT, E2E
    quantile: int
    production_ms: float | None
    replay_ms: float | None  # mean over the replays of each one's quantile
    difference: float | None  # (replay - production) / production
    low: float | None  # its 95 % interval (repetitions, then requests)
    high: float | None
    replay_spread: float | None  # range between the replays, relative to production; None with one
    within_noise: bool


class FidelityDifferenceDoc(TypedDict):
    """A known difference between the replay and production's recording, with its measured size."""

    name: str
    size: str
    value: float | None
    effect: str  # "heavier" / "lighter": which way it pushes the replay's figures; "" negligible


class FidelityDoc(TypedDict):
    """How faithfully one candidate's replays of a trace reproduced production (report.fidelity)."""

    candidate: str
    runs: int
    figures: list[FidelityFigureDoc]
    differences: list[FidelityDifferenceDoc]
    reproduces: bool
    statement: list[str]


class Document(TypedDict):
    """The whole report, in the order `--json` writes it (schema in docs/report.md)."""

    verdict: VerdictDoc
    fidelity: list[FidelityDoc]  # replays of the baseline's own trace against it; [] otherwise
    schema: str
    slo: SloSection | None
    runs: list[RunDoc]
    comparisons: list[ComparisonDoc]
    sweeps: list[SweepDoc]
    contracts: list[ContractDoc]
    warnings: list[str]


# The SummaryDoc-valued figures of a run by key, for tables that loop over them (mypy checks each key).
SUMMARIES: dict[str, Callable[[RunDoc], SummaryDoc]] = {
    "input_tokens": lambda r: r["input_tokens"],
    "output_tokens": lambda r: r["output_tokens"],
    "ttft_ms": lambda r: r["ttft_ms"],
    "tpot_ms": lambda r: r["tpot_ms"],
    "itl_ms": lambda r: r["itl_ms"],
    "e2e_ms": lambda r: r["e2e_ms"],
    "schedule_lag_ms": lambda r: r["schedule_lag_ms"],
    "ttft_from_scheduled_ms": lambda r: r["ttft_from_scheduled_ms"],
    "e2e_from_scheduled_ms": lambda r: r["e2e_from_scheduled_ms"],
}


def summary_of(run: RunDoc, key: str) -> SummaryDoc:
    """A run's distribution by key ("ttft_ms", "schedule_lag_ms", ...); KeyError for others."""
    return SUMMARIES[key](run)


def stat(summary: SummaryDoc, name: str) -> float | int | None:
    """One statistic by name ("p99", "count", ...), for tables that loop over `stats.STAT_NAMES`."""
    return cast(Mapping[str, float | int | None], summary)[name]
