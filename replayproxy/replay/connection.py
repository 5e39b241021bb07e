"""A lean HTTP/1.1 keep-alive client: pre-built request bytes out, timestamped reads in.

aiohttp's client builds request and response objects per call, which costs about a millisecond of
schedule fidelity at a few hundred requests per second (DESIGN.md, Performance budgets). Here a
send is one `transport.write` of bytes prepared before the run, and each `data_received` reads the
clock first, then runs the llhttp parser (httptools), whose callbacks hand body bytes to the
request's receiver with that read's time. Connections are opened and warmed before the clock
starts; the pool hands out idle ones (LIFO) and says when a send had to open a new one.

Servers close connections they advertised as keep-alive: llama.cpp's after every streamed response,
and any of them after its idle timeout. A request is only written on a connection that is still
open as far as the kernel knows (nothing readable on an idle socket: no FIN, no stray bytes), and
the pool learns from the first streamed responses whether the server keeps such connections; if it
does not, they are closed on our side and a fresh one is opened in the background in their place,
so that sends keep finding an open connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import httptools

from replayproxy.config import http_url
from replayproxy.errors import TargetUnreachable
from replayproxy.shape import ErrorClass
from replayproxy.tasks import spawn

Clock = Callable[[], int]
STREAM_GRACE_S = 0.01  # a connection waits this long after a streamed response while the pool learns
STREAMS_TO_TRUST = 3  # ...whether the server closes such connections; kept this many times: it does not
WARM_STALL_S = 1.0  # fill: once one connection answered, the longest wait for the next answer


class Receiver(Protocol):
    """What a connection reports to (request_timeline.RequestTimeline, or the warm-up probe)."""

    def on_headers(self, at_ns: int, status: int) -> None: ...

    def on_body(self, at_ns: int, data: bytes) -> None: ...

    def on_complete(self, at_ns: int) -> None: ...

    def fail(self, at_ns: int, error: ErrorClass, message: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go: the base URL split into what a socket and a request line need."""

    url: str
    host: str
    port: int
    base_path: str
    tls: bool

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = http_url(url, "target")
        assert parts.hostname is not None  # http_url refuses a URL without one
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        base = parts.path.rstrip("/")
        if base.endswith("/v1"):  # the OpenAI SDK's base URL style: every path below adds its own /v1
            base = base[: -len("/v1")]
        return cls(f"{parts.scheme}://{parts.netloc}{base}", parts.hostname, port, base, tls)

    @property
    def host_header(self) -> str:
        default = 443 if self.tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def request_bytes(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> bytes:
        """One complete HTTP/1.1 request, ready for `transport.write`."""
        lines = [
            f"{method} {self.base_path}{path} HTTP/1.1",
            f"Host: {self.host_header}",
            "Connection: keep-alive",
        ]
        if body or method == "POST":
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.clock = pool.clock
        self.transport: asyncio.Transport | None = None
        self.receiver: Receiver | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.closed = False
        self.idle_since = 0
        self.streamed = False  # the request in flight (or the last one) asked for a stream
        self.on_probation = False  # after a streamed response, while the pool learns the server's habit
        self._read_at = 0
        self._poll: select.poll | None = None

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            # TLS may read records (session tickets) on an idle socket, so the check is for plain TCP
            self._poll = select.poll()
            self._poll.register(sock.fileno(), select.POLLIN | select.POLLRDHUP)

    def data_received(self, data: bytes) -> None:
        self._read_at = self.clock()  # before any parsing: this read's events get this time
        if self.receiver is None or self.parser is None:
            self.close()  # bytes nobody asked for: the connection cannot be trusted any more
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail("bad_stream", f"malformed HTTP response: {e}")

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost reports an unfinished response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.on_probation:  # the server closed it right after a stream: it always will
            self.pool.learn_stream_close(closes=True)
            spawn(self.pool.replace(), name="replay-reconnect")
        self.pool.discard(self)
        if self.receiver is not None:
            reason = type(exc).__name__ if exc else "connection closed by the server"
            self._fail("reset", f"connection lost before the response ended ({reason})")

    # ------------------------------------------------------------------ httptools callbacks

    def on_headers_complete(self) -> None:
        if self.receiver is not None and self.parser is not None:
            self.receiver.on_headers(self._read_at, self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self.receiver is not None:
            self.receiver.on_body(self._read_at, body)

    def on_message_complete(self) -> None:
        receiver, parser = self.receiver, self.parser
        self.receiver = self.parser = None
        if receiver is None or parser is None:
            return
        keep = parser.should_keep_alive()
        receiver.on_complete(self._read_at)
        if not keep or self.closed:
            self.close()
        elif self.streamed:
            self.pool.after_stream(self)
        else:
            self.pool.release(self)

    # ------------------------------------------------------------------ used by the runner

    def usable(self) -> bool:
        """Still open for a new request: not closing, and (plain TCP) nothing to read while idle,
        which would be the server's FIN or bytes nobody asked for. One poll(2) with no wait."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        return self._poll is None or not self._poll.poll(0)

    def send(self, receiver: Receiver, wire: bytes, streamed: bool = False) -> int:
        """Write a whole request; returns the clock reading taken after the bytes were written."""
        assert self.transport is not None and self.receiver is None
        self.receiver = receiver
        self.streamed = streamed
        self.parser = httptools.HttpResponseParser(self)
        self.transport.write(wire)
        return self.clock()

    def abort(self, error: ErrorClass, message: str) -> None:
        """Give up on the request in flight (timeout): report it and drop the connection."""
        self._fail(error, message)

    def close(self) -> None:
        self.closed = True
        self.on_probation = False  # our own close teaches nothing about the server
        self.pool.discard(self)
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: ErrorClass, message: str) -> None:
        receiver = self.receiver
        self.receiver = self.parser = None
        self.close()
        if receiver is not None:
            receiver.fail(self.clock(), error, message)


class _Probe:
    """A receiver that only waits for the answer (warm-up and keep-alive refresh)."""

    def __init__(self) -> None:
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_headers(self, at_ns: int, status: int) -> None:
        if not self.done.done():
            self.done.set_result(status)

    def on_body(self, at_ns: int, data: bytes) -> None:
        pass

    def on_complete(self, at_ns: int) -> None:
        pass

    def fail(self, at_ns: int, error: ErrorClass, message: str) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(message))


class Pool:
    """Idle keep-alive connections to one target; the send path only pops and pushes."""

    def __init__(
        self,
        target: Target,
        clock: Clock,
        headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.target = target
        self.clock = clock
        self.connect_timeout_s = connect_timeout_s
        self.idle: deque[Connection] = deque()
        self.opened = 0
        self.closes_after_stream: bool | None = None  # learned from the first streamed responses
        self._streams_kept = 0
        self._closed = False
        self._ssl = ssl.create_default_context() if target.tls else None
        self._probe = target.request_bytes("GET", "/v1/models", headers=headers)

    async def open(self) -> Connection:
        loop = asyncio.get_running_loop()
        connecting = loop.create_connection(
            lambda: Connection(self),
            self.target.host,
            self.target.port,
            ssl=self._ssl,
            server_hostname=self.target.host if self._ssl else None,
        )
        async with asyncio.timeout(self.connect_timeout_s):  # not wait_for: see _warm
            _, protocol = await connecting
        self.opened += 1
        return protocol

    async def fill(self, count: int) -> None:
        """Open up to `count` connections and push one small request through each, all before the run.

        A server may serve fewer connections at once than the run will use (llama-server's few HTTP
        threads: the others wait, unanswered, until a thread frees): once one has answered, the
        warm-up ends when WARM_STALL_S pass with no further answer, closing those still silent;
        sends open their own when they need more. Only when none answers is the target unreachable."""
        if count <= 0:
            return
        opened = await asyncio.gather(*(self.open() for _ in range(count)), return_exceptions=True)
        connections = [c for c in opened if isinstance(c, Connection)]
        warming = {spawn(self._warm(c), name="replay-warm"): c for c in connections}
        failure: BaseException | None = next((e for e in opened if isinstance(e, BaseException)), None)
        try:
            if warming:
                done: set[asyncio.Task[None]] = set()
                pending = set(warming)
                while pending:
                    answered = any(t.exception() is None for t in done)
                    more, pending = await asyncio.wait(
                        pending,
                        timeout=WARM_STALL_S if answered else None,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    if not more:
                        break  # none answered for WARM_STALL_S: the server serves no more at once
                    done |= more
                for task in pending:
                    task.cancel()
                    warming[task].close()
                failed = [t for t in done if t.exception() is not None]
                for task in failed:
                    warming[task].close()
                failure = failure or next((t.exception() for t in failed), None)
                if len(failed) < len(done):
                    return
        except BaseException:
            for task, connection in warming.items():
                task.cancel()
                connection.close()
            raise
        where = f"{self.target.host}:{self.target.port}"
        reason = f"{type(failure).__name__}: {failure}" if failure is not None else "no connection"
        raise TargetUnreachable(f"cannot open connections to {where}: {reason}")

    async def refresh(self, idle_for_ns: int, limit: int = 50) -> None:
        """Keep idle connections alive (servers close idle ones, uvicorn after 5 s) with a tiny GET;
        at most `limit` per call, the longest idle first, so a big pool adds little load."""
        now = self.clock()
        stale = sorted(
            (c for c in self.idle if now - c.idle_since >= idle_for_ns), key=lambda c: c.idle_since
        )
        for connection in stale[:limit]:
            with contextlib.suppress(ValueError):
                self.idle.remove(connection)
        alive = [c for c in stale[:limit] if c.usable()]
        for connection in set(stale[:limit]) - set(alive):
            connection.close()
        await asyncio.gather(*(self._warm(c) for c in alive), return_exceptions=True)

    async def _warm(self, connection: Connection) -> None:
        probe = _Probe()
        connection.send(probe, self._probe)
        # Not asyncio.wait_for: on Python 3.11 it loses a cancellation (Ctrl-C) that arrives as the
        # awaited future completes (python/cpython#86296), and the run would go on.
        async with asyncio.timeout(self.connect_timeout_s):
            await probe.done

    def acquire(self) -> Connection | None:
        """An idle connection the server has not closed (none: the caller opens one; nothing was
        written on a closed one, so no request is lost or sent twice)."""
        while self.idle:
            connection = self.idle.pop()
            if connection.usable():
                return connection
            connection.close()
        return None

    def after_stream(self, connection: Connection) -> None:
        """A connection that just ended a streamed response: handed out again, closed (the server
        does it anyway), or, while unknown, kept aside for STREAM_GRACE_S to see if the server does."""
        if self.closes_after_stream:
            connection.close()
            spawn(self.replace(), name="replay-reconnect")
        elif self.closes_after_stream is False:
            self.release(connection)
        else:
            connection.on_probation = True
            asyncio.get_running_loop().call_later(STREAM_GRACE_S, self._end_probation, connection)

    async def replace(self) -> None:
        """Open one connection in the place of one the server closes after each stream."""
        with contextlib.suppress(OSError):  # TimeoutError included; a send then opens its own
            self.release(await self.open())

    def _end_probation(self, connection: Connection) -> None:
        connection.on_probation = False
        if connection.closed:
            return
        self.learn_stream_close(closes=False)
        self.after_stream(connection)

    def learn_stream_close(self, closes: bool) -> None:
        if closes:
            self.closes_after_stream = True
        elif self.closes_after_stream is None:
            self._streams_kept += 1
            if self._streams_kept >= STREAMS_TO_TRUST:
                self.closes_after_stream = False

    def release(self, connection: Connection) -> None:
        """Idle again; closed instead once the pool is (a response, a grace or a reconnect that
        ends after the run would otherwise leave an open socket nobody hands out or closes)."""
        if self._closed:
            connection.close()
            return
        connection.idle_since = self.clock()
        self.idle.append(connection)

    def discard(self, connection: Connection) -> None:
        if self.idle and connection in self.idle:
            self.idle.remove(connection)

    def close(self) -> None:
        self._closed = True
        while self.idle:
            self.idle.pop().close()
