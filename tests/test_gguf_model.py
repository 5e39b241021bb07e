"""A GGUF file's tokenizer and dimensions (gguf_model), as replay, the proxy, export and capacity use them.

The tokenizer rebuilt from a GGUF must count exactly as llama.cpp does: checked against a GGUF
written here from the session's BPE tokenizer, against the shared real-engine GGUF and its
Hugging Face tokenizer.json (skipped when absent), and against a real llama-server's /tokenize
(opt-in: REPLAYPROXY_REAL_LLAMACPP=URL of `../shared/real-engine/llama.cpp/start.sh`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path

import aiohttp
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from replayproxy.capacity.command import load_model  # noqa: E402
from replayproxy.proxy.prompt import PromptHasher  # noqa: E402
from replayproxy.replay import flavors, tokenizer_setup  # noqa: E402
from replayproxy.replay.hf_tokenizer import LocalTokenizer  # noqa: E402
from replayproxy.replay.tokenizer import Chat, TokenizerError  # noqa: E402
from tests.cli import run_cli  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "real-engine"
SHARED_GGUF = SHARED / "llama.cpp" / "tiny-llama-bf16.gguf"
HF_DIR = Path("~/.cache/real-engine/tiny-llama").expanduser()  # the same model, as vLLM serves it

# Sixty texts that exercise the pre-tokenizer's rules: words, contractions, digits of every run
# length, punctuation runs, whitespace runs and line ends, non-ASCII letters, emoji, code, and
# the special tokens of a ChatML vocabulary inside text.
_PIECES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done it, haven't they? It's John's.",
    "IT'S SHOUTING, WE'RE LOUD",
    "12 + 30 = 42; 1234567 / 89 = 13871.54",
    "version 3.11.4 on 2024-05-09T13:34:43Z",
    "    indented four\n\tand a tab\n\n\nthree newlines",
    "trailing spaces   ",
    "   leading spaces",
    "a  b   c    d",
    "line one\r\nline two\rline three",
    "ünïcödé wörds, naïve café, Straße",
    "日本語のテキストと中文文本",
    "Привет, мир! Как дела?",
    "emoji 😀🎉👍🏽 and ❤️",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more text</s> and <s>",
    "!!! ??? ... --- ***",
    "$100.00 & 50% off <tag attr='x'>",
    "https://example.com/path?q=1&r=two#frag",
    "snake_case camelCase PascalCase kebab-case",
    "“curly quotes” and ‘single’ — em dash – en dash",
    "x",
    " ",
    "\n",
    "0",
    "000111222333444555",
]


def _texts() -> list[str]:
    """The pieces, and thirty joins of two of them (boundaries between rules)."""
    joined = [_PIECES[i] + " " + _PIECES[(i * 7 + 3) % len(_PIECES)] for i in range(len(_PIECES))]
    return _PIECES + joined


TEXTS = _texts()
assert len(TEXTS) == 60


def write_gguf(path: Path, tokenizer_json: Path, pre: str = "gpt-2", model: str = "gpt2") -> Path:
    """A GGUF holding `tokenizer_json`'s vocabulary as llama.cpp's converter writes it (no tensors)."""
    spec = json.loads(tokenizer_json.read_text())
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {t["content"] for t in spec["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("test model")
    writer.add_block_count(3)
    writer.add_context_length(4096)
    writer.add_embedding_length(512)
    writer.add_feed_forward_length(1024)
    writer.add_head_count(8)
    writer.add_head_count_kv(2)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab[tokens[0]])
    writer.add_eos_token_id(vocab[tokens[0]])
    writer.add_add_bos_token(False)
    template = tokenizer_json.parent / "tokenizer_config.json"
    if template.is_file():
        writer.add_chat_template(json.loads(template.read_text()).get("chat_template", ""))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


CHATS = [
    Chat(({"role": "user", "content": "hello"},)),
    Chat((
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "Hello, wörld! 12 + 30 = 42?"},
        {"role": "assistant", "content": " spaced\n\tout "},
        {"role": "user", "content": "again"},
    )),
]  # fmt: skip


def test_a_gguf_tokenizer_counts_as_the_tokenizer_json_it_was_written_from(
    bpe_tokenizer: Path, tmp_path: Path
) -> None:
    file = write_gguf(tmp_path / "model.gguf", bpe_tokenizer)
    from_gguf, from_json = LocalTokenizer(file), LocalTokenizer(bpe_tokenizer)
    for special in (True, False):
        assert from_gguf.encode_text_now(TEXTS, special) == from_json.encode_text_now(TEXTS, special)
    if from_json._template is not None:  # the chat template travels in the GGUF too
        assert from_gguf.encode_chat_now(CHATS) == from_json.encode_chat_now(CHATS)
    assert from_gguf.vocab_size == from_json.vocab_size
    prompt = "a rendered prompt, hashed in token blocks " * 4
    assert PromptHasher(b"k" * 32, file).prefix(prompt) == PromptHasher(b"k" * 32, bpe_tokenizer).prefix(
        prompt
    )


@pytest.mark.parametrize(
    ("model", "pre", "says"),
    [
        ("llama", "default", "SentencePiece vocabulary is not rebuilt exactly here"),
        ("gpt2", "default", "pre-tokenizer type 'default' is not rebuilt here"),
        ("gpt2", "tekken", "pre-tokenizer type 'tekken'"),
    ],
)
def test_a_vocabulary_not_rebuilt_exactly_is_refused_naming_what_to_give(
    bpe_tokenizer: Path, tmp_path: Path, model: str, pre: str, says: str
) -> None:
    file = write_gguf(tmp_path / "model.gguf", bpe_tokenizer, pre=pre, model=model)
    with pytest.raises(TokenizerError) as caught:
        LocalTokenizer(file)
    assert says in str(caught.value) and "tokenizer.json" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_capacity_reads_the_dimensions_and_names_the_weight_type(bpe_tokenizer: Path, tmp_path: Path) -> None:
    spec, source = load_model(str(write_gguf(tmp_path / "model.gguf", bpe_tokenizer)))
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.hidden_size) == (3, 8, 2, 512)
    assert (spec.head_dim, spec.intermediate_size, spec.max_position_embeddings) == (64, 1024, 4096)
    assert spec.quantized_as == "int4" and spec.tie_word_embeddings  # no output.weight tensor
    assert source.endswith("GGUF Q4_K_M") and spec.name == "test model"


@pytest.mark.parametrize(
    "argv",
    [
        ["capacity", "--model", "{bad}", "--gpu-memory", "8GiB"],
        ["export", "{trace}", "--format", "vllm-custom", "--tokenizer", "{bad}", "-o", "{out}"],
    ],
)
def test_a_file_that_is_not_gguf_is_one_line_and_exit_2(tmp_path: Path, argv: list[str]) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a model" * 100)
    trace = tmp_path / "t.rpt"
    assert run_cli("synth", "-o", str(trace), "--requests", "3").returncode == 0
    done = run_cli(*[a.format(bad=bad, trace=trace, out=tmp_path / "out.jsonl") for a in argv])
    assert done.returncode == 2, done.stderr
    assert "not a readable GGUF file" in done.stderr and len(done.stderr.strip().splitlines()) == 1


needs_shared = pytest.mark.skipif(not SHARED_GGUF.is_file(), reason=f"no shared GGUF at {SHARED_GGUF}")


@needs_shared
def test_the_shared_gguf_counts_as_the_hugging_face_tokenizer_of_the_same_model() -> None:
    if not (HF_DIR / "tokenizer.json").is_file():
        pytest.skip(f"no Hugging Face copy of the model at {HF_DIR} (the vLLM real engine makes it)")
    from_gguf, from_hf = LocalTokenizer(SHARED_GGUF), LocalTokenizer(HF_DIR)
    for special in (True, False):
        assert from_gguf.encode_text_now(TEXTS, special) == from_hf.encode_text_now(TEXTS, special)
    assert from_gguf.encode_chat_now(CHATS) == from_hf.encode_chat_now(CHATS)
    gguf_spec, _ = load_model(str(SHARED_GGUF))
    hf_spec, _ = load_model(str(HF_DIR))
    assert dataclasses.replace(gguf_spec, name="") == dataclasses.replace(hf_spec, name="")


REAL = os.environ.get("REPLAYPROXY_REAL_LLAMACPP", "")


async def _server_ids(url: str, texts: list[str], special: bool) -> list[list[int]]:
    async with aiohttp.ClientSession() as session:
        found = []
        for text in texts:
            body = {"content": text, "add_special": special, "parse_special": True}
            async with session.post(f"{url}/tokenize", json=body) as resp:
                assert resp.status == 200
                found.append((await resp.json())["tokens"])
        return found


@pytest.mark.skipif(not REAL, reason="REPLAYPROXY_REAL_LLAMACPP=URL of a real llama-server not set")
def test_the_served_gguf_counts_as_the_real_llama_server_tokenize() -> None:
    """Run it against the shared GGUF (pre-tokenizer gpt-2) and against copies whose
    tokenizer.ggml.pre is llama-bpe or qwen2 (gguf's gguf_new_metadata.py --pre-tokenizer, started
    with MODEL=the copy) to check each splitting rule against llama.cpp's own."""
    url = REAL.rstrip("/").removesuffix("/v1")
    found = asyncio.run(_discovered(url))
    if found.path == "":
        pytest.skip(f"the server's model file is not on this host ({found.note})")
    assert found.path.endswith(".gguf") and found.note == "found: /props model_path", found
    local = LocalTokenizer(found.path)
    for special in (True, False):
        assert local.encode_text_now(TEXTS, special) == asyncio.run(_server_ids(url, TEXTS, special))


async def _discovered(url: str) -> tokenizer_setup.Chosen:
    """What replay chooses against this server: its GGUF, found through /props and checked to count
    as its /apply-template + /tokenize do on chat and text probes."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/v1/models") as resp:
            models = await resp.json()
        model, flavor = models["data"][0]["id"], flavors.get("llamacpp")
        return await tokenizer_setup.choose_tokenizer("", "", flavor, session, url, model, {}, models)
