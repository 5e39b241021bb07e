"""One replay of one candidate, what `replayproxy replay` and `compare` run: prepare, warm up, then
each measured run into its result file, partial results written when it is interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from replayproxy import clock
from replayproxy.errors import BadOption, RunAborted
from replayproxy.replay import (
    clock_offset,
    contract,
    procedure,
    progress,
    replies,
    result_file,
    sender,
    telemetry,
    workers,
)
from replayproxy.replay.connection import Target
from replayproxy.replay.options import ReplayOptions, parse_start_at
from replayproxy.replay.preparation import RunPlan, prepare_run
from replayproxy.replay.sidecars import Sidecars
from replayproxy.replay.summary import Summary

T = TypeVar("T")


def run_loop(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` on uvloop where there is one; SIGTERM ends it as Ctrl-C does."""
    try:
        import uvloop
    except ImportError:  # not on every platform
        factory = None
    else:
        factory = uvloop.new_event_loop
    terminated: list[bool] = []
    with asyncio.Runner(loop_factory=factory) as runner:
        try:
            return runner.run(_stopped_by_sigterm(work, terminated))
        except asyncio.CancelledError:
            if terminated:  # ended like Ctrl-C: the results so far were written
                raise KeyboardInterrupt from None
            raise


async def _stopped_by_sigterm(work: Awaitable[T], terminated: list[bool]) -> T:
    """`work`, which SIGTERM stops as Ctrl-C does (a service manager, a Kubernetes Job, a script
    whose background job ignores SIGINT, as a shell without job control starts it)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def stop() -> None:
        terminated.append(True)
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, stop)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def replay(
    options: ReplayOptions, progress_mode: progress.Shown = "none", front: Front | None = None
) -> list[Summary]:
    """Prepare, warm up, then each measured run; returns the summaries written to the result footers.

    When interrupted (Ctrl-C), the results so far are written before the interruption goes on, the
    requests still in flight recorded as `client_cancel`, and no further repetition starts.
    """
    plan = await open_candidate(options)
    try:
        return [await measure(options, plan, i, progress_mode, front) for i in range(1, options.repeat + 1)]
    finally:
        plan.close()


async def open_candidate(options: ReplayOptions) -> RunPlan:
    """Everything before the first measured run of one target: the plan, the contract, the warm-up.
    The caller closes the plan (`compare` holds one per candidate while it interleaves their runs)."""
    if options.workers > 1:
        workers.start_forkserver()
    plan = await prepare_run(options)
    try:
        url = Target.parse(options.target).url
        plan.contract = await contract.collect(
            url, plan.info.models, options.headers, options.engine_args, options.note
        )
        if options.metrics_url and (
            problem := await asyncio.to_thread(telemetry.metrics_problem, options.metrics_url)
        ):
            raise BadOption(f"--scrape-metrics: {problem} (or leave --scrape-metrics out)")
        if options.warmup:
            plan.warmup = await procedure.warm_up(options, plan)
    except BaseException:
        plan.close()
        raise
    return plan


# Starts a proxy in front of a target URL recording into a directory, for one run (`--via-proxy`),
# and gives its address: glue's to supply (launch.proxy_in_front), as a library starts no command.
Front = Callable[[str, Path], contextlib.AbstractContextManager[str]]


async def measure(
    options: ReplayOptions,
    plan: RunPlan,
    repetition: int,
    progress_mode: progress.Shown,
    front: Front | None = None,
) -> Summary:
    """Measured run `repetition` of `options.repeat`: the cache reset, then the run into its own file."""
    plan.repetition = repetition
    plan.pre_run.update(await procedure.reset_target(options, plan))
    output = procedure.output_for(options.output, repetition, options.repeat)
    options = dataclasses.replace(options, output=output)
    if not options.via_proxy:
        return await _measure(options, plan, progress_mode, options)
    if front is None:
        raise BadOption("--via-proxy needs a proxy to start, which this command does not do")
    trace_dir = Path(options.via_proxy) / Path(output).stem
    options = dataclasses.replace(options, via_proxy=str(trace_dir))
    with front(Target.parse(options.target).url, trace_dir) as url:
        return await _measure(options, plan, progress_mode, dataclasses.replace(options, target=url))


async def _measure(
    options: ReplayOptions, plan: RunPlan, progress_mode: progress.Shown, sending: ReplayOptions
) -> Summary:
    """One measured run into `options.output`; `sending`: the options the senders use (their target
    is the proxy's address with --via-proxy)."""
    sidecars = Sidecars(options.metrics_url, options.scrape_interval, options.gpu_sampler)
    tracker: progress.Tracker | None = None
    try:
        scheduled = plan.schedule.scheduled_ns[plan.send].tolist()
        tracker = progress.Tracker(progress.display_for(progress_mode, "replay"), scheduled, clock.now_ns)

        outcome = sender.Outcome()

        def start() -> int:
            outcome.ready_ns = clock.now_ns()
            start_ns = sender.start_ns_for(options)
            sidecars.start(start_ns)
            return start_ns

        try:
            if options.workers > 1:
                await workers.run_workers(sending, plan, tracker.update, start, outcome)
            else:
                readings = sender.RunnerReadings()
                show = None if tracker.display is None else lambda r: tracker.update(readings(r), r.start_ns)
                await sender.run_local(
                    sending,
                    plan.share(sending, plan.send),
                    plan.pool_size,
                    start,
                    progress=show,
                    outcome=outcome,
                    closed_loop=plan.closed_loop,
                    live=plan.live,
                )
        except asyncio.CancelledError:
            _save_partial(options, plan, outcome, tracker, sidecars, "interrupted")
            raise
        except (RunAborted, workers.WorkerCrashed):  # a worker died or failed: the others were stopped
            _save_partial(options, plan, outcome, tracker, sidecars, "stopped early")
            raise
        live = outcome.live_replies
        return _finish(options, plan, outcome, tracker, sidecars, live_replies=live)
    finally:
        sidecars.stop()  # a no-op once _finish collected them
        if tracker is not None:
            tracker.close()  # likewise; after a failure it gives the terminal back


def _save_partial(
    options: ReplayOptions,
    plan: RunPlan,
    outcome: sender.Outcome,
    tracker: progress.Tracker,
    sidecars: Sidecars,
    how: str,
) -> None:
    """Write what an interrupted or aborted run received, marked partial, and say where it went."""
    if not outcome.start_ns:
        return  # stopped before the start: nothing was sent, nothing to save
    stopped_s = max(0, clock.now_ns() - outcome.start_ns) / 1e9
    live = outcome.live_replies
    _finish(options, plan, outcome, tracker, sidecars, stopped_s, live)
    lost = plan.requests - len(outcome.results)
    unsent = f", {lost} of {plan.requests} planned requests not sent or lost" if lost else ""
    print(
        f"replayproxy replay: {how}; {len(outcome.results)} results in {options.output}{unsent}",
        file=sys.stderr,
    )


def _finish(
    options: ReplayOptions,
    plan: RunPlan,
    outcome: sender.Outcome,
    tracker: progress.Tracker,
    sidecars: Sidecars,
    stopped_s: float | None = None,
    live_replies: replies.LiveReplies | None = None,
) -> Summary:
    """Write the result file; `stopped_s` (seconds after the start) marks an interrupted, partial run;
    `live_replies` (counts of the turns built from replies) becomes a side record."""
    results, start_ns = outcome.results, outcome.start_ns
    ttfts = [r.ttft_ns for r in results if not r.error and r.ttft_ns >= 0]
    errors = sum(1 for r in results if r.error)
    lags = [r.sent_ns - r.scheduled_ns for r in results if r.sent_ns >= 0]
    tracker.start_ns = tracker.start_ns or start_ns
    tracker.close(progress.Reading(plan.requests, len(lags), len(results), errors, lags, ttfts))
    end = clock.Anchor.take()
    start_wall_ns = end.to_wall(start_ns)
    start_at = parse_start_at(options.start_at) if options.start_at else 0
    clocks = clock_offset.record(start_at, start_ns, outcome.ready_ns, end, plan.clock_reference)
    extras = dict(sidecars.stop())
    after = telemetry.scrape_cache_state(options.cache_metrics_url)
    extras["prefix_cache"] = {"before": plan.pre_run.get("prefix_cache", {}), "after": after}
    if live_replies:
        extras["live_replies"] = live_replies
    return result_file.write_results(options, plan, results, start_wall_ns, extras, stopped_s, clocks)
