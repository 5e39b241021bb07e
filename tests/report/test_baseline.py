"""The production baseline column from a trace's recorded timings."""

from __future__ import annotations

from itertools import count
from pathlib import Path

import pytest

from replayproxy.report.baseline import BASELINE_LABEL, baseline_run
from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader, write_trace

MS = 1_000_000


def write_baseline_trace(path: Path) -> Path:
    shapes = [
        RequestShape(
            offset_ns=0,
            input_tokens=500,
            output_tokens=5,
            ttft_ns=40 * MS,
            e2e_ns=80 * MS,
            chunk_gaps_us=(10_000,) * 4,
            model="m",
        ),
        RequestShape(
            offset_ns=1000 * MS,
            input_tokens=5000,
            output_tokens=3,
            output_estimated=True,
            ttft_ns=90 * MS,
            e2e_ns=110 * MS,
            chunk_gaps_us=(10_000, 10_000),
            model="m",
        ),
        RequestShape(
            offset_ns=2000 * MS, input_tokens=100, status=503, error="http_5xx", e2e_ns=5 * MS, model="m"
        ),
    ]
    clock = count(1)
    write_trace(
        path,
        TraceHeader(start_wall_ns=1, upstream="http://prod"),
        shapes,
        mono_ns=lambda: next(clock),
        wall_ns=lambda: 1,
    )
    return path


def test_baseline_uses_recorded_timings(tmp_path: Path) -> None:
    run = baseline_run(write_baseline_trace(tmp_path / "t.rpt"))
    m = run.measures
    assert run.label == BASELINE_LABEL and run.kind == "baseline" and run.target == "http://prod"
    assert list(m.ttft_ms[:2]) == [40.0, 90.0] and list(m.e2e_ms[:2]) == [80.0, 110.0]
    assert m.tpot_ms[0] == pytest.approx(40 / 4)
    assert m.tpot_ms[1] == pytest.approx(20 / 2)  # estimated output: falls back to the 3 chunks seen
    assert list(m.output_from_usage[:2]) == [True, False]
    assert list(m.ok) == [True, True, False]
    assert len(m.itl_ms) == 6 and set(m.itl_ms) == {10.0}
    assert m.duration_s == pytest.approx(2.005)
    assert all(v != v for v in m.lag_ms)  # no schedule: lag not measured (NaN)
    assert list(m.requests.index) == [0, 1, 2]
