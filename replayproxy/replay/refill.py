"""Reading prepared requests into a sender's window in the gaps between its sends.

The preparer process streams bodies through a pipe (replay.feed); reading a batch costs
milliseconds, so it happens only when the next send is at least `FEED_GUARD_NS` away, unless the
request due is missing (then at once: it cannot go before it arrives). A failure of the reading (the
preparer ended early) is kept for the send loop, which would otherwise wait for a request that can
never come.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from replayproxy.replay.window import Window

FEED_GUARD_NS = 2_000_000  # no reading of prepared requests this close to the next send
FEED_IDLE_S = 0.01  # the window is full: look again after this long
FEED_WAIT_S = 0.05  # the pipe is empty: wait this long for it at most, then look again


class Refill:
    """Fills `window` while the run goes; `next_send()` gives the sender's next (deadline, position)
    (deadline 0 when nothing is ahead on the clock), `on_batch()` runs after each batch taken in."""

    def __init__(
        self,
        window: Window,
        clock: Callable[[], int],
        start_ns: int,
        next_send: Callable[[], tuple[int, int]],
        on_batch: Callable[[], None],
    ) -> None:
        self.window = window
        self.clock = clock
        self.start_ns = start_ns
        self.next_send = next_send
        self.on_batch = on_batch
        self.fed = asyncio.Event()  # a batch was taken in (or the reading stopped)
        self.error: BaseException | None = None  # why the reading stopped before the window was full

    async def arrival(self, position: int) -> None:
        """Wait for a request whose body is not in the window yet (the preparer is behind); raises
        what stopped the reading, if it stopped (the preparer ended): that request can never come."""
        self.window.want(position)
        while self.window.missing(position):
            if self.error is not None:
                raise self.error
            self.fed.clear()
            await self.fed.wait()

    async def run(self) -> None:
        """`_fill`, its failure kept for `arrival` (a task's exception would only be logged)."""
        try:
            await self._fill()
        except Exception as e:
            self.error = e
            self.fed.set()

    async def _fill(self) -> None:
        """Read while the window's horizon and byte limit allow, in the gaps between sends (or at
        once, when the request due is missing)."""
        window = self.window
        while not window.complete:
            now = self.clock()
            if not window.needs_reading(now - self.start_ns):
                await asyncio.sleep(FEED_IDLE_S)
                continue
            deadline, position = self.next_send()
            room = deadline - now if deadline else 1 << 62
            if room <= FEED_GUARD_NS and not window.missing(position):
                await asyncio.sleep(max(room, 0) / 1e9 + 0.0002)  # until just after the next send
                continue
            if window.read():
                self.on_batch()
                self.fed.set()
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
