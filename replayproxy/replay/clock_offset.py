"""How far this replayer's clock is from the others' when several share one `--start-at`.

Each shard converts the common start to its own monotonic clock through its own wall clock, so a
pod whose wall clock is 40 ms ahead starts 40 ms early: schedule lag, measured on the pod's own
clock, cannot show it. What can be measured without NTP access is the wall clock against a clock
every shard sees: the target's HTTP `Date` header (one-second resolution). Each probe bounds the
offset (local minus target) to (sent - date - 1 s, received - date]; probes aimed at the moment
the target's second should tick, by the estimate so far, halve that interval each time, so a few
probes bound it to tens of milliseconds plus the round trip. The bound is reported with the
estimate. Behind a load balancer whose replicas' clocks disagree the probes contradict each
other, and no offset is reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

import aiohttp

from replayproxy import clock
from replayproxy.results import ClockReference, RunClock

SECOND_NS = 1_000_000_000
DATE_SOURCE = "target Date header"
PROBES = 6  # the first bounds the offset to ~1 s; each later one halves it


async def against_date(
    http: aiohttp.ClientSession, url: str, headers: Mapping[str, str], probes: int = PROBES
) -> ClockReference | None:
    """Local wall clock minus the target's `Date` (`offset_ns`), within `bound_ns` of the truth, or
    None when the target sends no usable `Date` (or contradicts itself). Failed probes are
    skipped: the offset is a note on the run, never a reason to stop."""
    low, high = -(1 << 62), 1 << 62
    answered = 0
    for probe in range(probes):
        if probe:
            await asyncio.sleep(_until_tick((low + high) // 2) / 1e9)
        sent = clock.wall_ns()
        try:
            async with http.get(url, headers=dict(headers)) as resp:
                date = resp.headers.get("Date", "")
                await resp.read()
        except (aiohttp.ClientError, TimeoutError, RuntimeError):  # RuntimeError: the session closed
            continue
        received = clock.wall_ns()
        try:
            date_ns = int(parsedate_to_datetime(date).timestamp()) * SECOND_NS
        except (TypeError, ValueError):
            return None
        low, high = max(low, sent - date_ns - SECOND_NS), min(high, received - date_ns)
        answered += 1
        if low > high:
            return None  # two clocks behind one address, or one stepped meanwhile
    if not answered:
        return None
    offset_ns, bound_ns = (low + high) // 2, (high - low + 1) // 2
    return ClockReference(source=DATE_SOURCE, offset_ns=offset_ns, bound_ns=bound_ns, probes=answered)


def _until_tick(offset_ns: int) -> int:
    """Nanoseconds from now until the target's clock, `offset_ns` behind ours, turns a second."""
    target_now = clock.wall_ns() - offset_ns
    return SECOND_NS - target_now % SECOND_NS


def record(
    start_at_ns: int, start_ns: int, ready_ns: int, end: clock.Anchor, reference: ClockReference | None
) -> RunClock:
    """What a shard's result header says about its clock (RunHeader.clock), each figure as measured:

    - ready_before_start_ns: how long before its start this process had everything ready
      (negative: it was late, and its first sends lag by that much);
    - start_at_ns, wall_drift_ns (with `--start-at`): the common start asked for, and how far the
      start, as the wall clock read after the run, moved from it (the wall clock slewed or stepped
      against the monotonic one during the run);
    - reference: the wall clock against the target's `Date` (see `against_date`), if measured.
    """
    out = RunClock(ready_before_start_ns=start_ns - ready_ns)
    if start_at_ns:
        out["start_at_ns"] = start_at_ns
        out["wall_drift_ns"] = end.to_wall(start_ns) - start_at_ns
    if reference is not None:
        out["reference"] = reference
    return out
