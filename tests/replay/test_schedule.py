"""Schedule arithmetic and the deadline waiter, with an injected clock (no real time)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from replayproxy.replay import schedule


def test_select_window_and_limit() -> None:
    offsets = np.array([0, 1, 2, 3, 4, 5], np.int64) * 1_000_000_000 + 7
    assert schedule.select(offsets, schedule.TraceSlice()).tolist() == [0, 1, 2, 3, 4, 5]
    assert schedule.select(offsets, schedule.TraceSlice(start_offset_s=2)).tolist() == [2, 3, 4, 5]
    assert schedule.select(offsets, schedule.TraceSlice(start_offset_s=1, duration_s=2)).tolist() == [1, 2]
    assert schedule.select(offsets, schedule.TraceSlice(limit=3, start_offset_s=1.5)).tolist() == [2, 3, 4]
    assert schedule.select(np.zeros(0, np.int64), schedule.TraceSlice()).tolist() == []


def test_scheduled_times_are_relative_and_scaled() -> None:
    offsets = np.array([5_000, 1_005_000, 3_005_000], np.int64)
    assert schedule.scheduled_ns(offsets, 1.0).tolist() == [0, 1_000_000, 3_000_000]
    assert schedule.scheduled_ns(offsets, 2.0).tolist() == [0, 500_000, 1_500_000]
    with pytest.raises(ValueError, match="speed"):
        schedule.scheduled_ns(offsets, 0)


def test_parse_shard() -> None:
    assert schedule.parse_shard("0/4") == (0, 4)
    assert schedule.parse_shard("3/4") == (3, 4)
    for bad in ("4/4", "x/2", "1", "-1/2", "0/0"):
        with pytest.raises(ValueError, match="shard"):
            schedule.parse_shard(bad)


def test_peak_concurrency() -> None:
    starts = np.array([0, 10, 20, 100], np.int64)
    assert schedule.peak_concurrency(starts, np.array([30, 30, 30, 5])) == 3
    # an interval ending exactly when the next starts does not overlap it
    assert schedule.peak_concurrency(np.array([0, 10]), np.array([10, 10])) == 1
    assert schedule.peak_concurrency(np.zeros(0, np.int64), np.zeros(0, np.int64)) == 0


def test_estimate_uses_recorded_e2e_when_known() -> None:
    e2e = np.array([2_000, -1, -1])
    out = np.array([10, 100, -1])
    est = schedule.estimate_e2e_ns(e2e, out)
    assert est[0] == 2_000
    assert est[1] == schedule.EST_BASE_NS + 100 * schedule.EST_PER_OUTPUT_TOKEN_NS
    assert (
        est[2] == schedule.EST_BASE_NS + schedule.EST_DEFAULT_OUTPUT_TOKENS * schedule.EST_PER_OUTPUT_TOKEN_NS
    )


class FakeTime:
    """A clock that advances only when the code under test sleeps or yields."""

    def __init__(self, yield_cost_ns: int = 100_000, oversleep_ns: int = 0) -> None:
        self.now = 0
        self.sleeps: list[float] = []
        self.yield_cost_ns = yield_cost_ns
        self.oversleep_ns = oversleep_ns

    def clock(self) -> int:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += int(seconds * 1e9) + self.oversleep_ns if seconds else self.yield_cost_ns


def test_waiter_sleeps_coarsely_then_yields_until_the_deadline() -> None:
    fake = FakeTime()
    waiter = schedule.Waiter(fake.clock, fake.sleep, spin_ns=1_000_000)
    reached = asyncio.run(waiter.until(10_000_000))
    assert reached >= 10_000_000
    assert reached - 10_000_000 < fake.yield_cost_ns  # never more than one yield late
    assert fake.sleeps[0] == pytest.approx(0.009)  # the coarse sleep stops spin_ns early
    assert all(s == 0 for s in fake.sleeps[1:]) and len(fake.sleeps) == 11


def test_waiter_absolute_deadlines_do_not_drift() -> None:
    """Oversleeping on one deadline does not shift the next: deadlines are absolute."""
    fake = FakeTime(oversleep_ns=300_000)
    waiter = schedule.Waiter(fake.clock, fake.sleep, spin_ns=500_000)

    async def walk() -> list[int]:
        return [await waiter.until(d) - d for d in range(5_000_000, 105_000_000, 5_000_000)]

    late = asyncio.run(walk())
    assert max(late) < 200_000


def test_waiter_returns_at_once_when_late() -> None:
    fake = FakeTime()
    fake.now = 50
    waiter = schedule.Waiter(fake.clock, fake.sleep)
    assert asyncio.run(waiter.until(10)) == 50
    assert fake.sleeps == []
