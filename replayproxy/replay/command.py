"""`replayproxy replay TRACE... --target URL -o RESULT.rpr`: options in, one run, a short summary out."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import sys
from collections.abc import Awaitable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from replayproxy import clock, config
from replayproxy.errors import BadOption, RunAborted
from replayproxy.launch import run_server
from replayproxy.replay import (
    contract,
    procedure,
    progress,
    replies,
    result_file,
    session,
    summary,
    telemetry,
    workers,
)
from replayproxy.replay.connection import Target
from replayproxy.replay.flavors import FLAVORS
from replayproxy.replay.options import PREPARE_MODES, ReplayOptions
from replayproxy.replay.preparation import RunPlan, prepare_run
from replayproxy.replay.sidecars import Sidecars
from replayproxy.results import ReplayResult

T = TypeVar("T")

EXAMPLES = (
    "replayproxy replay traces/ --target http://127.0.0.1:8000 -o vllm.rpr",
    "replayproxy replay prod.rpt --base-url http://host:8000/v1 --model my-model --request-rate 20 -o a.rpr",
    "replayproxy replay prod.rpt --target https://api.example.com --num-prompts 500 --progress log -o b.rpr",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("traces", nargs="+", metavar="TRACE", help="trace files (.rpt), directories or globs")
    add(
        "--target",
        "--base-url",
        dest="target",
        help="base URL of the engine, e.g. http://127.0.0.1:8000/v1 (default: none, required)",
    )
    add("-o", "--output", metavar="RESULT.rpr", help="result file to write (default: none, required)")
    add("--speed", type=float, help="time scale: 2 sends twice as fast (default: 1)")
    add(
        "--request-rate",
        type=float,
        metavar="R",
        help="scale the trace's timing to R req/s on average, instead of --speed (default: off)",
    )
    add(
        "--max-concurrency",
        type=int,
        metavar="N",
        help="cap requests in flight; timing is then not preserved (default: 0, no cap)",
    )
    add("--flavor", choices=["auto", *FLAVORS], help="engine dialect (default: auto, from /v1/models)")
    add("--model", help="send every request to this model (default: the recorded one, if served)")
    add(
        "--limit",
        "--num-prompts",
        dest="limit",
        type=int,
        metavar="N",
        help="replay at most N requests; whole sessions in closed loop (default: all)",
    )
    add(
        "--sessions",
        choices=["auto", "closed", "open"],
        help="closed: a session's next turn goes at the previous turn's end plus its think time; "
        "open: every request at its recorded offset (default: auto, closed if any session has 2+ turns)",
    )
    add(
        "--replies",
        choices=list(replies.MODES),
        help="live: in closed loop a later turn carries the candidate's reply to the turn before it, "
        "its new part sized to the recorded input length (needs exact prompts); planned: synthetic "
        "words where the reply stood (default: live)",
    )
    add(
        "--sample-sessions",
        type=float,
        metavar="F",
        help="replay this fraction of whole sessions, chosen by --seed (default: all)",
    )
    add("--start-offset", type=float, metavar="S", help="skip the first S seconds of the trace (default: 0)")
    add("--duration", type=float, metavar="S", help="replay only S seconds of the trace (default: all)")
    add("--seed", type=int, help="prompt synthesis seed; same seed, same bodies (default: 0)")
    add("--timeout", type=float, metavar="S", help="per-request timeout in seconds (default: 600)")
    add("--label", help="name of this run in reports (default: flavor@host)")
    add(
        "--api-key",
        metavar="KEY",
        help=config.API_KEY_HELP,
    )
    add(
        "--max-error-rate",
        type=float,
        metavar="SHARE",
        help="exit 1 when more than this share of requests failed (default: 0.5)",
    )
    add("--quiet", action="store_const", const=True, help="no progress display (--progress none)")
    add(
        "--progress",
        choices=progress.MODES,
        help="live panel (tty), a line every 10 s (log) or none (default: auto, tty on a terminal, else log)",
    )
    add("--workers", type=int, metavar="N", help="sender processes sharing one start time (default: 1)")
    add(
        "--shard",
        metavar="i/N",
        help="send shard i of N: whole sessions, with the requests linked to them, by a keyed hash; "
        "N processes or pods with one --start-at send the trace between them (default: all)",
    )
    add("--start-at", metavar="TIME", help="common start: UTC ISO time or unix seconds (default: now)")
    add(
        "--no-reset-prefix-cache",
        dest="reset_prefix_cache",
        action="store_const",
        const=False,
        help="skip the flavor's cache reset before the run",
    )
    add(
        "--no-calibrate",
        dest="calibrate",
        action="store_const",
        const=False,
        help="skip chat token calibration (lengths then assume the default template)",
    )
    add(
        "--tokenizer",
        metavar="PATH",
        help="local Hugging Face tokenizer.json (or its model directory), or a llama.cpp .gguf, for exact "
        "prompt lengths (default: the served one found on this host, else the engine's tokenize endpoint)",
    )
    add("--chat-template", metavar="FILE", help="Jinja chat template for --tokenizer (default: its own)")
    add(
        "--allow-approximate",
        action="store_const",
        const=True,
        help="go on with calibrated (approximate) prompt lengths when exact ones cannot be built; "
        "the result and the report then say the candidate is not like for like",
    )
    add(
        "--include-failed",
        action="store_const",
        const=True,
        help="also replay requests that failed when recorded (left out by default)",
    )
    add(
        "--pool-size",
        type=int,
        metavar="N",
        help="connections opened before the run (default: peak concurrency)",
    )
    add(
        "--scrape-metrics",
        nargs="?",
        const="/metrics",
        metavar="URL",
        help="poll the engine's Prometheus metrics during the run; URL: the target's /metrics (default: off)",
    )
    add(
        "--scrape-interval",
        type=float,
        metavar="S",
        help="metrics polling interval in seconds (default: 0.25)",
    )
    add(
        "--gpu-sampler",
        metavar="CMD",
        help="command printing GPU samples as CSV lines, e.g. nvidia-smi ... -lms 250 (default: none)",
    )
    add(
        "--warmup",
        metavar="N|Ss",
        help="first send the trace's first N requests (or S seconds) at their timing, not measured "
        "(default: none)",
    )
    add(
        "--repeat",
        type=int,
        metavar="K",
        help="measure K times, each after the cache reset, into RESULT-runI.rpr under one label (default: 1)",
    )
    add(
        "--engine-args",
        metavar="TEXT",
        help="how the engine was started, kept with the run's contract (default: none)",
    )
    add("--note", metavar="TEXT", help="free text kept with the run (default: none)")
    add(
        "--prepare",
        choices=PREPARE_MODES,
        help="stream: bodies are prepared by a helper process while the run goes, a window ahead of "
        "the clock; upfront: every body before the start (default: stream)",
    )
    add(
        "--prepare-window",
        type=float,
        metavar="S",
        help="seconds of the schedule whose bodies are held ready ahead of the clock (default: 20)",
    )
    add(
        "--prepare-memory",
        type=int,
        metavar="MIB",
        help="memory the ready bodies may take, per sender process (default: 512)",
    )
    add(
        "--via-proxy",
        metavar="DIR",
        help="send through a replayproxy proxy started in front of the target, which records each run's "
        "own trace in DIR/<result name>: the report then times the replay at a proxy, as production "
        "was (default: straight to the target)",
    )
    add("--config", metavar="FILE", help="TOML file; settings under [replay] (default: none)")


# Every setting but the secret can come from the command line; argparse leaves the absent ones None.
_OPTION_NAMES = tuple(
    f.name for f in dataclasses.fields(ReplayOptions) if f.name not in ("traces", "api_key")
)


def options_from_args(args: argparse.Namespace) -> ReplayOptions:
    file_values = config.read_toml(args.config).get("replay", {})
    overrides: dict[str, Any] = {name: getattr(args, name, None) for name in _OPTION_NAMES}
    overrides["traces"] = tuple(args.traces)
    overrides["api_key"] = getattr(args, "api_key", None)
    if overrides.get("request_rate") is not None and overrides.get("speed") is not None:
        raise config.ConfigError("--request-rate and --speed both set the timing; give one")
    options = config.build(ReplayOptions, section="replay", file_values=file_values, overrides=overrides)
    if not options.target:
        raise config.ConfigError("--target is required (or [replay] target in the config file)")
    if not options.output:
        raise config.ConfigError("-o/--output is required (or [replay] output in the config file)")
    if options.warmup:
        procedure.Warmup.parse(options.warmup)
    if options.repeat > 1 and options.start_at:
        raise config.ConfigError("--repeat cannot share one --start-at: each run starts after the last")
    return dataclasses.replace(options, api_key=config.api_key(options.api_key))


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    summaries = run_loop(replay(options, progress.resolve(options.progress, options.quiet, sys.stderr)))
    for facts in summaries:
        print(summary.render(facts, options.max_concurrency))
    for repetition, facts in enumerate(summaries, 1):
        failure = summary.failure(facts, options.max_error_rate)
        if failure:
            output = procedure.output_for(options.output, repetition, options.repeat)
            print(f"replayproxy replay: {failure} (results in {output})", file=sys.stderr)
            return 1
    return 0


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


async def replay(options: ReplayOptions, progress_mode: str = "none") -> list[dict[str, Any]]:
    """Prepare, warm up, then each measured run; returns the summaries written to the result footers.

    When interrupted (Ctrl-C), the results so far are written before the interruption goes on, the
    requests still in flight recorded as `client_cancel`, and no further repetition starts.
    """
    plan = await open_candidate(options)
    try:
        return [await measure(options, plan, i, progress_mode) for i in range(1, options.repeat + 1)]
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


async def measure(
    options: ReplayOptions, plan: RunPlan, repetition: int, progress_mode: str
) -> dict[str, Any]:
    """Measured run `repetition` of `options.repeat`: the cache reset, then the run into its own file."""
    plan.repetition = repetition
    plan.pre_run.update(await procedure.reset_target(options, plan))
    output = procedure.output_for(options.output, repetition, options.repeat)
    options = dataclasses.replace(options, output=output)
    if not options.via_proxy:
        return await _measure(options, plan, progress_mode, options)
    trace_dir = Path(options.via_proxy) / Path(output).stem
    options = dataclasses.replace(options, via_proxy=str(trace_dir))
    with _proxy_in_front(options.target, trace_dir) as url:
        return await _measure(options, plan, progress_mode, dataclasses.replace(options, target=url))


@contextlib.contextmanager
def _proxy_in_front(target: str, trace_dir: Path) -> Iterator[str]:
    """A proxy in front of `target` recording into `trace_dir`, as production's was, for one run: the
    replay's timings are then taken at the same point as production's. Stopped (its trace written)
    when the run ends."""
    argv = ["replayproxy", "proxy", "--upstream", Target.parse(target).url, "--listen", "127.0.0.1:0"]
    argv += ["--admin-listen", "", "--trace-dir", str(trace_dir)]
    with contextlib.ExitStack() as stack:
        try:
            proxy = stack.enter_context(run_server(argv))
        except RuntimeError as e:  # its last line says why
            raise BadOption(f"--via-proxy: the proxy did not start: {str(e).splitlines()[-1]}") from e
        yield proxy.url


async def _measure(
    options: ReplayOptions, plan: RunPlan, progress_mode: str, sending: ReplayOptions
) -> dict[str, Any]:
    """One measured run into `options.output`; `sending`: the options the senders use (their target
    is the proxy's address with --via-proxy)."""
    sidecars = Sidecars(options.metrics_url, options.scrape_interval, options.gpu_sampler)
    tracker: progress.Tracker | None = None
    try:
        scheduled = plan.schedule.scheduled_ns[plan.send].tolist()
        tracker = progress.Tracker(progress.display_for(progress_mode, "replay"), scheduled, clock.now_ns)

        def start() -> int:
            start_ns = session.start_ns_for(options)
            sidecars.start(start_ns)
            return start_ns

        outcome = session.Outcome()
        try:
            if options.workers > 1:
                await workers.run_workers(sending, plan, tracker.update, start, outcome)
            else:
                readings = session.RunnerReadings()
                show = None if tracker.display is None else lambda r: tracker.update(readings(r), r.start_ns)
                await session.run_local(
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
        return _finish(options, plan, outcome.results, outcome.start_ns, tracker, sidecars, live_replies=live)
    finally:
        sidecars.stop()  # a no-op once _finish collected them
        if tracker is not None:
            tracker.close()  # likewise; after a failure it gives the terminal back


def _save_partial(
    options: ReplayOptions,
    plan: RunPlan,
    outcome: session.Outcome,
    tracker: progress.Tracker,
    sidecars: Sidecars,
    how: str,
) -> None:
    """Write what an interrupted or aborted run received, marked partial, and say where it went."""
    if not outcome.start_ns:
        return  # stopped before the start: nothing was sent, nothing to save
    stopped_s = max(0, clock.now_ns() - outcome.start_ns) / 1e9
    live = outcome.live_replies
    _finish(options, plan, outcome.results, outcome.start_ns, tracker, sidecars, stopped_s, live)
    lost = plan.requests - len(outcome.results)
    unsent = f", {lost} of {plan.requests} planned requests not sent or lost" if lost else ""
    print(
        f"replayproxy replay: {how}; {len(outcome.results)} results in {options.output}{unsent}",
        file=sys.stderr,
    )


def _finish(
    options: ReplayOptions,
    plan: RunPlan,
    results: list[ReplayResult],
    start_ns: int,
    tracker: progress.Tracker,
    sidecars: Sidecars,
    stopped_s: float | None = None,
    live_replies: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the result file; `stopped_s` (seconds after the start) marks an interrupted, partial run;
    `live_replies` (counts of the turns built from replies) becomes a side record."""
    ttfts = [r.ttft_ns for r in results if not r.error and r.ttft_ns >= 0]
    errors = sum(1 for r in results if r.error)
    lags = [r.sent_ns - r.scheduled_ns for r in results if r.sent_ns >= 0]
    tracker.start_ns = tracker.start_ns or start_ns
    tracker.close(progress.Reading(plan.requests, len(lags), len(results), errors, lags, ttfts))
    start_wall_ns = clock.Anchor.take().to_wall(start_ns)
    extras = dict(sidecars.stop())
    after = telemetry.scrape_cache_state(options.cache_metrics_url)
    extras["prefix_cache"] = {"before": plan.pre_run.get("prefix_cache", {}), "after": after}
    if live_replies:
        extras["live_replies"] = live_replies
    return result_file.write_results(options, plan, results, start_wall_ns, extras, stopped_s)
