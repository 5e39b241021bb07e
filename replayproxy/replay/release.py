"""When each request of one sender is due: the send loop's rules over numbers, no socket, no clock.

The replay's counterpart of proxy.exchange. The driver (replay.runner) reports what happened — a
request was sent or ended, bodies arrived linked otherwise than the schedule said (relinked, moved
here, moved away) — and asks for the earliest (deadline, position) to send next. Open loop: a
request is due at the run start plus its scheduled offset. Closed loop: a request whose parents are
in this sender's schedule (the turn it continues, `after`, and the further requests it joins,
`joins`) leaves the timed order and is due when the last of them ended, at that end plus its think
time; a request none of whose parents is here keeps its offset. A session's previous turn is a list
of one parent, a join's branches a longer list: the same rule.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from replayproxy.replay.prepared import Schedule

NEVER = 1 << 62  # a deadline that never comes


class Continuation(NamedTuple):
    """`position` may go: `parent`, the last of its parents, ended at `end_ns`. The driver releases
    it (`Ledger.release`), at once or after building its body from that parent's reply."""

    position: int
    parent: int  # trace index
    end_ns: int


class Ledger:
    """The due order of the requests of `schedule` (one sender's, positions in send order), from
    the absolute monotonic `start_ns`; at most `max_concurrency` in flight when it is positive."""

    def __init__(
        self, schedule: Schedule, start_ns: int, *, closed_loop: bool, max_concurrency: int = 0
    ) -> None:
        self.schedule = schedule
        self.start_ns = start_ns
        self.closed_loop = closed_loop
        self.max_concurrency = max_concurrency
        self.in_flight = 0
        self._own = np.sort(schedule.trace_index)  # trace indexes this sender sends
        self._withdrawn: set[int] = set()  # timed positions that wait for parents instead, or moved away
        self._children: dict[int, list[int]] = {}  # trace index -> positions waiting for its end
        self._parents_left: dict[int, int] = {}  # waiting position -> its parents not ended yet
        self._latest: dict[int, tuple[int, int]] = {}  # waiting position -> (end, trace index) of the
        # latest of its parents that ended
        self._due: list[tuple[int, int]] = []  # heap of (absolute deadline, position) of released requests
        self._ends: dict[
            int, int
        ] = {}  # trace index -> end of a turn that requests arriving later may extend
        self._think: dict[int, int] = {}  # position -> think time, where the planner said otherwise
        waits = np.zeros(len(schedule.after), dtype=bool)
        if closed_loop:
            positions = np.arange(len(waits))
            owner = np.concatenate([positions, np.repeat(positions, np.diff(schedule.join_index))])
            parents = np.concatenate([schedule.after, schedule.joins])
            ours = np.flatnonzero((parents >= 0) & np.isin(parents, schedule.trace_index))
            ours = ours[np.argsort(owner[ours], kind="stable")]  # by position: after, then its joins
            waits[owner[ours]] = True
            for position, parent in zip(owner[ours].tolist(), parents[ours].tolist(), strict=True):
                self._parents_left[position] = self._parents_left.get(position, 0) + 1
                self._children.setdefault(parent, []).append(position)
        self._timed: deque[int] = deque(np.flatnonzero(~waits).tolist())  # sent at their offsets, in order

    def next(self) -> tuple[int, int] | None:
        """The earliest (deadline, position) due, timed or released; None while none is."""
        timed = self._timed
        while timed and timed[0] in self._withdrawn:
            self._withdrawn.discard(timed.popleft())
        timed_at = self.start_ns + int(self.schedule.scheduled_ns[timed[0]]) if timed else NEVER
        if self._due and self._due[0][0] <= timed_at:
            return self._due[0]
        return (timed_at, timed[0]) if timed else None

    def take(self, position: int) -> bool:
        """Take `position`, its deadline reached, if it is still the next of its order (it may have
        been withdrawn while its deadline was awaited: the driver asks `next` again)."""
        if self._due and self._due[0][1] == position:
            heapq.heappop(self._due)
            return True
        if self._timed and self._timed[0] == position and position not in self._withdrawn:
            self._timed.popleft()
            return True
        return False

    def withdrawn(self, position: int) -> bool:
        """Whether `position`, taken before its body arrived, left the timed order as it arrived
        (it waits for its parents, or another sender sends it); forgets it."""
        if position not in self._withdrawn:
            return False
        self._withdrawn.discard(position)
        return True

    @property
    def has_slot(self) -> bool:
        """Whether one more request may be in flight."""
        return not self.max_concurrency or self.in_flight < self.max_concurrency

    def sent(self) -> None:
        self.in_flight += 1

    def ended(self, index: int, end_ns: int, *, extendable: bool) -> list[Continuation]:
        """The request of trace index `index` ended at `end_ns` (sent or failed): the requests now
        free to go, each with the latest end of its parents. `extendable`: requests arriving later
        may still extend it (a later chat turn in closed loop), so its end is kept."""
        self.in_flight -= 1
        if extendable:
            self._ends[index] = end_ns
        free = []
        for position in self._children.pop(index, ()):
            latest = max(self._latest.get(position, (end_ns, index)), (end_ns, index))
            self._latest[position] = latest
            self._parents_left[position] -= 1
            if not self._parents_left[position]:
                del self._parents_left[position], self._latest[position]
                free.append(Continuation(position, latest[1], latest[0]))
        return free

    def release(self, position: int, end_ns: int) -> None:
        """`position` is due at `end_ns` plus its think time."""
        think = self._think.get(position)
        think = max(int(self.schedule.think_ns[position]) if think is None else think, 0)
        heapq.heappush(self._due, (end_ns + think, position))

    def moved_away(self, position: int) -> None:
        """Another sender sends `position` (the turn it extends is that sender's)."""
        self._withdrawn.add(position)

    def joined(self, position: int, parents: Sequence[int], think_ns: int) -> Continuation | None:
        """`position`, past the schedule, was moved here: it extends `parents`, turns of ours."""
        self._think[position] = think_ns
        return self._follow(position, parents)

    def relinked(self, position: int, parents: Sequence[int], think_ns: int) -> Continuation | None:
        """`position` arrived extending `parents`, not what the schedule said (the planner found an
        edited-reply continuation): in closed loop, where they are ours, it waits for them."""
        if not self.closed_loop or not all(self._ours(parent) for parent in parents):
            return None
        self._think[position] = think_ns
        self._withdrawn.add(position)
        return self._follow(position, parents)

    def _ours(self, index: int) -> bool:
        at = int(np.searchsorted(self._own, index))
        return at < len(self._own) and int(self._own[at]) == index

    def _follow(self, position: int, parents: Sequence[int]) -> Continuation | None:
        """`position` waits for those of `parents` still running; free now if none is."""
        running = [parent for parent in parents if parent not in self._ends]
        ended = [(self._ends[parent], parent) for parent in parents if parent in self._ends]
        if running:
            self._wait(position, running)
            if ended:
                self._latest[position] = max(ended)
            return None
        end_ns, parent = max(ended)
        return Continuation(position, parent, end_ns)

    def _wait(self, position: int, parents: Sequence[int]) -> None:
        self._parents_left[position] = len(parents)
        for parent in parents:
            self._children.setdefault(parent, []).append(position)
