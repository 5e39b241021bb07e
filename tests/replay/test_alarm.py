"""The sender's kernel timer: wakes at absolute `clock.now_ns` readings, never early, interruptible."""

from __future__ import annotations

import asyncio
import sys

import pytest

from replayproxy import clock
from replayproxy.replay.alarm import Alarm, Interrupt
from replayproxy.replay.schedule import Waiter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")


@pytest.fixture
def alarm() -> Alarm:
    made = Alarm.create()
    assert made is not None
    return made


def test_an_alarm_never_wakes_before_its_time(alarm: Alarm) -> None:
    async def walk() -> list[int]:
        early = []
        for gap_ns in (300_000, 1_000_000, 2_500_000, 50_000, 4_000_000):
            at = clock.now_ns() + gap_ns
            assert await alarm.wait(at) is False
            early.append(at - clock.now_ns())
        return early

    try:
        assert max(asyncio.run(walk())) <= 0
    finally:
        alarm.close()


def test_an_interrupt_ends_the_wait_at_once(alarm: Alarm) -> None:
    async def interrupted() -> tuple[bool, int]:
        interrupt = Interrupt()
        asyncio.get_running_loop().call_later(0.01, interrupt.set)
        started = clock.now_ns()
        rang = await alarm.wait(started + 5_000_000_000, interrupt)
        return rang, clock.now_ns() - started

    try:
        rang, waited = asyncio.run(interrupted())
    finally:
        alarm.close()
    assert rang is True
    assert waited < 2_000_000_000  # nowhere near the 5 s asked


def test_an_expiry_nobody_waited_for_does_not_end_the_next_wait(alarm: Alarm) -> None:
    """Interrupted before its time, the timer still fires; the next wait must not take that for its own."""

    async def after_a_stale_expiry() -> int:
        interrupt = Interrupt()
        interrupt.set()
        await alarm.wait(clock.now_ns() + 1_000_000, interrupt)  # returns at once: already interrupted
        stale = Interrupt()
        asyncio.get_running_loop().call_later(0.0005, stale.set)
        await alarm.wait(clock.now_ns() + 2_000_000, stale)
        await asyncio.sleep(0.01)  # the 2 ms expiry happens with nobody reading
        at = clock.now_ns() + 30_000_000
        await alarm.wait(at)
        return clock.now_ns() - at

    try:
        assert asyncio.run(after_a_stale_expiry()) >= 0
    finally:
        alarm.close()


def test_a_waiter_with_an_alarm_reaches_each_deadline(alarm: Alarm) -> None:
    waiter = Waiter(clock.now_ns, alarm=alarm)

    async def walk() -> list[int]:
        start = clock.now_ns()
        deadlines = [start + i * 1_500_000 for i in range(1, 12)]
        return [(await waiter.until(d) or 0) - d for d in deadlines]

    try:
        late = asyncio.run(walk())
    finally:
        alarm.close()
    assert min(late) >= 0
    assert max(late) < 500_000_000  # generous: a loaded machine may preempt us
