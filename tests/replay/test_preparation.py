"""Before the clock (replayproxy/replay/preparation.py): the speed that gives a request rate, and
dealing a run to worker processes: every request goes to exactly one worker in schedule order, and
in closed loop a session stays on one worker."""

from __future__ import annotations

import numpy as np
import pytest

from replayproxy.replay.preparation import deal, speed_for_rate
from replayproxy.replay.prepared import Schedule


def schedule(firsts: list[int]) -> Schedule:
    count = len(firsts)
    index = np.arange(count, dtype=np.int64)
    none = np.full(count, -1, np.int64)
    no_joins = np.zeros(len(index) + 1, np.int64)
    return Schedule(index, index * 1000, none, none, np.array(firsts, np.int64), no_joins[:0], no_joins)


def test_open_loop_deals_round_robin_in_schedule_order() -> None:
    planned = schedule([-1] * 7)
    shares = deal(planned, np.arange(7), 3, by_session=False)
    assert [share.tolist() for share in shares] == [[0, 3, 6], [1, 4], [2, 5]]


def test_closed_loop_keeps_each_session_on_one_worker() -> None:
    # sessions by first turn: 0 -> (0, 2, 5), 1 -> (1, 4), 3 -> (3,), and 6 alone
    planned = schedule([0, 1, 0, 3, 1, 0, -1])
    shares = deal(planned, np.arange(7), 2, by_session=True)
    assert [share.tolist() for share in shares] == [[0, 2, 3, 5], [1, 4, 6]]
    for share in shares:
        assert (np.diff(planned.scheduled_ns[share]) >= 0).all()
    groups = [set(planned.group[share].tolist()) for share in shares]
    assert not groups[0] & groups[1]


def test_every_request_is_dealt_once_and_more_workers_than_requests_leave_some_idle() -> None:
    planned = schedule([i % 2 for i in range(5)])
    for by_session in (False, True):
        shares = deal(planned, np.arange(5), 8, by_session)
        assert len(shares) == 8
        assert sorted(i for share in shares for i in share.tolist()) == list(range(5))


def test_the_speed_for_a_rate_spreads_the_window_over_its_requests() -> None:
    offsets = np.array([0, 2, 10], np.int64) * 10**9  # 3 requests over 10 s: 0.2 req/s at speed 1
    assert speed_for_rate(offsets, 1.0) == pytest.approx(5.0)
    assert speed_for_rate(offsets, 0.1) == pytest.approx(0.5)
    for degenerate in (np.array([5], np.int64), np.array([7, 7], np.int64), np.array([], np.int64)):
        with pytest.raises(ValueError, match="two requests at different times"):
            speed_for_rate(degenerate, 1.0)
