"""Usage injection: the one place the proxy rewrites bytes, and only for requests that need it.

Streaming engines report token counts only when asked (`stream_options.include_usage`). For a
recorded streaming request that did not set `stream_options`, the proxy splices that option into
the body (every other byte unchanged) and removes the extra `choices: []` usage event from what
the client receives, so the client's byte stream is what it would have been without the proxy.
Requests that already carry `stream_options` are never touched (continuous usage would change
every chunk). Some engines (vLLM) move fields such as `system_fingerprint` into the usage event
when usage is asked for; a usage event carrying such a field (beyond a chunk's identity: id,
object, created, model) that the stream's first event lacks is passed on without its `usage`
member instead of dropped, so the client loses nothing it gets direct.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from replayproxy.sse import USAGE, SSEDecoder, classify, data_lines

_OPTION = b'"stream_options":{"include_usage":true}'
_ONLY_NULL_USAGE = re.compile(rb'"usage"\s*:\s*null(?!.*"usage")', re.DOTALL)  # and no other "usage" after


def inject(body: bytes) -> tuple[bytes | None, Any]:
    """(new body or None if not needed, the parsed JSON or None) for a chat/completions request body."""
    if body.find(b'"stream"') < 0:
        return None, None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(obj, dict) or obj.get("stream") is not True or "stream_options" in obj:
        return None, obj
    brace = body.index(b"{") + 1
    return body[:brace] + _OPTION + b"," + body[brace:], obj


class UsageStripper:
    """Passes an SSE body through, minus usage-only events; holds back only an incomplete event."""

    __slots__ = ("idle", "_decoder", "_held", "_held_at", "_cr_end", "_envelope")

    def __init__(self) -> None:
        self.idle = False  # True: nothing held or pending, `feed` would return usage-free events as they are
        self._envelope: frozenset[str] | None = None  # top-level keys of the first event, once seen
        self._decoder: SSEDecoder | None = None  # only while an event is incomplete or may be usage
        self._held = b""
        self._held_at = 0  # stream offset of _held[0]
        self._cr_end: bool | None = None  # last event ended on CR: True if it was kept, False if dropped

    def feed(self, piece: bytes) -> bytes:
        if self._envelope is None and not self._held and self._decoder is None:  # at an event's start
            end = piece.find(b"\n")
            if piece.startswith(b"data:") and end > 0:
                self._envelope = _keys(piece[5:end])
        if not self._held and piece.endswith(b"\n\n") and _usage_free(piece):
            # Whole events and no usage (nearly every chunk): pass on untouched, restart decoding after them.
            if self._cr_end is not None and piece[:1] == b"\n":
                piece = piece if self._cr_end else piece[1:]
            self._decoder, self._cr_end = None, None
            self.idle = True
            return piece
        lines = data_lines(piece) if self._decoder is None and self._cr_end is None else None
        if lines is not None:  # one-line events only (the usage event and [DONE]): no decoder needed
            kept: list[bytes] = []
            for line in lines:
                new = self._without_usage(line[6:])
                if new is None:
                    kept.append(line)
                    if self._envelope is None:
                        self._envelope = _keys(line[6:])
                elif new:
                    kept.append(b"data: " + new)
            return piece if kept == lines else b"".join(line + b"\n\n" for line in kept)
        self.idle = False
        if self._decoder is None:
            self._decoder, self._held_at = SSEDecoder(), 0
        events = self._decoder.feed(piece)
        held = self._held + piece if self._held else piece
        if not events:
            self._held = held
            return b""
        out: list[bytes] = []
        cut = 0
        for event in events:
            end = event.end - self._held_at
            raw = held[cut:end]
            cut = end
            new = self._without_usage(event.data)
            drop = new is not None
            if not drop and self._envelope is None:
                self._envelope = _keys(event.data)
            if self._cr_end is not None and raw[:1] == b"\n":  # the LF of the previous event's CRLF
                if self._cr_end:
                    out.append(b"\n")
                raw = raw[1:]
            self._cr_end = (not drop) if raw.endswith(b"\r") else None
            if not drop:
                out.append(raw)
            elif new:
                out.append(b"data: " + new + b"\n\n")
        self._held = held[cut:]
        self._held_at += cut
        return b"".join(out)

    def flush(self) -> bytes:
        """Bytes of an unterminated last event, passed on unchanged at the end of the body."""
        rest, self._held = self._held, b""
        return rest

    def _without_usage(self, data: bytes) -> bytes | None:
        """None for an event to keep as it is; for a usage-only event (the one injection adds) b"" to
        drop it, or its data without `usage` when it carries a field the first event did not."""
        if _usage_free(data) or classify(data).kind != USAGE:
            return None
        if self._envelope is None:
            return b""
        obj = orjson.loads(data)  # classify parsed it: it is an object; once per stream
        if not obj.keys() - self._envelope - _IDENTITY:
            return b""
        del obj["usage"]
        return orjson.dumps(obj)


# Fields every chunk of a stream repeats (or may, like the usage event's own): never a reason to keep it.
_IDENTITY = frozenset({"id", "object", "created", "model", "choices", "usage"})


def _keys(data: bytes) -> frozenset[str] | None:
    """Top-level keys of one event's data (the stream's first: what its chunks carry), if an object."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return frozenset(obj) if isinstance(obj, dict) else None


def _usage_free(chunk: bytes) -> bool:
    """No event in `chunk` can be a usage event: it has no `"usage"` key, or only one, set to null.
    Once usage is asked for, OpenAI's API puts `"usage":null` in every chunk before the usage event;
    telling those apart here keeps them off the decoder (~22k instructions a read, callgrind).
    Inside a JSON string the quotes would be escaped, so a match is a key (or a whole string)."""
    at = chunk.find(b'"usage"')
    return at < 0 or _ONLY_NULL_USAGE.match(chunk, at) is not None
