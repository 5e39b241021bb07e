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
from replayproxy.trace import Columns

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
    """Per selected row: the trace row of the turn before it in its session (NONE for a first
    turn), and the think time to wait after that turn's end, at the replay's speed (ns)."""

    after: np.ndarray
    think_ns: np.ndarray


def links(cols: Columns, rows: np.ndarray, speed: float) -> Links:
    """Each selected turn's predecessor among the selected rows, and its think time: as recorded,
    else the recorded gap between the previous turn's end and this arrival (imported traces), at
    least 0. The predecessor is the turn it continues (`parent_id`) where that is selected, so
    branches of one turn each wait for it alone and run in parallel; a request that also joins
    other replies (`join_ids`) waits for the one of them that ended last as recorded. Otherwise it
    is the session's previous selected turn. Vectorized: traces of millions of requests are normal."""
    after = np.full(len(rows), NONE, dtype=np.int64)
    think = np.full(len(rows), NONE, dtype=np.int64)
    sessions = cols.session[rows]
    linked = np.flatnonzero(sessions != 0)
    if not len(linked):
        return Links(after, think)
    order = linked[np.argsort(sessions[linked], kind="stable")]  # by session, then selection order
    same = sessions[order[1:]] == sessions[order[:-1]]
    later, earlier = order[1:][same], order[:-1][same]
    previous = rows[earlier].astype(np.int64)
    graph = _graph_predecessors(cols, rows)
    found = graph[later] >= 0
    previous[found] = graph[later][found]
    row = rows[later].astype(np.int64)
    after[later] = previous
    recorded = cols.think_ns[row].astype(np.int64)
    ends = cols.offset_ns[previous] + np.maximum(cols.e2e_ns[previous], 0)
    recorded = np.where(recorded < 0, cols.offset_ns[row] - ends, recorded)
    think[later] = np.rint(np.maximum(recorded, 0) / speed).astype(np.int64)  # half to even, as round()
    return Links(after, think)


def _graph_predecessors(cols: Columns, rows: np.ndarray) -> np.ndarray:
    """Per selected row, the trace row of the selected reply it waits for last: its parent (by
    `parent_id` = a selected row's `chat_id`), or among its parent and joins the one whose recorded
    reply ended last; NONE when none of them is selected."""
    out = np.full(len(rows), NONE, dtype=np.int64)
    chats = cols.chat_id[rows]
    named = np.flatnonzero(chats != 0)
    if not len(named):
        return out
    by_chat = named[np.argsort(chats[named], kind="stable")]
    sorted_chats = chats[by_chat]

    def find(ids: np.ndarray) -> np.ndarray:
        at = np.minimum(np.searchsorted(sorted_chats, ids), len(by_chat) - 1)
        return np.where((ids != 0) & (sorted_chats[at] == ids), rows[by_chat[at]], NONE).astype(np.int64)

    out[:] = find(cols.parent_id[rows])
    join_counts = np.diff(cols.join_index)[rows]
    ends = cols.offset_ns + np.maximum(cols.e2e_ns, 0)
    for position in np.flatnonzero(join_counts > 0).tolist():
        deps = find(cols.joins_of(int(rows[position])))
        deps = np.concatenate([deps, out[position : position + 1]])
        deps = deps[(deps >= 0) & (deps < rows[position])]
        if len(deps):
            out[position] = int(deps[np.argmax(ends[deps])])
    return out


def first_turns(rows: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Per selected row, the trace row of its session's first selected turn (itself when first):
    the `after` chains followed to their roots by pointer doubling."""
    sorter = np.argsort(rows, kind="stable")
    linked = after >= 0
    parent = np.arange(len(rows), dtype=np.int64)
    parent[linked] = sorter[np.searchsorted(rows, after[linked], sorter=sorter)]
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            break
        parent = grand
    out: np.ndarray = rows[parent].astype(np.int64)
    return out
