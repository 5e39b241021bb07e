"""What exact prompts are made of, measured once per run through the target's tokenizer.

An alphabet of words that are one token each, alone and after a space, so a prompt of n words is
n tokens wherever they stand; and, per recorded role sequence, the template tokens the chat
template puts before the first message's content, between contents and after the last one (the
generation prompt). With both, every content token's position in the templated prompt is known,
which is what exact lengths and exact shared prefixes need (replay.layout builds them). Every
structure is checked on a second rendering before it is trusted.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from replayproxy.replay import flavors, synth
from replayproxy.replay.tokenizer import Chat, Tokenizer, TokenizerError

MIN_ALPHABET = 32  # fewer single-token words than this: the tokenizer is not usable for exact prompts
WANTED_ALPHABET = 256  # enough distinct first tokens for the siblings of one shared prefix
MAX_ALPHABET = 4096
CHECK_WORDS = 3  # words per message in the rendering that checks a measured structure


@dataclass(frozen=True, slots=True)
class Alphabet:
    """Words that are exactly one token alone (`first` ids) and after a space (`ids`)."""

    words: tuple[str, ...]
    first: tuple[int, ...]  # id of "word" at the start of a message or prompt
    ids: tuple[int, ...]  # id of " word" anywhere after

    def __len__(self) -> int:
        return len(self.words)


@dataclass(frozen=True, slots=True)
class Structure:
    """Template tokens around the contents of one role sequence (or the special tokens of a text prompt)."""

    head: tuple[int, ...]  # before the first content
    between: tuple[tuple[int, ...], ...]  # before content m + 1, after content m
    closing: tuple[int, ...]  # after the last content (the generation prompt)
    overhead: int = field(init=False, repr=False, compare=False)  # template tokens in all (asked per request)
    gaps: tuple[int, ...] = field(init=False, repr=False, compare=False)  # len(between[m]), per message

    def __post_init__(self) -> None:
        overhead = len(self.head) + sum(len(b) for b in self.between) + len(self.closing)
        object.__setattr__(self, "overhead", overhead)
        object.__setattr__(self, "gaps", tuple(len(b) for b in self.between))


@dataclass(slots=True)
class Book:
    """Everything exact planning needs from the tokenizer; `failed` keys fall back to approximate."""

    tokenizer_name: str
    alphabet: Alphabet
    text: Structure  # a text completion prompt: special tokens before the words
    chat: dict[str, Structure] = field(default_factory=dict)  # by synth.template_key
    failed: dict[str, str] = field(default_factory=dict)  # template key -> why it was not measured


def candidates(extra: Iterable[str] = ()) -> list[list[str]]:
    """Words to try for the alphabet, in rounds: the synthesis vocabulary (and `extra`), then
    two-letter strings, tried only when the first round found fewer than WANTED_ALPHABET."""
    pairs = [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase]
    first = list(dict.fromkeys([*synth.VOCAB, *extra]))
    return [first, [p for p in pairs if p not in set(first)]]


async def alphabet(tokenizer: Tokenizer, rounds: Sequence[Sequence[str]]) -> Alphabet:
    """Keep the candidates that are one token both alone and after a space (and not a special)."""
    kept: dict[str, tuple[int, int]] = {}
    seen: set[int] = set()
    for words in rounds:
        if len(kept) >= WANTED_ALPHABET:
            break
        encoded = await tokenizer.encode_text([f"{w} {w}" for w in words], special=False)
        for word, ids in zip(words, encoded, strict=True):
            if len(ids) == 2 and not {*ids} & seen and len(kept) < MAX_ALPHABET:
                kept[word] = (ids[0], ids[1])
                seen.update(ids)
    if len(kept) < MIN_ALPHABET:
        raise TokenizerError(
            f"{tokenizer.name}: only {len(kept)} single-token words found, "
            f"{MIN_ALPHABET} needed for exact prompts"
        )
    return Alphabet(tuple(kept), tuple(i for i, _ in kept.values()), tuple(j for _, j in kept.values()))


def _chat(roles: Sequence[str], tools: bool, contents: Sequence[str]) -> Chat:
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
    return Chat(messages, [flavors.DUMMY_TOOL] if tools else None)


def _split(ids: list[int], markers: Sequence[int]) -> Structure | None:
    """The template tokens around single-token contents `markers`, found in order in `ids`."""
    positions, at = [], 0
    for marker in markers:
        try:
            at = ids.index(marker, at)
        except ValueError:
            return None
        positions.append(at)
        at += 1
    head = tuple(ids[: positions[0]])
    between = tuple(tuple(ids[a + 1 : b]) for a, b in zip(positions, positions[1:], strict=False))
    return Structure(head, between, tuple(ids[positions[-1] + 1 :]))


def _expected(structure: Structure, contents: Sequence[Sequence[int]]) -> list[int]:
    ids = [*structure.head]
    for m, content in enumerate(contents):
        if m:
            ids += structure.between[m - 1]
        ids += content
    return ids + [*structure.closing]


async def structures(
    tokenizer: Tokenizer, letters: Alphabet, keys: Sequence[tuple[tuple[str, ...], bool]]
) -> tuple[dict[str, Structure], dict[str, str]]:
    """Measure each (roles, tools) key with one-word contents, check it with three-word contents."""
    words = letters.words
    marks = [[m % len(words) for m in range(len(roles))] for roles, _ in keys]
    plain = [_chat(r, t, [words[i] for i in ms]) for (r, t), ms in zip(keys, marks, strict=True)]
    spans = [
        [[(m * CHECK_WORDS + j + 7) % len(words) for j in range(CHECK_WORDS)] for m in range(len(roles))]
        for roles, _ in keys
    ]
    checks = [
        _chat(r, t, [" ".join(words[i] for i in span) for span in s])
        for (r, t), s in zip(keys, spans, strict=True)
    ]
    encoded = await tokenizer.encode_chat([*plain, *checks])
    found: dict[str, Structure] = {}
    failed: dict[str, str] = {}
    for n, ((roles, tools), ms, s) in enumerate(zip(keys, marks, spans, strict=True)):
        key = synth.template_key(roles, tools)
        structure = _split(encoded[n], [letters.first[i] for i in ms])
        if structure is None:
            failed[key] = "content words not found in the templated prompt"
            continue
        contents = [[letters.first[span[0]], *(letters.ids[i] for i in span[1:])] for span in s]
        if encoded[len(keys) + n] != _expected(structure, contents):
            failed[key] = "template tokens depend on the content"
            continue
        found[key] = structure
    return found, failed


async def text_structure(tokenizer: Tokenizer, letters: Alphabet) -> Structure:
    """The special tokens a text prompt gets (e.g. BOS), checked on a three-word prompt."""
    words = letters.words[:CHECK_WORDS]
    one, three = await tokenizer.encode_text([words[0], " ".join(words)], special=True)
    structure = _split(one, [letters.first[0]])
    expected = [letters.first[0], *letters.ids[1:CHECK_WORDS]]
    if structure is None or three != [*structure.head, *expected, *structure.closing]:
        raise TokenizerError(f"{tokenizer.name}: text prompts do not tokenize word by word")
    return structure


async def measure(
    tokenizer: Tokenizer, keys: Sequence[tuple[tuple[str, ...], bool]], extra_words: Iterable[str] = ()
) -> Book:
    letters = await alphabet(tokenizer, candidates(extra_words))
    text = await text_structure(tokenizer, letters)
    found, failed = await structures(tokenizer, letters, list(dict.fromkeys(keys)))
    return Book(tokenizer.name, letters, text, found, failed)
