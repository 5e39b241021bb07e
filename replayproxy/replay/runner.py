"""The send loop of one process: absolute deadlines, bytes out, results in, nothing else on the path.

A thin async driver around the release ledger (replay.release), which says which request is due
next and when: one coroutine waits for that deadline (`schedule.Waiter`), takes the request's bytes
from the window (replay.window), pops a warm connection and writes them. Beside it, off its path:
replay.refill reads bodies into the window, replay.digest turns finished requests into results,
replay.housekeeping enforces timeouts and says why a stalled sender is quiet, replay.live_turns
builds closed-loop turns from the replies to the turns they continue. Responses are handled in the
connections' callbacks, so there is no task per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from replayproxy.clock import now_ns
from replayproxy.replay.alarm import Alarm, Interrupt
from replayproxy.replay.connection import Connection, Pool
from replayproxy.replay.digest import Counters, Digester
from replayproxy.replay.housekeeping import Stall, housekeeping, quiet_reason
from replayproxy.replay.live_turns import LiveTurns, Rebuild
from replayproxy.replay.refill import Refill
from replayproxy.replay.release import Continuation, Ledger
from replayproxy.replay.request_timeline import RequestTimeline
from replayproxy.replay.schedule import Waiter
from replayproxy.replay.window import Window
from replayproxy.results import ReplayResult
from replayproxy.tasks import spawn


class Runner:
    """Sends the requests of `window` (its schedule in order) over `pool`; one result per request."""

    def __init__(
        self,
        window: Window,
        pool: Pool,
        *,
        clock: Callable[[], int],
        timeout_s: float,
        max_concurrency: int = 0,
        worker: int = 0,
        spin_ns: int = 1_000_000,
        results: list[ReplayResult] | None = None,
        closed_loop: bool = False,
        rebuild: Rebuild | None = None,
    ) -> None:
        self.window = window
        self.pool = pool
        self.clock = clock
        self.timeout_ns = int(timeout_s * 1e9)
        self.spin_ns = spin_ns
        self.closed_loop = closed_loop
        self.counters = Counters(total=window.total)
        self.results: list[ReplayResult] = results if results is not None else []
        self.start_ns = 0
        self.digester = Digester(clock, lambda: self._next[0], self.counters, self.results, worker)
        self.ledger = Ledger(window.schedule, 0, closed_loop=closed_loop, max_concurrency=max_concurrency)
        self.refill = Refill(window, clock, 0, lambda: self._next, self._arrived)
        self.stall = Stall(0)
        self.waiter = Waiter(clock, spin_ns=spin_ns)
        self._next = (0, -1)  # the next (deadline, position) to send; deadline 0: none on the clock
        self._released = Interrupt()  # a request became due, or the window complete
        self._flying: set[RequestTimeline] = set()
        self._slot = asyncio.Event()
        self._idle = asyncio.Event()
        self.live = LiveTurns(window, rebuild, self.refill.arrival, self._release) if rebuild else None

    @property
    def next_deadline_ns(self) -> int:
        """The sender's next absolute deadline; 0 when it has nothing left to send."""
        return self._next[0]

    async def run(self, start_ns: int) -> list[ReplayResult]:
        """Send everything relative to the absolute monotonic `start_ns`; returns when all ended."""
        self.start_ns = start_ns
        for part in (self.digester, self.ledger, self.refill, self.stall):
            part.start_ns = start_ns
        # a kernel timer on the real clock, so the sender wakes just before each deadline
        alarm = Alarm.create() if self.clock is now_ns else None
        self.waiter = Waiter(self.clock, spin_ns=self.spin_ns, alarm=alarm)
        helpers = [spawn(housekeeping(self, self.stall), name="replay-housekeeping"),
                   spawn(self.digester.run(), name="replay-digester"),
                   spawn(self.refill.run(), name="replay-feeder")]  # fmt: skip
        try:
            await self._send_all()
            if self._flying:
                self._idle.clear()
                await self._idle.wait()
        finally:
            for helper in helpers:
                helper.cancel()
            if alarm is not None:
                alarm.close()
            now = self.clock()
            for timeline in list(self._flying):
                timeline.fail(now, "client_cancel", "replay stopped before the response ended")
            self.digester.drain()
        return self.results

    async def _send_all(self) -> None:
        self._arrived()
        window = self.window
        while self.counters.sent < window.to_send or not window.complete:
            due = await self._next_due()
            if due is None:
                break
            deadline, position = due
            while not self.ledger.has_slot:
                self._slot.clear()
                await self._slot.wait()
            late = not window.has(position)
            if late:
                await self.refill.arrival(position)
                if self.ledger.withdrawn(position):  # it waits for an earlier turn, or it moved
                    continue
                self.counters.prepared_late += 1
            prepared, wire = self.window.take(position)
            if self.live is not None:
                wire = self.live.rebuilt.pop(position, wire)
            timeline = RequestTimeline(prepared, deadline, self._finished)
            timeline.prepared_late = late
            self._flying.add(timeline)
            self.ledger.sent()
            self.counters.sent += 1
            connection = self.pool.acquire()
            if connection is None:
                spawn(self._send_on_new(timeline, wire), name="replay-connect")
            else:
                self._send(timeline, connection, wire)
        self._next = (0, self._next[1])

    async def _next_due(self) -> tuple[int, int] | None:
        """Wait for the ledger's earliest deadline and take it: (deadline, position); None when all
        is sent and nothing more can come. A request released while waiting makes the choice again."""
        while True:
            self._released.clear()
            due = self.ledger.next()
            if due is None:
                self._next = (0, self._next[1])
                if self.counters.sent >= self.window.to_send and self.window.complete:
                    return None  # everything sent, and nothing more can come
                await self._released.wait()
                continue
            self._next = due
            if await self.waiter.until(due[0], self._released if self.closed_loop else None) is None:
                continue
            if self.ledger.take(due[1]):
                return due

    def _send(self, timeline: RequestTimeline, connection: Connection, wire: bytes) -> None:
        timeline.connection = connection
        timeline.wire = wire
        sent = connection.send(timeline, wire, timeline.prepared.stream)
        timeline.sent(sent)
        self.stall.sent(sent)  # after the write
        self.counters.lags_ns.append(sent - timeline.scheduled_at)

    async def _send_on_new(self, timeline: RequestTimeline, wire: bytes) -> None:
        """No idle connection: open one now and say so in the result (its lag includes the connect)."""
        timeline.new_connection = True
        self.counters.new_connections += 1
        try:
            connection = await self.pool.open()
        except (OSError, TimeoutError) as e:
            timeline.fail(self.clock(), "connect", f"{type(e).__name__}: {e}")
            return
        if timeline.done:  # timed out or cancelled while connecting
            connection.close()
            return
        self._send(timeline, connection, wire)

    def _finished(self, timeline: RequestTimeline) -> None:
        prepared = timeline.prepared
        extendable = self.closed_loop and prepared.after >= 0 and prepared.endpoint == "chat"
        if self.live is not None:
            self.live.ended(timeline)
        for free in self.ledger.ended(prepared.index, timeline.end_at, extendable=extendable):
            self._continue(timeline, free)
        if extendable and self.live is not None:
            self.live.keep(timeline)
        self._flying.discard(timeline)
        self.counters.done += 1
        self.stall.active_ns = self.clock()
        self.digester.add(timeline)
        self._slot.set()
        if not self._flying:
            self._idle.set()

    def _continue(self, timeline: RequestTimeline, free: Continuation) -> None:
        """`free.position` waited for `timeline`, the last of its parents to end: due after its think time."""
        if self.live is None:
            self._release(free.position, free.end_ns)
        else:
            self.live.start(free, timeline)

    def _release(self, position: int, end_ns: int) -> None:
        self.ledger.release(position, end_ns)
        self._released.set()

    def _arrived(self) -> None:
        """Tell the ledger about requests that arrived linked otherwise than the schedule said:
        moved to another sender, moved here (`joined`), or extending an earlier turn (`relinked`)."""
        window, ledger = self.window, self.ledger
        for position in window.moved:
            ledger.moved_away(position)
        for position in window.joined:
            prepared = window.peek(position)[0]
            self._follow(ledger.joined(position, [prepared.after, *prepared.joins], prepared.think_ns))
        for position in window.relinked:
            prepared = window.peek(position)[0]
            self._follow(ledger.relinked(position, [prepared.after, *prepared.joins], prepared.think_ns))
        window.moved.clear()
        window.joined.clear()
        window.relinked.clear()
        self.counters.total = window.to_send
        if window.complete:  # the send loop may wait for nothing but this
            self._released.set()

    def _follow(self, free: Continuation | None) -> None:
        """A request whose parent already ended goes now (after its think time)."""
        if free is not None and self.live is not None:
            self.live.follow(free)
        elif free is not None:
            self._release(free.position, free.end_ns)

    def in_flight(self) -> Collection[RequestTimeline]:
        return self._flying

    def left(self) -> tuple[int, int]:
        """Requests still to send, of how many (housekeeping's stall notice)."""
        return self.counters.total - self.counters.sent, self.counters.total

    def waits_for(self, now: int) -> str:
        return quiet_reason(now, self._next, self.window, self.ledger, len(self._flying))
