"""Streaming without buffering, client cancels reaching the upstream, upstream failures mapped like nginx."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from replayproxy.clock import now_ns
from tests.proxy.helpers import CaptureSink, RawRequest, RawUpstream, proxy, raw_exchange, run

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def sse_chunk(i: int) -> bytes:
    event = b'data: {"choices":[{"index":0,"delta":{"content":"tok%d"}}]}\n\n' % i
    return b"%x\r\n%b\r\n" % (len(event), event)


def test_each_chunk_reaches_the_client_before_the_upstream_sends_the_next() -> None:
    acks: asyncio.Queue[int] = asyncio.Queue(1)

    async def script(request: RawRequest) -> None:
        request.connection.write(SSE_HEAD)
        for i in range(20):
            request.connection.write(sse_chunk(i))
            assert await acks.get() == i  # the client must have seen chunk i: nothing may sit in a buffer
        request.connection.write(b"0\r\n\r\n")

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px:
            body = b""
            async with aiohttp.ClientSession() as session, session.get(px.url + "/stream") as resp:
                seen = 0
                async with asyncio.timeout(5):
                    async for piece in resp.content.iter_any():
                        body += piece
                        while seen < 20 and b'tok%d"' % seen in body:
                            await acks.put(seen)
                            seen += 1
            assert seen == 20 and body.count(b"data: ") == 20

    run(main())


@pytest.mark.serial  # a propagation bound in milliseconds
def test_client_cancel_reaches_the_upstream_within_100_ms() -> None:
    async def script(request: RawRequest) -> None:
        request.connection.write(SSE_HEAD + sse_chunk(0))
        for i in range(1, 200):  # keeps streaming until the proxy hangs up
            await asyncio.sleep(0.5)
            if request.connection.lost_ns >= 0:
                return
            request.connection.write(sse_chunk(i))

    async def main() -> None:
        sink = CaptureSink()
        async with RawUpstream(script) as up, proxy(up.url, observer=sink) as px:
            host, port = px.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            assert b"tok0" in await reader.readuntil(b"tok0")
            writer.transport.abort()
            cancelled_ns = now_ns()
            while up.connections[0].lost_ns < 0 and now_ns() - cancelled_ns < 2e9:
                await asyncio.sleep(0.001)
            assert 0 <= up.connections[0].lost_ns - cancelled_ns < 100e6
            await asyncio.sleep(0.05)
            [capture] = sink.captures
            assert capture.error == "client_cancel" and capture.status == 200
            assert capture.end_ns - cancelled_ns < 100e6
            assert px.metrics.hot.client_cancels == 1

    run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_upstream_gives_502() -> None:
    async def main() -> None:
        sink = CaptureSink()
        async with proxy(f"http://127.0.0.1:{free_port()}", observer=sink) as px:
            [response] = await raw_exchange(
                px.url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
            )
            assert response.status == 502
            assert px.metrics.hot.upstream_errors == {"connect": 1}
            assert (sink.captures[0].status, sink.captures[0].error) == (502, "connect")

    run(main())


@pytest.mark.parametrize(
    ("behaviour", "status", "error"),
    [("silent", 504, "timeout"), ("reset", 502, "reset"), ("garbage", 502, "bad_stream")],
)
def test_failures_before_the_response_head(behaviour: str, status: int, error: str) -> None:
    def script(request: RawRequest) -> None:
        if behaviour == "reset":
            request.connection.transport.abort()
        elif behaviour == "garbage":
            request.connection.write(b"SPDY/9 nonsense\r\n\r\n")

    async def main() -> None:
        sink = CaptureSink()
        async with RawUpstream(script) as up, proxy(up.url, observer=sink, first_byte_timeout_s=0.3) as px:
            started = now_ns()
            [response] = await raw_exchange(px.url, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert response.status == status
            assert (sink.captures[0].status, sink.captures[0].error) == (status, error)
            if behaviour == "silent":
                assert 0.25e9 < now_ns() - started < 2e9
                assert up.connections[0].lost_ns >= 0  # the proxy gave up on the upstream request too

    run(main())


@pytest.mark.parametrize("behaviour", ["reset", "stall"])
def test_failures_after_the_head_cut_the_stream(behaviour: str) -> None:
    async def script(request: RawRequest) -> None:
        request.connection.write(SSE_HEAD + sse_chunk(0))
        await asyncio.sleep(0.05)
        if behaviour == "reset":
            request.connection.transport.abort()

    async def main() -> None:
        sink = CaptureSink()
        async with RawUpstream(script) as up, proxy(up.url, observer=sink, idle_timeout_s=0.3) as px:
            async with aiohttp.ClientSession() as session, session.get(px.url) as resp:
                assert resp.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await resp.read()
            assert sink.captures[0].error == ("reset" if behaviour == "reset" else "timeout")

    run(main())


def test_stale_keep_alive_connection_is_retried_once() -> None:
    def script(request: RawRequest) -> None:
        request.connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        if len(request.connection.requests) == 1:
            request.connection.transport.close()  # a server whose keep-alive timer just fired

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px:
            async with aiohttp.ClientSession() as session:
                for _ in range(3):
                    await asyncio.sleep(0.02)
                    async with session.post(px.url, data=b"{}") as resp:
                        assert (resp.status, await resp.read()) == (200, b"ok")

    run(main())


def test_connection_limit_queues_and_times_out_with_504() -> None:
    async def script(request: RawRequest) -> None:
        await asyncio.sleep(0.6 if request.target == b"/slow" else 0)
        request.connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async def main() -> None:
        async with (
            RawUpstream(script) as up,
            proxy(up.url, max_upstream_connections=1, connect_timeout_s=0.2) as px,
        ):
            async with aiohttp.ClientSession() as session:
                slow = asyncio.ensure_future(session.get(px.url + "/slow"))
                await asyncio.sleep(0.05)
                async with session.get(px.url + "/fast") as resp:
                    assert resp.status == 504
                async with await slow as resp:
                    assert resp.status == 200
                async with session.get(px.url + "/fast") as resp:  # the freed connection is lent again
                    assert resp.status == 200
            assert len(up.connections) == 1

    run(main())
