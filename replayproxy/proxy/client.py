"""One client connection without its socket: request bytes in, exchanges out, answers in order.

The request parser runs over every byte the client sends; each request becomes an `Exchange`.
Pipelined requests queue behind the active one (never interleaved). Bytes after a request with
`Connection: close` are discarded (RFC 9112 §9.6) and that request is answered. A request offering
`Upgrade` without a body holds what follows until its answer: a 101 makes the connection a tunnel,
anything else resumes HTTP. A request with both a body and `Upgrade` is an ordinary request: llhttp
stops at its head, so its body is read on with a parser primed by a head of the same framing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

import httptools

from replayproxy.proxy import http1
from replayproxy.proxy.exchange import Context, Exchange, State
from replayproxy.proxy.heads import BadTarget
from replayproxy.proxy.seam import Link

MAX_QUEUED = 4  # pipelined requests read ahead before reading pauses


class _HeadTooLarge(Exception):
    pass


class ClientContext(Context, Protocol):
    """What a client side needs beyond what its exchanges need."""

    max_request_head_bytes: int

    def exchange_started(self, exchange: Exchange) -> None: ...


class ClientSide:
    """Sans-I/O state of one client connection; the asyncio protocol feeds it and gives it a `Link`."""

    __slots__ = (
        "ctx", "link", "send", "peer", "parser", "queue", "parsing", "head_bytes", "closing", "paused",
        "feeding", "idle_tick", "ended", "held", "tunnel", "body_after_upgrade", "priming",
    )  # fmt: skip

    def __init__(self, ctx: ClientContext, link: Link, peer: bytes | None = None) -> None:
        self.ctx = ctx
        self.link = link
        self.send: Callable[[bytes], None] = link.write  # the protocol puts its transport's write here
        self.peer = peer
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Exchange] = deque()  # the active exchange first, then pipelined ones
        self.parsing: Exchange | None = None
        self.head_bytes = 0
        self.closing = False
        self.paused = False
        self.feeding = False  # inside parser.feed_data: upstream writes wait for the end of the read
        self.idle_tick = ctx.tick
        self.ended = False  # a request said Connection: close; later bytes are discarded
        self.held: list[bytes] | None = None  # bytes after an Upgrade offer, until its answer
        self.tunnel: Exchange | None = None  # switched protocols: bytes go to this exchange untouched
        self.body_after_upgrade = False  # llhttp stopped at the head of a request that has a body
        self.priming = False  # the parser is reading the framing head it was primed with

    # ------------------------------------------------------------------ events from the socket

    def feed(self, data: bytes) -> None:
        if self.closing:
            return
        if self.tunnel is not None:
            self.tunnel.tunnel_up(data)
            return
        if self.held is not None:
            self.held.append(data)
            return
        if self.ended:
            return
        self.feeding = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            offset = e.args[0] if e.args and isinstance(e.args[0], int) else len(data)
            self.feeding = False
            self._after_upgrade_head(data[offset:])
            return
        except httptools.HttpParserError as e:
            if not self.ended:  # after Connection: close, llhttp refuses the rest: it is discarded
                self._reject(431 if isinstance(e.__context__, _HeadTooLarge) else 400)
                return
        finally:
            self.feeding = False
        if self.queue:
            self.queue[0].flush_up()

    def _after_upgrade_head(self, rest: bytes) -> None:
        self.parser = httptools.HttpRequestParser(self)
        if self.body_after_upgrade:
            self.body_after_upgrade = False
            ex = self.parsing
            assert ex is not None
            length = b"%d" % (ex.req_length or 0)
            framing = b"Transfer-Encoding: chunked" if ex.req_chunked else b"Content-Length: " + length
            self.priming = True
            self.parser.feed_data(b"POST / HTTP/1.1\r\n%b\r\n\r\n" % framing)
            self.feed(rest)
            return
        if self.queue and self.queue[-1].upgrade and self.queue[-1].state is not State.DONE:
            self.held = [rest]
            self.pause_reading(True)
        elif rest:
            self.feed(rest)
        elif self.queue:
            self.queue[0].flush_up()

    def write_paused(self, paused: bool) -> None:
        """The socket's send buffer filled (or drained): hold (or resume) the upstream's reads."""
        if self.queue:
            self.queue[0].client_paused(paused)

    def lost(self) -> None:
        self.closing = True
        for ex in list(self.queue):
            ex.client_gone()
        self.queue.clear()

    def tick(self, now: int, keepalive_ticks: int) -> None:
        for ex in list(self.queue):
            ex.tick(now)
        if not self.queue and now - self.idle_tick > keepalive_ticks:
            self.close()

    # ------------------------------------------------------------------ request parser callbacks

    def on_message_begin(self) -> None:
        if self.priming:
            return
        ex = Exchange(self.ctx, self)
        self.parsing = ex
        self.head_bytes = 0
        self.queue.append(ex)
        self.ctx.exchange_started(ex)
        if len(self.queue) > MAX_QUEUED:
            self.pause_reading(True)

    def on_url(self, url: bytes) -> None:
        if self.priming:
            return
        ex = self.parsing
        assert ex is not None
        ex.target += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.priming:
            return
        ex = self.parsing
        assert ex is not None
        ex.headers.append((name, value))
        self._count_head(len(name) + len(value) + 4)

    def _count_head(self, size: int) -> None:
        self.head_bytes += size
        if self.head_bytes > self.ctx.max_request_head_bytes:
            raise _HeadTooLarge

    def on_headers_complete(self) -> None:
        if self.priming:
            self.priming = False
            return
        ex = self.parsing
        assert ex is not None
        parser = self.parser
        method = parser.get_method()
        if method == b"CONNECT":
            raise httptools.HttpParserError("CONNECT is not forwarded")
        upgrade = parser.should_upgrade()
        try:
            ex.request_head(method, parser.get_http_version(), parser.should_keep_alive(), upgrade)
        except BadTarget as e:
            raise httptools.HttpParserError(str(e)) from e
        self.body_after_upgrade = upgrade and (ex.req_chunked or bool(ex.req_length))
        if ex is self.queue[0]:
            ex.start()

    def on_body(self, piece: bytes) -> None:
        if self.parsing is not None:
            self.parsing.request_body(piece)

    def on_message_complete(self) -> None:
        if self.body_after_upgrade:  # llhttp's end of the head, not of the request: its body follows
            return
        ex, self.parsing = self.parsing, None
        if ex is None:
            return
        if not ex.client_keep_alive:
            self.ended = True
        if ex.state is not State.DONE:
            ex.request_complete()

    # ------------------------------------------------------------------ used by exchanges

    def write(self, data: bytes) -> None:
        if not self.closing:
            self.link.write(data)

    def close(self) -> None:
        """Close after pending writes; exchanges still queued are cancelled when the loss is reported."""
        self.link.close()

    def pause_reading(self, paused: bool) -> None:
        if self.closing or paused == self.paused:
            return
        self.paused = paused
        self.link.pause(paused)

    def upgrade_answered(self, exchange: Exchange, switched: bool) -> None:
        held, self.held = self.held or [], None
        if switched:
            self.tunnel = exchange
            self.pause_reading(False)
            if held:
                exchange.tunnel_up(b"".join(held))
            return
        self.pause_reading(len(self.queue) > MAX_QUEUED)
        if held:
            self.feed(b"".join(held))

    def exchange_done(self, ex: Exchange) -> None:
        if ex in self.queue:
            self.queue.remove(ex)
        if self.closing:
            return
        if ex.close_after or not ex.request_done or (self.ended and not self.queue):
            self.close()
            return
        if len(self.queue) <= MAX_QUEUED and self.held is None:
            self.pause_reading(False)
        if self.queue:
            nxt = self.queue[0]
            if nxt.state is State.QUEUED:
                nxt.start()
        else:
            self.idle_tick = self.ctx.tick
            if self.ctx.draining:
                self.close()

    def _reject(self, status: int) -> None:
        if not any(ex.responding for ex in self.queue):
            self.write(http1.error_response(status, close=True))
        self.close()
        self.closing = True
