"""Sessions joined across recorders by their keyed reply ids (trace.fleet)."""

from __future__ import annotations

import numpy as np

from replayproxy.trace.fleet import join_sessions

U = np.uint64


def _scalar(rows: list[tuple[int, int, int, int, int, int, int]]) -> dict[str, np.ndarray]:
    """(offset, e2e, session, turn, think, chat_id, parent_id) per row, in arrival order."""
    names = ("offset_ns", "e2e_ns", "session", "turn", "think_ns", "chat_id", "parent_id")
    kinds = (np.int64, np.int64, U, np.int64, np.int64, U, U)
    return {n: np.array([r[i] for r in rows], k) for i, (n, k) in enumerate(zip(names, kinds, strict=True))}


def test_a_turn_recorded_by_another_pod_joins_its_parents_session_and_takes_its_followers_along() -> None:
    scalar = _scalar([
        (0, 100, 11, 0, -1, 501, 0),      # pod a: turn 0 of conversation 11, reply 501
        (150, 100, 22, 0, -1, 502, 501),  # pod b: continues 501, but b never saw it: a new session
        (300, 100, 22, 1, 50, 503, 502),  # pod b again: b linked it to its own session 22
        (450, 100, 33, 0, -1, 504, 503),  # pod c: continues 503
        (500, 100, 44, 0, -1, 0, 0),      # a first turn elsewhere: left alone
        (600, 100, 55, 0, -1, 0, 999),    # continues a reply no file holds: left alone
    ])  # fmt: skip
    assert join_sessions(scalar) == 2
    assert scalar["session"].tolist() == [11, 11, 11, 11, 44, 55]
    assert scalar["turn"].tolist() == [0, 1, 2, 3, 0, 0]
    assert scalar["think_ns"].tolist() == [-1, 50, 50, 50, -1, -1]


def test_identical_openings_continue_the_oldest_reply_not_yet_continued() -> None:
    scalar = _scalar([
        (0, 10, 1, 0, -1, 700, 0),
        (5, 10, 2, 0, -1, 700, 0),   # another user, the same opening and reply
        (40, 10, 3, 0, -1, 0, 700),
        (50, 10, 4, 0, -1, 0, 700),
        (60, 10, 5, 0, -1, 0, 701),
    ])  # fmt: skip
    join_sessions(scalar)
    assert scalar["session"].tolist() == [1, 2, 1, 2, 5]


def test_a_load_without_the_link_columns_is_left_as_it_is() -> None:
    scalar = _scalar([(0, 1, 1, 0, -1, 1, 0), (5, 1, 2, 0, -1, 0, 1)])
    del scalar["chat_id"]
    assert join_sessions(scalar) == 0 and scalar["session"].tolist() == [1, 2]
