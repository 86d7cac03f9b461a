"""State-space (Mamba) models: a recurrent state, constant in context, replaces the KV cache.

Configs are ``config.json`` files SAVED by the installed transformers (``save_pretrained``
into ``tmp_path``) and read back through perfscope's reader; exactness against the real
model (FLOPs, parameters, weight and state bytes) is the registry oracle's
(tests/test_costmodel_registry_oracle.py), this file pins what the oracle cannot see: how
the costs behave with context, and that the CLI says so.
"""

from __future__ import annotations

import argparse
import io
import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from torch.utils.flop_counter import FlopCounterMode

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.study import memory_need
from perfscope.analysis.whatif import predict
from perfscope.cli import roofline as _cli_roofline
from perfscope.errors import UsageError
from perfscope.hwdb import resolve_device

transformers = pytest.importorskip("transformers")


def _saved(tmp_path: Path, conf: Any) -> Path:
    folder = tmp_path / type(conf).__name__
    conf.save_pretrained(folder)
    return folder


def _mamba_130m_shape() -> Any:
    """state-spaces/mamba-130m-hf's shape (d 768, 24 layers, vocab 50280)."""
    return transformers.MambaConfig(hidden_size=768, num_hidden_layers=24, vocab_size=50280)


@pytest.mark.parametrize("reader", ["json", "transformers"])
def test_saved_mamba_config_loads_through_perfscope_reader(tmp_path: Path, reader: str) -> None:
    spec = ModelSpec.from_hf_config(_saved(tmp_path, _mamba_130m_shape()), reader=reader)
    assert spec.family == "mamba" and spec.is_ssm
    assert (spec.n_layers, spec.hidden_size, spec.vocab_size) == (24, 768, 50280)
    # I = expand · d, R = ceil(d / 16) ("auto"), N and K the defaults
    assert spec.ssm_inner_size == 1536
    assert spec.ssm_time_step_rank == math.ceil(768 / 16) == 48
    assert (spec.ssm_state_size, spec.ssm_conv_kernel) == (16, 4)
    assert spec.tied_embeddings and not spec.ssm_proj_bias and spec.ssm_conv_bias
    assert (spec.n_heads, spec.intermediate_size) == (0, 0)  # no attention, no MLP
    # mamba-130m-hf: 129,135,360 parameters (torch's count of the HF model)
    assert cm.param_count(spec) == 129_135_360


def test_saved_falcon_mamba_config_is_its_own_family(tmp_path: Path) -> None:
    conf = transformers.FalconMambaConfig(hidden_size=256, num_hidden_layers=4, vocab_size=1000)
    spec = ModelSpec.from_hf_config(_saved(tmp_path, conf))
    assert spec.family == "falcon_mamba" and spec.ssm_inner_size == 512


def test_saved_mamba2_config_reads_heads_groups_and_chunks(tmp_path: Path) -> None:
    spec = ModelSpec.from_hf_config(_saved(tmp_path, transformers.Mamba2Config()))
    assert spec.family == "mamba2" and spec.ssm_inner_size == 128 * 64 == 2 * 4096
    assert (spec.ssm_n_groups, spec.ssm_chunk_size, spec.ssm_state_size) == (8, 256, 128)
    # conv state over I + 2·G·N channels, SSM state H·P·N, per layer (bf16)
    assert spec.state_bytes_per_seq == 64 * ((8192 + 2 * 8 * 128) * 4 + 8192 * 128) * 2.0


def test_mamba_decode_bytes_do_not_grow_with_context(tmp_path: Path) -> None:
    spec = ModelSpec.from_hf_config(_saved(tmp_path, _mamba_130m_shape()))
    batch = 8
    # conv state I·K plus SSM state I·N per layer, at bf16
    state = 24 * 1536 * (4 + 16) * 2.0
    assert spec.state_bytes_per_seq == state
    short, long = cm.decode_cost(spec, batch, 128), cm.decode_cost(spec, batch, 32_768)
    assert short == long
    assert short.bytes_kv_read == short.bytes_kv_write == batch * state
    assert cm.kv_bytes_per_token(spec) == 0.0
    held = [cm.kv_cache_bytes_per_sequence(spec, t) for t in (1, 4096, 1_000_000)]
    assert held == [state] * 3
    for tokens in (128, 32_768):  # what a study's memory check and the what-if hold
        assert memory_need(spec, batch, tokens)["kv_cache_bytes"] == batch * state
        assert (
            predict(
                spec,
                resolve_device("h100-sxm5-80gb"),
                batch=batch,
                prompt_len=tokens,
                output_len=16,
            )["memory"]["kv_cache_bytes"]
            == batch * state
        )
    # a prefill has no state to read yet, and writes one per sequence
    pre = cm.prefill_cost(spec, batch, 512)
    assert (pre.bytes_kv_read, pre.bytes_kv_write) == (0.0, batch * state)


def _tiny(model_type: str) -> Any:
    """A tiny config of the family (Mamba2: 8 heads of 16 = expand 2 × hidden 64)."""
    kw: dict[str, Any] = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 211}
    if model_type == "mamba2":
        kw.update(num_heads=8, head_dim=16, n_groups=1, state_size=16, chunk_size=8)
    return transformers.CONFIG_MAPPING[model_type](**kw)


@pytest.mark.parametrize("model_type", ["mamba", "mamba2"])
def test_cached_steps_of_every_length_count_as_the_model_runs_them(
    tmp_path: Path, model_type: str
) -> None:
    """Prefill, then steps of 3, 1, 10 and 1 tokens on the state (chunked prefill and
    decode): perfscope's FLOPs equal FlopCounterMode's for each (the conv pads differently
    with and without a state; Mamba2's chunk size 8 makes 10 tokens two chunks)."""
    conf = _tiny(model_type)
    spec = replace(ModelSpec.from_hf_config(_saved(tmp_path, conf)), kv_bytes_per_element=4.0)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = (
            transformers.AutoModelForCausalLM.from_config(conf).float().eval().requires_grad_(False)
        )
    cache, ctx, rows = None, 0, 2
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for q in (9, 3, 1, 10, 1):
            ids = torch.randint(3, 200, (rows, q))
            with FlopCounterMode(display=False) as fc:
                out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            cache = out.cache
            want = int(fc.get_total_flops())
            assert cm.step_cost(spec, rows, rows * q, rows * ctx).flops == want, (q, ctx)
            ctx += q


def _run(argv: list[str]) -> str:
    parser = argparse.ArgumentParser(prog="perfscope")
    _cli_roofline.register(parser.add_subparsers())
    args = parser.parse_args(["roofline", *argv])
    buf = io.StringIO()
    assert args.handler(args, Console(file=buf, width=200)) == 0
    return buf.getvalue()


def test_roofline_names_the_family_and_a_constant_state_instead_of_kv(tmp_path: Path) -> None:
    folder = _saved(tmp_path, _mamba_130m_shape())
    out = _run(["--model", str(folder), "--hw", "h100-sxm5-80gb", "--tp", "2"])
    assert "family: mamba" in out
    assert "recurrent state, constant in context" in out
    assert "bf16 state)" in out and "no KV cache" in out
    assert "KV cache" not in out.replace("no KV cache", "")  # no KV column or line
    assert "1 per block" in out  # one all-reduce per Mamba block under TP


def test_roofline_refuses_attention_widths_for_a_mamba_model(tmp_path: Path) -> None:
    folder = _saved(tmp_path, _mamba_130m_shape())
    with pytest.raises(UsageError, match=r"state-space .*--heads"):
        _run(["--model", str(folder), "--heads", "8"])
