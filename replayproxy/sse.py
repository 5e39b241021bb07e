"""Server-sent events without I/O: bytes in, events out, and what each OpenAI-style chunk carries.

Shared by the proxy (which observes and sometimes filters upstream streams) and the replayer
(which timestamps chunks). `SSEDecoder.feed` accepts any split of the byte stream — a network
read may hold half an event or several — and follows the WHATWG parsing rules: CRLF, LF or CR
line ends, `:` comments, `data` lines joined by LF, dispatch on a blank line.
`classify` says whether an event's data carries generated content (TTFT and ITL count only those);
`error_kind` names an error body's type without its text.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import orjson

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


class SSEEvent(NamedTuple):
    """One dispatched event; `end` is the stream offset just past its terminating blank line.

    When a CRLF is split across two feeds, the event is dispatched on the CR and `end` stops
    before the LF (not seen yet); the decoder then skips that LF.
    """

    data: bytes
    event: str = ""  # the `event:` field; "" means the default type "message"
    id: str | None = None  # the last event id seen so far (the spec carries it forward)
    retry_ms: int | None = None
    end: int = 0


def data_lines(chunk: bytes) -> list[bytes] | None:
    """The lines of a chunk that is only whole one-line `data:` events with LF endings (a usage
    event and [DONE] in one read, say), without their blank lines; None for anything else."""
    if not (chunk.startswith(b"data: ") and chunk.endswith(b"\n\n") and chunk.find(b"\r") < 0):
        return None
    lines = chunk.split(b"\n\n")
    lines.pop()  # the empty rest after the last event
    for line in lines:  # a loop, not all() over a generator: this runs on the forwarding path
        if not line.startswith(b"data: ") or line.find(b"\n") >= 0:
            return None
    return lines


class SSEDecoder:
    """Incremental decoder; one per stream. Holds only the incomplete tail between calls."""

    __slots__ = ("_tail", "_data", "_event", "_id", "_retry", "_skip_lf", "_offset", "_started")

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._skip_lf = False  # the previous feed ended in CR, so a leading LF belongs to it
        self._offset = 0  # stream bytes consumed into complete lines
        self._started = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if (
            chunk.startswith(b"data: ")
            and chunk.endswith(b"\n\n")
            and not (self._tail or self._data or self._event or self._skip_lf)
            and chunk.find(b"\r") < 0
        ):  # whole `data:` events, the way engines write them: no line-by-line parsing needed
            if chunk.count(b"\n") == 2:
                self._started = True
                self._offset += len(chunk)
                return [SSEEvent(chunk[6:-2], "", self._id, self._retry, self._offset)]
            lines = data_lines(chunk)
            if lines is not None:
                return self._data_events(lines)
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                self._offset += 1
        buf = self._tail + chunk if self._tail else chunk
        if not self._started:
            if len(buf) < 3 and _BOM.startswith(buf):
                self._tail = buf
                return []
            self._started = True
            if buf.startswith(_BOM):
                buf = buf[3:]
                self._offset += 3
        events: list[SSEEvent] = []
        if buf.find(b"\r") >= 0:
            pos = 0
            for match in _LINE_END.finditer(buf):
                self._line(buf[pos : match.start()], self._offset + match.end(), events)
                pos = match.end()
            self._skip_lf = buf.endswith(b"\r")
        else:  # the common case: LF only, so a plain split finds the lines
            lines = buf.split(b"\n")
            at = self._offset
            for line in lines[:-1]:
                at += len(line) + 1
                self._line(line, at, events)
            pos = len(buf) - len(lines[-1])
        self._offset += pos
        self._tail = buf[pos:]
        return events

    def _data_events(self, lines: list[bytes]) -> list[SSEEvent]:
        self._started = True
        events = []
        for line in lines:
            self._offset += len(line) + 2
            events.append(SSEEvent(line[6:], "", self._id, self._retry, self._offset))
        return events

    def _line(self, line: bytes, end: int, events: list[SSEEvent]) -> None:
        if line.startswith(b"data: "):
            self._data.append(line[6:])
        elif line:
            self._field(line)
        elif self._data:
            events.append(self._dispatch(end))
        else:
            self._event = ""

    def _field(self, line: bytes) -> None:
        if line[:1] == b":":
            return
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\0" not in value:
                self._id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            self._retry = int(value)

    def _dispatch(self, end: int) -> SSEEvent:
        data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        event = SSEEvent(data, self._event, self._id, self._retry, end)
        self._data = []
        self._event = ""
        return event


# --------------------------------------------------------------------------- chunk classification

ROLE = "role"  # a chat chunk announcing the role, with no generated text yet
CONTENT = "content"  # carries generated text: content, reasoning, a tool-call or function-call delta
EMPTY = "empty"  # has choices but nothing generated (e.g. the finish_reason-only chunk)
USAGE = "usage"  # `choices: []` with `usage` (stream_options.include_usage's extra chunk)
DONE = "done"  # the `[DONE]` sentinel
ERROR = "error"  # an `{"error": ...}` object sent in the stream
OTHER = "other"  # not JSON, or JSON of another shape
KINDS = (ROLE, CONTENT, EMPTY, USAGE, DONE, ERROR, OTHER)


class Usage(NamedTuple):
    """Token counts an upstream reported; -1 where it said nothing. A tuple, not a frozen dataclass,
    whose construction costs ~6k instructions more: one is made per usage event, and per chunk
    under continuous usage stats."""

    prompt_tokens: int = -1
    completion_tokens: int = -1
    cached_tokens: int = -1


class ChunkInfo(NamedTuple):
    """What one event carries (a tuple: the replayer classifies every chunk of every request)."""

    kind: str  # one of KINDS
    usage: Usage | None = None  # present on usage chunks and, with continuous usage stats, on others
    finish_reason: str | None = None


_DONE_INFO = ChunkInfo(DONE)
_OTHER_INFO = ChunkInfo(OTHER)
_PLAIN = {kind: ChunkInfo(kind) for kind in KINDS}
_TEXT_KEYS = ("content", "reasoning_content", "reasoning")
_ERROR_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,47}")  # `invalid_request_error`, `BadRequestError`


def classify(data: bytes) -> ChunkInfo:
    """What one SSE event's data carries; never raises, whatever the bytes."""
    if not data.lstrip().startswith(b"{"):  # not an object, so never a chunk: no parse, no exception
        return _DONE_INFO if data.strip() == b"[DONE]" else _OTHER_INFO
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return _OTHER_INFO
    if type(obj) is not dict:
        return _OTHER_INFO
    choices = obj.get("choices")
    raw_usage = obj.get("usage")
    if raw_usage is None and type(choices) is list and len(choices) == 1:  # the common chunk, decided quickly
        choice = choices[0]
        if type(choice) is dict and choice.get("finish_reason") is None:
            delta = choice.get("delta")
            if type(delta) is dict and delta.get("content"):
                return _PLAIN[CONTENT] if type(delta["content"]) is str else _slow(choices, None)
            text = choice.get("text")
            if text and type(text) is str:
                return _PLAIN[CONTENT]
    usage = parse_usage(raw_usage)
    if type(choices) is not list:
        return ChunkInfo(ERROR if "error" in obj else (USAGE if usage else OTHER), usage)
    return _slow(choices, usage)


class StreamClassifier:
    """`classify` for the chunks of one stream, faster: a chunk that equals an earlier plain content
    chunk everywhere but inside its content string (same id, model, and a null finish reason) is
    content without being parsed. Engines repeat that envelope for every token. Some change it
    now and then (llama.cpp and TGI stamp each chunk's `created` with the current second), so the
    newest envelopes are kept, newest first, and a stream of any length is parsed about once per
    change rather than for every chunk once a fixed number of envelopes is used up."""

    __slots__ = ("_templates", "event_templates")

    _KEPT = 4

    def __init__(self) -> None:
        self._templates: list[tuple[bytes, bytes]] = []  # (bytes before the string, bytes after it)
        self.event_templates: list[tuple[bytes, bytes]] = []  # the same as whole `data: ...\n\n` events

    @property
    def templates(self) -> list[tuple[bytes, bytes]]:
        """The envelopes learned so far, newest first (bytes before the string, bytes after it)."""
        return self._templates

    def classify(self, data: bytes) -> ChunkInfo:
        if fitting_envelope(data, self._templates) is not None:
            return _PLAIN[CONTENT]
        info = classify(data)
        if info is _PLAIN[CONTENT]:
            template = _template(data)
            if template is not None and b"\n" not in data:
                self._templates.insert(0, template)
                self.event_templates.insert(0, (b"data: " + template[0], template[1] + b"\n\n"))
                del self._templates[self._KEPT :], self.event_templates[self._KEPT :]
        return info


def fitting_envelope(data: bytes, envelopes: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes] | None:
    """The envelope (prefix, suffix) around a non-empty string that `data` is, if any: each prefix
    ends with the string's opening quote, so a quote right after it would mean an empty string."""
    for envelope in envelopes:
        prefix, suffix = envelope
        start = len(prefix)
        if (
            data.startswith(prefix)
            and data.endswith(suffix)
            and len(data) > start + len(suffix)
            and data[start] != 0x22
        ):
            return envelope
    return None


_STRING_KEYS = (b'"content":"', b'"reasoning_content":"', b'"reasoning":"', b'"text":"')


def _template(data: bytes) -> tuple[bytes, bytes] | None:
    for key in _STRING_KEYS:
        at = data.find(key)
        if at >= 0:
            start = at + len(key)
            end = _string_end(data, start)
            return (data[:start], data[end:]) if end > start else None
    return None


def _string_end(data: bytes, start: int) -> int:
    """Index of the quote closing the JSON string that starts at `start` (-1 if none)."""
    end = data.find(b'"', start)
    while end > 0 and data[end - 1] == 0x5C:  # a backslash before it: escaped unless the run is even
        run = end - 1
        while data[run] == 0x5C:
            run -= 1
        if (end - 1 - run) % 2 == 0:
            break
        end = data.find(b'"', end + 1)
    return end


def _slow(choices: list[Any], usage: Usage | None) -> ChunkInfo:
    """Every choice looked at: any content makes the chunk content; a role alone makes it role-only."""
    if not choices:
        return ChunkInfo(USAGE if usage else EMPTY, usage)
    kind = EMPTY
    finish: str | None = None
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            finish = reason
        choice_kind = _choice_kind(choice)
        if choice_kind == CONTENT:
            kind = CONTENT
        elif choice_kind == ROLE and kind == EMPTY:
            kind = ROLE
    if usage is None and finish is None:
        return _PLAIN[kind]
    return ChunkInfo(kind, usage, finish)


def _choice_kind(choice: dict[str, Any]) -> str:
    text = choice.get("text")  # /v1/completions
    if isinstance(text, str) and text:
        return CONTENT
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return EMPTY
    for key in _TEXT_KEYS:
        value = delta.get(key)
        if isinstance(value, str) and value:
            return CONTENT
    if delta.get("tool_calls") or delta.get("function_call"):
        return CONTENT
    return ROLE if delta.get("role") else EMPTY


def error_kind(data: bytes) -> str:
    """The engine's error type or code from its JSON error object (OpenAI and vLLM
    `{"error": {"type", "code"}}`, older vLLM `{"object": "error", "type"}`, TGI `{"error_type"}`),
    when it is a short identifier-like token; "" otherwise. Never the message, nor a type that
    reads like one: either may quote the request."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ""
    if type(body) is not dict:
        return ""
    error = body.get("error")
    for scope in (error, body) if type(error) is dict else (body,):
        for key in ("type", "error_type", "code"):
            value = scope.get(key)
            if type(value) is int and 0 <= value < 1_000_000:
                return str(value)
            if type(value) is str and _ERROR_TOKEN.fullmatch(value):
                return value
    return ""


def parse_usage(value: object) -> Usage | None:
    """An OpenAI `usage` object as numbers; None when absent or not an object."""
    if not isinstance(value, dict):
        return None
    details = value.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(_count(value.get("prompt_tokens")), _count(value.get("completion_tokens")), _count(cached))


def parse_timings(value: object) -> Usage | None:
    """llama.cpp's `timings` as counts: it evaluated `prompt_n` prompt tokens and reused `cache_n`
    from its cache (its `usage.prompt_tokens` is their sum), and generated `predicted_n`."""
    if not isinstance(value, dict):
        return None
    evaluated, cached = _count(value.get("prompt_n")), _count(value.get("cache_n"))
    prompt = evaluated + cached if evaluated >= 0 and cached >= 0 else -1
    return Usage(prompt, _count(value.get("predicted_n")), cached)


def _count(value: object) -> int:
    return value if type(value) is int and value >= 0 else -1  # bool is not int here
