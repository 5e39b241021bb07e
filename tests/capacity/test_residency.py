"""KV residency over time: the event sweep against hand-worked and brute-force answers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from replayproxy.capacity.residency import (
    Curve,
    Timings,
    estimate,
    fit,
    from_results,
    from_trace,
    residency,
)
from replayproxy.results import ReplayResult, ResultWriter, RunHeader, load_results
from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader, load, write_trace

MS = 1_000_000


def timings(rows: list[tuple[int, int, int, int, int]], gaps: list[list[int]] | None = None) -> Timings:
    """rows: (arrival, ttft, e2e, input tokens, output tokens); gaps: chunk gaps (us) per request."""
    arrival, ttft, e2e, inputs, outputs = np.array(rows, dtype=np.int64).T
    gaps = gaps or [[] for _ in rows]
    index = np.concatenate([[0], np.cumsum([len(g) for g in gaps])]).astype(np.int64)
    flat = np.array([x for g in gaps for x in g], dtype=np.int64)
    return Timings(arrival, ttft, e2e, inputs, outputs, chunk_gaps_us=flat, chunk_index=index)


def test_hand_worked_two_requests() -> None:
    # A: arrives 0, input 100, first token at 10 ms, ends at 20 ms with 11 tokens (1 -> 11 linearly).
    # B: arrives 15 ms, input 50, first token at 20 ms, ends at 40 ms with 21 tokens.
    # At 20 ms (just before A ends): 100 + 11 + 50 = 161 tokens, the peak.
    t = timings([(0, 10 * MS, 20 * MS, 100, 11), (15 * MS, 5 * MS, 25 * MS, 50, 21)])
    curve = residency(t)
    assert curve.peak()[0] == pytest.approx(161.0) and curve.peak()[1] == 20 * MS
    # Areas: A 100 x 10 + 106 x 10 (1..11 mean 6); B 50 x 5 + 61 x 20 (51..71) -> 3530 over 40 ms.
    assert curve.mean() == pytest.approx(3530 / 40)
    # Above 155 only on 15..20 ms (156 -> 161): 5 ms; the top 5% (2 ms) is above 159.
    assert curve.time_above_ns(155) == pytest.approx(5 * MS)
    assert curve.first_above_ns(155) == 15 * MS
    assert curve.first_above_ns(158) == 17 * MS
    assert curve.quantile(0.95) == pytest.approx(159, abs=0.01)
    assert curve.quantile(0.5) == pytest.approx(71, abs=0.01)  # B's ramp ends at 71, half the time below
    assert curve.first_above_ns(161) is None
    assert int(curve.concurrency.max()) == 2


def brute_force(rows: list[tuple[int, int, int, int, int]], grid: np.ndarray) -> np.ndarray:
    """Resident tokens at each grid time, request by request, written independently of the sweep."""
    total = np.zeros(len(grid))
    for arrival, ttft, e2e, inputs, outputs in rows:
        first, end = arrival + ttft, arrival + e2e
        for k, now in enumerate(grid):
            if arrival <= now < end:
                generated = 0.0
                if now >= first:
                    start = min(outputs, 1)
                    generated = start + (outputs - start) * (now - first) / (end - first)
                total[k] += inputs + generated
    return total


def test_random_trace_matches_brute_force() -> None:
    rng = np.random.default_rng(7)
    rows = []
    for _ in range(40):
        ttft = int(rng.integers(20, 300)) * MS
        rows.append(
            (
                int(rng.integers(0, 2000)) * MS,
                ttft,
                ttft + int(rng.integers(10, 900)) * MS,
                int(rng.integers(1, 4000)),
                int(rng.integers(1, 800)),
            )
        )
    curve = residency(timings(rows))
    grid = np.arange(0, 3300 * MS, MS // 4)
    sampled = brute_force(rows, grid)
    peak, _ = curve.peak()
    assert peak == pytest.approx(sampled.max(), rel=2e-3)
    assert peak >= sampled.max() - 1e-6
    inside = (grid >= curve.times_ns[0]) & (grid < curve.times_ns[-1])
    assert curve.mean() == pytest.approx(sampled[inside].mean(), rel=2e-3)
    assert curve.quantile(0.95) == pytest.approx(np.quantile(sampled[inside], 0.95), rel=5e-3)


def test_chunk_times_drive_progress() -> None:
    # First token at 100 ms, four more chunks 10 ms apart, then the body ends only at 10 s:
    # after 140 ms all 50 tokens are resident, where a linear model would have ~1.
    rows = [(0, 100 * MS, 10_000 * MS, 1000, 50)]
    chunked = residency(timings(rows, [[10_000] * 4]))
    linear = residency(timings(rows))
    at = 200 * MS
    assert _value_at(chunked, at) == pytest.approx(1050)
    assert _value_at(linear, at) == pytest.approx(1000 + 1 + 49 * 100 / 9900)
    assert chunked.mean() > linear.mean()


def test_reported_chunk_sizes_are_followed() -> None:
    rows = [(0, 100 * MS, 1000 * MS, 10, 100)]
    t = timings(rows, [[100_000, 100_000]])  # chunks at 100, 200, 300 ms
    sized = replace(t, chunk_tokens=np.array([90, 5, 5]), chunk_tokens_index=np.array([0, 3]))
    curve = residency(sized, points=2)
    assert _value_at(curve, 100 * MS) == pytest.approx(10 + 90)
    assert _value_at(curve, 300 * MS) == pytest.approx(10 + 100)


def test_estimate_fills_unknown_ends_and_skips_unknown_sizes() -> None:
    t = timings([(0, -1, -1, 100, 11), (0, 50 * MS, -1, 100, 3), (0, -1, -1, -1, 5), (0, -1, 80 * MS, 7, 0)])
    filled, estimated, skipped = estimate(t, assume_ttft_ns=200 * MS, assume_tpot_ns=30 * MS)
    assert (estimated, skipped) == (2, 1)
    assert filled.ttft_ns[:2].tolist() == [200 * MS, 50 * MS]
    assert filled.e2e_ns[:2].tolist() == [200 * MS + 10 * 30 * MS, 50 * MS + 2 * 30 * MS]
    assert filled.input_tokens[2] == 0 and filled.output_tokens[2] == 0
    assert filled.ttft_ns[3] == -1  # failed before its first token: holds its input until the end
    # Just before 80 ms: #0 prefilling (100), #1 at 100 + 1 + 2 x 30/60 tokens, #3 holding 7.
    peak, when = residency(filled).peak()
    assert peak == pytest.approx(100 + 102 + 7) and when == 80 * MS


def test_fit_reports_time_over_capacity() -> None:
    t = timings([(0, 10 * MS, 20 * MS, 100, 11), (15 * MS, 5 * MS, 25 * MS, 50, 21)])
    over = fit(t, estimated=0, skipped=0, capacity_tokens=155)
    assert not over.fits
    assert over.time_over_s == pytest.approx(0.005)
    assert over.first_over_s == pytest.approx(0.015)
    assert over.peak_concurrency == 2 and over.longest_request_tokens == 111
    assert fit(t, 0, 0, capacity_tokens=161).fits


def test_from_trace(tmp_path: Path) -> None:
    shapes = [
        RequestShape(offset_ns=0, input_tokens=100, output_tokens=11, ttft_ns=10 * MS, e2e_ns=20 * MS),
        RequestShape(offset_ns=15 * MS, input_tokens=50, output_tokens=21, ttft_ns=5 * MS, e2e_ns=25 * MS),
        RequestShape(
            offset_ns=30 * MS, input_tokens=5, output_tokens=-1, max_tokens=9
        ),  # imported: no timings
    ]
    path = tmp_path / "t.rpt"
    write_trace(path, TraceHeader(start_wall_ns=1), shapes, mono_ns=lambda: 0, wall_ns=lambda: 1)
    t = from_trace(load(path))
    assert t.output_tokens.tolist() == [11, 21, 9]  # max_tokens stands in for an unknown output
    filled, estimated, skipped = estimate(t, 200 * MS, 30 * MS)
    assert (estimated, skipped) == (1, 0)
    assert residency(filled).peak()[0] == pytest.approx(161.0)


def test_from_results_aligns_shards(tmp_path: Path) -> None:
    def write(name: str, start_wall_ns: int, results: list[ReplayResult]) -> None:
        with ResultWriter(
            tmp_path / name, RunHeader(label="x", target="t", start_wall_ns=start_wall_ns)
        ) as w:
            for result in results:
                w.write(result)

    write(
        "a.rpr",
        1_000 * MS,
        [
            ReplayResult(0, 0, 0, ttft_ns=10 * MS, e2e_ns=20 * MS, prompt_tokens=100, completion_tokens=11),
        ],
    )
    write(
        "b.rpr",
        1_010 * MS,
        [
            ReplayResult(
                1,
                0,
                5 * MS,
                ttft_ns=5 * MS,
                e2e_ns=25 * MS,
                expected_input_tokens=50,
                expected_output_tokens=21,
            ),
            ReplayResult(
                2,
                0,
                6 * MS,
                e2e_ns=1 * MS,
                error="http_5xx",
                expected_input_tokens=9,
                expected_output_tokens=99,
            ),
        ],
    )
    t = from_results(load_results([tmp_path]))
    assert t.arrival_ns.tolist() == [0, 15 * MS, 16 * MS]
    assert t.input_tokens.tolist() == [100, 50, 9]
    assert t.output_tokens.tolist() == [11, 21, 0]  # a failure without chunks generated nothing
    # Just before 17 ms: A at 100 + 1 + 7, B prefilling 50, the failure holding 9.
    peak, when = residency(t).peak()
    assert peak == pytest.approx(108 + 50 + 9) and when == 17 * MS


def _value_at(curve: Curve, when_ns: int) -> float:
    times, after, before = curve.times_ns, curve.after, curve.before
    k = int(np.searchsorted(times, when_ns, side="right")) - 1
    if k + 1 >= len(times):
        return float(after[k])
    share = (when_ns - times[k]) / (times[k + 1] - times[k])
    return float(after[k] + share * (before[k + 1] - after[k]))
