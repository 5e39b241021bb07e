"""One replayed request's life as timestamps: send, headers, every network read, end — no I/O here.

The connection (replay.connection) calls these methods with the time of the network read that
delivered the bytes, taken before any parsing. During the run a read only appends `(time, bytes)`;
`digest` decodes the SSE events later, off the send path, giving every event completed by a read
that read's time. TTFT counts the first chunk carrying generated output (content, reasoning or a
tool-call delta, per `replayproxy.sse.classify`); with per-chunk usage (vLLM
`continuous_usage_stats`) the tokens of each content chunk are kept so ITL can be per token.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from replayproxy import sse
from replayproxy.replay.prepared import Prepared
from replayproxy.results import ReplayResult
from replayproxy.shape import ErrorClass, http_error

MAX_BODY_BYTES = 8 * 1024 * 1024  # non-streaming answers and error bodies are kept up to this
MAX_MESSAGE_CHARS = 200
UNSET = -1


class RequestTimeline:
    """Timestamps and counts for one request; `finish` runs once, on completion or failure."""

    __slots__ = (
        "prepared", "on_done", "connection", "scheduled_at", "sent_at", "headers_at", "first_at", "last_at",
        "end_at", "status", "error", "message", "gaps_us", "tokens", "per_chunk_usage", "content_chunks",
        "usage", "reads", "body_bytes", "new_connection", "prepared_late", "done", "complete", "digested",
        "wire",
    )  # fmt: skip

    def __init__(
        self, prepared: Prepared, scheduled_at: int, on_done: Callable[[RequestTimeline], None]
    ) -> None:
        self.prepared = prepared
        self.on_done = on_done
        self.connection: object | None = None  # the connection carrying it, for timeouts
        self.scheduled_at = scheduled_at  # absolute monotonic ns
        self.sent_at = UNSET
        self.headers_at = UNSET
        self.first_at = UNSET
        self.last_at = UNSET
        self.end_at = UNSET
        self.status = 0
        self.error: ErrorClass = ""
        self.message = ""
        self.gaps_us: list[int] = []
        self.tokens: list[int] = []
        self.per_chunk_usage = True  # every content chunk carried cumulative usage
        self.content_chunks = 0
        self.usage: sse.Usage | None = None
        self.reads: list[tuple[int, bytes]] = []  # (read time, body bytes) as they arrived
        self.body_bytes = 0
        self.new_connection = False
        self.prepared_late = False  # its body was not prepared by its deadline
        self.done = False
        self.complete = False  # the whole response arrived
        self.digested = False
        self.wire = b""  # the request's bytes as sent (a live reply builds the next turn on them)

    # ------------------------------------------------------------------ called by the connection

    def sent(self, at_ns: int) -> None:
        self.sent_at = at_ns

    def on_headers(self, at_ns: int, status: int) -> None:
        self.headers_at = at_ns
        self.status = status

    def on_body(self, at_ns: int, data: bytes) -> None:
        if self.body_bytes < MAX_BODY_BYTES or (self.status == 200 and self.prepared.stream):
            self.reads.append((at_ns, data))
            self.body_bytes += len(data)

    def on_complete(self, at_ns: int) -> None:
        if not self.done:
            self.complete = True
            self.finish(at_ns)

    def fail(self, at_ns: int, error: ErrorClass, message: str) -> None:
        if not self.done:
            self.error = error
            self.message = message[:MAX_MESSAGE_CHARS]
            self.finish(at_ns)

    def finish(self, at_ns: int) -> None:
        if self.done:
            return
        self.done = True
        self.end_at = at_ns
        self.connection = None
        self.on_done(self)

    # ------------------------------------------------------------------ after the fact

    def digest(self) -> None:
        """Decode what arrived (once): chunk times, tokens, usage, and errors only the body reveals."""
        if self.digested:
            return
        self.digested = True
        if self.status == 200 and self.prepared.stream:
            self._stream()
            if self.complete and self.content_chunks == 0 and not self.error:
                self.error, self.message = "bad_stream", "stream ended without a content chunk"
        elif self.error:
            return
        elif error := http_error(self.status):
            self.error = error
            self.message = _error_message(f"HTTP {self.status}", b"".join(data for _, data in self.reads))
        elif self.status != 200:
            self.error, self.message = "other", f"unexpected status {self.status}"
        elif self.complete:
            self._whole_body()

    def _stream(self) -> None:
        decoder = sse.SSEDecoder()
        reported = 0  # completion tokens reported so far (cumulative usage)
        for at_ns, data in self.reads:
            for event in decoder.feed(data):
                info = sse.classify(event.data)
                usage = info.usage
                if info.kind == sse.CONTENT:
                    if self.first_at == UNSET:
                        self.first_at = at_ns
                    else:
                        self.gaps_us.append((at_ns - self.last_at) // 1000)
                    self.last_at = at_ns
                    self.content_chunks += 1
                    if usage is not None and usage.completion_tokens >= 0:
                        self.tokens.append(usage.completion_tokens - reported)
                    else:
                        self.per_chunk_usage = False
                elif info.kind == sse.ERROR and not self.error:
                    self.error, self.message = "other", _error_message("error event", event.data)
                if usage is not None:
                    self.usage = usage
                    if usage.completion_tokens >= 0:
                        reported = usage.completion_tokens

    def _whole_body(self) -> None:
        try:
            answer = orjson.loads(b"".join(data for _, data in self.reads))
        except orjson.JSONDecodeError:
            self.error, self.message = "bad_stream", "response body is not JSON"
            return
        self.usage = sse.parse_usage(answer.get("usage")) if isinstance(answer, dict) else None
        # TTFT of a whole body: its first byte, as the proxy takes it (docs/report.md)
        self.first_at, self.last_at = self.reads[0][0], self.end_at
        self.content_chunks = 1

    def result(self, run_start_ns: int, worker: int = 0) -> ReplayResult:
        """The stored record; times after `sent_ns` are relative to the send."""
        self.digest()
        p = self.prepared
        sent = self.sent_at if self.sent_at != UNSET else self.end_at
        usage = self.usage or sse.Usage()
        keep_tokens = self.per_chunk_usage and len(self.tokens) == self.content_chunks and self.content_chunks
        return ReplayResult(
            index=p.index,
            scheduled_ns=self.scheduled_at - run_start_ns,
            sent_ns=sent - run_start_ns,
            endpoint=p.endpoint,
            stream=p.stream,
            headers_ns=_since(self.headers_at, sent),
            ttft_ns=_since(self.first_at, sent),
            e2e_ns=_since(self.end_at, sent),
            chunk_gaps_us=tuple(self.gaps_us),
            chunk_tokens=tuple(self.tokens) if keep_tokens else (),
            content_chunks=self.content_chunks,
            status=self.status,
            error=self.error,
            error_message=self.message,
            expected_input_tokens=p.expected_input_tokens,
            expected_shared_tokens=p.expected_shared_tokens,
            expected_output_tokens=p.expected_output_tokens,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            new_connection=self.new_connection,
            prepared_late=self.prepared_late,
            worker=worker,
            session=p.session,
            turn=p.turn,
            after=p.after,
            think_ns=p.think_ns,
        )


def _since(at_ns: int, sent_ns: int) -> int:
    return at_ns - sent_ns if at_ns != UNSET and sent_ns != UNSET else UNSET


def _error_message(what: str, body: bytes) -> str:
    """`what` and the engine's error type or code, never its message: engines quote the request in it."""
    kind = sse.error_kind(body)
    return f"{what} {kind}" if kind else what
