"""A GGUF model file's tokenizer and dimensions, read from its metadata.

A llama.cpp user often has nothing but the `.gguf` file, and it carries what the replayer, the
proxy and `capacity` need: the vocabulary, merges, pre-tokenizer type, special tokens and chat
template, and the layer, head and context sizes. It is read with the `gguf` package, the llama.cpp
project's own reader of the format (extra `replayproxy[gguf]`).

The tokenizer is rebuilt as a Hugging Face `tokenizers` byte-level BPE only where the result
splits text as llama.cpp does: a `gpt2` vocabulary whose pre-tokenizer type is one whose rule is
written below (GPT-2, Llama 3, Qwen2). SentencePiece and WordPiece vocabularies and other
pre-tokenizer types are refused with one line saying to give the model's `tokenizer.json` instead,
since a near miss would make "exact" prompt lengths silently wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from replayproxy.errors import BadInputFile, user_file

INSTEAD = "give the model's tokenizer.json (or its Hugging Face directory) with --tokenizer instead"

# llama.cpp's pre-tokenizer type names -> (split rule, whether a word found whole in the vocabulary
# skips the merges). The rules are the regexes of the Hugging Face tokenizer.json files llama.cpp
# maps to these types (llama-vocab.cpp): the GPT-2 one is ByteLevel's own.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS: dict[str, tuple[str, bool]] = {
    "gpt-2": (GPT2_SPLIT, False),
    "llama-bpe": (LLAMA3_SPLIT, True),
    "llama3": (LLAMA3_SPLIT, True),
    "llama-v3": (LLAMA3_SPLIT, True),
    "qwen2": (QWEN2_SPLIT, False),
    "deepseek-r1-qwen": (QWEN2_SPLIT, False),
}
# tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
SPECIAL_TYPES = (2, 3)
USER_DEFINED = 4
# general.file_type (llama.cpp's llama_ftype, named by gguf.LlamaFileType) -> the weight format
# `capacity` counts; a type not listed is counted as 16-bit, and the source line says so.
WEIGHT_FORMATS = {
    "F16": "float16",
    "BF16": "bfloat16",
    "Q8_0": "int8",
    **dict.fromkeys(("Q4_0", "Q4_1", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS"), "int4"),
}


class GGUFError(BadInputFile):
    """A GGUF file that cannot be read, or whose tokenizer cannot be rebuilt exactly here."""


class Vocabulary(NamedTuple):
    model: str  # tokenizer.ggml.model: gpt2 (byte-level BPE), llama (SentencePiece), bert, ...
    pre: str  # tokenizer.ggml.pre
    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos: str  # "" when the file names none
    eos: str
    add_bos: bool
    add_eos: bool
    chat_template: str


def _reader(path: Path) -> Any:
    try:
        from gguf import GGUFReader  # optional extra: replayproxy[gguf]
    except ImportError as e:
        raise GGUFError(
            f"{path}: reading GGUF needs the 'gguf' package: pip install 'replayproxy[gguf]'"
        ) from e
    with user_file(path):
        try:
            return GGUFReader(path, "r")
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 — on a malformed file the reader raises what numpy raises
            raise GGUFError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


def _value(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise GGUFError(f"{reader.data.filename}: metadata {key} unreadable ({type(e).__name__})") from e


def vocabulary(path: str | Path) -> Vocabulary:
    """The tokenizer metadata of the GGUF file at `path`."""
    path = Path(path)
    reader = _reader(path)
    tokens = _value(reader, "tokenizer.ggml.tokens", [])
    if not tokens:
        raise GGUFError(f"{path}: the GGUF file holds no tokenizer; {INSTEAD}")
    types = _value(reader, "tokenizer.ggml.token_type", []) or [1] * len(tokens)

    def token(key: str) -> str:
        index = _value(reader, key)
        return str(tokens[index]) if isinstance(index, int) and 0 <= index < len(tokens) else ""

    return Vocabulary(
        model=str(_value(reader, "tokenizer.ggml.model", "")),
        pre=str(_value(reader, "tokenizer.ggml.pre", "default")),
        tokens=[str(t) for t in tokens],
        types=[int(t) for t in types],
        merges=[str(m) for m in _value(reader, "tokenizer.ggml.merges", [])],
        bos=token("tokenizer.ggml.bos_token_id"),
        eos=token("tokenizer.ggml.eos_token_id"),
        add_bos=bool(_value(reader, "tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(_value(reader, "tokenizer.ggml.add_eos_token", False)),
        chat_template=str(_value(reader, "tokenizer.chat_template", "")),
    )


def hf_tokenizer(vocab: Vocabulary, where: str | Path) -> Any:
    """A `tokenizers.Tokenizer` splitting text as llama.cpp does with this vocabulary, or one line why not."""
    if vocab.model != "gpt2":
        kind = {"llama": "SentencePiece", "bert": "WordPiece", "t5": "Unigram"}.get(vocab.model, vocab.model)
        raise GGUFError(f"{where}: its {kind} vocabulary is not rebuilt exactly here; {INSTEAD}")
    if vocab.pre not in PRE_TOKENIZERS:
        raise GGUFError(
            f"{where}: pre-tokenizer type {vocab.pre!r} is not rebuilt here (known: "
            f"{', '.join(PRE_TOKENIZERS)}); {INSTEAD}"
        )
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
        from tokenizers.models import BPE
    except ImportError as e:
        raise GGUFError("a GGUF tokenizer needs 'tokenizers': pip install 'replayproxy[gguf]'") from e
    split, ignore_merges = PRE_TOKENIZERS[vocab.pre]
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    merges = [(a, b) for a, _, b in (m.partition(" ") for m in vocab.merges)]
    try:
        tokenizer = Tokenizer(BPE(ids, merges, ignore_merges=ignore_merges))
    except Exception as e:  # noqa: BLE001 — tokenizers raises its own exception types
        raise GGUFError(f"{where}: its vocabulary and merges do not fit together ({e}); {INSTEAD}") from e
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens([
        AddedToken(t, special=k in SPECIAL_TYPES, normalized=False)
        for t, k in zip(vocab.tokens, vocab.types, strict=False)
        if k in SPECIAL_TYPES or k == USER_DEFINED
    ])  # fmt: skip
    tokenizer.post_processor = _post_processor(vocab, ids, processors)
    return tokenizer


def _post_processor(vocab: Vocabulary, ids: dict[str, int], processors: Any) -> Any:
    """BOS / EOS added around the text as the file asks (llama.cpp's add_special)."""
    head = [vocab.bos] if vocab.add_bos and vocab.bos else []
    tail = [vocab.eos] if vocab.add_eos and vocab.eos else []
    if not head and not tail:
        return processors.ByteLevel(trim_offsets=False)
    return processors.TemplateProcessing(
        single=" ".join([*head, "$A", *tail]),
        pair=" ".join([*head, "$A", *tail, *head, "$B", *tail]),
        special_tokens=[(t, ids[t]) for t in dict.fromkeys([*head, *tail])],
    )


def file_type(reader: Any) -> str:
    """The weights' type as llama.cpp names it (BF16, Q4_K_M, ...), or "type N" for one it did not name."""
    from gguf import LlamaFileType

    value = _value(reader, "general.file_type", None)
    if not isinstance(value, int):
        return "unknown"
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"type {value}"


class Dimensions(NamedTuple):
    config: dict[str, Any]  # config.json's names: what `capacity` reads
    name: str
    file_type: str  # BF16, Q4_K_M, ...
    counted_as: str  # the weight format capacity counts: float16, bfloat16, int8, int4


def dimensions(path: str | Path) -> Dimensions:
    """The model's architecture numbers from the GGUF metadata, under config.json's names."""
    path = Path(path)
    reader = _reader(path)
    arch = str(_value(reader, "general.architecture", ""))
    if not arch:
        raise GGUFError(f"{path}: the GGUF file names no architecture (general.architecture)")

    def number(key: str) -> int:
        value = _value(reader, f"{arch}.{key}", 0)
        return int(max(value) if isinstance(value, Sequence) and value else value or 0)  # per-layer lists

    tokens = reader.fields.get("tokenizer.ggml.tokens")
    tensors = {t.name for t in reader.tensors}
    kind = file_type(reader)
    counted_as = WEIGHT_FORMATS.get(kind, "bfloat16")
    rope, key_length = number("rope.dimension_count"), number("attention.key_length")
    hf: dict[str, Any] = {
        "model_type": arch,
        "hidden_size": number("embedding_length"),
        "num_hidden_layers": number("block_count"),
        "num_attention_heads": number("attention.head_count"),
        "num_key_value_heads": number("attention.head_count_kv"),
        "intermediate_size": number("feed_forward_length"),
        "vocab_size": number("vocab_size") or (len(tokens.data) if tokens is not None else 0),
        "max_position_embeddings": number("context_length"),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "torch_dtype": "float16" if counted_as == "float16" else "bfloat16",
        "num_local_experts": number("expert_count"),
        "num_experts_per_tok": number("expert_used_count"),
        "moe_intermediate_size": number("expert_feed_forward_length"),
        "shared_expert_intermediate_size": number("expert_shared_count")
        * number("expert_feed_forward_length"),
        "first_k_dense_replace": number("leading_dense_block_count"),
        "kv_lora_rank": number("attention.kv_lora_rank"),
        "q_lora_rank": number("attention.q_lora_rank"),
    }
    if hf["kv_lora_rank"]:  # MLA: a key is its no-position part plus its rotary part
        hf |= {"qk_rope_head_dim": rope, "qk_nope_head_dim": key_length - rope}
        hf["v_head_dim"] = number("attention.value_length")
    elif key_length:
        hf["head_dim"] = key_length
    if counted_as in ("int4", "int8"):
        hf["quantization_config"] = {"quant_method": "gguf", "bits": 4 if counted_as == "int4" else 8}
    name = str(_value(reader, "general.name", "") or path.stem)
    return Dimensions(hf, name, kind, counted_as)
