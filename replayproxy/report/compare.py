"""Paired comparison of two runs of one trace: per-request ratios, share faster, bootstrap CIs.

Requests pair by their trace index; only pairs where both sides succeeded and measured the
figure are compared (the comparison states how many pairs it covers and how many were left out).
"B is faster" is said only when the 95% CI of the p50 (or p99) difference excludes zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from replayproxy.report.runs import Run
from replayproxy.report.stats import Interval, bootstrap_quantile_diff

COMPARED = ("ttft", "e2e")
QUANTILES = (50, 99)


@dataclass(frozen=True, slots=True)
class MetricComparison:
    metric: str
    pairs: int  # pairs where both runs measured the metric
    median_ratio: float  # median over pairs of B / A
    share_faster_b: float  # share of pairs where B < A
    diffs: dict[int, Interval]  # quantile -> CI of quantile(B) - quantile(A), ms

    def verdict(self, quantile: int) -> str:
        ci = self.diffs[quantile]
        if not self.pairs:
            return "not measured"
        if not ci.excludes_zero:
            return "no clear difference"
        return "B is faster" if ci.high < 0 else "B is slower"


@dataclass(frozen=True, slots=True)
class Comparison:
    a: str
    b: str
    common: int  # trace indices present in both runs
    only_a: int
    only_b: int
    metrics: tuple[MetricComparison, ...]


def _values(run: Run, metric: str) -> np.ndarray:
    return {"ttft": run.measures.ttft_ms, "e2e": run.measures.e2e_ms}[metric]


def compare(a: Run, b: Run, *, resamples: int = 1000, seed: int = 0) -> Comparison:
    """Pair requests of `a` and `b` by trace index and compare TTFT and E2E."""
    ia, ib = a.measures.requests.index, b.measures.requests.index
    _, pos_a, pos_b = np.intersect1d(ia, ib, assume_unique=False, return_indices=True)
    metrics = []
    for k, metric in enumerate(COMPARED):
        va, vb = _values(a, metric)[pos_a], _values(b, metric)[pos_b]
        both = np.isfinite(va) & np.isfinite(vb)
        va, vb = va[both], vb[both]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = vb / va
        ratios = ratios[np.isfinite(ratios)]
        diffs = bootstrap_quantile_diff(va, vb, QUANTILES, resamples=resamples, seed=seed + k)
        metrics.append(
            MetricComparison(
                metric=metric,
                pairs=len(va),
                median_ratio=float(np.median(ratios)) if len(ratios) else math.nan,
                share_faster_b=float(np.mean(vb < va)) if len(va) else math.nan,
                diffs=dict(zip(QUANTILES, diffs, strict=True)),
            )
        )
    common = len(pos_a)
    return Comparison(
        a.label, b.label, common, len(np.unique(ia)) - common, len(np.unique(ib)) - common, tuple(metrics)
    )


def comparable(a: Run, b: Run) -> bool:
    """Requests pair only between runs of the same trace (same digest; the baseline is the trace itself)."""
    return bool(a.trace_digest and a.trace_digest == b.trace_digest)
