"""The requests a runner holds between preparation and the socket: a window bounded by time and bytes.

The runner knows its whole schedule up front (a few numbers per request, replay.prepared.Schedule);
bodies arrive from the preparer process (replay.feed) and are kept only while they are due within
`horizon_ns` of the run clock and fit in `max_bytes`. A closed-loop turn whose previous turn
ended early may be due before the window reached it: asking for it (`want`) reads ahead of the
horizon, bytes allowing. A request the planner linked to an earlier turn than the schedule said
(an edited-reply continuation, replay.continuations) is listed in `relinked` as it arrives; when
another sender sends that turn, the request moves there: it arrives here as MOVED (listed in
`moved`, never sent here) and there as JOINED, at a position past the schedule's (in `joined`).
With several senders in closed loop such requests may come until the preparer's last frame, so
the window is complete only then. A
request whose body is not here at its deadline is sent as soon as it arrives and counted as
prepared late (the preparer fell behind), next to schedule lag.
Prepared up front, the same window is simply filled completely before the start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from replayproxy.errors import RunAborted
from replayproxy.replay import feed
from replayproxy.replay.feed import FeedReader
from replayproxy.replay.prepared import Prepared, Schedule, schedule_of

HORIZON_NS = 20_000_000_000  # bodies are read up to this far ahead of the run clock...
MAX_BYTES = 512 * 1024 * 1024  # ...while they take at most this much memory
PRIME_NS = 1_000_000_000  # before the start, the first second of the schedule is read in
REFILL_AT = 0.75  # share of the horizon still covered when reading starts again
UNLIMITED = 1 << 62

Entry = tuple[Prepared, bytes]


class Window:
    """Entries by position (into `schedule`, this runner's requests in send order)."""

    def __init__(
        self,
        schedule: Schedule,
        reader: FeedReader | None = None,
        horizon_ns: int = HORIZON_NS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.schedule = schedule
        self.reader = reader
        self.horizon_ns = horizon_ns
        self.max_bytes = max_bytes
        self.total = len(schedule.trace_index)
        self.received = 0  # entries arrived so far, in position order
        self.held_bytes = 0
        self._entries: dict[int, Entry] = {}
        self._wanted = -1  # a position asked for ahead of the horizon
        self._refilling = True  # reading until the horizon is covered
        self.relinked: list[int] = []  # arrived positions whose `after` differs from the schedule's
        self.moved: list[int] = []  # arrived positions another sender sends instead
        self.joined: list[int] = []  # positions (from `total` on) of requests moved here, new ones
        self._joined_count = 0
        self.to_send = self.total  # the schedule's, less those moved away, plus those moved here

    @classmethod
    def of(
        cls, prepared: Sequence[Prepared], wires: Sequence[bytes], schedule: Schedule | None = None
    ) -> Window:
        """A window holding requests prepared up front (in schedule order); `schedule`: theirs, when
        it differs from what they say (a warm-up's, moved to start at 0)."""
        window = cls(schedule if schedule is not None else schedule_of(prepared))
        for entry in zip(prepared, wires, strict=True):
            window._add(entry)
        return window

    @property
    def complete(self) -> bool:
        """Everything arrived: the schedule's requests, and the preparer's last frame when streamed
        (requests moved here come until then)."""
        return self.received >= self.total and (self.reader is None or self.reader.ended)

    def has(self, position: int) -> bool:
        return position in self._entries

    def peek(self, position: int) -> Entry:
        """The request at `position` while it is held (a live reply builds its body from it)."""
        return self._entries[position]

    def take(self, position: int) -> Entry:
        prepared, wire = self._entries.pop(position)
        self.held_bytes -= len(wire)
        return prepared, wire

    def missing(self, position: int) -> bool:
        """Whether `position` has not arrived yet (it may have been taken already)."""
        return self.received <= position < self.total

    def want(self, position: int) -> None:
        """`position` is due now: read up to it whatever the horizon."""
        self._wanted = max(self._wanted, position)

    def needs_reading(self, elapsed_ns: int) -> bool:
        """Whether to read more now, `elapsed_ns` into the run (negative before its start).

        Reading starts when less than REFILL_AT of the horizon is covered and goes on until all of
        it is (or the bytes are used up), so the sender reads in a few long stretches of gaps
        rather than a batch after every send."""
        if self.complete or self.reader is None:
            return False
        if self._wanted >= self.received or self.received >= self.total:
            return True  # a request due now, or the last frame (and requests moved here) to come
        if self.held_bytes >= self.max_bytes:
            self._refilling = False
            return False
        ahead = int(self.schedule.scheduled_ns[self.received]) - elapsed_ns
        if ahead > self.horizon_ns:
            self._refilling = False
        elif ahead <= self.horizon_ns * REFILL_AT:
            self._refilling = True
        return self._refilling

    def read(self) -> bool:
        """Take in one batch if one has arrived; whether one had."""
        if self.reader is None:
            return False
        batch = self.reader.read()
        if batch is None:
            return False
        for entry in batch:
            self._add(entry)
        if self.reader.ended and self.received < self.total:
            raise RunAborted(f"request preparation ended after {self.received} of {self.total} requests")
        return True

    def _add(self, entry: Entry | feed.Entry) -> None:
        kind = entry[2] if len(entry) > 2 else feed.OWN
        request: Entry = (entry[0], entry[1])
        if kind == feed.JOINED:
            position = self.total + self._joined_count
            self._joined_count += 1
            self.joined.append(position)
            self.to_send += 1
            self._hold(position, request)
            return
        expected = int(self.schedule.trace_index[self.received])
        if entry[0].index != expected:
            raise RuntimeError(f"prepared request {entry[0].index} arrived where {expected} was due")
        if kind == feed.MOVED:
            self.moved.append(self.received)
            self.to_send -= 1
        else:
            self._hold(self.received, request)
            if entry[0].after != int(self.schedule.after[self.received]):
                self.relinked.append(self.received)
        self.received += 1

    def _hold(self, position: int, request: Entry) -> None:
        self._entries[position] = request
        self.held_bytes += len(request[1])

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


async def fill(window: Window, until_ns: int = UNLIMITED) -> None:
    """Before the start: read until the schedule's first `until_ns` are in (or all of it is; not the
    requests other senders' schedules may move here: those are the run's to read)."""
    while window.reader is not None and window.received < window.total:
        if window.received and int(window.schedule.scheduled_ns[window.received]) > until_ns:
            return
        if not window.read():
            await asyncio.sleep(0.001)
