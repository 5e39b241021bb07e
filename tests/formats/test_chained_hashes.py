"""Imported prefix hashes chained per batch: the same hashes in memory or in the temporary file, in
any order."""

from __future__ import annotations

import numpy as np
import pytest

from replayproxy.formats.chained_hashes import ChainedHashes, take_rows
from replayproxy.formats.idchain import chain_hashes


def random_rows(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 9, rows)
    ids = rng.integers(0, 5, int(counts.sum()))  # few distinct ids: many equal prefixes
    inputs = counts * 16 - rng.integers(0, 20, rows)  # some rows end in a partial block
    return ids, counts, inputs


@pytest.mark.parametrize("memory_bytes", [0, 1 << 30])  # every batch in the file / all in memory
def test_batches_in_any_order_equal_one_chain_over_all_rows(memory_bytes: int) -> None:
    ids, counts, inputs = random_rows(2_000, seed=1)
    hashes = ChainedHashes(16, memory_bytes=memory_bytes)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for lo in range(0, 2_000, 300):  # batches of rows, as a reader hands them over
        hi = min(lo + 300, 2_000)
        hashes.add(ids[starts[lo] : starts[hi]], counts[lo:hi], inputs[lo:hi])
    keep = np.minimum(counts, np.maximum(inputs, 0) // 16)
    whole = chain_hashes(ids, counts, keep=keep)
    order = np.random.default_rng(2).permutation(2_000)
    order[:500] = np.sort(order[:500])  # runs of rows in file order are read in one piece
    frames, frame_counts = hashes.in_order(order)
    assert frame_counts.tolist() == keep[order].tolist()
    got = np.concatenate([frames(lo, min(lo + 128, 2_000)) for lo in range(0, 2_000, 128)])
    assert got.tolist() == take_rows(whole, keep, order).tolist()
    assert hashes.had_ids().tolist() == (counts > 0).tolist()


def test_take_rows() -> None:
    flat, counts = np.array([1, 2, 3, 4, 5, 6]), np.array([2, 0, 1, 3])
    assert take_rows(flat, counts, np.array([3, 1, 0, 2])).tolist() == [4, 5, 6, 1, 2, 3]
