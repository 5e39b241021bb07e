"""Re-blocking recorded prefix hashes into consumer hash ids: exact when aligned, never invented."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replayproxy import cli
from replayproxy.formats import blocks
from replayproxy.formats.blocks import block_ids
from replayproxy.trace import load, reuse
from tests.formats.helpers import hashed_trace, shape, tokens, write


def ids_by_row(path: Path, block: int) -> list[list[int]]:
    flat, counts = block_ids(load(path), block)
    ends = np.cumsum(counts)
    return [flat[e - c : e].tolist() for e, c in zip(ends, counts, strict=True)]


def test_aligned_reblocking_shares_exactly_the_common_full_blocks(tmp_path: Path) -> None:
    a = tokens(("sys", 100), ("x", 60))  # 160 tokens
    b = tokens(("sys", 100), ("y", 80))  # shares 100 tokens: 6 full 16-blocks, 3 full 32-blocks
    path = write(tmp_path / "t.rpt", [shape(0, a), shape(1, b)])
    rows = ids_by_row(path, 32)
    assert [len(r) for r in rows] == [5, 6]  # ceil(160/32), ceil(180/32)
    assert rows[0][:3] == rows[1][:3] and rows[0][3] != rows[1][3]
    assert sorted({i for r in rows for i in r}) == list(range(8))  # consecutive, first-seen order
    assert rows[0] == [0, 1, 2, 3, 4]


def test_target_blocks_beyond_the_hashed_prefix_and_partial_tails_are_fresh(tmp_path: Path) -> None:
    prompt = tokens(("sys", 64))
    recorded = shape(0, prompt)
    longer = shape(1, prompt, input_tokens=200, prefix_units=64)  # only 64 of 200 tokens hashed
    path = write(tmp_path / "t.rpt", [recorded, longer, shape(2, prompt[:40])])
    rows = ids_by_row(path, 32)
    assert rows[0] == rows[1][:2]  # both full blocks of the hashed prefix are shared
    assert len(set(rows[1][2:])) == 5 and not set(rows[1][2:]) & set(rows[0])  # unhashed: fresh
    assert (
        rows[2][0] == rows[0][0] and rows[2][1] not in rows[0] + rows[1]
    )  # 40 tokens: one full, one partial


def test_smaller_target_blocks_keep_their_position_in_the_identity(tmp_path: Path) -> None:
    prompt = tokens(("sys", 64))
    path = write(tmp_path / "t.rpt", [shape(0, prompt), shape(1, prompt)], block=64)
    rows = ids_by_row(path, 16)  # four 16-token blocks end inside one recorded 64-token block
    assert rows[0] == rows[1] and len(set(rows[0])) == 4


def test_unaligned_sizes_never_invent_sharing(tmp_path: Path) -> None:
    a = tokens(("sys", 40), ("x", 40))
    b = tokens(("sys", 40), ("y", 40))  # equal for 40 tokens: two recorded 16-blocks (32 tokens)
    path = write(tmp_path / "t.rpt", [shape(0, a), shape(1, b)])
    rows = ids_by_row(path, 24)  # target block 1 = tokens 24..47 needs recorded block 2 (32..47): differs
    assert rows[0][0] == rows[1][0] and rows[0][1] != rows[1][1]


def test_char_unit_traces_convert_with_each_requests_ratio(tmp_path: Path) -> None:
    text = "abcd" * 64  # 256 chars, 4 recorded 64-char blocks
    shapes = [
        shape(0, [0], input_tokens=64, prefix_units=256, prefix_hashes=tuple(range(1, 5))),
        shape(1, [0], input_tokens=64, prefix_units=256, prefix_hashes=(1, 2, 3, 9)),
    ]
    path = write(tmp_path / "t.rpt", shapes, block=64, unit="char")
    assert len(text) == 256
    rows = ids_by_row(path, 16)  # 4 chars per token: 16 tokens = one recorded 64-char block
    assert rows[0][:3] == rows[1][:3] and rows[0][3] != rows[1][3]


def test_mixed_block_sizes_refuse(tmp_path: Path) -> None:
    write(tmp_path / "a.rpt", [shape(0, tokens(("a", 40)))], block=16)
    write(tmp_path / "b.rpt", [shape(0, tokens(("a", 40)), block=32)], block=32)
    with pytest.raises(ValueError, match="different block sizes"):
        block_ids(load([tmp_path / "a.rpt", tmp_path / "b.rpt"]), 16)


@pytest.mark.parametrize("fmt", ["mooncake", "bailian", "jsonl"])
def test_recurring_hashes_counted_a_range_and_slice_at_a_time_export_the_same_bytes(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repeats that fall in different slices and value ranges are still found: same file, byte for byte."""
    rows = 3000
    rng = np.random.default_rng(3)
    pool = rng.integers(0, 2**64, 5000, dtype=np.uint64)  # some hashes recur, far apart in the trace
    hashes = pool[rng.integers(0, len(pool), 24 * rows)]
    inputs = rng.integers(24 * 16 - 15, 24 * 16 + 1, rows)
    trace = hashed_trace(tmp_path / "t.rpt", hashes, 24, inputs, block=16)
    whole, ranged = tmp_path / f"whole.{fmt}", tmp_path / f"ranged.{fmt}"
    assert cli.main(["export", str(trace), "-f", fmt, "-o", str(whole), "--block-size", "16"]) == 0
    monkeypatch.setattr(reuse, "HASHES_PER_RANGE", 1000)  # 64 value ranges
    monkeypatch.setattr(reuse, "HASHES_PER_SLICE", 777)  # ~90 slices per range
    assert cli.main(["export", str(trace), "-f", fmt, "-o", str(ranged), "--block-size", "16"]) == 0
    assert ranged.read_bytes() == whole.read_bytes()
    found = blocks._recurring(hashes)  # still in 64 value ranges
    assert len(found) > 1000  # the trace does share blocks
    assert bool(np.all(found[1:] > found[:-1]))  # distinct and sorted without a sort: ranges come in order


def test_searching_in_sorted_order_gives_each_key_the_place_plain_searchsorted_gives() -> None:
    rng = np.random.default_rng(5)
    table = np.unique(rng.integers(0, 1 << 40, 50_000, dtype=np.int64).astype(np.uint64))
    keys = np.concatenate([rng.choice(table, 30_000), rng.integers(0, 1 << 40, 30_000).astype(np.uint64)])
    rng.shuffle(keys)
    assert np.array_equal(blocks._sorted_search(table, keys), np.searchsorted(table, keys))
    assert blocks._sorted_search(table, keys[:0]).shape == (0,)
