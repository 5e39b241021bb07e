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


def reuse_by_definition(
    shapes: list[RequestShape], rows: np.ndarray, block_size: int, unit: str
) -> float | None:
    """The definition, request by request: blocks an earlier request of the window had, as tokens."""
    seen: set[int] = set()
    hits = []
    for row in rows:
        hashes = shapes[row].prefix_hashes
        hits.append(sum(h in seen for h in hashes))
        seen.update(hashes)
    inputs = np.array([shapes[r].input_tokens for r in rows], np.float64)
    hit_tokens = np.array(hits, np.float64) * block_size
    if unit != "token":
        units = np.array([shapes[r].prefix_units for r in rows], np.float64)
        hit_tokens = np.where(units > 0, hit_tokens * inputs / np.maximum(units, 1), 0.0)
    known = inputs > 0
    return float(np.minimum(hit_tokens, inputs)[known].sum() / inputs[known].sum()) if known.any() else None


@pytest.mark.parametrize("unit", ["token", "char"])
@pytest.mark.parametrize("seed", range(3))
def test_a_window_anywhere_in_a_random_trace_gives_the_definitions_reuse(
    tmp_path: Path, seed: int, unit: str
) -> None:
    rng = np.random.default_rng(seed)
    pool = [int(h) for h in rng.integers(0, 2**64, 30, dtype=np.uint64)]  # few blocks: much reuse
    shapes = [
        RequestShape(
            offset_ns=i,
            input_tokens=int(rng.integers(0, 200)),
            prefix_units=int(rng.integers(0, 800)),
            # chained hashes never repeat within a request
            prefix_hashes=tuple(pool[int(j)] for j in rng.choice(30, int(rng.integers(0, 6)), replace=False)),
        )
        for i in range(80)
    ]
    columns = write(tmp_path / "t.rpt", shapes, block_size=16, block_unit=unit)
    ends = [np.arange(25), np.arange(55, 80), np.array([0]), np.array([79])]
    windows = [np.arange(80), *ends, np.arange(10, 70), np.flatnonzero(rng.random(80) < 0.3)]
    for rows in windows:
        expected = reuse_by_definition(shapes, rows, 16, unit)
        assert prefix_reuse(columns, rows) == pytest.approx(expected, rel=1e-12), (unit, rows.tolist())
    assert prefix_reuse(columns) == pytest.approx(
        reuse_by_definition(shapes, np.arange(80), 16, unit), rel=1e-12
    )


def test_an_empty_window_has_no_reuse(tmp_path: Path) -> None:
    shapes = [RequestShape(offset_ns=i, input_tokens=32, prefix_hashes=(7,)) for i in range(3)]
    assert prefix_reuse(write(tmp_path / "t.rpt", shapes), np.zeros(0, np.int64)) is None
