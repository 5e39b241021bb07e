"""Ragged columns kept on disk (mapped) give exactly what the in-memory load gives, and readers
that release pages as they go still read the right values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replayproxy import trace
from replayproxy.trace import TraceHeader, reuse, write_columns
from replayproxy.trace.mapped import gather, is_mapped, mapped_array, release_pages


def _trace(path: Path, start_ns: int, offsets: np.ndarray, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    rows = len(offsets)
    counts = rng.integers(0, 40, rows)
    columns = {
        "offset_ns": offsets,
        "input_tokens": counts * 16 + 3,
        "status": 200,
        "prefix_hashes": (rng.integers(1, 5000, int(counts.sum())).astype(np.uint64), counts),
        "chunk_gaps_us": (rng.integers(0, 9, int(counts.sum())).astype(np.uint32), counts),
        "prefix_units": counts * 16 + 3,
    }
    header = TraceHeader(start_wall_ns=start_ns, source="test", block_size=16, block_unit="token")
    write_columns(path, header, columns, rows, wall_ns=lambda: 0, frame_records=700)
    return path


@pytest.mark.parametrize("files", [1, 2])
def test_a_trace_loaded_with_its_ragged_columns_on_disk_reads_the_same(tmp_path: Path, files: int) -> None:
    """Two files whose requests interleave are reordered into a new map, chunk by chunk."""
    paths = [
        _trace(
            tmp_path / f"t{i}.rpt", i * 1_000, np.sort(np.random.default_rng(i).integers(0, 10**9, 5000)), i
        )
        for i in range(files)
    ]
    held, mapped = trace.load(paths), trace.load(paths, ragged_on_disk=True)
    assert is_mapped(mapped.prefix_hashes) and is_mapped(mapped.chunk_gaps_us)
    assert not is_mapped(held.prefix_hashes)
    for name in ("prefix_hashes", "prefix_index", "chunk_gaps_us", "chunk_index", "offset_ns"):
        assert np.array_equal(getattr(held, name), getattr(mapped, name)), name
    release_pages(mapped.prefix_hashes[100:50_000])  # dropped pages are read back from the file
    assert np.array_equal(held.prefix_hashes, mapped.prefix_hashes)


def test_gather_and_release_read_the_values_of_a_mapped_array(monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.random.default_rng(0).integers(0, 2**63, 300_000).astype(np.uint64)
    mapped = mapped_array([values[:1000], values[1000:]], np.uint64)
    assert is_mapped(mapped[5:9]) and np.array_equal(mapped, values)
    positions = np.sort(np.random.default_rng(1).choice(len(values), 50_000, replace=False))
    monkeypatch.setattr("replayproxy.trace.mapped.GATHERED", 999)
    assert np.array_equal(gather(mapped, positions), values[positions])
    assert np.array_equal(gather(values, positions), values[positions])
    release_pages(values[10:20])  # not mapped: nothing happens
    assert len(mapped_array([], np.uint64)) == 0


def test_reuse_of_mapped_hashes_is_counted_range_by_range_with_the_same_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hit_blocks splits mapped hashes by value ranges (sorting each alone): the counts are equal."""
    rng = np.random.default_rng(2)
    counts = rng.integers(0, 30, 4000)
    index = np.concatenate([[0], np.cumsum(counts)])
    pool = rng.integers(0, 2**64, 3000, dtype=np.uint64)
    flat = pool[rng.integers(0, len(pool), int(index[-1]))]
    monkeypatch.setattr(reuse, "HASHES_PER_RANGE", 1000)  # 64 ranges
    monkeypatch.setattr(reuse, "HASHES_PER_SLICE", 777)
    expected = reuse.hit_blocks(flat, index)
    assert expected.sum() > 1000  # blocks do recur
    assert np.array_equal(reuse.hit_blocks(mapped_array([flat], np.uint64), index), expected)
