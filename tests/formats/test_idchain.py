"""Id chains: equal hashes exactly for equal id prefixes, whatever the chunking, no collisions."""

from __future__ import annotations

import numpy as np
import pytest

from replayproxy.formats.idchain import chain_hashes


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_chain_hashes_equal_exactly_for_equal_id_prefixes(chunk: int) -> None:
    rows = [[5, 6, 7], [5, 6], [9], [], [5, 6, 7, 8], [6, 5], [5, 9, 7]]
    ids = np.array([i for r in rows for i in r], np.int64)
    counts = np.array([len(r) for r in rows])
    flat = chain_hashes(ids, counts, chunk=chunk).tolist()
    by_prefix: dict[tuple[int, ...], int] = {}
    at = 0
    for r in rows:
        for j in range(len(r)):
            assert by_prefix.setdefault(tuple(r[: j + 1]), flat[at]) == flat[at]
            at += 1
    assert len(set(by_prefix.values())) == len(by_prefix)  # different prefixes, different hashes
    keep = np.array([2, 2, 0, 0, 3, 1, 1])
    kept = chain_hashes(ids, counts, keep=keep, chunk=chunk).tolist()
    assert kept == [by_prefix[tuple(r[: j + 1])] for r, k in zip(rows, keep, strict=True) for j in range(k)]


def test_chain_hashes_do_not_collide_at_scale() -> None:
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 40, 20_000)
    ids = rng.integers(0, 1 << 40, int(counts.sum()))
    assert len(np.unique(chain_hashes(ids, counts))) == len(ids)
