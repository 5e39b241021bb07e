"""Streaming preparation: the preparer process plans the trace once and sends each sender the same
bytes as preparing up front; the window holds only what its horizon and byte limit allow."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from replayproxy.replay import feed, flavors, plan, synth, window
from replayproxy.replay.connection import Target
from replayproxy.replay.prepared import Prepared, Schedule
from replayproxy.replay.preparer import Preparer
from replayproxy.shape import RequestShape, prefix_block_hashes
from replayproxy.sim import tokenizer
from replayproxy.trace import load
from tests.e2e.test_replay_sessions import MS, session_shapes
from tests.replay import traces

OPTIONS = plan.PlanOptions(
    seed=7, chat_template=synth.Template(tokenizer.CHAT_FIXED_OVERHEAD, tokenizer.CHAT_PER_MESSAGE_OVERHEAD)
)
TARGET = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def chat_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return traces.prefix_heavy(
        tmp_path_factory.mktemp("feed") / "chat.rpt", "chat", requests=240, rate_rps=100.0, sessions_share=0.5
    )


@pytest.fixture(scope="module")
def session_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Multi-turn sessions, and a request that extends one session's second turn with an edited
    reply (a new session to the proxy), which closed loop links to that turn as it is planned."""
    shapes = session_shapes(sessions=12, turns=3)
    second = next(s for s in shapes if s.session == 1000 and s.turn == 1)
    units = [*range(128), *range(500_000, 500_012), *range(600_000, 600_020)]  # its prompt, edited, new
    edited = second._replace(
        offset_ns=second.offset_ns + 80 * MS, session=0, turn=0, think_ns=-1, roles="suauau",
        input_tokens=len(units), prefix_hashes=prefix_block_hashes(units, 16, b"k"), prefix_units=len(units),
    )  # fmt: skip
    path = tmp_path_factory.mktemp("feed") / "sessions.rpt"
    return traces.write(path, sorted([*shapes, edited], key=lambda s: s.offset_ns))


@pytest.fixture(scope="module")
def preparer(chat_trace: Path) -> Iterator[Preparer]:
    started = Preparer((str(chat_trace),))
    try:
        yield started
    finally:
        started.close()


def whole_schedule(path: Path) -> Schedule:
    cols = load(path)
    return plan.schedule(cols, np.arange(len(cols)), OPTIONS.speed)


def upfront(path: Path, flavor: str = "vllm", options: plan.PlanOptions = OPTIONS) -> list[Prepared]:
    cols = load(path)
    return plan.prepare(cols, np.arange(len(cols)), flavors.get(flavor), options)


def upfront_wires(path: Path, flavor: str = "vllm", options: plan.PlanOptions = OPTIONS) -> list[bytes]:
    target = Target.parse(TARGET)
    headers = {"Accept": "text/event-stream"}
    return [target.request_bytes("POST", p.path, p.body, headers) for p in upfront(path, flavor, options)]


def windows_for(
    preparer: Preparer,
    schedule: Schedule,
    shares: Sequence[np.ndarray],
    flavor: str = "vllm",
    options: plan.PlanOptions = OPTIONS,
    **limits: int,
) -> list[window.Window]:
    pipes = preparer.deal(schedule, shares, flavors.get(flavor), options, TARGET, {})
    return [
        window.Window(schedule.take(positions), feed.FeedReader(pipe), **limits)
        for positions, pipe in zip(shares, pipes, strict=True)
    ]


def received(windows: list[window.Window]) -> list[list[tuple[Prepared, bytes]]]:
    """Every window filled side by side (the preparer writes to them in turn), then emptied."""

    async def fill_all() -> None:
        async with asyncio.timeout(60):
            await asyncio.gather(*(window.fill(held) for held in windows))

    try:
        asyncio.run(fill_all())
        return [[held.take(position) for position in range(held.total)] for held in windows]
    finally:
        for held in windows:
            held.close()


@pytest.mark.parametrize("flavor", ["vllm", "openai"])
def test_streamed_bodies_are_byte_identical_to_bodies_prepared_up_front(
    chat_trace: Path, preparer: Preparer, flavor: str
) -> None:
    expected = upfront_wires(chat_trace, flavor)
    schedule = whole_schedule(chat_trace)
    [got] = received(windows_for(preparer, schedule, [np.arange(len(expected))], flavor))
    assert [wire for _, wire in got] == expected
    assert [p.index for p, _ in got] == list(range(len(expected)))
    assert all(p.body == b"" for p, _ in got)  # the body travels once, inside the wire bytes


@pytest.mark.parametrize("live", [False, True], ids=["planned replies", "live replies"])
def test_closed_loop_streams_the_bytes_and_links_prepared_up_front(session_trace: Path, live: bool) -> None:
    """Closed loop's rewrites (ids asked for, live sharing, an edited-reply follower linked to the
    turn it extends) are made while planning, so a streamed run gets what preparing up front gives."""
    options = replace(OPTIONS, closed_loop=True, live_replies=live)
    expected = upfront(session_trace, options=options)
    wires = upfront_wires(session_trace, options=options)
    preparer = Preparer((str(session_trace),))
    try:
        schedule = whole_schedule(session_trace)
        [held] = windows_for(preparer, schedule, [np.arange(len(expected))], options=options)
        [got] = received([held])
        relinked = list(held.relinked)
    finally:
        preparer.close()
    assert [wire for _, wire in got] == wires
    assert [replace(p, body=b"") for p, _ in got] == [replace(p, body=b"") for p in expected]
    follower = next(p for p in expected if p.session == 0)
    assert follower.after >= 0 and relinked == [follower.index]  # the schedule did not know it
    asks = [b'"return_token_ids":true' in wire for wire in wires]
    assert any(asks) == live
    if not live:  # planned replies change no body
        assert wires == upfront_wires(session_trace)


def test_senders_dealt_from_one_plan_get_the_bytes_the_whole_plan_gives_them(
    chat_trace: Path, preparer: Preparer
) -> None:
    """The trace is planned once for every sender: each share (prefix donors in other shares, or
    sent by nobody) comes out as in the whole plan, and a second job (the next run) again."""
    expected = upfront_wires(chat_trace)
    schedule = whole_schedule(chat_trace)
    send = np.arange(1, len(expected), 3)  # the others are only planned
    shares = [send[sender::3] for sender in range(3)]
    for _ in range(2):
        got = received(windows_for(preparer, schedule, shares))
        for positions, entries in zip(shares, got, strict=True):
            assert [wire for _, wire in entries] == [expected[i] for i in positions.tolist()]


def test_a_sender_that_stops_reading_ends_its_job_not_the_preparer(tmp_path: Path) -> None:
    shapes = [RequestShape(i * 10_000_000, "completions", "m", True, 20_000, 2) for i in range(60)]
    big = traces.write(tmp_path / "big.rpt", shapes)  # ~110 KB of token ids a body: more than a pipe holds
    expected = upfront_wires(big)
    schedule = whole_schedule(big)
    everything = np.arange(len(expected))
    preparer = Preparer((str(big),))
    try:
        [abandoned] = windows_for(preparer, schedule, [everything], max_bytes=1)
        asyncio.run(window.fill(abandoned, until_ns=0))
        abandoned.close()  # an interrupted run, while the preparer waits to write the rest
        [got] = received(windows_for(preparer, schedule, [everything]))
    finally:
        preparer.close()
    assert [wire for _, wire in got] == expected


def test_the_window_stops_reading_at_its_horizon_and_byte_limit(chat_trace: Path, preparer: Preparer) -> None:
    schedule = whole_schedule(chat_trace)
    [held] = windows_for(
        preparer, schedule, [np.arange(len(schedule.trace_index))], horizon_ns=500_000_000, max_bytes=1 << 30
    )

    async def main() -> None:
        await window.fill(held, until_ns=0)
        while held.needs_reading(0):
            if not held.read():
                await asyncio.sleep(0.01)

    try:
        asyncio.run(main())
        assert 0 < held.received < held.total
        # everything due within the horizon is in; past it, at most the last batch read
        due = int(np.searchsorted(schedule.scheduled_ns, 500_000_000, side="right"))
        assert due <= held.received <= due + feed.BATCH_REQUESTS
        # reading starts again only when less than REFILL_AT of the horizon is left covered
        next_due = int(schedule.scheduled_ns[held.received])
        assert not held.needs_reading(next_due - 400_000_000)
        assert held.needs_reading(next_due - int(500_000_000 * window.REFILL_AT))
        held.max_bytes = held.held_bytes  # full by bytes: no more reading, whatever the horizon
        assert not held.needs_reading(10**12)
        held.want(held.received)  # ...unless a request due now is missing
        assert held.needs_reading(0)
    finally:
        held.close()


def test_a_preparer_that_dies_is_an_error_not_a_hang(chat_trace: Path) -> None:
    broken = Preparer(("/nonexistent/trace.rpt",))
    try:
        schedule = whole_schedule(chat_trace).take(np.arange(5))
        [held] = windows_for(broken, schedule, [np.arange(5)])
        with pytest.raises(RuntimeError, match="preparation stopped early"):
            received([held])
    finally:
        broken.close()


def test_a_sender_gets_what_was_planned_for_it_while_another_sender_is_not_reading(tmp_path: Path) -> None:
    """The preparer never waits on one sender's full pipe while another's planned request sits in
    a batch it has not written: that sender would wait for it, as long as the other does not read."""
    shapes = [RequestShape(i * 10_000_000, "completions", "m", True, 20_000, 2) for i in range(60)]
    big = traces.write(tmp_path / "big.rpt", shapes)  # ~110 KB a body: a pipe holds a few
    expected = upfront_wires(big)
    schedule = whole_schedule(big)
    sparse = np.array([2, 59])  # one early request, and its next one at the end of the plan
    busy = np.setdiff1d(np.arange(len(expected)), sparse)
    preparer = Preparer((str(big),))

    async def first_of(held: window.Window) -> None:
        async with asyncio.timeout(20):
            await window.fill(held, until_ns=0)

    try:
        idle, wanting = windows_for(preparer, schedule, [busy, sparse])
        try:
            asyncio.run(first_of(wanting))  # while `idle` reads nothing
            assert wanting.received >= 1 and wanting.take(0)[1] == expected[2]
        finally:
            idle.close()
            wanting.close()
    finally:
        preparer.close()


def test_requests_moved_to_a_sender_each_get_a_place_past_its_schedule(chat_trace: Path) -> None:
    """A sender's own schedule, plus requests moved to it as they are planned (edited-reply
    continuations of its turns), minus its requests moved away: each counted once, none lost."""
    schedule = whole_schedule(chat_trace).take(np.arange(3))
    expected = upfront(chat_trace)
    reading, writing = multiprocessing.Pipe(duplex=False)
    held = window.Window(schedule, feed.FeedReader(reading))
    try:
        own, moved_away, *_ = expected[:2]
        writing.send_bytes(feed.encode([(own, b"own"), (expected[5], b"joined", feed.JOINED)]))
        assert held.read() and held.joined == [3] and held.to_send == 4
        held.joined.clear()  # the runner took them in
        writing.send_bytes(feed.encode([(moved_away, b"", feed.MOVED), (expected[6], b"again", feed.JOINED)]))
        writing.send_bytes(feed.encode([(expected[2], b"last")]))
        writing.send_bytes(b"")
        while not held.complete:
            held.read()
        assert held.joined == [4] and held.moved == [1] and held.to_send == 4
        assert [held.take(p)[1] for p in (0, 2, 3, 4)] == [b"own", b"last", b"joined", b"again"]
        assert not held.has(1) and not held.missing(1)  # arrived, but another sender sends it
    finally:
        held.close()
        writing.close()
