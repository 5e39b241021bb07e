"""One request/response pair on the forwarding path as an explicit state machine: THE hot path.

Events come in as bytes and ticks (the client side's parsed request, upstream reads, the timer tick)
and bytes go out through `Link`s (seam.py); nothing here touches a socket, so tests drive it with
scripted byte splits. Its decisions read no clock: time comes in as the forwarder's timer ticks
(`Context.tick`, `Exchange.tick(now)`), and every deadline is a tick count. It calls `clock.now_ns`
itself in three places, all to timestamp an observer's capture (the arrival, each forwarded read,
the end) and only for exchanges an observer wants; no decision reads those stamps. One state enum,
one transition table, one deadline per state, like h11. httptools (llhttp) only finds response
boundaries; a capture for observers keeps references to the bytes, taken after they were written to
the client. Failures map like nginx's: 502/504 before the response head, a cut stream after it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httptools

from replayproxy.clock import now_ns
from replayproxy.proxy import heads, http1
from replayproxy.proxy.observe import Capture
from replayproxy.proxy.seam import Pool, UpstreamLink
from replayproxy.proxy.usage import UsageStripper, inject
from replayproxy.shape import ENDPOINT_PATHS, Endpoint, ErrorClass

_INJECTABLE = ("chat", "completions")
_TERMINAL = b"[DONE]\n\n"  # the end of an OpenAI-style stream's last event


class State(enum.Enum):
    HEAD = "head"  # request head arriving; timer: client_header_timeout_s
    QUEUED = "queued"  # head complete, behind an earlier request of the same connection
    CONNECTING = "connecting"  # borrowing an upstream connection; timer: connect_timeout_s
    AWAITING = "awaiting"  # request going upstream, no final response head; timer: first_byte once sent
    STREAMING = "streaming"  # response head passed on, body flowing; timer: idle_timeout_s between reads
    TUNNEL = "tunnel"  # after 101 Switching Protocols: bytes pass both ways untouched; timer: idle
    DONE = "done"

    # Identity hashing in C: Enum's own __hash__ is a Python call, and each transition hashes twice.
    __hash__ = object.__hash__


# Every legal move; anything else is a bug in this module and raises. AWAITING -> CONNECTING is the one
# move to a fresh connection when the lent one closed before any byte of the request was written to it
# (at most once: a request the upstream may have read is never sent again).
TRANSITIONS: dict[State, frozenset[State]] = {
    State.HEAD: frozenset({State.QUEUED, State.DONE}),
    State.QUEUED: frozenset({State.CONNECTING, State.DONE}),
    State.CONNECTING: frozenset({State.AWAITING, State.DONE}),
    State.AWAITING: frozenset({State.CONNECTING, State.STREAMING, State.TUNNEL, State.DONE}),
    State.STREAMING: frozenset({State.DONE}),
    State.TUNNEL: frozenset({State.DONE}),
    State.DONE: frozenset(),
}
_RESPONDING = (State.STREAMING, State.TUNNEL)
_STREAMING, _TUNNEL = State.STREAMING, State.TUNNEL  # module globals: the per-read checks skip the class


class StateError(RuntimeError):
    """A transition the table does not allow."""


class ResponseHeadTooLarge(Exception):
    """Raised inside the response parser's callback; the parser reports it as its own error."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Settings the state machine enforces; times in ticks of the forwarder's timer."""

    header_ticks: int
    connect_ticks: int
    first_byte_ticks: int
    idle_ticks: int
    total_ticks: int  # 0: none
    inject_usage: bool
    max_buffered_body_bytes: int
    max_captured_response_bytes: int
    max_response_head_bytes: int


class Context(Protocol):
    """What all exchanges of one listener share (forward.Forwarder)."""

    tick: int
    draining: bool
    limits: Limits
    upstream: heads.Upstream

    @property
    def pool(self) -> Pool: ...

    def observer_wants(self, endpoint: str) -> bool: ...
    def forwarded_fields(self, peer: bytes | None) -> http1.Headers: ...
    def exchange_finished(self, exchange: Exchange) -> None: ...
    def count_upstream_error(self, error: ErrorClass) -> None: ...
    def count_cancel(self) -> None: ...


class ClientEnd(Protocol):
    """The client connection an exchange answers on (client.ClientSide)."""

    peer: bytes | None
    feeding: bool  # inside a parse of client bytes: upstream writes wait for its end (one write)
    send: Callable[[bytes], None]  # the socket's own write: the per-read path takes no detour

    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def pause_reading(self, paused: bool) -> None: ...
    def exchange_done(self, exchange: Exchange) -> None: ...
    def upgrade_answered(self, exchange: Exchange, switched: bool) -> None: ...


# Path tails of the endpoint classes, longest first ("/chat/completions" also ends in "/completions").
_ENDPOINT_TAILS = tuple(
    sorted(
        ((path.removeprefix("/v1").encode(), e) for e, path in ENDPOINT_PATHS.items()),
        key=lambda t: -len(t[0]),
    )
)


def endpoint_of(method: bytes, path: bytes) -> Endpoint:
    """Endpoint class from the path's tail, so any prefix before /v1/... is accepted."""
    if method == b"POST":
        for tail, endpoint in _ENDPOINT_TAILS:
            if path.endswith(tail):
                return endpoint
    return "other"


class Exchange:
    """Created by the client side at a request's first byte; lives until the response ends."""

    __slots__ = (
        "ctx", "client", "send", "state", "deadline", "read_tick", "end_tick",
        "target", "headers", "fields", "method", "version", "client_keep_alive", "upgrade", "trailers",
        "endpoint",
        "cap", "buffering", "body", "body_bytes", "req_length", "req_chunked", "request_done",
        "upstream", "out_up", "wrote", "retried",
        "parser", "reason", "resp_headers", "head_bytes", "status", "chunked_out", "close_after", "reusable",
        "strip", "out", "head_waiting", "trailer_fields", "terminal",
    )  # fmt: skip

    def __init__(self, ctx: Context, client: ClientEnd) -> None:
        self.ctx = ctx
        self.client = client
        self.send = client.send
        self.state = State.HEAD
        self.deadline = ctx.tick + ctx.limits.header_ticks  # -1: no timer in this state (yet)
        self.read_tick = ctx.tick  # of the last upstream read: the idle timer of the responding states
        self.end_tick = ctx.tick + ctx.limits.total_ticks if ctx.limits.total_ticks else -1
        self.target = b""
        self.headers: http1.Headers = []
        self.fields: dict[bytes, bytes] = {}  # http1.field_values(headers), once the head is complete
        self.method = b""
        self.version = b"1.1"
        self.client_keep_alive = True
        self.upgrade = False  # a body-less request offering Upgrade: held until the answer says 101 or not
        self.trailers = False  # the client sent `TE: trailers`
        self.endpoint = "other"
        self.cap: Capture | None = None
        self.buffering = False  # hold the body until complete (usage injection needs all of it)
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.req_length: int | None = None
        self.req_chunked = False
        self.request_done = False
        self.upstream: UpstreamLink | None = None
        self.out_up: list[bytes] = []  # bytes for upstream not written yet
        self.wrote = False  # a byte of the request went to an upstream connection: never resent
        self.retried = False
        self.parser: httptools.HttpResponseParser | None = None
        self.reason = b""
        self.resp_headers: http1.Headers = []
        self.head_bytes = 0  # of the response head so far
        self.status = 0
        self.chunked_out = False
        self.close_after = False  # the client connection closes after this response
        self.reusable = False  # the upstream connection may serve another request after this one
        self.strip: UsageStripper | None = None
        self.out: list[bytes] = []  # bytes for the client, written after each upstream read
        self.head_waiting = False  # the response head is in `out`: the first body piece sends it at once
        self.trailer_fields: http1.Headers = []
        self.terminal = False  # the upstream sent the stream's last event (`data: [DONE]`)

    # ------------------------------------------------------------------ states and timers

    def _to(self, state: State) -> None:
        if state not in TRANSITIONS[self.state]:
            raise StateError(f"{self.state.name} -> {state.name}")
        self.state = state
        limits, tick = self.ctx.limits, self.ctx.tick
        if state is State.CONNECTING:
            self.deadline = tick + limits.connect_ticks
        elif state in _RESPONDING:  # the timer runs from the last read: read_tick + idle_timeout
            self.read_tick, self.deadline = tick, -1
        else:  # QUEUED waits on another exchange; AWAITING's timer starts once the request is sent
            self.deadline = -1

    def tick(self, now: int) -> None:
        """The forwarder's timer: expire this state's deadline or the whole-exchange limit."""
        state = self.state
        if state is State.HEAD:
            if self.deadline < now:
                self.client.close()  # like nginx's client_header_timeout: no answer, the connection goes
        elif state is not State.QUEUED and state is not State.DONE:  # a queued one must not answer early
            if self.terminal:  # the body's end did not follow the last event within a tick: send it alone
                self.flush_client()
            idle = state in _RESPONDING and self.read_tick + self.ctx.limits.idle_ticks < now
            if idle or 0 <= self.deadline < now or 0 <= self.end_tick < now:
                self.upstream_failed("timeout")

    @property
    def responding(self) -> bool:
        """The response head has gone to the client (errors now cut the stream instead of a 502)."""
        return self.state in _RESPONDING

    # ------------------------------------------------------------------ request side (from the client side)

    def request_head(self, method: bytes, version: str, keep_alive: bool, upgrade: bool) -> None:
        """The head is complete (`target` and `headers` were filled while it arrived)."""
        limits = self.ctx.limits
        self.method = method
        self.version = b"1.0" if version == "1.0" else b"1.1"
        self.client_keep_alive = keep_alive
        path = self.target.partition(b"?")[0]
        self.target = heads.rebase(self.target, self.ctx.upstream.prefix)  # may refuse it: nothing done yet
        self.endpoint = endpoint_of(method, path)
        fields = self.fields = http1.field_values(self.headers)
        heads.check_host(self.headers, fields, self.version)  # may refuse it: nothing done yet
        length = fields.get(b"content-length")
        self.req_length = int(length) if length is not None else None
        self.req_chunked = http1.is_chunked(fields)
        self.upgrade = upgrade and not self.req_chunked and not self.req_length and self.version == b"1.1"
        te = fields.get(b"te")
        self.trailers = te is not None and b"trailers" in te.lower()
        expect = fields.get(b"expect")
        if expect is not None and expect.lower() == b"100-continue" and self.version == b"1.1":
            self.client.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # like nginx: answer it here, drop Expect
        if self.ctx.observer_wants(self.endpoint):
            self.cap = Capture(
                now_ns(),
                self.endpoint,
                method.decode("latin-1"),
                path.decode("latin-1"),
                limit_bytes=limits.max_captured_response_bytes,
            )
            self.buffering = (
                limits.inject_usage
                and self.endpoint in _INJECTABLE
                and (self.req_length is None or self.req_length <= limits.max_buffered_body_bytes)
            )
        if not self.buffering:
            self.out_up.append(self._request_head_bytes(self.req_length if not self.req_chunked else None))
        self._to(State.QUEUED)

    def _request_head_bytes(self, length: int | None) -> bytes:
        ctx = self.ctx
        return heads.request_head(
            self.method,
            self.target,
            self.headers,
            self.fields,
            ctx.upstream,
            length=length,
            chunked=self.req_chunked and length is None,
            upgrade=self.upgrade,
            forwarded=ctx.forwarded_fields(self.client.peer),
        )

    def request_body(self, piece: bytes) -> None:
        self.body_bytes += len(piece)
        limit = self.ctx.limits.max_buffered_body_bytes
        cap = self.cap
        if cap is not None:
            if self.body_bytes <= limit:
                cap.request_body.append(piece)
            else:
                cap.body_truncated = True
        if not self.buffering:
            self.out_up.append(http1.chunk(piece) if self.req_chunked else piece)
            return
        self.body.append(piece)
        if self.body_bytes > limit:  # chunked and huge: stream it as it is
            self.buffering = False
            self.out_up.append(self._request_head_bytes(None))
            self.out_up.extend(http1.chunk(part) for part in self.body)
            self.body = []

    def request_complete(self) -> None:
        self.request_done = True
        cap = self.cap
        if cap is not None:
            cap.request_bytes = self.body_bytes
        if self.buffering:
            body = b"".join(self.body)
            self.body = []
            new_body, parsed = inject(body)
            if cap is not None:
                cap.request_json = parsed
                cap.injected_usage = new_body is not None
            if new_body is not None:
                body = new_body
            self.out_up.append(self._request_head_bytes(len(body)) + body)
        elif self.req_chunked:
            self.out_up.append(http1.CHUNKED_END)
        self.flush_up()

    def start(self) -> None:
        """First in its connection's line: borrow an upstream connection."""
        self._to(State.CONNECTING)
        self.ctx.pool.acquire(self)

    def flush_up(self) -> None:
        upstream = self.upstream
        if upstream is None or not self.out_up or self.state is State.DONE:
            return
        data = self.out_up[0] if len(self.out_up) == 1 else b"".join(self.out_up)
        self.out_up.clear()
        upstream.write(data)
        self.wrote = True
        if self.request_done and self.state is State.AWAITING and self.deadline < 0:
            self.deadline = self.ctx.tick + self.ctx.limits.first_byte_ticks

    def tunnel_up(self, data: bytes) -> None:
        """Client bytes after a 101: the upstream's, untouched."""
        if self.upstream is not None:
            self.upstream.write(data)

    def client_gone(self) -> None:
        """The client closed its connection: stop the upstream at once so the engine frees the slot."""
        if self.state is State.DONE:
            return
        if self.terminal and not self.out:  # the whole stream was forwarded: complete, whatever came after
            self._drop_upstream()  # the body's end is still unread upstream: not reusable
            self.close_after = True
            self._finish(reusable=False)
            return
        if self.state is not State.TUNNEL:  # a tunnel ends by either side closing
            if self.cap is not None:
                self.cap.error = "client_cancel"
            self.ctx.count_cancel()
        self._drop_upstream()
        self.close_after = True
        self._finish(reusable=False)

    def client_paused(self, paused: bool) -> None:
        """The client's socket buffer is full (or drained): stop (or resume) reading the upstream."""
        if self.upstream is not None:
            self.upstream.pause(paused)

    # ------------------------------------------------------------------ pool and upstream events

    def upstream_ready(self, conn: UpstreamLink) -> None:
        if self.state is not State.CONNECTING:  # ended while waiting
            self.ctx.pool.release(conn, True, self.ctx.tick)
            return
        self.upstream = conn
        self.parser = httptools.HttpResponseParser(self)
        self._to(State.AWAITING)
        if not self.client.feeding:  # else the client side flushes after its read: head + body, one write
            self.flush_up()

    def upstream_failed(self, error: ErrorClass) -> None:
        """Connect failure or timeout, reset, or a broken response: 502/504 before the head, else cut."""
        if self.state is State.DONE:
            return
        self.ctx.count_upstream_error(error)
        self._drop_upstream()
        if self.cap is not None:
            self.cap.error = error
        if self.responding:
            self.flush_client()
            self.close_after = True  # the client sees an incomplete body, as behind nginx
        else:
            self.status = 504 if error == "timeout" else 502
            if self.cap is not None:
                self.cap.status = self.status
            self.close_after = not self.request_done or not self.client_keep_alive
            self.client.write(http1.error_response(self.status, close=self.close_after))
        self._finish(reusable=False)

    def upstream_lost(self) -> None:
        if self.state is State.DONE:
            return
        self.upstream = None
        if self.state is State.TUNNEL:
            self.flush_client()
            self._finish(reusable=False)
        elif self.state is State.STREAMING and self._close_delimited():
            self.on_message_complete()  # the close is this response's end
        elif not self.wrote and not self.retried:
            self._retry()
        else:
            self.upstream_failed("reset")

    def upstream_pause(self, paused: bool) -> None:
        self.client.pause_reading(paused)

    def _retry(self) -> None:
        """The lent connection closed before a byte of the request was written to it (the body was
        still arriving): the upstream cannot have read anything, so a fresh connection is safe."""
        self.retried = True
        self.parser = None
        self.start()

    def upstream_data(self, data: bytes) -> None:
        self.read_tick = self.ctx.tick
        if self.state is _TUNNEL:
            self.send(data)
            return
        try:
            self.parser.feed_data(data)  # type: ignore[union-attr]
        except httptools.HttpParserUpgrade as e:  # a 101: what follows its head is the new protocol's
            if self.status != 101:  # a 101 nobody offered an Upgrade for
                self.upstream_failed("bad_stream")
                return
            offset = e.args[0] if e.args and isinstance(e.args[0], int) else len(data)
            if data[offset:]:
                self.out.append(data[offset:])
        except httptools.HttpParserError:
            self.upstream_failed("bad_stream")
            return
        out = self.out
        if out and not (self.terminal and self.state is _STREAMING and self.chunked_out):
            # One write per read (the first body piece went on its own): what the parse produced. The
            # stream's last event waits for the body's end (the next read, or a tick): one write, so
            # a client that closes on reading `[DONE]` cannot close before the chunked terminator.
            self.send(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    # ------------------------------------------------------------------ response parser callbacks

    def on_status(self, reason: bytes) -> None:
        self.reason += reason
        self._count_head(len(reason))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        if self.state is State.AWAITING:
            self.resp_headers.append((name, value))
        elif self.trailers:  # after the body: a trailer field
            self.trailer_fields.append((name, value))

    def _count_head(self, size: int) -> None:
        self.head_bytes += size
        if self.head_bytes > self.ctx.limits.max_response_head_bytes:
            raise ResponseHeadTooLarge

    def on_headers_complete(self) -> None:
        parser = self.parser
        if parser is None or self.state is not State.AWAITING:  # a response no one asked for: not answered
            return
        status = parser.get_status_code()
        if status == 101 and self.upgrade:
            self._switch()
        elif status < 200:
            if status != 100 and self.version == b"1.1":  # 103 Early Hints and the like pass on
                self.out.append(http1.serialize(b"HTTP/1.1 %d %b" % (status, self.reason), self.resp_headers))
            self.reason, self.resp_headers, self.head_bytes = b"", [], 0
        else:
            self._final_head(status, parser.should_keep_alive())

    def _final_head(self, status: int, keep_alive: bool) -> None:
        self.status = status
        self.reusable = keep_alive
        headers = self.resp_headers
        framing: http1.Headers = []
        fields = http1.field_values(headers)
        length = fields.get(b"content-length")
        no_body = http1.status_has_no_body(status, self.method)
        cap = self.cap
        event_stream = cap is not None and heads.is_event_stream(fields)  # only observers need it
        stripping = cap is not None and cap.injected_usage and event_stream
        chunked_in = http1.is_chunked(fields)
        if length is not None and not chunked_in and not stripping:
            framing.append((b"Content-Length", length))
        elif not no_body and self.version == b"1.1" and (chunked_in or length is not None):
            self.chunked_out = True
            framing.append((b"Transfer-Encoding", b"chunked"))
        elif not no_body:  # close-delimited upstream, or an HTTP/1.0 client: the close is the end
            self.close_after = True
        if not self.client_keep_alive or self.ctx.draining or not self.request_done:
            self.close_after = True
        connection = b"close" if self.close_after else b"keep-alive" if self.version == b"1.0" else b""
        head = heads.response_head(status, self.reason, headers, fields, framing, connection)
        self.out.append(head)
        self.head_waiting = True
        self._to(State.STREAMING)
        if self.upgrade:
            self.client.upgrade_answered(self, switched=False)
        if cap is not None:
            cap.status = status
            cap.event_stream = event_stream
            if stripping:  # the body shrinks by the usage event, so a Content-Length became chunked framing
                self.strip = UsageStripper()
        if no_body:
            self.on_message_complete()

    def _switch(self) -> None:
        self.status = 101
        self.close_after = True
        if self.cap is not None:
            self.cap.status = 101
        self.out.append(heads.switching_head(self.reason, self.resp_headers))
        self._to(State.TUNNEL)
        self.client.upgrade_answered(self, switched=True)

    def on_body(self, piece: bytes) -> None:
        if self.state is not _STREAMING:
            self.reusable = False  # bytes after the response: do not reuse the connection
            return
        self.terminal = piece[-8:] == _TERMINAL  # a slice, not endswith: no method call per read
        cap = self.cap
        if cap is not None:  # inlined: this runs for every read of observed streams
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
                strip.idle
                and piece[-2:] == b"\n\n"
                and not piece.partition(b'"usage"')[1]
                and not piece.partition(b'_reason":"')[1]
                and not piece.partition(b'_reason": "')[1]
            ):  # whole events with no usage and no finish (usage.plain) skip feed: it would return them
                piece = strip.feed(piece)
                if not piece:
                    return
        self.out.append(b"%x\r\n%b\r\n" % (len(piece), piece) if self.chunked_out else piece)
        if self.head_waiting:  # the first token goes out before the rest of the read is parsed
            self.head_waiting = False
            self.flush_client()

    def on_message_complete(self) -> None:
        if self.state is not State.STREAMING:
            return  # an interim (1xx) response, a 101's head, or a response after this exchange ended
        if self.strip is not None:
            rest = self.strip.flush()
            if rest:
                self.out.append(http1.chunk(rest) if self.chunked_out else rest)
        if self.chunked_out:
            trailers = self.trailer_fields
            self.out.append(heads.trailer_block(trailers) if trailers else http1.CHUNKED_END)
        self.flush_client()
        self._finish(reusable=self.reusable and self.request_done)

    # ------------------------------------------------------------------ end

    def flush_client(self) -> None:
        out = self.out
        if out:
            self.send(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    def _close_delimited(self) -> bool:
        """The upstream body has no length and no chunking: its end is the connection's close."""
        fields = http1.field_values(self.resp_headers)  # rare (the upstream closed mid-body): not kept
        return b"content-length" not in fields and not http1.is_chunked(fields)

    def _drop_upstream(self) -> None:
        """Abort the upstream connection, or stop waiting for one."""
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.close()
        elif self.state is State.CONNECTING:
            self.ctx.pool.forget(self)

    def _finish(self, reusable: bool) -> None:
        self._to(State.DONE)
        # The parser holds this exchange (its callbacks): letting go of it breaks the cycle, so an
        # ended exchange, its buffers and its capture are freed at once instead of by the collector.
        self.parser = None
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            self.ctx.pool.release(upstream, reusable, self.ctx.tick, self.terminal)
        cap = self.cap
        if cap is not None:
            cap.end_ns = now_ns()
        self.ctx.exchange_finished(self)
        self.client.exchange_done(self)
