"""Memory arithmetic against published parameter counts and hand-worked examples."""

from __future__ import annotations

from dataclasses import replace

import pytest

from replayproxy.capacity.memory import (
    GIB,
    ModelConfigError,
    ModelSpec,
    Setup,
    kv_bytes_per_token,
    parameter_parts,
    plan,
    smallest_tp,
    weight_bytes,
)
from replayproxy.capacity.presets import PRESETS, find_preset


def preset(name: str) -> ModelSpec:
    return ModelSpec.from_hf_config(PRESETS[name][1], name)


# Published totals (model cards / DeepSeek README_WEIGHTS.md), checked within 1%.
@pytest.mark.parametrize(
    ("name", "published_total", "published_active"),
    [
        ("Llama-3.1-8B", 8.03e9, None),
        ("Llama-3.1-70B", 70.6e9, None),
        ("Qwen2.5-7B", 7.61e9, None),
        ("Qwen2.5-72B", 72.7e9, None),
        ("Mistral-7B-v0.3", 7.25e9, None),
        ("Mixtral-8x7B", 46.7e9, 12.9e9),
        ("DeepSeek-V3", 671e9, 36.6e9),  # DeepSeek's active count leaves out the input embedding
    ],
)
def test_parameter_counts_match_published_totals(
    name: str, published_total: float, published_active: float | None
) -> None:
    spec = preset(name)
    parts = parameter_parts(spec)
    total = sum(p.params for p in parts)
    assert total == pytest.approx(published_total, rel=0.01)
    if published_active is not None:
        active = sum(p.active for p in parts)
        if name == "DeepSeek-V3":
            active -= spec.vocab_size * spec.hidden_size
        assert active == pytest.approx(published_active, rel=0.01)
        assert active < total / 3


def test_llama_8b_parameters_by_hand() -> None:
    h, layers, vocab, inter = 4096, 32, 128256, 14336
    attention = h * h * 2 + h * 1024 * 2  # q, o: 32 heads x 128; k, v: 8 kv heads x 128
    mlp = 3 * h * inter
    norms = (2 * layers + 1) * h
    expected = 2 * vocab * h + layers * (attention + mlp) + norms
    assert sum(p.params for p in parameter_parts(preset("Llama-3.1-8B"))) == expected == 8_030_261_248


def test_qwen_counts_its_qkv_bias() -> None:
    spec = preset("Qwen2.5-7B")
    assert spec.qkv_bias
    without = ModelSpec.from_hf_config({**PRESETS["Qwen2.5-7B"][1], "attention_bias": False})
    difference = sum(p.params for p in parameter_parts(spec)) - sum(
        p.params for p in parameter_parts(without)
    )
    assert difference == 28 * (3584 + 2 * 4 * 128)


@pytest.mark.parametrize(
    ("name", "kv_dtype", "expected"),
    [
        ("Llama-3.1-8B", "auto", 2 * 32 * 8 * 128 * 2),  # 131072
        ("Llama-3.1-8B", "fp8", 2 * 32 * 8 * 128 * 1),
        ("Llama-3.1-70B", "bf16", 2 * 80 * 8 * 128 * 2),
        ("Qwen2.5-7B", "auto", 2 * 28 * 4 * 128 * 2),
        ("Mixtral-8x7B", "auto", 2 * 32 * 8 * 128 * 2),
        ("DeepSeek-V3", "auto", 61 * (512 + 64) * 2),  # MLA: one latent, not K and V
    ],
)
def test_kv_bytes_per_token(name: str, kv_dtype: str, expected: int) -> None:
    assert kv_bytes_per_token(preset(name), kv_dtype) == expected


def test_kv_bytes_per_token_with_tensor_parallel() -> None:
    spec = preset("Llama-3.1-8B")
    assert kv_bytes_per_token(spec, "auto", tp=2) == 131072 // 2
    assert kv_bytes_per_token(spec, "auto", tp=8) == 2 * 32 * 1 * 128 * 2
    # 8 kv heads over 16 ranks: each rank keeps one whole head, so no further shrinking.
    assert kv_bytes_per_token(spec, "auto", tp=16) == 2 * 32 * 1 * 128 * 2
    result = plan(spec, Setup(gpu_memory_bytes=80 * GIB, gpus=16, tp=16))
    assert any("replicated" in note for note in result.notes)
    # MLA latents are not split across ranks.
    assert kv_bytes_per_token(preset("DeepSeek-V3"), "auto", tp=8) == 61 * 576 * 2


def test_int4_weights_by_hand() -> None:
    """Linear layers at 4 bits + fp16 scale and int4 zero per 128 weights; the rest stays 16-bit."""
    spec = preset("Llama-3.1-8B")
    linear = 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336)
    rest = 2 * 128256 * 4096 + 65 * 4096
    per_param = 0.5 + 2.5 / 128
    assert weight_bytes(parameter_parts(spec), "int4") == pytest.approx(linear * per_param + rest * 2, abs=1)
    assert weight_bytes(parameter_parts(spec), "fp8") == linear + rest * 2
    assert weight_bytes(parameter_parts(spec), "bf16") == (linear + rest) * 2


def test_plan_splits_the_budget_by_hand_with_fp8_kv() -> None:
    spec = preset("Llama-3.1-8B")
    setup = Setup(
        gpu_memory_bytes=24 * GIB,
        util=0.9,
        kv_dtype="fp8",
        runtime_bytes=GIB,
        activation_bytes=GIB,
        block_size=16,
    )
    result = plan(spec, setup)
    budget = int(0.9 * 24 * GIB)
    kv = budget - 16_060_522_496 - 2 * GIB
    assert result.budget_per_gpu_bytes == budget
    assert result.kv_per_gpu_bytes == kv
    assert result.kv_blocks == kv // (16 * 65536)
    assert result.kv_tokens == result.kv_blocks * 16
    bf16 = plan(spec, replace(setup, kv_dtype="auto"))
    assert bf16.kv_blocks == kv // (16 * 131072)
    assert result.kv_tokens == pytest.approx(2 * bf16.kv_tokens, abs=16)


def test_seed_arithmetic_kv_is_what_weights_and_activations_leave() -> None:
    """'24 GB: weights 16.2 / KV 6.5 / activations 1.3': KV = memory - weights - activations."""
    spec = preset("Llama-3.1-8B")
    result = plan(
        spec, Setup(gpu_memory_bytes=24 * 10**9, util=1.0, runtime_bytes=0, activation_bytes=1_300_000_000)
    )
    assert result.weights_per_gpu_bytes == 16_060_522_496  # 8.03 B x 2 B
    assert result.kv_per_gpu_bytes == 24 * 10**9 - 16_060_522_496 - 1_300_000_000  # 6.64 GB
    split = result.weights_per_gpu_bytes + result.activation_per_gpu_bytes + result.kv_per_gpu_bytes
    assert split == result.budget_per_gpu_bytes


def test_doubling_the_context_halves_the_sequences() -> None:
    result = plan(preset("Llama-3.1-8B"), Setup(gpu_memory_bytes=80 * GIB))
    assert result.sequences_at(16384) == result.kv_blocks // 1024
    assert result.sequences_at(32768) == result.kv_blocks // 2048
    assert result.sequences_at(32768) in (
        result.sequences_at(16384) // 2,
        (result.sequences_at(16384) + 1) // 2,
    )
    assert result.sequences_at(8000) == result.kv_blocks // 500  # rounded up to whole blocks


def test_tensor_parallel_shards_weights_and_replicas_multiply_sequences() -> None:
    spec = preset("Llama-3.1-70B")
    one = plan(spec, Setup(gpu_memory_bytes=80 * GIB, gpus=4, tp=4))
    norms_bytes = (2 * 80 + 1) * 8192 * 2
    assert one.weights_per_gpu_bytes == pytest.approx(
        (one.weights_bytes - norms_bytes) / 4 + norms_bytes, abs=8
    )
    two = plan(spec, Setup(gpu_memory_bytes=80 * GIB, gpus=8, tp=4))
    assert two.replicas == 2 and two.kv_blocks == one.kv_blocks
    assert two.sequences_at(8192) == 2 * one.sequences_at(8192)


def test_weights_that_do_not_fit() -> None:
    spec = preset("Llama-3.1-70B")
    setup = Setup(gpu_memory_bytes=80 * GIB)
    result = plan(spec, setup)
    assert not result.weights_fit and result.kv_blocks == 0 and result.sequences_at(2048) == 0
    assert smallest_tp(spec, setup) == 2
    assert plan(spec, Setup(gpu_memory_bytes=80 * GIB, weight_dtype="int4")).weights_fit


def test_util_for_inverts_the_budget() -> None:
    result = plan(preset("Qwen2.5-7B"), Setup(gpu_memory_bytes=80 * GIB, util=0.8))
    assert result.util_for(result.kv_tokens) == pytest.approx(0.8, abs=1e-3)
    assert result.util_for(result.kv_tokens) <= 0.8
    assert result.util_for(2 * result.kv_tokens) > 0.8


def test_checkpoint_format_is_the_default_weight_dtype() -> None:
    result = plan(preset("DeepSeek-V3"), Setup(gpu_memory_bytes=141 * GIB, gpus=8, tp=8))
    assert result.weight_dtype == "fp8"
    assert any("MLA" in note for note in result.notes)


def test_config_reading() -> None:
    base = {"hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16, "vocab_size": 1000}
    spec = ModelSpec.from_hf_config(
        {**base, "intermediate_size": 4096, "num_key_value_heads": 1, "head_dim": 256}
    )
    assert spec.attention_kind == "MQA" and spec.head_dim == 256
    assert kv_bytes_per_token(spec) == 2 * 4 * 1 * 256 * 2
    assert ModelSpec.from_hf_config({**base, "intermediate_size": 8}).head_dim == 128  # hidden / heads
    nested = ModelSpec.from_hf_config({"model_type": "vl", "text_config": {**base, "intermediate_size": 8}})
    assert nested.num_layers == 4
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        ModelSpec.from_hf_config({"hidden_size": 8})
    with pytest.raises(ModelConfigError, match="intermediate_size"):
        ModelSpec.from_hf_config(base)
    with pytest.raises(ModelConfigError, match="multiple"):
        ModelSpec.from_hf_config({**base, "intermediate_size": 8, "num_key_value_heads": 5})


def test_plan_rejects_bad_setups() -> None:
    spec = preset("Llama-3.1-8B")
    with pytest.raises(ValueError, match="multiple of --tp"):
        plan(spec, Setup(gpu_memory_bytes=GIB, gpus=3, tp=2))
    with pytest.raises(ValueError, match="does not divide"):
        plan(spec, Setup(gpu_memory_bytes=GIB, gpus=3, tp=3))
    with pytest.raises(ValueError, match="util"):
        plan(spec, Setup(gpu_memory_bytes=GIB, util=1.5))


def test_presets_are_found_by_name_or_repository() -> None:
    assert find_preset("llama-3.1-8b") is not None
    found = find_preset("meta-llama/Llama-3.1-8B")
    assert found is not None and found[0] == "Llama-3.1-8B"
    assert find_preset("gpt-5") is None
