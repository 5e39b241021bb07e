"""The report's decision sections, typed: the paired comparisons, each candidate's contract and
the verdict (its candidates and margin). `document_types.Document` holds them; the comparison and
candidate sections are frozen dataclasses whose `to_json` writes the published layout, one key per
metric and quantile (`ttft.p50_diff_ms`) and goodput keys only with an SLO (see document_types).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict


class IntervalDoc(TypedDict):
    """A point estimate with its bootstrap 95% interval (`stats.Interval.to_dict`)."""

    estimate: float | None
    ci95_low: float | None
    ci95_high: float | None


class RunSpread(TypedDict):
    """A quantile's range between A's repetitions and between B's; None with one run."""

    a: float | None
    b: float | None


@dataclass(frozen=True, slots=True)
class QuantileComparisonDoc:
    diff_ms: IntervalDoc  # quantile(B) - quantile(A), mean over runs
    run_spread_ms: RunSpread
    verdict: str  # "B is faster", "B is slower", "no clear difference" or "not measured"


@dataclass(frozen=True, slots=True)
class MetricComparisonDoc:
    pairs: int  # pairs of the first runs where both measured the metric
    median_ratio_b_over_a: float | None
    share_faster_b: float | None
    quantiles: dict[int, QuantileComparisonDoc]  # 50 -> the p50 figures, ...

    def to_json(self) -> dict[str, object]:
        """Published with one key per quantile and figure: `p50_diff_ms` ... `p99_verdict`."""
        by_quantile = self.quantiles.items()
        return {
            "pairs": self.pairs,
            "median_ratio_b_over_a": self.median_ratio_b_over_a,
            "share_faster_b": self.share_faster_b,
            **{f"p{q}_diff_ms": figures.diff_ms for q, figures in by_quantile},
            **{f"p{q}_run_spread_ms": figures.run_spread_ms for q, figures in by_quantile},
            **{f"p{q}_verdict": figures.verdict for q, figures in by_quantile},
        }


@dataclass(frozen=True, slots=True)
class ComparisonDoc:
    """Candidate B against candidate A, paired by trace index."""

    a: str
    b: str
    runs_a: int
    runs_b: int
    run_to_run_noise: str  # "measured" (both repeated) or "unknown"
    common_requests: int
    only_a: int
    only_b: int
    metrics: dict[str, MetricComparisonDoc]  # "ttft", "e2e"

    def to_json(self) -> dict[str, object]:
        """Published with each metric as a key of its own (`comparisons[0].ttft`)."""
        return {
            "a": self.a,
            "b": self.b,
            "runs_a": self.runs_a,
            "runs_b": self.runs_b,
            "run_to_run_noise": self.run_to_run_noise,
            "common_requests": self.common_requests,
            "only_a": self.only_a,
            "only_b": self.only_b,
            **self.metrics,
        }


class GpuDoc(TypedDict):
    """One GPU as the replayer found it (`nvidia-smi` names, memory with its unit, driver)."""

    name: str
    memory_total: str
    driver: str


class ContractDoc(TypedDict):
    """The conditions one candidate was measured under, from its first run's header."""

    label: str
    engine_version: str
    model: str
    max_model_len: int | None
    engine_config: dict[str, object]  # as the engine published it; vLLM and SGLang name keys apart
    gpus: list[GpuDoc]
    engine_args: str
    note: str
    warmup: dict[str, object]  # the warm-up the replayer sent, e.g. {"requests": 8}
    runs: int
    cache_reset: str  # "ok", "skipped", "failed: ...", or "no reset action"
    prompt_lengths: str  # "exact", or "approximate: why" when any run's prompts were not exact


@dataclass(frozen=True, slots=True)
class CandidateGoodput:
    requests_per_s: float | None  # pooled over the candidate's runs
    fraction: float | None
    run_range: tuple[float | None, float | None] | None  # lowest and highest run's rate; one run: None
    requests: int  # units counted: requests, or sessions when `unit` is "sessions"
    unit: str = "req"  # "sessions" under a per-session (makespan) clause: rates are sessions/s


@dataclass(frozen=True, slots=True)
class CandidateDoc:
    """One candidate's line of the verdict."""

    label: str
    runs: int
    goodput: CandidateGoodput | None  # None without an SLO
    ttft_p50_ms: float | None  # mean over its runs

    def to_json(self) -> dict[str, object]:
        """Published flat, the goodput figures as `goodput_*` keys present only with an SLO; under a
        per-session clause the rate and count are `goodput_sessions_per_s` and `sessions`."""
        out: dict[str, object] = {"label": self.label, "runs": self.runs}
        if (g := self.goodput) is not None:
            sessions = g.unit == "sessions"
            out["goodput_sessions_per_s" if sessions else "goodput_requests_per_s"] = g.requests_per_s
            out["goodput_fraction"] = g.fraction
            out["goodput_run_range"] = list(g.run_range) if g.run_range is not None else None
            out["sessions" if sessions else "requests"] = g.requests
        out["ttft_p50_ms"] = self.ttft_p50_ms
        return out


class GoodputOverNone(TypedDict):
    """The winner's margin when the other candidate meets the SLO for no request."""

    goodput_over_none: float  # req/s (sessions/s under a per-session clause)


class VerdictDoc(TypedDict):
    """The report's opening: the lines every renderer prints first, and the decision as data."""

    lines: list[str]
    candidates: list[CandidateDoc]
    winner: str | None
    versus: str | None
    metric: str  # "goodput" or "ttft_p50"
    margin: IntervalDoc | GoodputOverNone | None  # B/A goodput ratio or TTFT p50 difference; None: no pair
    noise: str  # "measured" (repetitions) or "unknown"
    warnings: list[str]
