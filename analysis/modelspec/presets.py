"""Named public models (``--model llama-3-8b``) as the config fields that matter."""

from __future__ import annotations

from pathlib import Path

from perfscope.jsontypes import JsonObject

#: Named public models as the HF ``config.json`` fields that matter (bf16). Values from the
#: models' published configs.
PRESETS: dict[str, JsonObject] = {
    "llama-2-7b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
    },
    "llama-2-13b": {
        "model_type": "llama",
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 40,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
    },
    "llama-2-70b": {
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
    },
    "llama-3-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    },
    "llama-3-70b": {
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    },
    "mistral-7b": {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    },
    "mistral-7b-v0.1": {
        # v0.1 attends over a 4096-token sliding window (v0.2/v0.3 dropped it).
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
    },
    "mixtral-8x7b": {
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
        "torch_dtype": "bfloat16",
    },
    "qwen2.5-7b": {
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
    },
    "gemma-2-9b": {
        "model_type": "gemma2",
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "vocab_size": 256000,
        "sliding_window": 4096,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    },
    "qwen1.5-moe-a2.7b": {
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "decoder_sparse_step": 1,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 151936,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "deepseek-v3": {
        # The release ships FP8 block-quantised weights; the preset is the bf16 view
        # (--weight-dtype fp8 for the release's storage).
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
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "n_group": 8,
        "topk_group": 4,
        "vocab_size": 129280,
        "max_position_embeddings": 163840,
        "torch_dtype": "bfloat16",
    },
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "vocab_size": 50257,
        "n_positions": 1024,
        "torch_dtype": "float32",
    },
}

_PRESET_ALIASES = {
    "gpt-2": "gpt2",
    "gpt2-small": "gpt2",
    "gpt-2-small": "gpt2",
    "llama2-7b": "llama-2-7b",
    "llama2-13b": "llama-2-13b",
    "llama2-70b": "llama-2-70b",
    "llama3-8b": "llama-3-8b",
    "llama3-70b": "llama-3-70b",
    "llama-3.1-8b": "llama-3-8b",
    "llama-3.1-70b": "llama-3-70b",
    "mistral-7b-v0.3": "mistral-7b",
    "mistral-7b-v0.2": "mistral-7b",
    "qwen2.5-7b-instruct": "qwen2.5-7b",
    "gemma2-9b": "gemma-2-9b",
    "qwen1.5-moe": "qwen1.5-moe-a2.7b",
    "deepseek-v3-base": "deepseek-v3",
}


def _preset_key(name: str) -> str | None:
    key = name.strip().lower().replace("_", "-")
    key = key.split("/")[-1] if "/" in key and not Path(name).exists() else key
    key = key.removeprefix("meta-").removesuffix("-hf").removesuffix("-instruct")
    if key in PRESETS:
        return key
    return _PRESET_ALIASES.get(key)


def preset_names() -> list[str]:
    """Known preset keys, in table order."""
    return list(PRESETS)
