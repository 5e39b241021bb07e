"""Turn links: which earlier reply a chat request continues, by keyed hashes, and its think time.

In the recorder process each chat request's conversation is hashed message by message (a keyed
chain, like the prefix hashes). After its response ended, the conversation plus the reply the proxy
forwarded gives its `chat_id`; a later request whose messages up to its last assistant message hash
to that value (`parent_id`) continues it, as Bailian's `parent_chat_id` links turns. Because the
reply is part of the link, two users with the same opening but different replies never merge. The
reply's text is rebuilt from the SSE content the stream scan already walks and only its hash is
kept. `SessionLinker` remembers recent chat ids (bounded) and gives each request its session, turn
and think time (end of the reply it continues to its own arrival).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from replayproxy.proxy.prompt import content_text

_FIELD = b"\x1f"
_CALL = b"\x1e"
_ROOT = b"replayproxy conversation\0"


class Conversation(NamedTuple):
    """What a chat request's messages link to: keyed digests and the tool results' lengths."""

    digest: bytes  # chain digest over every message sent (8 bytes)
    parent_id: int  # digest up to the last assistant message; 0 when there is none
    tool_chars: int  # characters of the tool/function results after that message


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


def _as_id(digest: bytes) -> int:
    return int.from_bytes(digest, "little") or 1


def conversation(messages: Sequence[Any], key: bytes) -> Conversation:
    """Chain the keyed digests of `messages` (a chat body's `messages`), noting where the last
    assistant message ends and the length of the tool results after it."""
    digest = hashlib.blake2b(_ROOT, key=key, digest_size=8).digest()
    parent_id = tool_chars = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        role = role if isinstance(role, str) else ""
        text = content_text(message.get("content"))
        digest = _chain(key, digest, _message_payload(role, text, _message_calls(message)))
        if role == "assistant":
            parent_id, tool_chars = _as_id(digest), 0
        elif role in ("tool", "function"):
            tool_chars += len(text)
    return Conversation(digest, parent_id, tool_chars)


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


def chat_id(context: Conversation, reply: Reply, key: bytes) -> int:
    """The id a continuation's `parent_id` will equal: the conversation plus this reply."""
    text, calls = reply.finish()
    return _as_id(_chain(key, context.digest, _message_payload("assistant", text, calls)))


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


@dataclass(slots=True)
class _Ended:
    """A recorded turn whose reply may be continued."""

    session: int
    turn: int
    end_ns: int
    continued: bool = False


class Link(NamedTuple):
    session: int
    turn: int
    think_ns: int  # -1 when the turn continues nothing this recorder saw


class SessionLinker:
    """Recent chat ids and the turns they ended, bounded by count (oldest forgotten first).

    Runs in the recorder process only. Records come in the order responses end, and a continuation
    arrives after its parent's reply ended, so a parent is always linked before its children."""

    def __init__(self, key: bytes, capacity: int = 1 << 16) -> None:
        self._key = key
        self._capacity = capacity
        self._ended: OrderedDict[int, list[_Ended]] = OrderedDict()

    def link(self, context: Conversation, chat: int, arrival_ns: int, end_ns: int) -> Link:
        """Session, turn and think time of a request, and remember its reply for continuations."""
        parent = self._parent(context.parent_id, arrival_ns) if context.parent_id else None
        if parent is None:
            seed = context.digest + arrival_ns.to_bytes(8, "little", signed=True)
            session = _as_id(hashlib.blake2b(b"session\0" + seed, key=self._key, digest_size=8).digest())
            found = Link(session, 0, -1)
        else:
            parent.continued = True
            found = Link(parent.session, parent.turn + 1, max(0, arrival_ns - parent.end_ns))
        if chat and end_ns >= 0:
            self._remember(chat, _Ended(found.session, found.turn, end_ns))
        return found

    def _parent(self, parent_id: int, arrival_ns: int) -> _Ended | None:
        """The turn this request continues: of those with that reply, the oldest not yet continued
        that ended before it arrived (two users with identical turns so far are told apart), else
        the newest (a retry or an edited turn continues the same session)."""
        candidates = self._ended.get(parent_id)
        if not candidates:
            return None
        for candidate in candidates:
            if not candidate.continued and candidate.end_ns <= arrival_ns:
                return candidate
        return candidates[-1]

    def _remember(self, chat: int, ended: _Ended) -> None:
        candidates = self._ended.get(chat)
        if candidates is None:
            self._ended[chat] = [ended]
            if len(self._ended) > self._capacity:
                self._ended.popitem(last=False)
        else:
            candidates.append(ended)
            del candidates[:-8]  # identical conversations beyond a few are not told apart anyway
            self._ended.move_to_end(chat)
