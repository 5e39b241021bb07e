"""Per-session figures: turns, session time, overlaps and think-time error, from result columns."""

from __future__ import annotations

import numpy as np

from replayproxy.report.sessions import SessionColumns, previous_turns, session_doc

MS = 1_000_000


def columns(sent_ms: list[int], e2e_ms: list[int], think_ms: list[int]) -> SessionColumns:
    """Session 5: turns 0, 1, 3 (in that order); session 6: turn 2 alone."""
    session = np.array([5, 5, 6, 5], np.uint64)
    return SessionColumns(
        index=np.arange(4),
        session=session,
        after=previous_turns(session),
        think_ns=np.array(think_ms) * MS,
        sent_ns=np.array(sent_ms) * MS,
        scheduled_ns=np.maximum(np.array(sent_ms) * MS - 10 * MS, 0),
        e2e_ns=np.array(e2e_ms) * MS,
    )


def test_think_time_error_and_session_time() -> None:
    doc = session_doc(columns([0, 150, 20, 400], [100, 200, 50, 100], [-1, 40, -1, 50]))
    assert doc is not None
    assert (doc["sessions"], doc["multi_turn_sessions"], doc["later_turns"], doc["overlapping_turns"]) == (
        2,
        1,
        2,
        0,
    )
    assert doc["turns_per_session"]["max"] == 3
    assert doc["think_ms"]["p50"] == 50  # 150 - 100 and 400 - 350
    assert sorted([doc["think_error_ms"]["max"], doc["think_abs_error_ms"]["max"]]) == [10, 10]
    assert doc["session_s"]["max"] == 0.5 and doc["finish_from_schedule_s"]["max"] == 0.5


def test_a_turn_sent_before_the_previous_one_ended_is_an_overlap() -> None:
    doc = session_doc(columns([0, 50, 20, 400], [100, 200, 50, 100], [-1, 40, -1, 50]))
    assert doc is not None and doc["overlapping_turns"] == 1 and doc["think_ms"]["max"] == 150


def test_no_multi_turn_session_means_no_section() -> None:
    single = SessionColumns(*(np.array([v]) for v in (0, 9, -1, -1, 0, 0, 5)))
    assert session_doc(single) is None
    assert previous_turns(np.array([0, 3, 0, 3, 3], np.uint64)).tolist() == [-1, -1, -1, 1, 3]
