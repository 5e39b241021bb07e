"""What a request will generate, decided at arrival: output length, finish reason and text.

A real engine discovers EOS token by token; the sim draws it up front from a seeded geometric
distribution (a constant per-token EOS probability, mean `mean_output_tokens`), so the engine only
needs the length and the same request with the same `seed` always yields the same text.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from replayproxy.sim.structured import Structure, shape
from replayproxy.sim.tokenizer import GENERATED_IDS, piece

WORDS = (tuple(GENERATED_IDS), tuple(piece(i) for i in GENERATED_IDS))  # the sim's own tokenizer


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """The request fields that decide the output (validated by sim.api)."""

    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """The tokens a request will emit; `pieces[i]` is the text of token i ('' for EOS or after stop)."""

    pieces: tuple[str, ...]
    finish_reason: str  # "stop" (EOS or stop string), "length" or "tool_calls"
    stop_reason: str | None  # the matched stop string, like vLLM's stop_reason
    tool_name: str = ""  # the tool called: the pieces are then its arguments
    shaped: bool = False  # JSON or a tool call (sim.structured), not free text
    ids: tuple[int, ...] = ()  # the generated token ids (free text only): their KV blocks get cached

    @property
    def length(self) -> int:
        return len(self.pieces)


class Sampler:
    """Draws output plans; requests without a seed use a run-wide stream seeded by the config.

    `output_seed` stands for another model build: it changes every drawn text, greedy ones too.
    """

    def __init__(
        self,
        mean_output_tokens: float,
        seed: int,
        output_seed: int = 0,
        vocabulary: tuple[Sequence[int], Sequence[str]] = WORDS,
    ) -> None:
        self._eos_p = min(1.0, 1.0 / mean_output_tokens)
        self._unseeded = random.Random(seed)
        self._output_seed = output_seed
        self.vocabulary = vocabulary  # (token ids, their pieces) generation draws from

    def plan(
        self, prompt_ids: list[int], params: SamplingParams, structure: Structure | None = None
    ) -> OutputPlan:
        rng = random.Random(self._request_seed(prompt_ids, params))
        if structure is not None:
            shaped = shape(structure, rng, params.max_tokens, params.min_tokens, params.ignore_eos)
            return OutputPlan(shaped.pieces, shaped.finish_reason, None, shaped.tool_name, shaped=True)
        length = params.max_tokens if params.ignore_eos else self._eos_length(rng, params)
        ids, texts = self.vocabulary
        drawn = rng.choices(range(len(ids)), k=length)
        pieces = [texts[i] for i in drawn]
        token_ids = tuple(ids[i] for i in drawn)
        eos = length < params.max_tokens
        if eos:
            pieces[-1] = ""  # the EOS token is generated and counted, but has no text
        finish = "stop" if eos else "length"
        if params.stop:
            cut = _first_stop(pieces, params.stop, params.min_tokens)
            if cut is not None:
                char, last, stop = cut
                return OutputPlan(_clip(pieces[: last + 1], char), "stop", stop, ids=token_ids[: last + 1])
        return OutputPlan(tuple(pieces), finish, None, ids=token_ids)

    def _request_seed(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """Greedy requests depend on the prompt only; seeded ones on prompt and seed."""
        if params.seed is None and params.temperature > 0:
            return self._unseeded.getrandbits(64)
        digest = hashlib.blake2b(array("q", prompt_ids).tobytes(), digest_size=8)
        if self._output_seed:
            digest.update(b"output-seed %d" % self._output_seed)
        if params.temperature > 0:
            digest.update(str(params.seed).encode())
        return int.from_bytes(digest.digest(), "little")

    def _eos_length(self, rng: random.Random, params: SamplingParams) -> int:
        u = rng.random()
        drawn = 1 if self._eos_p >= 1.0 else 1 + int(math.log1p(-u) / math.log1p(-self._eos_p))
        return min(params.max_tokens, max(drawn, params.min_tokens, 1))


def _first_stop(pieces: list[str], stops: tuple[str, ...], min_tokens: int) -> tuple[int, int, str] | None:
    """The earliest-ending stop-string match whose last token is at or after token `min_tokens`.

    Returns (character where the match starts, index of the token completing it, the stop string).
    """
    text = "".join(pieces)
    ends = list(itertools.accumulate(map(len, pieces)))
    best: tuple[int, int, str] | None = None
    for stop in stops:
        start = text.find(stop)
        while start != -1:
            last = bisect.bisect_left(ends, start + len(stop))
            if last + 1 >= min_tokens:
                if best is None or (last, start) < (best[1], best[0]):
                    best = (start, last, stop)
                break
            start = text.find(stop, start + 1)
    return best


def _clip(pieces: list[str], limit: int) -> tuple[str, ...]:
    """Pieces with all text at or after character `limit` removed (the stop string is not returned,
    as in vLLM and OpenAI), keeping one entry per generated token."""
    out, pos = [], 0
    for p in pieces:
        out.append(p[: max(0, limit - pos)])
        pos += len(p)
    return tuple(out)
