"""Prefix reuse of a trace: the share of input tokens an infinite prefix cache would serve.

One definition for `inspect` and for the profile a replay stores of its window, so both give one
figure for one set of requests. Vectorized: a hundred million hashes sort in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from replayproxy.trace.columns import Columns, ragged_rows
from replayproxy.trace.mapped import is_mapped, release_pages


def prefix_reuse(columns: Columns, rows: np.ndarray | None = None) -> float | None:
    """Share of input tokens in blocks some earlier request already had: an infinite prefix cache's hits.

    Hashes are chained, so an equal hash means an equal prefix up to that block. Char blocks are
    converted to tokens with each request's own tokens-per-char ratio. `rows` (arrival order)
    restricts it to those requests, "earlier" included: `inspect` takes them all, a replay its
    window. None when no request has hashes, or when files were hashed with different keys or
    block settings (not comparable).
    """
    settings = {(h.block_size, h.block_unit, h.hash_scheme, h.key_fingerprint) for h in columns.headers}
    if not len(columns.prefix_hashes) or len(settings) != 1:
        return None
    rows = np.arange(len(columns), dtype=np.int64) if rows is None else rows
    flat, index = ragged_rows(columns.prefix_hashes, columns.prefix_index, rows)
    if not len(flat):
        return 0.0 if len(rows) else None
    block_size, unit = columns.headers[0].block_size, columns.headers[0].block_unit
    hit_tokens = hit_blocks(flat, index).astype(np.float64) * block_size
    inputs = columns.input_tokens[rows].astype(np.float64)
    if unit != "token":
        units = columns.prefix_units[rows].astype(np.float64)
        hit_tokens = np.where(units > 0, hit_tokens * inputs / np.maximum(units, 1), 0.0)
    known = inputs > 0
    total = inputs[known].sum()
    return float(np.minimum(hit_tokens, inputs)[known].sum() / total) if total > 0 else None


def hit_blocks(flat: np.ndarray, index: np.ndarray, chunk: int = 1 << 22) -> np.ndarray:
    """Per request, how many of its hashes an earlier request (lower row) already had.

    Sorting (hash, row) pairs is what finds first sightings; packing a pair into one u64 lets
    numpy's fast value sort do it (an argsort of 10^8 hashes takes several times longer). The
    row takes the low bits, so the hash is compared on its other 64 - k bits, once on its top
    bits and once on its bottom ones. A shortened hash can only merge distinct hashes, which
    adds hits, so the smaller count is kept: it is wrong only if both shortenings merge
    something in the same request (odds ~1e-7 per request at 10^8 distinct blocks).
    """
    n = len(index) - 1
    bits = max(1, (n - 1).bit_length())
    if is_mapped(flat):
        return _hit_blocks_by_range(flat, index, bits, chunk)
    rows = np.repeat(np.arange(n, dtype=np.uint64), np.diff(index))
    keys = np.empty_like(flat)
    np.bitwise_and(flat, np.uint64(~((1 << bits) - 1) & (2**64 - 1)), out=keys)
    from_top = _later_sightings(np.bitwise_or(keys, rows, out=keys), bits, n, chunk)
    np.left_shift(flat, np.uint64(bits), out=keys)
    from_bottom = _later_sightings(np.bitwise_or(keys, rows, out=keys), bits, n, chunk)
    hits: np.ndarray = np.minimum(from_top, from_bottom)
    return hits


def _later_sightings(keys: np.ndarray, bits: int, n: int, chunk: int) -> np.ndarray:
    """Per row, its keys whose hash part also occurs with a lower row (keys = hash part | row).

    After the sort, neighbours are compared chunk by chunk so the temporaries stay small.
    """
    keys.sort()
    counts = np.zeros(n, dtype=np.int64)
    row_mask = np.uint64((1 << bits) - 1)
    for start in range(1, len(keys), chunk):
        current = keys[start : start + chunk]
        previous = keys[start - 1 : start - 1 + len(current)]
        repeated = ((current ^ previous) >> np.uint64(bits)) == 0
        counts += np.bincount((current[repeated] & row_mask).astype(np.intp), minlength=n)
    return counts


def _hit_blocks_by_range(flat: np.ndarray, index: np.ndarray, bits: int, chunk: int) -> np.ndarray:
    """`hit_blocks` of mapped hashes, one range of key values at a time: keys of different ranges
    differ in their top bits, so they are never neighbours in the sorted keys and each range is
    counted on its own, with the same result. Memory follows one range, not the trace."""
    n = len(index) - 1
    low = np.uint64(~((1 << bits) - 1) & (2**64 - 1))
    counts = []
    for shift in (0, bits):  # the hash's top bits, then its bottom ones (see hit_blocks)
        found = np.zeros(n, np.int64)
        for values, positions in value_ranges(flat, shift, with_positions=True):
            rows = (np.searchsorted(index, positions, side="right") - 1).astype(np.uint64)
            keys = (values << np.uint64(shift)) if shift else (values & low)
            found += _later_sightings(keys | rows, bits, n, chunk)
        counts.append(found)
    hits: np.ndarray = np.minimum(*counts)
    return hits


HASHES_PER_RANGE = 1 << 20  # hashes of one value range taken at a time (8 MB of them)
MAX_RANGES = 64  # passes over the hashes at most: huge traces take bigger ranges, not more passes
HASHES_PER_SLICE = 1 << 20  # hashes scanned at a time within a pass (8 MB)


def value_ranges(
    hashes: np.ndarray, shift: int = 0, with_positions: bool = False
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The hashes split by the top bits of `hashes << shift`, one range at a time: its hashes
    (in position order) and, if asked, their positions. Equal hashes fall in one range, so what
    needs every copy of a value (counting, first sightings) is done a range at a time; each
    pass reads the hashes a slice at a time and releases its pages (a mapped column)."""
    ranges = 1
    while ranges < MAX_RANGES and ranges * HASHES_PER_RANGE < len(hashes):
        ranges *= 2
    top = np.uint64(64 - ranges.bit_length() + 1)
    scratch = np.empty(min(len(hashes), HASHES_PER_SLICE), np.uint64)  # each slice's range numbers
    for which in range(ranges):
        values: list[np.ndarray] = []
        positions: list[np.ndarray] = []
        for start in range(0, len(hashes), HASHES_PER_SLICE):
            part = hashes[start : start + HASHES_PER_SLICE]
            if ranges > 1:
                number = scratch[: len(part)]
                np.right_shift(np.left_shift(part, np.uint64(shift), out=number), top, out=number)
                inside = np.flatnonzero(number == np.uint64(which))
            else:
                inside = np.arange(len(part))
            values.append(part[inside])
            if with_positions:
                positions.append(inside + start)
            release_pages(part)
        if values:
            yield np.concatenate(values), np.concatenate(positions) if positions else np.zeros(0, np.int64)
