"""What runs beside a sender's send loop, off its path: timeouts, keep-alive refreshes, collections of
young objects in the gaps between sends, and saying why the sender is quiet.

A stall must never look like a quiet trace: while a request is due and nothing has been sent or
answered for `STALL_NOTICE_NS`, a warning says (again every as long) what the send loop waits for,
and another says when sending goes on.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Collection
from typing import Protocol

from replayproxy.replay.connection import Connection, Pool
from replayproxy.replay.release import Ledger
from replayproxy.replay.request_timeline import RequestTimeline
from replayproxy.replay.window import Window
from replayproxy.tasks import spawn

_log = logging.getLogger("replayproxy.replay")

HOUSEKEEPING_S = 0.1
REFRESH_EVERY = 10  # housekeeping rounds between keep-alive refreshes
REFRESH_IDLE_NS = 2_000_000_000
COLLECT_EVERY = 20  # housekeeping rounds between collections of young objects...
COLLECT_ROOM_NS = 20_000_000  # ...done only when the next send is at least this far away
STALL_NOTICE_NS = 30_000_000_000  # nothing sent or finished this long while a request is due: say why


def settle_memory() -> None:
    """Collect now, freeze what exists (the prepared bodies) and pause automatic collection, so no
    collection runs just before a send; housekeeping collects young objects in gaps instead."""
    gc.collect()
    gc.freeze()
    gc.disable()


def restore_memory() -> None:
    gc.enable()
    gc.unfreeze()


class Sender(Protocol):
    """What housekeeping reads of the send loop (replay.runner.Runner)."""

    clock: Callable[[], int]
    pool: Pool
    timeout_ns: int

    @property
    def next_deadline_ns(self) -> int: ...
    def in_flight(self) -> Collection[RequestTimeline]: ...
    def left(self) -> tuple[int, int]: ...  # requests still to send, of how many
    def waits_for(self, now: int) -> str: ...  # what the send loop waits for, in words


def quiet_reason(now: int, due: tuple[int, int], window: Window, ledger: Ledger, flying: int) -> str:
    """What a send loop whose next request is `due` (deadline, position; deadline 0: none on the
    clock) waits for, in words."""
    deadline, position = due
    if deadline == 0:
        return f"every turn left waits for the end of a turn still in flight ({flying} in flight)"
    late_s = (now - deadline) / 1e9
    if window.missing(position):
        row = int(window.schedule.trace_index[position])
        delivered = f"{window.received} of {window.total}"
        return (f"the request due {late_s:.0f} s ago (trace row {row}) has not arrived from the "
                f"preparer, which has delivered {delivered}")  # fmt: skip
    if not ledger.has_slot:
        return f"--max-concurrency {ledger.max_concurrency} requests are in flight and none has ended"
    return f"the request due {late_s:.0f} s ago is ready but was not sent"


class Stall:
    """The quiet stretches of one sender's run, which starts at `start_ns`."""

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.active_ns = 0  # the last send or finished request
        self._from = 0  # since when nothing was sent or answered, once that was reported
        self._noticed_ns = 0  # when it was last reported

    def sent(self, at_ns: int) -> None:
        """A request was written at `at_ns` (a stall that was reported ends here)."""
        self.active_ns = at_ns
        if self._from:
            _log.warning("replay: sending again after %.0f s without a send or an answer",
                         (at_ns - self._from) / 1e9)  # fmt: skip
            self._from = self._noticed_ns = 0

    def check(self, now: int, sender: Sender) -> None:
        """Warn if a request is due (its deadline passed, or none ahead on the clock) and nothing
        was sent or finished for the notice time."""
        quiet_from = max(self.active_ns, self.start_ns)
        if self._from and quiet_from > self._from:  # answers came, no send yet
            self._from = self._noticed_ns = 0
        deadline = sender.next_deadline_ns
        waiting = deadline == 0 or deadline <= now
        left, total = sender.left()
        if left <= 0 or not waiting or now - quiet_from < STALL_NOTICE_NS:
            return
        if self._noticed_ns and now - self._noticed_ns < STALL_NOTICE_NS:
            return
        self._from, self._noticed_ns = quiet_from, now
        _log.warning("replay: nothing sent or answered for %.0f s, %d of %d requests to send: %s",
                     (now - quiet_from) / 1e9, left, total, sender.waits_for(now))  # fmt: skip


async def housekeeping(sender: Sender, stall: Stall) -> None:
    """Every `HOUSEKEEPING_S`, for as long as the sender runs."""
    rounds = 0
    collect_due = COLLECT_EVERY
    while True:
        await asyncio.sleep(HOUSEKEEPING_S)
        rounds += 1
        now = sender.clock()
        timeout_ns = sender.timeout_ns
        for timeline in [e for e in sender.in_flight() if e.sent_at >= 0 and now - e.sent_at > timeout_ns]:
            connection = timeline.connection
            if isinstance(connection, Connection):
                connection.abort("timeout", f"no complete response within {timeout_ns / 1e9:g} s")
            else:
                timeline.fail(now, "timeout", "timed out")
        stall.check(now, sender)
        if rounds % REFRESH_EVERY == 0:
            spawn(sender.pool.refresh(REFRESH_IDLE_NS), name="replay-refresh")
        deadline = sender.next_deadline_ns
        if rounds >= collect_due and (not deadline or deadline - now > COLLECT_ROOM_NS):
            gc.collect(1)
            collect_due = rounds + COLLECT_EVERY
