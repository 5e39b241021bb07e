"""Per-session figures of a run: turns per session, session time, overlaps, think-time reproduction.

A session's time is its first turn's send to its last turn's end (DESIGN.md, "session time"); the
time to finish it counts from the first turn's *scheduled* send, so a late start shows. A later
turn's think time as replayed is its send minus the end of the turn it followed (`after`); its
error is that minus the think time the schedule gave it (`think_ns`). A negative replayed think
time is an overlap: the turn went out while the one before it was still running, which never
happened in production. For the production baseline the same figures come from the trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replayproxy.report.document_types import SessionsDoc, ThinkFigures
from replayproxy.report.measures import NS_PER_MS, NS_PER_S
from replayproxy.report.stats import summarize


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


def previous_turns(session: np.ndarray) -> np.ndarray:
    """For requests in arrival order: the index of the previous request of the same session, or -1."""
    after = np.full(len(session), -1, np.int64)
    last: dict[int, int] = {}
    for i, s in enumerate(session.tolist()):
        if s:
            after[i] = last.get(s, -1)
            last[s] = i
    return after


def session_doc(cols: SessionColumns) -> SessionsDoc | None:
    """The report's `sessions` entry, or None when no session has more than one turn."""
    linked = cols.session != 0
    if not linked.any():
        return None
    ids, group, turns = np.unique(cols.session[linked], return_inverse=True, return_counts=True)
    if turns.max() < 2:
        return None
    sent = cols.sent_ns[linked]
    ends = np.where(cols.e2e_ns[linked] >= 0, sent + cols.e2e_ns[linked], sent)
    first_sent = np.full(len(ids), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first_sent, group, sent)
    last_end = np.zeros(len(ids), np.int64)
    np.maximum.at(last_end, group, ends)
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
        "session_s": summarize((last_end - first_sent) / NS_PER_S).to_dict(),
        "finish_from_schedule_s": finish,
        **_think_figures(cols),
    }


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
