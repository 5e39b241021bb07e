"""The measurement procedure around a replay: warm up, then reset caches and measure K times.

Benchmarking practice is to warm an engine up (CUDA graphs, allocator, first-request paths) before
measuring, and to repeat the measured run so that run-to-run noise can be told apart from a real
difference. `--warmup N|Ss` sends the trace's first N requests (or its first S seconds) at their
own timing before the measured run and keeps only their counts; `--repeat K` runs the measured
replay K times, each after the flavor's cache reset, each into its own result file of one label.
Several candidates (`replayproxy compare`) run their repetitions interleaved (`interleaved`).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy import clock
from replayproxy.errors import BadOption
from replayproxy.replay import probe_http, sender, telemetry
from replayproxy.replay.connection import Target
from replayproxy.replay.options import ReplayOptions
from replayproxy.replay.preparation import RunPlan
from replayproxy.replay.target import pre_run
from replayproxy.results import RunWarmup

WARMUP_LEAD_NS = 100_000_000
_WARMUP = re.compile(r"^(?P<value>\d+(?:\.\d+)?)(?P<unit>s?)$")


@dataclass(frozen=True, slots=True)
class Warmup:
    """`--warmup 20` (the first 20 requests) or `--warmup 30s` (those in the first 30 s)."""

    requests: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> Warmup:
        match = _WARMUP.match(text.strip().lower())
        if match is None:
            raise BadOption(f"--warmup must be a request count or seconds, e.g. 20 or 30s; got {text!r}")
        if match["unit"]:
            return cls(seconds=float(match["value"]))
        if "." in match["value"]:
            raise BadOption(f"--warmup request count must be a whole number, got {text!r}")
        return cls(requests=int(match["value"]))

    def select(self, scheduled_ns: np.ndarray) -> int:
        """How many requests the warm-up sends: a prefix of the schedule (`scheduled_ns`, in order)."""
        if self.requests is not None:
            return min(self.requests, len(scheduled_ns))
        assert self.seconds is not None
        limit_ns = (int(scheduled_ns[0]) if len(scheduled_ns) else 0) + self.seconds * 1e9
        return int(np.searchsorted(scheduled_ns, limit_ns, side="left"))


def interleaved(labels: Sequence[str], repeat: int, seed: int | None = None) -> list[tuple[str, int]]:
    """The order of the measured runs of several candidates: round i runs repetition i of each, so a
    drift of the machine over time falls on every candidate alike (A, B, A, B, ...); with a seed,
    each round's order is shuffled, so no candidate always runs first after the other's load."""
    rng = random.Random(seed)
    order: list[tuple[str, int]] = []
    for repetition in range(1, repeat + 1):
        round_ = list(labels)
        if seed is not None:
            rng.shuffle(round_)
        order.extend((label, repetition) for label in round_)
    return order


def output_for(output: str, repetition: int, repetitions: int) -> str:
    """RESULT.rpr for one run; RESULT-run2.rpr for the second of several."""
    if repetitions == 1:
        return output
    path = Path(output)
    return str(path.with_name(f"{path.stem}-run{repetition}{path.suffix or '.rpr'}"))


async def warm_up(options: ReplayOptions, plan: RunPlan) -> RunWarmup:
    """Send the warm-up requests at their own timing; what was sent is recorded, not measured."""
    warmup = Warmup.parse(options.warmup)
    count = warmup.select(plan.schedule.scheduled_ns[plan.send])
    if not count:
        return RunWarmup(spec=options.warmup, requests=0, errors=0, duration_s=0.0)
    chosen = plan.send[:count]
    share = plan.share(options, chosen, shift_ns=int(plan.schedule.scheduled_ns[chosen[0]]))
    started = clock.now_ns()
    outcome = await sender.run_local(
        options, share, min(plan.pool_size, count), clock.now_ns() + WARMUP_LEAD_NS
    )
    return RunWarmup(
        spec=options.warmup,
        requests=len(outcome.results),
        errors=sum(1 for r in outcome.results if r.error),
        duration_s=round((clock.now_ns() - started) / 1e9, 3),
    )


async def reset_target(options: ReplayOptions, plan: RunPlan) -> dict[str, Any]:
    """The flavor's pre-run actions (e.g. the prefix-cache reset) right before one measured run."""
    skip = set() if options.reset_prefix_cache else {a.name for a in plan.flavor.pre_run}
    url = Target.parse(options.target).url
    async with probe_http.session(60.0) as http:
        outcome: dict[str, Any] = dict(await pre_run(http, url, plan.flavor, skip, options.headers))
    # the engine's block size and prefix-cache counters at the start, beside the reset's outcome
    outcome["prefix_cache"] = await asyncio.to_thread(telemetry.scrape_cache_state, options.cache_metrics_url)
    return outcome
