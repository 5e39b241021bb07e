"""Per-session figures of a run: turns per session, makespan, latency by depth, overlaps, think time.

A session's time (its makespan, what an agent's task is judged by) is its first turn's send to its
last turn's end (DESIGN.md, "session time"); the time to finish it counts from the first turn's
*scheduled* send, so a late start shows. Per-step latency is grouped by `turn`, the request's depth
in the session graph (longest path from a root), in power-of-two buckets. A later
turn's think time as replayed is its send minus the end of the turn it followed (`after`); its
error is that minus the think time the schedule gave it (`think_ns`). A negative replayed think
time is an overlap: the turn went out while the one before it was still running, which never
happened in production. For the production baseline the same figures come from the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replayproxy.report.document_types import DepthRow, SessionsDoc, ThinkFigures
from replayproxy.report.measures import NS_PER_MS, NS_PER_S, Requests
from replayproxy.report.stats import summarize

DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64)  # lower bounds; each bucket runs to the next one's


def _empty() -> np.ndarray:
    return np.zeros(0)


@dataclass(slots=True)
class SessionColumns:
    """Per request: session id (0: none), turn, trace index of the turn it followed, planned think."""

    index: np.ndarray
    session: np.ndarray
    after: np.ndarray  # -1: first turn, or not known
    think_ns: np.ndarray  # the think time it should have had; -1 unknown
    sent_ns: np.ndarray
    scheduled_ns: np.ndarray  # -1 when the run had no schedule (the baseline)
    e2e_ns: np.ndarray  # from the send; -1 when it never ended
    # depth in the session graph, and the Measures' TTFT/E2E (NaN: failed); empty: not known
    turn: np.ndarray = field(default_factory=_empty)
    ttft_ms: np.ndarray = field(default_factory=_empty)
    e2e_ms: np.ndarray = field(default_factory=_empty)


def previous_turns(session: np.ndarray) -> np.ndarray:
    """For requests in arrival order: the index of the previous request of the same session, or -1."""
    after = np.full(len(session), -1, np.int64)
    last: dict[int, int] = {}
    for i, s in enumerate(session.tolist()):
        if s:
            after[i] = last.get(s, -1)
            last[s] = i
    return after


def session_groups(session: np.ndarray) -> tuple[np.ndarray, int]:
    """Each request's session number in [0, count): a request outside a session is one of its own."""
    linked = session != 0
    _, linked_group = np.unique(session[linked], return_inverse=True)
    sessions = int(linked_group.max()) + 1 if linked.any() else 0
    group = np.empty(len(session), np.int64)
    group[linked] = linked_group
    loose = int((~linked).sum())
    group[~linked] = sessions + np.arange(loose)
    return group, sessions + loose


def makespans_ns(group: np.ndarray, count: int, sent_ns: np.ndarray, e2e_ns: np.ndarray) -> np.ndarray:
    """Per session: its first request's send to its last request's end (a request that never
    ended counts at its send)."""
    ends = np.where(e2e_ns >= 0, sent_ns + e2e_ns, sent_ns)
    first_sent = np.full(count, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first_sent, group, sent_ns)
    last_end = np.full(count, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(last_end, group, ends)
    return last_end - first_sent


def session_columns(req: Requests, ttft_ms: np.ndarray, e2e_ms: np.ndarray) -> SessionColumns | None:
    """A run's session columns, or None for a result file from before sessions were recorded."""
    if not (len(req.session) == len(req.after) == len(req.think_ns) == len(req)):
        return None
    turn = req.turn if len(req.turn) == len(req) else np.zeros(0, np.int64)
    return SessionColumns(
        req.index,
        req.session,
        req.after,
        req.think_ns,
        req.sent_ns,
        req.scheduled_ns,
        req.e2e_ns,
        turn,
        ttft_ms,
        e2e_ms,
    )


def session_doc(cols: SessionColumns) -> SessionsDoc | None:
    """The report's `sessions` entry, or None when no session has more than one turn."""
    linked = cols.session != 0
    if not linked.any():
        return None
    ids, group, turns = np.unique(cols.session[linked], return_inverse=True, return_counts=True)
    if turns.max() < 2:
        return None
    sent = cols.sent_ns[linked]
    makespan = makespans_ns(group, len(ids), sent, cols.e2e_ns[linked])
    first_sent = np.full(len(ids), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first_sent, group, sent)
    last_end = first_sent + makespan
    scheduled = cols.scheduled_ns[linked]
    finish = None
    if (scheduled >= 0).all():
        first_scheduled = np.full(len(ids), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first_scheduled, group, scheduled)
        finish = summarize((last_end - first_scheduled) / NS_PER_S).to_dict()
    return {
        "sessions": len(ids),
        "multi_turn_sessions": int((turns > 1).sum()),
        "turns_per_session": summarize(turns.astype(np.float64)).to_dict(),
        "session_s": summarize(makespan / NS_PER_S).to_dict(),
        "finish_from_schedule_s": finish,
        "by_depth": depth_rows(cols.turn[linked], cols.ttft_ms[linked], cols.e2e_ms[linked])
        if len(cols.turn) == len(cols.session) == len(cols.ttft_ms) == len(cols.e2e_ms)
        else None,
        **_think_figures(cols),
    }


def depth_rows(turn: np.ndarray, ttft_ms: np.ndarray, e2e_ms: np.ndarray) -> list[DepthRow]:
    """TTFT and E2E p50/p95 of the requests at each depth bucket that has any."""
    bucket = np.searchsorted(DEPTH_BUCKETS, turn, side="right") - 1
    rows: list[DepthRow] = []
    for b, low in enumerate(DEPTH_BUCKETS):
        at = bucket == b
        if not at.any():
            continue
        high = DEPTH_BUCKETS[b + 1] - 1 if b + 1 < len(DEPTH_BUCKETS) else None
        name = str(low) if high == low else f"{low}+" if high is None else f"{low}-{high}"
        ttft, e2e = summarize(ttft_ms[at]), summarize(e2e_ms[at])
        rows.append(
            {
                "depth": name,
                "requests": int(at.sum()),
                "ttft_ms": {"p50": _num(ttft.p50), "p95": _num(ttft.p95), "count": ttft.count},
                "e2e_ms": {"p50": _num(e2e.p50), "p95": _num(e2e.p95), "count": e2e.count},
            }
        )
    return rows


def _num(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


def _think_figures(cols: SessionColumns) -> ThinkFigures:
    """Think times as replayed against the planned ones, and how many turns overlapped."""
    end_of = dict(zip(cols.index.tolist(), (cols.sent_ns + np.maximum(cols.e2e_ns, 0)).tolist(), strict=True))
    later = np.flatnonzero((cols.after >= 0) & np.isin(cols.after, cols.index))
    got_ns = np.array([cols.sent_ns[i] - end_of[int(cols.after[i])] for i in later.tolist()], np.int64)
    planned = cols.think_ns[later]
    known = planned >= 0
    return {
        "later_turns": len(later),
        "overlapping_turns": int((got_ns < 0).sum()),
        "think_ms": summarize(got_ns / NS_PER_MS).to_dict(),
        "think_error_ms": summarize((got_ns[known] - planned[known]) / NS_PER_MS).to_dict(),
        "think_abs_error_ms": summarize(np.abs(got_ns[known] - planned[known]) / NS_PER_MS).to_dict(),
    }
