"""The measurement contract on hand-worked requests written through the real result format."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from replayproxy.report.measures import concurrency, exact_share, in_flight_series
from replayproxy.report.runs import load_runs
from tests.report.helpers import result, write_run


def _measures(tmp_path: Path, *results):  # type: ignore[no-untyped-def]
    return load_runs([write_run(tmp_path / "r.rpr", results)])[0].measures


def test_ttft_tpot_e2e_lag_and_scheduled_latency(tmp_path: Path) -> None:
    m = _measures(
        tmp_path,
        result(
            0,
            ttft_ms=10,
            e2e_ms=100,
            completion_tokens=10,
            sent_ms=105,
            scheduled_ms=100,
            gaps_us=[10_000] * 9,
        ),
        result(1, error="http_5xx", e2e_ms=3, sent_ms=200),
    )
    assert m.ttft_ms[0] == 10 and m.e2e_ms[0] == 100
    assert m.tpot_ms[0] == pytest.approx(90 / 9)  # (E2E - TTFT) / (output tokens - 1)
    assert m.lag_ms[0] == pytest.approx(5) and m.lag_ms[1] == 0
    assert m.ttft_sched_ms[0] == pytest.approx(15) and m.e2e_sched_ms[0] == pytest.approx(105)
    assert list(m.ok) == [True, False]
    assert math.isnan(m.ttft_ms[1]) and math.isnan(m.e2e_ms[1]) and math.isnan(m.tpot_ms[1])
    assert len(m.itl_ms) == 9  # the failed request's gaps are not pooled


def test_output_tokens_fall_back_from_usage_to_chunk_tokens_to_chunks(tmp_path: Path) -> None:
    m = _measures(
        tmp_path,
        result(0, completion_tokens=7, gaps_us=[1000] * 3),
        result(1, chunk_tokens=[2, 3, 4], gaps_us=[1000, 1000]),
        result(2, gaps_us=[1000] * 4),
    )
    assert list(m.output_tokens) == [7, 9, 5]
    assert list(m.output_from_usage) == [True, False, False]


def test_itl_is_split_per_token_when_chunk_tokens_are_known(tmp_path: Path) -> None:
    # Chunks of 1, 2 and 3 tokens; the 2-token chunk came 4 ms after the first, the 3-token one 6 ms later:
    # 2 values of 2 ms, then 3 values of 2 ms; the first chunk's token belongs to TTFT.
    m = _measures(tmp_path, result(0, chunk_tokens=[1, 2, 3], gaps_us=[4000, 6000], completion_tokens=6))
    assert m.itl_per_token
    assert list(m.itl_ms) == [2.0] * 5
    assert float(np.sum(m.itl_ms)) == pytest.approx(10.0)  # sums to the decode time


def test_itl_uses_raw_gaps_when_chunk_tokens_do_not_line_up(tmp_path: Path) -> None:
    m = _measures(tmp_path, result(0, chunk_tokens=[1, 2], gaps_us=[4000, 6000, 8000]))
    assert not m.itl_per_token and list(m.itl_ms) == [4.0, 6.0, 8.0]


def test_concurrency_mean_and_peak_from_send_and_end(tmp_path: Path) -> None:
    m = _measures(
        tmp_path,
        result(0, sent_ms=0, e2e_ms=1000),
        result(1, sent_ms=500, e2e_ms=1000),
        result(2, sent_ms=1000, e2e_ms=1000),  # starts exactly when #0 ends: not overlapping it
    )
    mean, peak = concurrency(m)
    assert m.duration_s == pytest.approx(2.0)
    assert mean == pytest.approx(3.0 / 2.0) and peak == 2
    t, count = in_flight_series(m, points=5)  # t = 0, 0.5, 1, 1.5, 2
    assert list(count) == [1, 2, 2, 1, 0]


def test_exact_share_counts_only_known_pairs() -> None:
    share, count = exact_share(np.array([10, 11, -1, 5]), np.array([10, 12, 9, -1]))
    assert (share, count) == (0.5, 2)
    share, count = exact_share(np.array([-1]), np.array([3]))
    assert math.isnan(share) and count == 0
