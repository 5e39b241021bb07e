"""Upstream side of the forwarding path: keep-alive connections and the pool that lends them out.

An `UpstreamConnection` only moves bytes; the exchange that borrowed it parses the response. The
pool keeps idle connections most-recently-used first (the freshest is least likely to have been
closed by the server's own keep-alive timer), never lends one whose close is already waiting in
the kernel (`stale`: a request written there could not be proven unread, so it could not be
resent), and bounds the number of open connections; requests beyond the bound wait for a
release, a loss, or their connect timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
from collections import deque

from replayproxy.proxy.seam import Borrower, UpstreamLink
from replayproxy.shape import ErrorClass
from replayproxy.tasks import spawn


class UpstreamConnection(asyncio.Protocol):
    """The socket of one upstream connection, and the exchange's `UpstreamLink` to it."""

    __slots__ = ("pool", "transport", "borrower", "idle_tick", "lost", "poll", "on_probation")

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.borrower: Borrower | None = None
        self.idle_tick = 0
        self.lost = False
        self.poll: select.poll | None = None  # the transport's TCP socket, for `stale`; None: not one
        self.on_probation = False  # just ended a stream, while the pool learns whether the server closes it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.poll = select.poll()
            self.poll.register(sock.fileno(), select.POLLIN | select.POLLRDHUP)

    def stale(self) -> bool:
        """The server closed this idle connection (its FIN or RST waits unread) or wrote to it
        unasked, and the loop has not read that yet. Polling takes nothing: a live connection is
        left as it was. A request written to a stale connection may or may not have been read, so
        it could never be resent: the pool lends a fresh connection instead."""
        transport = self.transport
        if self.lost or transport is None or transport.is_closing():
            return True
        # One poll(2) with no wait: readable on an idle connection is the server's FIN or bytes
        # nobody asked for, POLLRDHUP its half-close, POLLHUP / POLLERR a reset. (A socket object
        # made over the descriptor to peek with MSG_PEEK added a quarter to forwarding's CPU.)
        return self.poll is not None and bool(self.poll.poll(0))

    def data_received(self, data: bytes) -> None:
        borrower = self.borrower
        if borrower is None:  # an idle connection must stay silent; anything else is a broken peer
            self.close()
            return
        borrower.upstream_data(data)

    def eof_received(self) -> bool:
        return False  # close; connection_lost tells the borrower

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        borrower, self.borrower = self.borrower, None
        self.pool.lost(self)
        if borrower is not None:
            borrower.upstream_lost()

    def pause_writing(self) -> None:
        if self.borrower is not None:
            self.borrower.upstream_pause(True)

    def resume_writing(self) -> None:
        if self.borrower is not None:
            self.borrower.upstream_pause(False)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        """Abort: the engine sees the connection go at once and frees the request's slot."""
        self.borrower = None
        if self.transport is not None:
            self.transport.abort()

    def pause(self, paused: bool) -> None:
        if self.transport is not None and not self.lost:
            (self.transport.pause_reading if paused else self.transport.resume_reading)()


STREAM_GRACE_S = 0.01  # a connection that just ended a stream waits this long while the pool learns
STREAMS_TO_TRUST = 3  # ...whether the server closes such connections; kept this many times: it does not


class UpstreamPool:
    """Lends connections to one upstream (host, port); every method runs on the event loop.

    Some servers close a connection right after each streamed response while advertising keep-alive
    (a default llama-server, microseconds after its last chunk). A request written in that gap is
    lost and, written once, can never be resent (at most once): so the pool learns from the first
    streams. Until it knows, a connection that just ended a stream rests STREAM_GRACE_S before it is
    lent again; closed by the server in that time, it teaches that the server always does, and from
    then on such connections are closed here at once, the next request going on a fresh one.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        connect_timeout_s: float,
        max_connections: int,
        max_idle: int,
    ) -> None:
        self.host = host
        self.port = port
        self._tls = tls
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._max_idle = max_idle
        self.idle: list[UpstreamConnection] = []
        self.open = 0  # connected or connecting
        self.waiting: deque[Borrower] = deque()
        self.closes_after_stream: bool | None = None  # learned from the first streamed responses
        self._streams_kept = 0
        self._resting: list[UpstreamConnection] = []

    def acquire(self, borrower: Borrower) -> None:
        """Lend a connection now if one is idle, else connect, else queue the borrower."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.stale():
                self._lend(conn, borrower)
                return
            conn.close()  # its connection_lost (now or on the next turn of the loop) frees its slot
        if self.open < self._max_connections:
            self.open += 1
            spawn(self._connect(borrower), name="upstream-connect")
        else:
            self.waiting.append(borrower)

    def forget(self, borrower: Borrower) -> None:
        """A waiting borrower gave up (client gone, timeout)."""
        with contextlib.suppress(ValueError):
            self.waiting.remove(borrower)

    def release(self, conn: UpstreamLink, reusable: bool, tick: int, streamed: bool = False) -> None:
        assert isinstance(conn, UpstreamConnection)
        conn.borrower = None
        if not reusable or conn.lost or (streamed and self.closes_after_stream):
            conn.close()
            return
        if streamed and self.closes_after_stream is None:
            conn.on_probation, conn.idle_tick = True, tick
            self._resting.append(conn)
            asyncio.get_running_loop().call_later(STREAM_GRACE_S, self._rested, conn)
            return
        if self.waiting:
            self._lend(conn, self.waiting.popleft())
        elif len(self.idle) < self._max_idle:
            conn.idle_tick = tick
            self.idle.append(conn)
        else:
            conn.close()

    def lost(self, conn: UpstreamConnection) -> None:
        self.open -= 1
        if conn.on_probation:  # the server closed it right after a stream: it always will
            conn.on_probation = False
            self.closes_after_stream = True
            self._resting.remove(conn)
        if conn in self.idle:
            self.idle.remove(conn)
        if self.waiting and self.open < self._max_connections:
            self.open += 1
            spawn(self._connect(self.waiting.popleft()), name="upstream-connect")

    def _rested(self, conn: UpstreamConnection) -> None:
        if not conn.on_probation:
            return  # lost meanwhile (and learned from), or closed with the pool
        conn.on_probation = False
        self._resting.remove(conn)
        if self.closes_after_stream is None:
            self._streams_kept += 1
            if self._streams_kept >= STREAMS_TO_TRUST:
                self.closes_after_stream = False
        self.release(conn, True, conn.idle_tick)

    def close_idle(self, older_than_tick: int | None = None) -> None:
        """Close idle connections last used before `older_than_tick` (all when None); resting ones
        only with all."""
        if older_than_tick is None:
            resting, self._resting = self._resting, []
            for conn in resting:
                conn.on_probation = False
                conn.close()
        keep = [c for c in self.idle if older_than_tick is not None and c.idle_tick >= older_than_tick]
        for conn in self.idle:
            if conn not in keep:
                conn.close()
        self.idle = keep

    def _lend(self, conn: UpstreamConnection, borrower: Borrower) -> None:
        conn.borrower = borrower
        borrower.upstream_ready(conn)

    async def _connect(self, borrower: Borrower) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: UpstreamConnection(self),
                    self.host,
                    self.port,
                    ssl=self._tls,
                    server_hostname=self.host if self._tls else None,
                )
        except TimeoutError:
            self._failed(borrower, "timeout")
        except (OSError, ssl.SSLError):
            self._failed(borrower, "connect")
        else:
            self._lend(conn, borrower)

    def _failed(self, borrower: Borrower, error: ErrorClass) -> None:
        self.open -= 1
        borrower.upstream_failed(error)
        if self.waiting and self.open < self._max_connections:
            self.open += 1
            spawn(self._connect(self.waiting.popleft()), name="upstream-connect")
