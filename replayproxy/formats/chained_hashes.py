"""Imported prefix hashes, chained a batch of rows at a time and kept out of memory once they are many.

A reader hands each batch's source hash ids here as it parses them; only each row's full blocks
are chained (a trailing partial block is never shared) and the ids are dropped at once. Hashes are
the one part of an import that grows with rows × blocks (770 M for a million 12k-token prompts in
16-token blocks), so past `MEMORY_BYTES` they go to an unlinked temporary file and are read back a
trace frame at a time, in arrival order, when the trace is written. The per-row counts go to
temporary files from the start (mapped when read), so no part of the hashes grows in memory by row.
"""

from __future__ import annotations

import os
import tempfile
import weakref

import numpy as np

from replayproxy.formats.idchain import chain_hashes
from replayproxy.trace.mapped import SpilledArray, release_pages

MEMORY_BYTES = 32 << 20  # hashes held in memory before they go to the temporary file
_ITEM = np.dtype(np.uint64).itemsize


class ChainedHashes:
    """Per row (in the reader's order): its chained full-block hashes and whether it had ids at all."""

    def __init__(self, block_size: int, memory_bytes: int | None = None) -> None:
        self.block_size = block_size
        self._memory_bytes = MEMORY_BYTES if memory_bytes is None else memory_bytes
        self._held: list[np.ndarray] = []  # hashes not yet in the file
        self._held_bytes = 0
        self._counts = SpilledArray(np.dtype(np.int64))  # hashes kept per row
        self._had_ids = SpilledArray(np.dtype(np.bool_))
        self._mapped: tuple[np.ndarray, np.ndarray] | None = None  # both, once read
        self.total = 0  # hashes kept in all
        self._fd = -1
        self._file_bytes = 0
        self._flat: np.ndarray | None = None  # every hash, when they stayed in memory

    def add(self, ids: np.ndarray, id_counts: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        """One batch of rows: flat source ids, ids per row, and each row's input tokens. Returns the
        batch's chained hashes (each row's kept blocks, in order)."""
        id_counts = np.asarray(id_counts, np.int64)
        keep = np.minimum(id_counts, np.maximum(np.asarray(inputs, np.int64), 0) // self.block_size)
        hashes = chain_hashes(np.asarray(ids, np.int64), id_counts, keep=keep)
        self._counts.extend(keep)
        self._had_ids.extend(id_counts > 0)
        self.total += int(keep.sum())
        self._held.append(hashes)
        self._held_bytes += hashes.nbytes
        if self._held_bytes > self._memory_bytes:
            self._spill()
        return hashes

    def counts(self) -> np.ndarray:
        """Hashes kept per row (mapped; no rows can be added once read)."""
        return self._read_rows()[0]

    def had_ids(self) -> np.ndarray:
        """Rows whose source line listed hash ids (their hashed length is known; mapped)."""
        return self._read_rows()[1]

    def _read_rows(self) -> tuple[np.ndarray, np.ndarray]:
        if self._mapped is None:
            self._mapped = self._counts.result(), self._had_ids.result()
        return self._mapped

    def in_order(self, order: np.ndarray | None) -> tuple[_Reordered, np.ndarray]:
        """The hashes of rows `order[0], order[1], ...` (None: as added) as `trace.write_columns`
        takes a ragged column: a function giving the flat hashes of output rows [lo, hi), and
        counts per row."""
        counts = self.counts()
        return self.rows_in(order), counts if order is None else counts[order]

    def rows_in(self, order: np.ndarray | None) -> _Reordered:
        """A function giving the flat hashes of output rows [lo, hi), output row j being row
        order[j] (None: j)."""
        return _Reordered(self, order, self.counts())

    def read(self, first: int, stop: int) -> np.ndarray:
        """Flat hashes [first, stop) in the order they were added."""
        if self._fd < 0:
            if self._flat is None:
                self._flat = _joined(self._held, np.uint64)
                self._held = [self._flat]
            return self._flat[first:stop]
        self._spill()
        out = np.empty(stop - first, np.uint64)
        view, at = memoryview(out.data).cast("B"), first * _ITEM
        while len(view):
            got = os.preadv(self._fd, [view], at)
            if not got:
                raise OSError(f"the import's temporary hash file ended at byte {at}")
            view, at = view[got:], at + got
        return out

    def _spill(self) -> None:
        if self._fd < 0:
            fd, name = tempfile.mkstemp(prefix="replayproxy-import-", suffix=".hashes")
            os.unlink(name)  # gone with the process, whatever happens
            self._fd = fd
            weakref.finalize(self, os.close, fd)
        for hashes in self._held:
            view = memoryview(hashes.data).cast("B")
            while len(view):
                written = os.pwrite(self._fd, view, self._file_bytes)
                self._file_bytes += written
                view = view[written:]
        self._held, self._held_bytes, self._flat = [], 0, None


class _Reordered:
    """Flat hashes of output rows [lo, hi), where output row j is input row order[j] (or j)."""

    def __init__(self, hashes: ChainedHashes, order: np.ndarray | None, counts: np.ndarray) -> None:
        self._hashes = hashes
        self._order = order
        self._counts = counts
        self._starts = _mapped_starts(counts)

    def __call__(self, lo: int, hi: int) -> np.ndarray:
        starts, counts = self._starts, self._counts
        if self._order is None:
            return self._hashes.read(int(starts[lo]), int(starts[hi]))
        rows = self._order[lo:hi]
        ranked = np.sort(rows)
        # rows stored one after another are read in one piece: an input already in arrival order
        # reads each frame's hashes with one call
        breaks = np.flatnonzero(np.diff(ranked) != 1) + 1
        firsts = ranked[np.concatenate([[0], breaks])] if len(ranked) else ranked
        lasts = ranked[np.concatenate([breaks - 1, [len(ranked) - 1]])] if len(ranked) else ranked
        pieces = [
            self._hashes.read(int(starts[a]), int(starts[b + 1]))
            for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True)
        ]
        flat = np.concatenate(pieces) if pieces else np.zeros(0, np.uint64)
        if np.array_equal(rows, ranked):
            release_pages(starts)
            return flat
        taken = take_rows(flat, counts[ranked], np.searchsorted(ranked, rows))
        release_pages(starts)
        release_pages(counts)
        return taken


ROWS_AT_ONCE = 1 << 20


def _mapped_starts(counts: np.ndarray) -> np.ndarray:
    """Where each row's hashes start (and, last, the total), summed a million rows at a time into a
    mapped array."""
    starts = SpilledArray(np.dtype(np.int64))
    at = 0
    starts.extend(np.zeros(1, np.int64))
    for lo in range(0, len(counts), ROWS_AT_ONCE):
        summed = np.cumsum(counts[lo : lo + ROWS_AT_ONCE], dtype=np.int64) + at
        release_pages(counts[lo : lo + ROWS_AT_ONCE])
        starts.extend(summed)
        at = int(summed[-1])
    return starts.result()


def take_rows(flat: np.ndarray, counts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The flat values of `rows` (indices into the rows that `counts` describes), in that order."""
    starts = np.cumsum(counts) - counts
    moved = counts[rows]
    index = np.repeat(starts[rows], moved) + (
        np.arange(int(moved.sum())) - np.repeat(np.cumsum(moved) - moved, moved)
    )
    taken: np.ndarray = flat[index]
    return taken


def _joined(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype)
