"""Statistics against independent computations: numpy percentiles, known distributions, A/B CIs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replayproxy.report.stats import (
    bootstrap_quantile_diff,
    grouped_summaries,
    summarize,
)


def test_summary_matches_numpy_and_ignores_nan() -> None:
    rng = np.random.default_rng(3)
    values = rng.lognormal(2, 1, 1001)
    with_nan = np.concatenate([values, [np.nan, np.nan]])
    s = summarize(with_nan)
    assert s.count == 1001
    for q, got in zip((50, 90, 95, 99), (s.p50, s.p90, s.p95, s.p99), strict=True):
        assert got == pytest.approx(np.percentile(values, q))
    assert s.max == values.max() and s.mean == pytest.approx(values.mean())


def test_summary_of_hand_worked_values() -> None:
    s = summarize(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]))
    # linear interpolation: position (n-1)q = 9 * 0.5 = 4.5 -> between 5 and 6
    assert (s.p50, s.max, s.mean, s.count) == (5.5, 10.0, 5.5, 10) and s.p90 == pytest.approx(9.1)


def test_empty_summary_is_null_with_zero_count() -> None:
    s = summarize(np.array([np.nan]))
    assert s.count == 0 and math.isnan(s.p99)
    assert s.to_dict() == {
        "p50": None,
        "p90": None,
        "p95": None,
        "p99": None,
        "max": None,
        "mean": None,
        "count": 0,
    }


def test_grouped_summaries_equal_per_group_numpy() -> None:
    rng = np.random.default_rng(5)
    groups = rng.integers(0, 6, 5000)
    groups[groups == 4] = 5  # group 4 empty
    values = rng.exponential(10, 5000)
    values[::17] = np.nan
    out = grouped_summaries(groups, values, 6)
    for g in range(6):
        mine = values[(groups == g) & np.isfinite(values)]
        if not len(mine):
            assert out[g].count == 0
            continue
        assert out[g].count == len(mine)
        assert out[g].p50 == pytest.approx(np.percentile(mine, 50))
        assert out[g].p99 == pytest.approx(np.percentile(mine, 99))
        assert out[g].max == mine.max() and out[g].mean == pytest.approx(mine.mean())


@pytest.mark.parametrize("max_paired", [10_000, 100])  # paired resampling, and the order-statistic path
def test_bootstrap_ci_covers_known_difference(max_paired: int) -> None:
    # B is A shifted by exactly -5 ms plus independent noise: the population quantile difference is -5.
    rng = np.random.default_rng(11)
    n = 2000
    a = rng.normal(100, 10, n)
    b = a - 5 + rng.normal(0, 1, n)
    p50, p99 = bootstrap_quantile_diff(a, b, (50, 99), seed=1, max_paired=max_paired)
    assert p50.low < -5 < p50.high
    assert p50.excludes_zero and p50.high < 0
    assert p99.low < -5 < p99.high
    assert p50.estimate == pytest.approx(np.quantile(b, 0.5) - np.quantile(a, 0.5))


def test_bootstrap_ci_coverage_over_many_experiments() -> None:
    # Nominal 95%: over 40 independent experiments the CI must cover the true difference (3) most times.
    covered = 0
    for k in range(40):
        rng = np.random.default_rng(100 + k)
        a = rng.exponential(20, 300)
        b = rng.exponential(20, 300) + 3.0  # independent samples; true median difference is 3
        (ci,) = bootstrap_quantile_diff(a, b, (50,), resamples=400, seed=k)
        covered += ci.low <= 3.0 <= ci.high
    assert covered >= 34


def test_bootstrap_ci_contains_zero_when_there_is_no_difference() -> None:
    excluded = 0
    for k in range(20):
        rng = np.random.default_rng(200 + k)
        a = rng.lognormal(3, 0.5, 500)
        b = rng.lognormal(3, 0.5, 500)
        ci50, ci99 = bootstrap_quantile_diff(a, b, (50, 99), resamples=400, seed=k)
        excluded += ci50.excludes_zero
    assert excluded <= 3  # about 1 in 20 by chance


def test_bootstrap_is_seeded_and_checks_lengths() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=300), rng.normal(size=300)
    assert bootstrap_quantile_diff(a, b, (50,), seed=4) == bootstrap_quantile_diff(a, b, (50,), seed=4)
    assert bootstrap_quantile_diff(a, b, (50,), seed=4) != bootstrap_quantile_diff(a, b, (50,), seed=5)
    with pytest.raises(ValueError):
        bootstrap_quantile_diff(a, b[:10], (50,))
    (empty,) = bootstrap_quantile_diff(np.array([]), np.array([]), (50,))
    assert math.isnan(empty.estimate) and not empty.excludes_zero
