"""Turn links: the keyed hashes by which a chat request names the recorded replies it continues.

In the recorder process each chat request's conversation is hashed message by message (a keyed
chain, like the prefix hashes). After its response ended, the conversation plus the reply the proxy
forwarded gives its `chat_id`; a later request whose messages up to an assistant message hash to
that value continues it, as Bailian's `parent_chat_id` links turns. Because the reply is part of the
link, two users with the same opening but different replies never merge. Each reply also gets a
keyed hash of its own text and calls alone (`content`), so that a request quoting replies of other
branches (an agent joining parallel calls, as assistant messages or tool results) names them too.
The reply's text is rebuilt from the SSE content the stream scan already walks and only its hashes
are kept; `proxy.linker` turns them into sessions, depths, joins and think times.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from replayproxy.proxy.prompt import content_text

_FIELD = b"\x1f"
_CALL = b"\x1e"
_ROOT = b"replayproxy conversation\0"
_CONTENT = b"replayproxy reply\0"


class Mark(NamedTuple):
    """An assistant message or a tool result of a request: what the linker matches to recorded replies."""

    prefix_id: int  # chain id of the conversation through this assistant message; 0 for a tool result
    content: int  # keyed hash of the message's own text and calls; 0 when it has neither
    chars: int  # characters of its text and calls


class Conversation(NamedTuple):
    """What a chat request's messages link to: keyed digests and the tool results' lengths."""

    digest: bytes  # chain digest over every message sent (8 bytes)
    parent_id: int  # digest up to the last assistant message; 0 when there is none
    tool_chars: int  # characters of the tool/function results after that message
    marks: tuple[Mark, ...] = ()  # its assistant messages and tool results, in order


def _message_payload(role: str, text: str, calls: Sequence[tuple[str, str]]) -> bytes:
    """The canonical bytes of one message: what a client sends back of a reply (role, text, and each
    tool call's name and arguments; ids and types left out, since clients rewrite them)."""
    parts = [role.encode(), _FIELD, text.encode("utf-8", "surrogatepass")]
    for name, arguments in calls:
        parts += (
            _CALL,
            name.encode("utf-8", "surrogatepass"),
            _FIELD,
            arguments.encode("utf-8", "surrogatepass"),
        )
    return b"".join(parts)


def _chain(key: bytes, previous: bytes, payload: bytes) -> bytes:
    return hashlib.blake2b(previous + payload, key=key, digest_size=8).digest()


def as_id(digest: bytes) -> int:
    return int.from_bytes(digest, "little") or 1


def conversation(messages: Sequence[Any], key: bytes) -> Conversation:
    """Chain the keyed digests of `messages` (a chat body's `messages`), noting where the last
    assistant message ends and the length of the tool results after it."""
    digest = hashlib.blake2b(_ROOT, key=key, digest_size=8).digest()
    parent_id = tool_chars = 0
    marks: list[Mark] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        role = role if isinstance(role, str) else ""
        text = content_text(message.get("content"))
        calls = _message_calls(message)
        digest = _chain(key, digest, _message_payload(role, text, calls))
        if role == "assistant":
            parent_id, tool_chars = as_id(digest), 0
            marks.append(Mark(parent_id, content_id(text, calls, key), _size(text, calls)))
        elif role in ("tool", "function"):
            tool_chars += len(text)
            marks.append(Mark(0, content_id(text, [], key), len(text)))
    return Conversation(digest, parent_id, tool_chars, tuple(marks))


def content_id(text: str, calls: Sequence[tuple[str, str]], key: bytes) -> int:
    """The keyed hash of a message's own text and calls, wherever it stands: how a reply is known
    when a request quotes it as an assistant message or returns it as a tool result; 0 = empty."""
    if not text and not calls:
        return 0
    return as_id(
        hashlib.blake2b(_CONTENT + _message_payload("", text, calls), key=key, digest_size=8).digest()
    )


def _size(text: str, calls: Sequence[tuple[str, str]]) -> int:
    return len(text) + sum(len(name) + len(arguments) for name, arguments in calls)


def _message_calls(message: dict[str, Any]) -> list[tuple[str, str]]:
    calls = message.get("tool_calls")
    found = (
        [call.get("function") for call in calls if isinstance(call, dict)] if isinstance(calls, list) else []
    )
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        found.append(legacy)
    return [_name_arguments(f) for f in found if isinstance(f, dict)]


def _name_arguments(function: dict[str, Any]) -> tuple[str, str]:
    name, arguments = function.get("name"), function.get("arguments")
    return (name if isinstance(name, str) else "", arguments if isinstance(arguments, str) else "")


def reply_ids(context: Conversation, reply: Reply, key: bytes) -> tuple[int, int]:
    """The id a continuation's `parent_id` will equal (the conversation plus this reply), and the
    reply's own `content_id` (what a join quoting it matches)."""
    text, calls = reply.finish()
    chat = as_id(_chain(key, context.digest, _message_payload("assistant", text, calls)))
    return chat, content_id(text, calls, key)


class Reply:
    """The reply a stream carried (choice 0), rebuilt as it is scanned: runs of content tokens
    still JSON-escaped (decoded together at the end), decoded pieces, and tool-call fragments."""

    __slots__ = ("_segments", "_calls")

    def __init__(self) -> None:
        self._segments: list[bytes | str] = []  # bytes: a JSON string's inside; str: decoded text
        self._calls: dict[int, list[str]] = {}  # tool-call index -> [name, arguments so far]

    def escaped(self, inside: bytes) -> None:
        """Content tokens as the inside of a JSON string (escapes untouched)."""
        self._segments.append(inside)

    def chunk(self, obj: object) -> None:
        """A parsed streamed chunk (`delta`) or a whole answer (`message`)."""
        choices = obj.get("choices") if isinstance(obj, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            return
        part = choice.get("delta", choice.get("message"))
        if not isinstance(part, dict):
            return
        content = part.get("content")
        if isinstance(content, str) and content:
            self._segments.append(content)
        calls = part.get("tool_calls")
        for position, call in enumerate(calls if isinstance(calls, list) else []):
            if isinstance(call, dict):
                index = call.get("index", position)
                self._call_fragment(index if isinstance(index, int) else position, call.get("function"))
        if isinstance(part.get("function_call"), dict):
            self._call_fragment(-1, part["function_call"])

    def _call_fragment(self, index: int, function: object) -> None:
        if not isinstance(function, dict):
            return
        slot = self._calls.setdefault(index, ["", ""])
        name, arguments = _name_arguments(function)
        slot[0] += name
        slot[1] += arguments

    def finish(self) -> tuple[str, list[tuple[str, str]]]:
        """The reply's text and its tool calls (name, arguments) in index order."""
        out: list[str] = []
        run: list[bytes] = []
        for segment in self._segments:
            if isinstance(segment, bytes):
                run.append(segment)
                continue
            if run:
                out.append(_unescape(run))
                run = []
            out.append(segment)
        if run:
            out.append(_unescape(run))
        legacy = self._calls.pop(-1, None)
        calls = [(name, arguments) for _, (name, arguments) in sorted(self._calls.items())]
        if legacy is not None:
            calls.append((legacy[0], legacy[1]))
        return "".join(out), calls


def _unescape(run: list[bytes]) -> str:
    try:
        text = orjson.loads(b'"' + b"".join(run) + b'"')
    except orjson.JSONDecodeError:
        return ""
    return text if isinstance(text, str) else ""
