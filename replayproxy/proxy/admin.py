"""The admin listener: `/metrics` for Prometheus, `/healthz` (liveness), `/readyz` (readiness).

It runs on the forwarding loop, so what it can cost that loop is bounded whatever its clients do
(`AdminLimits`): a few connections open (past that, accepting pauses and the kernel's backlog
holds the rest), a request within a header timeout, idle connections closed, a budget of requests
answered per second (a request past it waits, its connection unread), and `/metrics` rendered at
most once per `metrics_ttl_s` (a render costs ~1 ms). A small HTTP/1.1 server over httptools
rather than aiohttp, whose objects cost about as much per request as the render.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httptools
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from replayproxy.clock import now_ns
from replayproxy.proxy.listener import bind
from replayproxy.proxy.metrics import ProxyMetrics
from replayproxy.tasks import spawn

MAX_REQUEST_BYTES = 16384  # head and body of one request
_ACCEPTS_PER_WAKE = 16
_RETRY_S = 0.1  # accepting again after running out of file descriptors
_REASONS = {
    200: b"OK",
    404: b"Not Found",
    405: b"Method Not Allowed",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class AdminLimits:
    """What one admin listener may cost the forwarding loop."""

    max_connections: int = 32
    header_timeout_s: float = 5.0  # first byte of a request -> its end
    idle_timeout_s: float = 30.0  # between requests on a kept-alive connection (scrapes come every 15 s)
    rate: float = 100.0  # requests answered per second, all connections together
    burst: int = 20  # requests answered at once after a quiet spell
    metrics_ttl_s: float = 0.25  # a rendered /metrics serves every scrape within this
    sweep_s: float = 0.25  # how often deadlines are looked at


@dataclass(frozen=True, slots=True)
class AdminResponse:
    """One answer of the admin listener (/metrics, /healthz, /readyz or an error): status, body, type."""

    status: int
    body: bytes
    content_type: bytes = b"application/json"


@dataclass(frozen=True, slots=True)
class Health:
    """What the proxy tells its admin listener; each callable is read per request."""

    accepting: Callable[[], bool]  # False once draining
    recording: Callable[[], str]  # why recording fails; "" while it keeps up; "off" when not recording
    upstream: Callable[[], Awaitable[str]]  # why the upstream does not answer; "" when it does
    ready_requires_recording: bool = False


class Budget:
    """A token bucket: `rate` per second, at most `burst` saved up."""

    def __init__(self, rate: float, burst: int) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._at_ns = now_ns()

    def wait_s(self) -> float:
        """0.0 and a token taken, or how long until the next one (nothing taken)."""
        now = now_ns()
        self._tokens = min(self._burst, self._tokens + (now - self._at_ns) * self._rate / 1e9)
        self._at_ns = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate


class AdminServer:
    """Accepts, bounds and answers admin connections; `start` on the running loop, `close` at the end."""

    def __init__(
        self, sock: socket.socket, metrics: ProxyMetrics, health: Health, limits: AdminLimits = AdminLimits()
    ) -> None:
        self.sock = sock
        self._metrics = metrics
        self._health = health
        self.limits = limits
        self.connections: set[AdminConnection] = set()
        self.budget = Budget(limits.rate, limits.burst)
        self._waiting: deque[AdminConnection] = deque()
        self._release: asyncio.TimerHandle | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._accepting = False
        self._rendered = b""
        self._rendered_ns = -1
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        self._accept_more(True)
        self._sweep = self._loop.call_later(self.limits.sweep_s, self._run_sweep)

    def close(self) -> None:
        self._accept_more(False)
        for handle in (self._release, self._sweep, self._retry):
            if handle is not None:
                handle.cancel()
        self.sock.close()
        for conn in list(self.connections):
            conn.abort()

    # ------------------------------------------------------------------ connections

    def _accept_more(self, on: bool) -> None:
        if on == self._accepting or self._loop is None or self.sock.fileno() < 0:
            return
        self._accepting = on
        if on:
            self._loop.add_reader(self.sock.fileno(), self._accept)
        else:
            self._loop.remove_reader(self.sock.fileno())

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            if len(self.connections) >= self.limits.max_connections:
                self._accept_more(False)  # the backlog holds the rest until one closes
                return
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    assert self._loop is not None
                    self._accept_more(False)
                    self._retry = self._loop.call_later(_RETRY_S, self._accept_more, True)
                    return
                continue  # that client gave up
            conn.setblocking(False)
            protocol = AdminConnection(self)
            self.connections.add(protocol)
            spawn(self._attach(conn, protocol), name="admin-accept")

    async def _attach(self, conn: socket.socket, protocol: AdminConnection) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, conn)
        except OSError:
            conn.close()
            self.gone(protocol)

    def gone(self, conn: AdminConnection) -> None:
        self.connections.discard(conn)
        with contextlib.suppress(ValueError):
            self._waiting.remove(conn)
        if len(self.connections) < self.limits.max_connections:
            self._accept_more(True)

    def _run_sweep(self) -> None:
        assert self._loop is not None
        now = now_ns()
        for conn in list(self.connections):
            if 0 <= conn.deadline_ns < now:
                conn.abort()
        self._sweep = self._loop.call_later(self.limits.sweep_s, self._run_sweep)

    # ------------------------------------------------------------------ the request budget

    def wants_answer(self, conn: AdminConnection) -> None:
        """A request is complete: answer it now if the budget allows, else when it does (in order)."""
        if not self._waiting and self.budget.wait_s() == 0.0:
            conn.answer()
            return
        self._waiting.append(conn)
        self._schedule_release()

    def _schedule_release(self) -> None:
        if self._release is None and self._waiting and self._loop is not None:
            self._release = self._loop.call_later(self.budget.wait_s(), self._release_next)

    def _release_next(self) -> None:
        self._release = None
        while self._waiting and self.budget.wait_s() == 0.0:
            self._waiting.popleft().answer()
        self._schedule_release()

    # ------------------------------------------------------------------ answers

    async def reply(self, method: bytes, path: bytes) -> AdminResponse:
        if path not in (b"/metrics", b"/healthz", b"/readyz"):
            return AdminResponse(404, b'{"error": "not found"}')
        if method not in (b"GET", b"HEAD"):
            return AdminResponse(405, b'{"error": "GET or HEAD"}')
        if path == b"/metrics":
            return AdminResponse(200, self._render(), CONTENT_TYPE_LATEST.encode())
        if path == b"/healthz":
            return self._healthz()
        return await self._readyz()

    def _render(self) -> bytes:
        now = now_ns()
        if self._rendered_ns < 0 or now - self._rendered_ns >= self.limits.metrics_ttl_s * 1e9:
            self._rendered, self._rendered_ns = generate_latest(self._metrics.registry), now
        return self._rendered

    def _healthz(self) -> AdminResponse:
        """Liveness: 200 while accepting traffic, even while recording fails (live traffic never pays
        for it), and 503 once draining, so load balancers stop sending; the body says both."""
        accepting = self._health.accepting()
        recording = _recording(self._health.recording())
        body = {"status": "ok" if accepting else "draining", "recording": recording}
        return AdminResponse(200 if accepting else 503, json.dumps(body).encode())

    async def _readyz(self) -> AdminResponse:
        """Readiness: accepting, the upstream answers, and (unless told otherwise) recording keeps up."""
        health = self._health
        accepting = health.accepting()
        upstream = await health.upstream()
        recording = health.recording()
        keeping_up = recording in ("", "off") or not health.ready_requires_recording
        ready = accepting and not upstream and keeping_up
        body = {
            "status": "ready" if ready else "not ready" if accepting else "draining",
            "upstream": f"down ({upstream})" if upstream else "ok",
            "recording": _recording(recording),
        }
        return AdminResponse(200 if ready else 503, json.dumps(body).encode())


def _recording(failing: str) -> str:
    return "off" if failing == "off" else f"failing ({failing})" if failing else "ok"


class AdminConnection(asyncio.Protocol):
    """One admin client: one request at a time (reading pauses until it is answered)."""

    def __init__(self, server: AdminServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.deadline_ns = now_ns() + int(server.limits.idle_timeout_s * 1e9)  # -1 while an answer is owed
        self.url = b""
        self.size = 0  # bytes of the current request
        self.keep_alive = True
        self.busy = False  # a request is complete and not answered yet
        self.request = (b"", b"")  # method and path of that request
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.gone(self)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self.size == 0:
            self.deadline_ns = now_ns() + int(self.server.limits.header_timeout_s * 1e9)
        self.size += len(data)
        if self.size > MAX_REQUEST_BYTES:
            self._send(AdminResponse(431, b'{"error": "request too large"}'), close=True)
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._send(AdminResponse(405, b'{"error": "GET or HEAD"}'), close=True)
        except httptools.HttpParserError:
            self.abort()

    def on_url(self, url: bytes) -> None:
        if not self.busy:
            self.url += url

    def on_message_complete(self) -> None:
        if self.busy:  # pipelined within one read: answered by closing after the first
            self.keep_alive = False
            return
        self.busy = True
        self.deadline_ns = -1
        self.keep_alive = self.parser.should_keep_alive()
        self.request = (self.parser.get_method(), self.url.partition(b"?")[0])
        if self.transport is not None:
            self.transport.pause_reading()  # later pipelined requests wait in the socket
        self.server.wants_answer(self)

    def answer(self) -> None:
        """The budget allows this request an answer now."""
        if not self.closing:
            spawn(self._answer(*self.request), name="admin-answer")

    async def _answer(self, method: bytes, path: bytes) -> None:
        reply = await self.server.reply(method, path)
        self._send(reply, close=not self.keep_alive, head_only=method == b"HEAD")
        if self.closing:
            return
        self.url, self.size, self.busy = b"", 0, False
        self.deadline_ns = now_ns() + int(self.server.limits.idle_timeout_s * 1e9)
        if self.transport is not None:
            self.transport.resume_reading()

    def _send(self, reply: AdminResponse, close: bool, head_only: bool = False) -> None:
        if self.transport is None or self.closing:
            return
        head = b"HTTP/1.1 %d %b\r\nContent-Type: %b\r\nContent-Length: %d\r\n%b\r\n" % (
            reply.status,
            _REASONS.get(reply.status, b"Unknown"),
            reply.content_type,
            len(reply.body),
            b"Connection: close\r\n" if close else b"",
        )
        self.transport.write(head if head_only else head + reply.body)
        if close:
            self.closing = True
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()


def listen(host: str, port: int) -> socket.socket:
    """The admin listener's socket."""
    return bind(host, port, 128, "admin listener")
