"""Prefix reuse (replayproxy/trace/reuse.py): the share of input tokens an infinite prefix cache
would serve, over a whole trace or a window of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replayproxy import trace
from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader
from replayproxy.trace.reuse import hit_blocks, prefix_reuse
from tests.trace.helpers import FakeClock


def write(path: Path, shapes: list[RequestShape], **header: object) -> trace.Columns:
    clock = FakeClock()
    trace.write_trace(
        path, TraceHeader(start_wall_ns=0, **header), shapes, mono_ns=clock.mono_ns, wall_ns=clock.wall_ns
    )  # type: ignore[arg-type]
    return trace.load(path)


def test_hits_are_blocks_an_earlier_request_already_had() -> None:
    flat = np.array([1, 2, 1, 2, 3, 9, 1], np.uint64)
    index = np.array([0, 2, 5, 6, 7])  # rows: [1 2] [1 2 3] [9] [1]
    assert hit_blocks(flat, index).tolist() == [0, 2, 0, 1]


def test_reuse_is_hit_tokens_over_input_tokens(tmp_path: Path) -> None:
    shapes = [
        RequestShape(offset_ns=0, input_tokens=40, prefix_hashes=(1, 2)),
        RequestShape(offset_ns=1, input_tokens=50, prefix_hashes=(1, 2, 3)),  # 2 blocks of 16 hit
        RequestShape(offset_ns=2, input_tokens=10, prefix_hashes=(1,)),  # 16 hit, capped at its 10 tokens
    ]
    columns = write(tmp_path / "t.rpt", shapes)
    assert prefix_reuse(columns) == pytest.approx((32 + 10) / 100)


def test_a_window_counts_only_its_own_requests_as_earlier(tmp_path: Path) -> None:
    shapes = [RequestShape(offset_ns=i, input_tokens=32, prefix_hashes=(7, 8)) for i in range(3)]
    columns = write(tmp_path / "t.rpt", shapes)
    assert prefix_reuse(columns) == pytest.approx(64 / 96)
    assert prefix_reuse(columns, np.array([1, 2])) == pytest.approx(32 / 64)  # row 0 is outside the window
    assert prefix_reuse(columns, np.array([2])) == 0.0


def test_char_blocks_are_converted_with_each_requests_own_ratio(tmp_path: Path) -> None:
    shapes = [
        RequestShape(offset_ns=0, input_tokens=100, prefix_units=400, prefix_hashes=(1, 2)),
        RequestShape(offset_ns=1, input_tokens=50, prefix_units=400, prefix_hashes=(1, 2)),
    ]
    columns = write(tmp_path / "t.rpt", shapes, block_size=64, block_unit="char")
    assert prefix_reuse(columns) == pytest.approx((2 * 64 * 50 / 400) / 150)


def test_no_hashes_gives_none(tmp_path: Path) -> None:
    assert prefix_reuse(write(tmp_path / "t.rpt", [RequestShape(offset_ns=0, input_tokens=5)])) is None
