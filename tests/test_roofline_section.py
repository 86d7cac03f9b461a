"""Roofline per phase and verdicts, from step records and from the request timeline."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pandas as pd
import pytest
import torch
from rich.console import Console

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.roofline import roofline_section
from perfscope.analysis.summary import EnergyPhase, Roofline
from perfscope.dashboard.terminal import roofline_table
from perfscope.hwdb.spec import DeviceSpec

A100 = DeviceSpec(
    key="a100-sxm4-80gb",
    name="NVIDIA A100 SXM4 80GB",
    vendor="nvidia",
    kind="gpu",
    peak_flops={"fp32": 19.5e12, "bf16": 312e12, "fp16": 312e12},
    mem_bw_bytes_s=2039e9,
    mem_bytes=80e9,
    cache_bytes=40e6,
)
SPEC = ModelSpec.from_preset("llama-3-8b")


def _steps(rows: list[tuple[str, int, int, int, float]]) -> pd.DataFrame:
    """(kind, batch, new, context, seconds) → a STEP_SCHEMA frame, back to back."""
    out, t = [], 0
    for i, (kind, b, n, c, secs) in enumerate(rows):
        dur = round(secs * 1e9)
        out.append(
            {
                "step_id": i,
                "kind": kind,
                "t_start": t,
                "t_end": t + dur,
                "batch_size": b,
                "new_tokens": n,
                "context_tokens": c,
                "request_ids": list(range(b)),
            }
        )
        t += dur + 1000
    return pd.DataFrame(out)


def _sol(spec: ModelSpec, dev: DeviceSpec, b: int, n: int, c: int) -> float:
    s = cm.step_cost(spec, b, n, c)
    return max(s.flops / dev.peak_flops["bf16"], s.bytes / dev.mem_bw_bytes_s)


def test_decode_at_half_speed_of_light_is_memory_bound_with_numbers() -> None:
    sol_p = _sol(SPEC, A100, 4, 4 * 512, 0)
    rows = [("prefill", 4, 4 * 512, 0, sol_p / 0.6)]
    rows += [
        ("decode", 4, 4, 4 * (512 + i), _sol(SPEC, A100, 4, 4, 4 * (512 + i)) / 0.5)
        for i in range(64)
    ]
    r = roofline_section(_steps(rows), None, None, SPEC, A100)
    json.dumps(r.to_dict(), allow_nan=False)  # its JSON form is JSON
    assert r["available"]
    assert r["source"] == "steps"
    assert not r["estimated"]
    dec, pre = r["phases"]["decode"], r["phases"]["prefill"]
    assert dec["verdict"] == "memory-bound"
    assert dec["efficiency"] == pytest.approx(0.5, rel=1e-3)
    assert dec["mbu"] == pytest.approx(0.5, rel=1e-3)
    assert dec["mfu"] == pytest.approx(dec["flops"] / (dec["time_s"] * 312e12))
    assert dec["intensity"] < dec["ridge_point"] == pytest.approx(312e12 / 2039e9)
    assert dec["batch_size_mean"] == 4
    assert dec["steps"] == 64
    assert "memory-bound" in dec["evidence"]
    assert "MBU 50%" in dec["evidence"]
    assert "ridge 153 FLOP/B" in dec["evidence"]
    assert pre["verdict"] == "compute-bound"
    assert pre["mfu"] == pytest.approx(0.6, rel=1e-3)
    assert pre["flops_useful"] < pre["flops"]
    assert pre["ceilings"]["source"] == "datasheet"
    assert pre["ceilings"]["peak_flops"] == 312e12


def test_both_utilisations_low_is_overhead_bound_and_threshold_is_configurable() -> None:
    rows = [("decode", 1, 1, 100 + i, _sol(SPEC, A100, 1, 1, 100 + i) / 0.05) for i in range(10)]
    r = roofline_section(_steps(rows), None, None, SPEC, A100)
    dec = r["phases"]["decode"]
    assert dec["verdict"] == "overhead-bound"
    assert dec["roof"] == "memory"
    assert "below 20%" in dec["evidence"]
    r2 = roofline_section(_steps(rows), None, None, SPEC, A100, overhead_threshold=0.01)
    assert r2["phases"]["decode"]["verdict"] == "memory-bound"


def test_working_set_in_cache_uses_the_cache_ceiling_instead_of_dram_mbu_above_100() -> None:
    tiny = ModelSpec(
        name="tiny", n_layers=2, hidden_size=128, n_heads=4, n_kv_heads=2, head_dim=32,
        intermediate_size=352, vocab_size=1024, weight_dtype="fp32", weight_bytes_per_param=4,
        act_dtype="fp32", act_bytes_per_element=4, kv_dtype="fp32", kv_bytes_per_element=4,
    )  # fmt: skip
    cpu = DeviceSpec(
        key="cpu", name="test CPU", vendor="amd", kind="cpu", peak_flops={"fp32": 100e9},
        mem_bw_bytes_s=10e9, cache_bytes=32e6, cache_bw_bytes_s=100e9, source="calibrated",
    )  # fmt: skip
    step = cm.step_cost(tiny, 1, 1, 64)
    t = step.bytes / 40e9  # 4x faster than DRAM allows, 40% of the cache ceiling
    r = roofline_section(_steps([("decode", 1, 1, 64, t)] * 5), None, None, tiny, cpu)
    dec = r["phases"]["decode"]
    assert dec["fits_in_cache"]
    assert dec["memory_level"] == "cache"
    assert dec["mbu"] == pytest.approx(0.4, rel=1e-3)
    assert dec["mbu_dram"] == pytest.approx(4.0, rel=1e-3)
    assert dec["verdict"] == "memory-bound"
    assert "fits in the" in dec["evidence"]
    assert dec["ceilings"]["source"] == "calibrated"


def test_warmup_steps_are_left_out_and_energy_passes_through() -> None:
    rows = [("decode", 1, 1, 10, 0.01), ("decode", 1, 1, 10, 0.01)]
    steps = _steps(rows)
    steps["request_ids"] = pd.Series([[7], [8]])
    requests = pd.DataFrame(
        {
            "request_id": [7, 8],
            "prompt_tokens": [10, 10],
            "is_warmup": [True, False],
            "t_sent": [None, None],
            "t_first_token": [None, None],
            "t_last_token": [None, None],
            "output_tokens": [0, 0],
            "error": [None, None],
        }
    )
    energy = {
        "decode": EnergyPhase(
            energy_j=12.5, time_s=0.01, steps=1, tokens=1, j_per_token=12.5, avg_power_w=1250.0
        )
    }
    r = roofline_section(steps, requests, None, SPEC, A100, energy=energy)
    assert r["phases"]["decode"]["steps"] == 1
    assert r["phases"]["decode"]["energy"] == {
        "energy_j": 12.5,
        "time_s": 0.01,
        "steps": 1,
        "tokens": 1,
        "j_per_token": 12.5,
        "avg_power_w": 1250.0,
    }


def test_missing_model_or_device_says_why() -> None:
    steps = _steps([("decode", 1, 1, 10, 0.01)])
    assert "model" in roofline_section(steps, None, None, None, A100)["reason"]
    r = roofline_section(steps, None, None, SPEC, None)
    assert not r["available"]
    assert "--hw" in r["reason"]
    assert "not available" in _render(r)


def _requests(n: int, prompt: int, out: int, t_first_s: float, tpot_s: float) -> pd.DataFrame:
    """n identical requests sent at 0, decoding together."""
    ns = 1e9
    return pd.DataFrame(
        {
            "request_id": np.arange(n),
            "prompt_tokens": [prompt] * n,
            "max_output_tokens": [out] * n,
            "t_scheduled": [0] * n,
            "t_sent": [0] * n,
            "t_first_token": [round(t_first_s * ns)] * n,
            "t_last_token": [round((t_first_s + (out - 1) * tpot_s) * ns)] * n,
            "output_tokens": [out] * n,
            "error": [None] * n,
            "is_warmup": [False] * n,
        }
    )


def test_http_run_without_steps_is_estimated_from_the_timeline() -> None:
    req = _requests(4, 100, 11, t_first_s=0.05, tpot_s=0.02)
    r = roofline_section(pd.DataFrame(), req, None, SPEC, A100)
    assert r["source"] == "timeline"
    assert r["estimated"]
    dec, pre = r["phases"]["decode"], r["phases"]["prefill"]
    assert dec["estimated"]
    assert pre["estimated"]
    assert "estimated from the request timeline" in dec["evidence"]
    # four requests decoding together for 10 steps of 20 ms
    assert dec["batch_size_mean"] == pytest.approx(4)
    assert dec["steps"] == 10
    assert dec["time_s"] == pytest.approx(0.2)
    exact = cm.generation_cost(SPEC, 4, 100, 11).decode
    assert dec["flops"] == pytest.approx(exact.flops, rel=1e-9)
    assert dec["bytes"] == pytest.approx(exact.bytes, rel=1e-9)
    # prefill: each prompt once, bounded by the TTFT window
    assert pre["flops"] == pytest.approx(4 * cm.prefill_cost(SPEC, 1, 100).flops)
    assert pre["time_s"] == pytest.approx(0.05)


def test_real_reference_engine_steps_give_consistent_roofline() -> None:
    ref = pytest.importorskip("perfscope.profiler.engines.reference.model")
    cfg = ref.PRESETS["tiny"]
    model = ref.ReferenceModel.build(cfg, seed=0)
    spec = ModelSpec.from_dict(cfg.model_spec())
    b, s = 4, 32
    cache = model.new_cache(b, 64)
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    rows = []
    t0 = time.perf_counter()
    model.prefill(ids, cache)
    rows.append(("prefill", b, b * s, 0, time.perf_counter() - t0))
    for i in range(8):
        t0 = time.perf_counter()
        model.decode(ids[:, 0], cache, torch.full((b,), s + i))
        rows.append(("decode", b, b, b * (s + i), time.perf_counter() - t0))
    cpu = DeviceSpec(
        key="cpu", name="test CPU", vendor="amd", kind="cpu", peak_flops={"fp32": 50e9},
        mem_bw_bytes_s=10e9, source="calibrated",
    )  # fmt: skip
    r = roofline_section(_steps(rows), None, None, spec, cpu)
    for phase in ("prefill", "decode"):
        p = r["phases"][phase]
        assert p["verdict"] in ("compute-bound", "memory-bound", "overhead-bound")
        assert p["mfu"] == pytest.approx(p["achieved_flops_s"] / 50e9)
        assert p["mbu"] == pytest.approx(p["achieved_bytes_s"] / 10e9)
        assert p["efficiency"] == pytest.approx(p["sol_time_s"] / p["time_s"])
        assert f"{p['intensity']:.3g} FLOP/B" in p["evidence"]
    assert r["phases"]["prefill"]["intensity"] > r["phases"]["decode"]["intensity"]


def _render(r: Roofline) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200).print(roofline_table(r))
    return buf.getvalue()


def test_rich_table_shows_verdicts_ceilings_and_evidence() -> None:
    rows = [("prefill", 1, 512, 0, 0.05), ("decode", 1, 1, 512, 0.02)]
    text = _render(roofline_section(_steps(rows), None, None, SPEC, A100))
    assert "prefill" in text
    assert "decode" in text
    assert "ceilings (datasheet)" in text
    assert "312 TFLOP/s bf16" in text
    assert "MBU" in text
    assert "bound" in text
