"""The check run itself, in process against sims: rows per (target, prompt, repeat), warm-up, interruption."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from replayproxy.check.prompts import PromptSet, parse_prompts
from replayproxy.check.requests import Sampling
from replayproxy.check.runner import CheckOptions, run_check
from replayproxy.results import CheckTarget, load_checks
from replayproxy.sim import SimConfig
from replayproxy.sim.thread import sim_thread

PROMPTS = PromptSet(
    "t",
    "d",
    parse_prompts("t", [(1, {"messages": [{"role": "user", "content": "a b"}]}), (2, {"prompt": "c d"})]),
)


def options(tmp_path: Path, urls: dict[str, str], **fields: Any) -> CheckOptions:
    targets = tuple(CheckTarget(label, url) for label, url in urls.items())
    return CheckOptions(targets, PROMPTS, tmp_path / "c.rpc", sampling=Sampling(max_tokens=8), **fields)


def test_rows_in_order_and_warmup_not_kept(tmp_path: Path) -> None:
    with sim_thread(SimConfig(port=0, speed=50)) as a, sim_thread(SimConfig(port=0, speed=50)) as b:
        lines: list[str] = []
        footer = asyncio.run(run_check(options(tmp_path, {"A": a, "B": b}, repeat=2, warmup=2), lines.append))
    assert footer == {"answers": 8, "errors": 0, "scorer_failures": 0}
    assert lines[0].startswith("A: 4 answers, 0 errors")
    (check,) = load_checks([tmp_path / "c.rpc"])
    columns = (
        check.column("target").tolist(),
        check.column("prompt_index").tolist(),
        check.column("repeat").tolist(),
    )
    order = list(zip(*columns, strict=True))
    assert order == [(t, p, r) for t in "AB" for p in (0, 1) for r in (0, 1)]
    assert set(check.column("similarity_ppm").tolist()) == {1_000_000}
    assert check.header.sampling["max_tokens"] == 8 and check.header.warmup == 2


def test_interrupted_check_keeps_the_targets_answered(tmp_path: Path) -> None:
    slow = SimConfig(port=0, speed=50, first_byte_delay=30.0)
    with sim_thread(SimConfig(port=0, speed=50)) as a, sim_thread(slow) as b:

        async def interrupt() -> None:
            done = asyncio.Event()
            task = asyncio.ensure_future(
                run_check(options(tmp_path, {"A": a, "B": b}, warmup=0), lambda line: done.set())
            )
            await asyncio.wait_for(done.wait(), 30)
            await asyncio.sleep(0.2)  # B's requests are in flight
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(interrupt())
    (check,) = load_checks([tmp_path / "c.rpc"])
    assert set(check.column("target")) == {"A"} and len(check) == 2 * 3
    assert check.footer["interrupted"] is True
