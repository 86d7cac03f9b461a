"""Published validation cases (hardware.md §7), reproduced where their conventions are stated."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.roofline import phase_roofline
from perfscope.analysis.whatif import predict
from perfscope.hwdb.spec import DeviceSpec

GiB = 2**30


def _device(peak_bf16: float, bw: float, key: str = "dev", mem: float | None = 80e9) -> DeviceSpec:
    return DeviceSpec(
        key=key,
        name=key,
        vendor="test",
        kind="gpu",
        peak_flops={"bf16": peak_bf16, "fp16": peak_bf16},
        mem_bw_bytes_s=bw,
        mem_bytes=mem,
    )


def _costs(flops: float = 0.0, nbytes: float = 0.0) -> dict[str, float]:
    return {
        "flops": flops,
        "flops_useful": flops,
        "flops_attention": 0.0,
        "bytes": nbytes,
        "bytes_weights": nbytes,
        "bytes_kv_read": 0.0,
        "bytes_kv_write": 0.0,
        "bytes_activations": 0.0,
    }


def _phase(
    model: ModelSpec, dev: DeviceSpec, flops: float, nbytes: float, time_s: float
) -> dict[str, Any]:
    return phase_roofline(
        "decode",
        model=model,
        device=dev,
        costs=_costs(flops, nbytes),
        time_s=time_s,
        steps=1,
        tokens=1,
        batch_size_mean=1,
        context_tokens_mean=0,
        max_context_tokens=0,
    )


LLAMA_7B_LLM_ANALYSIS = ModelSpec(
    # decapoda LLaMA-7B as llm-analysis reads it: ungated 16384 MLP, shared embedding,
    # logits for every position.
    name="llama-7b-llm-analysis",
    n_layers=32,
    hidden_size=4096,
    n_heads=32,
    n_kv_heads=32,
    head_dim=128,
    intermediate_size=16384,
    vocab_size=32000,
    mlp_gated=False,
    tied_embeddings=True,
    lm_head_all_positions=True,
)


def test_case1_databricks_mbu_is_half() -> None:
    spec = ModelSpec.from_preset("llama-2-7b")
    r = _phase(spec, _device(312e12, 2.0e12), 0.0, 14e9, 0.014)
    assert r["achieved_bytes_s"] == pytest.approx(1.0e12)
    assert r["mbu"] == pytest.approx(0.50)


@pytest.mark.parametrize(("batch", "gib"), [(1, 0.3125), (16, 5), (32, 10), (64, 20)])
def test_case2_databricks_kv_cache_sizes_llama2_70b(batch: int, gib: float) -> None:
    spec = ModelSpec.from_preset("llama-2-70b")
    assert cm.kv_cache_bytes(spec, batch * 1024) == pytest.approx(gib * GiB)
    int8 = spec.with_dtypes(kv_dtype="int8")
    assert cm.kv_cache_bytes(int8, batch * 1024) == pytest.approx(gib * GiB / 2)
    if batch == 1:
        assert cm.kv_cache_bytes(spec, 1024) == 335_544_320


def test_case3_llm_analysis_llama_7b_flops_weights_and_kv() -> None:
    spec = LLAMA_7B_LLM_ANALYSIS
    # llm-analysis: unmasked attention and logits for all 512 positions.
    assert cm.step_cost(spec, 1, 512, 0).flops == pytest.approx(6.868726e12, rel=1e-6)
    # its decode is a forward of one token with no past
    assert cm.step_cost(spec, 1, 1, 0).flops == pytest.approx(1.3147570e10, rel=1e-7)
    assert cm.param_count(spec) * 2 == 13_147_578_368
    assert cm.weight_bytes(spec) == 13_147_578_368
    assert cm.kv_cache_bytes(spec, 544) == 285_212_672


def test_case3_llm_analysis_decode_latency_from_weights_and_twice_the_kv() -> None:
    spec = LLAMA_7B_LLM_ANALYSIS
    # decode = weights / BW + 2 x final-size KV / BW (its load + store convention)
    t = (cm.weight_bytes(spec) + 2 * cm.kv_cache_bytes(spec, 544)) / 2039e9
    assert t == pytest.approx(6.7298e-3, rel=1e-3)
    assert 2 * cm.kv_cache_bytes(spec, 544) / 2039e9 == pytest.approx(0.27976e-3, rel=1e-4)


def test_case3_prefill_speed_of_light_is_within_2_percent_of_llm_analysis() -> None:
    # llm-analysis sums per-module max(compute, memory); the whole-pass roofline is 1.8% lower.
    p = predict(
        LLAMA_7B_LLM_ANALYSIS, _device(312e12, 2039e9), batch=1, prompt_len=512, output_len=32
    )
    assert p["ttft_s"] == pytest.approx(22.407e-3, rel=0.02)
    assert p["prefill"]["bound"] == "compute-bound"


def test_case4_fastertransformer_13b_mfu_and_mbu() -> None:
    spec = ModelSpec(
        name="test-13b",
        n_layers=40,
        hidden_size=5120,
        n_heads=40,
        n_kv_heads=40,
        head_dim=128,
        intermediate_size=20480,
        vocab_size=50272,
        mlp_gated=False,
        tied_embeddings=True,
        lm_head_all_positions=True,
    )
    assert cm.step_cost(spec, 1, 512, 0).flops == pytest.approx(1.336322e13, rel=1e-6)
    assert cm.weight_bytes(spec) == 25_681_438_720
    a100_40 = _device(312e12, 1555e9, mem=40e9)
    pre = _phase(spec, a100_40, 1.3363e13, 1.0, 0.06317)
    assert pre["mfu"] == pytest.approx(0.678, abs=0.001)
    # decode at 512 + 5 cached tokens: weights + KV (+ our small activation term)
    d = cm.decode_cost(spec, 1, 517)
    dec = _phase(spec, a100_40, d.flops, d.bytes, 0.022)
    assert dec["mbu"] == pytest.approx(0.76, abs=0.01)
    assert dec["verdict"] == "memory-bound"


def test_case5_llm_viewer_llama2_7b_decode_terms() -> None:
    spec = ModelSpec.from_preset("llama-2-7b")
    # weights read per decode step: all matmul weights incl. lm_head
    assert cm.matmul_params(spec) * 2 == pytest.approx(1.3214e10, rel=1e-4)
    # 1024 keys per row: 1023 cached + the new token
    c = cm.step_cost(spec, 1, 1, 1023)
    assert cm.kv_cache_bytes(spec, 1024) == pytest.approx(5.3687e8, rel=1e-4)
    # LLM-Viewer's lm_head lacks the factor 2 and it adds softmax/norm ops (<0.1%)
    viewer_ops = c.flops_linear + c.flops_attention + c.flops_lm_head / 2
    assert viewer_ops == pytest.approx(1.3628e10, rel=2e-3)


def test_case6_llama_cpp_m2_ultra_decode_mbu() -> None:
    m2 = DeviceSpec(
        key="m2", name="M2 Ultra", vendor="apple", kind="soc", peak_flops={}, mem_bw_bytes_s=800e9
    )
    spec = ModelSpec.from_preset("llama-2-7b")
    assert _phase(spec, m2, 0.0, 13.475e9, 1 / 40.53)["mbu"] == pytest.approx(0.683, abs=0.001)
    q8 = _phase(spec, m2, 0.0, 6.67 * GiB, 1 / 61.41)
    assert q8["mbu"] == pytest.approx(0.550, abs=0.001)


@pytest.mark.parametrize(
    ("preset", "n_mat", "decode_flops", "decode_bytes", "a100_ms", "h100_ms", "prefill", "ai64"),
    [
        ("llama-2-7b", 6.6071e9, 1.3751e10, 1.3751e10, 6.744, 4.105, 2.7626e13, 18.5),
        ("llama-3-8b", 7.5047e9, 1.5546e10, 1.5144e10, 7.427, 4.520, 2.9688e13, 42.2),
        ("llama-2-70b", 6.8713e10, 1.4011e11, 1.3776e11, 67.56, 41.12, 2.8588e14, 56.4),
    ],
)
def test_case7_formula_self_check(
    preset: str,
    n_mat: float,
    decode_flops: float,
    decode_bytes: float,
    a100_ms: float,
    h100_ms: float,
    prefill: float,
    ai64: float,
) -> None:
    spec = ModelSpec.from_preset(preset).with_dtypes(weight_dtype="bf16")
    assert cm.matmul_params(spec) == pytest.approx(n_mat, rel=1e-4)
    d = cm.step_cost(spec, 1, 1, 1023)  # T = 1024 keys
    assert d.flops == pytest.approx(decode_flops, rel=1e-4)
    # the formula's bytes: matmul weights + KV read of T tokens
    formula_bytes = 2 * cm.matmul_params(spec) + cm.kv_cache_bytes(spec, 1024)
    assert formula_bytes == pytest.approx(decode_bytes, rel=1e-4)
    assert formula_bytes / 2.039e12 * 1e3 == pytest.approx(a100_ms, rel=1e-3)
    assert formula_bytes / 3.35e12 * 1e3 == pytest.approx(h100_ms, rel=1e-3)
    # ours adds embedding rows, norms, the KV write and activations: < 1% at batch 1
    assert d.bytes == pytest.approx(decode_bytes, rel=0.01)
    assert cm.step_cost(spec, 1, 2048, 0).flops_useful == pytest.approx(prefill, rel=1e-4)
    # decode intensity at batch 64, T = 1024 (formula without activations)
    d64 = cm.step_cost(spec, 64, 64, 64 * 1023)
    formula_ai = d64.flops / (2 * cm.matmul_params(spec) + cm.kv_cache_bytes(spec, 64 * 1024))
    assert formula_ai == pytest.approx(ai64, rel=3e-3)
    assert d64.intensity == pytest.approx(ai64, rel=0.05)


def test_moe_decode_reads_only_routed_experts() -> None:
    spec = ModelSpec.from_preset("mixtral-8x7b")
    one = cm.decode_cost(spec, 1, 512)
    dense_part = (
        spec.n_layers * cm.attention_params_per_layer(spec) + spec.hidden_size * spec.vocab_size
    )
    expert = spec.n_layers * cm.mlp_params_per_expert(spec)
    # batch 1: exactly 2 of 8 experts per layer
    assert one.bytes_weights == pytest.approx(2 * (dense_part + 2 * expert), rel=1e-3)
    # a large batch touches (almost) all experts
    big = cm.decode_cost(spec, 256, 512)
    assert big.bytes_weights == pytest.approx(2 * (dense_part + 8 * expert), rel=1e-3)
    # FLOPs always pay for the active experts only
    assert one.flops_linear == 2 * cm.matmul_params(spec, active=True, lm_head=False)


def test_quantised_weights_scale_bytes_not_flops() -> None:
    spec = ModelSpec.from_preset("llama-2-7b")
    int4 = spec.with_dtypes(weight_dtype="int4")
    a, b = cm.decode_cost(spec, 1, 512), cm.decode_cost(int4, 1, 512)
    assert a.flops == b.flops
    assert b.bytes_weights / a.bytes_weights == pytest.approx((0.5 + 2 / 128) / 2, rel=0.01)
    assert int4.act_dtype == "bf16"


def test_generation_cost_sums_decode_steps_with_growing_context() -> None:
    spec = replace(ModelSpec.from_preset("gpt2"), lm_head_all_positions=False)
    g = cm.generation_cost(spec, 2, 100, 11)
    assert g.decode_steps == 10
    manual = sum(
        (cm.decode_cost(spec, 2, 100 + i) for i in range(1, 10)), cm.decode_cost(spec, 2, 100)
    )
    assert g.decode.flops == pytest.approx(manual.flops)
    assert g.decode.bytes == pytest.approx(manual.bytes)
