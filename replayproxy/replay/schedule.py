"""When each request is sent: selection of the trace slice, absolute deadlines, and the waiter.

Pure arithmetic over numpy columns plus one awaitable that reaches an absolute monotonic deadline
(coarse sleep, then a short busy-yield), with the clock and the sleep injected so tests need no
real time. Deadlines are `run_start + offset / speed`, never "previous send + gap", so a late
request does not push later ones (GoReplay's drift; DESIGN.md "measurement contract").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.replay.alarm import Alarm, Interrupt

# Fallback service-time model for peak-concurrency estimates when the trace has no recorded E2E.
EST_BASE_NS = 500_000_000
EST_PER_OUTPUT_TOKEN_NS = 30_000_000
EST_DEFAULT_OUTPUT_TOKENS = 256


@dataclass(frozen=True, slots=True)
class TraceSlice:
    """Which part of a trace to replay: offsets in seconds from the trace start, and a count."""

    start_offset_s: float = 0.0
    duration_s: float | None = None
    limit: int | None = None


def select(offsets_ns: np.ndarray, part: TraceSlice) -> np.ndarray:
    """Indices (into the arrival-sorted trace) of the requests inside `part`, in arrival order."""
    if len(offsets_ns) == 0:
        return np.zeros(0, np.int64)
    begin = offsets_ns[0] + int(part.start_offset_s * 1e9)
    keep = offsets_ns >= begin
    if part.duration_s is not None:
        keep &= offsets_ns < begin + int(part.duration_s * 1e9)
    chosen = np.flatnonzero(keep).astype(np.int64)
    return chosen[: part.limit] if part.limit is not None else chosen


def scheduled_ns(offsets_ns: np.ndarray, speed: float) -> np.ndarray:
    """Send times relative to the run start: the first selected request goes at 0."""
    if speed <= 0:
        raise BadOption(f"speed must be > 0, got {speed}")
    if len(offsets_ns) == 0:
        return np.zeros(0, np.int64)
    relative: np.ndarray = (offsets_ns - offsets_ns[0]) / speed
    return np.round(relative).astype(np.int64)


def parse_shard(text: str) -> tuple[int, int]:
    """`i/N` -> (i, N) with 0 <= i < N."""
    try:
        index_text, count_text = text.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError as e:
        raise BadOption(f"--shard must look like i/N (e.g. 0/4), got {text!r}") from e
    if count < 1 or not 0 <= index < count:
        raise BadOption(f"--shard {text}: need 0 <= i < N")
    return index, count


def estimate_e2e_ns(e2e_ns: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """Recorded E2E where known, else a rough service time from the output length."""
    outputs = np.where(output_tokens >= 0, output_tokens, EST_DEFAULT_OUTPUT_TOKENS)
    estimate = EST_BASE_NS + outputs.astype(np.int64) * EST_PER_OUTPUT_TOKEN_NS
    return np.where(e2e_ns > 0, e2e_ns, estimate).astype(np.int64)


def peak_concurrency(start_ns: np.ndarray, duration_ns: np.ndarray) -> int:
    """Most intervals [start, start + duration) open at once (sweep over sorted events)."""
    if len(start_ns) == 0:
        return 0
    times = np.concatenate([start_ns, start_ns + np.maximum(duration_ns, 1)])
    steps = np.concatenate([np.ones(len(start_ns), np.int64), -np.ones(len(start_ns), np.int64)])
    order = np.lexsort((steps, times))  # at equal times, ends (-1) before starts (+1)
    return int(np.max(np.cumsum(steps[order])))


Clock = Callable[[], int]
ALARM_LEAD_NS = 200_000  # an alarm wakes the waiter this long before the deadline (its wake-up latency)
Sleep = Callable[[float], Awaitable[None]]


class Waiter:
    """Reaches absolute monotonic deadlines: wake a little before, then busy-yield.

    asyncio (and uvloop, whose timers have 1 ms resolution) cannot wake a coroutine more precisely
    than about a millisecond. With an `alarm` (a kernel timer, replay.alarm) the wait ends
    `ALARM_LEAD_NS` before the deadline; without one, a coarse sleep ends `spin_ns` before it. The
    last stretch yields to the loop with `sleep(0)` — receiving chunks keeps working — and
    re-reads the clock until the deadline has passed.
    """

    def __init__(
        self,
        clock: Clock,
        sleep: Sleep = asyncio.sleep,
        spin_ns: int = 1_000_000,
        alarm: Alarm | None = None,
        lead_ns: int = ALARM_LEAD_NS,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._spin_ns = spin_ns
        self._alarm = alarm
        self._lead_ns = lead_ns

    async def until(self, deadline_ns: int, interrupt: Interrupt | None = None) -> int | None:
        """Return the clock reading at which `deadline_ns` was reached (>= deadline_ns), or None
        as soon as `interrupt` is set (a closed-loop turn became due: the caller looks again)."""
        now = self._clock()
        remaining = deadline_ns - now
        if self._alarm is not None:
            if remaining > self._lead_ns:
                if await self._alarm.wait(deadline_ns - self._lead_ns, interrupt):
                    return None
                now = self._clock()
        elif remaining > self._spin_ns:
            seconds = (remaining - self._spin_ns) / 1e9
            if interrupt is None:
                await self._sleep(seconds)
            elif await _set_within(interrupt, seconds):
                return None
            now = self._clock()
        while now < deadline_ns:
            if interrupt is not None and interrupt.is_set():
                return None
            await self._sleep(0)
            now = self._clock()
        return now


async def _set_within(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to `seconds` for `event`; whether it was set."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True
