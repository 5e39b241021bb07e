"""Why a quiet sender is quiet, on numbers: the words of the stall notice from the ledger and window."""

from __future__ import annotations

from replayproxy.replay.housekeeping import quiet_reason
from replayproxy.replay.release import Ledger
from replayproxy.replay.window import Window
from tests.replay.test_release import schedule

SECOND = 1_000_000_000


def test_a_sender_with_nothing_on_the_clock_waits_for_turns_in_flight() -> None:
    plan = schedule([0, 5])
    reason = quiet_reason(40 * SECOND, (0, 1), Window(plan), Ledger(plan, 0, closed_loop=True), flying=3)
    assert reason == "every turn left waits for the end of a turn still in flight (3 in flight)"


def test_a_due_request_the_preparer_has_not_delivered_is_named_by_its_trace_row() -> None:
    plan = schedule([0, 5, 9])
    window = Window(plan)
    window.received = 1
    reason = quiet_reason(40 * SECOND, (9 * SECOND, 2), window, Ledger(plan, 0, closed_loop=False), flying=0)
    assert reason == (
        "the request due 31 s ago (trace row 2) has not arrived from the preparer, which has delivered 1 of 3"
    )


def test_a_full_concurrency_cap_and_a_ready_request_are_told_apart() -> None:
    plan = schedule([0, 5])
    window = Window(plan)
    window.received = 2
    capped = Ledger(plan, 0, closed_loop=False, max_concurrency=1)
    assert capped.take(0)
    capped.sent()
    reason = quiet_reason(35 * SECOND, (5 * SECOND, 1), window, capped, flying=1)
    assert reason == "--max-concurrency 1 requests are in flight and none has ended"
    free = Ledger(plan, 0, closed_loop=False)
    assert quiet_reason(35 * SECOND, (5 * SECOND, 1), window, free, flying=0) == (
        "the request due 30 s ago is ready but was not sent"
    )
