"""Streaming preparation: the preparer process sends the same bytes as preparing up front, and the
window holds only what its horizon and byte limit allow."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from replayproxy.replay import feed, flavors, plan, synth, window
from replayproxy.replay.connection import Target
from replayproxy.shape import prefix_block_hashes
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


def spec(
    path: Path, send: np.ndarray, flavor: str = "vllm", options: plan.PlanOptions = OPTIONS
) -> feed.FeedSpec:
    cols = load(path)
    return feed.FeedSpec((str(path),), np.arange(len(cols)), send, flavors.get(flavor), options, TARGET)


def upfront(path: Path, flavor: str = "vllm", options: plan.PlanOptions = OPTIONS) -> list[plan.Prepared]:
    cols = load(path)
    return plan.prepare(cols, np.arange(len(cols)), flavors.get(flavor), options)


def upfront_wires(path: Path, flavor: str = "vllm", options: plan.PlanOptions = OPTIONS) -> list[bytes]:
    target = Target.parse(TARGET)
    headers = {"Accept": "text/event-stream"}
    return [target.request_bytes("POST", p.path, p.body, headers) for p in upfront(path, flavor, options)]


async def streamed(the_spec: feed.FeedSpec, **limits: int) -> window.Window:
    cols = load(the_spec.traces)
    schedule = plan.schedule(cols, the_spec.rows, the_spec.options.speed).take(the_spec.send)
    held = window.Window(schedule, feed.FeedReader(the_spec), **limits)
    await window.fill(held)
    return held


@pytest.mark.parametrize("flavor", ["vllm", "openai"])
def test_streamed_bodies_are_byte_identical_to_bodies_prepared_up_front(
    chat_trace: Path, flavor: str
) -> None:
    expected = upfront_wires(chat_trace, flavor)
    held = asyncio.run(streamed(spec(chat_trace, np.arange(len(expected)), flavor)))
    try:
        got = [held.take(position) for position in range(held.total)]
    finally:
        held.close()
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
    held = asyncio.run(streamed(spec(session_trace, np.arange(len(expected)), options=options)))
    try:
        got = [held.take(position) for position in range(held.total)]
        relinked = list(held.relinked)
    finally:
        held.close()
    assert [wire for _, wire in got] == wires
    assert [replace(p, body=b"") for p, _ in got] == [replace(p, body=b"") for p in expected]
    follower = next(p for p in expected if p.session == 0)
    assert follower.after >= 0 and relinked == [follower.index]  # the schedule did not know it
    asks = [b'"return_token_ids":true' in wire for wire in wires]
    assert any(asks) == live
    open_loop = upfront_wires(session_trace)
    if not live:  # planned replies change no body
        assert wires == open_loop


def test_a_share_gets_the_bytes_the_whole_plan_gives_those_requests(chat_trace: Path) -> None:
    """A worker's preparer plans every request (prefix donors of other shares included) but
    serializes only its own, which come out as in the whole plan."""
    expected = upfront_wires(chat_trace)
    send = np.arange(1, len(expected), 3)
    held = asyncio.run(streamed(spec(chat_trace, send)))
    try:
        got = [held.take(position)[1] for position in range(held.total)]
    finally:
        held.close()
    assert got == [expected[i] for i in send.tolist()]


def test_the_window_stops_reading_at_its_horizon_and_byte_limit(chat_trace: Path) -> None:
    cols = load(chat_trace)
    the_spec = spec(chat_trace, np.arange(len(cols)))
    schedule = plan.schedule(cols, the_spec.rows, 1.0)
    held = window.Window(schedule, feed.FeedReader(the_spec), horizon_ns=500_000_000, max_bytes=1 << 30)

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
    rows = np.arange(5)
    broken = feed.FeedSpec(("/nonexistent/trace.rpt",), rows, rows, flavors.get("vllm"), OPTIONS, TARGET)
    schedule = plan.schedule(load(chat_trace), np.arange(5), 1.0)
    held = window.Window(schedule, feed.FeedReader(broken))

    async def main() -> None:
        async with asyncio.timeout(60):
            await window.fill(held)

    try:
        with pytest.raises(RuntimeError, match="preparation stopped early"):
            asyncio.run(main())
    finally:
        held.close()
