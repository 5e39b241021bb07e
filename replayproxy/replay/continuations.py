"""Closed-loop rewrites of planned requests, made in arrival order from the requests before them.

In closed loop a later turn is built on the turn it continues, so the plan says more than the
trace: which turns ask the target for their generated ids (a later turn sends them back), how much
of a continued turn the cache already holds (its previous prompt and reply), and which requests
extend an earlier turn's conversation with an edited reply although the proxy could not link them.
Each rewrite looks only backwards (at requests planned before it), so the planner makes them as it
goes and a streamed preparation holds only the live sessions' few numbers, not the whole list.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import orjson

from replayproxy.replay.prepared import Prepared
from replayproxy.trace import Columns

TOKEN_ID_FLAVORS = ("vllm",)  # answer `return_token_ids` with each choice's generated ids


class _Leader(NamedTuple):
    row: int
    expected_input_tokens: int
    group: int  # its session's first turn (followers stay with it)


class Continuations:
    """The rewrites of one closed-loop plan. `trace_index` / `after`: the schedule (arrival order);
    `live`: later turns carry the candidate's replies (--replies live); `token_ids`: the target
    returns generated ids when asked (vLLM)."""

    def __init__(
        self,
        cols: Columns,
        trace_index: np.ndarray,
        after: np.ndarray,
        speed: float,
        *,
        live: bool,
        token_ids: bool,
    ) -> None:
        self._cols, self._speed, self._live = cols, speed, live
        linked = after[after >= 0]
        self._asks = np.isin(trace_index, linked) if live and token_ids else np.zeros(len(trace_index), bool)
        self._pending = Counter(linked.tolist()) if live else Counter()  # index -> later turns to come
        self._lengths: dict[int, tuple[int, int]] = {}  # index -> (input, output) of a turn still continued
        self._leaders: dict[int, _Leader] = {}  # digest of a later turn's opening -> the earliest such turn
        self._sizes: list[int] = []  # message counts among those openings, largest first

    def asks_ids(self, position: int) -> bool:
        """Whether the request at `position` asks for its generated ids (a later turn sends them back)."""
        return bool(self._asks[position])

    def rewrite(self, p: Prepared, messages: Any) -> Prepared:
        """`p` as closed loop sends it; `messages`: its planned chat messages (None otherwise)."""
        if self._live:
            p = self._expect_live_sharing(p)
        if p.endpoint != "chat" or messages is None:
            return p
        if p.after >= 0:
            if (key := _opening(messages, None)) is not None:
                digest = _digest(key)
                if digest not in self._leaders:
                    self._leaders[digest] = _Leader(p.index, p.expected_input_tokens, p.group)
                    if key[0] not in self._sizes:
                        self._sizes = sorted([*self._sizes, key[0]], reverse=True)
            return p
        if self._leaders and p.expected_shared_tokens > 0:
            for n in self._sizes:
                key = _opening(messages, n)
                leader = self._leaders.get(_digest(key)) if key is not None else None
                if leader is not None:
                    return self._follow(p, leader)
        return p

    def _expect_live_sharing(self, p: Prepared) -> Prepared:
        """A continued turn shares with the cache everything its previous turn computed: that prompt
        and its reply but the last token (whose KV is never computed), at most its own length - 1."""
        if self._pending[p.index] > 0:
            self._lengths[p.index] = (p.expected_input_tokens, p.expected_output_tokens)
        previous = self._lengths.get(p.after) if p.after >= 0 else None
        if p.after >= 0:
            self._pending[p.after] -= 1
            if self._pending[p.after] <= 0:
                self._lengths.pop(p.after, None)
                del self._pending[p.after]
        if previous is not None and min(previous[0], p.expected_input_tokens) > 0:
            computed = previous[0] + max(previous[1], 1) - 1
            shared = max(p.expected_shared_tokens, min(computed, p.expected_input_tokens - 1))
            p = replace(p, expected_shared_tokens=shared)
        return p

    def _follow(self, p: Prepared, leader: _Leader) -> Prepared:
        """A request extending `leader`'s conversation with an edited reply (the client sent something
        else back, so the proxy could not link it) waits for its end plus the recorded gap: in
        production it came after it, and sent at its offset it could find it still prefilling. With
        live replies it is built on the messages the leader sent, so it shares its whole prompt."""
        cols = self._cols
        end = int(cols.offset_ns[leader.row]) + max(int(cols.e2e_ns[leader.row]), 0)
        think = round(max(int(cols.offset_ns[p.index]) - end, 0) / self._speed)
        shared = p.expected_shared_tokens
        if self._live:
            shared = max(shared, min(leader.expected_input_tokens, p.expected_input_tokens - 1))
        return replace(p, after=leader.row, think_ns=think, first=leader.group, expected_shared_tokens=shared)


def is_follower(turn: Prepared, previous: Prepared) -> bool:
    """Whether `turn` follows `previous` by its messages (an edited reply) rather than by session."""
    return turn.session == 0 or turn.session != previous.session


def _opening(messages: Any, n: int | None) -> tuple[int, bytes, str] | None:
    """The first `n` messages (all when None) as a key: the ones before the last whole, the last
    by its first word; for a follower (`n` given), message n must be an assistant message."""
    if not isinstance(messages, list) or not messages:
        return None
    n = len(messages) if n is None else n
    if not 0 < n <= len(messages) or not all(isinstance(m, dict) for m in messages[: n + 1]):
        return None
    if n < len(messages) and messages[n].get("role") != "assistant":
        return None
    last = str(messages[n - 1].get("content") or "").split()
    return n, orjson.dumps(messages[: n - 1]), last[0] if last else ""


def _digest(key: tuple[int, bytes, str]) -> int:
    """A key kept as 128 bits: the leaders of a long trace must not hold their conversations."""
    n, before, word = key
    h = hashlib.blake2b(before, digest_size=16)
    h.update(b"\0" + word.encode() + b"\0" + str(n).encode())
    return int.from_bytes(h.digest(), "little")
