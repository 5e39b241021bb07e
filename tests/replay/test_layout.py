"""Exact prompts' word choice: the words of recorded blocks are the same computed or cached."""

from __future__ import annotations

import numpy as np
import pytest

from replayproxy.replay import layout


@pytest.mark.parametrize("block", [16, 64, 512])
def test_cached_block_words_equal_computed_ones_through_eviction(block: int) -> None:
    rng = np.random.default_rng(block)
    seed, size = np.uint64(11), 3000
    cache = layout.BlockWords(layout.PositionCodes(seed), block, size)
    cache._capacity = 3  # evicts all the time: a block seen again is computed afresh
    for _ in range(200):
        positions = np.unique(rng.integers(0, 6 * block, int(rng.integers(1, 4 * block)))).astype(np.int64)
        chain = int(rng.integers(0, 6))
        hashes = rng.integers(1, 6, chain, dtype=np.uint64) * np.uint64(0x9E37_79B9_7F4A_7C15)
        branch = rng.integers(0, size, len(hashes) + 1).astype(np.int64)
        own = np.uint64(rng.integers(0, 2**63))
        codes = layout.PositionCodes(seed)
        direct = layout.word_indices(positions, hashes, own, branch, block, codes, size)
        cached = layout.word_indices(positions, hashes, own, branch, block, codes, size, cache)
        assert np.array_equal(direct, cached)
        assert direct.min() >= 0 and direct.max() < size


def test_requests_sharing_a_block_share_its_words_and_differ_after_it() -> None:
    block, size = 64, 3000
    codes = layout.PositionCodes(np.uint64(5))
    cache = layout.BlockWords(codes, block, size)
    positions = np.arange(3, 2 * block, dtype=np.int64)
    shared = np.array([0xABCDEF], np.uint64)
    branch = np.array([7, 8], np.int64)
    one = layout.word_indices(positions, shared, np.uint64(1), branch, block, codes, size, cache)
    two = layout.word_indices(positions, shared, np.uint64(2), branch, block, codes, size, cache)
    inside = positions < block
    assert np.array_equal(one[inside], two[inside])
    assert not np.array_equal(one[~inside][1:], two[~inside][1:])  # own words past the recorded block
