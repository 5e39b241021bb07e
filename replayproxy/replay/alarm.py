"""A kernel timer that wakes the event loop at an absolute `clock.now_ns` reading, within microseconds.

asyncio's timers (uvloop's count whole milliseconds from a clock read once per loop turn) wake a
coroutine up to a millisecond or two early or late, so a sender that must write within a
millisecond of its deadline had to spin through the last millisecond before each one: CPU the
preparer on the same core needs, and a runnable sender the scheduler may switch away from
mid-spin. A timerfd armed on the clock `now_ns` reads (CLOCK_MONOTONIC) is a high-resolution
kernel timer; registered with the loop like a socket, it makes the loop's poll return at the time
asked. Linux only: elsewhere `Alarm.create` gives None and the waiter sleeps, then spins.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import sys
from typing import Any

from replayproxy import clock

_ABSOLUTE = 1  # TFD_TIMER_ABSTIME


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Interrupt(asyncio.Event):
    """An event that also ends an alarm's wait the moment it is set (a plain Event can only be
    awaited, and awaiting two things at once would need a task per wait)."""

    def __init__(self) -> None:
        super().__init__()
        self.ring: asyncio.Future[bool] | None = None

    def set(self) -> None:
        super().set()
        ring = self.ring
        if ring is not None and not ring.done():
            ring.set_result(True)


class Alarm:
    """One timerfd, armed for one wait at a time."""

    def __init__(self, fd: int, settime: Any) -> None:
        self._fd = fd
        self._settime = settime

    @classmethod
    def create(cls) -> Alarm | None:
        """An alarm on `clock.now_ns`'s clock; None where there is no timerfd for it."""
        if clock.NOW_CLOCK_ID is None or not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            create, settime = libc.timerfd_create, libc.timerfd_settime
        except (OSError, AttributeError):
            return None
        settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        fd = create(clock.NOW_CLOCK_ID, os.O_NONBLOCK | os.O_CLOEXEC)  # TFD_NONBLOCK, TFD_CLOEXEC
        return cls(fd, settime) if fd >= 0 else None

    async def wait(self, at_ns: int, interrupt: Interrupt | None = None) -> bool:
        """Until `clock.now_ns()` reads `at_ns` or later; True when `interrupt` was set first."""
        if interrupt is not None and interrupt.is_set():
            return True
        loop = asyncio.get_running_loop()
        ring: asyncio.Future[bool] = loop.create_future()
        at_ns = max(at_ns, 1)  # a zero time would disarm the timer
        value = _Itimerspec(_Timespec(0, 0), _Timespec(at_ns // 1_000_000_000, at_ns % 1_000_000_000))
        if self._settime(self._fd, _ABSOLUTE, ctypes.byref(value), None) != 0:  # also clears a stale expiry
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        loop.add_reader(self._fd, _rang, ring)
        if interrupt is not None:
            interrupt.ring = ring
        try:
            return await ring
        finally:
            loop.remove_reader(self._fd)
            if interrupt is not None:
                interrupt.ring = None
            with contextlib.suppress(BlockingIOError):
                os.read(self._fd, 8)  # the expiry count, so the fd is quiet until armed again

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _rang(ring: asyncio.Future[bool]) -> None:
    if not ring.done():
        ring.set_result(False)
