"""The send loop against a raw loopback server: open loop, new connections, caps and timeouts."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection

import pytest

from replayproxy import clock
from replayproxy.errors import RunAborted
from replayproxy.replay import feed, housekeeping
from replayproxy.replay.connection import Pool, Target
from replayproxy.replay.housekeeping import restore_memory, settle_memory
from replayproxy.replay.prepared import Prepared, Schedule, schedule_of
from replayproxy.replay.runner import Runner
from replayproxy.replay.window import Window
from replayproxy.results import ReplayResult
from tests.replay.sse_server import serving, sse_answer

MODELS = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


def plan(count: int, gap_ns: int) -> list[Prepared]:
    return [Prepared(i, i * gap_ns, "chat", "/v1/chat/completions", b"{}", True, 5, 3) for i in range(count)]


async def replay(
    respond, prepared: list[Prepared], pool_size: int, schedule: Schedule | None = None, **kwargs: object
) -> list[ReplayResult]:  # type: ignore[no-untyped-def]
    async with serving(respond) as server:
        target = Target.parse(server.url)
        pool = Pool(target, clock.now_ns)
        await pool.fill(pool_size)
        wires = [target.request_bytes("POST", p.path, p.body) for p in prepared]
        window = Window.of(prepared, wires, schedule)
        runner = Runner(window, pool, clock=clock.now_ns, **kwargs)  # type: ignore[arg-type]
        settle_memory()
        try:
            results = await runner.run(clock.now_ns() + 20_000_000)
        finally:
            restore_memory()
        pool.close()
        return sorted(results, key=lambda r: r.index)


def answer(request: bytes, writer: asyncio.StreamWriter, _: int) -> None:
    writer.write(MODELS if request.startswith(b"GET") else sse_answer(3))


def slowly(delay_s: float, chunks: int) -> Callable[[bytes, asyncio.StreamWriter, int], Awaitable[None]]:
    """A responder that answers each POST after `delay_s` with a stream of `chunks` chunks."""

    async def respond(request: bytes, writer: asyncio.StreamWriter, _: int) -> None:
        if request.startswith(b"GET"):
            writer.write(MODELS)
            return
        await asyncio.sleep(delay_s)
        writer.write(sse_answer(chunks))

    return respond


@pytest.mark.serial  # a send-lag bound in milliseconds
def test_open_loop_sends_on_schedule_over_warm_connections() -> None:
    results = asyncio.run(replay(answer, plan(40, 5_000_000), 10, timeout_s=5))
    assert [r.index for r in results] == list(range(40))
    assert all(r.error == "" and r.content_chunks == 3 for r in results)
    assert not any(r.new_connection for r in results)
    lags = sorted(r.sent_ns - r.scheduled_ns for r in results)
    assert lags[0] >= 0 and lags[-2] < 20_000_000  # generous: shared CI machines
    assert [r.scheduled_ns for r in results] == [i * 5_000_000 for i in range(40)]


def test_without_an_idle_connection_the_result_says_so() -> None:
    results = asyncio.run(replay(answer, plan(3, 0), 0, timeout_s=5))  # all at once: none can reuse
    assert all(r.new_connection and r.error == "" for r in results)


def test_max_concurrency_delays_sends() -> None:
    slow = slowly(0.05, 1)

    results = asyncio.run(replay(slow, plan(4, 0), 4, timeout_s=5, max_concurrency=1))
    lags = [r.sent_ns - r.scheduled_ns for r in results]
    assert all(r.error == "" for r in results)
    assert lags[-1] >= 3 * 45_000_000  # each waited for the previous one to finish


def test_timeouts_are_recorded_and_the_run_continues() -> None:
    async def silent_for_first(request: bytes, writer: asyncio.StreamWriter, _: int) -> None:
        if request.startswith(b"GET"):
            writer.write(MODELS)
        elif b'"hang"' in request:
            await asyncio.sleep(3)
        else:
            writer.write(sse_answer(2))

    prepared = plan(3, 10_000_000)
    prepared[0] = Prepared(0, 0, "chat", "/v1/chat/completions", b'{"hang"}', True, 5, 3)
    results = asyncio.run(replay(silent_for_first, prepared, 3, timeout_s=0.3))
    assert results[0].error == "timeout" and 0.3e9 <= results[0].e2e_ns < 2e9
    assert [r.error for r in results[1:]] == ["", ""]


@pytest.mark.serial  # a think-time bound in milliseconds
def test_closed_loop_sends_a_later_turn_at_the_previous_end_plus_think_time() -> None:
    slow = slowly(0.08, 2)  # longer than the recorded gap between the turns

    def turn(index: int, offset_ms: int, after: int) -> Prepared:
        think = 30_000_000 if after >= 0 else -1
        return Prepared(index, offset_ms * 1_000_000, "chat", "/v1/chat/completions", b"{}", True, 5, 3,
                        session=7, turn=index, after=after, think_ns=think)  # fmt: skip

    prepared = [turn(0, 0, -1), turn(1, 20, 0), turn(2, 40, 1)]
    results = asyncio.run(replay(slow, prepared, 3, timeout_s=5, closed_loop=True))
    assert all(r.error == "" for r in results)
    for previous, later in zip(results, results[1:], strict=False):
        think = later.sent_ns - (previous.sent_ns + previous.e2e_ns)
        assert 30_000_000 <= think < 300_000_000  # after the end, by the think time (generous)
        assert later.scheduled_ns == previous.sent_ns + previous.e2e_ns + 30_000_000  # the dynamic deadline
    open_loop = asyncio.run(replay(slow, prepared, 3, timeout_s=5))
    assert [r.scheduled_ns for r in open_loop] == [0, 20_000_000, 40_000_000]


def test_closed_loop_holds_a_request_the_planner_linked_until_the_turn_it_extends_ended() -> None:
    """An edited-reply continuation is found only as it is planned: the schedule sends it at its
    offset, but arriving linked to a turn it waits for that turn's end plus its think time."""

    slow = slowly(0.08, 2)

    leader = Prepared(0, 0, "chat", "/v1/chat/completions", b"{}", True, 5, 3, session=7)
    follower = Prepared(1, 10_000_000, "chat", "/v1/chat/completions", b"{}", True, 5, 3, after=0,
                        think_ns=30_000_000, first=0)  # fmt: skip
    prepared = [leader, follower]
    unlinked = schedule_of(prepared)
    unlinked.after[1] = unlinked.think_ns[1] = unlinked.first[1] = -1  # what the schedule knew
    results = asyncio.run(replay(slow, prepared, 2, unlinked, timeout_s=5, closed_loop=True))
    first, second = results
    assert first.error == second.error == "" and second.after == 0
    assert second.scheduled_ns == first.sent_ns + first.e2e_ns + 30_000_000  # not its 10 ms offset
    assert second.sent_ns >= second.scheduled_ns
    open_loop = asyncio.run(
        replay(slow, prepared, 2, schedule_of(prepared)._replace(after=unlinked.after), timeout_s=5)
    )
    assert open_loop[1].scheduled_ns == 10_000_000  # open loop: at its offset


async def fed_replay(
    prepared: list[Prepared],
    feed_it: Callable[[Connection, Target], Awaitable[None]],
    timeout_s: float = 20.0,
) -> list[ReplayResult]:
    """`prepared` sent from a window that a preparer's pipe fills, `feed_it` writing into that pipe
    while the run goes; the whole run bounded by `timeout_s` (a hang fails the test)."""
    async with serving(answer) as server:
        target = Target.parse(server.url)
        pool = Pool(target, clock.now_ns)
        await pool.fill(2)
        reading, writing = multiprocessing.Pipe(duplex=False)
        window = Window(schedule_of(prepared), feed.FeedReader(reading))
        runner = Runner(window, pool, clock=clock.now_ns, timeout_s=5)
        feeding = asyncio.ensure_future(feed_it(writing, target))
        try:
            async with asyncio.timeout(timeout_s):
                return await runner.run(clock.now_ns() + 20_000_000)
        finally:
            feeding.cancel()
            window.close()
            writing.close()
            pool.close()


def batch(target: Target, *prepared: Prepared) -> bytes:
    return feed.encode([(p, target.request_bytes("POST", p.path, p.body)) for p in prepared])


def test_a_due_request_whose_body_does_not_come_is_reported_then_sent_when_it_does(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stall says what the send loop waits for (never silence), and when it goes on."""
    monkeypatch.setattr(housekeeping, "STALL_NOTICE_NS", 300_000_000)
    first, second = plan(2, 50_000_000)

    async def feed_it(pipe: Connection, target: Target) -> None:
        pipe.send_bytes(batch(target, first))
        while "has not arrived from the preparer" not in caplog.text:
            await asyncio.sleep(0.05)
        pipe.send_bytes(batch(target, second))
        pipe.send_bytes(b"")

    with caplog.at_level(logging.WARNING, logger="replayproxy.replay"):
        results = asyncio.run(fed_replay([first, second], feed_it))
    assert [(r.index, r.error, r.prepared_late) for r in results] == [(0, "", False), (1, "", True)]
    assert "nothing sent or answered for 0 s, 1 of 2 requests to send: the request due 0 s ago" in caplog.text
    assert "(trace row 1) has not arrived from the preparer, which has delivered 1 of 2" in caplog.text
    assert "sending again after 0 s without a send or an answer" in caplog.text


def test_a_preparer_that_ends_early_ends_the_run_instead_of_leaving_it_waiting() -> None:
    """The feeder's failure reaches the send loop: the request it waits for can never come."""

    async def feed_it(pipe: Connection, target: Target) -> None:
        pipe.send_bytes(batch(target, *plan(1, 0)))
        pipe.close()  # the preparer process died

    with pytest.raises(RunAborted, match="the preparer process ended"):
        asyncio.run(fed_replay(plan(3, 30_000_000), feed_it))
