"""The fitted cost model: roofline time + host terms per layer, sequence, token and step,
fitted by non-negative least squares, with its residual; priced passes; projections that
carry only what moves with the device."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.costmodel import weight_bytes
from perfscope.analysis.modelspec import ModelSpec, weight_bytes_per_param
from perfscope.analysis.overhead import (
    KERNELS_PER_LAYER,
    OverheadFit,
    StepSamples,
    cast_bytes,
    chunked_prefill_steps,
    fit_overhead,
    launch_time,
    nnls,
    quantisation_bytes,
    roof_times,
    samples_from_steps,
    sparse_bytes_factor,
)
from perfscope.analysis.whatif import predict, project_run
from perfscope.hwdb import lookup
from tests.conftest import PERFSCOPE, subprocess_env
from tests.test_advisor_consistency import CPU
from tests.test_advisor_suggestions import _run

TRUE = {"roof": 1.5, "layer": 20e-6, "seq": 40e-6, "tok": 3e-6, "step": 100e-6}


def _synthetic(spec: ModelSpec, rng: np.random.Generator, noise: float = 0.0) -> StepSamples:
    b = rng.integers(1, 9, 60).astype(float)
    n = np.where(rng.random(60) < 0.3, b * rng.integers(8, 64, 60), b)  # prefill or decode
    c = b * rng.integers(8, 128, 60)
    roof = roof_times(spec, CPU, b, n, c)
    t = (
        TRUE["roof"] * roof
        + TRUE["layer"] * spec.n_layers
        + TRUE["seq"] * b
        + TRUE["tok"] * n
        + TRUE["step"]
    )
    t = t + noise * rng.standard_normal(60)  # absolute timing noise, s
    return StepSamples(t, roof, np.full(60, float(spec.n_layers)), b, n, CPU.key, "cpu")


def test_two_model_shapes_pin_every_term_and_the_fit_recovers_them() -> None:
    rng = np.random.default_rng(0)
    small = ModelSpec.from_preset("llama-3-8b")
    two = dataclasses.replace(small, n_layers=2)
    six = dataclasses.replace(small, n_layers=6)
    fit = fit_overhead([_synthetic(two, rng), _synthetic(six, rng)])
    assert fit.folded == ()
    assert fit.roof_scale == pytest.approx(TRUE["roof"], rel=1e-6)
    assert fit.per_layer_s == pytest.approx(TRUE["layer"], rel=1e-6)
    assert fit.per_sequence_s == pytest.approx(TRUE["seq"], rel=1e-6)
    assert fit.per_token_s == pytest.approx(TRUE["tok"], rel=1e-6)
    assert fit.per_step_s == pytest.approx(TRUE["step"], rel=1e-6)
    assert fit.residual_rms_s < 1e-12 and fit.samples == 120
    assert "us/sequence" in fit.describe() and "residual" in fit.describe()


def test_one_model_shape_folds_per_layer_into_per_step_and_reports_the_residual() -> None:
    rng = np.random.default_rng(1)
    spec = dataclasses.replace(ModelSpec.from_preset("llama-3-8b"), n_layers=2)
    s = _synthetic(spec, rng, noise=5e-6)
    fit = fit_overhead(s)
    assert fit.folded == ("per layer",)
    assert fit.per_layer_s == 0.0
    assert fit.per_step_s == pytest.approx(TRUE["step"] + 2 * TRUE["layer"], rel=0.3)
    assert fit.residual_rms_s == pytest.approx(5e-6, rel=0.5)  # the noise shows as residual
    assert 0 < fit.residual_rel < 0.05
    pred = fit.step_time(s.roof_s, 2, s.sequences, s.tokens)
    rms = float(np.sqrt(np.mean((pred - s.time_s) ** 2)))
    assert rms == pytest.approx(fit.residual_rms_s, rel=1e-9)


def test_nnls_keeps_every_coefficient_non_negative() -> None:
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = np.array([3.0, 2.0, 1.0])  # least squares wants a negative slope
    x = nnls(a, b)
    assert (x >= 0).all() and x[1] == 0.0
    assert x[0] == pytest.approx(2.0)
    x2 = nnls(np.eye(3), np.array([1.0, -2.0, 3.0]))
    assert x2 == pytest.approx([1.0, 0.0, 3.0])


def test_a_per_sequence_cost_makes_a_larger_batch_pay_per_row_unlike_fixed_overhead() -> None:
    spec = ModelSpec.from_preset("llama-3-8b")
    fit = OverheadFit(1.0, 0.0, 2e-3, 0.0, 5e-3, device=CPU.key)
    kw = {"prompt_len": 32, "output_len": 16}
    one = predict(spec, CPU, batch=1, overhead=fit, **kw)
    eight = predict(spec, CPU, batch=8, overhead=fit, **kw)
    # TPOT grows by 7 rows x 2 ms (plus the roofline's own change)
    extra = eight["tpot_s"] - one["tpot_s"]
    sol_extra = (
        predict(spec, CPU, batch=8, **kw)["tpot_s"] - predict(spec, CPU, batch=1, **kw)["tpot_s"]
    )
    assert extra == pytest.approx(7 * 2e-3 + sol_extra, rel=1e-6)
    assert eight["overhead_fit"]["per_sequence_s"] == 2e-3


def test_projections_onto_a_gpu_carry_only_what_moves_with_the_device() -> None:
    h100 = lookup("h100-sxm5-80gb")
    assert h100.kernel_launch_s == pytest.approx(5e-6)
    field = h100.extra["fields"]["launch.kernel"]
    assert field["estimate"] and "developer.nvidia.com/blog/cuda-graphs" in field["sources"][0]
    tiny = dataclasses.replace(ModelSpec.from_preset("llama-3-8b"), n_layers=2)
    assert launch_time(h100, tiny) == pytest.approx(KERNELS_PER_LAYER * 2 * 5e-6)
    assert launch_time(CPU, tiny) == 0.0
    cpu_fit = OverheadFit(3.0, 1e-4, 2e-4, 1e-6, 1e-3, device=CPU.key, platform="cpu")
    moved = cpu_fit.on_device(h100, tiny)
    assert (moved.per_sequence_s, moved.per_token_s, moved.per_step_s) == (0.0, 0.0, 0.0)
    assert moved.per_layer_s * tiny.n_layers == pytest.approx(launch_time(h100, tiny))
    assert moved.roof_scale == 1.0
    gpu_fit = dataclasses.replace(cpu_fit, device="a100-sxm4-80gb", platform="gpu")
    kept = gpu_fit.on_device(h100, tiny, launches=False)
    assert kept.per_sequence_s == 2e-4 and kept.per_step_s == 1e-3  # the same host drives it
    assert cpu_fit.on_device(CPU, tiny) is cpu_fit

    roof, wl = _run(tiny, CPU, batch=1, prompt=32, out=16, eff_prefill=0.05, eff_decode=0.02)
    (proj,) = project_run(roof, tiny, wl, [h100], measured_on=CPU.key, fit=cpu_fit)
    sol = proj["range"]["speed_of_light"]["tpot_s"]
    assert proj["tpot_s"] >= sol / 0.2 + launch_time(h100, tiny) - 1e-12
    assert any("kernel launches priced" in n for n in proj["notes"])
    assert any("not carried" in n for n in proj["notes"])


def test_priced_passes_follow_their_arithmetic() -> None:
    spec = dataclasses.replace(ModelSpec.from_preset("llama-3-8b"), n_layers=2).with_dtypes(
        weight_dtype="int8"
    )
    params = weight_bytes(spec) / spec.weight_bytes_per_param
    act = weight_bytes_per_param(spec.act_dtype)
    assert quantisation_bytes(spec, "int8-wo", 1) == pytest.approx(params * 2 * act)
    dyn = quantisation_bytes(spec, "int8", 10)
    assert dyn == 5.0 * (6 * spec.hidden_size + spec.intermediate_size) * 2 * 10
    assert quantisation_bytes(spec, "none", 10) == 0.0
    with pytest.raises(ValueError, match="unknown quantisation mode"):
        quantisation_bytes(spec, "int3", 1)
    assert cast_bytes(1000.0, 1.0, 4.0) == 8000.0  # fp8 read, fp32 written + read
    assert cast_bytes(1000.0, 4.0, 4.0) == 0.0
    assert sparse_bytes_factor(0.5) == pytest.approx(1.5)  # CSR at 50%: more bytes than dense
    assert sparse_bytes_factor(0.25) == pytest.approx(0.75)
    assert chunked_prefill_steps(100, 32, decode_rows=4) == [28, 28, 28, 16]
    assert chunked_prefill_steps(100, None) == [100]
    with pytest.raises(ValueError, match="no room"):
        chunked_prefill_steps(10, 4, decode_rows=4)


@pytest.mark.slow
def test_a_real_run_fits_with_a_stated_residual(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            *PERFSCOPE,
            "run",
            "--model-preset",
            "tiny",
            "--batch-size",
            "4",
            "--requests",
            "8",
            "--warmup",
            "0",
            "--prompt-len",
            "16",
            "--output-len",
            "8",
            "--hw",
            "epyc-9654",
            "--no-telemetry",
            "--runs-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    assert out.returncode == 0, out.stderr
    run = next(p for p in tmp_path.iterdir() if (p / "steps.parquet").is_file())
    steps = pd.read_parquet(run / "steps.parquet")
    summary = json.loads((run / "summary.json").read_text())
    spec = ModelSpec.from_dict(summary["model"])
    fit = fit_overhead(samples_from_steps(steps, spec, lookup("epyc-9654")))
    assert fit.samples == len(steps)
    assert np.isfinite(fit.residual_rel) and fit.residual_rel >= 0
    assert min(fit.roof_scale, fit.per_sequence_s, fit.per_token_s, fit.per_step_s) >= 0
    # the fit explains the run's total time to within its residual per step (prefill steps
    # priced as prefill: the decode-step formula alone misses a prompt's work)
    s = samples_from_steps(steps, spec, lookup("epyc-9654"))
    pred = fit.predict(s)
    assert abs(float(pred.sum() - s.time_s.sum())) <= fit.residual_rms_s * len(s) ** 0.5 * 3


@pytest.mark.slow
def test_advisor_fit_shows_each_run_and_all_together_with_the_residual(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from perfscope.cli import main
    from tests.data.runs.builders import complete_run

    one = complete_run(tmp_path, "--hw", "epyc-9654", "--no-telemetry")
    two = complete_run(tmp_path, "--hw", "epyc-9654", "--no-telemetry", "--batch-size", "2")
    capsys.readouterr()
    assert main(["advisor", "fit", str(one), str(two), "--json"]) == 0
    fits = json.loads(capsys.readouterr().out)
    assert set(fits) == {one.name, two.name, "all"}
    assert fits["all"]["samples"] == fits[one.name]["samples"] + fits[two.name]["samples"]
    assert all(f["residual_rms_s"] >= 0 for f in fits.values())
    assert main(["advisor", "fit", str(one)]) == 0
    assert "residual" in capsys.readouterr().out
    assert main(["advisor", "fit", str(tmp_path / "nope")]) != 0


#: The reference engine's tiny model, as its runs record it.
TINY = ModelSpec.from_dict(
    {
        "name": "reference",
        "n_layers": 2,
        "hidden_size": 128,
        "n_heads": 4,
        "n_kv_heads": 2,
        "head_dim": 32,
        "intermediate_size": 352,
        "vocab_size": 1024,
        "weight_dtype": "fp32",
        "weight_bytes_per_param": 4.0,
        "kv_dtype": "fp32",
        "kv_bytes_per_element": 4.0,
        "act_dtype": "fp32",
        "act_bytes_per_element": 4.0,
    }
)


def test_prefill_steps_fitted_apart_price_an_eight_prompt_prefill_by_its_work() -> None:
    """Batch-1 steps of an overhead-bound engine: decode steps are host time (10 ms) plus
    a context-growing term the decode fit reads as 20 x roofline; a prefill is a decode
    step plus 3 x its roofline. Fitted apart, an 8-prompt prefill is priced at that; one
    fit of both kinds, from one prompt shape, cannot tell the prompt's work from host time
    per token and misses it."""
    from perfscope.analysis.overhead import fitted_times

    rows = []
    t = 0
    for _ in range(8):
        for i in range(16):
            kind, n, c = ("prefill", 32, 0) if i == 0 else ("decode", 1, 32 + i)
            rows.append((kind, t, 1, n, c))
    df = pd.DataFrame(rows, columns=["kind", "t_start", "batch_size", "new_tokens", "ctx"])
    b, n, c = (df[k].to_numpy(float) for k in ("batch_size", "new_tokens", "ctx"))
    roof = roof_times(TINY, CPU, b, n, c)
    prefill = (df["kind"] == "prefill").to_numpy()
    decode_like = 10e-3 + 20 * np.where(prefill, roof_times(TINY, CPU, b, b, c + n), roof)
    dur = np.where(prefill, decode_like + 3 * roof, decode_like)
    steps = df.rename(columns={"ctx": "context_tokens"})
    steps["t_end"] = steps["t_start"] + (dur * 1e9).astype(np.int64)
    apart = fit_overhead(samples_from_steps(steps, TINY, CPU))
    assert apart.prefill_scale == pytest.approx(3.0, rel=1e-6)
    assert apart.residual_rms_s < 1e-8 and "prefill steps fitted apart" in apart.describe()
    one = fit_overhead(samples_from_steps(steps.drop(columns="kind"), TINY, CPU))
    assert one.prefill_scale is None
    shape = {"batch": 8, "prompt_len": 32, "output_len": 16}
    want = float(
        10e-3
        + 20 * roof_times(TINY, CPU, np.array([8.0]), np.array([8.0]), np.array([256.0]))[0]
        + 3 * roof_times(TINY, CPU, np.array([8.0]), np.array([256.0]), np.array([0.0]))[0]
    )
    assert fitted_times(apart, TINY, CPU, **shape).ttft_s == pytest.approx(want, rel=1e-6)
    assert abs(fitted_times(one, TINY, CPU, **shape).ttft_s / want - 1) > 0.05


def test_a_dtype_the_fit_never_saw_is_no_faster_than_its_own_roofline() -> None:
    """A fit made on fp32 steps (its multiplier: overhead over the fp32 ceilings) projecting
    bf16 on a CPU whose bf16 matmuls run at a tenth of fp32: the work is at least bf16's
    roofline, not the fp32 work scaled (which would make bf16 look as fast as fp32)."""
    from perfscope.analysis.overhead import fitted_times

    slow16 = dataclasses.replace(CPU, peak_flops={"fp32": 1e11, "bf16": 1e10})
    fit = dataclasses.replace(
        OverheadFit(2.0, 0.0, 0.0, 0.0, 1e-3, device=slow16.key), act_dtype="fp32"
    )
    bf16 = dataclasses.replace(TINY, act_dtype="bf16")
    shape = {"batch": 8, "prompt_len": 256, "output_len": 2}
    ft = fitted_times(fit, bf16, slow16, **shape)
    rows = np.array([8.0])
    own = roof_times(bf16, slow16, rows, rows * 256, np.array([0.0]))[0]
    at_fp32 = roof_times(TINY, slow16, rows, rows * 256, np.array([0.0]))[0]
    assert own > 2.0 * at_fp32  # compute-bound prefill: bf16's ceiling binds
    assert ft.ttft_s == pytest.approx(own + 1e-3, rel=1e-6)
    same = fitted_times(dataclasses.replace(fit, act_dtype="bf16"), bf16, slow16, **shape)
    assert same.ttft_s == pytest.approx(2.0 * own + 1e-3, rel=1e-6)  # fitted at bf16: scaled
