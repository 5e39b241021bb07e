"""Dealing a run to worker processes (replayproxy/replay/workers.py): every request goes to exactly
one worker in schedule order, and in closed loop a session stays on one worker."""

from __future__ import annotations

from replayproxy.replay.plan import Prepared
from replayproxy.replay.workers import deal


def request(index: int, first: int = -1) -> Prepared:
    return Prepared(index, index * 1000, "chat", "/v1/chat/completions", b"{}", True, 5, 3, first=first)


def test_open_loop_deals_round_robin_in_schedule_order() -> None:
    prepared = [request(i) for i in range(7)]
    shares = deal(prepared, 3, by_session=False)
    assert [[p.index for p in share] for share in shares] == [[0, 3, 6], [1, 4], [2, 5]]


def test_closed_loop_keeps_each_session_on_one_worker() -> None:
    # sessions by first turn: 0 -> (0, 2, 5), 1 -> (1, 4), 3 -> (3,), and 6 alone
    firsts = {0: 0, 1: 1, 2: 0, 3: 3, 4: 1, 5: 0, 6: -1}
    prepared = [request(i, firsts[i]) for i in range(7)]
    shares = deal(prepared, 2, by_session=True)
    assert [[p.index for p in share] for share in shares] == [[0, 2, 3, 5], [1, 4, 6]]
    for share in shares:
        assert [p.scheduled_ns for p in share] == sorted(p.scheduled_ns for p in share)
    groups = [{p.group for p in share} for share in shares]
    assert not groups[0] & groups[1]


def test_every_request_is_dealt_once_and_more_workers_than_requests_leave_some_idle() -> None:
    prepared = [request(i, i % 2) for i in range(5)]
    for by_session in (False, True):
        shares = deal(prepared, 8, by_session)
        assert len(shares) == 8
        assert sorted(p.index for share in shares for p in share) == list(range(5))
