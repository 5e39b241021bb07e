"""Client side of the forwarding path: one protocol per client connection, and the shared context.

The request parser runs over every byte the client sends; each request becomes an `Exchange`.
Pipelined requests queue behind the active one (never interleaved), keep-alive is honoured on
both sides, and a client that goes away cancels its exchange at once. Timeouts are enforced by
`Forwarder.tick`, run every `TICK_S` by the server, so no clock or timer is touched per chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import ssl
from collections import deque
from urllib.parse import urlsplit

import httptools

from replayproxy.proxy import http1
from replayproxy.proxy.exchange import Exchange
from replayproxy.proxy.metrics import HotCounters
from replayproxy.proxy.observe import Observer, RateLimitedLog, guarded
from replayproxy.proxy.settings import ProxySettings
from replayproxy.proxy.upstream import UpstreamPool

TICK_S = 0.05
_MAX_QUEUED = 4  # pipelined requests read ahead before reading pauses


class _HeadTooLarge(Exception):
    pass


class Forwarder:
    """State shared by all connections of one listener: settings, the upstream pool, observers."""

    def __init__(
        self,
        settings: ProxySettings,
        hot: HotCounters,
        observer: Observer | None = None,
        count_error: object = None,
    ) -> None:
        self.settings = settings
        parts = urlsplit(settings.upstream)
        tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.upstream_prefix = parts.path.rstrip("/").encode("latin-1")
        self.upstream_host = parts.netloc.encode("latin-1")
        self.pool = UpstreamPool(
            parts.hostname or "",
            parts.port or (443 if tls else 80),
            tls=tls,
            connect_timeout_s=settings.connect_timeout_s,
            max_connections=settings.max_upstream_connections,
            max_idle=settings.max_idle_upstream_connections,
        )
        self.hot = hot
        hot.in_flight = lambda: len(self.exchanges)
        hot.upstream_connections = lambda: self.pool.open
        self.observer = observer
        self.log = RateLimitedLog(settings.log_interval_s)
        self._count_error = count_error
        self.tick = 0
        self.draining = False
        self.exchanges: set[Exchange] = set()
        self.clients: set[ClientConnection] = set()
        self._xff = settings.forwarded_headers in ("x-forwarded-for", "both")
        self._fwd = settings.forwarded_headers in ("forwarded", "both")

    def protocol(self) -> ClientConnection:
        return ClientConnection(self)

    # ------------------------------------------------------------------ used by exchanges

    def observer_wants(self, endpoint: str) -> bool:
        observer = self.observer
        wanted: list[bool] = []
        if observer is not None:
            guarded(lambda: wanted.append(observer.wants(endpoint)), self._observer_failed, self.log)
        return bool(wanted and wanted[0])

    def exchange_finished(self, exchange: Exchange) -> None:
        self.exchanges.discard(exchange)
        status = exchange.status
        key = (exchange.endpoint, f"{status // 100}xx" if status else "none")
        requests = self.hot.requests
        requests[key] = requests.get(key, 0) + 1
        cap, observer = exchange.cap, self.observer
        if cap is not None and observer is not None:
            guarded(lambda: observer.finished(cap), self._observer_failed, self.log)

    def count_upstream_error(self, error: str) -> None:
        errors = self.hot.upstream_errors
        errors[error] = errors.get(error, 0) + 1

    def count_cancel(self) -> None:
        self.hot.client_cancels += 1

    def forwarded_fields(self, client: ClientConnection) -> http1.Headers:
        fields: http1.Headers = []
        if client.peer is None:
            return fields
        if self._xff:
            fields.append((b"X-Forwarded-For", client.peer))
        if self._fwd:
            node = b'"[%b]"' % client.peer if b":" in client.peer else client.peer
            fields.append((b"Forwarded", b"for=" + node))
        return fields

    def _observer_failed(self, kind: str) -> None:
        if callable(self._count_error):
            self._count_error(kind)

    # ------------------------------------------------------------------ timeouts

    def run_tick(self) -> None:
        """Enforce every timeout; called every TICK_S by the server."""
        self.tick += 1
        tick, s = self.tick, self.settings
        connect, first_byte = _ticks(s.connect_timeout_s), _ticks(s.first_byte_timeout_s)
        idle, total = _ticks(s.idle_timeout_s), _ticks(s.total_timeout_s) if s.total_timeout_s else 0
        for ex in list(self.exchanges):
            if ex.done:
                continue
            if ex.method == b"":  # head still arriving
                if tick - ex.start_tick > _ticks(s.client_header_timeout_s):
                    ex.client.close_now()
                continue
            if not ex.active:
                continue
            if total and tick - ex.start_tick > total:
                ex.upstream_failed("timeout")
            elif ex.upstream is None and not ex.head_sent:
                if tick - ex.active_tick > connect:
                    ex.upstream_failed("timeout")
            elif not ex.head_sent:
                if ex.sent and tick - ex.sent_tick > first_byte:
                    ex.upstream_failed("timeout")
            elif ex.upstream is not None:
                if ex.upstream.activity != ex.seen_activity:
                    ex.seen_activity, ex.active_tick = ex.upstream.activity, tick
                elif tick - ex.active_tick > idle:
                    ex.upstream_failed("timeout")
        keepalive = _ticks(s.client_keepalive_s)
        for client in list(self.clients):
            if not client.queue and tick - client.idle_tick > keepalive:
                client.close_now()
        self.pool.close_idle(tick - _ticks(s.upstream_keepalive_s))

    def drain(self) -> None:
        """Stop keeping connections alive: idle clients are closed now, busy ones after their response."""
        self.draining = True
        for client in list(self.clients):
            if not client.queue:
                client.close_now()
        self.pool.close_idle()


def _ticks(seconds: float) -> int:
    return math.ceil(seconds / TICK_S)


class ClientConnection(asyncio.Protocol):
    __slots__ = (
        "ctx",
        "transport",
        "parser",
        "queue",
        "parsing",
        "closing",
        "idle_tick",
        "peer",
        "paused",
        "feeding",
    )

    def __init__(self, ctx: Forwarder) -> None:
        self.ctx = ctx
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Exchange] = deque()  # the active exchange first, then pipelined ones
        self.parsing: Exchange | None = None
        self.closing = False
        self.idle_tick = ctx.tick
        self.peer: bytes | None = None
        self.paused = False
        self.feeding = False  # inside parser.feed_data: upstream writes wait for the end of the read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        self.ctx.clients.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ctx.settings.forwarded_headers != "none":
            peer = transport.get_extra_info("peername")
            self.peer = str(peer[0]).encode() if isinstance(peer, tuple) else None

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.feeding = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:  # Upgrade is hop-by-hop and not forwarded
            self.parser = httptools.HttpRequestParser(self)
            rest = data[e.args[0] :] if e.args and isinstance(e.args[0], int) else b""
            if rest:
                self.data_received(rest)
                return
        except httptools.HttpParserError as e:
            self._reject(431 if isinstance(e.__context__, _HeadTooLarge) else 400)
            return
        finally:
            self.feeding = False
        if self.queue:
            self.queue[0].flush_up()

    def eof_received(self) -> bool:
        return False  # like nginx: a client that stops sending has gone; connection_lost cancels

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.ctx.clients.discard(self)
        for ex in list(self.queue):
            ex.client_gone()
        for ex in list(self.queue):  # never started: nothing upstream to cancel
            self.ctx.exchanges.discard(ex)
        self.queue.clear()

    def pause_writing(self) -> None:
        self._pause_upstream(True)

    def resume_writing(self) -> None:
        self._pause_upstream(False)

    def _pause_upstream(self, paused: bool) -> None:
        if self.queue and self.queue[0].upstream is not None:
            transport = self.queue[0].upstream.transport
            if transport is not None:
                (transport.pause_reading if paused else transport.resume_reading)()

    # ------------------------------------------------------------------ request parser callbacks

    def on_message_begin(self) -> None:
        ex = Exchange(self.ctx, self)
        self.parsing = ex
        self.queue.append(ex)
        self.ctx.exchanges.add(ex)
        if len(self.queue) > _MAX_QUEUED:
            self.pause_reading(True)

    def on_url(self, url: bytes) -> None:
        ex = self.parsing
        assert ex is not None
        ex.target += url
        ex.head_bytes += len(url)
        if ex.head_bytes > self.ctx.settings.max_request_head_bytes:
            raise _HeadTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.parsing
        assert ex is not None
        ex.headers.append((name, value))
        ex.head_bytes += len(name) + len(value) + 4
        if ex.head_bytes > self.ctx.settings.max_request_head_bytes:
            raise _HeadTooLarge

    def on_headers_complete(self) -> None:
        ex = self.parsing
        assert ex is not None
        parser = self.parser
        method = parser.get_method()
        if method == b"CONNECT":
            raise httptools.HttpParserError("CONNECT is not forwarded")
        ex.request_head(method, parser.get_http_version(), parser.should_keep_alive())
        if ex is self.queue[0]:
            ex.start()

    def on_body(self, piece: bytes) -> None:
        if self.parsing is not None:
            self.parsing.request_body(piece)

    def on_message_complete(self) -> None:
        ex, self.parsing = self.parsing, None
        if ex is not None and not ex.done:
            ex.request_complete()

    # ------------------------------------------------------------------ used by exchanges

    def write(self, data: bytes) -> None:
        if not self.closing and self.transport is not None:
            self.transport.write(data)

    def pause_reading(self, paused: bool) -> None:
        if self.closing or self.transport is None or paused == self.paused:
            return
        self.paused = paused
        (self.transport.pause_reading if paused else self.transport.resume_reading)()

    def exchange_done(self, ex: Exchange) -> None:
        if ex in self.queue:
            self.queue.remove(ex)
        if self.closing:
            return
        if ex.close_after or (ex.reading_body and not ex.request_done):
            self.close_now()
            return
        if len(self.queue) <= 1:
            self.pause_reading(False)
        if self.queue:
            nxt = self.queue[0]
            if nxt.method and not nxt.active:
                nxt.start()
        else:
            self.idle_tick = self.ctx.tick
            if self.ctx.draining:
                self.close_now()

    def close_now(self) -> None:
        """Close after pending writes; exchanges still queued are cancelled by connection_lost."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _reject(self, status: int) -> None:
        if not any(ex.head_sent for ex in self.queue):
            self.write(http1.error_response(status, close=True))
        self.close_now()
        self.closing = True
