import pytest

from replayproxy.sim.kv import BlockPool, block_hashes


def test_block_hashes_chain_over_full_blocks_only() -> None:
    a = block_hashes(list(range(40)), 16)
    b = block_hashes(list(range(32)) + [0] * 8, 16)
    c = block_hashes([99] + list(range(1, 40)), 16)
    assert len(a) == 2 and a == b
    assert c[0] != a[0] and c[1] != a[1]  # a change in block 0 changes every later hash


def test_allocation_prefers_free_blocks_then_evicts_least_recently_released() -> None:
    pool = BlockPool(4)
    assert pool.allocate(2)
    assert pool.publish(11) and pool.publish(22)
    pool.release(0, [11, 22])  # both now cached and evictable, 11 released first
    assert pool.available == 4 and pool.usage == 0.0
    assert pool.allocate(3)  # 2 free + evicts 11
    assert pool.cached_prefix([11, 22]) == (0, 0)
    assert not pool.allocate(2)


def test_held_cached_blocks_are_not_evicted_and_count_as_used() -> None:
    pool = BlockPool(3)
    pool.allocate(1)
    pool.publish(7)
    pool.release(0, [7])
    assert pool.cached_prefix([7, 8]) == (1, 1)
    pool.hold([7])
    assert pool.available == 2 and pool.usage == pytest.approx(1 / 3)
    assert pool.allocate(2) and not pool.allocate(1)
    assert pool.cached_prefix([7]) == (1, 0)


def test_publish_refuses_a_hash_already_cached() -> None:
    pool = BlockPool(2)
    pool.allocate(2)
    assert pool.publish(5) and not pool.publish(5)


def test_reset_forgets_unheld_blocks_only() -> None:
    pool = BlockPool(4)
    pool.allocate(2)
    pool.publish(1)
    pool.publish(2)
    pool.release(0, [1])
    assert pool.reset_cache() == 1
    assert pool.cached_prefix([1]) == (0, 0) and pool.cached_prefix([2]) == (1, 0)
    assert pool.available == 3
