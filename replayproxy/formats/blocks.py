"""Recorded prefix hashes re-blocked into the integer `hash_ids` that Mooncake-style consumers read.

Target block j of a request covers tokens [jB, (j+1)B). It gets a *shared* id when it is full and
the recorded chain covers it: its identity is the recorded chain hash of the recorded block holding
its last token (with j mixed in when several target blocks can end in one recorded block). Chained
hashes make that exact when the recorded unit is tokens and B is a multiple of the recorded block
size; otherwise equal ids still imply equal recorded prefixes (never invented sharing), and some
real sharing inside a recorded block is not shown. Every other
block — beyond the hashed prefix, or the trailing partial block — gets a fresh id used once, so no
id ever stands for two block lengths (AIPerf rejects that). Distinct identities become consecutive
integers in first-seen order, as the published traces are. docs/formats.md has the details.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from replayproxy.errors import BadInputFile, BadOption
from replayproxy.formats.exporting import row_chunks
from replayproxy.trace import Columns
from replayproxy.trace.mapped import release_pages
from replayproxy.trace.reuse import value_ranges


def source_blocks(cols: Columns) -> tuple[int, str]:
    """The one block size and unit of all loaded files (ids from different blockings cannot match)."""
    kinds = {(h.block_size, h.block_unit) for h in cols.headers}
    if len(kinds) != 1:
        raise BadInputFile(
            f"traces hashed with different block sizes/units {sorted(kinds)}; export them separately"
        )
    return kinds.pop()


def export_block(cols: Columns, given: int | None, convention: int) -> int:
    """Tokens per exported id: the one given, else the trace's own token block size (so every shared
    block it recorded stays shared), else (char blocks) the consumer's `convention`."""
    if given:
        return given
    size, unit = source_blocks(cols)
    return size if unit == "token" else convention


class ReuseTally:
    """Prefix reuse of the exported ids, as `trace.reuse.prefix_reuse` defines it for the trace: the
    share of input tokens in blocks whose id an earlier request already had. Ids are numbered in
    first-seen order (`_number`), so an earlier request's ids are exactly those below the largest
    id seen before this request."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._seen = 0  # ids below this were taken by earlier requests
        self._hit = 0
        self._total = 0

    def add(self, ids: np.ndarray, counts: np.ndarray, tokens: np.ndarray) -> None:
        """One chunk of consecutive requests: their flat ids, ids per request and input tokens."""
        n = len(counts)
        starts = np.cumsum(counts) - counts
        row_max = np.full(n, -1, np.int64)
        has = counts > 0
        if has.any():
            row_max[has] = np.maximum.reduceat(ids, starts[has])
        through = np.maximum.accumulate(np.concatenate([[self._seen - 1], row_max]))
        before = through[:-1] + 1  # per request: ids below this are earlier requests'
        self._seen = int(through[-1]) + 1
        rows = np.repeat(np.arange(n), counts)
        hits = np.bincount(rows[ids < before[rows]], minlength=n)
        known = tokens > 0
        self._hit += int(np.minimum(hits * self.block_tokens, tokens)[known].sum())
        self._total += int(tokens[known].sum())

    @property
    def reuse(self) -> float | None:
        return self._hit / self._total if self._total else None


def input_tokens_of(cols: Columns, rows: slice = slice(None)) -> np.ndarray:
    """Input tokens of `rows`, falling back to the hashed prompt length for token-unit traces;
    unknown → 0."""
    tokens = cols.input_tokens[rows].astype(np.int64)
    _, unit = source_blocks(cols)
    if unit == "token":
        tokens = np.where(tokens < 0, cols.prefix_units[rows], tokens)
    return np.maximum(tokens, 0)


BLOCKS_PER_CHUNK = 1 << 18  # target blocks re-blocked at a time: memory stays bounded whatever the size


def _block_counts(cols: Columns, rows: slice, block_tokens: int) -> np.ndarray:
    counts: np.ndarray = -(-input_tokens_of(cols, rows) // block_tokens)
    return counts


def _total_blocks(cols: Columns, block_tokens: int) -> int:
    """Target blocks of the whole trace, counted a window of rows at a time."""
    return sum(int(_block_counts(cols, rows, block_tokens).sum()) for rows in row_chunks(len(cols)))


def _chunk_bounds(cols: Columns, block_tokens: int, blocks_per_chunk: int, total: int) -> Iterator[slice]:
    """Consecutive row ranges: each ends after the row whose blocks reach the next multiple of
    `blocks_per_chunk` (counted from the start of the trace, below `total`), found a window of
    rows at a time, so no per-row array of the whole trace is held."""
    n, start, base, mark = len(cols), 0, 0, blocks_per_chunk
    for rows in row_chunks(n):
        ends = base + np.cumsum(_block_counts(cols, rows, block_tokens))
        while mark < total and mark <= int(ends[-1]):
            stop = rows.start + int(np.searchsorted(ends, mark)) + 1
            if stop > start:
                yield slice(start, stop)
                start = stop
            mark += blocks_per_chunk
        base = int(ends[-1])
    if start < n:
        yield slice(start, n)


def block_ids(cols: Columns, block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Per request `ceil(input_tokens / block_tokens)` ids; returns the flat ids and per-request counts."""
    chunks = list(iter_block_ids(cols, block_tokens))
    if not chunks:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([ids for ids, _ in chunks]), np.concatenate([counts for _, counts in chunks])


def iter_block_ids(
    cols: Columns,
    block_tokens: int,
    blocks_per_chunk: int = BLOCKS_PER_CHUNK,
    tally: ReuseTally | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`block_ids` for consecutive chunks of requests (flat ids, counts), numbered across chunks.

    Only blocks whose recorded hash occurs more than once can ever share an id, so the table
    carried from chunk to chunk holds those identities alone, not every block of the trace. A
    chunk's hashes are released from memory once it is numbered (trace.release_pages), so a trace
    loaded with its hashes on disk is read through, never held.
    """
    if block_tokens <= 0:
        raise BadOption(f"--block-size must be positive, got {block_tokens}")
    size, unit = source_blocks(cols)
    recurring = _recurring(cols.prefix_hashes)
    total = _total_blocks(cols, block_tokens)
    mixed = unit != "token" or block_tokens % size != 0
    known: _Numbered | _NumberedByHash = _Numbered() if mixed else _NumberedByHash(len(recurring), total)
    next_id = 0
    for rows in _chunk_bounds(cols, block_tokens, blocks_per_chunk, total):
        tokens = input_tokens_of(cols, rows)
        counts = -(-tokens // block_tokens)
        where, identity = _shareable(cols, tokens, rows, counts, block_tokens, size, unit, recurring)
        ids, next_id = _number(int(counts.sum()), where, identity, known, next_id)
        if tally is not None:
            tally.add(ids, counts, tokens)
        release_pages(
            cols.prefix_hashes[int(cols.prefix_index[rows.start]) : int(cols.prefix_index[rows.stop])]
        )
        yield ids, counts
        cols.release(rows)  # once the caller wrote these rows


def iter_row_ids(
    cols: Columns, block_tokens: int, tally: ReuseTally | None = None
) -> Iterator[tuple[slice, list[list[int]]]]:
    """Per chunk: the rows it covers and each row's ids as a list (what JSON writers emit)."""
    first = 0
    for flat, counts in iter_block_ids(cols, block_tokens, tally=tally):
        ids = flat.tolist()
        ends = np.cumsum(counts).tolist()
        yield (
            slice(first, first + len(counts)),
            [ids[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)],
        )
        first += len(counts)


def repeated_ids(cols: Columns, block_tokens: int) -> np.ndarray:
    """Which ids `iter_block_ids` gives to more than one block (a first pass over the trace), as a
    bit per id (ids are consecutive from 0): `is_repeated(bits, ids)` reads it. One bit per
    block of the trace, whatever its sharing, instead of a sorted array of the repeated ids.

    Fresh ids are used once, so an id repeats when it occurs twice in one chunk or comes back in a
    later chunk (numbered before that chunk starts).
    """
    blocks = _total_blocks(cols, block_tokens) if block_tokens > 0 else 0
    bits = np.zeros((blocks + 7) // 8, np.uint8)
    numbered = 0  # ids below this were handed out in earlier chunks
    for ids, _ in iter_block_ids(cols, block_tokens):
        unique, counts = np.unique(ids, return_counts=True)
        _set_bits(bits, unique[(counts > 1) | (unique < numbered)])
        if len(unique):
            numbered = max(numbered, int(unique[-1]) + 1)
    return bits


def _set_bits(bits: np.ndarray, ids: np.ndarray) -> None:
    """Set the bits of sorted, distinct `ids` (ids sharing a byte are OR-ed together first)."""
    if not len(ids):
        return
    at = ids >> 3
    masks = np.left_shift(1, ids & 7).astype(np.uint8)
    starts = np.flatnonzero(np.concatenate([[True], at[1:] != at[:-1]]))
    bits[at[starts]] |= np.bitwise_or.reduceat(masks, starts)


def is_repeated(bits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Per id, whether `repeated_ids` found it on more than one block."""
    found: np.ndarray = ((bits[ids >> 3] >> (ids & 7).astype(np.uint8)) & 1).astype(bool)
    return found


def _recurring(hashes: np.ndarray) -> np.ndarray:
    """Sorted recorded hashes that occur at least twice (the only ones behind a shared id).

    Exact answers need every distinct hash at hand, so instead of one sorted copy of all hashes
    each pass counts one range of values (trace.reuse.value_ranges): the working set is one
    range's hashes, plus the answer itself (8 bytes per recurring hash); a mapped trace is read
    a slice at a time and never resident as a whole.
    """
    found = [np.zeros(0, hashes.dtype)]
    for values, _ in value_ranges(hashes):
        unique, counts = np.unique(values, return_counts=True)
        found.append(unique[counts > 1])
    # The ranges come in order of their top bits, so the concatenation is sorted already.
    return np.concatenate(found)


def _shareable(
    cols: Columns,
    chunk_tokens: np.ndarray,
    rows: slice,
    counts: np.ndarray,
    block_tokens: int,
    size: int,
    unit: str,
    recurring: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions (in the chunk) of blocks that may share an id, and their identities: the
    recorded hash's index in `recurring` when one target block ends in each recorded block, else
    the hash mixed with the target block's position."""
    first = rows.start
    row = np.repeat(np.arange(len(counts)), counts)
    j = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
    end = (j + 1) * block_tokens  # one past the block's last token
    index = cols.prefix_index[first : first + len(counts) + 1]
    recorded = np.diff(index)
    if unit == "token":
        holder = (end + size - 1) // size - 1  # recorded block holding the target block's last token
        shared = (end <= chunk_tokens[row]) & (holder < recorded[row])
    else:  # char blocks: tokens per char from the request's own counts
        units = cols.prefix_units[rows].astype(np.float64)
        per_unit = np.where(units > 0, chunk_tokens / np.maximum(units, 1), 0.0)
        span = np.maximum(size * per_unit[row], 1e-9)
        holder = np.ceil(end / span - 1e-9).astype(np.int64) - 1
        shared = (end <= chunk_tokens[row]) & (holder < recorded[row]) & (per_unit[row] > 0)
    where = np.flatnonzero(shared)
    identity = cols.prefix_hashes[index[row[where]] + holder[where]]
    at = np.minimum(_sorted_search(recurring, identity), max(len(recurring) - 1, 0))
    seen_twice = recurring[at] == identity if len(recurring) else np.zeros(len(identity), bool)
    where, identity = where[seen_twice], identity[seen_twice]
    if unit != "token" or block_tokens % size:
        # Several target blocks can end in one recorded block: the position joins the key.
        identity = _mix(identity ^ (j[where].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
        return where, identity
    return where, at[seen_twice]  # the hash's place among the recurring ones stands for it


def _sorted_search(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """`np.searchsorted(table, keys)`, with the keys searched in sorted order: numpy then starts
    each search where the last ended, so a table larger than the CPU caches (millions of recurring
    hashes) is walked forwards instead of probed at random, which made an export's time per row
    grow with the trace."""
    order = np.argsort(keys)
    found = np.empty(len(keys), np.intp)
    found[order] = np.searchsorted(table, keys[order])
    return found


class _Numbered:
    """Identities numbered so far (sorted) and their ids: a lookup is one vectorized search, and
    16 bytes per identity instead of a dict entry's ~100 (millions of shared 16-token blocks)."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.uint64)
        self.ids = np.zeros(0, np.int64)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The id of each (sorted, unique) key; -1 where it has none yet."""
        if not len(self.keys):
            return np.full(len(keys), -1, np.int64)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        found: np.ndarray = np.where(self.keys[at] == keys, self.ids[at], -1)
        return found

    def add(self, keys: np.ndarray, ids: np.ndarray) -> None:
        """Learn new (sorted, unknown) keys, keeping the table sorted."""
        at = np.searchsorted(self.keys, keys)
        self.keys = np.insert(self.keys, at, keys)
        self.ids = np.insert(self.ids, at, ids)


class _NumberedByHash:
    """Ids of recurring hashes, by the hash's index in the sorted recurring set: 4 bytes per
    recurring hash (8 past 2**31 blocks), allocated once, never copied; -1 until numbered."""

    def __init__(self, recurring: int, blocks: int) -> None:
        self.ids = np.full(recurring, -1, np.int32 if blocks < 2**31 else np.int64)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        found: np.ndarray = self.ids[keys].astype(np.int64)
        return found

    def add(self, keys: np.ndarray, ids: np.ndarray) -> None:
        self.ids[keys] = ids


def _number(
    total: int, where: np.ndarray, identity: np.ndarray, known: _Numbered | _NumberedByHash, next_id: int
) -> tuple[np.ndarray, int]:
    """Consecutive ints in order of first appearance; blocks at `where` with equal identity share one.

    `known` maps identities numbered in earlier chunks to their ids and learns this chunk's.
    """
    keys, first_at, inverse = np.unique(identity, return_index=True, return_inverse=True)
    earlier = known.lookup(keys)
    is_new = np.ones(total, bool)  # blocks that take the next number: fresh ones and first sightings
    is_new[where] = False
    is_new[where[first_at[earlier < 0]]] = True
    numbers = next_id + np.cumsum(is_new) - 1
    ids = numbers.copy()
    fresh = earlier < 0
    earlier[fresh] = numbers[where[first_at[fresh]]]
    known.add(keys[fresh], earlier[fresh])
    ids[where] = earlier[inverse]
    return ids, next_id + int(is_new.sum())


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))  # type: ignore[no-any-return]
