"""How many imported blocks change meaning when per-block ids are chained into prefix hashes.

Bailian's `hash_ids` name a 16-token block's content wherever it sits (salted SipHash per block,
not chained: AIPerf's `bailian_trace` loader description), so equal ids at another position, after
a different prefix, would read as a cache hit no prefix cache can give. The import chains them
(equal hash ⇔ equal prefix up to the block). A block occurrence changes meaning when its id was
seen before but its prefix was not: over the whole file that is exactly
`distinct (id, prefix) pairs − distinct ids` (the first sighting of each id is also the first of
its prefix), whatever the order. Distinct values are kept per batch in temporary files and
counted once at the end (about 16 bytes per distinct block while it sorts).
"""

from __future__ import annotations

import numpy as np

from replayproxy.trace.mapped import SpilledArray


class BlockMeaning:
    """Counts, over batches of (source id, chained hash) per kept block, the blocks whose id was
    already seen after a different prefix."""

    def __init__(self) -> None:
        self._ids = SpilledArray(np.dtype(np.int64))
        self._hashes = SpilledArray(np.dtype(np.uint64))
        self.blocks = 0

    def add(self, ids: np.ndarray, hashes: np.ndarray) -> None:
        self.blocks += len(ids)
        self._ids.extend(np.unique(ids))
        self._hashes.extend(np.unique(hashes))

    def changed(self) -> int:
        """Block occurrences that an id match would call a hit and a prefix match would not."""
        distinct_ids = len(np.unique(self._ids.result()))
        distinct_prefixes = len(np.unique(self._hashes.result()))
        return max(distinct_prefixes - distinct_ids, 0)
