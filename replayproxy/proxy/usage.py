"""Usage injection: the one place the proxy rewrites bytes, and only for requests that need it.

Streaming engines report token counts only when asked (`stream_options.include_usage`). For a
recorded streaming request that did not set `stream_options`, the proxy splices that option into
the body (every other byte unchanged) and removes the `choices: []` usage event it caused from
what the client receives, so the client's byte stream is what it would have been without the
proxy. Requests that already carry `stream_options` are never touched (continuous usage would
change every chunk). Asking for usage can move fields: llama.cpp moves its `timings` out of the
finish chunk into the usage event. So the finish event is held back until the next event: when
that is the usage event, the members it carries that the finish event lacks (beyond a chunk's
identity) are put back at the end of the finish event, where the engine writes them unasked, and
the usage event is dropped whole. An event the client did not ask for never reaches it.
"""

from __future__ import annotations

import json
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
    """Passes an SSE body through, minus the usage event; holds back only an incomplete event and
    a finish event (until the next event shows whether fields moved out of it)."""

    __slots__ = ("idle", "_decoder", "_held", "_held_at", "_cr_end", "_finish")

    def __init__(self) -> None:
        self.idle = False  # True: nothing held or pending, `feed` returns `plain` events as they are
        self._decoder: SSEDecoder | None = None  # only while an event is incomplete or may be usage
        self._held = b""
        self._held_at = 0  # stream offset of _held[0]
        self._cr_end: bool | None = None  # last event ended on CR: True if it was kept, False if dropped
        self._finish = b""  # a whole finish event, held back

    def feed(self, piece: bytes) -> bytes:
        if not self._held and not self._finish and piece.endswith(b"\n\n") and plain(piece):
            # Whole events, no usage, no finish (nearly every chunk): pass on untouched.
            if self._cr_end is not None and piece[:1] == b"\n":
                piece = piece if self._cr_end else piece[1:]
            self._decoder, self._cr_end = None, None
            self.idle = True
            return piece
        out: list[bytes] = []
        lines = data_lines(piece) if self._decoder is None and self._cr_end is None else None
        if lines is not None:  # one-line events only (the usage event and [DONE]): no decoder needed
            for line in lines:
                self._pass(line + b"\n\n", line[6:], out)
            return b"".join(out)
        self.idle = False
        if self._decoder is None:
            self._decoder, self._held_at = SSEDecoder(), 0
        events = self._decoder.feed(piece)
        held = self._held + piece if self._held else piece
        if not events:
            self._held = held
            return b""
        cut = 0
        for event in events:
            end = event.end - self._held_at
            raw = held[cut:end]
            cut = end
            if self._cr_end is not None and raw[:1] == b"\n":  # the LF of the previous event's CRLF
                if self._cr_end:
                    if self._finish:
                        self._finish += b"\n"
                    else:
                        out.append(b"\n")
                raw = raw[1:]
            kept = self._pass(raw, event.data, out)
            self._cr_end = kept if raw.endswith(b"\r") else None
        self._held = held[cut:]
        self._held_at += cut
        return b"".join(out)

    def flush(self) -> bytes:
        """A held finish event and the bytes of an unterminated last event, unchanged, at the body's end."""
        rest, self._finish, self._held = self._finish + self._held, b"", b""
        return rest

    def _pass(self, raw: bytes, data: bytes, out: list[bytes]) -> bool:
        """Hand one whole event on to `out` (or hold it, a finish event); False: it was dropped."""
        finish = self._finish
        if _usage_free(data) or classify(data).kind != USAGE:
            if finish:
                out.append(finish)
            if _finishes(data):  # the usage event may follow with fields moved out of it
                self._finish = raw
                self.idle = False
            else:
                self._finish = b""
                out.append(raw)
            return True
        if finish:
            self._finish = b""
            out.append(_merged(finish, data))
        return False


# Members every chunk of a stream carries (or may, like the usage event's own): never moved.
_IDENTITY = frozenset({"id", "object", "created", "model", "choices", "usage"})
_JSON = json.JSONDecoder()


def _merged(finish: bytes, usage_data: bytes) -> bytes:
    """The finish event with the usage event's members it lacks appended (llama.cpp's `timings`),
    each as the engine wrote it; the finish event as it is when there are none or either is odd."""
    try:
        moved = _members(usage_data)
        end = finish.rfind(b"}")
        line = finish.find(b"data:")
        have = _members(finish[line + 5 : end + 1].strip())
    except (ValueError, IndexError):  # not one-line JSON objects: nothing can be put back safely
        return finish
    extra = [text for key, text in moved.items() if key not in _IDENTITY and key not in have]
    if not extra:
        return finish
    return finish[:end] + b"," + b",".join(extra) + finish[end:]


def _members(data: bytes) -> dict[str, bytes]:
    """Top-level members of a JSON object's text, each as written (`"key":value`), by key."""
    text = data.decode()
    at = _skip(text, text.index("{") + 1)
    members: dict[str, bytes] = {}
    while text[at] != "}":
        key, colon = _JSON.raw_decode(text, at)
        colon = _skip(text, colon)
        if text[colon] != ":":
            raise ValueError("no colon after a key")
        _, end = _JSON.raw_decode(text, _skip(text, colon + 1))
        members[key] = text[at:end].encode()
        at = _skip(text, end)
        if text[at] == ",":
            at = _skip(text, at + 1)
    return members


def _skip(text: str, at: int) -> int:
    """The index of the first non-space character at or after `at` (JSON's four spaces)."""
    while text[at] in " \t\r\n":
        at += 1
    return at


def plain(chunk: bytes) -> bool:
    """No event in `chunk` is a usage event or a finish event: the stripper passes it on untouched."""
    return _usage_free(chunk) and not _finishes(chunk)


def _finishes(chunk: bytes) -> bool:
    """A finish reason that is a string (written without or with a space) is in `chunk`. Two
    substring searches: `partition` takes its argument directly where `find` parses it from a tuple."""
    return bool(chunk.partition(b'_reason":"')[1] or chunk.partition(b'_reason": "')[1])


def _usage_free(chunk: bytes) -> bool:
    """No event in `chunk` can be a usage event: it has no `"usage"` key, or only one, set to null.
    Once usage is asked for, OpenAI's API puts `"usage":null` in every chunk before the usage event;
    telling those apart here keeps them off the decoder (~22k instructions a read, callgrind).
    Inside a JSON string the quotes would be escaped, so a match is a key (or a whole string)."""
    at = chunk.find(b'"usage"')
    return at < 0 or _ONLY_NULL_USAGE.match(chunk, at) is not None
