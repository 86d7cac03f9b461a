"""Falcon (its three attention layouts), DBRX and the options the registry oracle's one tiny
instance per family leaves at their defaults (biases, q/k norms, gated norms, dense
variants of MoE hybrids), read from a ``config.json`` SAVED by the installed transformers
and checked against the real tiny model the way the registry oracle checks every family
(tests/test_costmodel_registry_oracle.py): parameters, weight bytes, prefill and decode
FLOPs under ``FlopCounterMode`` and the cache the prefill left."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import ModelSpec

transformers = pytest.importorskip("transformers")

from tests.test_costmodel_registry_oracle import (  # noqa: E402
    NESTED,
    B,
    S,
    Truth,
    mismatches,
    perfscope_spec,
    run_truth,
    tiny_config,
)


def _saved_spec(tmp_path: Path, conf: Any) -> tuple[Any, ModelSpec]:
    """Save ``conf``, load it back as a user would, and read the folder with perfscope."""
    folder = tmp_path / f"{conf.model_type}-saved"
    conf.save_pretrained(folder)
    loaded = transformers.AutoConfig.from_pretrained(folder)
    loaded._attn_implementation = "eager"
    spec = ModelSpec.from_hf_config(folder)
    spec = replace(
        spec,
        weight_bytes_per_param=4.0,
        unquantized_bytes_per_param=0.0,
        act_bytes_per_element=4.0,
        kv_bytes_per_element=4.0,
    )
    return loaded, spec


def _falcon(**layout: Any) -> Any:
    return transformers.FalconConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=211,
        max_position_embeddings=128,
        **layout,
    )


FALCON_LAYOUTS = {
    # Falcon-7B: one shared K/V head, parallel attention and MLP off one LayerNorm, RoPE.
    "multi_query": {"multi_query": True, "parallel_attn": True},
    # Falcon-40B/180B: K/V groups, two LayerNorms feeding the parallel branches.
    "new_decoder_architecture": {
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
        "parallel_attn": True,
    },
    # Falcon-RW: ALiBi, multi-head, sequential attention then MLP, biases everywhere.
    "alibi": {"alibi": True, "multi_query": False, "parallel_attn": False, "bias": True},
}


@pytest.mark.parametrize("layout", sorted(FALCON_LAYOUTS))
def test_falcon_layouts_saved_by_transformers_are_counted_exactly(
    tmp_path: Path, layout: str
) -> None:
    conf, spec = _saved_spec(tmp_path, _falcon(**FALCON_LAYOUTS[layout]))
    assert spec.family == "falcon"
    _, truth = run_truth(conf)
    if layout == "new_decoder_architecture":
        # perfscope caches the 2 K/V groups, as serving engines and transformers 5.25 do
        # (transformers 5.24 broadcast them to all 4 heads before its cache).
        assert spec.n_kv_heads == 2
        assert any("K/V heads cached" in n for n in cm.model_assumptions(spec))
        broadcast = cm.kv_cache_bytes(spec, B * S, batch=B) * spec.n_heads // spec.n_kv_heads
        if truth.kv_bytes == broadcast:
            truth = replace(truth, kv_bytes=truth.kv_bytes * spec.n_kv_heads // spec.n_heads)
    assert mismatches(spec, truth) == []
    assert truth.kv_bytes == cm.kv_cache_bytes(spec, B * S, batch=B)


def test_falcon_7b_release_config_counts_7b_parameters() -> None:
    """falcon-7b's own config.json (legacy RefinedWebModel keys) through the JSON reader."""
    cfg = {
        "model_type": "RefinedWebModel",
        "architectures": ["RWForCausalLM"],
        "hidden_size": 4544,
        "n_head": 71,
        "n_layer": 32,
        "multi_query": True,
        "parallel_attn": True,
        "bias": False,
        "vocab_size": 65024,
    }
    spec = ModelSpec.from_hf_config(cfg, reader="json")
    assert (spec.n_kv_heads, spec.head_dim, spec.norms_per_layer) == (1, 64, 1)
    assert (
        cm.param_count(spec) == 6_921_720_704
    )  # FalconForCausalLM of that shape on the meta device


def test_dbrx_saved_by_transformers_is_counted_exactly(tmp_path: Path) -> None:
    conf = transformers.DbrxConfig(
        d_model=64,
        n_heads=4,
        n_layers=2,
        vocab_size=211,
        max_seq_len=128,
        # rope_theta and clip_qkv: what transformers 5.24's DBRX attention needs to build
        attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
    )
    conf, spec = _saved_spec(tmp_path, conf)
    assert (spec.family, spec.n_experts, spec.n_active_experts, spec.n_kv_heads) == (
        "dbrx",
        4,
        2,
        2,
    )
    _, truth = run_truth(conf)
    assert isinstance(truth, Truth)
    assert mismatches(spec, truth) == []


#: Options the oracle's one tiny instance per family leaves at their defaults.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "cohere2_moe-shared-experts": ("cohere2_moe", {"num_shared_experts": 2}),
    "granitemoe_swa-shared-mlp": ("granitemoe_swa", {"shared_intermediate_size": 48}),
    "exaone_moe-no-shared-all-sparse": (
        "exaone_moe",
        {"num_shared_experts": 0, "mlp_layer_types": ["sparse", "sparse"]},
    ),
    "glm4_moe_lite-all-sparse-two-shared": (
        "glm4_moe_lite",
        {"mlp_layer_types": ["sparse", "sparse"], "n_shared_experts": 2},
    ),
    "ernie4_5_moe-biases": ("ernie4_5_moe", {"use_bias": True}),
    "ernie4_5_moe-moe-range": (
        "ernie4_5_moe",
        {
            "num_hidden_layers": 4,
            "moe_layer_start_index": 1,
            "moe_layer_end_index": 2,
            "moe_num_shared_experts": 0,
        },
    ),
    "hunyuan_v1_moe-bias-top2": ("hunyuan_v1_moe", {"attention_bias": True, "moe_topk": 2}),
    "persimmon-no-qk-norm": ("persimmon", {"qk_layernorm": False}),
    "mpt-untied": ("mpt", {"tie_word_embeddings": False}),
    "nanochat-attention-bias": ("nanochat", {"attention_bias": True}),
    "minimax_m2-attention-bias-ignored": ("minimax_m2", {"attention_bias": True}),
    "youtu-bias": ("youtu", {"attention_bias": True}),
    "ministral3-no-window": ("ministral3", {"sliding_window": None}),
    "hyperclovax-no-post-norm-bias": (
        "hyperclovax",
        {"use_post_norm": False, "attention_bias": True},
    ),
    "apertus-biases-relu2": (
        "apertus",
        {"attention_bias": True, "mlp_bias": True, "hidden_act": "relu2"},
    ),
    "lfm3-plain": (
        "lfm3",
        {"use_sandwich_norm": False, "use_attention_gate": False, "conv_bias": True},
    ),
    "jais2-bias-free": ("jais2", {"attention_bias": False, "mlp_bias": False}),
    "minicpm5_moe-bias": ("minicpm5_moe", {"attention_bias": True}),
    "qwen3_next-attention-bias": ("qwen3_next", {"attention_bias": True}),
    "hy_v3-bias": ("hy_v3", {"attention_bias": True}),
    "sarvam_mla-bias": ("sarvam_mla", {"attention_bias": True}),
    "afmoe-bias": ("afmoe", {"attention_bias": True}),
    "afmoe-all-moe-no-shared": ("afmoe", {"num_dense_layers": 0, "num_shared_experts": 0}),
    "solar_open-bias-two-shared": ("solar_open", {"attention_bias": True, "n_shared_experts": 2}),
    "olmo-bias-clip": ("olmo", {"attention_bias": True, "clip_qkv": 8.0}),
    "gpt_bigcode-multi-head": ("gpt_bigcode", {"multi_query": False}),
    "glm4_moe-qk-norm-bias": ("glm4_moe", {"use_qk_norm": True, "attention_bias": True}),
    "minicpm3-bias-untied": ("minicpm3", {"attention_bias": True, "tie_word_embeddings": False}),
    # Mamba2's in_proj bias covers gate, conv channels and dt (perfscope once counted 2·I)
    "mamba2-bias": ("mamba2", {"use_bias": True}),
    "bamba-proj-bias": ("bamba", {"mamba_proj_bias": True, "attention_bias": True}),
    "jamba-proj-bias-no-conv-bias": ("jamba", {"mamba_proj_bias": True, "mamba_conv_bias": False}),
    "nemotron_h-bias": ("nemotron_h", {"use_bias": True, "mlp_bias": True}),
    "lfm2-conv-bias": ("lfm2", {"conv_bias": True}),
    "granitemoehybrid-dense": ("granitemoehybrid", {"num_local_experts": 0}),
    "falcon_h1-gated-norm-biases": (
        "falcon_h1",
        {"mamba_rms_norm": True, "mamba_proj_bias": True, "projectors_bias": True},
    ),
    "zamba2-two-blocks-three-uses": (
        "zamba2",
        {
            "num_hidden_layers": 6,
            "layers_block_type": [
                "linear_attention",
                "hybrid",
                "linear_attention",
                "hybrid",
                "hybrid",
                "linear_attention",
            ],
            "num_mem_blocks": 2,
        },
    ),
    "zamba2-biases-no-attention-adapters": (
        "zamba2",
        {"add_bias_linear": True, "use_shared_attention_adapter": False},
    ),
    "qwen3_next-sparse-step": ("qwen3_next", {"decoder_sparse_step": 2, "mlp_only_layers": []}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_layout_variants_saved_by_transformers_are_counted_exactly(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_type, options = VARIANTS[variant]
    monkeypatch.setitem(NESTED, model_type, {**NESTED.get(model_type, {}), **options})
    conf = tiny_config(model_type)
    for key, value in options.items():
        assert getattr(conf, key) == value, key
    _, truth = run_truth(conf)
    folder = tmp_path / model_type
    conf.save_pretrained(folder)
    saved = ModelSpec.from_hf_config(folder)
    as_oracle = perfscope_spec(conf)  # the oracle's fp32 view of the same config
    spec = replace(
        saved,
        **{
            k: getattr(as_oracle, k)
            for k in ("weight_bytes_per_param", "act_bytes_per_element", "mla_absorbed")
        },
        kv_bytes_per_element=4.0,
        unquantized_bytes_per_param=0.0,
    )
    assert replace(spec, notes=()) == replace(as_oracle, notes=())
    assert mismatches(spec, truth) == []
