"""Synthetic prompts with the trace's lengths and prefix sharing: a pure function of (trace, seed).

A prompt is modelled as a stream of token positions. A position inside recorded block i takes its
word from (seed, h_i, position in block), so requests whose chains agree for k blocks get the same
words there and different ones after; positions past the hashed blocks take words keyed by the
request's trace index. Chat prompts are split into messages with the recorded roles; a request
that shares blocks copies its donor's message boundaries inside the shared span (the donor is the
first request holding the deepest shared hash), so templates put header tokens at the same places.
Template tokens are modelled as following each message's content, which keeps modelled positions at
or before the real ones; sharing is exact while the real offset stays under one block.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# Common English words that are one token (with or without a leading space) in the tokenizers of
# the common open model families (Llama 3, Qwen 2/3, Mistral, GPT cl100k/o200k); calibration checks.
VOCAB: tuple[str, ...] = tuple(
    """
    the of and to in is you that it he was for on are as with his they at be this have from or one
    had by but not what all were we when your can said there use an each which she do how their if
    will up other about out many then them these so some her would make like him into time has look
    two more write go see number no way could people my than first water been call who now find long
    down day did get come made may part over new sound take only little work know place year live me
    back give most very after thing our just name good sentence man think say great where help
    through much before line right too mean old any same tell boy follow came want show also around
    form three small set put end does another well large must big even such because turn here why
    ask went men read need land different home us move try kind hand picture again change off play
    spell air away animal house point page letter mother answer found study still learn should world
    high every near add food between own below country plant last school father keep tree never
    start city earth eye light thought head under story saw left few while along might close
    something seem next hard open example begin life always those both paper together got group often
    run important until children side feet car mile night walk white sea began grow took river four
    carry state once book hear stop without second later miss idea enough eat face watch far
    really almost let above girl sometimes mountain cut young talk soon list song being leave family
    """.split()
)
ROLE_NAMES = {"s": "system", "u": "user", "a": "assistant", "d": "system"}  # others become "user"
TOKEN_ID_LOW = 1000  # token-id prompts stay clear of the special tokens at either end of vocabularies
TOKEN_ID_HIGH = 30000

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TAIL_SALT = np.uint64(0x7A11_5EED_0000_0001)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over a uint64 array: a fast, well-spread, portable integer hash
    (array arithmetic wraps silently, so no error-state guard is needed; in place, to spare copies)."""
    z = x + _GOLDEN
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_MASK64 = (1 << 64) - 1


def _tail_key(index: int) -> int:
    """`_mix` of (index ^ _TAIL_SALT) on a Python int: one request's key costs no array operations."""
    z = ((index ^ int(_TAIL_SALT)) + int(_GOLDEN)) & _MASK64
    z = ((z ^ (z >> 30)) * int(_M1)) & _MASK64
    z = ((z ^ (z >> 27)) * int(_M2)) & _MASK64
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=4096)  # asked once per request; traces hold few distinct role sequences
def chat_roles(letters: str) -> tuple[str, ...]:
    """Roles to send for recorded role letters; tool/function/other turns become user turns."""
    return tuple(ROLE_NAMES.get(letter, "user") for letter in letters) or ("user",)


@dataclass(frozen=True, slots=True)
class Template:
    """Tokens a target adds around content: per request, per message, and per content word."""

    fixed_tokens: int = 0
    per_message_tokens: int = 0
    tokens_per_word: float = 1.0
    exact: dict[str, int] = field(default_factory=dict)  # measured total overhead by `template_key`

    def overhead(self, key: str, messages: int) -> int:
        if key in self.exact:
            return self.exact[key]
        return self.fixed_tokens + self.per_message_tokens * messages


def template_key(roles: Sequence[str], tools: bool) -> str:
    """Calibration key: requests with equal keys get the same template overhead."""
    return ",".join(roles) + ("+tools" if tools else "")


Message = tuple[str, int]  # (role, content tokens)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a prompt's content sits: messages in order, each followed by `gap` template tokens."""

    messages: tuple[Message, ...]
    gap: int  # modelled template tokens after each message's content

    def spans(self) -> list[tuple[str, int, int]]:
        """(role, first position, content tokens) of each message."""
        out, pos = [], 0
        for role, tokens in self.messages:
            out.append((role, pos, tokens))
            pos += tokens + self.gap
        return out


def split_evenly(total: int, slots: int) -> list[int]:
    base, extra = divmod(max(total, 0), slots)
    return [base] * (slots - 1) + [base + extra]


def copy_shared(donor: Layout, shared: int) -> tuple[list[Message], bool]:
    """The donor's messages inside the first `shared` positions; True if the last one may grow."""
    copied: list[Message] = []
    pos = 0
    for role, tokens in donor.messages:
        if pos >= shared:
            return copied, False
        if pos + tokens < shared:  # content ends inside the span: its closing template tokens follow
            copied.append((role, tokens))
            pos += tokens + donor.gap
            continue
        copied.append((role, shared - pos))
        return copied, True
    return copied, False


def layout(
    n_tokens: int, roles: Sequence[str], overhead: int, gap: int, shared: int, donor: Layout | None
) -> Layout:
    """Message lengths giving `n_tokens` in all, matching `donor` inside the first `shared` positions."""
    copied, growable = copy_shared(donor, shared) if donor is not None and shared > 0 else ([], False)
    if len(copied) > len(roles) or [r for r, _ in copied] != list(roles[: len(copied)]):
        names = [r for r, _ in copied] + list(roles[len(copied) :])
    else:
        names = list(roles)
    if len(copied) == len(names) and copied and not growable:
        growable = True  # no later message to put the rest in: the last copied one grows (may cost a block)
    fixed = copied[:-1] if growable else copied
    remaining = n_tokens - overhead - sum(t for _, t in fixed)
    free = len(names) - len(fixed)
    floor = copied[-1][1] if growable else 0
    if remaining < floor:  # the donor's span does not fit this request: no sharing
        return Layout(tuple(zip(roles, split_evenly(n_tokens - overhead, len(roles)), strict=True)), gap)
    sizes = split_evenly(remaining - floor, free)
    sizes[0] += floor
    return Layout(tuple(fixed) + tuple(zip(names[len(fixed) :], sizes, strict=True)), gap)


class Words:
    """Word (or token id) choice by position: shared blocks give shared words, the tail its own."""

    def __init__(self, seed: int, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError(f"block size in tokens must be >= 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self._seed = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64))[0]
        self._within = np.zeros(0, np.uint64)  # mix(position ^ seed) by position, grown on demand
        self._tiled = np.zeros(0, np.uint64)  # the first block_tokens of those, repeated

    def _within_codes(self, need: int) -> np.ndarray:
        """mix(position ^ seed) for positions 0..need-1 (a prefix of a table grown on demand)."""
        if need > len(self._within):
            size = max(need, 2 * len(self._within), 4096)
            self._within = _mix(np.arange(size, dtype=np.uint64) ^ self._seed)
        return self._within

    def codes(self, index: int, hashes: np.ndarray, start: int, count: int) -> np.ndarray:
        """64-bit codes for positions [start, start + count) of trace request `index`: inside
        recorded block b from (h_b, position in block), past the blocks from the request's own key."""
        end = start + count
        size = self.block_tokens
        chain_end = min(end, len(hashes) * size)
        table = self._within_codes(max(end, size))
        parts = []
        if start < chain_end:
            first, last = start // size, (chain_end - 1) // size + 1
            keys = np.repeat(hashes[first:last].astype(np.uint64, copy=False), size)
            lead = start - first * size
            keys = keys[lead : lead + chain_end - start]
            if len(self._tiled) < last * size:
                self._tiled = np.tile(table[:size], max(last, 2 * len(self._tiled) // size, 256))
            keys ^= self._tiled[start:chain_end]
            parts.append(keys)
        tail_start = max(start, chain_end)
        if tail_start < end:
            parts.append(table[tail_start:end] ^ np.uint64(_tail_key(index)))
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, np.uint64)
        return _mix(joined)

    def words(self, index: int, hashes: np.ndarray, start: int, count: int) -> str:
        return self.texts(index, hashes, [(start, count)])[0]

    def texts(self, index: int, hashes: np.ndarray, spans: Sequence[tuple[int, int]]) -> list[str]:
        """The words at each (start, count) span of positions: one pass over the range they cover."""
        if not spans:
            return []
        low = min(start for start, _ in spans)
        high = max(start + count for start, count in spans)
        chosen = self.codes(index, hashes, low, max(high - low, 0)) % np.uint64(len(VOCAB))
        words = _VOCAB_ARRAY[chosen.astype(np.intp)]
        return [" ".join(words[start - low : start - low + count].tolist()) for start, count in spans]

    def token_ids(self, index: int, hashes: np.ndarray, count: int) -> list[int]:
        span = np.uint64(TOKEN_ID_HIGH - TOKEN_ID_LOW)
        return (self.codes(index, hashes, 0, count) % span + np.uint64(TOKEN_ID_LOW)).tolist()  # type: ignore[no-any-return]


_VOCAB_ARRAY = np.array(VOCAB, dtype=object)


def shared_blocks(first_owner: np.ndarray, index: np.ndarray, row: int) -> int:
    """Leading blocks of request `row` that an earlier request already had (chains are prefix-closed)."""
    owners = first_owner[index[row] : index[row + 1]]
    return int(np.count_nonzero(owners < row))


def first_owners(hashes: np.ndarray, index: np.ndarray) -> np.ndarray:
    """For every flat hash, the first row (request) whose chain contains it."""
    rows = np.repeat(np.arange(len(index) - 1, dtype=np.int64), np.diff(index))
    if len(hashes) == 0:
        return rows
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    return rows[first][inverse.reshape(-1)]
