"""GPU-memory arithmetic for `replayproxy capacity`: parameters, weight bytes, KV bytes per token, KV budget.

Pure computation over a Hugging Face config (or a preset with the same keys). The formulas and
every assumption are written down in docs/capacity.md; the defaults follow vLLM's memory model
(`--gpu-memory-utilization` bounds weights + activations + runtime + KV cache, in paged blocks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from replayproxy.errors import BadInputFile, BadOption

GIB = 1 << 30

# Weight formats: bits per parameter of the quantized linear layers. Embeddings, lm_head, norms
# and MoE routers stay 16-bit in every common format (AWQ, GPTQ, vLLM fp8, compressed-tensors).
WEIGHT_BITS = {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
# int4 (AWQ / GPTQ): per group of 128 weights one fp16 scale (2 B) and one packed int4 zero (0.5 B).
INT4_GROUP_SIZE = 128
INT4_GROUP_META_BYTES = 2.5
KV_DTYPE_BYTES = {"auto": 2, "bf16": 2, "fp16": 2, "fp8": 1}
UNQUANTIZED_BYTES = 2  # the model's 16-bit dtype


class ModelConfigError(BadInputFile):
    """A model config the calculator cannot use (missing or inconsistent keys)."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The architecture numbers that decide memory; zeros mean "not this kind of model"."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int = 0
    dtype: str = "bf16"  # the checkpoint's 16-bit dtype (torch_dtype)
    quantized_as: str = ""  # weight format the checkpoint is published in, when quantized
    # Mixture of experts (Mixtral, Qwen-MoE, DeepSeek): per-layer routed experts.
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_intermediate_size: int = 0  # total width of always-on shared experts
    dense_layers: int = 0  # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    # Multi-head latent attention (DeepSeek-V2/V3): one compressed latent is cached per token.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_kind(self) -> str:
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str = "") -> ModelSpec:
        """Read a transformers config.json (text models; a nested `text_config` is used if present)."""
        if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
            config = {**config["text_config"], "quantization_config": config.get("quantization_config")}
        required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        missing = [key for key in required if not isinstance(config.get(key), int)]
        if missing:
            raise ModelConfigError(f"model config lacks {', '.join(missing)} (needs {', '.join(required)})")
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        num_experts = int(config.get("num_local_experts") or config.get("num_experts") or 0)
        num_experts = num_experts or int(config.get("n_routed_experts") or 0)
        expert_width = int(config.get("moe_intermediate_size") or config.get("intermediate_size") or 0)
        shared = int(config.get("shared_expert_intermediate_size") or 0)
        shared = shared or int(config.get("n_shared_experts") or 0) * expert_width
        intermediate = int(config.get("intermediate_size") or 0)
        if not intermediate and not num_experts:
            raise ModelConfigError("model config lacks intermediate_size")
        model_type = str(config.get("model_type", ""))
        spec = cls(
            name=name or str(config.get("_name_or_path") or model_type or "model"),
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=intermediate,
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("attention_bias", model_type.startswith("qwen2"))),
            max_position_embeddings=int(config.get("max_position_embeddings") or 0),
            dtype="fp16" if config.get("torch_dtype") == "float16" else "bf16",
            quantized_as=_published_format(config.get("quantization_config")),
            num_experts=num_experts,
            experts_per_token=int(config.get("num_experts_per_tok") or 0) if num_experts else 0,
            expert_intermediate_size=expert_width if num_experts else 0,
            shared_intermediate_size=shared if num_experts else 0,
            dense_layers=int(config.get("first_k_dense_replace") or 0) if num_experts else 0,
            kv_lora_rank=int(config.get("kv_lora_rank") or 0),
            q_lora_rank=int(config.get("q_lora_rank") or 0),
            qk_nope_head_dim=int(config.get("qk_nope_head_dim") or 0),
            qk_rope_head_dim=int(config.get("qk_rope_head_dim") or 0),
            v_head_dim=int(config.get("v_head_dim") or 0),
        )
        if spec.num_kv_heads <= 0 or spec.num_heads % spec.num_kv_heads:
            raise ModelConfigError(
                f"{spec.num_heads} attention heads are not a multiple of {spec.num_kv_heads} kv heads"
            )
        if spec.is_mla and not (spec.qk_rope_head_dim and spec.v_head_dim and spec.qk_nope_head_dim):
            raise ModelConfigError(
                "MLA config (kv_lora_rank) lacks qk_rope_head_dim, qk_nope_head_dim or v_head_dim"
            )
        if spec.is_moe and spec.experts_per_token <= 0:
            raise ModelConfigError("MoE config lacks num_experts_per_tok")
        return spec


def _published_format(quantization: Any) -> str:
    if not isinstance(quantization, Mapping):
        return ""
    method, bits = str(quantization.get("quant_method", "")).lower(), quantization.get("bits")
    if method == "fp8":
        return "fp8"
    return {4: "int4", 8: "int8"}.get(bits, "") if isinstance(bits, int) else ""


@dataclass(frozen=True, slots=True)
class Part:
    """A group of parameters, how many of them one tensor-parallel rank holds, and whether quantized."""

    name: str
    params: int
    per_gpu: int
    quantized: bool
    active: int  # parameters used per token (all of them except unrouted experts)


def parameter_parts(spec: ModelSpec, tp: int = 1) -> list[Part]:
    """Parameters by group, sharded as vLLM shards them across `tp` ranks (see docs/capacity.md)."""
    h, layers = spec.hidden_size, spec.num_layers
    shard = -(-spec.vocab_size * h // tp)
    parts = [Part("embeddings", spec.vocab_size * h, shard, False, spec.vocab_size * h)]
    if not spec.tie_word_embeddings:
        parts.append(Part("lm_head", spec.vocab_size * h, shard, False, spec.vocab_size * h))
    norms = (2 * layers + 1) * h
    if spec.is_mla:
        norms += layers * (spec.kv_lora_rank + spec.q_lora_rank)
    parts.append(Part("norms", norms, norms, False, norms))
    attn, attn_replicated = _attention_params(spec, tp)
    parts.append(Part("attention", layers * attn, layers * attn_replicated, True, layers * attn))
    dense_mlp = 3 * h * spec.intermediate_size
    if not spec.is_moe:
        parts.append(Part("mlp", layers * dense_mlp, layers * dense_mlp // tp, True, layers * dense_mlp))
        return parts
    moe_layers = layers - spec.dense_layers
    if spec.dense_layers:
        n = spec.dense_layers * dense_mlp
        parts.append(Part("dense mlp", n, n // tp, True, n))
    expert = 3 * h * spec.expert_intermediate_size
    routed = moe_layers * spec.num_experts * expert
    parts.append(Part("experts", routed, routed // tp, True, moe_layers * spec.experts_per_token * expert))
    if spec.shared_intermediate_size:
        n = moe_layers * 3 * h * spec.shared_intermediate_size
        parts.append(Part("shared experts", n, n // tp, True, n))
    router = moe_layers * h * spec.num_experts
    parts.append(Part("routers", router, router, False, router))
    return parts


def _attention_params(spec: ModelSpec, tp: int) -> tuple[int, int]:
    """(parameters of one layer's attention, those one TP rank holds)."""
    h, heads = spec.hidden_size, spec.num_heads
    if spec.is_mla:
        qk_dim = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        q_down = h * spec.q_lora_rank if spec.q_lora_rank else 0
        q_up = (spec.q_lora_rank or h) * heads * qk_dim
        kv_down = h * (spec.kv_lora_rank + spec.qk_rope_head_dim)
        kv_up = spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim)
        out = heads * spec.v_head_dim * h
        # The down-projections are replicated on every rank (ReplicatedLinear in vLLM).
        return q_down + q_up + kv_down + kv_up + out, q_down + kv_down + (q_up + kv_up + out) // tp
    q_width, kv_width = heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    bias = (q_width + 2 * kv_width) if spec.qkv_bias else 0
    total = 2 * h * q_width + 2 * h * kv_width + bias
    # With fewer kv heads than ranks, each rank keeps a whole kv head (replicated).
    kv_per_gpu = max(spec.num_kv_heads // tp, 1) * spec.head_dim
    bias_per_gpu = (q_width // tp + 2 * kv_per_gpu) if spec.qkv_bias else 0
    return total, 2 * h * q_width // tp + 2 * h * kv_per_gpu + bias_per_gpu


def quantized_bytes_per_param(weight_dtype: str) -> float:
    """Bytes per parameter of a quantized linear layer, metadata included (docs/capacity.md)."""
    if weight_dtype not in WEIGHT_BITS:
        raise BadOption(f"unknown weight dtype {weight_dtype!r}; valid: {', '.join(WEIGHT_BITS)}")
    per_param = WEIGHT_BITS[weight_dtype] / 8
    if weight_dtype == "int4":
        per_param += INT4_GROUP_META_BYTES / INT4_GROUP_SIZE
    return per_param


def weight_bytes(parts: list[Part], weight_dtype: str, *, per_gpu: bool = False) -> int:
    """Bytes of the weights (all of them, or one TP rank's share)."""
    quantized = quantized_bytes_per_param(weight_dtype)
    total = 0.0
    for part in parts:
        params = part.per_gpu if per_gpu else part.params
        total += params * (quantized if part.quantized else UNQUANTIZED_BYTES)
    return math.ceil(total)


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str = "auto", tp: int = 1) -> int:
    """KV-cache bytes one token occupies on one TP rank (tp=1: the whole model's)."""
    if kv_dtype not in KV_DTYPE_BYTES:
        raise BadOption(f"unknown kv dtype {kv_dtype!r}; valid: {', '.join(KV_DTYPE_BYTES)}")
    size = KV_DTYPE_BYTES[kv_dtype]
    if spec.is_mla:
        # One latent (kv_lora_rank) plus the shared rope key per layer, instead of K and V;
        # every TP rank caches the whole latent.
        return spec.num_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * size
    kv_heads = max(spec.num_kv_heads // tp, 1)
    return 2 * spec.num_layers * kv_heads * spec.head_dim * size


def activation_bytes(spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Peak forward-pass memory of one rank for a full batch (the engine's profile run), estimated.

    tokens x (2 hidden + q/k/v width / tp + 3 MLP width / tp) x 2 B for the residual, the
    attention projections and the MLP's gate/up/act tensors, plus fp32 logits for max_num_seqs.
    """
    if spec.is_mla:
        qkv = spec.num_heads * (2 * (spec.qk_nope_head_dim + spec.qk_rope_head_dim) + spec.v_head_dim)
    else:
        qkv = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
    mlp = spec.intermediate_size
    if spec.is_moe:
        routed = spec.experts_per_token * spec.expert_intermediate_size + spec.shared_intermediate_size
        mlp = max(mlp if spec.dense_layers else 0, routed)
    per_token = 2 * spec.hidden_size + qkv / tp + 3 * mlp / tp
    logits = max_num_seqs * spec.vocab_size * 4
    return math.ceil(max_num_batched_tokens * per_token * UNQUANTIZED_BYTES + logits)


@dataclass(frozen=True, slots=True)
class Setup:
    """How the model is served: GPUs, parallelism, formats and the engine's memory settings."""

    gpu_memory_bytes: int
    gpus: int = 1
    tp: int = 1
    weight_dtype: str = ""  # "" = the checkpoint's format (quantized_as, else its 16-bit dtype)
    kv_dtype: str = "auto"
    util: float = 0.90
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    runtime_bytes: int = 3 * GIB // 2  # CUDA context, cuBLAS/NCCL workspaces, CUDA graphs
    activation_bytes: int | None = None  # None = estimated (activation_bytes())


@dataclass(frozen=True, slots=True)
class Plan:
    """One GPU's memory split and the KV cache it leaves, per replica of `tp` GPUs."""

    spec: ModelSpec
    setup: Setup
    weight_dtype: str
    params_total: int
    params_active: int
    weights_bytes: int  # the whole model, once
    weights_per_gpu_bytes: int
    kv_bytes_per_token: int  # the whole model, per token
    kv_bytes_per_token_per_gpu: int
    activation_per_gpu_bytes: int
    budget_per_gpu_bytes: int  # util x GPU memory
    kv_per_gpu_bytes: int  # what the KV cache gets: budget - weights - activations - runtime (>= 0)
    kv_blocks: int  # per replica (every rank of a replica holds the same blocks)
    replicas: int
    notes: tuple[str, ...]

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache of one replica holds."""
        return self.kv_blocks * self.setup.block_size

    @property
    def weights_fit(self) -> bool:
        return self.weights_per_gpu_bytes <= self.budget_per_gpu_bytes

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.setup.block_size)

    def sequences_at(self, context_tokens: int) -> int:
        """Sequences of `context_tokens` that fit at once, over all replicas."""
        return self.kv_blocks // self.blocks_for(context_tokens) * self.replicas if context_tokens > 0 else 0

    def util_for(self, tokens: int) -> float:
        """The smallest utilization whose budget holds `tokens` per replica (may exceed 1)."""
        fixed = self.weights_per_gpu_bytes + self.activation_per_gpu_bytes + self.setup.runtime_bytes
        kv = self.blocks_for(tokens) * self.setup.block_size * self.kv_bytes_per_token_per_gpu
        return (fixed + kv) / self.setup.gpu_memory_bytes


def plan(spec: ModelSpec, setup: Setup) -> Plan:
    """Split one GPU's budget into weights, activations, runtime and KV cache."""
    if setup.tp < 1 or setup.gpus < 1 or setup.gpus % setup.tp:
        raise BadOption(f"--gpus {setup.gpus} must be a positive multiple of --tp {setup.tp}")
    if spec.num_heads % setup.tp:
        raise BadOption(f"--tp {setup.tp} does not divide the model's {spec.num_heads} attention heads")
    if not 0 < setup.util <= 1:
        raise BadOption(f"--util {setup.util} must be in (0, 1]")
    if setup.block_size < 1:
        raise BadOption("--block-size must be positive")
    weight_dtype = setup.weight_dtype or spec.quantized_as or spec.dtype
    parts = parameter_parts(spec, setup.tp)
    activations = setup.activation_bytes
    if activations is None:
        activations = activation_bytes(spec, setup.tp, setup.max_num_batched_tokens, setup.max_num_seqs)
    budget = int(setup.util * setup.gpu_memory_bytes)
    weights_per_gpu = weight_bytes(parts, weight_dtype, per_gpu=True)
    kv_per_gpu = max(budget - weights_per_gpu - activations - setup.runtime_bytes, 0)
    per_token_gpu = kv_bytes_per_token(spec, setup.kv_dtype, setup.tp)
    return Plan(
        spec=spec,
        setup=setup,
        weight_dtype=weight_dtype,
        params_total=sum(p.params for p in parts),
        params_active=sum(p.active for p in parts),
        weights_bytes=weight_bytes(parts, weight_dtype),
        weights_per_gpu_bytes=weights_per_gpu,
        kv_bytes_per_token=kv_bytes_per_token(spec, setup.kv_dtype),
        kv_bytes_per_token_per_gpu=per_token_gpu,
        activation_per_gpu_bytes=activations,
        budget_per_gpu_bytes=budget,
        kv_per_gpu_bytes=kv_per_gpu,
        kv_blocks=kv_per_gpu // (per_token_gpu * setup.block_size),
        replicas=setup.gpus // setup.tp,
        notes=tuple(_notes(spec, setup, weight_dtype)),
    )


def _notes(spec: ModelSpec, setup: Setup, weight_dtype: str) -> list[str]:
    notes = []
    if spec.is_mla:
        notes.append(
            f"MLA: one {spec.kv_lora_rank}+{spec.qk_rope_head_dim} latent per token and layer is cached "
            f"instead of K and V for {spec.num_kv_heads} heads; every TP rank holds the whole latent"
        )
    elif spec.num_kv_heads < setup.tp:
        notes.append(
            f"{spec.num_kv_heads} kv heads < tp {setup.tp}: each rank keeps one kv head, "
            f"replicated {setup.tp // spec.num_kv_heads}x (KV bytes per token do not shrink further)"
        )
    if weight_dtype == "int4":
        notes.append(
            f"int4: +{INT4_GROUP_META_BYTES:g} B per group of {INT4_GROUP_SIZE} weights "
            "(fp16 scale + int4 zero, AWQ/GPTQ layout)"
        )
    if weight_dtype in ("fp8", "int8", "int4"):
        notes.append("embeddings, lm_head, norms and routers stay 16-bit (not quantized)")
    if spec.quantized_as and weight_dtype != spec.quantized_as:
        notes.append(f"the checkpoint is published as {spec.quantized_as}; computed as {weight_dtype}")
    if setup.gpus > setup.tp:
        notes.append(
            f"{setup.gpus // setup.tp} replicas of tp {setup.tp} (data parallel), each with its own KV cache"
        )
    return notes


def smallest_tp(spec: ModelSpec, setup: Setup) -> int | None:
    """The smallest power-of-two TP (dividing the heads) that leaves room for a KV cache, if any."""
    tp = 1
    while tp <= spec.num_heads:
        if spec.num_heads % tp == 0:
            trial = plan(spec, replace(setup, tp=tp, gpus=tp))
            if trial.kv_blocks > 0:
                return tp
        tp *= 2
    return None
