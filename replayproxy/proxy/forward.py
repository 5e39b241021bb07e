"""The forwarding path's shared context and its client-side I/O seam.

`Forwarder` holds what every connection of one listener shares (settings as limits, the upstream
pool, the observer, counters) and runs the timer: every `TICK_S` the server calls `run_tick`, which
hands the tick to each client side and so to each exchange, so no clock or timer is touched per
chunk. `ClientProtocol` is the asyncio protocol that feeds a `ClientSide` and is its `Link`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import ssl
from urllib.parse import urlsplit

from replayproxy.proxy import http1
from replayproxy.proxy.client import ClientSide
from replayproxy.proxy.exchange import Exchange, Limits
from replayproxy.proxy.heads import Upstream
from replayproxy.proxy.metrics import HotCounters
from replayproxy.proxy.observe import Observer, RateLimitedLog, guarded
from replayproxy.proxy.settings import ProxySettings
from replayproxy.proxy.upstream import UpstreamPool
from replayproxy.shape import ErrorClass

TICK_S = 0.05


def ticks(seconds: float) -> int:
    return math.ceil(seconds / TICK_S)


def limits_of(settings: ProxySettings) -> Limits:
    return Limits(
        header_ticks=ticks(settings.client_header_timeout_s),
        connect_ticks=ticks(settings.connect_timeout_s),
        first_byte_ticks=ticks(settings.first_byte_timeout_s),
        idle_ticks=ticks(settings.idle_timeout_s),
        total_ticks=ticks(settings.total_timeout_s) if settings.total_timeout_s else 0,
        inject_usage=settings.inject_usage,
        max_buffered_body_bytes=settings.max_buffered_body_bytes,
        max_captured_response_bytes=settings.max_captured_response_bytes,
        max_response_head_bytes=settings.max_response_head_bytes,
    )


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
        self.limits = limits_of(settings)
        self.max_request_head_bytes = settings.max_request_head_bytes
        parts = urlsplit(settings.upstream)
        tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.upstream = Upstream(parts.path.rstrip("/").encode("latin-1"), parts.netloc.encode("latin-1"))
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
        self.clients: set[ClientProtocol] = set()
        self._xff = settings.forwarded_headers in ("x-forwarded-for", "both")
        self._fwd = settings.forwarded_headers in ("forwarded", "both")
        self._keepalive_ticks = ticks(settings.client_keepalive_s)

    def protocol(self) -> ClientProtocol:
        return ClientProtocol(self)

    # ------------------------------------------------------------------ used by exchanges

    def observer_wants(self, endpoint: str) -> bool:
        observer = self.observer
        if observer is None:
            return False
        wanted: list[bool] = []
        guarded(lambda: wanted.append(observer.wants(endpoint)), self._observer_failed, self.log)
        return bool(wanted and wanted[0])

    def exchange_started(self, exchange: Exchange) -> None:
        self.exchanges.add(exchange)

    def exchange_finished(self, exchange: Exchange) -> None:
        self.exchanges.discard(exchange)
        status = exchange.status
        key = (exchange.endpoint, f"{status // 100}xx" if status else "none")
        requests = self.hot.requests
        requests[key] = requests.get(key, 0) + 1
        cap, observer = exchange.cap, self.observer
        if cap is not None and observer is not None:
            guarded(lambda: observer.finished(cap), self._observer_failed, self.log)

    def count_upstream_error(self, error: ErrorClass) -> None:
        errors = self.hot.upstream_errors
        errors[error] = errors.get(error, 0) + 1

    def count_cancel(self) -> None:
        self.hot.client_cancels += 1

    def forwarded_fields(self, peer: bytes | None) -> http1.Headers:
        fields: http1.Headers = []
        if peer is None:
            return fields
        if self._xff:
            fields.append((b"X-Forwarded-For", peer))
        if self._fwd:
            node = b'"[%b]"' % peer if b":" in peer else peer
            fields.append((b"Forwarded", b"for=" + node))
        return fields

    def _observer_failed(self, kind: str) -> None:
        if callable(self._count_error):
            self._count_error(kind)

    # ------------------------------------------------------------------ timer

    def run_tick(self) -> None:
        """Advance the clock one tick; each exchange enforces its own deadlines. A failure in one
        connection's timer is logged (rate-limited) and that connection closed: the others go on."""
        self.tick += 1
        tick, keepalive = self.tick, self._keepalive_ticks
        for client in list(self.clients):
            try:
                client.side.tick(tick, keepalive)
            except Exception as e:  # noqa: BLE001 — a bug in one exchange must not stop every timer
                self.log("timer", f"timer failed: {type(e).__name__}: {e}; its connection was closed")
                client.abort()
        self.pool.close_idle(tick - ticks(self.settings.upstream_keepalive_s))

    def drain(self) -> None:
        """Stop keeping connections alive: idle clients are closed now, busy ones after their response."""
        self.draining = True
        for client in list(self.clients):
            if not client.side.queue:
                client.close()
        self.pool.close_idle()


class ClientProtocol(asyncio.Protocol):
    """The socket of one client connection: bytes to its `ClientSide`, and its `Link` back."""

    __slots__ = ("ctx", "transport", "side")

    def __init__(self, ctx: Forwarder) -> None:
        self.ctx = ctx
        self.transport: asyncio.Transport | None = None
        self.side = ClientSide(ctx, self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        self.side.send = transport.write  # type: ignore[attr-defined]  # a WriteTransport's
        self.ctx.clients.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ctx.settings.forwarded_headers != "none":
            peer = transport.get_extra_info("peername")
            self.side.peer = str(peer[0]).encode() if isinstance(peer, tuple) else None

    def data_received(self, data: bytes) -> None:
        self.side.feed(data)

    def eof_received(self) -> bool:
        return False  # like nginx: a client that stops sending has gone; connection_lost cancels

    def connection_lost(self, exc: Exception | None) -> None:
        self.ctx.clients.discard(self)
        self.side.lost()

    def pause_writing(self) -> None:
        self.side.write_paused(True)

    def resume_writing(self) -> None:
        self.side.write_paused(False)

    # ------------------------------------------------------------------ Link

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def pause(self, paused: bool) -> None:
        if self.transport is not None:
            (self.transport.pause_reading if paused else self.transport.resume_reading)()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
