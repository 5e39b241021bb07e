"""Nothing lost on a kill: a SIGKILL of the forwarding process under load (an OOM kill looks the
same), with or without a SIGSTOP before it, costs at most the records of its last queue flush
(give or take a flush timer that a busy host runs late).
Its recorder process sees the pipe end (or reset), writes what it holds with the footer, and exits.
Each request carries a unique `seed`, which the trace keeps, so every response the client
completed can be looked up in the trace."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from replayproxy.clock import now_ns
from replayproxy.trace import ReadReport, read_trace_files
from tests.proxy.helpers import children_of, ended
from tests.servers import Server, sim, start_proxy
from tests.trace.helpers import shapes_of

FLUSH_NS = 20_000_000  # the proxy hands its queue to the recorder process this often
# on a busy host (load 5 on two cores) the flush timer itself runs late by tens of milliseconds: a
# response is judged settled once a flush period and this much more have passed before the kill
STARVED_NS = 100_000_000
RUNS = 10  # of each kind: 20 kills in all
LOAD_S = 0.8
WORKERS = 4


@pytest.fixture(scope="module")
def engine() -> Iterator[Server]:
    with sim("--speed", "20") as server:
        yield server


async def load(url: str, until_ns: int) -> dict[int, int]:
    """Short chats (some streamed) from a few workers until `until_ns`; seed -> when its response
    was complete at the client."""
    done: dict[int, int] = {}
    seeds = itertools.count(1)

    async def worker(session: aiohttp.ClientSession) -> None:
        while now_ns() < until_ns:
            seed = next(seeds)
            body = {
                "model": "sim-llama-3.1-8b",
                "messages": [{"role": "user", "content": "Say something short."}],
                "max_tokens": 3,
                "seed": seed,
                "stream": seed % 3 == 0,
            }
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()
                    if resp.status == 200:
                        done[seed] = now_ns()
            await asyncio.sleep(0.01)

    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(WORKERS)))
    return done


def _wait(condition: object, timeout_s: float = 15.0) -> bool:
    async def poll() -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not condition():  # type: ignore[operator]
                    await asyncio.sleep(0.02)
        return bool(condition())  # type: ignore[operator]

    return asyncio.run(poll())


def _kill_under_load(engine: Server, trace_dir: Path, stop_first: bool) -> tuple[dict[int, int], int]:
    """Runs the load against a proxy and kills it mid-load; (completions, kill time)."""
    with start_proxy(engine.url, trace_dir) as proxy:
        pid = proxy.process.pid
        assert _wait(lambda: len(children_of(pid)) == 1), "no recorder process"
        [recorder] = children_of(pid)

        async def run() -> tuple[dict[int, int], int]:
            end = now_ns() + int(LOAD_S * 1e9)
            traffic = asyncio.ensure_future(load(proxy.url, end))  # no new request after the kill
            await asyncio.sleep(LOAD_S)
            killed_ns = now_ns()  # from here the proxy hands nothing more to its recorder
            if stop_first:
                os.kill(pid, signal.SIGSTOP)
                await asyncio.sleep(0.2)
            os.kill(pid, signal.SIGKILL)
            return await traffic, killed_ns

        try:
            done, killed_ns = asyncio.run(run())
            proxy.process.wait(10)
            assert _wait(lambda: ended(recorder)), "the recorder process outlived the proxy"
        finally:
            if not ended(recorder):
                os.kill(recorder, signal.SIGKILL)
    return done, killed_ns


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop_first", [False, True], ids=["sigkill", "sigstop-then-sigkill"])
def test_a_killed_proxy_loses_at_most_its_last_queue_flush(
    engine: Server, tmp_path: Path, stop_first: bool
) -> None:
    for run in range(RUNS):
        trace_dir = tmp_path / f"run{run}"
        done, killed_ns = _kill_under_load(engine, trace_dir, stop_first)
        report = ReadReport()
        read_trace_files([trace_dir], report)
        assert report.files >= 1 and report.footers == report.files, f"run {run}: a file lacks its footer"
        recorded = {shape.sampling.get("seed") for shape in shapes_of(trace_dir)}
        settled = {seed for seed, at in done.items() if at < killed_ns - FLUSH_NS - STARVED_NS}
        assert len(settled) > 20, f"run {run}: too little load to judge ({len(settled)} responses)"
        missing = settled - recorded
        assert not missing, f"run {run}: {len(missing)} of {len(settled)} completed responses lost"
