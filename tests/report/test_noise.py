"""Run-to-run noise in every interval: repetitions are resampled as well as requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replayproxy.report import noise
from replayproxy.report.compare import compare
from replayproxy.report.runs import Run, load_runs
from replayproxy.report.stats import Interval
from tests.report.helpers import synthetic_run


def _runs(tmp_path: Path, label: str, medians_ms: list[float], seed: int) -> list[Run]:
    """One run per median: 400 requests of log-normal TTFT around it."""
    rng = np.random.default_rng(seed)
    paths = []
    for i, median in enumerate(medians_ms):
        ttft = median * rng.lognormal(0, 0.3, 400)
        paths.append(synthetic_run(tmp_path / f"{label}{i}.rpr", ttft, ttft + 200, label=label))
    return load_runs(paths)


def test_noisy_repetitions_declare_no_winner(tmp_path: Path) -> None:
    # Three replays of one unchanged engine gave TTFT p50 of about 30, 225 and 160 ms; the other
    # candidate's runs fall in the same range. Within one run each pair would look "clearly" apart.
    a = _runs(tmp_path, "A", [30, 225, 160], seed=1)
    b = _runs(tmp_path, "B", [60, 240, 110], seed=2)
    within_one_run = compare(a[1:2], b[2:3], seed=0).metrics[0]
    assert within_one_run.verdict(50) == "B is faster"  # what request-level resampling alone says
    c = compare(a, b, seed=0)
    assert c.noise_known and c.metrics[0].verdict(50) == "no clear difference"


def test_a_difference_larger_than_the_noise_is_called(tmp_path: Path) -> None:
    a = _runs(tmp_path, "A", [100, 104, 98], seed=3)
    b = _runs(tmp_path, "B", [60, 63, 58], seed=4)
    ttft = compare(a, b, seed=0).metrics[0]
    assert ttft.verdict(50) == "B is faster"
    assert ttft.diffs[50].low < -40 * 0.8 and ttft.diffs[50].high > -40 * 1.2 and ttft.diffs[50].high < 0


def test_a_difference_inside_the_spread_of_repetitions_is_not_clear() -> None:
    tight = Interval(-10.0, -12.0, -8.0)
    assert noise.clear(tight, 0.0, [None, None])  # no repetitions: only the interval counts
    assert not noise.clear(tight, 0.0, [15.0, 3.0])  # repetitions of A alone differ by 15 ms


def test_goodput_ratio_resamples_runs() -> None:
    steady = [noise.RunCount(90, 100, 10.0), noise.RunCount(91, 100, 10.0), noise.RunCount(89, 100, 10.0)]
    better = [noise.RunCount(45, 50, 2.5) for _ in range(3)]  # twice the rate, 18 good req/s
    ratio = noise.goodput_ratio(steady, better, seed=1)
    assert ratio.estimate == pytest.approx(2.0)
    assert ratio.low > 1.6 and ratio.high < 2.4
    swinging = [noise.RunCount(30, 100, 10.0), noise.RunCount(95, 100, 10.0), noise.RunCount(60, 100, 10.0)]
    wide = noise.goodput_ratio(swinging, steady, seed=1)
    assert wide.low < 1.0 < wide.high or wide.high - wide.low > 1.0
