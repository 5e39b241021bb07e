"""Sessions joined across recorders by their keyed reply ids (trace.fleet)."""

from __future__ import annotations

import numpy as np
import pytest

from replayproxy.errors import BadOption
from replayproxy.trace.fleet import SKEW_VARIABLE, join_sessions, skew_ns

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


def _skewed() -> dict[str, np.ndarray]:
    """Pod b's clock runs behind pod a's: its turn 1 seems to arrive 300 us before turn 0 ended,
    and the merge even puts it before turn 0 itself."""
    return _scalar([
        (0, 100, 77, 0, -1, 0, 0),              # pod a: an unrelated request
        (500_000, 50, 22, 0, -1, 602, 601),     # pod b: continues reply 601
        (700_000, 100_000, 11, 0, -1, 601, 0),  # pod a: turn 0, ends at 800_000 on a's clock
        (750_000, 100, 22, 1, 60, 0, 602),      # pod b: its own follower
    ])  # fmt: skip


def test_pods_whose_clocks_disagree_within_the_tolerance_still_join() -> None:
    scalar = _skewed()
    assert join_sessions(scalar, skew=300_000) == 1
    assert scalar["session"].tolist() == [77, 11, 11, 11]
    assert scalar["turn"].tolist() == [0, 1, 0, 2]
    assert scalar["think_ns"].tolist() == [-1, 0, -1, 60]  # the skew hides the think time: clipped at 0


def test_skew_beyond_the_tolerance_leaves_the_turns_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    scalar = _skewed()
    assert join_sessions(scalar, skew=300_000 - 1) == 0
    assert scalar["session"].tolist() == [77, 22, 11, 22]
    monkeypatch.setenv(SKEW_VARIABLE, "0")
    assert join_sessions(_skewed()) == 0
    monkeypatch.setenv(SKEW_VARIABLE, "0.0003")
    assert join_sessions(_skewed()) == 1


def test_the_tolerance_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert skew_ns({}) == 1_000_000_000
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(BadOption, match=SKEW_VARIABLE):
            skew_ns({SKEW_VARIABLE: bad})
