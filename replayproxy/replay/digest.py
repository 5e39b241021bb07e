"""Turning finished requests into results in the gaps between a sender's sends.

A finished request holds only timestamped reads (replay.request_timeline); decoding them costs
about `DIGEST_NS_PER_READ` each, so it happens only when the next send is more than
`DIGEST_GUARD_NS` plus that away, unless the backlog passes `MAX_UNDIGESTED` (memory stays bounded).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from replayproxy.replay.request_timeline import RequestTimeline
from replayproxy.results import ReplayResult

DIGEST_GUARD_NS = 1_500_000  # no digesting this close to the next send
DIGEST_NS_PER_READ = 20_000  # rough cost of decoding one network read's events
MAX_UNDIGESTED = 2_000  # past this backlog, digest regardless (memory stays bounded)


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


class Digester:
    """Appends a result per finished request to `results`; `next_deadline()` gives the sender's next
    absolute deadline (0: none on the clock)."""

    def __init__(
        self,
        clock: Callable[[], int],
        next_deadline: Callable[[], int],
        counters: Counters,
        results: list[ReplayResult],
        worker: int,
    ) -> None:
        self.clock = clock
        self.next_deadline = next_deadline
        self.counters = counters
        self.results = results
        self.worker = worker
        self.start_ns = 0
        self._waiting: deque[RequestTimeline] = deque()
        self._finished_one = asyncio.Event()

    def add(self, timeline: RequestTimeline) -> None:
        self._waiting.append(timeline)
        self._finished_one.set()

    def drain(self) -> None:
        """Digest everything left (the run ended)."""
        while self._waiting:
            self._digest(self._waiting.popleft())

    async def run(self) -> None:
        """Decode finished requests between sends, so decoding never delays a scheduled write."""
        while True:
            if not self._waiting:
                self._finished_one.clear()
                await self._finished_one.wait()
            timeline = self._waiting[0]
            deadline = self.next_deadline()
            room = deadline - self.clock() if deadline else 1 << 62
            if room > DIGEST_GUARD_NS + DIGEST_NS_PER_READ * len(timeline.reads) or (
                len(self._waiting) > MAX_UNDIGESTED
            ):
                self._digest(self._waiting.popleft())
                await asyncio.sleep(0)  # let reads and the sender in between two digests
            else:
                await asyncio.sleep(max(room, 0) / 1e9 + 0.0002)  # until just after the next send

    def _digest(self, timeline: RequestTimeline) -> None:
        result = timeline.result(self.start_ns, self.worker)
        if result.error:
            self.counters.errors += 1
        self.results.append(result)
