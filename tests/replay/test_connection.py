"""The lean HTTP/1.1 client against a raw loopback server: keep-alive, chunked SSE, failures."""

from __future__ import annotations

import asyncio

import pytest

from replayproxy import clock
from replayproxy.errors import TargetUnreachable
from replayproxy.replay import connection
from replayproxy.replay.connection import Pool, Target
from replayproxy.replay.prepared import Prepared
from replayproxy.replay.request_timeline import RequestTimeline
from replayproxy.results import ReplayResult
from replayproxy.tasks import spawn
from tests.replay.sse_server import SSE_HEAD, chunk, serving, sse_answer

PREPARED = Prepared(0, 0, "chat", "/v1/chat/completions", b'{"x":1}', True, 5, 3)


def test_target_parse_and_request_bytes() -> None:
    target = Target.parse("http://example.com:8080/api/v1/")
    assert (target.host, target.port, target.base_path, target.tls) == ("example.com", 8080, "/api", False)
    wire = target.request_bytes("POST", "/v1/completions", b"{}", {"Authorization": "Bearer k"})
    assert wire.startswith(b"POST /api/v1/completions HTTP/1.1\r\nHost: example.com:8080\r\n")
    assert b"Content-Length: 2\r\n" in wire and wire.endswith(b"\r\n\r\n{}")
    assert Target.parse("https://h").port == 443 and Target.parse("https://h").host_header == "h"
    with pytest.raises(ValueError, match="http"):
        Target.parse("ftp://h")


async def exchange_over(pool: Pool, wire: bytes) -> ReplayResult:
    finished: asyncio.Future[RequestTimeline] = asyncio.get_running_loop().create_future()
    ex = RequestTimeline(PREPARED, clock.now_ns(), finished.set_result)
    connection = pool.acquire()
    assert connection is not None
    ex.sent(connection.send(ex, wire))
    return (await asyncio.wait_for(finished, 5)).result(0)


def test_keep_alive_pool_reuses_warm_connections() -> None:
    async def main() -> None:
        def respond(request: bytes, writer: asyncio.StreamWriter, _: int) -> None:
            if request.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            else:
                writer.write(sse_answer(4))

        async with serving(respond) as server:
            target = Target.parse(server.url)
            pool = Pool(target, clock.now_ns)
            await pool.fill(2)
            assert server.connections == 2 and len(pool.idle) == 2
            wire = target.request_bytes("POST", PREPARED.path, PREPARED.body)
            for _ in range(3):
                result = await exchange_over(pool, wire)
                assert (
                    result.error == "" and result.content_chunks == 4 and result.chunk_tokens == (1, 1, 1, 1)
                )
                assert 0 < result.headers_ns <= result.ttft_ns <= result.e2e_ns
            assert server.connections == 2  # no new connection was needed
            assert server.requests[-1].endswith(b'{"x":1}')
            pool.close()

    asyncio.run(main())


def test_reset_mid_stream_and_malformed_answers_are_errors() -> None:
    async def main() -> None:
        def respond(request: bytes, writer: asyncio.StreamWriter, connection: int) -> None:
            if request.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            elif connection == 1:
                writer.write(SSE_HEAD + chunk(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'))
                writer.transport.abort()
            else:
                writer.write(b"NOT HTTP AT ALL\r\n\r\n")

        async with serving(respond) as server:
            target = Target.parse(server.url)
            pool = Pool(target, clock.now_ns)
            await pool.fill(1)
            wire = target.request_bytes("POST", PREPARED.path, PREPARED.body)
            reset = await exchange_over(pool, wire)
            assert reset.error == "reset" and reset.content_chunks == 1
            assert pool.acquire() is None  # the broken connection is gone
            await pool.fill(1)
            bad = await exchange_over(pool, wire)
            assert bad.error == "bad_stream" and "malformed" in bad.error_message

    asyncio.run(main())


def test_refresh_pings_the_longest_idle_connections_first() -> None:
    async def main() -> None:
        def respond(request: bytes, writer: asyncio.StreamWriter, _: int) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

        async with serving(respond) as server:
            pool = Pool(Target.parse(server.url), clock.now_ns)
            await pool.fill(3)
            for age, connection in enumerate(pool.idle):
                connection.idle_since -= (age + 1) * 10_000_000_000
            youngest = max(pool.idle, key=lambda c: c.idle_since)
            await pool.refresh(idle_for_ns=5_000_000_000, limit=2)
            assert len(server.requests) == 3 + 2
            await asyncio.sleep(0.05)
            assert len(pool.idle) == 3
            fresh = [c for c in pool.idle if clock.now_ns() - c.idle_since < 1_000_000_000]
            assert len(fresh) == 2 and youngest not in fresh  # the two longest idle were pinged
            pool.close()

    asyncio.run(main())


def test_a_cancel_during_warm_up_is_not_lost_when_the_answer_lands_in_the_same_tick() -> None:
    """Ctrl-C while the pool warms up must stop the run; asyncio.wait_for on 3.11 could swallow a
    cancellation arriving just as the awaited answer completed (python/cpython#86296)."""

    class Answering:
        probe: object = None

        def send(self, probe: object, wire: bytes) -> int:
            self.probe = probe
            return 0

    async def main() -> None:
        pool = Pool(Target.parse("http://127.0.0.1:9"), clock.now_ns)
        connection = Answering()
        warming = spawn(pool._warm(connection), name="warm")  # type: ignore[arg-type]
        await asyncio.sleep(0)  # warming now waits for the probe's answer
        connection.probe.done.set_result(200)  # type: ignore[attr-defined]
        warming.cancel()  # in the same tick
        with pytest.raises(asyncio.CancelledError):
            await warming

    asyncio.run(main())


def test_the_pool_learns_that_the_server_closes_after_a_stream_and_never_writes_on_a_closed_one() -> None:
    """llama.cpp's habit: the stream's response says keep-alive, then the server closes."""

    async def main() -> None:
        def respond(request: bytes, writer: asyncio.StreamWriter, _: int) -> None:
            if request.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            else:
                writer.write(sse_answer(2))
                writer.close()

        async with serving(respond) as server:
            target = Target.parse(server.url)
            pool = Pool(target, clock.now_ns)
            await pool.fill(2)
            wire = target.request_bytes("POST", PREPARED.path, PREPARED.body)
            finished: asyncio.Future[RequestTimeline] = asyncio.get_running_loop().create_future()
            timeline = RequestTimeline(PREPARED, clock.now_ns(), finished.set_result)
            connection = pool.acquire()
            assert connection is not None
            timeline.sent(connection.send(timeline, wire, streamed=True))
            assert (await asyncio.wait_for(finished, 5)).result(0).error == ""
            await asyncio.sleep(0.1)
            assert pool.closes_after_stream is True and connection.closed
            assert len(pool.idle) == 2  # the other one, and one opened in place of the closed one
            pool.close()

    asyncio.run(main())


def test_a_connection_the_server_closed_is_not_handed_out_before_the_loop_reads_the_fin() -> None:
    async def main() -> None:
        async def close_soon(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(0.05)
            writer.close()

        server = await asyncio.start_server(close_soon, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(Target.parse(f"http://127.0.0.1:{port}"), clock.now_ns)
        connection = await pool.open()
        assert connection.transport is not None
        connection.transport.pause_reading()  # the event loop will not see the FIN
        pool.release(connection)
        assert pool.acquire() is connection  # open so far
        pool.release(connection)
        await asyncio.sleep(0.3)
        assert not connection.closed  # the loop has not read the FIN, but the kernel has it:
        assert pool.acquire() is None  # no request is written on it
        assert connection.closed
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_a_warm_up_keeps_the_connections_a_busy_server_answers_and_closes_the_silent_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """llama-server serves a few connections at once and leaves the rest waiting, unanswered: the
    warm-up goes on with those that answered; only a server that answers none is unreachable."""
    monkeypatch.setattr(connection, "WARM_STALL_S", 0.2)

    async def main() -> None:
        def answer_first_two(request: bytes, writer: asyncio.StreamWriter, number: int) -> None:
            if number <= 2:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

        async with serving(answer_first_two) as server:
            pool = Pool(Target.parse(server.url), clock.now_ns, connect_timeout_s=5.0)
            started = clock.now_ns()
            await pool.fill(6)
            assert len(pool.idle) == 2 and server.connections == 6
            assert clock.now_ns() - started < 3_000_000_000  # not the 5 s connect timeout
            pool.close()

        async with serving(lambda request, writer, number: None) as silent:
            pool = Pool(Target.parse(silent.url), clock.now_ns, connect_timeout_s=0.3)
            with pytest.raises(TargetUnreachable, match="cannot open connections"):
                await pool.fill(3)
            pool.close()

    asyncio.run(main())
