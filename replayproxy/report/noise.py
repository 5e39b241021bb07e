"""Intervals that include run-to-run noise: a hierarchical bootstrap over repetitions, then requests.

Three replays of one trace against one unchanged engine can differ more between themselves than two
engines differ, so resampling requests within one run understates the uncertainty. Each bootstrap
draw here first resamples the candidate's runs (with replacement), then each drawn run's requests;
the statistic is taken over the drawn runs (pooled goodput, or the mean of per-run quantiles). With
one run per candidate only the request level is left, and the run-to-run noise is unknown.

Both levels are drawn in closed form, so a draw costs O(runs), not O(requests): a run's resampled
count of good requests is Binomial(n, good / n), and a resampled q-quantile of n sorted values is
x_(J), J = ceil(n U), U ~ Beta(r, n - r + 1) (the order-statistic bootstrap; see stats.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from replayproxy.report.stats import Interval

CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class RunCount:
    """One run's goodput inputs: requests meeting the SLO, all requests, and the run's duration."""

    good: int
    total: int
    duration_s: float

    @property
    def rate(self) -> float:
        return self.good / self.duration_s if self.duration_s > 0 else math.nan


def pooled_rate(runs: Sequence[RunCount]) -> float:
    duration = sum(r.duration_s for r in runs)
    return sum(r.good for r in runs) / duration if duration > 0 else math.nan


def spread(values: Sequence[float]) -> float | None:
    """Range between repetitions (max - min); None with fewer than two runs (noise unknown)."""
    known = [v for v in values if math.isfinite(v)]
    return max(known) - min(known) if len(known) >= 2 else None


def _run_draws(k: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of the runs each draw resamples, shape (resamples, k)."""
    return rng.integers(0, k, size=(resamples, k))


def _drawn_good(
    runs: Sequence[RunCount], resamples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Each draw's resampled runs (indices, shape (resamples, k)) and their resampled good counts."""
    good = np.array([r.good for r in runs], dtype=np.int64)
    total = np.array([r.total for r in runs], dtype=np.int64)
    chosen = _run_draws(len(runs), resamples, rng)
    share = np.where(total > 0, good / np.maximum(total, 1), 0.0)
    return chosen, rng.binomial(total[chosen], share[chosen])


def goodput_draws(runs: Sequence[RunCount], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap draws of the pooled goodput rate (good requests per second) of one candidate."""
    chosen, drawn_good = _drawn_good(runs, resamples, rng)
    duration = np.array([r.duration_s for r in runs], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates: np.ndarray = drawn_good.sum(axis=1) / duration[chosen].sum(axis=1)
    return rates


def share_draws(runs: Sequence[RunCount], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap draws of the pooled share good / total (e.g. the SLO attainment, the error rate)."""
    chosen, drawn_good = _drawn_good(runs, resamples, rng)
    total = np.array([r.total for r in runs], dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares: np.ndarray = drawn_good.sum(axis=1) / total[chosen].sum(axis=1)
    return shares


def mean_draws(runs: Sequence[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap draws of the mean over runs of each run's mean; a run's resampled mean is drawn from
    its normal approximation (mean, sd / sqrt(n)), which a request-level bootstrap converges to."""
    per_run = np.empty((len(runs), resamples))
    for i, v in enumerate(runs):
        finite = v[np.isfinite(v)]
        if not len(finite):
            per_run[i] = np.nan
            continue
        sd = float(finite.std(ddof=1)) if len(finite) > 1 else 0.0
        per_run[i] = finite.mean() + rng.standard_normal(resamples) * sd / math.sqrt(len(finite))
    chosen = _run_draws(len(runs), resamples, rng)
    means: np.ndarray = per_run[chosen, np.arange(resamples)[:, None]].mean(axis=1)
    return means


def quantile_draws(
    runs: Sequence[np.ndarray], quantile: float, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap draws of the mean over runs of each run's q-quantile (q in [0, 1])."""
    sorted_runs = [np.sort(v[np.isfinite(v)]) for v in runs]
    per_run = np.empty((len(runs), resamples))
    for i, values in enumerate(sorted_runs):
        n = len(values)
        if not n:
            per_run[i] = np.nan
            continue
        rank = min(max(int(np.rint(quantile * (n - 1))) + 1, 1), n)
        u = rng.beta(rank, n - rank + 1, size=resamples)
        per_run[i] = values[np.clip(np.ceil(u * n).astype(np.int64) - 1, 0, n - 1)]
    chosen = _run_draws(len(runs), resamples, rng)
    means: np.ndarray = per_run[chosen, np.arange(resamples)[:, None]].mean(axis=1)
    return means


def run_quantiles(runs: Sequence[np.ndarray], quantile: float) -> list[float]:
    out = []
    for v in runs:
        finite = v[np.isfinite(v)]
        out.append(float(np.quantile(finite, quantile)) if len(finite) else math.nan)
    return out


def interval(estimate: float, draws: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    finite = draws[np.isfinite(draws)]
    if not math.isfinite(estimate) or len(finite) < len(draws) * 0.5:
        return Interval(estimate, math.nan, math.nan)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return Interval(estimate, float(low), float(high))


def goodput_ratio(
    a: Sequence[RunCount], b: Sequence[RunCount], *, resamples: int = 1000, seed: int = 0
) -> Interval:
    """B's pooled goodput over A's, with an interval over runs and requests."""
    rng = np.random.default_rng(seed)
    estimate_a, estimate_b = pooled_rate(a), pooled_rate(b)
    estimate = estimate_b / estimate_a if estimate_a > 0 else math.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        draws = goodput_draws(b, resamples, rng) / goodput_draws(a, resamples, rng)
    return interval(estimate, np.where(np.isfinite(draws), draws, np.nan))


def quantile_difference(
    a: Sequence[np.ndarray],
    b: Sequence[np.ndarray],
    quantile: float,
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> Interval:
    """Mean-over-runs q-quantile of B minus A's, with an interval over runs and requests."""
    rng = np.random.default_rng(seed)
    estimate = float(np.mean(run_quantiles(b, quantile)) - np.mean(run_quantiles(a, quantile)))
    draws = quantile_draws(b, quantile, resamples, rng) - quantile_draws(a, quantile, resamples, rng)
    return interval(estimate, draws)


def clear(difference: Interval, null: float, spreads: Sequence[float | None]) -> bool:
    """A difference is clear when its interval excludes the null and it exceeds every measured
    run-to-run spread (a difference smaller than repetitions of one config differ is noise)."""
    if not (math.isfinite(difference.low) and math.isfinite(difference.high)):
        return False
    if difference.low <= null <= difference.high:
        return False
    return all(s is None or abs(difference.estimate - null) > s for s in spreads)


Judgement = Literal["pass", "fail", "inconclusive"]


def judge(figure: Interval, holds: Callable[[float], bool]) -> Judgement:
    """A limit against an interval: kept when the whole interval keeps it, crossed when the whole
    interval breaks it, and otherwise not decided by these runs (more repetitions narrow it)."""
    if not (math.isfinite(figure.low) and math.isfinite(figure.high)):
        return "inconclusive"
    kept = holds(figure.low), holds(figure.high)
    if all(kept):
        return "pass"
    return "fail" if not any(kept) else "inconclusive"
