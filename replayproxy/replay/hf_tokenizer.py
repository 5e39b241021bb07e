"""A local Hugging Face tokenizer (`tokenizer.json`) and chat template, as the `Tokenizer` seam.

For targets without a tokenize endpoint, or to prepare offline: `--tokenizer PATH` names a
`tokenizer.json`, the model directory holding it, or a llama.cpp `.gguf` file (its tokenizer and
chat template rebuilt from the metadata by gguf_model, extra `replayproxy[gguf]`). The chat
template is read the way Hugging Face and vLLM read it (`chat_template` in `tokenizer_config.json`,
or `chat_template.jinja`) and rendered with Jinja's sandbox and the same options (`trim_blocks`,
`lstrip_blocks`); the rendering is then encoded without added special tokens, as
`apply_chat_template(tokenize=True)` does. Needs the `tokenizers` and `jinja2` packages (extra
`replayproxy[tokenizers]`); nothing is downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from replayproxy import gguf_model
from replayproxy.errors import user_file
from replayproxy.replay.tokenizer import Chat, TokenizerError, chat_messages


def _special(config: dict[str, Any], name: str) -> str:
    value = config.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _template_of(config: dict[str, Any], directory: Path | None) -> str:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str) and template:
        return template
    standalone = directory / "chat_template.jinja" if directory is not None else None
    if standalone is not None and standalone.is_file():
        return standalone.read_text(encoding="utf-8")
    return ""


def _from_json(file: Path) -> Any:
    try:
        from tokenizers import Tokenizer as HfTokenizer  # optional extra: replayproxy[tokenizers]
    except ImportError as e:
        raise TokenizerError(
            "--tokenizer needs the 'tokenizers' package: pip install 'replayproxy[tokenizers]'"
        ) from e
    try:
        return HfTokenizer.from_file(str(file))
    except Exception as e:  # noqa: BLE001 — tokenizers raises its own exception types
        hint = "; a llama.cpp model file must end in .gguf" if "UTF-8" in str(e) else ""
        raise TokenizerError(f"tokenizer {file}: cannot load ({type(e).__name__}: {e}){hint}") from e


def _config_next_to(file: Path) -> dict[str, Any]:
    config_file = file.parent / "tokenizer_config.json"
    if not config_file.is_file():
        return {}
    try:
        loaded = orjson.loads(config_file.read_bytes())
    except orjson.JSONDecodeError as e:
        raise TokenizerError(f"{config_file}: not JSON ({e})") from e
    return loaded if isinstance(loaded, dict) else {}


def _from_gguf(file: Path) -> tuple[Any, dict[str, Any]]:
    """llama.cpp's tokenizer rebuilt from the GGUF metadata, and its template and special tokens."""
    try:
        vocab = gguf_model.vocabulary(file)
        tokenizer = gguf_model.hf_tokenizer(vocab, file)
    except gguf_model.GGUFError as e:
        raise TokenizerError(str(e)) from e
    return tokenizer, {"chat_template": vocab.chat_template, "bos_token": vocab.bos, "eos_token": vocab.eos}


class LocalTokenizer:
    """`tokenizer.json` and the chat template next to it, or a GGUF's (or one given); encodes in-process."""

    def __init__(self, path: str | Path, chat_template: str | Path | None = None) -> None:
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        self.name = file.name
        directory: Path | None = file.parent
        if file.suffix == ".gguf":
            (self._tokenizer, config), directory = _from_gguf(file), None
        else:
            self._tokenizer, config = _from_json(file), _config_next_to(file)
        if chat_template is not None:
            source = Path(chat_template)
            with user_file(source):
                template = source.read_text(encoding="utf-8") if source.is_file() else str(chat_template)
        else:
            template = _template_of(config, directory)
        self._template = _compile(template) if template else None
        self._specials = {
            "bos_token": _special(config, "bos_token"),
            "eos_token": _special(config, "eos_token"),
        }

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def render(self, chat: Chat) -> str:
        """The chat template's text for `chat`, with the generation prompt."""
        if self._template is None:
            raise TokenizerError(f"{self.name}: no chat template (give one with --chat-template FILE)")
        try:
            return str(
                self._template.render(
                    messages=chat_messages(chat),
                    tools=[dict(t) for t in chat.tools] if chat.tools else None,
                    add_generation_prompt=True,
                    **self._specials,
                )
            )
        except Exception as e:  # noqa: BLE001 — a template may raise anything, raise_exception included
            raise TokenizerError(f"{self.name}: chat template failed: {type(e).__name__}: {e}") from e

    def encode_chat_now(self, chats: Sequence[Chat]) -> list[list[int]]:
        rendered = [self.render(c) for c in chats]
        return [list(e.ids) for e in self._tokenizer.encode_batch(rendered, add_special_tokens=False)]

    def encode_text_now(self, texts: Sequence[str], special: bool = True) -> list[list[int]]:
        return [list(e.ids) for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=special)]

    async def encode_chat(self, chats: Sequence[Chat]) -> list[list[int]]:
        return self.encode_chat_now(chats)

    async def encode_text(self, texts: Sequence[str], special: bool = True) -> list[list[int]]:
        return self.encode_text_now(texts, special)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """Jinja's `tojson` as transformers defines it for chat templates (no HTML escaping)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _compile(template: str) -> Any:
    try:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise TokenizerError(
            "chat templates need the 'jinja2' package: pip install 'replayproxy[tokenizers]'"
        ) from e

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)  # noqa: DTZ005 — templates print a local date, as in transformers

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise TokenizerError(f"chat template does not compile: {e}") from e
