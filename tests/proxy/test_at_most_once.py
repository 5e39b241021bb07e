"""At most once: a POST reaches the upstream once or not at all. It goes to a fresh connection only
when the one it was lent had closed before a byte of it was written; otherwise the client gets the
502 and the capture names the error. Upstreams here are raw asyncio servers that count every
request they read, by an id in its body."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable

import aiohttp
import httptools

from tests.proxy.helpers import CaptureSink, proxy, run

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Upstream(asyncio.Protocol):
    """One connection of a counting upstream: parses requests; `act(conn, n)` runs after the n-th
    request of this connection has been read whole."""

    def __init__(self, arrivals: list[bytes], act: Callable[[Upstream, int], None]) -> None:
        self.arrivals = arrivals
        self.act = act
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.body = b""
        self.served = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.body = b""

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.arrivals.append(self.body)
        self.served += 1
        self.act(self, self.served)

    def reset(self) -> None:
        """Close with RST (SO_LINGER 0), as a crashed or overloaded server does."""
        assert self.transport is not None
        sock = self.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


@contextlib.asynccontextmanager
async def counting_upstream(
    act: Callable[[Upstream, int], None], protocol: type[Upstream] | None = None
) -> AsyncIterator[tuple[str, list[bytes], list[int]]]:
    """Yields the URL, the bodies of the requests read (in order), and a count of connections."""
    arrivals: list[bytes] = []
    connections: list[int] = []
    loop = asyncio.get_running_loop()

    def made() -> asyncio.Protocol:
        connections.append(1)
        return (protocol or Upstream)(arrivals, act)

    server = await loop.create_server(made, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", arrivals, connections
    finally:
        server.close()


async def post_all(url: str, n: int, pause_s: float = 0.0) -> list[int]:
    """POST bodies 0..n-1 one after another on one keep-alive client connection; their statuses."""
    statuses = []
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            async with session.post(url + "/v1/completions", data=b"%d" % i) as resp:
                await resp.read()
                statuses.append(resp.status)
            await asyncio.sleep(pause_s)
    return statuses


def test_a_request_the_upstream_read_then_reset_is_a_502_never_a_resend() -> None:
    """Every connection answers its first request, then resets after reading the second: on a
    reused connection the proxy cannot know whether the engine acted on it."""

    def act(conn: Upstream, n: int) -> None:
        if n == 1:
            assert conn.transport is not None
            conn.transport.write(OK)
        else:
            conn.reset()

    async def main() -> None:
        sink = CaptureSink()
        async with counting_upstream(act) as (url, arrivals, _), proxy(url, observer=sink) as px:
            statuses = await post_all(px.url, 10)
        assert statuses == [200, 502] * 5
        assert collections.Counter(arrivals) == {b"%d" % i: 1 for i in range(10)}  # each POST once
        failed = [c for c in sink.captures if c.status == 502]
        assert len(failed) == 5 and {c.error for c in failed} == {"reset"}
        assert {c.error for c in sink.captures if c.status == 200} == {""}

    run(main())


def test_a_request_on_a_fresh_connection_that_the_upstream_read_then_reset_is_a_502() -> None:
    async def main() -> None:
        sink = CaptureSink()
        async with (
            counting_upstream(lambda conn, n: conn.reset()) as (url, arrivals, connections),
            proxy(url, observer=sink) as px,
        ):
            statuses = await post_all(px.url, 5)
        assert statuses == [502] * 5
        assert collections.Counter(arrivals) == {b"%d" % i: 1 for i in range(5)}
        assert len(connections) == 5 and [c.error for c in sink.captures] == ["reset"] * 5

    run(main())


class _ClosesUnread(Upstream):
    """Closes every connection as soon as bytes arrive, before reading a request head."""

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.close()


def test_an_upstream_that_closes_before_reading_the_head_gets_each_request_at_most_once() -> None:
    async def main() -> None:
        sink = CaptureSink()
        async with (
            counting_upstream(lambda conn, n: None, _ClosesUnread) as (url, arrivals, connections),
            proxy(url, observer=sink) as px,
        ):
            statuses = await post_all(px.url, 5)
        assert statuses == [502] * 5 and arrivals == []
        assert len(connections) == 5  # the request was written, so it was not sent on another one
        assert [c.error for c in sink.captures] == ["reset"] * 5

    run(main())


def test_a_kept_alive_connection_the_upstream_closed_between_requests_is_never_written_to() -> None:
    """The server closes each connection right after its response (a keep-alive timer firing): the
    next request goes on a fresh connection, whether the loop has already seen the close or the
    close still waits in the kernel, and every POST arrives exactly once."""

    def act(conn: Upstream, n: int) -> None:
        assert conn.transport is not None
        conn.transport.write(OK)
        conn.transport.close()

    async def main() -> None:
        async with counting_upstream(act) as (url, arrivals, connections), proxy(url) as px:
            statuses = await post_all(px.url, 20)
            statuses += await post_all(px.url, 5, pause_s=0.05)  # the loop has seen each close
        assert statuses == [200] * 25
        assert collections.Counter(arrivals) == {b"%d" % i: 1 + (i < 5) for i in range(20)}
        assert len(connections) == 25

    run(main())


def test_a_connection_lost_while_the_body_still_arrives_moves_to_a_fresh_one() -> None:
    """With usage injection the body is held until complete (to add `stream_options` if it
    streams): a lent connection that closes in the meantime has carried nothing, so the request
    goes whole to a new connection."""
    closed_first: list[int] = []

    class ClosesFirstIdle(Upstream):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            if not closed_first:
                closed_first.append(1)
                asyncio.get_running_loop().call_later(0.1, transport.close)

    def act(conn: Upstream, n: int) -> None:
        assert conn.transport is not None
        conn.transport.write(OK)

    async def main() -> None:
        async with (
            counting_upstream(act, ClosesFirstIdle) as (url, arrivals, connections),
            proxy(url, observer=CaptureSink()) as px,
        ):
            host, port = px.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            body = b'{"prompt": "x", "max_tokens": 3}'
            head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
            writer.write(head + body[:5])
            await asyncio.sleep(0.3)  # the lent connection is closed by now; nothing was written to it
            writer.write(body[5:])
            answer = await asyncio.wait_for(reader.readuntil(b"ok"), 5)
            writer.close()
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert arrivals == [body] and len(connections) == 2

    run(main())
