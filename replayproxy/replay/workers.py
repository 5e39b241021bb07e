"""`--workers N`: deal the schedule to N sender processes that share one start time.

One core sends a few hundred streaming requests per second within a millisecond of schedule;
beyond that, more processes rather than a silently late schedule. Each worker starts its own
preparer (replay.feed) for its share, so it holds only its own window; it warms its pool, says
"ready", receives the absolute monotonic start (CLOCK_MONOTONIC is shared by all processes of a
host), runs, and sends its results back; progress counters arrive once a second.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection as Pipe
from typing import Any

from replayproxy.replay import session
from replayproxy.replay.options import ReplayOptions
from replayproxy.replay.preparation import RunPlan, Share
from replayproxy.replay.progress import Reading, merge
from replayproxy.replay.runner import Runner
from replayproxy.results import ReplayResult

READY_TIMEOUT_S = 300.0


def _worker_main(
    options: ReplayOptions,
    share: Share,
    pool_size: int,
    worker: int,
    pipe: Pipe,
    closed_loop: bool = False,
) -> None:
    """Entry point of a worker process."""
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # not on every platform
        factory = None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            outcome = runner.run(_work(options, share, pool_size, worker, pipe, closed_loop))
        pipe.send(("done", outcome.results))
    except Exception as e:  # reported to the parent, which stops the run with one line
        pipe.send(("error", f"worker {worker}: {type(e).__name__}: {e}"))
    finally:
        pipe.close()


async def _work(
    options: ReplayOptions,
    share: Share,
    pool_size: int,
    worker: int,
    pipe: Pipe,
    closed_loop: bool,
) -> session.Outcome:
    def wait_for_start() -> int:
        pipe.send(("ready", None))
        message, start_ns = pipe.recv()
        if message != "start":
            raise RuntimeError("stopped before the start")
        return int(start_ns)

    readings = session.RunnerReadings()

    def progress(runner: Runner) -> None:
        pipe.send(("progress", tuple(readings(runner))))

    return await session.run_local(
        options,
        share,
        pool_size,
        wait_for_start,
        worker=worker,
        progress=progress,
        closed_loop=closed_loop,
    )


async def run_workers(
    options: ReplayOptions,
    plan: RunPlan,
    on_reading: Callable[[Reading, int], None],
    start: Callable[[], int],
) -> tuple[list[ReplayResult], int]:
    """Run the plan over `options.workers` processes; returns merged results and the shared start."""
    count = options.workers
    context = multiprocessing.get_context("spawn")
    pipes, processes = [], []
    for worker, positions in enumerate(plan.deal(count)):
        parent, child = context.Pipe()
        size = max(1, -(-plan.pool_size // count))
        process = context.Process(
            target=_worker_main,
            args=(options, plan.share(options, positions), size, worker, child, plan.closed_loop),
            name=f"replay-worker-{worker}",
            daemon=False,  # it starts its own preparer process; stopped in the finally below
        )
        process.start()
        child.close()
        pipes.append(parent)
        processes.append(process)
    try:
        for pipe in pipes:
            await _expect(pipe, "ready", READY_TIMEOUT_S)
        start_ns = start()
        for pipe in pipes:
            pipe.send(("start", start_ns))
        results = await _collect(pipes, lambda reading: on_reading(reading, start_ns))
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
    return results, start_ns


async def _expect(pipe: Pipe, wanted: str, timeout_s: float) -> Any:
    async with asyncio.timeout(timeout_s):  # not wait_for, which can lose a cancellation on 3.11
        message, payload = await asyncio.to_thread(pipe.recv)
    if message == "error":
        raise RuntimeError(payload)
    if message != wanted:
        raise RuntimeError(f"worker said {message!r} where {wanted!r} was expected")
    return payload


async def _collect(pipes: list[Pipe], on_reading: Callable[[Reading], None]) -> list[ReplayResult]:
    """Wait for every worker's results, merging their progress readings into one meanwhile."""
    results: list[ReplayResult] = []
    latest: dict[int, Reading] = {}
    pending = dict(enumerate(pipes))
    while pending:
        await asyncio.sleep(0.2)
        for worker, pipe in list(pending.items()):
            while pending.get(worker) is not None and pipe.poll():
                message, payload = pipe.recv()
                if message == "progress":
                    fresh = Reading(*payload)
                    old = latest.get(worker)
                    if old is not None:  # not passed on yet: keep its new values
                        fresh = fresh._replace(
                            lags_ns=old.lags_ns + fresh.lags_ns, ttfts_ns=old.ttfts_ns + fresh.ttfts_ns
                        )
                    latest[worker] = fresh
                elif message == "done":
                    results.extend(payload)
                    del pending[worker]
                else:
                    raise RuntimeError(payload)
        if latest:
            on_reading(merge(list(latest.values())))
            latest = {w: r._replace(lags_ns=[], ttfts_ns=[]) for w, r in latest.items()}
    return results
