"""Closed-loop turns built from the candidate's own replies, between the end of a turn and its release.

When a turn ends, each turn that continues it is rebuilt from that reply (replay.replies) during
its think time, then released to the ledger (replay.release); a build that takes longer than the
think time makes the turn late, and its lag says so. A later chat turn's timeline is kept while an
edited-reply continuation arriving within the window's horizon may still extend it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from replayproxy.replay.prepared import Prepared
from replayproxy.replay.release import Continuation
from replayproxy.replay.request_timeline import RequestTimeline
from replayproxy.replay.window import Window
from replayproxy.tasks import spawn

_log = logging.getLogger("replayproxy.replay")
# A later turn's bytes, built once the turn before it ended (None: its planned bytes)
Rebuild = Callable[[RequestTimeline, Prepared, bytes], Awaitable[bytes | None]]


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
            self.start(ended, free.position)
            return
        _log.warning("live replies: an edited-reply turn keeps its planned prompt "
                     "(the turn it extends ended a window before it was prepared)")  # fmt: skip
        self.release(free.position, free.end_ns)

    def start(self, timeline: RequestTimeline, position: int) -> None:
        """`position` continues the turn of `timeline`, which ended: build it, then release it."""
        spawn(self._build_then_release(timeline, position), name="replay-live-turn")

    async def _build_then_release(self, timeline: RequestTimeline, position: int) -> None:
        try:
            if self.window.missing(position):  # a turn ahead of the window: read up to it first
                await self.arrival(position)
            wire = await self.rebuild(timeline, *self.window.peek(position))
        except Exception as e:  # noqa: BLE001 — a failed build costs that turn its live reply, nothing more
            _log.warning("live reply not built (%s: %s); the turn stays as planned", type(e).__name__, e)
            wire = None
        if wire is not None:
            self.rebuilt[position] = wire
        self.release(position, timeline.end_at)
