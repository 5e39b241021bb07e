"""Sessions in a replay: which whole conversations to keep, and how each turn hangs off the last.

Closed-loop replay (`--sessions closed`) sends a session's first turn at its recorded offset and
every later turn at the end of the previous one plus its recorded think time, so a candidate
slower than production never overlaps two turns of one conversation, as production never did.
Cutting a trace down (`--limit`, `--sample-sessions`, a time window) keeps sessions whole, so
the prefix reuse between turns survives. Pure numpy over trace columns, before the clock starts.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.replay.schedule import TraceSlice, select
from replayproxy.trace import Columns, ragged_rows

Mode = Literal["closed", "open"]
SessionsOption = Literal["auto", "closed", "open"]  # auto: closed when a session has several turns
MODES: tuple[SessionsOption, ...] = get_args(SessionsOption)
NONE = -1

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def has_multi_turn(cols: Columns) -> bool:
    """Whether any session has a later turn (then closed loop is the default)."""
    return bool(np.any((cols.session != 0) & (cols.turn > 0)))


def resolve(mode: str, cols: Columns) -> Mode:
    if mode not in MODES:
        raise BadOption(f"--sessions must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "auto":
        return "closed" if has_multi_turn(cols) else "open"
    return "closed" if mode == "closed" else "open"


def groups(cols: Columns) -> np.ndarray:
    """A group number per row, dense from 0: rows of one session share one; any other row is its own."""
    session = cols.session
    linked = session != 0
    _, inverse = np.unique(session[linked], return_inverse=True)
    group = np.empty(len(session), dtype=np.int64)
    group[linked] = inverse
    group[~linked] = len(np.unique(inverse)) + np.arange(int((~linked).sum()), dtype=np.int64)
    return group


def select_rows(
    cols: Columns, window: TraceSlice, mode: Mode, sample_sessions: float | None = None, seed: int = 0
) -> np.ndarray:
    """Rows to replay, in arrival order. Open loop cuts as before (by request); closed loop keeps
    every session whose first turn lies in the window whole, and `limit` then takes sessions in
    order of their first turn until at least `limit` requests are kept (the last one whole).
    `sample_sessions` keeps that fraction of sessions in both modes, chosen by a hash of the
    seed and the session, so the same seed keeps the same sessions."""
    group = groups(cols)
    keep = np.ones(len(cols), dtype=bool)
    if sample_sessions is not None:
        if not 0 < sample_sessions <= 1:
            raise BadOption(f"--sample-sessions must be in (0, 1], got {sample_sessions}")
        keep = _chosen(_group_keys(cols), seed, sample_sessions)
    if mode == "open":
        inside = select(cols.offset_ns[keep], TraceSlice(window.start_offset_s, window.duration_s))
        rows: np.ndarray = np.flatnonzero(keep)[inside]
        return rows[: window.limit] if window.limit is not None else rows
    firsts = _first_rows(group)  # per group, its first row (rows are in arrival order)
    in_window = np.zeros(len(cols), dtype=bool)
    in_window[select(cols.offset_ns, TraceSlice(window.start_offset_s, window.duration_s))] = True
    kept_groups = np.flatnonzero(in_window[firsts] & keep[firsts])
    if window.limit is not None:
        sizes = np.bincount(group, minlength=len(firsts))[kept_groups]
        order = np.argsort(firsts[kept_groups], kind="stable")
        enough = int(np.searchsorted(np.cumsum(sizes[order]), window.limit)) + 1 if window.limit else 0
        kept_groups = kept_groups[order[:enough]]
    chosen = np.zeros(len(firsts), dtype=bool)
    chosen[kept_groups] = True
    return np.flatnonzero(chosen[group]).astype(np.int64)


def _first_rows(group: np.ndarray) -> np.ndarray:
    firsts = np.full(int(group.max()) + 1 if len(group) else 0, len(group), dtype=np.int64)
    np.minimum.at(firsts, group, np.arange(len(group), dtype=np.int64))
    return firsts


def _group_keys(cols: Columns) -> np.ndarray:
    """A stable 64-bit key per row's group: the session id, or the row's own offset outside sessions."""
    keys: np.ndarray = np.where(cols.session != 0, cols.session, cols.offset_ns.astype(np.uint64) ^ _GOLDEN)
    return keys


def _chosen(keys: np.ndarray, seed: int, fraction: float) -> np.ndarray:
    """splitmix64 of (key, seed) below `fraction` of the range: a seeded coin per group."""
    with np.errstate(over="ignore"):
        z = keys.astype(np.uint64) ^ (np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _M2) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53) < fraction


class Links(NamedTuple):
    """Per selected row: the trace row of the request it continues (NONE: none, it goes at its
    offset), the trace rows of the further requests it waits for (`joins[join_index[i]:join_index[i
    + 1]]`), and the think time to wait after the last of them ended, at the replay's speed (ns)."""

    after: np.ndarray
    think_ns: np.ndarray
    joins: np.ndarray
    join_index: np.ndarray


def links(cols: Columns, rows: np.ndarray, speed: float) -> Links:
    """What each selected request waits for among the selected rows, and its think time: as
    recorded, else the recorded gap between the end of the last of them and this arrival (imported
    traces), at least 0. A request that names dependencies (`parent_id`, `join_ids`) waits for those
    selected: the turn it continues (`after`; the first selected join stands in when its parent is
    not selected) and every further one (`joins`), so branches of one turn each wait for it alone
    and run in parallel, and a join waits for all it joins; when none is selected it goes at its
    recorded offset. A request that names none (a trace without reply hashes) waits for its
    session's previous selected turn. Vectorized: traces of millions of requests are normal."""
    deps, dep_index = _dependencies(cols, rows)
    count = np.diff(dep_index)
    has = np.flatnonzero(count > 0)
    after = np.full(len(rows), NONE, dtype=np.int64)
    after[has] = deps[dep_index[has]]
    named = (cols.parent_id[rows] != 0) | (np.diff(cols.join_index)[rows] > 0)
    previous = _previous_turns(cols.session[rows], rows)
    unnamed = np.flatnonzero(~named & (previous >= 0))
    after[unnamed] = previous[unnamed]
    first_dep = np.zeros(len(deps), dtype=bool)
    first_dep[dep_index[has]] = True
    join_index = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.maximum(count - 1, 0), out=join_index[1:])
    think = np.full(len(rows), NONE, dtype=np.int64)
    waits = np.flatnonzero(after >= 0)
    if not len(waits):
        return Links(after, think, deps[~first_dep], join_index)
    ends = cols.offset_ns + np.maximum(cols.e2e_ns, 0)
    last_end = ends[after]
    if len(has):  # the last recorded end among each request's dependencies
        np.maximum.at(last_end, np.repeat(np.arange(len(rows)), count), ends[deps])
    row = rows[waits].astype(np.int64)
    recorded = cols.think_ns[row].astype(np.int64)
    recorded = np.where(recorded < 0, cols.offset_ns[row] - last_end[waits], recorded)
    think[waits] = np.rint(np.maximum(recorded, 0) / speed).astype(np.int64)  # half to even, as round()
    return Links(after, think, deps[~first_dep], join_index)


def _previous_turns(sessions: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per selected row, the trace row of its session's previous selected row; NONE for a first."""
    previous = np.full(len(rows), NONE, dtype=np.int64)
    linked = np.flatnonzero(sessions != 0)
    order = linked[np.argsort(sessions[linked], kind="stable")]  # by session, then selection order
    same = sessions[order[1:]] == sessions[order[:-1]]
    previous[order[1:][same]] = rows[order[:-1][same]]
    return previous


def _dependencies(cols: Columns, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per selected row, the trace rows of the selected earlier requests it names (its parent by
    `parent_id`, then its `join_ids` in order, each once), laid end to end, and their index."""
    parents = np.asarray(cols.parent_id[rows], dtype=np.uint64)
    join_ids, join_at = ragged_rows(cols.join_ids, cols.join_index, rows)
    owner = np.concatenate([np.arange(len(rows)), np.repeat(np.arange(len(rows)), np.diff(join_at))])
    named = np.concatenate([parents, np.asarray(join_ids, dtype=np.uint64)])
    rank = np.concatenate([np.zeros(len(rows), np.int64), 1 + np.arange(len(join_ids), dtype=np.int64)])
    chats = cols.chat_id[rows]
    found = np.full(len(named), NONE, dtype=np.int64)
    known = np.flatnonzero(chats != 0)
    if len(known):
        by_chat = known[np.argsort(chats[known], kind="stable")]  # the earliest of equal ids first
        sorted_chats = chats[by_chat]
        at = np.minimum(np.searchsorted(sorted_chats, named), len(by_chat) - 1)
        hit = (named != 0) & (sorted_chats[at] == named)
        found[hit] = rows[by_chat[at[hit]]]
    keep = (found >= 0) & (found < rows[owner])
    owner, found, rank = owner[keep], found[keep], rank[keep]
    order = np.lexsort((rank, owner))
    owner, found = owner[order], found[order]
    fresh = np.ones(len(found), dtype=bool)  # each dependency once: its first mention
    if len(found):
        pairs = owner * (int(found.max()) + 1) + found
        _, firsts = np.unique(pairs, return_index=True)
        fresh[:] = False
        fresh[firsts] = True
    owner, found = owner[fresh], found[fresh]
    index = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=len(rows)), out=index[1:])
    return found, index


def first_turns(
    rows: np.ndarray, after: np.ndarray, joins: np.ndarray | None = None, join_index: np.ndarray | None = None
) -> np.ndarray:
    """Per selected row, the trace row of the first selected request of its graph (itself when
    first): the smallest row connected to it through `after` and `joins` links, found by
    propagating the smallest label along the links and pointer doubling until nothing changes."""
    sorter = np.argsort(rows, kind="stable")
    child = np.flatnonzero(after >= 0)
    parent = after[child]
    if joins is not None and join_index is not None and len(joins):
        child = np.concatenate([child, np.repeat(np.arange(len(rows)), np.diff(join_index))])
        parent = np.concatenate([parent, joins])
    parent = sorter[np.searchsorted(rows, parent, sorter=sorter)]
    label = np.arange(len(rows), dtype=np.int64)
    while True:
        before = label.copy()
        low = np.minimum(label[child], label[parent])
        np.minimum.at(label, child, low)
        np.minimum.at(label, parent, low)
        label = label[label]
        if np.array_equal(label, before):
            break
    out: np.ndarray = rows[label].astype(np.int64)
    return out
