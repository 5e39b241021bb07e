"""The send loop of one process: absolute deadlines, bytes out, results in, nothing else on the path.

One coroutine walks the prepared requests in schedule order, waits for each deadline
(`schedule.Waiter`), pops a warm connection and writes the request's bytes; responses are handled
in the connections' callbacks, so there is no task per request. Reads are only timestamped and
kept; a digester turns finished requests into results in the gaps between sends, never within
`DIGEST_GUARD_NS` of the next deadline. A housekeeping task enforces timeouts, refreshes idle
connections and feeds the progress line. Open loop: a request is sent at its time whether or not
earlier ones finished, unless `max_concurrency` caps requests in flight.
"""

from __future__ import annotations

import asyncio
import gc
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from replayproxy.replay.client import Exchange
from replayproxy.replay.connection import Connection, Pool
from replayproxy.replay.plan import Prepared
from replayproxy.replay.schedule import Waiter
from replayproxy.results import ReplayResult
from replayproxy.tasks import spawn

HOUSEKEEPING_S = 0.1
REFRESH_EVERY = 10  # housekeeping rounds between keep-alive refreshes
REFRESH_IDLE_NS = 2_000_000_000
DIGEST_GUARD_NS = 1_500_000  # no digesting this close to the next send
DIGEST_NS_PER_READ = 20_000  # rough cost of decoding one network read's events
MAX_UNDIGESTED = 2_000  # past this backlog, digest regardless (memory stays bounded)
COLLECT_EVERY = 20  # housekeeping rounds between collections of young objects...
COLLECT_ROOM_NS = 20_000_000  # ...done only when the next send is at least this far away


@dataclass(slots=True)
class Counters:
    """Live counts for the progress line; `lags_ns` holds the lags since the last reading."""

    total: int = 0
    sent: int = 0
    done: int = 0
    errors: int = 0
    new_connections: int = 0
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
    """Sends `prepared` (sorted by `scheduled_ns`) over `pool` and collects one result per request."""

    def __init__(
        self,
        prepared: Sequence[Prepared],
        wires: Sequence[bytes],
        pool: Pool,
        *,
        clock: Callable[[], int],
        timeout_s: float,
        max_concurrency: int = 0,
        worker: int = 0,
        spin_ns: int = 1_000_000,
        results: list[ReplayResult] | None = None,
    ) -> None:
        self.prepared = prepared
        self.wires = wires
        self.pool = pool
        self.clock = clock
        self.timeout_ns = int(timeout_s * 1e9)
        self.max_concurrency = max_concurrency
        self.worker = worker
        self.waiter = Waiter(clock, spin_ns=spin_ns)
        self.counters = Counters(total=len(prepared))
        self.results: list[ReplayResult] = results if results is not None else []
        self.start_ns = 0
        self._flying: set[Exchange] = set()
        self._slot = asyncio.Event()
        self._idle = asyncio.Event()
        self._undigested: deque[Exchange] = deque()
        self._finished_one = asyncio.Event()
        self._next_deadline = 0  # the sender's next deadline; 0 when it has nothing left to send

    @property
    def next_deadline_ns(self) -> int:
        """The sender's next absolute deadline; 0 when it has nothing left to send."""
        return self._next_deadline

    async def run(self, start_ns: int) -> list[ReplayResult]:
        """Send everything relative to the absolute monotonic `start_ns`; returns when all ended."""
        self.start_ns = start_ns
        helpers = [spawn(self._housekeeping(), name="replay-housekeeping"),
                   spawn(self._digester(), name="replay-digester")]  # fmt: skip
        try:
            await self._send_all()
            if self._flying:
                self._idle.clear()
                await self._idle.wait()
        finally:
            for helper in helpers:
                helper.cancel()
            now = self.clock()
            for exchange in list(self._flying):
                exchange.fail(now, "client_cancel", "replay stopped before the response ended")
            while self._undigested:
                self._digest(self._undigested.popleft())
        return self.results

    async def _send_all(self) -> None:
        for prepared, wire in zip(self.prepared, self.wires, strict=True):
            deadline = self.start_ns + prepared.scheduled_ns
            self._next_deadline = deadline
            await self.waiter.until(deadline)
            while self.max_concurrency and len(self._flying) >= self.max_concurrency:
                self._slot.clear()
                await self._slot.wait()
            exchange = Exchange(prepared, deadline, self._finished)
            self._flying.add(exchange)
            self.counters.sent += 1
            connection = self.pool.acquire()
            if connection is None:
                spawn(self._send_on_new(exchange, wire), name="replay-connect")
            else:
                self._send(exchange, connection, wire)
        self._next_deadline = 0

    def _send(self, exchange: Exchange, connection: Connection, wire: bytes) -> None:
        exchange.connection = connection
        sent = connection.send(exchange, wire)
        exchange.sent(sent)
        self.counters.lags_ns.append(sent - exchange.scheduled_at)

    async def _send_on_new(self, exchange: Exchange, wire: bytes) -> None:
        """No idle connection: open one now and say so in the result (its lag includes the connect)."""
        exchange.new_connection = True
        self.counters.new_connections += 1
        try:
            connection = await self.pool.open()
        except (OSError, TimeoutError) as e:
            exchange.fail(self.clock(), "connect", f"{type(e).__name__}: {e}")
            return
        if exchange.done:  # timed out or cancelled while connecting
            connection.close()
            return
        self._send(exchange, connection, wire)

    def _finished(self, exchange: Exchange) -> None:
        self._flying.discard(exchange)
        self.counters.done += 1
        self._undigested.append(exchange)
        self._finished_one.set()
        self._slot.set()
        if not self._flying:
            self._idle.set()

    def _digest(self, exchange: Exchange) -> None:
        result = exchange.result(self.start_ns, self.worker)
        if result.error:
            self.counters.errors += 1
        self.results.append(result)

    async def _digester(self) -> None:
        """Decode finished requests between sends, so decoding never delays a scheduled write."""
        while True:
            if not self._undigested:
                self._finished_one.clear()
                await self._finished_one.wait()
            exchange = self._undigested[0]
            room = self._next_deadline - self.clock() if self._next_deadline else 1 << 62
            if room > DIGEST_GUARD_NS + DIGEST_NS_PER_READ * len(exchange.reads) or (
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
            for exchange in [e for e in self._flying if e.sent_at >= 0 and now - e.sent_at > self.timeout_ns]:
                connection = exchange.connection
                if isinstance(connection, Connection):
                    connection.abort("timeout", f"no complete response within {self.timeout_ns / 1e9:g} s")
                else:
                    exchange.fail(now, "timeout", "timed out")
            if rounds % REFRESH_EVERY == 0:
                spawn(self.pool.refresh(REFRESH_IDLE_NS), name="replay-refresh")
            if rounds >= collect_due and (
                not self._next_deadline or self._next_deadline - now > COLLECT_ROOM_NS
            ):
                gc.collect(1)
                collect_due = rounds + COLLECT_EVERY
