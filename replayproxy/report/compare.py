"""Comparison of two candidates (each one or more runs of one trace): intervals with run-to-run noise.

Requests pair by their trace index between the candidates' first runs, for the descriptive figures
(median B/A ratio, share faster; only pairs where both sides succeeded and measured the figure).
The p50 / p99 differences are the mean-over-runs quantile of B minus A's, with a hierarchical
bootstrap interval (runs, then requests: report.noise). "B is faster" is said only when that
interval excludes zero and the difference exceeds the spread between either candidate's
repetitions; with one run per candidate the run-to-run noise is unknown and the comparison says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from replayproxy.report import noise
from replayproxy.report.runs import Run
from replayproxy.report.stats import Interval

COMPARED = ("ttft", "e2e")
QUANTILES = (50, 99)


@dataclass(frozen=True, slots=True)
class MetricComparison:
    metric: str
    pairs: int  # pairs of the first runs where both measured the metric
    median_ratio: float  # median over pairs of B / A
    share_faster_b: float  # share of pairs where B < A
    diffs: dict[int, Interval]  # quantile -> interval of quantile(B) - quantile(A), ms
    spreads: dict[int, tuple[float | None, float | None]]  # quantile -> run-to-run range of A, of B

    def verdict(self, quantile: int) -> str:
        if not self.pairs:
            return "not measured"
        if not noise.clear(self.diffs[quantile], 0.0, self.spreads[quantile]):
            return "no clear difference"
        return "B is faster" if self.diffs[quantile].estimate < 0 else "B is slower"


@dataclass(frozen=True, slots=True)
class Comparison:
    a: str
    b: str
    common: int  # trace indices present in both first runs
    only_a: int
    only_b: int
    metrics: tuple[MetricComparison, ...]
    runs_a: int = 1
    runs_b: int = 1

    @property
    def noise_known(self) -> bool:
        return self.runs_a > 1 and self.runs_b > 1


def _values(run: Run, metric: str) -> np.ndarray:
    return {"ttft": run.measures.ttft_ms, "e2e": run.measures.e2e_ms}[metric]


def compare(a: list[Run], b: list[Run], *, resamples: int = 1000, seed: int = 0) -> Comparison:
    """Compare candidate `b` with candidate `a` (each a list of repetitions) on TTFT and E2E."""
    ia, ib = a[0].measures.requests.index, b[0].measures.requests.index
    _, pos_a, pos_b = np.intersect1d(ia, ib, assume_unique=False, return_indices=True)
    metrics = []
    for k, metric in enumerate(COMPARED):
        va, vb = _values(a[0], metric)[pos_a], _values(b[0], metric)[pos_b]
        both = np.isfinite(va) & np.isfinite(vb)
        va, vb = va[both], vb[both]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = vb / va
        ratios = ratios[np.isfinite(ratios)]
        runs_a = [_values(r, metric) for r in a]
        runs_b = [_values(r, metric) for r in b]
        diffs, spreads = {}, {}
        for q in QUANTILES:
            diffs[q] = noise.quantile_difference(
                runs_a, runs_b, q / 100, resamples=resamples, seed=seed + 10 * k + q
            )
            spreads[q] = (
                noise.spread(noise.run_quantiles(runs_a, q / 100)),
                noise.spread(noise.run_quantiles(runs_b, q / 100)),
            )
        metrics.append(
            MetricComparison(
                metric=metric,
                pairs=len(va),
                median_ratio=float(np.median(ratios)) if len(ratios) else math.nan,
                share_faster_b=float(np.mean(vb < va)) if len(va) else math.nan,
                diffs=diffs,
                spreads=spreads,
            )
        )
    common = len(pos_a)
    return Comparison(
        a[0].label,
        b[0].label,
        common,
        len(np.unique(ia)) - common,
        len(np.unique(ib)) - common,
        tuple(metrics),
        len(a),
        len(b),
    )


def comparable(a: Run, b: Run) -> bool:
    """Requests pair only between runs of the same trace (same digest; the baseline is the trace itself)."""
    return bool(a.trace_digest and a.trace_digest == b.trace_digest)
