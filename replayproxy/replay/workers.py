"""`--workers N`: deal the schedule to N sender processes that share one start time.

One core sends a few hundred streaming requests per second within a millisecond of schedule;
beyond that, more processes rather than a silently late schedule. Workers are forked from a
server that imported their code while the run was being prepared (`start_forkserver`), so they
start in milliseconds with little to unpickle; then each is sent its `Assignment`. The one
preparer process (replay.preparer) plans the whole trace once and streams each worker its share
through a pipe, so a worker holds only its own window. A worker warms its pool, says `Ready`, receives the
absolute monotonic start (CLOCK_MONOTONIC is shared by all processes of a host), runs, and sends
its results back in `Done`; progress counters arrive once a second.

Stopping is the parent's decision: workers ignore SIGINT (a terminal sends it to the whole process
group) and stop on SIGTERM, which the parent sends when it is interrupted or a worker dies; each
stopped worker still sends the results it has, its in-flight requests marked `client_cancel`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.forkserver
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from multiprocessing.process import BaseProcess
from typing import Literal

from replayproxy import clock
from replayproxy.errors import RunAborted, UserError
from replayproxy.replay import replies, sender
from replayproxy.replay.options import ReplayOptions
from replayproxy.replay.preparation import RunPlan, Share
from replayproxy.replay.prepared import Schedule
from replayproxy.replay.progress import Reading, merge
from replayproxy.replay.runner import Runner
from replayproxy.results import ReplayResult

# forked from a server that imported this module once; spawned (importing it each) where there is none
START_METHOD: Literal["forkserver", "spawn"] = (
    "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
)
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0  # a stopped worker's last answer: cancelling, then pickling its results

log = logging.getLogger(__name__)


# The pipe protocol. Worker -> parent: Ready, then Progress readings, then Done or Failed.
# Parent -> worker: Assignment, then Start (or nothing: the parent terminates a worker it no
# longer needs).
@dataclass(frozen=True, slots=True)
class Assignment:
    """What a started worker sends: its share's schedule, and how."""

    schedule: Schedule
    pool_size: int
    closed_loop: bool = False
    live: replies.Setup | None = None


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker's pool is warm; it waits for `Start`."""


@dataclass(frozen=True, slots=True)
class Start:
    start_ns: int  # absolute monotonic start shared by all workers


@dataclass(frozen=True, slots=True)
class Progress:
    reading: Reading


@dataclass(frozen=True, slots=True)
class Done:
    results: list[ReplayResult]
    stopped: bool = False  # stopped by SIGTERM before the end: results are partial


@dataclass(frozen=True, slots=True)
class Failed:
    message: str  # one line, "worker N: Type: text"
    user_error: bool  # a UserError (the user can fix it) rather than a bug
    traceback: str = ""


ToParent = Ready | Progress | Done | Failed


class WorkerCrashed(RuntimeError):
    """A worker raised something that is not a user error: a bug, shown as one."""


def start_forkserver() -> None:
    """Start, in the background, the server that forks the workers after importing their code:
    called before the run is prepared, so that importing overlaps the preparation."""
    if START_METHOD == "forkserver":
        multiprocessing.get_context(START_METHOD).set_forkserver_preload([__name__])
        multiprocessing.forkserver.ensure_running()


def _worker_main(options: ReplayOptions, worker: int, pipe: Pipe, feed: Pipe | None) -> None:
    """Entry point of a worker process; `feed`: its pipe from the preparer."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the run stops
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # not on every platform
        factory = None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            done = runner.run(_work(options, worker, pipe, feed))
        pipe.send(done)
    except Exception as e:  # reported to the parent, which stops the run with one line
        message = f"worker {worker}: {type(e).__name__}: {e}"
        with contextlib.suppress(OSError):  # the parent may be gone already
            pipe.send(Failed(message, isinstance(e, UserError), traceback.format_exc()))
    finally:
        pipe.close()


async def _work(options: ReplayOptions, worker: int, pipe: Pipe, feed: Pipe | None) -> Done:
    assignment = pipe.recv()
    if not isinstance(assignment, Assignment):
        raise RuntimeError(f"expected an assignment, got {assignment!r}")
    share = Share(feed, assignment.schedule)
    main = asyncio.current_task()
    assert main is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)

    def wait_for_start() -> int:
        pipe.send(Ready())
        message = pipe.recv()
        if not isinstance(message, Start):
            raise RuntimeError(f"expected the start, got {message!r}")
        return message.start_ns

    readings = sender.RunnerReadings()

    def progress(runner: Runner) -> None:
        pipe.send(Progress(readings(runner)))

    outcome = sender.Outcome()
    try:
        await sender.run_local(
            options,
            share,
            assignment.pool_size,
            wait_for_start,
            worker=worker,
            progress=progress,
            outcome=outcome,
            closed_loop=assignment.closed_loop,
            live=assignment.live,
        )
    except asyncio.CancelledError:  # SIGTERM: the parent stops the run and wants what we have
        return Done(outcome.results, stopped=True)
    return Done(outcome.results)


@dataclass(slots=True)
class Crew:
    """The worker processes of one run, and what each has answered so far."""

    pipes: list[Pipe]
    processes: list[BaseProcess]
    shares: list[int]  # requests dealt to each worker
    pending: set[int] = field(default_factory=set)  # workers whose results have not arrived
    closed: set[int] = field(default_factory=set)  # workers whose pipe ended (the process is gone)
    lost: list[str] = field(default_factory=list)  # one line per worker whose results are missing

    def stop(self) -> None:
        """Ask every worker still running to stop and send what it has."""
        for worker in sorted(self.pending):
            if self.processes[worker].is_alive():
                self.processes[worker].terminate()  # SIGTERM: the worker cancels its run, answers Done

    def receive(self, worker: int) -> list[ToParent]:
        """The messages waiting on a worker's pipe; its end (the worker is gone) is noted in `closed`."""
        pipe, messages = self.pipes[worker], []
        try:
            while pipe.poll():
                messages.append(pipe.recv())
        except (EOFError, OSError):
            self.closed.add(worker)
        return messages

    def lose(self, worker: int, why: str) -> None:
        self.pending.discard(worker)
        self.lost.append(f"worker {worker} {why}: its {self.shares[worker]} requests are missing")

    def lose_if_gone(self, worker: int) -> bool:
        if worker not in self.closed or worker not in self.pending:
            return False
        self.processes[worker].join(timeout=1)
        self.lose(worker, _exit_of(self.processes[worker]))
        return True

    def close(self) -> None:
        """End every process (those still running after their answer or the wait: killed), then pipes."""
        for worker, process in enumerate(self.processes):
            if worker in self.pending and process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        for pipe in self.pipes:
            pipe.close()


async def run_workers(
    options: ReplayOptions,
    plan: RunPlan,
    on_reading: Callable[[Reading, int], None],
    start: Callable[[], int],
    outcome: sender.Outcome,
) -> None:
    """Run the plan over `options.workers` processes, merging their results into `outcome`.

    When cancelled (Ctrl-C) after the start, every worker is stopped and its results so far are
    collected into `outcome` before the cancellation goes on. When a worker dies or fails, the
    others are stopped likewise and `RunAborted` (or `WorkerCrashed` for a bug) says what was lost.
    """
    count = options.workers
    get = multiprocessing.get_context
    context = get("forkserver") if START_METHOD == "forkserver" else get("spawn")
    shares = plan.shares(options, plan.deal(count))  # one preparer job streams every worker's share
    crew = Crew([], [], [len(share.schedule.trace_index) for share in shares], set(range(count)))
    for worker, share in enumerate(shares):
        parent, child = context.Pipe()
        process = context.Process(
            target=_worker_main,
            args=(options, worker, child, share.feed),  # little to pickle: start() returns at once
            name=f"replay-worker-{worker}",
            daemon=False,  # ended in Crew.close
        )
        process.start()
        child.close()
        if share.feed is not None:
            share.feed.close()  # the worker has its own copy
        crew.pipes.append(parent)
        crew.processes.append(process)
    size = max(1, -(-plan.pool_size // count))
    readings = Readings(lambda reading: on_reading(reading, outcome.start_ns))
    try:
        for share, pipe in zip(shares, crew.pipes, strict=True):
            assignment = Assignment(share.schedule, size, plan.closed_loop, plan.live)
            with contextlib.suppress(OSError):  # a worker already gone is found out waiting for it
                await asyncio.to_thread(pipe.send, assignment)
        for worker, pipe in enumerate(crew.pipes):
            await _expect_ready(crew, worker, pipe)
        outcome.start_ns = start()
        for pipe in crew.pipes:
            pipe.send(Start(outcome.start_ns))
        failure = await _collect(crew, outcome, readings)
        if failure is not None:
            crew.stop()
            await _drain(crew, outcome)
            raise failure
    except asyncio.CancelledError:
        if outcome.start_ns:
            crew.stop()
            await _drain(crew, outcome)
        raise
    finally:
        crew.close()
    if crew.lost:
        raise RunAborted("; ".join(crew.lost))


async def _expect_ready(crew: Crew, worker: int, pipe: Pipe) -> None:
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):  # not wait_for, which can lose a cancellation on 3.11
            message = await asyncio.to_thread(pipe.recv)
    except EOFError:
        crew.processes[worker].join(timeout=1)  # its pipe ended as it exited: read how it ended
        raise RunAborted(f"worker {worker} {_exit_of(crew.processes[worker])} before it was ready") from None
    if isinstance(message, Failed):
        raise _failure(message)
    if not isinstance(message, Ready):
        raise WorkerCrashed(f"worker {worker} said {message!r} where Ready was expected")


def _failure(message: Failed) -> Exception:
    if message.user_error:
        return RunAborted(message.message)
    log.debug("%s\n%s", message.message, message.traceback)
    return WorkerCrashed(message.message)


class Readings:
    """The workers' latest progress readings not passed on yet: counts are the latest, new lags and
    TTFTs accumulate until `flush` passes them on once."""

    def __init__(self, on_reading: Callable[[Reading], None]) -> None:
        self._on_reading = on_reading
        self._latest: dict[int, Reading] = {}
        self._fresh = False

    def take(self, worker: int, reading: Reading) -> None:
        old = self._latest.get(worker)
        if old is not None:  # not passed on yet: keep its new values
            lags, ttfts = old.lags_ns + reading.lags_ns, old.ttfts_ns + reading.ttfts_ns
            reading = reading._replace(lags_ns=lags, ttfts_ns=ttfts)
        self._latest[worker] = reading
        self._fresh = True

    def flush(self) -> None:
        """Pass on the merged readings, if any arrived since the last flush."""
        if not self._fresh:
            return
        self._on_reading(merge(list(self._latest.values())))
        self._latest = {w: r._replace(lags_ns=[], ttfts_ns=[]) for w, r in self._latest.items()}
        self._fresh = False


async def _collect(crew: Crew, outcome: sender.Outcome, readings: Readings) -> Exception | None:
    """Take every worker's results into `outcome`, merging their progress readings meanwhile;
    returns the first failure instead (a worker that died or raised), for the caller to stop on.
    Whatever the workers said before a failure is passed on first: a dying worker's last reading
    counts."""
    while crew.pending:
        await asyncio.sleep(0.2)
        failure = _receive_all(crew, outcome, readings)
        readings.flush()
        if failure is not None:
            return failure
    return None


def _receive_all(crew: Crew, outcome: sender.Outcome, readings: Readings) -> Exception | None:
    """Every message waiting from the pending workers; the first failure among them, if any."""
    for worker in sorted(crew.pending):
        failed = _receive(crew, worker, outcome, readings, "failed")
        if failed is not None:
            return _failure(failed)
        if crew.lose_if_gone(worker):
            return RunAborted("; ".join(crew.lost))
    return None


def _receive(
    crew: Crew, worker: int, outcome: sender.Outcome, readings: Readings | None, failed_as: str
) -> Failed | None:
    """The messages waiting from `worker`: readings taken (unless None: dropped), results into
    `outcome`; its failure, if it sent one (it is then lost, `failed_as`)."""
    failed = None
    for message in crew.receive(worker):
        if isinstance(message, Progress):
            if readings is not None:
                readings.take(worker, message.reading)
        elif isinstance(message, Done):
            outcome.results.extend(message.results)
            crew.pending.discard(worker)
        elif isinstance(message, Failed):
            crew.lose(worker, failed_as)
            failed = message
    return failed


async def _drain(crew: Crew, outcome: sender.Outcome) -> None:
    """After `Crew.stop`: wait for the stopped workers' last results (their readings are no longer
    shown: the results say it all); count the silent ones as lost."""
    deadline = clock.now_ns() + int(STOP_TIMEOUT_S * 1e9)
    while crew.pending and clock.now_ns() < deadline:
        for worker in sorted(crew.pending):
            _receive(crew, worker, outcome, None, "failed while stopping")
            crew.lose_if_gone(worker)
        await asyncio.sleep(0.05)
    for worker in sorted(crew.pending):
        crew.lose(worker, f"did not answer within {STOP_TIMEOUT_S:g} s of the stop")
        crew.processes[worker].kill()  # nothing more is awaited from it


def _exit_of(process: BaseProcess) -> str:
    code = process.exitcode
    if code is None:
        return "stopped answering"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"
