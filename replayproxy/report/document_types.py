"""The report document's sections as TypedDicts: `document.build_document` fills them, the
renderers (`sections`, `verdict`, `render_*`, the gate) read them, and mypy checks both sides.

They describe plain dicts, so `--json` writes exactly what it wrote before; keys carry units and a
figure that could not be measured is None (null).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypedDict, cast


class Summary(TypedDict):
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


class PercentileCheck(TypedDict):
    slo: str
    value_ms: float | None
    limit_ms: float
    count: int
    met: bool


class GoodputDoc(TypedDict):
    requests_per_s: float | None
    fraction: float | None
    good: int
    of: int
    percentile_checks: list[PercentileCheck]
    percentiles_met: bool
    not_applicable: int  # successful requests with no TPOT/ITL to judge


class Breakdowns(TypedDict):
    input_length: list[dict[str, Any]]
    endpoint: list[dict[str, Any]]
    window_10s: list[dict[str, Any]]


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
    options: dict[str, Any]
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
    input_tokens: Summary
    output_tokens: Summary
    output_tokens_from_usage_share: float | None
    ttft_ms: Summary
    tpot_ms: Summary
    itl_ms: Summary
    itl_unit: str
    e2e_ms: Summary
    schedule_lag_ms: Summary
    ttft_from_scheduled_ms: Summary
    e2e_from_scheduled_ms: Summary
    exact_input_share: float | None
    exact_input_count: int
    exact_output_share: float | None
    exact_output_count: int
    goodput: GoodputDoc | None
    telemetry: dict[str, Any] | None
    gpu: dict[str, Any] | None
    trace_prefix_reuse: float | None
    prefix_cache: dict[str, Any] | None
    sessions: dict[str, Any] | None
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
    ttft_ms: Summary
    tpot_ms: Summary
    e2e_ms: Summary
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
    max_rate_under_slo: float | None
    best_speed_meeting_slo: float | None
    max_error_rate: float


class VerdictDoc(TypedDict):
    """The report's opening: the lines every renderer prints first, and the decision as data."""

    lines: list[str]
    candidates: list[dict[str, Any]]  # one per candidate; its goodput keys only with an SLO
    winner: str | None
    versus: str | None
    metric: str
    margin: dict[str, Any] | None  # an interval, or goodput against none
    noise: str  # "measured" (repetitions) or "unknown"
    warnings: list[str]


class Document(TypedDict):
    """The whole report, in the order `--json` writes it (schema in docs/report.md)."""

    verdict: VerdictDoc
    schema: str
    slo: SloSection | None
    runs: list[RunDoc]
    comparisons: list[dict[str, Any]]
    sweeps: list[SweepDoc]
    contracts: list[dict[str, Any]]
    warnings: list[str]


# The Summary-valued figures of a run by key, for tables that loop over them (mypy checks each key).
SUMMARIES: dict[str, Callable[[RunDoc], Summary]] = {
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


def summary_of(run: RunDoc, key: str) -> Summary:
    """A run's distribution by key ("ttft_ms", "schedule_lag_ms", ...); KeyError for others."""
    return SUMMARIES[key](run)


def stat(summary: Summary, name: str) -> float | int | None:
    """One statistic by name ("p99", "count", ...), for tables that loop over `stats.STAT_NAMES`."""
    return cast(Mapping[str, float | int | None], summary)[name]
