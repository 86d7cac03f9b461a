"""The cost model against torch's FlopCounterMode and real parameter counts.

HF models are built from the small configs in ``tests/data/hf_configs`` with random
weights, eager attention and eager experts (on CPU FlopCounterMode does not see SDPA or
grouped-mm experts), and run under ``torch.no_grad`` (``inference_mode`` hides the ops).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import PRESETS, ModelSpec

transformers = pytest.importorskip("transformers")

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
SMALL = ["gpt2", "llama-gqa", "qwen2", "mixtral-moe", "mistral", "gemma", "phi3", "gpt-neox", "opt"]
B, S = 2, 12


def _flops(fn: Any) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        fn()
    return int(fc.get_total_flops())


def _hf_model(name: str) -> tuple[Any, ModelSpec]:
    cfg = json.loads((CONFIGS / name / "config.json").read_text())
    conf = transformers.AutoConfig.for_model(
        **{k: v for k, v in cfg.items() if k != "architectures"}
    )
    kwargs: dict[str, Any] = {"attn_implementation": "eager"}
    if cfg.get("num_local_experts"):
        kwargs["experts_implementation"] = "eager"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(conf, **kwargs).float().eval()
    return model, ModelSpec.from_hf_config(CONFIGS / name / "config.json")


@pytest.mark.parametrize("name", SMALL)
def test_hf_param_count_matches_numel_exactly(name: str) -> None:
    model, spec = _hf_model(name)
    assert cm.param_count(spec) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", SMALL)
def test_hf_prefill_and_decode_flops_match_flop_counter(name: str) -> None:
    model, spec = _hf_model(name)
    ids = torch.randint(3, spec.vocab_size, (B, S))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values

    # Prefill of B prompts of S tokens, logits for the last position (as generate does).
    measured_prefill = _flops(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1))
    predicted_prefill = cm.step_cost(spec, B, B * S, 0).flops
    assert predicted_prefill == pytest.approx(measured_prefill, rel=0.01)

    # One decode step on top of the S cached tokens per row.
    nxt = torch.randint(3, spec.vocab_size, (B, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured_decode = _flops(
            lambda: model(input_ids=nxt, past_key_values=cache, use_cache=True)
        )
    predicted_decode = cm.step_cost(spec, B, B, B * S).flops
    assert predicted_decode == pytest.approx(measured_decode, rel=0.01)


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "mixtral-moe"])
def test_hf_forward_with_all_position_logits_matches_when_spec_says_so(name: str) -> None:
    model, spec = _hf_model(name)
    ids = torch.randint(3, spec.vocab_size, (B, S))
    measured = _flops(lambda: model(input_ids=ids, use_cache=False))
    all_pos = ModelSpec.from_dict({**spec.to_dict(), "lm_head_all_positions": True})
    assert cm.step_cost(all_pos, B, B * S, 0).flops == pytest.approx(measured, rel=0.01)
    # ... and the last-position count is lower by exactly (S - 1) rows of lm_head per batch row.
    diff = cm.step_cost(all_pos, B, B * S, 0).flops - cm.step_cost(spec, B, B * S, 0).flops
    assert diff == 2 * B * (S - 1) * spec.hidden_size * spec.vocab_size


def test_chunked_prefill_on_a_cache_matches_flop_counter() -> None:
    model, spec = _hf_model("llama-gqa")
    ids = torch.randint(3, spec.vocab_size, (B, S))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = _flops(
            lambda: model(
                input_ids=ids[:, :5], past_key_values=cache, use_cache=True, logits_to_keep=1
            )
        )
    assert cm.step_cost(spec, B, B * 5, B * S).flops == pytest.approx(measured, rel=0.01)


def test_attention_as_executed_is_the_full_square_and_useful_is_the_causal_half() -> None:
    spec = ModelSpec.from_preset("llama-2-7b")
    c = cm.step_cost(spec, 1, 2048, 0)
    layers, hq = spec.n_layers, spec.n_heads * spec.head_dim
    assert c.flops_attention == 4 * layers * hq * 2048**2
    assert c.flops_attention_useful == 2 * layers * hq * 2048 * 2049
    # decode: both conventions read the whole cache plus the new token
    d = cm.step_cost(spec, 4, 4, 4 * 100)
    assert d.flops_attention == d.flops_attention_useful == 4 * layers * hq * 4 * 101


# ---------------------------------------------------------------------- reference engine

reference = pytest.importorskip("perfscope.profiler.engines.reference.model")


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_reference_engine_params_and_flops_match(preset: str) -> None:
    cfg = reference.PRESETS[preset]
    model = reference.ReferenceModel.build(cfg, seed=0)
    spec = ModelSpec.from_dict(cfg.model_spec())
    assert cm.param_count(spec) == sum(p.numel() for p in model.parameters()) == cfg.n_params()

    b, s = 3, 16
    cache = model.new_cache(b, 64)
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    measured_prefill = _flops(lambda: model.prefill(ids, cache))
    assert cm.step_cost(spec, b, b * s, 0).flops == pytest.approx(measured_prefill, rel=0.01)

    lengths = torch.full((b,), s)
    measured_decode = _flops(lambda: model.decode(ids[:, 0], cache, lengths))
    assert cm.step_cost(spec, b, b, b * s).flops == pytest.approx(measured_decode, rel=0.01)


# ---------------------------------------------------------------------- presets, full size


@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_param_counts_match_hf_models_built_on_meta(preset: str) -> None:
    conf = transformers.AutoConfig.for_model(**PRESETS[preset])
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(conf)
    assert cm.param_count(ModelSpec.from_preset(preset)) == sum(
        p.numel() for p in model.parameters()
    )


def test_known_public_param_counts() -> None:
    # Published totals of the released checkpoints.
    assert cm.param_count(ModelSpec.from_preset("gpt2")) == 124_439_808
    assert cm.param_count(ModelSpec.from_preset("llama-2-7b")) == 6_738_415_616
    assert cm.param_count(ModelSpec.from_preset("llama-3-8b")) == 8_030_261_248
    assert cm.param_count(ModelSpec.from_preset("mixtral-8x7b")) == 46_702_792_704
