"""Sender processes (replayproxy/replay/workers.py): a run dealt to worker processes, their results
merged back; a worker that dies or fails costs its own results only and is reported; an interrupt
stops every worker and keeps what each had. Real workers run against the simulated engine where
process life and death are the point; the parent's side of the pipe protocol is driven in-process
with scripted messages where they are not."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection as Pipe
from pathlib import Path

import pytest

from replayproxy.errors import RunAborted
from replayproxy.replay import preparation, sender, workers
from replayproxy.replay.options import ReplayOptions
from replayproxy.replay.progress import Reading
from replayproxy.results import ReplayResult
from replayproxy.shape import prefix_block_hashes
from replayproxy.sim.config import SimConfig
from replayproxy.sim.server import serving
from tests.e2e.test_replay_sessions import MS, session_shapes
from tests.replay import traces

Watch = Callable[[Reading, "asyncio.Task[None]"], None]


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four seconds of requests: long enough to stop a run in its middle."""
    path = tmp_path_factory.mktemp("workers") / "t.rpt"
    return traces.write_synthetic(
        path, requests=60, rate_rps=15.0, input_len="uniform:20,40", output_len="fixed:3"
    )


async def run(
    trace: Path, tmp_path: Path, speed: float, watch: Watch | None = None, **settings: object
) -> tuple[preparation.RunPlan, sender.Outcome, list[Reading], asyncio.CancelledError | None]:
    """A two-worker run of `trace` against an in-process sim: the plan, what was collected, the
    merged readings and its interruption, if any. `watch` sees every merged reading; `settings`:
    more of the ReplayOptions."""
    async with serving(SimConfig(port=0, speed=20.0)) as url:
        options = ReplayOptions(
            target=url, output=str(tmp_path / "r.rpr"), traces=(str(trace),), workers=2,
            flavor="vllm", calibrate=False, reset_prefix_cache=False, quiet=True, speed=speed,
            **settings,  # type: ignore[arg-type]
        )  # fmt: skip
        plan = await preparation.prepare_run(options)
        outcome = sender.Outcome()
        readings: list[Reading] = []

        def on_reading(reading: Reading, start_ns: int) -> None:
            assert start_ns == outcome.start_ns > 0
            readings.append(reading)
            if watch is not None:
                watch(reading, task)

        start = lambda: sender.start_ns_for(options)  # noqa: E731
        task = asyncio.ensure_future(workers.run_workers(options, plan, on_reading, start, outcome))
        ended: asyncio.CancelledError | None = None
        try:
            await task
        except asyncio.CancelledError as e:
            ended = e
        finally:
            plan.close()  # the preparer process
    return plan, outcome, readings, ended


def live_workers() -> list[str]:
    return [p.name for p in multiprocessing.active_children() if p.name.startswith("replay-worker")]


@pytest.mark.slow
def test_each_worker_sends_its_deal_and_every_result_comes_back(long_trace: Path, tmp_path: Path) -> None:
    plan, outcome, readings, ended = asyncio.run(run(long_trace, tmp_path, speed=4.0))  # a second of schedule
    assert ended is None
    dealt = plan.deal(2)
    by_worker = {w: sorted(r.index for r in outcome.results if r.worker == w) for w in (0, 1)}
    assert by_worker == {w: sorted(plan.schedule.trace_index[dealt[w]].tolist()) for w in (0, 1)}
    assert len(outcome.results) == plan.requests == 60
    assert all(r.error == "" for r in outcome.results)
    assert readings and readings[-1].total == 60  # both workers' counters, summed
    assert sum(len(r.lags_ns) for r in readings) <= 60  # each lag passed on once at most
    assert not live_workers()


@pytest.mark.slow
def test_an_interrupt_stops_every_worker_and_keeps_what_each_had(long_trace: Path, tmp_path: Path) -> None:
    def interrupt_midway(reading: Reading, task: asyncio.Task[None]) -> None:
        if reading.done >= 10:
            task.cancel()  # what Ctrl-C does to the replay command's task

    plan, outcome, _, ended = asyncio.run(run(long_trace, tmp_path, speed=1.0, watch=interrupt_midway))
    assert isinstance(ended, asyncio.CancelledError)  # the interruption goes on once results are in
    indices = [r.index for r in outcome.results]
    assert 10 <= len(indices) < 60 and len(set(indices)) == len(indices)
    assert {r.worker for r in outcome.results} == {0, 1}  # both stopped workers answered
    assert {r.error for r in outcome.results} <= {"", "client_cancel"}  # in flight at the stop: cancelled
    assert not live_workers()


@pytest.fixture(scope="module")
def edited_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three-turn sessions, and for every other one a request that extends its second turn with an
    edited reply (a new session to the proxy): closed loop links each to that turn as it is planned."""
    shapes = session_shapes(sessions=8, turns=3)
    followers = []
    for s in range(0, 8, 2):
        second = next(shape for shape in shapes if shape.session == 1000 + s and shape.turn == 1)
        base = s * 10_000
        edited, new = range(500_000 + s * 100, 500_012 + s * 100), range(600_000 + s * 100, 600_020 + s * 100)
        units = [*range(base, base + 128), *edited, *new]  # its prompt, the edited reply, a new message
        followers.append(second._replace(
            offset_ns=second.offset_ns + 80 * MS, session=0, turn=0, think_ns=-1, roles="suauau",
            input_tokens=len(units), prefix_hashes=prefix_block_hashes(units, 16, b"k"),
            prefix_units=len(units),
        ))  # fmt: skip
    path = tmp_path_factory.mktemp("workers") / "edited.rpt"
    return traces.write(path, sorted([*shapes, *followers], key=lambda shape: shape.offset_ns))


def follower_links(results: list[ReplayResult]) -> dict[int, tuple[int, int]]:
    """Each edited-reply follower (no session of its own) -> (the turn it waited for, how long
    after that turn's end it was sent, ns)."""
    by_index = {r.index: r for r in results}
    out = {}
    for r in results:
        if r.session == 0:
            leader = by_index[r.after] if r.after >= 0 else None
            out[r.index] = (r.after, r.sent_ns - (leader.sent_ns + leader.e2e_ns) if leader else -1)
    return out


@pytest.mark.slow
def test_an_edited_reply_continuation_waits_for_its_turn_whichever_worker_was_dealt_it(
    edited_trace: Path, tmp_path: Path
) -> None:
    """The planner links it to a turn as it is planned, after the deal: when another worker sends
    that turn, the request moves there and waits for that turn's end, as with one sender."""
    plan, outcome, _, ended = asyncio.run(
        run(edited_trace, tmp_path, 1.0, sessions="closed", replies="planned")
    )
    assert ended is None and all(r.error == "" for r in outcome.results)
    assert len(outcome.results) == plan.requests == 8 * 3 + 4
    links = follower_links(outcome.results)
    assert len(links) == 4
    worker_of = {r.index: r.worker for r in outcome.results}
    dealt = {
        int(plan.schedule.trace_index[p]): w for w, share in enumerate(plan.deal(2)) for p in share.tolist()
    }
    assert any(dealt[index] != dealt[after] for index, (after, _) in links.items())  # some had to move
    for index, (after, waited_ns) in links.items():
        assert after >= 0 and waited_ns >= 0  # sent after the end of the turn it extends
        assert worker_of[index] == worker_of[after]
    alone = asyncio.run(alone_run(edited_trace, tmp_path))
    assert {i: a for i, (a, _) in links.items()} == {i: a for i, (a, _) in follower_links(alone).items()}


async def alone_run(trace: Path, tmp_path: Path) -> list[ReplayResult]:
    """The same closed-loop run from one sender."""
    async with serving(SimConfig(port=0, speed=20.0)) as url:
        options = ReplayOptions(
            target=url, output=str(tmp_path / "one.rpr"), traces=(str(trace),), flavor="vllm",
            calibrate=False, reset_prefix_cache=False, quiet=True, sessions="closed", replies="planned",
        )  # fmt: skip
        plan = await preparation.prepare_run(options)
        try:
            outcome = await sender.run_local(
                options, plan.share(options, plan.send), plan.pool_size, sender.start_ns_for(options),
                closed_loop=plan.closed_loop,
            )  # fmt: skip
        finally:
            plan.close()
    return outcome.results


# The parent's side of the protocol, against scripted workers: forked children (or, where the
# process does not matter, the test itself at the pipe's other end) sending the typed messages.

RESULTS = [ReplayResult(index=i, scheduled_ns=i, sent_ns=i, worker=1) for i in range(5)]


def scripted(pipe: Pipe, script: str) -> None:
    """A worker: Ready, the start, one reading, then `script`: finish, die, fail, or wait for the
    stop (SIGTERM) and answer with part of its results, or ignore the stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if script == "stop-ignored":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken by sigwait below
    if script == "exit-early":
        os._exit(3)
    pipe.send(workers.Ready())
    assert isinstance(pipe.recv(), workers.Start)
    pipe.send(workers.Progress(Reading(total=5, sent=2, done=1, errors=0, lags_ns=[7], ttfts_ns=[9])))
    if script == "finish":
        pipe.send(workers.Done(RESULTS))
    elif script == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    elif script in ("user-error", "bug"):
        pipe.send(workers.Failed("worker 1: ValueError: bad", script == "user-error", "Traceback: here"))
    elif script == "stop-ignored":
        time.sleep(60)
    else:
        signal.sigwait({signal.SIGTERM})
        pipe.send(workers.Done(RESULTS[:2], stopped=True))
    pipe.close()


@contextlib.contextmanager
def crew_of(*scripts: str) -> Iterator[workers.Crew]:
    """Forked scripted workers (started in milliseconds: nothing to import), always ended."""
    context = multiprocessing.get_context("fork")
    crew = workers.Crew([], [], [len(RESULTS)] * len(scripts), set(range(len(scripts))))
    for number, script in enumerate(scripts):
        parent, child = context.Pipe()
        process = context.Process(target=scripted, args=(child, script), name=f"scripted-worker-{number}")
        process.start()
        child.close()
        crew.pipes.append(parent)
        crew.processes.append(process)
    try:
        yield crew
    finally:
        crew.close()


async def collect(crew: workers.Crew, outcome: sender.Outcome, readings: list[Reading]) -> Exception | None:
    """Ready, start, collect; on a failure stop the rest and drain them (the run's own order)."""
    for worker, pipe in enumerate(crew.pipes):
        await workers._expect_ready(crew, worker, pipe)
    for pipe in crew.pipes:
        pipe.send(workers.Start(1))
    passed_on = workers.Readings(readings.append)
    failure = await workers._collect(crew, outcome, passed_on)
    if failure is not None:
        crew.stop()
        await workers._drain(crew, outcome)
    return failure


def test_a_dead_worker_costs_its_own_share_and_the_stopped_ones_answer() -> None:
    outcome = sender.Outcome()
    readings: list[Reading] = []
    with crew_of("wait-for-stop", "die") as crew:
        failure = asyncio.run(collect(crew, outcome, readings))
    assert isinstance(failure, RunAborted)
    assert str(failure) == "worker 1 was killed by SIGKILL: its 5 requests are missing"
    assert crew.lost == [str(failure)] and not crew.pending
    assert outcome.results == RESULTS[:2]  # the survivor's results, sent when it was stopped
    assert not [p for p in crew.processes if p.is_alive()]
    # the reading the dead worker sent just before it died is passed on, next to the survivor's
    assert readings and (readings[-1].total, readings[-1].sent, readings[-1].done) == (10, 4, 2)
    assert sum(len(r.lags_ns) for r in readings) == 2 and sum(len(r.ttfts_ns) for r in readings) == 2


@pytest.mark.parametrize(("script", "error"), [("user-error", RunAborted), ("bug", workers.WorkerCrashed)])
def test_a_worker_that_fails_stops_the_run_with_its_one_line(
    script: str, error: type[Exception], caplog: pytest.LogCaptureFixture
) -> None:
    outcome: sender.Outcome = sender.Outcome()
    with caplog.at_level(logging.DEBUG, logger=workers.__name__), crew_of("wait-for-stop", script) as crew:
        failure = asyncio.run(collect(crew, outcome, []))
    assert type(failure) is error and str(failure) == "worker 1: ValueError: bad"
    assert crew.lost == ["worker 1 failed: its 5 requests are missing"]
    assert outcome.results == RESULTS[:2]
    assert ("Traceback: here" in caplog.text) is (script == "bug")  # a bug's traceback, for -v


def test_a_worker_gone_before_it_is_ready_is_named_with_its_exit() -> None:
    with (
        crew_of("exit-early") as crew,
        pytest.raises(RunAborted, match="worker 0 exited with status 3 before it"),
    ):
        asyncio.run(workers._expect_ready(crew, 0, crew.pipes[0]))


def test_a_worker_that_ignores_the_stop_is_counted_lost_and_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "STOP_TIMEOUT_S", 0.5)
    outcome = sender.Outcome()
    with crew_of("stop-ignored", "die") as crew:
        asyncio.run(collect(crew, outcome, []))
        ignoring = crew.processes[0]
    assert crew.lost[1] == "worker 0 did not answer within 0.5 s of the stop: its 5 requests are missing"
    assert not outcome.results and ignoring.exitcode == -signal.SIGKILL


class Exited:
    """A worker process that has already ended (what Crew reads of one)."""

    exitcode = 0

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        pass


def test_readings_merge_across_workers_and_none_is_lost_between_polls() -> None:
    """Two readings from one worker between polls: counts are the latest, new lags are all kept."""
    ends = [multiprocessing.Pipe() for _ in range(2)]
    crew = workers.Crew([parent for parent, _ in ends], [Exited(), Exited()], [3, 2], {0, 1})  # type: ignore[list-item]
    first, second = ends[0][1], ends[1][1]
    first.send(workers.Progress(Reading(total=3, sent=1, done=0, errors=0, lags_ns=[1], ttfts_ns=[])))
    first.send(workers.Progress(Reading(total=3, sent=3, done=2, errors=1, lags_ns=[2, 3], ttfts_ns=[4])))
    second.send(workers.Progress(Reading(total=2, sent=2, done=2, errors=0, lags_ns=[5], ttfts_ns=[6])))
    first.send(workers.Done(RESULTS[:3]))
    second.send(workers.Done(RESULTS[3:]))
    readings: list[Reading] = []
    outcome = sender.Outcome()
    assert asyncio.run(workers._collect(crew, outcome, workers.Readings(readings.append))) is None
    assert outcome.results == RESULTS and not crew.pending and not crew.lost
    merged = readings[0]
    assert (merged.total, merged.sent, merged.done, merged.errors) == (5, 5, 4, 1)
    assert sorted(merged.lags_ns) == [1, 2, 3, 5] and sorted(merged.ttfts_ns) == [4, 6]
    crew.close()
