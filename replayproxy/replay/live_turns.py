"""Closed-loop turns built from the candidate's own replies, between the end of a turn and its release.

When the last of a request's parents ends, it is rebuilt from their replies (replay.replies) during
its think time, then released to the ledger (replay.release): the turn it continues gives its
prompt and reply, each request it joins its reply; a build that takes longer than the think time
makes the turn late, and its lag says so. A parent's timeline is kept from its end until every
request of the schedule waiting for it was built, and a later chat turn's while an edited-reply
continuation arriving within the window's horizon may still extend it.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from replayproxy.replay.prepared import Prepared
from replayproxy.replay.release import Continuation
from replayproxy.replay.request_timeline import RequestTimeline
from replayproxy.replay.window import Window
from replayproxy.tasks import spawn

_log = logging.getLogger("replayproxy.replay")
# A later turn's bytes, built once the turn it continues and the requests it joins (None: not
# replayed here) ended; None: its planned bytes
Rebuild = Callable[
    [RequestTimeline, Sequence[RequestTimeline | None], Prepared, bytes], Awaitable[bytes | None]
]


class LiveTurns:
    """Rebuilds turns of `window` with `rebuild`, then `release(position, end_ns)`; `arrival(position)`
    waits for a body the window has not read yet."""

    def __init__(
        self,
        window: Window,
        rebuild: Rebuild,
        arrival: Callable[[int], Awaitable[None]],
        release: Callable[[int, int], None],
    ) -> None:
        self.window = window
        self.rebuild = rebuild
        self.arrival = arrival
        self.release = release
        self.rebuilt: dict[int, bytes] = {}  # position -> bytes built from the previous turn's reply
        self._ended: OrderedDict[int, RequestTimeline] = OrderedDict()  # trace index -> a kept turn
        schedule = window.schedule
        parents = np.concatenate([schedule.after, schedule.joins])
        self._waiting = Counter(parents[parents >= 0].tolist())  # trace index -> requests to build on it
        self._parents: dict[int, RequestTimeline] = {}  # trace index -> an ended parent still waited for

    def ended(self, timeline: RequestTimeline) -> None:
        """A request ended: kept while requests of the schedule waiting for it are still to build."""
        if self._waiting[timeline.prepared.index] > 0:
            self._parents[timeline.prepared.index] = timeline

    def keep(self, timeline: RequestTimeline) -> None:
        """A later chat turn ended: keep it while a request that extends it can still arrive."""
        self._ended[timeline.prepared.index] = timeline
        oldest = timeline.end_at - self.window.horizon_ns
        while self._ended and next(iter(self._ended.values())).end_at < oldest:
            self._ended.popitem(last=False)

    def follow(self, free: Continuation) -> None:
        """A request that arrived after its parent ended: built from it while it is kept."""
        ended = self._ended.get(free.parent)
        if ended is not None:
            self.start(free, ended)
            return
        _log.warning("live replies: an edited-reply turn keeps its planned prompt "
                     "(the turn it extends ended a window before it was prepared)")  # fmt: skip
        self.release(free.position, free.end_ns)

    def start(self, free: Continuation, at_hand: RequestTimeline) -> None:
        """`free.position` may go, its parents ended (the last one `at_hand`): build it, then release it."""
        spawn(self._build_then_release(free, at_hand), name="replay-live-turn")

    async def _build_then_release(self, free: Continuation, at_hand: RequestTimeline) -> None:
        position = free.position
        try:
            if self.window.missing(position):  # a turn ahead of the window: read up to it first
                await self.arrival(position)
            prepared, wire = self.window.peek(position)
            parent, *joins = (self._parent(index, at_hand) for index in (prepared.after, *prepared.joins))
            built = None
            if parent is not None and not prepared.spawned:  # a sub-agent carries none of its context
                built = await self.rebuild(parent, joins, prepared, wire)
        except Exception as e:  # noqa: BLE001 — a failed build costs that turn its live reply, nothing more
            _log.warning("live reply not built (%s: %s); the turn stays as planned", type(e).__name__, e)
            built = None
        if built is not None:
            self.rebuilt[position] = built
        self.release(position, free.end_ns)

    def _parent(self, index: int, at_hand: RequestTimeline) -> RequestTimeline | None:
        """The ended timeline of trace index `index` (one build fewer waits for it), if kept."""
        if self._waiting[index] > 0:
            self._waiting[index] -= 1
        kept = self._parents.get(index) if self._waiting[index] > 0 else self._parents.pop(index, None)
        if kept is None and at_hand.prepared.index == index:
            return at_hand
        return kept if kept is not None else self._ended.get(index)
