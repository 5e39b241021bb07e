"""Live replies: a session's next turn carries the candidate's own reply where production's stood.

Closed-loop replay knows each turn's reply when the turn ends. The next turn's prompt is then the
previous prompt as sent, the reply (its text for chat; its token ids for token-id completions, from
vLLM's `return_token_ids`, else the text tokenized), and the new part: the planned turn's new
messages cut or stretched so the whole prompt has the recorded input length under the target's
tokenizer. One tokenize call per chat turn measures the prompt with one word per new message;
alphabet words are one token each (replay.prompt_parts), so the difference fixes the word count. The
engine's prefix cache then sees what production's did: its own reply again in the next turn.
Built after the previous turn ended, during the think time; a build that outlasts the think time
shows as schedule lag of that turn.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, TypedDict, get_args

import aiohttp
import orjson

from replayproxy import sse
from replayproxy.replay import continuations, flavors, prompt_parts, tokenizer_setup
from replayproxy.replay.connection import Target
from replayproxy.replay.prepared import Prepared
from replayproxy.replay.request_timeline import RequestTimeline
from replayproxy.replay.tokenizer import Chat, Tokenizer, TokenizerError, calls_made

_log = logging.getLogger("replayproxy.replay")
ReplyMode = Literal["live", "planned"]
MODES: tuple[ReplyMode, ...] = get_args(ReplyMode)


class Reply(NamedTuple):
    """What one turn generated, as the next turn sends it back: text, and token ids when given."""

    text: str
    ids: list[int] | None  # None: the target did not return them
    tool_call: bool  # the reply was a tool call (its next turn is left as planned)


def reply_of(reads: Sequence[tuple[int, bytes]], stream: bool) -> Reply:
    """Choice 0's content (chat) or text (completions) and token ids, from a response's raw reads."""
    texts: list[str] = []
    ids: list[int] = []
    given = tool_call = False
    if stream:
        decoder = sse.SSEDecoder()
        events = [e.data for _, data in reads for e in decoder.feed(data)]
        objects = [_loads(data) for data in events if data.startswith(b"{")]
    else:
        objects = [_loads(b"".join(data for _, data in reads))]
    for obj in objects:
        choices = obj.get("choices") if isinstance(obj, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        part = choice.get("delta", choice.get("message"))
        text = part.get("content") if isinstance(part, dict) else choice.get("text")
        if isinstance(text, str):
            texts.append(text)
        if isinstance(part, dict) and part.get("tool_calls"):
            tool_call = True
        token_ids = choice.get("token_ids")
        if isinstance(token_ids, list):
            given = True
            ids += [t for t in token_ids if isinstance(t, int)]
    return Reply("".join(texts), ids if given else None, tool_call)


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


@dataclass(frozen=True, slots=True)
class Setup:
    """What a sender process needs to build live turns (picklable, for worker processes)."""

    words: tuple[str, ...]  # the measured alphabet: one token each
    tokenizer_path: str  # --tokenizer or the served one found on this host; "" for the engine's endpoint
    chat_template: str
    flavor: str
    url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)


class LiveReplies(TypedDict):
    """The run's `live_replies` side record: how its live turns came out (counts only)."""

    built: int
    short: int
    planned: dict[str, int]  # why a turn kept its planned body -> turns
    reply_tokens: int
    reply_tokens_as_generated: int
    target_calls: int


@dataclass(slots=True)
class Counts:
    """How the live turns came out: built exactly, built short of words, or left as planned."""

    built: int = 0
    short: int = 0  # the reply left less room than one word per new message
    planned: dict[str, int] = field(default_factory=dict)  # why a turn kept its planned body
    reply_tokens: int = 0  # generated tokens of the replies threaded, where the target gave their ids
    as_generated: int = 0  # ...of which the next prompt holds the same ids (before the first change)
    target_calls: int = 0  # tokenize calls to the target during the run (no local tokenizer)

    def keep(self, why: str) -> None:
        if why not in self.planned:
            _log.warning("live replies: a turn keeps its planned prompt (%s)", why)
        self.planned[why] = self.planned.get(why, 0) + 1

    def record(self) -> LiveReplies:
        """The run's `live_replies` side record."""
        return LiveReplies(
            built=self.built,
            short=self.short,
            planned=dict(self.planned),
            reply_tokens=self.reply_tokens,
            reply_tokens_as_generated=self.as_generated,
            target_calls=self.target_calls,
        )

    def round_trip(self, generated: Sequence[int] | None, sent: Sequence[int]) -> None:
        """Count how far the ids sent back follow the ids generated: a prefix cache hits the reply
        only that far (a reply text that re-tokenizes otherwise, e.g. split UTF-8, stops it)."""
        if generated is None:
            return
        same = next((i for i, (a, b) in enumerate(zip(generated, sent, strict=False)) if a != b), None)
        self.reply_tokens += len(generated)
        self.as_generated += min(len(generated), len(sent)) if same is None else same


class Threader:
    """Builds each continued turn's body from the previous body sent and the reply it got."""

    def __init__(
        self,
        setup: Setup,
        tokenizer: Tokenizer,
        target: Target | None = None,
        headers: Mapping[str, str] | None = None,
        continued: Mapping[int, int] | None = None,
    ) -> None:
        self.setup = setup
        self.tokenizer = tokenizer
        self.counts = Counts()
        self._calls_before = calls_made(tokenizer)  # the endpoint's probe, made before the clock
        self._target = target
        self._headers = {"Accept": "text/event-stream", **(headers or {})}
        self._continued = Counter(continued or {})  # trace index -> later turns still to build on it
        self._sent: dict[int, Any] = {}  # trace index -> prompt sent (messages, ids or text), if rebuilt

    def record(self) -> LiveReplies:
        """The counts, with the tokenize calls the run made to the target (an engine tokenizer's)."""
        self.counts.target_calls = calls_made(self.tokenizer) - self._calls_before
        return self.counts.record()

    async def wire_after(
        self, previous: RequestTimeline, joins: Sequence[RequestTimeline | None], turn: Prepared, wire: bytes
    ) -> bytes | None:
        """The request bytes of `turn` (planned as `wire`) after its previous turn and the requests
        it joins (None: not replayed here) ended; None: as planned. Streamed requests carry their
        bodies only inside their wire bytes."""
        if previous.error or previous.status != 200:
            self.counts.keep("the previous turn failed")
            return None
        reply = reply_of(previous.reads, previous.prepared.stream)
        joined = [
            None if j is None or j.error or j.status != 200 else reply_of(j.reads, j.prepared.stream).text
            for j in joins
        ]
        sent = previous.prepared
        if not sent.body:
            sent = replace(sent, body=body_of(previous.wire))
        planned = turn if turn.body else replace(turn, body=body_of(wire))
        body = await self.body_after(sent, reply, planned, joined)
        if body is None or self._target is None:
            return None
        return self._target.request_bytes("POST", turn.path, body, self._headers)

    async def body_after(
        self, previous: Prepared, reply: Reply, turn: Prepared, joined: Sequence[str | None] = ()
    ) -> bytes | None:
        """The body of `turn` continuing `previous` with `reply`, and carrying the `joined` replies
        of the requests it joins (None: its planned text stays); None keeps the planned body."""
        prompt = self._sent.get(previous.index)
        self._continued[previous.index] -= 1
        if self._continued[previous.index] <= 0:  # its last follower: forget what it sent
            self._sent.pop(previous.index, None)
        if prompt is None:
            prompt = orjson.loads(previous.body).get("messages" if previous.endpoint == "chat" else "prompt")
        body = orjson.loads(turn.body)
        built: list[Any] | str | None
        edited = continuations.is_follower(turn, previous)  # keeps its own reply: the previous prompt only
        if reply.tool_call and not edited:
            self.counts.keep("the reply was a tool call")
            return None
        if turn.endpoint == "chat":
            sent_reply = None if edited else reply
            built = await self._chat(
                prompt, sent_reply, body, turn.expected_input_tokens, previous.expected_input_tokens,
                {} if edited else dict(zip(turn.join_slots, joined, strict=False)),
            )  # fmt: skip
        elif isinstance(prompt, list) and isinstance(body.get("prompt"), list):
            built = await self._ids(prompt, reply, body["prompt"], turn.expected_input_tokens)
        elif isinstance(prompt, str) and isinstance(body.get("prompt"), str):
            built = await self._text(prompt, reply, body["prompt"], turn.expected_input_tokens)
        else:
            built = None
        if built is None:
            self.counts.keep("the planned turn does not continue the previous prompt")
            return None
        if self._continued[turn.index] > 0:
            self._sent[turn.index] = built
        self.counts.built += 1
        return orjson.dumps({**body, ("messages" if turn.endpoint == "chat" else "prompt"): built})

    def _room(self, need: int, parts: int) -> int:
        """`need` words over `parts` parts, each at least one (counted when that is too many)."""
        if need < parts:
            self.counts.short += 1
        return max(need, parts)

    async def _chat(
        self,
        before: Any,
        reply: Reply | None,
        body: dict[str, Any],
        target: int,
        before_tokens: int,
        joined: Mapping[int, str | None],
    ) -> list[Any] | None:
        """`before`, the reply as the assistant message (unless None: the turn keeps its own), then
        the planned new messages: the `joined` replies (by message index: where the recorded join's
        context had the replies it joins; None keeps the planned text there), the others sized so
        that the whole prompt has `target` tokens."""
        messages = body.get("messages")
        if not isinstance(before, list) or not isinstance(messages, list):
            return None
        n = len(before)
        if len(messages) < n + 2 or messages[n].get("role") != "assistant":
            return None
        pool = _words(messages[n:], self.setup.words)
        if reply is None:
            head, new = list(before), messages[n:]
        else:
            head, new = [*before, {"role": "assistant", "content": reply.text}], messages[n + 1 :]
        fixed = {  # by index into `new`, whose first message is the head's length into the prompt
            at - len(head): str(new[at - len(head)].get("content") or "") if text is None else text
            for at, text in joined.items()
            if 0 <= at - len(head) < len(new)
        }
        new = [{**m, "content": fixed[i]} if i in fixed else m for i, m in enumerate(new)]
        sized = [i for i in range(len(new)) if i not in fixed]
        if target <= 0 or not sized:
            return [*head, *new]
        probe = [
            *head,
            *({"role": m["role"], "content": fixed.get(i, pool[i % len(pool)])} for i, m in enumerate(new)),
        ]
        [ids] = await self.tokenizer.encode_chat([Chat(probe, body.get("tools"))])
        if reply is not None and before_tokens > 0:
            self.counts.round_trip(reply.ids, ids[before_tokens:])
        need = self._room(target - (len(ids) - len(sized)), len(sized))
        lengths = _split(need, [len(str(new[i].get("content") or "").split()) for i in sized])
        contents, at = dict(fixed), 0
        for i, length in zip(sized, lengths, strict=True):
            contents[i] = " ".join(pool[(at + j) % len(pool)] for j in range(length))
            at += length
        return [*head, *({**m, "content": contents[i]} for i, m in enumerate(new))]

    async def _ids(self, before: list[Any], reply: Reply, planned: list[Any], target: int) -> list[int]:
        reply_ids = reply.ids
        if reply_ids is None:
            [reply_ids] = await self.tokenizer.encode_text([reply.text], special=False)
        pool = [t for t in planned[len(before) :] if isinstance(t, int)] or [
            t for t in planned if isinstance(t, int)
        ]
        head = [*before, *reply_ids]
        self.counts.round_trip(reply.ids, reply_ids)
        need = self._room(target - len(head), 1) if target > 0 else len(pool)
        return head + [pool[i % len(pool)] for i in range(need)]

    async def _text(self, before: str, reply: Reply, planned: str, target: int) -> str:
        pool = planned.split() or list(self.setup.words)
        head = before + reply.text
        if target <= 0:
            return head + " " + " ".join(pool)
        [ids] = await self.tokenizer.encode_text([head + " " + pool[0]], special=True)
        need = self._room(target - (len(ids) - 1), 1)
        return head + " " + " ".join(pool[i % len(pool)] for i in range(need))


def _words(messages: Sequence[Any], alphabet: Sequence[str]) -> list[str]:
    """The planned contents' words (alphabet words), else the alphabet itself."""
    words = [w for m in messages if isinstance(m, dict) for w in str(m.get("content") or "").split()]
    return words or list(alphabet)


def _split(total: int, planned: Sequence[int]) -> list[int]:
    """`total` words over the new messages: the planned sizes but the last, which takes the rest,
    or evenly when the planned ones leave the last nothing."""
    parts = len(planned)
    head = [max(1, p) for p in planned[:-1]]
    if total - sum(head) >= 1:
        return [*head, total - sum(head)]
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def setup_for(
    book: prompt_parts.Book | None,
    options_tokenizer: str,
    chat_template: str,
    flavor: flavors.Flavor,
    url: str,
    model: str,
    headers: dict[str, str],
) -> tuple[Setup | None, str]:
    """The live-reply setup for an exact run, or None and why replies stay as planned."""
    if book is None:
        return None, "planned: no tokenizer measured, so a reply's length cannot be sized exactly"
    setup = Setup(book.alphabet.words, options_tokenizer, chat_template, flavor.name, url, model, headers)
    return setup, f"live ({book.tokenizer_name})"


def body_of(wire: bytes) -> bytes:
    """The body of a whole HTTP request (replay.connection.Target.request_bytes)."""
    return wire[wire.index(b"\r\n\r\n") + 4 :]


@contextlib.asynccontextmanager
async def opened(
    setup: Setup, target: Target, headers: Mapping[str, str], after: Sequence[int]
) -> AsyncIterator[Threader]:
    """A threader with its own tokenizer (and HTTP session, for an engine's tokenize endpoint)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60.0)) as session:
        tokenizer, why = await tokenizer_setup.find_tokenizer(
            setup.tokenizer_path, setup.chat_template, flavors.get(setup.flavor), session, setup.url,
            setup.model, setup.headers,
        )  # fmt: skip
        if tokenizer is None:
            raise TokenizerError(f"live replies: no tokenizer for the run ({why})")
        continued = Counter(a for a in after if a >= 0)
        yield Threader(setup, tokenizer, target, headers, continued)
