"""Regression tests for errors that were silent: every config here is a ``config.json`` SAVED
by the installed transformers (``save_pretrained`` into ``tmp_path``), the way users meet
them, never a hand-written dict. Truth is the real model: tiny random instances for FLOPs
and parameters, torch's ``meta`` device for full-size parameter counts."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.parallel import ParallelPlan, predict_parallel
from perfscope.analysis.whatif import predict
from perfscope.hwdb import resolve_device

transformers = pytest.importorskip("transformers")

B, S = 2, 12


def _save(tmp_path: Path, conf: Any) -> Path:
    folder = tmp_path / type(conf).__name__
    conf.save_pretrained(folder)
    return folder


def _model(conf: Any, cls: Any = None) -> Any:
    kwargs: dict[str, Any] = {"attn_implementation": "eager"}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if cls is None:
            cls = transformers.AutoModelForCausalLM
            kwargs["experts_implementation"] = "eager"
            try:
                return cls.from_config(conf, **kwargs).float().eval()
            except (TypeError, ValueError):
                kwargs.pop("experts_implementation")
        return cls.from_config(conf, **kwargs).float().eval()


def _flops(model: Any, vocab: int) -> tuple[int, int]:
    ids = torch.randint(3, vocab, (B, S))
    nxt = torch.randint(3, vocab, (B, 1))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FlopCounterMode(display=False) as fc:
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        prefill = int(fc.get_total_flops())
        with FlopCounterMode(display=False) as fc:
            model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return prefill, int(fc.get_total_flops())


def _meta_params(conf: Any) -> int:
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(conf)
    return sum(p.numel() for p in model.parameters())


_TINY = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 211,
    "max_position_embeddings": 256,
}


def test_qwen3_moe_saved_by_transformers_keeps_its_experts(tmp_path: Path) -> None:
    conf = transformers.Qwen3MoeConfig(
        **_TINY, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32
    )
    folder = _save(tmp_path, conf)
    saved = json.loads((folder / "config.json").read_text())
    assert "num_experts" not in saved and saved["num_local_experts"] == 8  # the v5 spelling
    for reader in ("auto", "json"):
        spec = ModelSpec.from_hf_config(folder, reader=reader)
        assert (spec.n_experts, spec.n_active_experts) == (8, 2), reader
    spec = ModelSpec.from_hf_config(folder)
    model = _model(conf)
    assert cm.param_count(spec) == sum(p.numel() for p in model.parameters())
    assert (cm.step_cost(spec, B, B * S, 0).flops, cm.step_cost(spec, B, B, B * S).flops) == (
        _flops(model, spec.vocab_size)
    )


def test_qwen3_30b_a3b_resaved_counts_30_5b_parameters(tmp_path: Path) -> None:
    conf = transformers.Qwen3MoeConfig(
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        vocab_size=151936,
        tie_word_embeddings=False,
    )
    spec = ModelSpec.from_hf_config(_save(tmp_path, conf))
    assert cm.param_count(spec) == _meta_params(conf)
    assert cm.param_count(spec) == pytest.approx(30.53e9, rel=1e-3)


def test_mla_kv_cache_is_not_split_by_tensor_parallelism() -> None:
    spec = ModelSpec.from_preset("deepseek-v3")
    h200 = resolve_device("h100-sxm5-80gb")
    kw: dict[str, Any] = {"batch": 8, "prompt_len": 4096, "output_len": 128}
    one = predict(spec, h200, tp=1, **kw)["memory"]["kv_cache_bytes"]
    eight = predict(spec, h200, tp=8, **kw)["memory"]["kv_cache_bytes"]
    assert eight == one  # every rank holds the whole latent
    assert cm.kv_share_per_device(spec, 8) == 1.0
    table = predict_parallel(spec, h200, ParallelPlan(tp=8), **kw)
    weights_per_device = cm.weight_bytes(spec) / 8
    assert table.stage_memory_bytes[0] == pytest.approx(weights_per_device + eight, rel=1e-9)
    # ordinary GQA still splits its heads
    llama = ModelSpec.from_preset("llama-3-70b")
    assert cm.kv_share_per_device(llama, 8) == 1 / 8
    assert cm.kv_share_per_device(llama, 16) == 1 / 8


def test_saved_deepseek_v3_holds_its_whole_latent_cache_on_every_tp_rank(tmp_path: Path) -> None:
    """The issue's case from a config.json saved by transformers (DeepseekV3Config's defaults
    are DeepSeek-V3's shape): batch 64 at 4,096 tokens holds 61 layers × (512 + 64) × 2 B
    per token, 18,421,383,168 bytes, on each of 8 ranks (the old split showed 1/8 of it)."""
    conf = transformers.DeepseekV3Config(max_position_embeddings=163840)
    spec = ModelSpec.from_hf_config(_save(tmp_path, conf))
    assert spec.is_mla and cm.kv_bytes_per_token(spec) == 61 * (512 + 64) * 2.0
    h100 = resolve_device("h100-sxm5-80gb")
    kw: dict[str, Any] = {"batch": 64, "prompt_len": 4000, "output_len": 96}
    one = predict(spec, h100, tp=1, **kw)["memory"]["kv_cache_bytes"]
    eight = predict(spec, h100, tp=8, **kw)["memory"]["kv_cache_bytes"]
    assert eight == one == 64 * 4096 * 61 * (512 + 64) * 2.0 == 18_421_383_168
    table = predict_parallel(spec, h100, ParallelPlan(tp=8), **kw)
    assert table.stage_memory_bytes[0] == pytest.approx(cm.weight_bytes(spec) / 8 + eight)


def _deepseek_tiny() -> Any:
    return transformers.DeepseekV3Config(
        **{**_TINY, "num_key_value_heads": 4},
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=20,
        n_group=2,
        topk_group=1,
    )


def test_mla_prefill_is_expanded_by_default_and_absorbed_on_request(tmp_path: Path) -> None:
    conf = _deepseek_tiny()
    spec = ModelSpec.from_hf_config(_save(tmp_path, conf))
    assert (cm.mla_mode(spec, S), cm.mla_mode(spec, 1)) == ("expanded", "absorbed")
    model = _model(conf)
    prefill, decode = _flops(model, spec.vocab_size)
    # transformers runs prefill expanded: the default prefill count is exact
    assert cm.step_cost(spec, B, B * S, 0).flops == prefill
    # and decode expanded too (HF); vLLM's absorbed decode is the default
    hf = replace(spec, mla_absorbed=False)
    assert cm.step_cost(hf, B, B, B * S).flops == decode
    absorbed = replace(spec, mla_prefill_absorbed=True)
    assert cm.mla_mode(absorbed, S) == "absorbed"
    # absorbed attention runs over the 576-wide latent: at 8k tokens it is 1.87x the
    # expanded count the engines really do (what the old default reported)
    big = ModelSpec.from_preset("deepseek-v3")
    exp = cm.prefill_cost(big, 1, 8192).flops
    absd = cm.prefill_cost(replace(big, mla_prefill_absorbed=True), 1, 8192).flops
    assert absd / exp == pytest.approx(1.87, abs=0.01)


def _gptq(lm_head: bool) -> dict[str, Any]:
    return {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "desc_act": False,
        "sym": True,
        "lm_head": lm_head,
    }


def test_gptq_lm_head_true_quantises_the_lm_head(tmp_path: Path) -> None:
    d, v = 4096, 128256
    shape = {
        "hidden_size": d,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": v,
        "dtype": "float16",
    }
    plain = transformers.LlamaConfig(**shape, quantization_config=_gptq(False))
    head = transformers.LlamaConfig(**shape, quantization_config=_gptq(True))
    a = ModelSpec.from_hf_config(_save(tmp_path / "a", plain))
    b = ModelSpec.from_hf_config(_save(tmp_path / "b", head))
    assert (a.quant_lm_head, b.quant_lm_head) == (False, True)
    # packed int4 + fp16 scale + packed zero per 128 inputs, int32 g_idx per input feature
    gptq_head = d * v * (0.5 + 2 / 128 + 0.5 / 128) + 4 * d
    assert cm.weight_bytes(a) - cm.weight_bytes(b) == pytest.approx(2 * d * v - gptq_head)
    da, db = cm.decode_cost(a, 8, 4096), cm.decode_cost(b, 8, 4096)
    assert da.bytes_weights - db.bytes_weights == pytest.approx(2 * d * v - gptq_head)


def test_opt_350m_projects_a_narrower_embedding_in_and_out(tmp_path: Path) -> None:
    tiny = transformers.OPTConfig(
        hidden_size=64,
        ffn_dim=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=211,
        max_position_embeddings=256,
        word_embed_proj_dim=32,
        do_layer_norm_before=False,
    )
    spec = ModelSpec.from_hf_config(_save(tmp_path, tiny))
    assert spec.embed_dim == 32
    model = _model(tiny)
    assert cm.param_count(spec) == sum(p.numel() for p in model.parameters())
    assert (cm.step_cost(spec, B, B * S, 0).flops, cm.step_cost(spec, B, B, B * S).flops) == (
        _flops(model, spec.vocab_size)
    )
    real = transformers.OPTConfig(
        hidden_size=1024,
        ffn_dim=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        vocab_size=50272,
        max_position_embeddings=2048,
        word_embed_proj_dim=512,
        do_layer_norm_before=False,
    )
    big = ModelSpec.from_hf_config(_save(tmp_path / "350m", real))
    assert cm.param_count(big) == _meta_params(real) == 331_196_416


def test_mistral_7b_v01_keeps_its_4096_token_window() -> None:
    v01 = ModelSpec.from_preset("mistral-7b-v0.1")
    v03 = ModelSpec.from_preset("mistral-7b")
    assert (v01.sliding_window, v03.sliding_window) == (4096, 0)
    per_token = cm.kv_bytes_per_token(v03)
    assert cm.kv_cache_bytes_per_sequence(v01, 16384) == 4096 * per_token
    assert cm.kv_cache_bytes_per_sequence(v03, 16384) == 16384 * per_token


def test_the_mistral_7b_v01_alias_reads_as_v01s_saved_config(tmp_path: Path) -> None:
    """mistral-7b-v0.1 (and its alias spelling) is the config transformers saves for v0.1's
    shape with its 4096-token window, field for field; v0.3's has no window."""
    shape: dict[str, Any] = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "dtype": "bfloat16",
    }
    v01 = transformers.MistralConfig(**shape, sliding_window=4096)
    v03 = transformers.MistralConfig(**shape, sliding_window=None)
    saved01 = ModelSpec.from_hf_config(_save(tmp_path / "v01", v01))
    saved03 = ModelSpec.from_hf_config(_save(tmp_path / "v03", v03))
    for alias, saved in (("Mistral-7B-v0.1", saved01), ("mistral-7b-v0.3", saved03)):
        preset = ModelSpec.from_preset(alias)
        assert replace(preset, name="", notes=()) == replace(saved, name="", notes=()), alias
    assert (saved01.sliding_window, saved03.sliding_window) == (4096, 0)


def test_mistral_saved_without_a_window_reads_the_class_default(tmp_path: Path) -> None:
    # MistralConfig defaults to a 4096 window; the model code reads that default.
    conf = transformers.MistralConfig(**_TINY)
    saved = ModelSpec.from_hf_config(_save(tmp_path, conf))
    assert saved.sliding_window == conf.sliding_window == 4096


def test_llava_counts_its_vision_tower(tmp_path: Path) -> None:
    text = transformers.LlamaConfig(**_TINY)
    vision = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        projection_dim=16,
    )
    conf = transformers.LlavaConfig(
        text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_index=5
    )
    spec = ModelSpec.from_hf_config(_save(tmp_path, conf))
    assert spec.extra_params > 0
    assert any("vision_config" in n for n in spec.notes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.LlavaForConditionalGeneration(conf)
    assert cm.param_count(spec) == sum(p.numel() for p in model.parameters())
    # the vision tower is stored, never read by a text decode step
    no_tower = replace(spec, extra_params=0)
    step = cm.decode_cost(spec, 1, 16).bytes_weights
    assert step == cm.decode_cost(no_tower, 1, 16).bytes_weights
    assert cm.weight_bytes(spec) > cm.weight_bytes(no_tower)


def test_roofline_names_the_family_and_every_assumption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from perfscope.cli import main

    conf = _deepseek_tiny()
    folder = _save(tmp_path, conf)
    assert main(["roofline", "--model", str(folder), "--hw", "h100-sxm5-80gb", "--json"]) == 0
    lines = json.loads(capsys.readouterr().out)["assumptions"]
    assert lines[0] == "family: deepseek"
    assert any(x.startswith("MLA: prefill expanded, decode absorbed") for x in lines)
    assert any("uniform, independent routing" in x for x in lines)
    assert any(x.startswith("config read through transformers") for x in lines)
    assert main(["roofline", "--model", "mistral-7b-v0.1", "--hw", "h100-sxm5-80gb"]) == 0
    text = capsys.readouterr().out
    assert "family: mistral" in text
    gptq = transformers.LlamaConfig(**_TINY, quantization_config=_gptq(True))
    assert main(["roofline", "--model", str(_save(tmp_path / "q", gptq)), "--json"]) == 0
    lines = json.loads(capsys.readouterr().out)["assumptions"]
    assert any(
        x.startswith("weights: gptq int4 group 128") and "lm_head quantised" in x for x in lines
    )
