"""One sender's run: stream its share's bodies in, warm a pool, wait for the start, send.

Everything slow happens off the send path: the preparer process (replay.preparer) makes the bodies
and the runner reads them into a bounded window (replay.window) between sends, so the send loop only
sees prepared bytes and warm connections; in closed loop too, a later turn's live reply is built on
the body in the window when the turn it continues ends.
With `workers > 1` each worker process runs this for its share (replay.workers) against one
absolute start time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from replayproxy import clock
from replayproxy.errors import BadOption
from replayproxy.replay import replies
from replayproxy.replay import window as windows
from replayproxy.replay.connection import Pool, Target
from replayproxy.replay.feed import FeedReader
from replayproxy.replay.housekeeping import restore_memory, settle_memory
from replayproxy.replay.options import ReplayOptions, parse_start_at
from replayproxy.replay.preparation import Share
from replayproxy.replay.progress import Reading
from replayproxy.replay.runner import Runner
from replayproxy.results import ReplayResult
from replayproxy.tasks import spawn

START_LEAD_NS = 200_000_000  # first send this long after everything is ready


def start_ns_for(options: ReplayOptions) -> int:
    """The absolute monotonic start: `--start-at` converted through a wall/monotonic anchor, or soon."""
    anchor = clock.Anchor.take()
    if not options.start_at:
        return anchor.mono_ns + START_LEAD_NS
    start = anchor.mono_ns + (parse_start_at(options.start_at) - anchor.wall_ns)
    if start < anchor.mono_ns:
        raise BadOption(f"--start-at {options.start_at} is in the past")
    return start


@dataclass(slots=True)
class Outcome:
    """What a run produced so far: complete after `run_local` returns, partial if it was interrupted."""

    results: list[ReplayResult] = field(default_factory=list)
    start_ns: int = 0  # absolute monotonic start; 0 until it was decided
    ready_ns: int = 0  # monotonic time the start was decided at: everything was ready to send
    live_replies: replies.LiveReplies | None = None  # with live replies: how the turns came out


async def run_local(
    options: ReplayOptions,
    share: Share,
    pool_size: int,
    start: Callable[[], int] | int,
    *,
    worker: int = 0,
    progress: Callable[[Runner], None] | None = None,
    outcome: Outcome | None = None,
    closed_loop: bool = False,
    live: replies.Setup | None = None,
) -> Outcome:
    """Start the share's preparer, warm a pool, fill the window's first part (or all of it, when
    prepared up front), wait for the start, send; fills and returns `outcome`. With `live` (closed
    loop), later turns are built from the replies to the turns before them."""
    outcome = outcome if outcome is not None else Outcome()
    target = Target.parse(options.target)
    pool = Pool(target, clock.now_ns, options.headers)
    window = _window(options, share)
    upfront = options.prepare == "upfront"
    if upfront:
        window.horizon_ns = window.max_bytes = windows.UNLIMITED
    async with contextlib.AsyncExitStack() as stack:
        threader = None
        if live is not None and closed_loop:
            opened = replies.opened(live, target, options.headers, share.schedule.after.tolist())
            threader = await stack.enter_async_context(opened)
        try:
            until = windows.UNLIMITED if upfront else windows.PRIME_NS
            await asyncio.gather(pool.fill(pool_size), windows.fill(window, until))
            runner = Runner(
                window,
                pool,
                clock=clock.now_ns,
                timeout_s=options.timeout,
                max_concurrency=options.max_concurrency,
                worker=worker,
                results=outcome.results,
                closed_loop=closed_loop,
                rebuild=threader.wire_after if threader is not None else None,
            )
            settle_memory()
            outcome.start_ns = start if isinstance(start, int) else start()
            reporter = spawn(_report_progress(runner, progress), name="replay-progress") if progress else None
            try:
                await runner.run(outcome.start_ns)
            finally:
                if reporter is not None:
                    reporter.cancel()
        finally:
            window.close()
            pool.close()
            restore_memory()
            if threader is not None:
                outcome.live_replies = threader.record()
    return outcome


def _window(options: ReplayOptions, share: Share) -> windows.Window:
    """The share's requests, streamed from the preparer."""
    return windows.Window(
        share.schedule,
        FeedReader(share.feed) if share.feed is not None else None,
        horizon_ns=int(options.prepare_window * 1e9),
        max_bytes=options.prepare_memory << 20,
    )


PROGRESS_ROOM_NS = 5_000_000  # draw progress when the next send is at least this far away...
PROGRESS_WAIT_S = 0.25  # ...or after waiting this long for such a gap


async def _report_progress(runner: Runner, progress: Callable[[Runner], None]) -> None:
    while True:
        await asyncio.sleep(1.0)
        for _ in range(int(PROGRESS_WAIT_S / 0.001)):
            if not 0 < runner.next_deadline_ns - clock.now_ns() < PROGRESS_ROOM_NS:
                break
            await asyncio.sleep(0.001)  # a send is due soon: drawing must not delay it
        progress(runner)


class RunnerReadings:
    """Progress readings of a local runner: its counts, and the lags and TTFTs new since the last."""

    def __init__(self) -> None:
        self._seen = 0

    def __call__(self, runner: Runner) -> Reading:
        c = runner.counters
        lags, c.lags_ns = c.lags_ns, []
        new, self._seen = runner.results[self._seen :], len(runner.results)
        ttfts = [r.ttft_ns for r in new if not r.error and r.ttft_ns >= 0]
        return Reading(c.total, c.sent, c.done, c.errors, lags, ttfts)
