"""`--shard i/N` that keeps sessions whole: each shard (a process, or a pod of an Indexed Job) takes
whole connected groups of requests, so closed-loop turns and live-reply continuations never wait on a
turn another shard sends.

Requests are linked when they share a session, or when one continues the reply of another (its
`parent_id` is the other's `chat_id`: an edited or regenerated turn that its recorder filed under a
new session). A group goes to shard `hash(key) mod N`, the key being its first request's session id
(itself a keyed hash) or, outside sessions, its arrival offset: every shard computes the same split
from the same trace, with no coordinator.
"""

from __future__ import annotations

import numpy as np

from replayproxy.trace import Columns

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def components(cols: Columns, rows: np.ndarray) -> np.ndarray:
    """Per selected row (arrival order), the position of the first row of its linked group."""
    n = len(rows)
    label = np.arange(n, dtype=np.int64)
    pairs = [_same_session(cols.session[rows]), _replies(cols.chat_id[rows], cols.parent_id[rows])]
    a = np.concatenate([p[0] for p in pairs])
    b = np.concatenate([p[1] for p in pairs])
    if not len(a):
        return label
    while True:  # label propagation with pointer jumping: each group ends at its smallest position
        before = label.copy()
        low = np.minimum(label[a], label[b])
        np.minimum.at(label, a, low)
        np.minimum.at(label, b, low)
        label = label[label]
        if np.array_equal(label, before):
            return label


def _same_session(sessions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    linked = np.flatnonzero(sessions != 0)
    order = linked[np.argsort(sessions[linked], kind="stable")]
    same = sessions[order[1:]] == sessions[order[:-1]]
    return order[1:][same], order[:-1][same]


def _replies(chat_ids: np.ndarray, parent_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(continuation, the request whose reply it continues) position pairs."""
    holders = np.flatnonzero(chat_ids != 0)
    followers = np.flatnonzero(parent_ids != 0)
    if not len(holders) or not len(followers):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = holders[np.argsort(chat_ids[holders], kind="stable")]
    at = np.searchsorted(chat_ids[order], parent_ids[followers])
    found = at < len(order)
    found[found] = chat_ids[order[at[found]]] == parent_ids[followers[found]]
    return followers[found], order[at[found]]


def shard_of(cols: Columns, rows: np.ndarray, count: int) -> np.ndarray:
    """Per selected row, its shard in [0, count): the same for every row of a linked group."""
    first = components(cols, rows)
    keys = np.where(
        cols.session[rows][first] != 0,
        cols.session[rows][first].astype(np.uint64),
        cols.offset_ns[rows][first].astype(np.uint64) ^ _GOLDEN,
    )
    with np.errstate(over="ignore"):  # splitmix64: spreads sequential keys evenly
        z = keys + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    shards: np.ndarray = (z % np.uint64(count)).astype(np.int64)
    return shards
