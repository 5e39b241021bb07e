"""In-process servers for the proxy tests: a scripted raw upstream, the proxy, and a raw HTTP client.

Everything runs on one uvloop loop inside `run(...)`, so a test is a plain function that builds
its servers, talks to them over real loopback sockets, and asserts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httptools
import uvloop
from aiohttp import web

from replayproxy.clock import now_ns
from replayproxy.proxy.observe import Capture, Observer
from replayproxy.proxy.server import ProxyServer, serving
from replayproxy.proxy.settings import ProxySettings
from tests.servers import Server

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout_s):
            return await coro

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(bounded())


def settings(upstream: str, trace_dir: Path | None = None, **overrides: Any) -> ProxySettings:
    return ProxySettings(
        upstream=upstream,
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        trace_dir=trace_dir,
        record=trace_dir is not None,
        **overrides,
    )


@contextlib.asynccontextmanager
async def proxy(
    upstream: str, trace_dir: Path | None = None, observer: Observer | None = None, **overrides: Any
) -> AsyncIterator[ProxyServer]:
    async with serving(settings(upstream, trace_dir, **overrides), observer=observer) as server:
        yield server


@contextlib.asynccontextmanager
async def aiohttp_upstream(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """An aiohttp server answering every method and path with `handler`."""
    app = web.Application(client_max_size=64 << 20)
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@dataclass
class RawRequest:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    connection: RawConnection


@dataclass
class RawConnection:
    """One upstream TCP connection as the raw upstream saw it."""

    transport: asyncio.Transport
    lost_ns: int = -1
    requests: list[RawRequest] = field(default_factory=list)

    def write(self, data: bytes) -> None:
        self.transport.write(data)


class RawUpstream:
    """A byte-level upstream: each request is handed to `script(request)`, which writes raw bytes."""

    def __init__(self, script: Callable[[RawRequest], Awaitable[None] | None]) -> None:
        self.script = script
        self.connections: list[RawConnection] = []
        self.requests: list[RawRequest] = []
        self.url = ""
        self.tasks: set[asyncio.Future[None]] = set()
        self._server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> RawUpstream:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _RawProtocol(self), "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for conn in self.connections:
            conn.transport.abort()


class _RawProtocol(asyncio.Protocol):
    def __init__(self, owner: RawUpstream) -> None:
        self.owner = owner
        self.parser = httptools.HttpRequestParser(self)
        self.conn: RawConnection | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn = RawConnection(transport)  # type: ignore[arg-type]
        self.owner.connections.append(self.conn)

    def data_received(self, data: bytes) -> None:
        with contextlib.suppress(httptools.HttpParserUpgrade):
            self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        assert self.conn is not None
        self.conn.lost_ns = now_ns()

    def on_message_begin(self) -> None:
        self.headers, self.url, self.body = [], b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.conn is not None
        request = RawRequest(self.parser.get_method(), self.url, self.headers, b"".join(self.body), self.conn)
        self.conn.requests.append(request)
        self.owner.requests.append(request)
        result = self.owner.script(request)
        if asyncio.iscoroutine(result):
            task = asyncio.ensure_future(result)
            self.owner.tasks.add(task)
            task.add_done_callback(self.owner.tasks.discard)


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for n, v in headers if n.lower() == name.lower()), None)


@dataclass
class RawResponse:
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    complete: bool


class _ResponseReader:
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[RawResponse] = []
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        self.done.append(RawResponse(status, self.reason, self.headers, b"".join(self.body), True))
        self.reason, self.headers, self.body = b"", [], []


async def raw_exchange(url: str, data: bytes, responses: int = 1) -> list[RawResponse]:
    """Send raw bytes to `url`'s host and read `responses` responses (or until the server closes)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    parser = _ResponseReader()
    try:
        writer.write(data)
        while len(parser.done) < responses:
            chunk = await reader.read(65536)
            if not chunk:
                if parser.parser.get_status_code():
                    parser.done.append(
                        RawResponse(
                            parser.parser.get_status_code(),
                            parser.reason,
                            parser.headers,
                            b"".join(parser.body),
                            False,
                        )
                    )
                break
            parser.parser.feed_data(chunk)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return parser.done


def children_of(pid: int) -> list[int]:
    """Processes whose parent is `pid` (the proxy's recorder process)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if stat.read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                found.append(int(stat.parent.name))
    return found


def ended(pid: int) -> bool:
    """The process ended (a zombie its parent has not reaped yet counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def add_piece(cap: Capture, piece: bytes, at_ns: int) -> None:
    """Keep one piece of an upstream body in a hand-made capture, as the forwarding path does."""
    cap.response_bytes += len(piece)
    if cap.response_bytes > cap.limit_bytes:
        cap.response_truncated = True
        return
    cap.pieces.append(piece)
    cap.piece_ns.append(at_ns)


class CaptureSink:
    """An observer that keeps every capture, for tests of what the hot path hands over."""

    def __init__(self, endpoints: tuple[str, ...] = ("chat", "completions", "embeddings", "other")) -> None:
        self.endpoints = endpoints
        self.captures: list[Capture] = []

    def wants(self, endpoint: str) -> bool:
        return endpoint in self.endpoints

    def finished(self, capture: Capture) -> None:
        self.captures.append(capture)


def admin_url(server: Server, timeout_s: float = 10.0) -> str:
    """The admin URL a proxy subprocess printed on the line after its listening line."""
    deadline = now_ns() + int(timeout_s * 1e9)
    while now_ns() < deadline:
        for line in list(server.output):
            if line.startswith("admin listening on "):
                return line.removeprefix("admin listening on ")
        time.sleep(0.01)
    raise AssertionError("the proxy printed no admin line:\n" + "\n".join(server.output[-10:]))
