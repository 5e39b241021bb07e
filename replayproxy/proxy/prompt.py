"""Prompts as hashable units: the canonical rendering and its keyed block hashes.

Without a tokenizer the prompt is rendered as text and cut into 64-character blocks; with one
(`tokenizer = "tokenizer.json"` or a llama.cpp `.gguf`; extras `tokenizers`, `gguf`) the rendering
is tokenized and cut into 16-token blocks. Equal hash chains mean equal rendered prefixes, which is
what prefix caches reuse. The rendering (docs/proxy.md) is: tools first, then per message `<|role|>` (plus
`:name`), a newline, the text, a newline; non-text parts become a type tag and a digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from replayproxy import gguf_model
from replayproxy.config import ConfigError
from replayproxy.shape import BlockHashes, prefix_block_hashes

DEFAULT_BLOCK = {"token": 16, "char": 64}


class PromptHasher:
    """Turns request bodies into (prefix hashes, prompt length in units)."""

    def __init__(self, key: bytes, tokenizer: Path | None = None, block_size: int = 0) -> None:
        self.key = key
        self.unit = "token" if tokenizer is not None else "char"
        self.block_size = block_size or DEFAULT_BLOCK[self.unit]
        self.tokenizer_name = tokenizer.name if tokenizer is not None else ""
        self._tokenizer: Any = _load_tokenizer(tokenizer) if tokenizer is not None else None

    def prefix(self, rendered: str | list[int]) -> tuple[BlockHashes, int]:
        """Hashes of the full blocks of a rendered prompt, and its length in this hasher's unit."""
        units: str | Sequence[int]
        if isinstance(rendered, list):
            units = rendered if self.unit == "token" else " ".join(map(str, rendered))
        elif self._tokenizer is not None:
            units = self._tokenizer.encode(rendered, add_special_tokens=False).ids
        else:
            units = rendered
        return prefix_block_hashes(units, self.block_size, self.key), len(units)


def _load_tokenizer(path: Path) -> Any:
    if path.suffix == ".gguf":  # a llama.cpp model file: its tokenizer rebuilt from the metadata
        try:
            return gguf_model.hf_tokenizer(gguf_model.vocabulary(path), path)
        except gguf_model.GGUFError as e:
            raise ConfigError(f"tokenizer: {e}") from e
    try:
        from tokenizers import Tokenizer  # optional extra: replayproxy[tokenizers]
    except ImportError as e:
        raise ConfigError(
            "tokenizer is set but the 'tokenizers' package is missing: pip install 'replayproxy[tokenizers]'"
        ) from e
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 — tokenizers raises its own exception types
        raise ConfigError(f"tokenizer {path}: cannot load ({type(e).__name__})") from e


def render_chat(body: dict[str, Any]) -> str:
    """The rendering of a chat request (the module docstring's layout)."""
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    tools = body.get("tools") or body.get("functions")
    parts: list[str] = []
    if tools:
        parts.append("<|tools|>\n" + _json(tools) + "\n")
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role", "")
        role = role if isinstance(role, str) else _json(role)
        name = message.get("name")
        head = f"<|{role}:{name}|>\n" if isinstance(name, str) else f"<|{role}|>\n"
        parts.append(head + content_text(message.get("content")))
        for key in ("tool_calls", "function_call", "tool_call_id"):
            if message.get(key):
                parts.append(f"<|{key}|>" + _json(message[key]))
        parts.append("\n")
    return "".join(parts)


def render_completion(body: dict[str, Any]) -> str | list[int]:
    """The prompt of /v1/completions: text, or token ids; a batch is rendered as its first prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return list(prompt)
        prompt = prompt[0]
        if isinstance(prompt, list):
            return [t for t in prompt if isinstance(t, int)]
    return prompt if isinstance(prompt, str) else ""


def content_text(content: Any) -> str:
    """A message's content as text; non-text parts become a type tag and a digest."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            out.append(part["text"])
        else:  # images, audio, files: a tag and a digest, so equal media hash equal and text stays small
            digest = hashlib.blake2b(_json(part).encode(), digest_size=8).hexdigest()
            out.append(f"<|{part.get('type', 'part')}:{digest}|>")
    return "".join(out)


def _json(value: Any) -> str:
    """Canonical JSON of a part that is not text; what JSON cannot hold (NaN, integers past 64 bits,
    nesting deeper than orjson's limit) falls back to repr, and past repr's depth to a fixed tag."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        try:
            return repr(value)
        except (RecursionError, ValueError):  # ValueError: an integer too long to print
            return "<|unrenderable|>"
