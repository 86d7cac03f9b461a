"""ModelSpec constructors: HF config files, presets, dtypes and quantisation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import (
    ModelSpec,
    compute_dtype_for,
    dtype_bytes,
    preset_names,
    weight_bytes_per_param,
)
from perfscope.errors import UsageError

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def test_dtype_bytes_and_weight_bytes_with_group_scales() -> None:
    assert dtype_bytes("torch.bfloat16") == 2.0
    assert dtype_bytes("float32") == 4.0
    assert dtype_bytes("fp8") == 1.0
    assert weight_bytes_per_param("int8") == 1.0
    assert weight_bytes_per_param("int4") == pytest.approx(0.5 + 2 / 128)
    assert weight_bytes_per_param("int4", group_size=32) == pytest.approx(0.5 + 2 / 32)
    assert weight_bytes_per_param("bf16", group_size=32) == 2.0
    assert compute_dtype_for("int4") == "bf16"
    assert compute_dtype_for("fp8") == "fp8"
    with pytest.raises(UsageError, match="unknown dtype"):
        dtype_bytes("fp7")


def test_llama3_config_file_reads_gqa_shape_and_dtype() -> None:
    spec = ModelSpec.from_hf_config(CONFIGS / "llama-3-8b" / "config.json")
    assert spec.name == "llama-3-8b"
    assert (spec.n_layers, spec.hidden_size, spec.n_heads, spec.n_kv_heads) == (32, 4096, 32, 8)
    assert (spec.head_dim, spec.intermediate_size, spec.vocab_size) == (128, 14336, 128256)
    assert (spec.mlp_gated, spec.tied_embeddings) == (True, False)
    assert spec.weight_dtype == spec.kv_dtype == spec.act_dtype == "bf16"
    assert cm.kv_bytes_per_token(spec) == 131_072
    # a folder works as well as the file, and matches the preset
    assert ModelSpec.from_hf_config(CONFIGS / "llama-3-8b") == spec
    preset = ModelSpec.from_preset("llama-3-8b")
    assert cm.param_count(preset) == cm.param_count(spec)


def test_gptq_config_gives_int4_weights_with_scales_and_bf16_compute() -> None:
    spec = ModelSpec.from_hf_config(CONFIGS / "llama-gptq-int4")
    assert spec.weight_dtype == "int4"
    assert spec.weight_bytes_per_param == pytest.approx(0.5 + 2 / 128)
    assert spec.act_dtype == "bf16"
    assert spec.kv_bytes_per_element == 2.0


def test_family_specific_fields() -> None:
    def fields(name: str, *keys: str) -> tuple[object, ...]:
        spec = ModelSpec.from_hf_config(CONFIGS / name)
        return tuple(getattr(spec, k) for k in keys)

    assert fields(
        "gpt2", "mlp_gated", "tied_embeddings", "pos_embeddings", "intermediate_size", "norm_bias"
    ) == (False, True, 256, 512, True)
    assert fields("gpt2", "weight_dtype") == ("fp32",)
    assert fields("qwen2", "qkv_bias", "o_bias", "sliding_window") == (True, False, 0)
    assert fields("mixtral-moe", "n_experts", "n_active_experts") == (4, 2)
    assert fields("gemma", "head_dim", "tied_embeddings", "n_kv_heads") == (48, True, 1)
    assert fields("gpt-neox", "tied_embeddings", "weight_dtype", "qkv_bias") == (
        False,
        "fp16",
        True,
    )
    assert fields("opt", "pos_embeddings", "tied_embeddings") == (258, True)
    assert fields("mistral", "sliding_window") == (8,)


def test_presets_cover_the_issue_list_and_aliases_resolve() -> None:
    for key in (
        "llama-2-7b",
        "llama-2-13b",
        "llama-2-70b",
        "llama-3-8b",
        "llama-3-70b",
        "mistral-7b",
        "mixtral-8x7b",
        "qwen2.5-7b",
        "gpt2",
    ):
        assert key in preset_names()
    assert ModelSpec.from_preset("meta-llama/Llama-2-7b-hf") == ModelSpec.from_preset("llama-2-7b")
    assert ModelSpec.from_preset("GPT-2") == ModelSpec.from_preset("gpt2")
    assert ModelSpec.resolve("Llama-3-8B").n_kv_heads == 8
    with pytest.raises(UsageError, match="unknown model preset"):
        ModelSpec.from_preset("llama-9-1t")


def test_resolve_reads_a_path_and_rejects_nonsense(tmp_path: Path) -> None:
    assert ModelSpec.resolve(str(CONFIGS / "qwen2" / "config.json")).qkv_bias
    with pytest.raises(UsageError, match="neither a preset"):
        ModelSpec.resolve(str(tmp_path / "nope.json"))
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="cannot read"):
        ModelSpec.from_hf_config(bad)
    bad.write_text(json.dumps({"model_type": "bert_like", "vocab_size": 10}))
    with pytest.raises(UsageError, match="hidden_size"):
        ModelSpec.from_hf_config(bad)


def test_to_dict_round_trip_and_old_dicts_still_load() -> None:
    spec = ModelSpec.from_preset("mixtral-8x7b").with_dtypes(weight_dtype="int4", kv_dtype="fp8")
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    old = {k: v for k, v in spec.to_dict().items() if k not in ("qkv_bias", "sliding_window")}
    old["future_field"] = 1
    assert ModelSpec.from_dict(old).n_experts == 8


def test_with_dtypes_moves_compute_and_kv() -> None:
    base = ModelSpec.from_preset("llama-2-7b")
    fp8 = base.with_dtypes(weight_dtype="fp8")
    assert (fp8.weight_bytes_per_param, fp8.act_dtype, fp8.act_bytes_per_element) == (
        1.0,
        "fp8",
        2.0,
    )
    kv8 = base.with_dtypes(kv_dtype="fp8")
    assert cm.kv_bytes_per_token(kv8) == cm.kv_bytes_per_token(base) / 2
    assert kv8.weight_dtype == base.weight_dtype
