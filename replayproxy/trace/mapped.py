"""Long columns kept in an unlinked temporary file and mapped, instead of held on the heap.

A trace's prefix hashes grow with requests × blocks (24 M hashes, 190 MB, for a million 12k-token
prompts); an export reads them once, a chunk of requests at a time. Written to a temporary file
and mapped read-only, they behave as any numpy array, and a reader that is done with a range
calls `release_pages` so the range leaves resident memory (it is read back from the page cache
if touched again). Peak resident memory then follows the chunk, not the trace.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np


class SpilledArray:
    """An array filled in order into a temporary file; `result` maps it (the `_Growing` interface)."""

    def __init__(self, dtype: np.dtype[Any]) -> None:
        self.dtype = np.dtype(dtype)
        fd, name = tempfile.mkstemp(prefix="replayproxy-", suffix=".column")
        os.unlink(name)  # gone with the process, whatever happens
        self._fd = fd
        self._close = weakref.finalize(self, os.close, fd)  # once, by result() or when dropped
        self.size = 0

    capacity = 1 << 62  # never needs reserving

    def reserve(self, capacity: int) -> None:
        """Nothing to reserve: the file grows as values come."""

    def extend(self, values: np.ndarray) -> None:
        view = memoryview(np.ascontiguousarray(values, self.dtype).data).cast("B")
        at = self.size * self.dtype.itemsize
        while len(view):
            written = os.pwrite(self._fd, view, at)
            view, at = view[written:], at + written
        self.size += len(values)

    def result(self) -> np.ndarray:
        """The values, mapped read-only; the descriptor is closed (the map keeps the file alive)."""
        try:
            if not self.size:
                return np.zeros(0, self.dtype)
            mapped = mmap.mmap(self._fd, self.size * self.dtype.itemsize, access=mmap.ACCESS_READ)
            return np.frombuffer(mapped, self.dtype)
        finally:
            self._close()


def mapped_array(pieces: Iterable[np.ndarray], dtype: np.dtype[Any] | type) -> np.ndarray:
    """The pieces end to end as one mapped array, written one piece at a time (a mapped piece's
    pages are released once it is written)."""
    spilled = SpilledArray(np.dtype(dtype))
    for piece in pieces:
        spilled.extend(piece)
        release_pages(piece)
    return spilled.result()


def is_mapped(array: np.ndarray) -> bool:
    return _mapping(array) is not None


def release_pages(view: np.ndarray) -> None:
    """Drop the resident pages under `view`, a consecutive slice of a mapped array (else nothing)."""
    found = _mapping(view)
    if found is None or not view.nbytes or not view.flags.c_contiguous:
        return
    mapped, root = found
    start = view.ctypes.data - root.ctypes.data
    first = start - start % mmap.PAGESIZE
    stop = start + view.nbytes
    stop -= stop % mmap.PAGESIZE  # the partial page at the end may hold the next slice's values
    if stop > first:
        mapped.madvise(mmap.MADV_DONTNEED, first, stop - first)


GATHERED = 1 << 20  # values of a mapped array spanned by one chunk of a gather (8 MB of hashes)


def gather(array: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """`array[positions]` (ascending positions); a mapped array is read a span of it at a time,
    each span's pages released, so scattered reads never make the whole map resident."""
    if not is_mapped(array):
        taken: np.ndarray = array[positions]
        return taken
    out = np.empty(len(positions), array.dtype)
    bounds = np.searchsorted(positions, np.arange(0, len(array) + GATHERED, GATHERED)).tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        if hi > lo:
            out[lo:hi] = array[positions[lo:hi]]
            release_pages(array[int(positions[lo]) : int(positions[hi - 1]) + 1])
    return out


def _mapping(array: np.ndarray) -> tuple[mmap.mmap, np.ndarray] | None:
    """The map under a view of a mapped array, and the array that starts at the map's start."""
    base: Any = array
    while isinstance(base, np.ndarray):
        under = base.base.obj if isinstance(base.base, memoryview) else base.base
        if isinstance(under, mmap.mmap):
            return under, base
        base = base.base
    return None
