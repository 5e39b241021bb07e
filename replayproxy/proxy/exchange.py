"""One request/response pair on the forwarding path: THE hot path (DESIGN.md, Performance budgets).

Bytes move as they arrive: the request head is rebuilt without hop-by-hop fields, body pieces
go upstream as read, and every upstream read becomes one client write. httptools (llhttp) only
finds message boundaries; nothing is parsed beyond that unless an observer asked for a capture,
and even then the capture only keeps references. Failures map like nginx's: 502/504 before the
response head, a cut stream after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httptools

from replayproxy.clock import now_ns
from replayproxy.proxy import http1
from replayproxy.proxy.observe import Capture
from replayproxy.proxy.upstream import UpstreamConnection
from replayproxy.proxy.usage import UsageStripper, inject

if TYPE_CHECKING:
    from replayproxy.proxy.forward import ClientConnection, Forwarder

_RETRY_KEEP_BYTES = 1 << 20  # request bytes kept to resend once if a reused connection was stale
_INJECTABLE = ("chat", "completions")
_DROP_REQUEST = frozenset({b"expect"})


def endpoint_of(method: bytes, path: bytes) -> str:
    """Endpoint class from the path's tail, so any prefix before /v1/... is accepted."""
    if method == b"POST":
        if path.endswith(b"/chat/completions"):
            return "chat"
        if path.endswith(b"/completions"):
            return "completions"
        if path.endswith(b"/embeddings"):
            return "embeddings"
    return "other"


def _is_event_stream(headers: http1.Headers) -> bool:
    content_type = http1.header_value(headers, b"content-type") or b""
    return content_type.lower().startswith(b"text/event-stream")


class Exchange:
    """Created by the client connection at a request's first byte; lives until the response ends."""

    __slots__ = (
        "ctx",
        "client",
        "target",
        "headers",
        "head_bytes",
        "method",
        "version",
        "client_keep_alive",
        "endpoint",
        "cap",
        "buffering",
        "body",
        "body_bytes",
        "req_length",
        "req_chunked",
        "request_done",
        "upstream",
        "out_up",
        "sent_log",
        "sent_bytes",
        "sent",
        "retried",
        "parser",
        "reason",
        "resp_headers",
        "status",
        "interim",
        "head_sent",
        "chunked_out",
        "close_after",
        "upstream_keep_alive",
        "strip",
        "out",
        "done",
        "start_tick",
        "sent_tick",
        "head_tick",
        "seen_activity",
        "active_tick",
        "active",
        "reading_body",
        "reused",
        "got_response",
    )

    def __init__(self, ctx: Forwarder, client: ClientConnection) -> None:
        self.ctx = ctx
        self.client = client
        self.target = b""
        self.headers: http1.Headers = []
        self.head_bytes = 0
        self.method = b""
        self.version = b"1.1"
        self.client_keep_alive = True
        self.endpoint = "other"
        self.cap: Capture | None = None
        self.buffering = False  # hold the body until complete (usage injection needs all of it)
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.req_length: int | None = None
        self.req_chunked = False
        self.request_done = False
        self.upstream: UpstreamConnection | None = None
        self.out_up: list[bytes] = []  # bytes for upstream not written yet
        self.sent_log: list[bytes] | None = []  # everything written upstream, for one retry
        self.sent_bytes = 0
        self.sent = False
        self.retried = False
        self.parser: httptools.HttpResponseParser | None = None
        self.reason = b""
        self.resp_headers: http1.Headers = []
        self.status = 0
        self.interim = False
        self.head_sent = False
        self.chunked_out = False
        self.close_after = False
        self.upstream_keep_alive = False
        self.strip: UsageStripper | None = None
        self.out: list[bytes] = []  # bytes for the client, written after each upstream read
        self.done = False
        self.start_tick = ctx.tick
        self.sent_tick = -1
        self.head_tick = -1
        self.seen_activity = -1
        self.active_tick = ctx.tick
        self.active = False  # first in its connection's queue: may talk to the upstream
        self.reading_body = True
        self.reused = False  # the upstream connection had served requests before
        self.got_response = False

    # ------------------------------------------------------------------ request side

    def request_head(self, method: bytes, version: str, keep_alive: bool) -> None:
        ctx = self.ctx
        self.method = method
        self.version = b"1.0" if version == "1.0" else b"1.1"
        self.client_keep_alive = keep_alive
        path = self.target.partition(b"?")[0]
        self.endpoint = endpoint_of(method, path)
        length = http1.header_value(self.headers, b"content-length")
        self.req_length = int(length) if length is not None else None
        self.req_chunked = http1.is_chunked(self.headers)
        expect = http1.header_value(self.headers, b"expect")
        if expect is not None and expect.lower() == b"100-continue" and self.version == b"1.1":
            self.client.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # like nginx: answer it here, drop Expect
        observer = ctx.observer
        if observer is not None and ctx.observer_wants(self.endpoint):
            self.cap = Capture(
                now_ns(),
                self.endpoint,
                method.decode("latin-1"),
                path.decode("latin-1"),
                limit_bytes=ctx.settings.max_captured_response_bytes,
            )
            self.buffering = (
                ctx.settings.inject_usage
                and self.endpoint in _INJECTABLE
                and (self.req_length is None or self.req_length <= ctx.settings.max_buffered_body_bytes)
            )
        if not self.buffering:
            self._queue_up(self._request_head_bytes(self.req_length if not self.req_chunked else None))
        self.active_tick = ctx.tick

    def _request_head_bytes(self, length: int | None) -> bytes:
        ctx = self.ctx
        target = self.target
        if target[:1] != b"/" and target != b"*":  # absolute-form: keep only path and query
            scheme_end = target.find(b"://")
            slash = target.find(b"/", scheme_end + 3) if scheme_end >= 0 else -1
            target = target[slash:] if slash >= 0 else b"/"
        extra = ctx.forwarded_fields(self.client)
        if http1.header_value(self.headers, b"host") is None:
            extra.append((b"Host", ctx.upstream_host))
        framing: http1.Headers = []
        if length is not None:
            framing.append((b"Content-Length", b"%d" % length))
        elif self.req_chunked:
            framing.append((b"Transfer-Encoding", b"chunked"))
        start = b"%b %b%b HTTP/1.1" % (self.method, ctx.upstream_prefix, target)
        return http1.serialize(start, http1.end_to_end(self.headers, framing, _DROP_REQUEST), extra)

    def request_body(self, piece: bytes) -> None:
        self.body_bytes += len(piece)
        cap = self.cap
        if cap is not None:
            if self.body_bytes <= self.ctx.settings.max_buffered_body_bytes:
                cap.request_body.append(piece)
            else:
                cap.body_truncated = True
        if self.buffering:
            self.body.append(piece)
            if self.body_bytes > self.ctx.settings.max_buffered_body_bytes:  # chunked and huge: stream it
                self.buffering = False
                self._queue_up(self._request_head_bytes(None))
                for part in self.body:
                    self._queue_up(http1.chunk(part))
                self.body = []
        else:
            self._queue_up(http1.chunk(piece) if self.req_chunked else piece)

    def request_complete(self) -> None:
        self.request_done = True
        self.reading_body = False
        if self.cap is not None:
            self.cap.request_bytes = self.body_bytes
        if self.buffering:
            body = b"".join(self.body)
            self.body = []
            new_body, parsed = inject(body)
            cap = self.cap
            if cap is not None:
                cap.request_json = parsed
                cap.injected_usage = new_body is not None
            if new_body is not None:
                body = new_body
            self._queue_up(self._request_head_bytes(len(body)) + body)
        elif self.req_chunked:
            self._queue_up(http1.CHUNKED_END)
        self.flush_up()

    def _queue_up(self, data: bytes) -> None:
        self.out_up.append(data)

    def start(self) -> None:
        """Become the connection's active exchange: borrow an upstream connection."""
        self.active = True
        self.active_tick = self.ctx.tick
        self.ctx.pool.acquire(self)

    def flush_up(self) -> None:
        upstream = self.upstream
        if upstream is None or not self.out_up or self.done:
            return
        data = self.out_up[0] if len(self.out_up) == 1 else b"".join(self.out_up)
        self.out_up.clear()
        upstream.write(data)
        if self.sent_log is not None:
            self.sent_bytes += len(data)
            if self.sent_bytes <= _RETRY_KEEP_BYTES:
                self.sent_log.append(data)
            else:
                self.sent_log = None
        if self.request_done and not self.sent:
            self.sent = True
            self.sent_tick = self.ctx.tick
            if self.cap is not None:
                self.cap.sent_ns = now_ns()

    # ------------------------------------------------------------------ pool callbacks

    def upstream_ready(self, conn: UpstreamConnection) -> None:
        if self.done:
            self.ctx.pool.release(conn, True, self.ctx.tick)
            return
        conn.requests += 1
        self.reused = conn.requests > 1
        self.upstream = conn
        self.parser = httptools.HttpResponseParser(self)
        self.active_tick = self.ctx.tick
        if not self.client.feeding:  # else the client flushes after parsing its read: head + body, one write
            self.flush_up()

    def upstream_failed(self, error: str) -> None:
        """Connect failure or timeout, reset, or a broken response: 502/504 before the head, else cut."""
        if self.done:
            return
        self.ctx.count_upstream_error(error)
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.abort()
        else:
            self.ctx.pool.forget(self)
        if self.cap is not None:
            self.cap.error = error
        if not self.head_sent:
            self.status = 504 if error == "timeout" else 502
            if self.cap is not None:
                self.cap.status = self.status
            self.close_after = not self.request_done or not self.client_keep_alive
            self.client.write(http1.error_response(self.status, close=self.close_after, version=self.version))
        else:
            self.flush_client()
            self.close_after = True  # the client sees an incomplete body, as behind nginx
        self._finish(reusable=False)

    def upstream_lost(self) -> None:
        if self.done:
            return
        self.upstream = None
        if self.head_sent and self._close_delimited():
            self.on_message_complete()  # the close is this response's end
            return
        if not self.got_response and self.reused and not self.retried and self.sent_log is not None:
            self._retry()
            return
        self.upstream_failed("reset")

    def upstream_pause(self, paused: bool) -> None:
        self.client.pause_reading(paused)

    def _retry(self) -> None:
        """A kept-alive connection the server had closed: resend on a fresh one (nothing was answered)."""
        self.retried = True
        assert self.sent_log is not None
        self.out_up = [*self.sent_log, *self.out_up]
        self.sent_log, self.sent_bytes, self.sent = [], 0, False
        self.parser = None
        self.ctx.pool.acquire(self)

    def upstream_data(self, data: bytes) -> None:
        self.got_response = True
        try:
            self.parser.feed_data(data)  # type: ignore[union-attr]
        except httptools.HttpParserError:
            self.upstream_failed("bad_stream")
            return
        if self.out:
            self.flush_client()

    def client_gone(self) -> None:
        """The client closed its connection: stop the upstream at once so the engine frees the slot."""
        if self.done:
            return
        if self.cap is not None:
            self.cap.error = "client_cancel"
        self.ctx.count_cancel()
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.abort()
        else:
            self.ctx.pool.forget(self)
        self.close_after = True
        self._finish(reusable=False)

    # ------------------------------------------------------------------ response parser callbacks

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.resp_headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        if parser is None:  # another response in the read that ended this exchange: not answered to anyone
            return
        status = parser.get_status_code()
        if status < 200:
            self.interim = True
            if status != 100 and self.version == b"1.1":  # 103 Early Hints and the like pass on
                self.out.append(http1.serialize(b"HTTP/1.1 %d %b" % (status, self.reason), self.resp_headers))
            self.reason, self.resp_headers = b"", []
            return
        self.status = status
        self.head_tick = self.ctx.tick
        self.upstream_keep_alive = parser.should_keep_alive()
        headers = self.resp_headers
        extra: http1.Headers = []
        framing: http1.Headers = []
        length = http1.header_value(headers, b"content-length")
        no_body = http1.status_has_no_body(status, self.method)
        stripping = self.cap is not None and self.cap.injected_usage and _is_event_stream(headers)
        if length is not None and not http1.is_chunked(headers) and not stripping:
            framing.append((b"Content-Length", length))
        elif not no_body:
            if self.version == b"1.1":
                self.chunked_out = True
                framing.append((b"Transfer-Encoding", b"chunked"))
            else:
                self.close_after = True
        if not self.client_keep_alive or self.ctx.draining or not self.request_done:
            self.close_after = True
        if self.close_after:
            extra.append((b"Connection", b"close"))
        elif self.version == b"1.0":
            extra.append((b"Connection", b"keep-alive"))
        start = b"HTTP/%b %d %b" % (self.version, status, self.reason)
        self.out.append(http1.serialize(start, http1.end_to_end(headers, framing), extra))
        self.head_sent = True
        cap = self.cap
        if cap is not None:
            cap.status = status
            cap.head_ns = now_ns()
            cap.event_stream = _is_event_stream(headers)
            if stripping:  # the body shrinks by the usage event, so a Content-Length became chunked framing
                self.strip = UsageStripper()
        if no_body:
            self.on_message_complete()

    def on_body(self, piece: bytes) -> None:
        if self.done:
            self.upstream_keep_alive = False  # bytes after a bodiless response: do not reuse
            return
        cap = self.cap
        if cap is not None:  # inlined Capture.add_piece: this runs for every chunk of observed streams
            cap.response_bytes += len(piece)
            if cap.response_bytes <= cap.limit_bytes:
                cap.pieces.append(piece)
                cap.piece_ns.append(now_ns())  # parsed microseconds after its read arrived
            else:
                cap.response_truncated = True
            strip = self.strip
            # Per read, so the cheapest spellings (callgrind): `partition` takes its one argument
            # directly where `find` and `endswith` parse theirs from a tuple, and `in` on bytes first
            # tries its operand as an int, raising and clearing a TypeError inside.
            if strip is not None and not (
                strip.idle and piece[-2:] == b"\n\n" and not piece.partition(b'"usage"')[1]
            ):  # whole usage-free events skip feed, which would return them as they are
                piece = strip.feed(piece)
                if not piece:
                    return
        self.out.append(b"%x\r\n%b\r\n" % (len(piece), piece) if self.chunked_out else piece)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.done:
            return
        if self.strip is not None:
            rest = self.strip.flush()
            if rest:
                self.out.append(http1.chunk(rest) if self.chunked_out else rest)
        if self.chunked_out:
            self.out.append(http1.CHUNKED_END)
        self.flush_client()
        self._finish(reusable=self.upstream_keep_alive and self.request_done)

    # ------------------------------------------------------------------ end

    def flush_client(self) -> None:
        out = self.out
        if out:
            self.client.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    def _close_delimited(self) -> bool:
        """The upstream body has no length and no chunking: its end is the connection's close."""
        headers = self.resp_headers
        return http1.header_value(headers, b"content-length") is None and not http1.is_chunked(headers)

    def _finish(self, reusable: bool) -> None:
        self.done = True
        # The parser holds this exchange (its callbacks): letting go of it breaks the cycle, so an
        # ended exchange, its buffers and its capture are freed at once instead of by the collector.
        self.parser = None
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            self.ctx.pool.release(upstream, reusable, self.ctx.tick)
        cap = self.cap
        if cap is not None:
            cap.end_ns = now_ns()
        self.ctx.exchange_finished(self)
        self.client.exchange_done(self)
