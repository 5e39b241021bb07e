"""The only module that reads clocks, so timing code can be audited and faked in one place.

Intervals use the monotonic `perf_counter_ns`; the wall clock is read only to anchor a run or a
trace file to UTC for humans and for merging files from several hosts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# Monotonic nanoseconds: every measured interval in the project is a difference of these. Bound
# to the C function itself, not wrapped: the proxy reads it for every upstream read it records.
now_ns: Callable[[], int] = time.perf_counter_ns
# The POSIX clock `now_ns` reads, where it is one (Linux: CLOCK_MONOTONIC): a kernel timer armed
# on it (replay.alarm) fires at `now_ns` readings. None elsewhere.
NOW_CLOCK_ID: int | None = (
    getattr(time, "CLOCK_MONOTONIC", None)
    if time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"
    else None
)


def wall_ns() -> int:
    """UTC nanoseconds since the epoch, for headers and file names only."""
    return time.time_ns()


@dataclass(frozen=True, slots=True)
class Anchor:
    """A pair of simultaneous readings, so monotonic offsets can be shown as UTC times."""

    mono_ns: int
    wall_ns: int

    @classmethod
    def take(cls) -> Anchor:
        return cls(mono_ns=now_ns(), wall_ns=wall_ns())

    def to_wall(self, mono_ns: int) -> int:
        return self.wall_ns + (mono_ns - self.mono_ns)
