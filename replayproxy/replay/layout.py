"""Exact prompts in token positions: where each message's content sits, and which word is at each position.

A templated prompt is the structure's template tokens with content between them (replay.prompt_parts);
every content word is one token, so a layout of content lengths fixes the total and every
position. A request that shares `S` tokens with its donor copies the donor's layout up to `S` and
puts its own content at `S`; message ends are put on block bounds where they fit, so a later
request's divergence point falls on content, not inside template tokens. Recorded block b holds
positions [bounds[b], bounds[b + 1]) (replay.block_bounds), the tail those from bounds[len(blocks)].
Words are chosen by position: inside recorded block b from (h_b, position in block), in the tail
from the request's own key, and the first content position of each block takes a *branch word*:
the i-th distinct continuation of a prefix gets the i-th word after a base drawn from that prefix,
so siblings differ from their first token on (for up to the alphabet's size of siblings). All pure.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from replayproxy.replay.prompt_parts import Structure
from replayproxy.replay.synth import _GOLDEN, _M1, _M2, _mix

_TAIL_SALT = np.uint64(0x7A11_5EED_0000_0001)


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """Content lengths of one prompt and the absolute position where each content starts."""

    roles: tuple[str, ...]
    lengths: tuple[int, ...]
    starts: tuple[int, ...]
    total: int
    structure: Structure

    def end(self, m: int) -> int:
        return self.starts[m] + self.lengths[m]


def _fill(
    roles: Sequence[str],
    structure: Structure,
    fixed: Sequence[int],
    first_min: int,
    total: int,
    marks: Sequence[int],
) -> TokenLayout | None:
    """Lengths for messages after `fixed` (the first at least `first_min`), each end moved to the
    nearest block bound (`marks`, increasing) where it falls among them and the move fits."""
    n = len(roles)
    budget = total - structure.overhead - sum(fixed)
    free = n - len(fixed)
    if free <= 0 or budget < first_min + free - 1:
        return None
    gaps = structure.gaps
    lengths, starts = list(fixed), []
    start = len(structure.head)
    for m, length in enumerate(fixed):
        starts.append(start)
        start += length + (gaps[m] if m < len(gaps) else 0)
    for idx in range(free):
        m = len(fixed) + idx
        after = free - idx - 1
        low = first_min if idx == 0 else 1
        if after == 0:
            size = budget
        else:
            size = max(low, budget // (after + 1))
            aligned = _nearest(marks, start + size) - start
            if low <= aligned <= budget - after:
                size = aligned
            size = min(size, budget - after)
        lengths.append(size)
        starts.append(start)
        budget -= size
        start += size + (gaps[m] if m < len(gaps) else 0)
    return TokenLayout(
        tuple(roles), tuple(lengths), tuple(starts), structure.overhead + sum(lengths), structure
    )


def _nearest(marks: Sequence[int], end: int) -> int:
    """The bound nearest to `end` when `end` lies between two of them (the lower on a tie), else `end`."""
    i = bisect_left(marks, end)
    if i == 0 or i >= len(marks):
        return end
    low, high = marks[i - 1], marks[i]
    return low if end - low <= high - end else high


def fresh(roles: Sequence[str], structure: Structure, total: int, marks: Sequence[int]) -> TokenLayout | None:
    return _fill(roles, structure, (), 1, total, marks)


def shared_layout(
    roles: Sequence[str],
    structure: Structure,
    total: int,
    marks: Sequence[int],
    shared: int,
    donor: TokenLayout | None,
) -> tuple[TokenLayout | None, int]:
    """A layout sharing `shared` tokens with `donor` where the template allows; (layout, tokens shared).

    Sharing that would end inside the donor's template tokens ends at the next content instead
    when this request has the same template tokens there (a later turn after the generation
    prompt), else at the donor's content end. None when the length cannot hold the prompt at all.
    """
    if donor is None or shared <= 0:
        return fresh(roles, structure, total, marks), 0
    shared = min(shared, donor.total, total - len(structure.closing) - 1)
    n = len(donor.lengths)
    m = next((i for i in range(n) if shared <= donor.end(i)), n - 1)
    # (fixed lengths, the next message's minimum length, tokens shared, donor messages in the span)
    plan: tuple[list[int], int, int, int]
    if donor.starts[m] <= shared <= donor.end(m):
        plan = (list(donor.lengths[:m]), shared - donor.starts[m] + 1, shared, m + 1)
    else:
        if shared > donor.end(m):  # past the last content: inside the donor's generation prompt
            gap, next_start = donor.structure.closing, donor.total
        else:  # inside the template tokens before message m: those after message m - 1
            if m == 0:
                return fresh(roles, structure, total, marks), 0
            m -= 1
            gap, next_start = donor.structure.between[m], donor.starts[m + 1]
        if len(roles) > m + 1 and m < len(structure.between) and structure.between[m] == gap:
            plan = (list(donor.lengths[: m + 1]), 1, next_start, m + 1)
        else:
            plan = (list(donor.lengths[:m]), donor.lengths[m] + 1, donor.end(m), m + 1)
    fixed, first_min, realized, copied = plan
    same_template = (
        tuple(roles[:copied]) == donor.roles[:copied]
        and structure.head == donor.structure.head
        and structure.between[: copied - 1] == donor.structure.between[: copied - 1]
    )
    layout = _fill(roles, structure, fixed, first_min, total, marks) if same_template else None
    if layout is None:
        return fresh(roles, structure, total, marks), 0
    return layout, realized


def branch_ranks(parents: np.ndarray, children: np.ndarray) -> np.ndarray:
    """For each (parent, child) pair in planning order, the rank of the child among its parent's
    distinct children by first appearance: equal pairs get equal ranks, siblings distinct ones."""
    if not len(parents):
        return np.zeros(0, np.int64)
    pair = _mix(parents ^ _mix(children))
    unique, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
    order = np.lexsort((first, parents[first]))
    group = parents[first][order]
    starts = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))
    ranks_sorted = np.arange(len(order)) - np.repeat(starts, np.diff(np.append(starts, len(order))))
    ranks = np.empty(len(unique), np.int64)
    ranks[order] = ranks_sorted
    out: np.ndarray = ranks[inverse.reshape(-1)]
    return out


def _mix64(x: np.ndarray) -> np.ndarray:
    """synth's splitmix64 finalizer for arrays, without its error-state guard (arrays wrap silently)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def tail_keys(rows: np.ndarray) -> np.ndarray:
    """Each request's own key, for the positions past its recorded blocks."""
    return _mix64(rows.astype(np.uint64) ^ _TAIL_SALT)


def branch_words(parents: np.ndarray, ranks: np.ndarray, size: int) -> np.ndarray:
    """The branch word of each (parent, rank): a base drawn from the parent, plus the rank."""
    out: np.ndarray = ((_mix64(parents.astype(np.uint64)) % np.uint64(size)).astype(np.int64) + ranks) % size
    return out


class PositionCodes:
    """mix(position ^ seed) for positions 0..n, grown on demand: the seed's part of every word code."""

    def __init__(self, seed: np.uint64) -> None:
        self._seed = seed
        self._table = np.zeros(0, np.uint64)

    def upto(self, need: int) -> np.ndarray:
        """The codes of positions 0..need-1 (a view of the table, at least that long)."""
        if need > len(self._table):
            size = max(need, 2 * len(self._table), 4096)
            self._table = _mix64(np.arange(size, dtype=np.uint64) ^ self._seed)
        return self._table


def word_indices(
    plan: TokenLayout,
    hashes: np.ndarray,
    own_key: np.uint64,
    branch: np.ndarray,
    marks: Sequence[int],
    codes: PositionCodes,
    size: int,
    first: int = 0,
) -> np.ndarray:
    """Alphabet index of the word at each absolute position p of one request's prompt from
    marks[first] (the start of block `first`, the words before it known already) up to its last
    content, at p - marks[first] (template positions hold values nobody reads).

    `marks` holds where each recorded block starts and then where the tail starts, `branch` the
    branch word of each (len(hashes) + 1 values each). Run for every exact prompt, so it costs a
    fixed dozen array operations whatever the number of blocks and messages: the recorded blocks'
    codes by two repeats, the tail's in one, the mix in place, then the branch words by slices,
    one per message.
    """
    end = plan.end(len(plan.lengths) - 1)
    blocks = len(hashes)
    start = marks[first]
    last = bisect_left(marks, end, first, blocks)  # blocks from `first` before `last` hold a position < end
    recorded = min(end, marks[last])
    z = np.empty(max(end - start, 0), np.uint64)
    table = codes.upto(max(end, 1))
    if recorded > start:
        starts = np.array(marks[first : last + 1], np.int64)
        starts[-1] = recorded
        lengths = starts[1:] - starts[:-1]
        within = np.arange(start, recorded) - np.repeat(starts[:-1], lengths)
        np.bitwise_xor(table[within], np.repeat(hashes[first:last], lengths), out=z[: recorded - start])
    tail = max(recorded, start)
    if end > tail:
        np.bitwise_xor(table[tail:end], own_key, out=z[tail - start : end - start])
    z += _GOLDEN
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    z %= np.uint64(size)
    chosen = z.view(np.int64)
    _place_branch_words(chosen, plan, branch, marks, start)
    return chosen


def _place_branch_words(
    chosen: np.ndarray, plan: TokenLayout, branch: np.ndarray, marks: Sequence[int], offset: int
) -> None:
    """Block b's branch word goes on the first content position at or after marks[b] when that
    position is still inside block b (the tail, the last mark, has no end). Per message: the block
    starts it holds, and its own first position when it opens a block whose start fell on
    template tokens with no content before it. Positions before `offset` are left."""
    before = -1  # end of the previous message's content
    for start, length in zip(plan.starts, plan.lengths, strict=True):
        if length <= 0:
            continue
        stop = start + length
        if stop > offset:
            low, high = bisect_left(marks, max(start, offset)), bisect_right(marks, stop - 1)
            if low < high:
                at = np.asarray(marks[low:high], np.int64) - offset
                chosen[at] = branch[low:high]
            opened = bisect_right(marks, start) - 1
            if start >= offset and marks[opened] < start and before <= marks[opened]:
                chosen[start - offset] = branch[opened]
        before = stop
