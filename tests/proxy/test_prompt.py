"""The canonical prompt rendering and the hasher's units."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from replayproxy.config import ConfigError
from replayproxy.proxy.prompt import PromptHasher, render_chat, render_completion
from replayproxy.shape import prefix_block_hashes

KEY = b"q" * 32


def test_rendering_is_documented_shape() -> None:
    body = {
        "tools": [{"b": 1, "a": 2}],
        "messages": [
            {"role": "system", "content": "S"},
            {
                "role": "user",
                "name": "ann",
                "content": [{"type": "text", "text": "T"}, {"type": "image_url", "x": 1}],
            },
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            {"role": "tool", "tool_call_id": "1", "content": "R"},
            "not a message",
        ],
    }
    text = render_chat(body)
    assert text.startswith('<|tools|>\n[{"a":2,"b":1}]\n<|system|>\nS\n<|user:ann|>\nT<|image_url:')
    assert text.endswith('<|assistant|>\n<|tool_calls|>[{"id":"1"}]\n<|tool|>\nR<|tool_call_id|>"1"\n')


def test_completion_prompts() -> None:
    assert render_completion({"prompt": "abc"}) == "abc"
    assert render_completion({"prompt": ["first", "second"]}) == "first"
    assert render_completion({"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert render_completion({"prompt": [[4, 5], [6]]}) == [4, 5]
    assert render_completion({}) == ""


def test_char_blocks_of_64_by_default() -> None:
    hasher = PromptHasher(KEY)
    assert (hasher.unit, hasher.block_size) == ("char", 64)
    hashes, units = hasher.prefix("x" * 200)
    assert units == 200 and hashes == prefix_block_hashes("x" * 200, 64, KEY)
    assert PromptHasher(KEY, block_size=10).prefix("y" * 25)[0] == prefix_block_hashes("y" * 25, 10, KEY)


def test_missing_tokenizers_package_is_a_clear_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(ConfigError, match="pip install 'replayproxy\\[tokenizers\\]'"):
        PromptHasher(KEY, tmp_path / "tokenizer.json")


def test_token_blocks_with_a_tokenizer(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers", reason="needs the tokenizers extra (in .[test])")
    Tokenizer, models, pre_tokenizers = tokenizers.Tokenizer, tokenizers.models, tokenizers.pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate("abcdefghij")}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    hasher = PromptHasher(KEY, path)
    assert (hasher.unit, hasher.block_size, hasher.tokenizer_name) == ("token", 16, "tokenizer.json")
    hashes, units = hasher.prefix(" ".join("abcdefghij" * 4))
    assert units == 40 and len(hashes) == 2
    assert hasher.prefix([1] * 32)[0] == prefix_block_hashes([1] * 32, 16, KEY)
