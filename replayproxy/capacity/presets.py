"""Model presets for `replayproxy capacity`: the architecture keys of published Hugging Face configs.

Each preset is the subset of the model's `config.json` that the calculator reads, copied from the
published file named in its comment, so a preset and a local config.json go through the same
parser (replayproxy.capacity.memory.ModelSpec.from_hf_config). Keys are in the HF spelling.
"""

from __future__ import annotations

from typing import Any

# https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
# Published total: 8.03B parameters.
LLAMA_3_1_8B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "torch_dtype": "bfloat16",
}

# https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json
# Published total: 70.6B parameters.
LLAMA_3_1_70B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "torch_dtype": "bfloat16",
}

# https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
# (q/k/v projections carry a bias in Qwen2; max_position_embeddings is 131072 in the base model's
# config, 32768 in -Instruct's, which reaches 128k with YaRN.) Published total: 7.61B parameters.
QWEN2_5_7B: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# https://huggingface.co/Qwen/Qwen2.5-72B/blob/main/config.json
# Published total: 72.7B parameters.
QWEN2_5_72B: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# https://huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json
# (v0.3 = v0.2 with the vocabulary extended to 32768; no sliding window.) Published total: 7.25B.
MISTRAL_7B_V0_3: dict[str, Any] = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 32768,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
# Published: 46.7B total, 12.9B active parameters (8 experts, 2 per token).
MIXTRAL_8X7B: dict[str, Any] = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
# MLA attention (one 512 + 64 latent per token and layer), 256 routed + 1 shared expert, the first
# 3 layers dense; weights published in FP8 (128x128 block scales). Published: 671B total main-model
# parameters and 37B active (README_WEIGHTS.md: 36.6B excluding the input embedding), plus a 14B
# multi-token-prediction module (num_nextn_predict_layers) not loaded for plain serving.
DEEPSEEK_V3: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
}

# Preset name -> (Hugging Face repository, config keys). Names are matched case-insensitively,
# and the repository id (e.g. "meta-llama/Llama-3.1-8B") is accepted too.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "Llama-3.1-8B": ("meta-llama/Llama-3.1-8B", LLAMA_3_1_8B),
    "Llama-3.1-70B": ("meta-llama/Llama-3.1-70B", LLAMA_3_1_70B),
    "Qwen2.5-7B": ("Qwen/Qwen2.5-7B", QWEN2_5_7B),
    "Qwen2.5-72B": ("Qwen/Qwen2.5-72B", QWEN2_5_72B),
    "Mistral-7B-v0.3": ("mistralai/Mistral-7B-v0.3", MISTRAL_7B_V0_3),
    "Mixtral-8x7B": ("mistralai/Mixtral-8x7B-v0.1", MIXTRAL_8X7B),
    "DeepSeek-V3": ("deepseek-ai/DeepSeek-V3", DEEPSEEK_V3),
}


def find_preset(name: str) -> tuple[str, str, dict[str, Any]] | None:
    """(preset name, repository, config) for a preset or repository name, or None."""
    wanted = name.strip().lower()
    for preset, (repo, config) in PRESETS.items():
        if wanted in (preset.lower(), repo.lower()):
            return preset, repo, config
    return None
