"""How the sim turns prompts into token ids: its own word tokenizer, or a real Hugging Face tokenizer.

With `--tokenizer tokenizer.json` the sim counts prompt tokens as an engine serving that tokenizer
would: chat messages rendered with a chat template (ChatML, or Llama 3's headers; chosen by
`--chat-template` or from the `chat_template` in `tokenizer_config.json` beside the file), then
encoded without added specials; text prompts encoded with the tokenizer's own special tokens.
This is the sim's own implementation of the templates (it shares no code with the replayer, whose
exact prompts it checks). Generated tokens are tokens of the same tokenizer (the sim's words that
are one token after a space), so a reply re-tokenizes to the ids that produced it, as the next turn
of a conversation needs for the prefix cache to hit its blocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from replayproxy.sim import tokenizer as words

TEMPLATES = ("chatml", "llama3")


class Vocabulary(NamedTuple):
    """What generation draws from: token ids and the text each adds to a reply."""

    ids: tuple[int, ...]
    pieces: tuple[str, ...]


class Prompts(Protocol):
    vocab_size: int
    roles: tuple[str, ...]
    generation: Vocabulary

    def chat(self, messages: Sequence[tuple[str, str]]) -> list[int]: ...

    def text(self, prompt: str, special: bool = True) -> list[int]: ...


class WordPrompts:
    """The sim's deterministic word tokenizer and its Llama-3-like template (sim/tokenizer.py)."""

    vocab_size = words.VOCAB_SIZE
    roles: tuple[str, ...] = words.ROLES
    generation = Vocabulary(tuple(words.GENERATED_IDS), tuple(words.piece(i) for i in words.GENERATED_IDS))

    def chat(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        return words.render_chat(messages)

    def text(self, prompt: str, special: bool = True) -> list[int]:
        return [words.BOS_ID, *words.encode(prompt)] if special else words.encode(prompt)


def _render_chatml(messages: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return body + "<|im_start|>assistant\n"


def _render_llama3(messages: Sequence[tuple[str, str]]) -> str:
    body = "".join(
        f"<|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}<|eot_id|>"
        for role, content in messages
    )
    return "<|begin_of_text|>" + body + "<|start_header_id|>assistant<|end_header_id|>\n\n"


RENDER = {"chatml": _render_chatml, "llama3": _render_llama3}


def _detect(directory: Path) -> str:
    config = directory / "tokenizer_config.json"
    template = ""
    if config.is_file():
        loaded: Any = json.loads(config.read_text(encoding="utf-8"))
        template = str(loaded.get("chat_template") or "") if isinstance(loaded, dict) else ""
    return "llama3" if "<|start_header_id|>" in template else "chatml"


class HfPrompts:
    """A Hugging Face `tokenizer.json` with a built-in chat template."""

    roles: tuple[str, ...] = ("system", "user", "assistant", "tool", "developer")
    vocab_size: int
    generation: Vocabulary

    def __init__(self, path: str | Path, template: str = "") -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ValueError("--tokenizer needs the 'tokenizers' package (pip install tokenizers)") from e
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        try:
            self._tokenizer = Tokenizer.from_file(str(file))
        except Exception as e:  # noqa: BLE001 — tokenizers raises its own exception types
            raise ValueError(f"tokenizer {file}: cannot load ({type(e).__name__})") from e
        name = template or _detect(file.parent)
        if name not in RENDER:
            raise ValueError(f"unknown chat template {name!r}; valid: {', '.join(TEMPLATES)}")
        self._render = RENDER[name]
        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))
        self.generation = self._single_token_words()

    def _single_token_words(self) -> Vocabulary:
        """The sim's words that are one token after a space: generated text of them re-tokenizes
        (inside a chat template too, where specials and newlines split it) to the same ids."""
        kept: dict[int, str] = {}
        for word in dict.fromkeys(words.WORDS):
            ids = self._tokenizer.encode(" " + word, add_special_tokens=False).ids
            if len(ids) == 1 and ids[0] not in kept:
                kept[ids[0]] = " " + word
        if len(kept) < 16:
            raise ValueError("tokenizer: fewer than 16 of the sim's words are one token; cannot generate")
        return Vocabulary(tuple(kept), tuple(kept.values()))

    def chat(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        return list(self._tokenizer.encode(self._render(messages), add_special_tokens=False).ids)

    def text(self, prompt: str, special: bool = True) -> list[int]:
        return list(self._tokenizer.encode(prompt, add_special_tokens=special).ids)


def load(path: str | None, template: str = "") -> Prompts:
    return HfPrompts(path, template) if path else WordPrompts()
