"""Hybrid decoders: blocks that mix attention with Mamba, Mamba2 or short-conv mixers.

The registry oracle (tests/test_costmodel_registry_oracle.py) proves one prefill and one
decode step of each hybrid family exact. This file pins what it does not see, on configs
SAVED by the installed transformers: that both config readers agree, that FLOPs stay exact
over cached steps of every length, that the cache the model really holds after each step is
the KV of the attention blocks plus a state that does not grow, a full-size Jamba's
parameters, and what ``perfscope roofline`` says about the mix.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import ModelSpec
from perfscope.errors import UsageError

transformers = pytest.importorskip("transformers")

from tests.test_costmodel_registry_oracle import _kv_bytes, tiny_config  # noqa: E402
from tests.test_costmodel_ssm import _run  # noqa: E402  (perfscope roofline, captured)

HYBRIDS = [
    "bailing_hybrid",
    "bamba",
    "falcon_h1",
    "granitemoehybrid",
    "jamba",
    "kimi_linear",
    "lfm2",
    "lfm2_moe",
    "lfm3",
    "minimax",
    "nemotron_h",
    "olmo_hybrid",
    "qwen3_next",
    "zamba2",
]


def _saved(tmp_path: Path, conf: Any) -> Path:
    folder = tmp_path / conf.model_type
    conf.save_pretrained(folder)
    return folder


def _jamba_v01() -> Any:
    """ai21labs/Jamba-v0.1's shape: 32 blocks, attention in every 8th (offset 4), a MoE of
    16 experts (top 2) in every other block, Mamba d_state 16, conv 4, expand 2."""
    return transformers.JambaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=65536,
        num_experts=16,
        num_experts_per_tok=2,
        mamba_dt_rank=256,
    )


@pytest.mark.parametrize("model_type", HYBRIDS)
def test_saved_hybrid_configs_read_the_same_through_both_readers(
    tmp_path: Path, model_type: str
) -> None:
    folder = _saved(tmp_path, tiny_config(model_type))
    via_class = ModelSpec.from_hf_config(folder, reader="transformers")
    via_json = ModelSpec.from_hf_config(folder, reader="json")
    assert replace(via_class, notes=()) == replace(via_json, notes=())
    assert via_class.family == model_type and via_class.n_attention_layers > 0
    assert set(via_class.mixers()) - {"attention", "none"}  # a recurrent mixer beside it


@pytest.mark.parametrize(
    "model_type",
    [
        "bailing_hybrid",
        "bamba",
        "falcon_h1",
        "jamba",
        "kimi_linear",
        "lfm2",
        "lfm3",
        "minimax",
        "nemotron_h",
        "qwen3_next",
        "zamba2",
    ],
)
def test_cached_steps_count_as_the_hybrid_runs_them_and_only_attention_grows(
    tmp_path: Path, model_type: str
) -> None:
    """Prefill 9 tokens, then steps of 3, 1, 70 and 1 on the cache (chunked prefill and
    decode; 70 tokens are 9 Mamba2 chunks of 8 and 2 gated-DeltaNet chunks of 64): each
    step's FLOPs equal FlopCounterMode's, and after each the cache tensors
    hold the attention blocks' K/V of every token so far plus a recurrent state of the same
    size every time."""
    conf = tiny_config(model_type)
    saved = ModelSpec.from_hf_config(_saved(tmp_path, conf))
    # transformers expands an MLA latent in decode too (the oracle's convention)
    spec = replace(saved, kv_bytes_per_element=4.0, mla_absorbed=False)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(
            conf, attn_implementation="eager", experts_implementation="eager"
        )
    model = model.float().eval().requires_grad_(False)
    cache, ctx, rows = None, 0, 2
    kv_token = cm.kv_bytes_per_token(spec)  # the attention blocks' (MLA: the latent's)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for q in (9, 3, 1, 70, 1):
            ids = torch.randint(3, 200, (rows, q))
            with FlopCounterMode(display=False) as fc:
                out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            assert cm.step_cost(spec, rows, rows * q, rows * ctx).flops == fc.get_total_flops()
            ctx += q
            held = _kv_bytes(cache)
            # what the next decode step reads: all of it (a sliding layer keeps window - 1)
            assert held == cm.decode_cost(spec, rows, ctx).bytes_kv_read, (q, ctx)
            if not spec.layer_windows:  # every attention block keeps every token
                assert held - rows * ctx * kv_token == rows * spec.state_bytes_per_seq


def test_full_size_jamba_parameters_match_the_model_and_its_state_does_not_grow() -> None:
    conf = _jamba_v01()
    spec = ModelSpec.from_hf_config(conf.to_dict())
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(conf)
    assert cm.param_count(spec) == sum(p.numel() for p in model.parameters())
    assert spec.mixers().count("attention") == 4 and sum(spec.moe_layer_mask()) == 16
    # decode at 128 and 32,768 tokens of context: only the 4 attention blocks' KV grows
    short, long = cm.decode_cost(spec, 8, 128), cm.decode_cost(spec, 8, 32768)
    kv_token = 4 * 2 * 8 * 128 * 2.0  # attention blocks × K,V × heads × width × bf16
    assert long.bytes_kv_read - short.bytes_kv_read == 8 * (32768 - 128) * kv_token
    assert long.bytes_kv_write == short.bytes_kv_write == 8 * (kv_token + spec.state_bytes_per_seq)
    # 28 Mamba blocks × (conv 8192×4 + SSM 8192×16) at bf16, per sequence
    assert spec.state_bytes_per_seq == 28 * (8192 * 4 + 8192 * 16) * 2.0


def test_roofline_names_the_layer_mix_and_the_state(tmp_path: Path) -> None:
    folder = _saved(tmp_path, _jamba_v01())
    out = _run(["--model", str(folder), "--hw", "h100-sxm5-80gb", "--tp", "2"])
    assert "family: jamba" in out
    assert "layer mix: 28 Mamba, 4 attention of 32 blocks" in out
    assert "KV cache in the 4 attention block(s) only" in out
    assert "recurrent state, constant in context" in out
    assert "MoE: 16 experts, top-2" in out
    assert "65 ring all-reduces" in out and "2 per block" in out


def test_roofline_refuses_widths_for_a_hybrid_but_keeps_its_pattern_over_layers(
    tmp_path: Path,
) -> None:
    folder = _saved(tmp_path, _jamba_v01())
    with pytest.raises(UsageError, match=r"hybrid \(jamba\) model: --hidden-size do not apply"):
        _run(["--model", str(folder), "--hw", "h100-sxm5-80gb", "--hidden-size", "2048"])
    out = _run(["--model", str(folder), "--hw", "h100-sxm5-80gb", "--layers", "16"])
    assert "layer mix: 14 Mamba, 2 attention of 16 blocks" in out


def test_full_size_qwen3_next_parameters_match_the_model_and_name_the_deltanet_state() -> None:
    """transformers' Qwen3NextConfig defaults are Qwen3-Next-80B-A3B's shape: 48 blocks,
    a full attention every 4th, 512 experts (top 10) with a gated shared expert."""
    conf = transformers.Qwen3NextConfig()
    spec = ModelSpec.from_hf_config(conf.to_dict())
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(conf)
    assert cm.param_count(spec) == sum(p.numel() for p in model.parameters())
    assert spec.mixers().count("linear") == 36 and spec.n_attention_layers == 12
    # 36 DeltaNet blocks × (conv 8192×4 + state 32 heads × 128 × 128) at bf16
    assert spec.state_bytes_per_seq == 36 * (8192 * 4 + 32 * 128 * 128) * 2.0
    said = "\n".join(cm.model_assumptions(spec))
    assert "36 gated-DeltaNet, 12 attention of 48 blocks" in said
    assert "triangular solves count 0" in said


def test_a_runs_model_spec_names_the_family_and_its_assumptions(tmp_path: Path) -> None:
    """``--model-spec PATH`` (an HTTP or python engine's model) stores the family and every
    assumption with the shape, as ``perfscope roofline --model`` prints them."""
    from perfscope.api.run import RunArgs, _model_spec

    folder = _saved(tmp_path, _jamba_v01())
    stored = _model_spec(RunArgs(model_spec=str(folder), cli=True))
    assert stored is not None and stored["source"] == f"--model-spec {folder}"
    said = stored["assumptions"]
    assert said[0] == "family: jamba"
    assert any(s.startswith("layer mix: 28 Mamba, 4 attention of 32 blocks") for s in said)
    assert any("recurrent state, constant in context" in s for s in said)
    assert (
        ModelSpec.from_dict(dict(stored)).layer_mixers
        == ModelSpec.from_hf_config(folder).layer_mixers
    )
