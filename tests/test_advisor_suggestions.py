"""Advisor suggestions and what-if projections, computed from the cost model."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis import costmodel as cm
from perfscope.analysis.advisor import advise
from perfscope.analysis.costmodel import step_costs
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.roofline import phase_roofline, roofline_section
from perfscope.analysis.summary import Advice, Gain
from perfscope.analysis.whatif import predict, predict_derated, project_run, run_derating
from perfscope.hwdb import lookup
from perfscope.hwdb.spec import DeviceSpec


def _gpu(key: str, bf16: float, bw: float, mem: float) -> DeviceSpec:
    return DeviceSpec(
        key=key,
        name=key.upper(),
        vendor="nvidia",
        kind="gpu",
        peak_flops={"bf16": bf16, "fp16": bf16, "fp8": 2 * bf16, "int8": 2 * bf16},
        mem_bw_bytes_s=bw,
        mem_bytes=mem,
        cache_bytes=40e6,
    )


A100 = _gpu("a100-sxm4-80gb", 312e12, 2039e9, 80e9)
H100 = _gpu("h100-sxm5-80gb", 989e12, 3350e9, 80e9)
L4 = _gpu("l4", 121e12, 300e9, 24e9)


def _run(
    spec: ModelSpec,
    dev: DeviceSpec,
    *,
    batch: int,
    prompt: int,
    out: int,
    eff_prefill: float,
    eff_decode: float,
    stall_prefills: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Steps and requests of a static batch that ran at the given efficiencies."""
    rows, t, ns = [], 0, 1e9
    pre = cm.prefill_cost(spec, batch, prompt)
    dur = max(pre.flops / dev.peak_flops["bf16"], pre.bytes / dev.mem_bw_bytes_s) / eff_prefill
    rows.append(("prefill", batch, batch * prompt, 0, t, t + round(dur * ns)))
    t += round(dur * ns)
    t_first = t
    for i in range(out - 1):
        c = cm.decode_cost(spec, batch, prompt + i)
        d = max(c.flops / dev.peak_flops["bf16"], c.bytes / dev.mem_bw_bytes_s) / eff_decode
        rows.append(("decode", batch, batch, batch * (prompt + i), t, t + round(d * ns)))
        t += round(d * ns)
        if stall_prefills and i % 8 == 0:
            # another request's prefill runs while this batch decodes
            rows.append(("prefill", 1, prompt, 0, t, t + round(dur * ns)))
            t += round(dur * ns)
    steps = pd.DataFrame(
        [
            {
                "step_id": i,
                "kind": k,
                "t_start": a,
                "t_end": b,
                "batch_size": bs,
                "new_tokens": n,
                "context_tokens": c,
                "request_ids": list(range(bs)),
            }
            for i, (k, bs, n, c, a, b) in enumerate(rows)
        ]
    )
    requests = pd.DataFrame(
        {
            "request_id": range(batch),
            "prompt_tokens": [prompt] * batch,
            "max_output_tokens": [out] * batch,
            "t_scheduled": [0] * batch,
            "t_sent": [0] * batch,
            "t_first_token": [t_first] * batch,
            "t_last_token": [t] * batch,
            "output_tokens": [out] * batch,
            "error": [None] * batch,
            "is_warmup": [False] * batch,
        }
    )
    roof = roofline_section(steps, requests, None, spec, dev)
    workload = {
        "prompt_tokens_mean": prompt,
        "output_tokens_mean": out,
        "batch_size": batch,
        "requests": batch,
    }
    return roof, workload


def _by_technique(advice: list[Advice]) -> dict[str, Advice]:
    return {a.technique: a for a in advice}


def test_small_batch_memory_bound_decode_gets_batching_quantisation_and_speculation() -> None:
    spec = ModelSpec.from_preset("llama-2-7b")
    roof, wl = _run(spec, A100, batch=1, prompt=512, out=64, eff_prefill=0.6, eff_decode=0.6)
    assert roof["phases"]["decode"]["verdict"] == "memory-bound"
    advice = advise(roof, spec, A100, wl)
    got = _by_technique(advice)
    assert [a.rank for a in advice] == list(range(1, len(advice) + 1))
    gains = [a.projected_gain.value for a in advice if a.projected_gain.unit.startswith("x")]
    assert gains == sorted(gains, reverse=True)
    for a in advice:  # no suggestion without a number
        assert a.projected_gain.value > 1
        assert a.why
        assert a.assumptions
    batching = got["larger batches / continuous batching"]
    assert batching.projected_gain.unit == "x decode throughput"
    # at batch ~153 (A100 ridge knee) throughput grows by two orders of magnitude
    assert batching.projected_gain.value > 20
    int8 = got["int8 weights (W8A16)"]
    assert int8.projected_gain.value == pytest.approx(1.9, abs=0.1)
    int4 = got["int4 weights (W4A16, GPTQ/AWQ, group 128)"]
    assert int4.projected_gain.value == pytest.approx(3.5, abs=0.3)
    spec_dec = got["speculative decoding"]
    assert 1.5 < spec_dec.projected_gain.value < 3.0
    assert "tensor parallelism" not in got  # 13.5 GB is < 25% of 72 GB usable


def test_kv_dominated_decode_suggests_fp8_kv_and_gqa() -> None:
    spec = ModelSpec.from_preset("llama-2-7b")  # MHA: 512 KiB of KV per token
    roof, wl = _run(spec, A100, batch=32, prompt=2048, out=32, eff_prefill=0.6, eff_decode=0.6)
    dec = roof["phases"]["decode"]
    assert (dec["bytes_kv_read"] / dec["bytes"]) > 0.5
    got = _by_technique(advise(roof, spec, A100, wl))
    fp8 = got["fp8 KV cache"]
    assert 1.3 < fp8.projected_gain.value < 2.0
    gqa = got["GQA/MQA (a model with fewer KV heads)"]
    assert gqa.projected_gain.value > fp8.projected_gain.value


def test_model_that_does_not_fit_needs_tensor_parallelism_first() -> None:
    spec = ModelSpec.from_preset("llama-2-70b")  # 138 GB in fp16
    roof, wl = _run(spec, A100, batch=1, prompt=128, out=16, eff_prefill=0.5, eff_decode=0.5)
    advice = advise(roof, spec, A100, wl)
    first = advice[0]
    assert first.technique == "tensor parallelism"
    # a count, not a range: no low, high or bound
    assert first.projected_gain == Gain(value=2.0, unit="devices needed to fit", metric="devices")


def test_prefill_stalling_decode_suggests_disaggregation() -> None:
    spec = ModelSpec.from_preset("llama-3-8b")
    roof, wl = _run(
        spec,
        A100,
        batch=8,
        prompt=2048,
        out=64,
        eff_prefill=0.6,
        eff_decode=0.6,
        stall_prefills=True,
    )
    share = roof["latency"]["decode_stall_share"]
    assert share > 0.1
    got = _by_technique(advise(roof, spec, A100, wl))
    dis = got["prefill/decode disaggregation (or chunked prefill)"]
    assert dis.projected_gain.value == pytest.approx(1 / (1 - share), rel=1e-3)


def test_overhead_bound_decode_suggests_cutting_overhead_and_keeps_overhead_fixed() -> None:
    spec = ModelSpec.from_preset("llama-3-8b")
    roof, wl = _run(spec, A100, batch=1, prompt=256, out=32, eff_prefill=0.5, eff_decode=0.05)
    dec = roof["phases"]["decode"]
    assert dec["verdict"] == "overhead-bound"
    derate = run_derating(roof)
    per_step = dec["time_s"] / dec["steps"]
    assert derate.decode_overhead_s == pytest.approx(per_step - dec["sol_time_s"] / dec["steps"])
    got = _by_technique(advise(roof, spec, A100, wl))
    cut = got["cut decode per-step overhead (CUDA graphs, torch.compile, fused kernels)"]
    # a range: eager (20% of speed of light) to compiled engines (60%), never beyond 1/eff
    gain = cut.projected_gain
    assert gain.value == pytest.approx(0.6 / dec["efficiency"], rel=1e-3)
    assert gain.low == pytest.approx(0.2 / dec["efficiency"], rel=1e-3)
    assert gain.bound == pytest.approx(1 / dec["efficiency"], rel=1e-3)
    # quantising an overhead-bound decode gains < 5%: the fixed overhead stays, so no advice
    assert "int8 weights (W8A16)" not in got
    kw: dict[str, Any] = {"batch": 1, "prompt_len": 256, "output_len": 32}
    derate_int4 = predict_derated(spec.with_dtypes(weight_dtype="int4"), A100, derate, **kw)
    base = predict_derated(spec, A100, derate, **kw)
    assert base.tpot_s / derate_int4.tpot_s < 1.05


def test_predict_llama2_7b_on_a100_is_sensible_at_speed_of_light() -> None:
    spec = ModelSpec.from_preset("llama-2-7b")
    p = predict(spec, A100, batch=1, prompt_len=512, output_len=128)
    assert p["speed_of_light"]
    assert any("speed of light" in n for n in p["notes"])
    # weights 13.5 GB / 2039 GB/s ≈ 6.6 ms per token; 512-token prefill ≈ 6.8 TFLOP / 312 TF/s
    assert p["tpot_s"] == pytest.approx(6.63e-3, rel=0.02)
    assert p["ttft_s"] == pytest.approx(21.7e-3, rel=0.02)
    assert p["prefill"]["bound"] == "compute-bound"
    assert p["decode"]["bound"] == "memory-bound"
    assert p["memory"]["kv_cache_bytes"] == 640 * 524288
    assert p["memory"]["fits"]
    usable = 0.9 * 80e9 - cm.weight_bytes(spec)
    assert p["max_batch"] == int(usable // (640 * 524288))
    derated = predict(spec, A100, batch=1, prompt_len=512, output_len=128, efficiency=0.5)
    assert derated["tpot_s"] == pytest.approx(2 * p["tpot_s"])
    assert not derated["speed_of_light"]


def test_predict_tensor_parallel_and_cached_prefix() -> None:
    spec = ModelSpec.from_preset("llama-2-70b")
    one = predict(spec, A100, batch=1, prompt_len=1024, output_len=64)
    assert one["memory"]["fits"] is False
    two = predict(spec, A100, batch=1, prompt_len=1024, output_len=64, tp=2)
    assert two["memory"]["weights_bytes"] == pytest.approx(one["memory"]["weights_bytes"] / 2)
    # 8 KV heads split over 2 devices: half the cache each
    assert two["memory"]["kv_cache_bytes"] == pytest.approx(one["memory"]["kv_cache_bytes"] / 2)
    assert two["tpot_s"] == pytest.approx(one["tpot_s"] / 2, rel=0.02)
    cached = predict(
        spec, A100, batch=1, prompt_len=1024, output_len=64, tp=2, cached_prefix_len=768
    )
    assert cached["ttft_s"] < two["ttft_s"] / 3


def test_project_run_uses_the_run_efficiency_only_on_its_own_device_class() -> None:
    spec = ModelSpec.from_preset("llama-3-8b")
    roof, wl = _run(spec, A100, batch=4, prompt=512, out=64, eff_prefill=0.6, eff_decode=0.5)
    proj = project_run(roof, spec, wl, [A100, H100, L4], measured_on=A100.key)
    assert [p["device"]["key"] for p in proj] == ["a100-sxm4-80gb", "h100-sxm5-80gb", "l4"]
    on_a100 = proj[0]
    assert on_a100["assumption"] == "measured"
    assert on_a100["efficiency"]["decode"] == pytest.approx(0.5, rel=1e-3)
    # projecting the run back onto its own device reproduces its TPOT
    assert on_a100["tpot_s"] == pytest.approx(roof["latency"]["tpot_mean_s"], rel=0.02)
    # another device: its own speed of light at the documented engine range, not 50%
    h100 = proj[1]
    assert h100["assumption"] == "engine range"
    sol = h100["range"]["speed_of_light"]["tpot_s"]
    assert h100["range"]["compiled"]["tpot_s"] == pytest.approx(sol / 0.6, rel=1e-3)
    assert h100["range"]["eager"]["tpot_s"] == pytest.approx(sol / 0.2, rel=1e-3)
    assert "compiled" in h100["basis"] and "eager" in h100["basis"]
    assert not proj[2]["speed_of_light"]


def test_predict_counts_the_kv_cache_a_sequence_really_holds() -> None:
    """Sliding-window layers hold at most their window, and no sequence holds more than
    the model's context: memory, fit and the largest batch use that, not tokens x bytes."""
    gemma = ModelSpec.from_preset("gemma-2-9b")  # half its layers slide over 4096 tokens
    long = predict(gemma, A100, batch=4, prompt_len=7000, output_len=1000)
    per_seq = cm.kv_cache_bytes_per_sequence(gemma, 8000)
    assert per_seq < 8000 * cm.kv_bytes_per_token(gemma)  # the window caps half the layers
    assert long["memory"]["kv_cache_bytes"] == pytest.approx(4 * per_seq)
    cap = 0.9 * 80e9  # this hand-built A100 states no usable capacity: the datasheet's
    assert long["max_batch"] == int((cap - cm.weight_bytes(gemma)) // per_seq)

    llama = ModelSpec.from_preset("llama-2-7b")  # 4096-token context
    over = predict(llama, A100, batch=2, prompt_len=4000, output_len=1000)
    at_context = cm.kv_cache_bytes_per_sequence(llama, 4096)
    assert over["memory"]["kv_cache_bytes"] == pytest.approx(2 * at_context)
    assert over["memory"]["kv_tokens_per_sequence"] == 4096
    assert any("KV cache counted at the context" in n for n in over["notes"])


def test_predict_measures_capacity_against_what_the_driver_exposes() -> None:
    """An "80 GB" H100 exposes 81559 MiB (85.5 GB): the fit and the largest batch use it."""
    h100 = lookup("h100-sxm5-80gb")
    assert h100.mem_usable_bytes == 81559 * 2**20
    spec = ModelSpec.from_preset("llama-3-8b")
    p = predict(spec, h100, batch=1, prompt_len=1024, output_len=1024)
    assert p["memory"]["capacity_bytes"] == pytest.approx(0.9 * 81559 * 2**20)
    per_seq = cm.kv_cache_bytes_per_sequence(spec, 2048)
    assert p["max_batch"] == int((0.9 * 81559 * 2**20 - cm.weight_bytes(spec)) // per_seq)
    assert p["max_batch"] > int((0.9 * 80e9 - cm.weight_bytes(spec)) // per_seq)
    assert any("usable capacity" in n for n in p["notes"])


def test_the_roofline_working_set_holds_each_sequence_within_its_window() -> None:
    """A sliding-window model's cached tokens, split over the step's rows, hold less KV than
    tokens x the all-layer per-token size; the working set (cache or DRAM) uses that."""
    gemma = ModelSpec.from_preset("gemma-2-9b")
    b, ctx = 8, 8000
    arrays = step_costs(gemma, np.array([b]), np.array([b]), np.array([b * ctx]))
    costs = {k: float(v.sum()) for k, v in arrays.items()}
    kw: dict[str, Any] = {
        "model": gemma,
        "device": A100,
        "costs": costs,
        "time_s": 0.1,
        "steps": 1,
        "tokens": b,
        "batch_size_mean": b,
        "context_tokens_mean": ctx,
        "max_context_tokens": b * (ctx + 1),
    }
    held = phase_roofline("decode", **kw, max_context_rows=b)
    unknown = phase_roofline("decode", **kw)
    expect = cm.weight_bytes(gemma) + b * cm.kv_cache_bytes_per_sequence(gemma, ctx + 1)
    assert held["working_set_bytes"] == pytest.approx(expect)
    assert unknown["working_set_bytes"] > held["working_set_bytes"]


def test_a_far_from_the_roof_phase_states_its_bound_without_exponent_notation() -> None:
    """At 0.01% of speed of light the bound is 10,000x: written as a number, not 1e+04x."""
    spec = ModelSpec.from_preset("llama-3-8b")
    roof, wl = _run(spec, A100, batch=1, prompt=256, out=32, eff_prefill=0.5, eff_decode=1e-4)
    got = _by_technique(advise(roof, spec, A100, wl))
    cut = got["cut decode per-step overhead (CUDA graphs, torch.compile, fused kernels)"]
    assert cut.projected_gain.bound > 1000
    assert "e+" not in cut.assumptions
    assert re.search(r"never beyond speed of light \(\d{1,3}(,\d{3})+x\)", cut.assumptions)
