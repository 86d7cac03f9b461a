"""The cost model on many HF architectures: FLOPs exact against FlopCounterMode, bytes against
the real model's tensors, and the cases that used to be silently wrong.

Tiny models are built from configs with random weights, eager attention and eager experts
(on CPU FlopCounterMode sees neither SDPA nor grouped-mm experts) in fp32, and run under
``torch.no_grad``. Decode bytes are checked term by term against what the model really
holds: weights read = every parameter tensor's bytes, except that the embedding table
contributes only the looked-up rows (and MoE experts only those the batch activates, in
expectation); KV read = the bytes of the cache the prefill left (HF keeps ``window - 1``
entries in sliding layers and the compressed latent in MLA layers). Activation bytes have
no such ground truth and are not checked here.
"""

from __future__ import annotations

import functools
import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import ModelSpec, family_for, quant_layout
from perfscope.errors import UsageError

transformers = pytest.importorskip("transformers")

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
B, S = 2, 12

_BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 211,
    "max_position_embeddings": 256,
    "torch_dtype": "float32",
}

#: Small configs of the families the older tests do not build, each with the feature that
#: used to be miscounted turned on at a size the test sequence (12 tokens) exercises.
INLINE: dict[str, dict[str, Any]] = {
    "qwen3": {**_BASE, "model_type": "qwen3", "head_dim": 24, "tie_word_embeddings": True},
    "llama-mqa-bias": {
        **_BASE,
        "model_type": "llama",
        "num_key_value_heads": 1,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "granite": {**_BASE, "model_type": "granite"},
    "gemma2-window": {**_BASE, "model_type": "gemma2", "head_dim": 16, "sliding_window": 4},
    "gemma3-window": {
        **_BASE,
        "model_type": "gemma3_text",
        "head_dim": 16,
        "sliding_window": 4,
        "sliding_window_pattern": 3,
        "num_hidden_layers": 5,
    },
    "qwen2-max-window-layers": {
        **_BASE,
        "model_type": "qwen2",
        "use_sliding_window": True,
        "sliding_window": 4,
        "max_window_layers": 2,
    },
    "starcoder2-window": {
        **_BASE,
        "model_type": "starcoder2",
        "sliding_window": 6,
        "use_bias": True,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "qwen2-moe-shared": {
        **_BASE,
        "model_type": "qwen2_moe",
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 80,
        "mlp_only_layers": [1],
    },
    "qwen3-moe": {
        **_BASE,
        "model_type": "qwen3_moe",
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    },
    "deepseek-v3-mla": {
        **_BASE,
        "model_type": "deepseek_v3",
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 32,
        "q_lora_rank": 48,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 20,
        "n_group": 2,
        "topk_group": 1,
    },
    "deepseek-v2-lite-mla": {
        **_BASE,
        "model_type": "deepseek_v2",
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 2,
        "moe_intermediate_size": 24,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
    },
}
FILES = ["gpt2", "llama-gqa", "qwen2", "mixtral-moe", "mistral", "gemma", "phi3", "gpt-neox", "opt"]
ARCHS = [*FILES, *INLINE]


def _config(name: str) -> dict[str, Any]:
    if name in INLINE:
        return dict(INLINE[name])
    cfg: dict[str, Any] = json.loads((CONFIGS / name / "config.json").read_text())
    return cfg


@functools.cache
def _built(name: str) -> tuple[Any, ModelSpec, int, int, int, Any]:
    """(model, spec, params, prefill FLOPs, decode FLOPs, cache after prefill), built once."""
    cfg = _config(name)
    conf = transformers.AutoConfig.for_model(
        **{k: v for k, v in cfg.items() if k != "architectures"}
    )
    kwargs: dict[str, Any] = {"attn_implementation": "eager"}
    if any(cfg.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        kwargs["experts_implementation"] = "eager"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(conf, **kwargs).float().eval()
    spec = ModelSpec.from_hf_config(cfg, name=name)
    if spec.is_mla:
        spec = replace(spec, mla_absorbed=False)  # HF expands the latent (naive MLA)
    ids = torch.randint(3, spec.vocab_size, (B, S))
    nxt = torch.randint(3, spec.vocab_size, (B, 1))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FlopCounterMode(display=False) as fc:
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        prefill = int(fc.get_total_flops())
        cache = out.past_key_values
        kv_bytes = sum(
            t.numel() * t.element_size()
            for layer in cache.layers
            for t in (layer.keys, layer.values)
        )
        with FlopCounterMode(display=False) as fc:
            model(input_ids=nxt, past_key_values=cache, use_cache=True)
        decode = int(fc.get_total_flops())
    params = sum(p.numel() for p in model.parameters())
    return model, spec, params, prefill, decode, kv_bytes


def test_at_least_fifteen_architectures_are_covered() -> None:
    families = {family_for(_config(n)).key for n in ARCHS}
    assert len(ARCHS) >= 15
    assert len(families) >= 14


@pytest.mark.parametrize("name", ARCHS)
def test_params_and_flops_match_the_real_model_exactly(name: str) -> None:
    _, spec, params, prefill, decode, _ = _built(name)
    assert cm.param_count(spec) == params
    assert cm.step_cost(spec, B, B * S, 0).flops == prefill
    assert cm.step_cost(spec, B, B, B * S).flops == decode


@pytest.mark.parametrize("name", ARCHS)
def test_decode_kv_read_is_the_cache_the_prefill_left(name: str) -> None:
    _, spec, _, _, _, kv_bytes = _built(name)
    spec = replace(spec, kv_bytes_per_element=4.0)  # the test models run in fp32
    assert cm.step_cost(spec, B, B, B * S).bytes_kv_read == kv_bytes


def _expert_tensors(model: Any) -> list[tuple[str, torch.Tensor]]:
    return [(n, p) for n, p in model.named_parameters() if ".experts." in n]


@pytest.mark.parametrize(
    "name",
    ["llama-mqa-bias", "gemma2-window", "gpt2", "qwen2-moe-shared", "deepseek-v3-mla", "qwen3-moe"],
)
def test_decode_weight_bytes_are_the_tensors_a_step_reads(name: str) -> None:
    model, spec, *_ = _built(name)
    spec = replace(spec, weight_bytes_per_param=4.0, act_bytes_per_element=4.0)
    emb = model.get_input_embeddings().weight
    experts = {id(p) for _, p in _expert_tensors(model)}
    dense = sum(p.numel() * 4 for p in model.parameters() if id(p) not in experts and p is not emb)
    tied = model.get_output_embeddings().weight is emb
    table = emb.numel() * 4 if tied else 0  # a tied lm_head reads the whole table
    rows = B * spec.hidden_size * 4 * (2 if spec.pos_embeddings else 1)
    if spec.pos_embeddings:  # GPT-2's position table is read by rows too
        wpe = model.transformer.wpe.weight
        dense -= wpe.numel() * 4
    expert_bytes = sum(p.numel() * 4 for _, p in _expert_tensors(model))
    if spec.is_moe:
        moe_layers = sum(spec.moe_layer_mask())
        per_expert = expert_bytes / (moe_layers * spec.n_experts)
        e, k = spec.n_experts, spec.n_active_experts
        expected = e * (1 - (1 - k / e) ** B)  # uniform routing of B tokens
        expert_bytes = moe_layers * expected * per_expert
    hand = dense + table + rows + expert_bytes
    assert cm.step_cost(spec, B, B, B * S).bytes_weights == pytest.approx(hand, rel=1e-12)


# ---------------------------------------------------------------------- MLA


def test_mla_absorbed_flops_by_hand_and_latent_cache() -> None:
    spec = replace(_built("deepseek-v3-mla")[1], mla_absorbed=True)
    h, r, rope, nope, v = 4, 32, 8, 16, 20
    naive = replace(spec, mla_absorbed=False)
    ctx = 100
    a, n = cm.decode_cost(spec, 1, ctx), cm.decode_cost(naive, 1, ctx)
    kv = ctx + 1
    layers = spec.n_layers
    # naive: per-head scores over h_qk = nope + rope and values over v, plus the latent of
    # every attended key expanded through kv_b (r -> H·(nope + v))
    assert n.flops_attention == layers * 2 * h * ((nope + rope) + v) * kv
    kv_b = r * h * (nope + v)
    # absorbed: scores over the latent (r + rope), values in the latent (r); kv_b's two
    # halves are applied once per query token instead of once per key
    assert a.flops_attention == layers * 2 * h * ((r + rope) + r) * kv
    assert n.flops_linear - a.flops_linear == layers * 2 * kv_b * (kv - 1)
    # both cache the latent and the shared rotary key only
    assert cm.kv_bytes_per_token(spec) == layers * (r + rope) * spec.kv_bytes_per_element
    assert a.bytes_kv_read == n.bytes_kv_read == ctx * cm.kv_bytes_per_token(spec)


def test_deepseek_v3_release_shape() -> None:
    spec = ModelSpec.from_preset("deepseek-v3")
    assert cm.param_count(spec) == 671_026_404_352  # published: 671B (MTP module excluded)
    # published 37B activated: active matmuls (lm_head included) plus the embedding
    active = cm.matmul_params(spec, active=True) + spec.vocab_size * spec.hidden_size
    assert active / 1e9 == pytest.approx(37.5, abs=0.1)
    assert cm.kv_bytes_per_token(spec) == 61 * 576 * 2  # 70 KB per token in bf16
    assert spec.dense_layers == (0, 1, 2) and spec.shared_expert_intermediate_size == 2048


# ---------------------------------------------------------------------- attention layouts


def test_mistral_decode_reads_only_the_window() -> None:
    spec = ModelSpec.from_preset("mistral-7b")
    assert spec.sliding_window == 0  # the preset is v0.2+ (no window) ...
    v01 = replace(spec, sliding_window=4096)  # ... v0.1 slides over 4096 tokens
    step = cm.decode_cost(v01, 32, 16384)
    per_layer_token = 2 * 8 * 128 * 2
    assert step.bytes_kv_read == 32 * 32 * 4095 * per_layer_token
    assert step.bytes / 1e9 == pytest.approx(31.7, abs=0.1)
    assert cm.kv_cache_bytes(v01, 32 * 16384, batch=32) == 32 * 32 * 4096 * per_layer_token


def test_gemma2_alternates_local_and_global_layers() -> None:
    spec = ModelSpec.from_preset("gemma-2-9b")
    kinds = [la.kind for la in spec.layer_attention()]
    assert kinds[:4] == ["sliding", "full", "sliding", "full"] and kinds.count("full") == 21
    step = cm.decode_cost(spec, 1, 8192)
    per_layer_token = 2 * 8 * 256 * 2
    assert step.bytes_kv_read == (21 * 8192 + 21 * 4095) * per_layer_token
    layout = {(g.kind, g.span): g for g in cm.kv_cache_layout(spec, 8192)}
    assert layout[("sliding", 4096)].bytes == 21 * 4096 * per_layer_token
    assert cm.param_count(spec) == 9_241_705_984  # google/gemma-2-9b


def test_layer_types_with_chunked_attention_match_a_brute_force_count() -> None:
    cfg = {
        **_BASE,
        "model_type": "llama",
        "layer_types": [
            "chunked_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
        ],
        "attention_chunk_size": 8,
        "sliding_window": 5,
    }
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.layer_windows == (-8, 0, 5, 0)
    past, new = 13, 6
    useful = 0
    for t in range(past, past + new):
        useful += (t % 8) + 1  # chunked: own chunk
        useful += 2 * (t + 1)  # two full layers
        useful += min(t + 1, 5)  # sliding
    per_key = 2 * spec.n_heads * 2 * spec.head_dim
    got = cm.step_cost(spec, 1, new, past)
    assert got.flops_attention_useful == per_key * useful
    assert got.bytes_kv_read == (13 % 8 + 2 * 13 + 4) * cm.kv_bytes_per_token(spec) / 4


def test_unknown_layer_type_and_family_are_refused_with_what_is_missing() -> None:
    with pytest.raises(UsageError, match="linear_attention"):
        ModelSpec.from_hf_config(
            {**_BASE, "model_type": "qwen3", "layer_types": ["linear_attention"] * 4}
        )
    with pytest.raises(
        UsageError, match=r"'mamba_like' is not a decoder family.*lacks hidden_size"
    ):
        ModelSpec.from_hf_config({"model_type": "mamba_like", "num_hidden_layers": 2})
    with pytest.raises(UsageError, match="architectures \\['FooForCausalLM'\\]"):
        ModelSpec.from_hf_config(
            {**_BASE, "model_type": "foo", "architectures": ["FooForCausalLM"]}
        )
    # an unknown model_type whose class is a known family maps cleanly
    spec = ModelSpec.from_hf_config(
        {**_BASE, "model_type": "my_finetune", "architectures": ["Qwen2ForCausalLM"]}
    )
    assert spec.qkv_bias and not spec.o_bias


# ---------------------------------------------------------------------- MoE


def test_qwen15_moe_counts_shared_experts_and_qkv_bias() -> None:
    spec = ModelSpec.from_preset("qwen1.5-moe-a2.7b")
    assert cm.param_count(spec) == 14_315_784_192  # published 14.3B total
    assert spec.qkv_bias and spec.shared_expert_gate
    # 2.7B activated = active matmuls + embedding + lm_head
    active = cm.matmul_params(spec, active=True) + spec.vocab_size * spec.hidden_size
    assert active / 1e9 == pytest.approx(2.7, abs=0.02)


def test_expected_distinct_experts_under_uniform_routing() -> None:
    spec = ModelSpec.from_preset("deepseek-v3")
    one = float(cm.expected_active_experts(spec, 1))
    assert one == pytest.approx(8)
    many = float(cm.expected_active_experts(spec, 64))
    assert many == pytest.approx(256 * (1 - (1 - 8 / 256) ** 64))
    assert 220 < many < 256


# ---------------------------------------------------------------------- quantisation


def _gptq_linear_bytes(n_in: int, n_out: int, bits: int = 4, group: int = 128) -> int:
    """The tensors AutoGPTQ saves for one linear: qweight, qzeros, scales, g_idx."""
    qweight = (n_in * bits // 32) * n_out * 4  # int32
    qzeros = (n_in // group) * (n_out * bits // 32) * 4  # int32
    scales = (n_in // group) * n_out * 2  # fp16
    g_idx = n_in * 4  # int32
    return qweight + qzeros + scales + g_idx


def test_gptq_llama2_7b_weight_bytes_match_a_hand_count() -> None:
    spec = ModelSpec.from_hf_config(CONFIGS / "llama-2-7b-gptq")
    d, f, v, layers = 4096, 11008, 32000, 32
    per_layer = 4 * _gptq_linear_bytes(d, d) + 2 * _gptq_linear_bytes(d, f)
    per_layer += _gptq_linear_bytes(f, d)
    fp16 = 2 * (2 * v * d + layers * 2 * d + d)  # embedding, lm_head, norms
    hand = layers * per_layer + fp16
    assert cm.weight_bytes(spec) == pytest.approx(hand, rel=1e-12)
    assert hand / 1e9 == pytest.approx(3.89, abs=0.01)
    # decode at batch 1 reads the same minus the table, plus one embedding row
    step = cm.decode_cost(spec, 1, 100)
    table = 2 * v * d
    expect = hand - table + 2 * d
    assert step.bytes_weights == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize(
    ("qc", "dtype", "compute", "per_param"),
    [
        (
            {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
            "int4",
            "bf16",
            0.5 + 2 / 128 + 0.5 / 128,
        ),
        (
            {
                "quant_method": "bitsandbytes",
                "load_in_4bit": True,
                "bnb_4bit_use_double_quant": True,
            },
            "int4",
            "bf16",
            0.5 + 1 / 64 + 4 / (64 * 256),
        ),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8", "int8", 1.0),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8", "fp8", 1 + 4 / 128**2),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {
                        "weights": {
                            "num_bits": 4,
                            "type": "int",
                            "strategy": "group",
                            "group_size": 128,
                            "symmetric": True,
                        },
                        "input_activations": None,
                        "targets": ["Linear"],
                    }
                },
                "ignore": ["lm_head"],
            },
            "int4",
            "bf16",
            0.5 + 2 / 128,
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {
                        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                        "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
                    }
                },
            },
            "fp8",
            "fp8",
            1.0,
        ),
    ],
)
def test_quantisation_configs_give_storage_and_compute(
    qc: dict[str, Any], dtype: str, compute: str, per_param: float
) -> None:
    cfg = {**_BASE, "model_type": "llama", "torch_dtype": "bfloat16", "quantization_config": qc}
    layout = quant_layout(cfg)
    assert layout is not None
    spec = ModelSpec.from_hf_config(cfg)
    assert (spec.weight_dtype, spec.act_dtype) == (dtype, compute)
    got = spec.weight_bytes_per_param + spec.quant_zero_bytes_per_param
    assert got == pytest.approx(per_param)
    assert spec.embedding_bytes_per_param == 2.0  # embedding and lm_head stay 16-bit
    assert spec.kv_bytes_per_element == 2.0


def test_unknown_quant_method_is_refused() -> None:
    cfg = {**_BASE, "model_type": "llama", "quantization_config": {"quant_method": "hqq"}}
    with pytest.raises(UsageError, match=r"'hqq'.*--weight-dtype"):
        ModelSpec.from_hf_config(cfg)


def test_weight_dtype_override_can_keep_embeddings_16bit() -> None:
    base = ModelSpec.from_preset("llama-2-7b")
    whole = base.with_dtypes(weight_dtype="int4")
    real = base.with_dtypes(weight_dtype="int4", keep_embeddings_16bit=True)
    lm_head = 4096 * 32000
    diff = cm.weight_bytes(real) - cm.weight_bytes(whole)
    assert diff == pytest.approx(2 * lm_head * (2 - (0.5 + 2 / 128)))
    assert ModelSpec.from_dict(json.loads(json.dumps(real.to_dict()))) == real


@pytest.mark.parametrize(
    "name", ["gemma3-window", "qwen2-max-window-layers", "deepseek-v3-mla", "qwen3-moe", "gpt2"]
)
def test_operator_classes_sum_to_the_step_and_honour_windows_mla_and_moe(name: str) -> None:
    spec = ModelSpec.from_hf_config(_config(name), name=name)
    # a prefill and a long-context decode step (context well past any window)
    for new, ctx in ((32.0, 0.0), (4.0, 256.0)):
        costs = cm.step_costs(spec, 4, new, ctx)
        total = {k: float(v) for k, v in costs.items()}
        classes = cm.operator_class_costs(total)
        assert sum(c["flops"] for c in classes.values()) == pytest.approx(total["flops"])
        assert sum(c["bytes"] for c in classes.values()) == pytest.approx(total["bytes"])
        assert classes["attention_kv"]["bytes"] == pytest.approx(
            total["bytes_kv_read"] + total["bytes_kv_write"]
        )
    if spec.sliding_window or any(spec.layer_windows):
        # the windowed layers read only their window: less KV than the same model unwindowed
        full = replace(spec, sliding_window=0, layer_windows=())
        windowed = cm.operator_class_costs(
            {k: float(v) for k, v in cm.step_costs(spec, 4, 4.0, 256.0).items()}
        )
        unwindowed = cm.operator_class_costs(
            {k: float(v) for k, v in cm.step_costs(full, 4, 4.0, 256.0).items()}
        )
        assert windowed["attention_kv"]["bytes"] < unwindowed["attention_kv"]["bytes"]
        assert windowed["attention_kv"]["flops"] < unwindowed["attention_kv"]["flops"]
