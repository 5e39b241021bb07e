"""Paired comparison: pairing by trace index, ratios, share faster, and honest verdicts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replayproxy.report.compare import compare
from replayproxy.report.runs import load_runs
from tests.report.helpers import result, synthetic_run, write_run


def _ab(tmp_path: Path, factor: float, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    ttft = rng.lognormal(4, 0.6, 600)
    e2e = ttft + rng.lognormal(7, 0.4, 600)
    noise = rng.lognormal(0, 0.05, 600)
    a = synthetic_run(tmp_path / "a.rpr", ttft, e2e, label="A")
    b = synthetic_run(tmp_path / "b.rpr", ttft * factor * noise, e2e * factor * noise, label="B")
    return load_runs([a, b])


def test_faster_b_is_called_faster_with_ci_excluding_zero(tmp_path: Path) -> None:
    a, b = _ab(tmp_path, 0.7)
    c = compare([a], [b], seed=3)
    ttft = c.metrics[0]
    assert c.common == 600 and ttft.pairs == 600
    assert ttft.median_ratio == pytest.approx(0.7, rel=0.03)
    assert ttft.share_faster_b > 0.95
    assert ttft.verdict(50) == "B is faster" and ttft.diffs[50].high < 0
    true_diff = np.quantile(b.measures.ttft_ms, 0.5) - np.quantile(a.measures.ttft_ms, 0.5)
    assert ttft.diffs[50].low <= true_diff <= ttft.diffs[50].high
    assert compare([b], [a], seed=3).metrics[0].verdict(50) == "B is slower"


def test_no_verdict_when_runs_only_differ_by_noise(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    ttft_a, ttft_b = rng.lognormal(4, 0.6, 400), rng.lognormal(4, 0.6, 400)
    a = synthetic_run(tmp_path / "a.rpr", ttft_a, ttft_a + 500, label="A")
    b = synthetic_run(tmp_path / "b.rpr", ttft_b, ttft_b + 500, label="B")
    c = compare(*([r] for r in load_runs([a, b])), seed=1)
    assert c.metrics[0].verdict(50) == "no clear difference"
    assert not c.metrics[0].diffs[50].excludes_zero


def test_pairs_by_trace_index_not_position_and_skips_failures(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a.rpr", [result(i, ttft_ms=10 * (i + 1)) for i in range(4)], label="A")
    # B holds indices 3, 1, 0 (no 2), in another order, each exactly half of A's TTFT; index 0 failed on B.
    b = write_run(
        tmp_path / "b.rpr",
        [result(3, ttft_ms=20), result(1, ttft_ms=10), result(0, error="reset")],
        label="B",
    )
    c = compare(*([r] for r in load_runs([a, b])))
    assert (c.common, c.only_a, c.only_b) == (3, 1, 0)
    ttft = c.metrics[0]
    assert ttft.pairs == 2 and ttft.median_ratio == pytest.approx(0.5) and ttft.share_faster_b == 1.0
