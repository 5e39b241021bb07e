"""The rendered words of prefixes that recur, kept so that exact planning copies them instead of
choosing and joining them again for every request that shares them (a system prompt, a session's
earlier turns).

Inside its recorded blocks an exact prompt's words depend only on those blocks' hashes (which,
within one preparation, also fix where the blocks fall), their branch words and where the
messages fall (replay.layout), so a key of exactly these gives the same
pieces to every request that has them: bodies stay byte-identical whether a prefix was found here
or built afresh. A prefix is kept once a second request has it (the planner's shared blocks), up
to a memory budget, oldest out first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replayproxy.replay.layout import TokenLayout

MIN_TOKENS = 64  # shorter shared prefixes cost more to look up than to build
MAX_BYTES = 64 << 20  # rendered pieces kept at most (roughly: characters, or 40 bytes a token id)
_ID_BYTES = 40  # a token id in a list: the pointer and the int object

Key = tuple[Any, ...]


def key(
    plan: TokenLayout, hashes: np.ndarray, branch: np.ndarray, blocks: int, upto: int, token_ids: bool
) -> Key:
    """What fixes the words before `upto` (where recorded block `blocks` starts): the blocks'
    hashes and branch words, and each message's span before `upto`."""
    spans = tuple((s, min(s + n, upto)) for s, n in zip(plan.starts, plan.lengths, strict=True) if s < upto)
    return (upto, token_ids, hashes[:blocks].tobytes(), branch[:blocks].tobytes(), spans)


class PrefixWords:
    """Per message before a prefix's end, its rendered words (text, or a list of token ids)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._pieces: dict[Key, tuple[tuple[Any, ...], int]] = {}
        self._bytes = 0

    def get(self, at: Key) -> tuple[Any, ...] | None:
        found = self._pieces.get(at)
        return found[0] if found is not None else None

    def put(self, at: Key, pieces: tuple[Any, ...]) -> None:
        size = sum(len(p) * (_ID_BYTES if isinstance(p, list) else 1) for p in pieces)
        if size > self.max_bytes or at in self._pieces:
            return
        while self._pieces and self._bytes + size > self.max_bytes:
            oldest = next(iter(self._pieces))
            self._bytes -= self._pieces.pop(oldest)[1]
        self._pieces[at] = (pieces, size)
        self._bytes += size
