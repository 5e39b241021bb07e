"""The send loop of one process: absolute deadlines, bytes out, results in, nothing else on the path.

One coroutine walks the schedule in order, waits for each deadline (`schedule.Waiter`), takes the
request's bytes from the window (replay.window), pops a warm connection and writes them; a feeder
reads prepared requests into the window in the gaps between sends, never within `FEED_GUARD_NS` of
the next deadline unless the request due is missing; responses are handled in the connections'
callbacks, so there is no task per request. Reads are only timestamped and kept; a digester turns
finished requests into results in the gaps between sends, never within `DIGEST_GUARD_NS` of the next
deadline. A housekeeping task enforces timeouts, refreshes idle connections, feeds the progress line
and says why when a request is due but nothing has been sent or answered for `STALL_NOTICE_NS` (a
stall must never look like a quiet trace). Open loop: a request is sent at its time whether or not
earlier ones finished, unless `max_concurrency` caps requests in flight. Closed loop across the
turns of a session (`closed_loop`): a later turn becomes due when the turn before it ends, at that
end plus its think time, and its schedule lag is measured against that deadline. With live replies
(`rebuild`) that turn's bytes are built from the reply when the previous turn ends; a build that
takes longer than the think time makes the turn late, and its lag says so. A request the planner
linked to an earlier turn as it was prepared (an edited-reply continuation) leaves the timed
schedule when it arrives in the window and waits for that turn's end like any later turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from replayproxy.clock import now_ns
from replayproxy.replay.alarm import Alarm, Interrupt
from replayproxy.replay.connection import Connection, Pool
from replayproxy.replay.prepared import Prepared
from replayproxy.replay.request_timeline import RequestTimeline
from replayproxy.replay.schedule import Waiter
from replayproxy.replay.window import Window
from replayproxy.results import ReplayResult
from replayproxy.tasks import spawn

_log = logging.getLogger("replayproxy.replay")
# A later turn's bytes, built once the turn before it ended (None: its planned bytes)
Rebuild = Callable[[RequestTimeline, Prepared, bytes], Awaitable[bytes | None]]

HOUSEKEEPING_S = 0.1
REFRESH_EVERY = 10  # housekeeping rounds between keep-alive refreshes
REFRESH_IDLE_NS = 2_000_000_000
DIGEST_GUARD_NS = 1_500_000  # no digesting this close to the next send
DIGEST_NS_PER_READ = 20_000  # rough cost of decoding one network read's events
MAX_UNDIGESTED = 2_000  # past this backlog, digest regardless (memory stays bounded)
COLLECT_EVERY = 20  # housekeeping rounds between collections of young objects...
COLLECT_ROOM_NS = 20_000_000  # ...done only when the next send is at least this far away
FEED_GUARD_NS = 2_000_000  # no reading of prepared requests this close to the next send
FEED_IDLE_S = 0.01  # the window is full: look again after this long
FEED_WAIT_S = 0.05  # the pipe is empty: wait this long for it at most, then look again
STALL_NOTICE_NS = 30_000_000_000  # nothing sent or finished this long while a request is due: say why


@dataclass(slots=True)
class Counters:
    """Live counts for the progress line; `lags_ns` holds the lags since the last reading."""

    total: int = 0
    sent: int = 0
    done: int = 0
    errors: int = 0
    new_connections: int = 0
    prepared_late: int = 0  # requests whose body was not ready at their deadline
    lags_ns: list[int] = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        return self.sent - self.done


def settle_memory() -> None:
    """Collect now, freeze what exists (the prepared bodies) and pause automatic collection, so no
    collection runs just before a send; housekeeping collects young objects in gaps instead."""
    gc.collect()
    gc.freeze()
    gc.disable()


def restore_memory() -> None:
    gc.enable()
    gc.unfreeze()


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
        self.schedule = window.schedule
        self.pool = pool
        self.clock = clock
        self.timeout_ns = int(timeout_s * 1e9)
        self.max_concurrency = max_concurrency
        self.worker = worker
        self.spin_ns = spin_ns
        self.waiter = Waiter(clock, spin_ns=spin_ns)
        self.counters = Counters(total=window.total)
        self.results: list[ReplayResult] = results if results is not None else []
        self.start_ns = 0
        self._flying: set[RequestTimeline] = set()
        self._slot = asyncio.Event()
        self._idle = asyncio.Event()
        self._undigested: deque[RequestTimeline] = deque()
        self._finished_one = asyncio.Event()
        self._next_deadline = 0  # the sender's next deadline; 0 when it has nothing left to send
        self._due_position = -1  # the position whose deadline that is
        self.closed_loop = closed_loop
        self._waiting: dict[int, list[int]] = {}  # trace index of a turn -> positions due after its end
        self._due: list[tuple[int, int]] = []  # heap of (absolute deadline, position) of released turns
        self._released = Interrupt()
        self._fed = asyncio.Event()  # the feeder took in a batch
        self.rebuild = rebuild
        self._rebuilt: dict[int, bytes] = {}  # position -> bytes built from the previous turn's reply
        self._own = np.sort(self.schedule.trace_index)  # trace indexes this runner sends
        self._relinked: set[int] = set()  # timed positions that now wait for an earlier turn instead
        self._ends: dict[int, int] = {}  # trace index -> end of a finished turn that requests may extend
        # ...and its timeline, while requests arriving within the window's horizon may still extend it
        self._ended: OrderedDict[int, RequestTimeline] = OrderedDict()
        self._joined_think: dict[int, int] = {}  # position moved here from another sender -> its think
        self._active_ns = 0  # the last send or finished request
        self._stall_from = 0  # since when nothing was sent or answered, once that was reported
        self._stall_noticed_ns = 0  # when it was last reported
        self._feed_error: BaseException | None = None  # why the feeder stopped before the window was full

    @property
    def next_deadline_ns(self) -> int:
        """The sender's next absolute deadline; 0 when it has nothing left to send."""
        return self._next_deadline

    async def run(self, start_ns: int) -> list[ReplayResult]:
        """Send everything relative to the absolute monotonic `start_ns`; returns when all ended."""
        self.start_ns = start_ns
        # a kernel timer on the real clock, so the sender wakes just before each deadline
        alarm = Alarm.create() if self.clock is now_ns else None
        self.waiter = Waiter(self.clock, spin_ns=self.spin_ns, alarm=alarm)
        helpers = [spawn(self._housekeeping(), name="replay-housekeeping"),
                   spawn(self._digester(), name="replay-digester"),
                   spawn(self._feeder(), name="replay-feeder")]  # fmt: skip
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
            while self._undigested:
                self._digest(self._undigested.popleft())
        return self.results

    async def _send_all(self) -> None:
        timed = self._timed_positions()
        self._relink()
        window = self.window
        while self.counters.sent < window.to_send or not window.complete:
            due = await self._next_due(timed)
            if due is None:
                break
            position, deadline = due
            while self.max_concurrency and len(self._flying) >= self.max_concurrency:
                self._slot.clear()
                await self._slot.wait()
            late = not window.has(position)
            if late:
                await self._arrival(position)
                if position in self._relinked:  # linked to an earlier turn (due after it), or moved
                    self._relinked.discard(position)
                    continue
                self.counters.prepared_late += 1
            prepared, wire = self.window.take(position)
            wire = self._rebuilt.pop(position, wire)
            timeline = RequestTimeline(prepared, deadline, self._finished)
            timeline.prepared_late = late
            self._flying.add(timeline)
            self.counters.sent += 1
            connection = self.pool.acquire()
            if connection is None:
                spawn(self._send_on_new(timeline, wire), name="replay-connect")
            else:
                self._send(timeline, connection, wire)
        self._next_deadline = 0

    def _timed_positions(self) -> deque[int]:
        """Positions sent at their scheduled offsets (in order); in closed loop, a later turn whose
        previous turn is in this run waits for that turn's end instead."""
        after = self.schedule.after
        waits = np.zeros(len(after), dtype=bool)
        if self.closed_loop:
            waits = (after >= 0) & np.isin(after, self.schedule.trace_index)
        for position in np.flatnonzero(waits).tolist():
            self._waiting.setdefault(int(after[position]), []).append(position)
        return deque(np.flatnonzero(~waits).tolist())

    async def _arrival(self, position: int) -> None:
        """Wait for a request whose body is not in the window yet (the preparer is behind); raises
        what stopped the feeder, if it stopped (the preparer ended): that request can never come."""
        self.window.want(position)
        while self.window.missing(position):
            if self._feed_error is not None:
                raise self._feed_error
            self._fed.clear()
            await self._fed.wait()

    async def _feeder(self) -> None:
        """`_feed`, its failure kept for the send loop (a task's exception would only be logged, and
        the request it waits for would never come)."""
        try:
            await self._feed()
        except Exception as e:
            self._feed_error = e
            self._fed.set()

    async def _feed(self) -> None:
        """Read prepared requests into the window in the gaps between sends (or at once, when the
        request due is missing), while the window's horizon and byte limit allow."""
        window = self.window
        while not window.complete:
            now = self.clock()
            if not window.needs_reading(now - self.start_ns):
                await asyncio.sleep(FEED_IDLE_S)
                continue
            room = self._next_deadline - now if self._next_deadline else 1 << 62
            if room <= FEED_GUARD_NS and not window.missing(self._due_position):
                await asyncio.sleep(max(room, 0) / 1e9 + 0.0002)  # until just after the next send
                continue
            if window.read():
                self._relink()
                self._fed.set()
                if window.complete:  # the send loop may wait for nothing but this
                    self._released.set()
                await asyncio.sleep(0)
            else:
                await self._readable()

    async def _readable(self) -> None:
        """Until the preparer's pipe has data (or a short while, to look at the limits again)."""
        reader = self.window.reader
        assert reader is not None
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def arrived() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(reader.fileno, arrived)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FEED_WAIT_S):
                    await ready
        finally:
            loop.remove_reader(reader.fileno)

    async def _next_due(self, timed: deque[int]) -> tuple[int, int] | None:
        """Wait for the earliest deadline, timed or released, and take it: (position, deadline);
        None when all is sent and nothing more can come. A turn released while waiting (its
        previous turn ended) makes the choice again."""
        while True:
            while timed and timed[0] in self._relinked:
                self._relinked.discard(timed.popleft())
            timed_at = self.start_ns + int(self.schedule.scheduled_ns[timed[0]]) if timed else 1 << 62
            due_at = self._due[0][0] if self._due else 1 << 62
            deadline = min(timed_at, due_at)
            self._released.clear()
            if deadline == 1 << 62:
                self._next_deadline = 0
                if self.counters.sent >= self.window.to_send and self.window.complete:
                    return None  # everything sent, and nothing more can come
                await self._released.wait()
                continue
            self._next_deadline = deadline
            self._due_position = self._due[0][1] if due_at <= timed_at else timed[0]
            if await self.waiter.until(deadline, self._released if self.closed_loop else None) is None:
                continue
            if due_at <= timed_at:
                return heapq.heappop(self._due)[1], deadline
            if timed[0] in self._relinked:  # relinked while its offset was awaited
                continue
            return timed.popleft(), deadline

    def _send(self, timeline: RequestTimeline, connection: Connection, wire: bytes) -> None:
        timeline.connection = connection
        timeline.wire = wire
        sent = connection.send(timeline, wire, timeline.prepared.stream)
        timeline.sent(sent)
        self._active_ns = sent
        if self._stall_from:  # after the write: a stall that was reported ends here
            _log.warning("replay: sending again after %.0f s without a send or an answer",
                         (sent - self._stall_from) / 1e9)  # fmt: skip
            self._stall_from = self._stall_noticed_ns = 0
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
        for position in self._waiting.pop(timeline.prepared.index, ()):
            self._continue(timeline, position)
        if self.closed_loop and timeline.prepared.after >= 0 and timeline.prepared.endpoint == "chat":
            self._keep_ended(timeline)
        self._flying.discard(timeline)
        self.counters.done += 1
        self._active_ns = self.clock()
        self._undigested.append(timeline)
        self._finished_one.set()
        self._slot.set()
        if not self._flying:
            self._idle.set()

    def _continue(self, timeline: RequestTimeline, position: int) -> None:
        """`position` continues the turn of `timeline`, which ended: due after its think time."""
        if self.rebuild is None:
            self._release(timeline.end_at, position)
        else:
            spawn(self._rebuild_then_release(timeline, position), name="replay-live-turn")

    def _release(self, end_at: int, position: int) -> None:
        joined = self._joined_think.get(position)  # past the schedule: moved here from another's
        think = max(int(self.schedule.think_ns[position]) if joined is None else joined, 0)
        heapq.heappush(self._due, (end_at + think, position))
        self._released.set()

    def _keep_ended(self, timeline: RequestTimeline) -> None:
        """A later chat turn that ended: an edited-reply continuation prepared later may extend it.
        Its end is kept for good (a few bytes); with live replies its timeline too, while such a
        request can still arrive within the window's horizon."""
        index = timeline.prepared.index
        self._ends[index] = timeline.end_at
        if self.rebuild is None:
            return
        self._ended[index] = timeline
        oldest = timeline.end_at - self.window.horizon_ns
        while self._ended and next(iter(self._ended.values())).end_at < oldest:
            self._ended.popitem(last=False)

    def _relink(self) -> None:
        """Requests that arrived linked to an earlier turn than the schedule said (the planner found
        them extending its conversation) leave the timed schedule and wait for that turn's end; so
        do those moved here from another sender's schedule (that turn is ours), and those moved away
        leave it for good."""
        window = self.window
        for position in window.moved:
            self._relinked.add(position)
        for position in window.joined:
            self._joined_think[position] = window.peek(position)[0].think_ns
            self._follow(position, window.peek(position)[0].after)
        for position in window.relinked:
            prepared = window.peek(position)[0]
            after = prepared.after
            at = int(np.searchsorted(self._own, after))
            if not self.closed_loop or at >= len(self._own) or int(self._own[at]) != after:
                continue  # open loop, or the turn it extends is another sender's
            self.schedule.after[position] = after
            self.schedule.think_ns[position] = prepared.think_ns
            self.schedule.first[position] = prepared.first
            self._relinked.add(position)
            self._follow(position, after)
        window.moved.clear()
        window.joined.clear()
        window.relinked.clear()
        self.counters.total = window.to_send

    def _follow(self, position: int, after: int) -> None:
        """`position` waits for the end of the turn `after` (ours), or goes now if that has ended."""
        if after not in self._ends:
            self._waiting.setdefault(after, []).append(position)
        elif after in self._ended:
            self._continue(self._ended[after], position)
        else:
            if self.rebuild is not None:
                _log.warning("live replies: an edited-reply turn keeps its planned prompt "
                             "(the turn it extends ended a window before it was prepared)")  # fmt: skip
            self._release(self._ends[after], position)

    async def _rebuild_then_release(self, timeline: RequestTimeline, position: int) -> None:
        assert self.rebuild is not None
        try:
            if self.window.missing(position):  # a turn ahead of the window: read up to it first
                await self._arrival(position)
            wire = await self.rebuild(timeline, *self.window.peek(position))
        except Exception as e:  # noqa: BLE001 — a failed build costs that turn its live reply, nothing more
            _log.warning("live reply not built (%s: %s); the turn stays as planned", type(e).__name__, e)
            wire = None
        if wire is not None:
            self._rebuilt[position] = wire
        self._release(timeline.end_at, position)

    def _digest(self, timeline: RequestTimeline) -> None:
        result = timeline.result(self.start_ns, self.worker)
        if result.error:
            self.counters.errors += 1
        self.results.append(result)

    async def _digester(self) -> None:
        """Decode finished requests between sends, so decoding never delays a scheduled write."""
        while True:
            if not self._undigested:
                self._finished_one.clear()
                await self._finished_one.wait()
            timeline = self._undigested[0]
            room = self._next_deadline - self.clock() if self._next_deadline else 1 << 62
            if room > DIGEST_GUARD_NS + DIGEST_NS_PER_READ * len(timeline.reads) or (
                len(self._undigested) > MAX_UNDIGESTED
            ):
                self._digest(self._undigested.popleft())
                await asyncio.sleep(0)  # let reads and the sender in between two digests
            else:
                await asyncio.sleep(max(room, 0) / 1e9 + 0.0002)  # until just after the next send

    async def _housekeeping(self) -> None:
        rounds = 0
        collect_due = COLLECT_EVERY
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            rounds += 1
            now = self.clock()
            for timeline in [e for e in self._flying if e.sent_at >= 0 and now - e.sent_at > self.timeout_ns]:
                connection = timeline.connection
                if isinstance(connection, Connection):
                    connection.abort("timeout", f"no complete response within {self.timeout_ns / 1e9:g} s")
                else:
                    timeline.fail(now, "timeout", "timed out")
            self._watch_stall(now)
            if rounds % REFRESH_EVERY == 0:
                spawn(self.pool.refresh(REFRESH_IDLE_NS), name="replay-refresh")
            if rounds >= collect_due and (
                not self._next_deadline or self._next_deadline - now > COLLECT_ROOM_NS
            ):
                gc.collect(1)
                collect_due = rounds + COLLECT_EVERY

    def _watch_stall(self, now: int) -> None:
        """Warn while a request is due and nothing has been sent or finished for `STALL_NOTICE_NS`
        (again every as long), saying what the send loop waits for (`_send` says when it goes on)."""
        quiet_from = max(self._active_ns, self.start_ns)
        if self._stall_from and quiet_from > self._stall_from:  # answers came, no send yet
            self._stall_from = self._stall_noticed_ns = 0
        waiting = self._next_deadline == 0 or self._next_deadline <= now  # nothing ahead on the clock
        if self.counters.sent >= self.counters.total or not waiting or now - quiet_from < STALL_NOTICE_NS:
            return
        if self._stall_noticed_ns and now - self._stall_noticed_ns < STALL_NOTICE_NS:
            return
        self._stall_from, self._stall_noticed_ns = quiet_from, now
        left, total = self.counters.total - self.counters.sent, self.counters.total
        _log.warning("replay: nothing sent or answered for %.0f s, %d of %d requests to send: %s",
                     (now - quiet_from) / 1e9, left, total, self._stall_reason(now))  # fmt: skip

    def _stall_reason(self, now: int) -> str:
        """What the send loop waits for, in words."""
        flying = len(self._flying)
        if self._next_deadline == 0:
            return f"every turn left waits for the end of a turn still in flight ({flying} in flight)"
        late_s = (now - self._next_deadline) / 1e9
        position = self._due_position
        if self.window.missing(position):
            row = int(self.schedule.trace_index[position])
            delivered = f"{self.window.received} of {self.window.total}"
            return (f"the request due {late_s:.0f} s ago (trace row {row}) has not arrived from the "
                    f"preparer, which has delivered {delivered}")  # fmt: skip
        if self.max_concurrency and flying >= self.max_concurrency:
            return f"--max-concurrency {self.max_concurrency} requests are in flight and none has ended"
        return f"the request due {late_s:.0f} s ago is ready but was not sent"
