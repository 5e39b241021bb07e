"""Paged KV cache accounting with a prefix cache, as in vLLM's block pool.

Only counts matter, not contents: a block is free, private to one sequence, or cached under the
chained hash of its prompt tokens. Cached blocks are shared by reference count; those no sequence
holds stay reusable until evicted in least-recently-released order when free blocks run out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks: equal hash i means equal tokens up to the end of block i."""
    hashes, parent = [], 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class BlockPool:
    """A fixed number of KV blocks; `available` counts free plus evictable cached blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = num_blocks
        self._refs: dict[int, int] = {}  # cached block hash -> sequences holding it
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unheld; oldest first

    @property
    def available(self) -> int:
        return self._free + len(self._evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences (vLLM's kv_cache_usage_perc, as a fraction)."""
        return 1.0 - self.available / self.num_blocks

    def cached_prefix(self, hashes: Sequence[int]) -> tuple[int, int]:
        """(number of leading blocks cached, how many of those are unheld and would leave `available`)."""
        unheld = 0
        for n, h in enumerate(hashes):
            refs = self._refs.get(h)
            if refs is None:
                return n, unheld
            unheld += refs == 0
        return len(hashes), unheld

    def hold(self, hashes: Sequence[int]) -> None:
        """Take a reference on cached blocks (a prefix hit)."""
        for h in hashes:
            refs = self._refs[h]
            if refs == 0:
                del self._evictable[h]
            self._refs[h] = refs + 1

    def allocate(self, n: int) -> bool:
        """Take n private blocks, evicting the least recently released cached blocks if needed."""
        if n > self.available:
            return False
        take = min(n, self._free)
        self._free -= take
        for _ in range(n - take):
            h, _ = self._evictable.popitem(last=False)
            del self._refs[h]
        return True

    def publish(self, h: int) -> bool:
        """Turn one private block into a cached one under hash h; False if h is already cached."""
        if h in self._refs:
            return False
        self._refs[h] = 1
        return True

    def release(self, private: int, held: Sequence[int]) -> None:
        """Give back a sequence's private blocks and its references on cached ones."""
        self._free += private
        for h in held:
            refs = self._refs[h] - 1
            self._refs[h] = refs
            if refs == 0:
                self._evictable[h] = None

    def reset_cache(self) -> int:
        """Forget every unheld cached block (POST /reset_prefix_cache); returns how many."""
        count = len(self._evictable)
        for h in self._evictable:
            del self._refs[h]
        self._free += count
        self._evictable.clear()
        return count
