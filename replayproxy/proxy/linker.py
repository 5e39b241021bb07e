"""Session graphs at record time: which recorded replies a chat request waits for.

A request continues the turn whose `chat_id` its conversation hashes to at an assistant message —
the last one for a plain turn, an earlier one for a branch whose later assistant messages are
replies of other requests (an agent joining parallel calls by quoting their answers). Every
assistant message or tool result after that point whose own text is a recorded reply is a join.
So a request gets its parent, its joins, its session (the parent's, else the first join's), its
depth (one past its deepest dependency) and its think time (from the last-ending dependency: for
a tool result, the tool wait). Only keyed hashes and numbers are held.

Runs in the recorder process only. Records come in the order responses end, and a request arrives
after the replies it quotes ended, so every dependency is linked before its dependents.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from replayproxy.proxy.links import Conversation, Mark, as_id

# A reply quoted from another session (a sub-agent with its own context returning its answer) is a
# join only past this many characters: short answers ("Done.") recur across unrelated sessions.
CROSS_SESSION_CHARS = 32
_REMEMBERED = 8  # identical replies remembered per hash; beyond a few they are not told apart anyway


@dataclass(slots=True)
class _Ended:
    """A recorded request whose reply may be continued or joined."""

    chat: int
    session: int
    turn: int
    end_ns: int
    continued: bool = False


class SessionLink(NamedTuple):
    session: int
    turn: int  # depth: one past the deepest dependency; 0 for a root
    think_ns: int  # last dependency's end -> arrival; -1 when it depends on nothing this recorder saw
    parent_id: int
    tool_chars: int  # tool results after the parent that no recorded reply explains
    join_ids: tuple[int, ...]


class SessionLinker:
    """Recent replies by chat id and by content, and the requests they ended, bounded by count
    (oldest forgotten first)."""

    def __init__(self, key: bytes, capacity: int = 1 << 16) -> None:
        self._key = key
        self._capacity = capacity
        self._by_chat: OrderedDict[int, list[_Ended]] = OrderedDict()
        self._by_content: OrderedDict[int, list[_Ended]] = OrderedDict()

    def link(
        self, context: Conversation, chat: int, content: int, arrival_ns: int, end_ns: int
    ) -> SessionLink:
        """Session, depth, joins and think time of a request; remember its reply for dependents."""
        parent, at = self._parent_of(context.marks, arrival_ns)
        joins, tool_chars = self._joins(context.marks[at + 1 :], parent, arrival_ns)
        if parent is None and not joins:
            seed = context.digest + arrival_ns.to_bytes(8, "little", signed=True)
            session = as_id(hashlib.blake2b(b"session\0" + seed, key=self._key, digest_size=8).digest())
            found = SessionLink(session, 0, -1, context.parent_id, context.tool_chars, ())
        else:
            needed = [parent, *joins] if parent is not None else joins
            if parent is not None:
                parent.continued = True
            found = SessionLink(
                needed[0].session,
                max(e.turn for e in needed) + 1,
                max(0, arrival_ns - max(e.end_ns for e in needed)),
                context.marks[at].prefix_id if parent is not None else 0,
                tool_chars,
                tuple(e.chat for e in joins),
            )
        if chat and end_ns >= 0:
            ended = _Ended(chat, found.session, found.turn, end_ns)
            self._remember(self._by_chat, chat, ended)
            # An empty reply (an end-of-sequence first) is remembered too, under content 0: a join
            # quoting it is told by its session and by the other replies it quotes.
            self._remember(self._by_content, content, ended)
        return found

    def _parent_of(self, marks: Sequence[Mark], arrival_ns: int) -> tuple[_Ended | None, int]:
        """The turn continued and the index of its assistant message; walking back past assistant
        messages that are recorded replies of other requests (joined branches). None with the index
        after which the context holds nothing recorded: -1 when every assistant message is a reply."""
        for i in range(len(marks) - 1, -1, -1):
            mark = marks[i]
            if not mark.prefix_id:
                continue  # a tool result
            parent = self._parent(mark.prefix_id, arrival_ns)
            if parent is not None:
                return parent, i
            if not any(e.end_ns <= arrival_ns for e in self._by_content.get(mark.content, ())):
                return None, i  # a message no recorded reply explains (edited, or not seen)
        return None, -1

    def _parent(self, parent_id: int, arrival_ns: int) -> _Ended | None:
        """Of the turns with that reply, the oldest not yet continued that ended before it arrived
        (two users with identical turns so far are told apart), else the newest (a branch, a retry
        or an edited turn continues the same session)."""
        candidates = self._by_chat.get(parent_id)
        if not candidates:
            return None
        for candidate in candidates:
            if not candidate.continued and candidate.end_ns <= arrival_ns:
                return candidate
        return candidates[-1]

    def _joins(
        self, marks: Sequence[Mark], parent: _Ended | None, arrival_ns: int
    ) -> tuple[list[_Ended], int]:
        """The recorded replies quoted after the parent's message, each once, and the characters of
        the tool results that are none of them."""
        joins: list[_Ended] = []
        seen = {parent.chat} if parent is not None else set()
        tool_chars = 0
        for mark in marks:
            reply = self._reply(mark, parent, arrival_ns, seen)
            if reply is None:
                tool_chars += 0 if mark.prefix_id else mark.chars
                continue
            seen.add(reply.chat)
            joins.append(reply)
        return joins, tool_chars

    def _reply(self, mark: Mark, parent: _Ended | None, arrival_ns: int, seen: set[int]) -> _Ended | None:
        """The recorded reply a message quotes and no earlier message did (`seen`): the newest ended
        before the request arrived, in the parent's session if one is; from another session only
        when long enough to be told apart."""
        ended = [
            e for e in self._by_content.get(mark.content, ()) if e.end_ns <= arrival_ns and e.chat not in seen
        ]
        if parent is not None:
            same = [e for e in ended if e.session == parent.session]
            if same:
                return same[-1]
        return ended[-1] if ended and mark.chars >= CROSS_SESSION_CHARS else None

    def _remember(self, index: OrderedDict[int, list[_Ended]], key: int, ended: _Ended) -> None:
        candidates = index.get(key)
        if candidates is None:
            index[key] = [ended]
            if len(index) > self._capacity:
                index.popitem(last=False)
        else:
            candidates.append(ended)
            del candidates[:-_REMEMBERED]
            index.move_to_end(key)
