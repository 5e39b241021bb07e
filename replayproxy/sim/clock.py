"""Every clock read of the simulated engine, in one place (the sim cannot import replayproxy.clock).

Engine timing uses the monotonic counter; the ground-truth log and the `created` fields use the
wall clock, because they are compared with timestamps taken by other processes.
"""

from __future__ import annotations

import asyncio
import time


def now_ns() -> int:
    """Monotonic nanoseconds, for step deadlines and latency metrics."""
    return time.perf_counter_ns()


def wall_ns() -> int:
    """UTC nanoseconds since the epoch, for the truth log (comparable across processes)."""
    return time.time_ns()


def wall_s() -> int:
    """Whole UTC seconds, for OpenAI's `created` fields."""
    return time.time_ns() // 1_000_000_000


async def sleep_until(deadline_ns: int) -> None:
    """Sleep until a monotonic deadline; always yields once so other tasks can run."""
    await asyncio.sleep(max(0.0, (deadline_ns - now_ns()) / 1e9))
