"""Advice that agrees with itself and with the studies: every reason is generated from the
numbers it quotes (checked here by re-doing the arithmetic), and a suggestion a stored study
on this machine class contradicts is reworded with that evidence."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from perfscope.analysis.advisor import advise, batch_target
from perfscope.analysis.calibration import CalibrationEntry, MachineClass, machine_of_device
from perfscope.analysis.modelspec import ModelSpec
from perfscope.hwdb.spec import DeviceSpec
from tests.test_advisor_suggestions import A100, _run

#: A small CPU whose ridge (0.1 FLOP/B) lies far below a batch-1 fp16 decode (about 1 FLOP/B).
CPU = DeviceSpec(
    key="test-cpu-calibrated",
    name="Test CPU (calibrated)",
    vendor="amd",
    kind="cpu",
    peak_flops={"fp32": 1e11, "bf16": 1e11, "fp16": 1e11},
    mem_bw_bytes_s=1e12,
    mem_bytes=64e9,
    cache_bytes=32e6,
    source="calibrated",
    extra={"calibration": {"fingerprint": {"cpu_model": "Test CPU", "cores": 2}}},
)
HERE = MachineClass("Test CPU", 2, None, "reference")

_UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def _seconds(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)\s*(ns|µs|us|ms|s)", text.strip())
    assert m, text
    return float(m.group(1)) * _UNITS[m.group(2)]


def _entry(
    technique: str,
    knob: str,
    base: str,
    value: str,
    metric: str,
    measured: float,
    interval: tuple[float, float],
    machine: MachineClass = HERE,
) -> CalibrationEntry:
    return CalibrationEntry(
        technique=technique,
        machine=machine,
        metric=metric,
        knob=knob,
        baseline=base,
        value=value,
        projected_ratio=1.0,
        sol_ratio=1.0,
        measured_ratio=measured,
        interval=interval,
        confidence=0.95,
        significant=not interval[0] <= 1 <= interval[1],
        error=1.0 / measured - 1.0,
        runs_per_setting=3,
        method="t",
        study_file="samples/studies/results/x-study-threads.json",
        created_at="2026-12-01T23:14:44+00:00",
    )


def _overhead_bound_cpu_run() -> tuple[ModelSpec, dict[str, Any], dict[str, Any]]:
    spec = ModelSpec.from_preset("llama-3-8b")
    roof, wl = _run(spec, CPU, batch=1, prompt=64, out=16, eff_prefill=0.05, eff_decode=0.02)
    return spec, roof, wl


def test_batching_above_the_ridge_does_not_say_weights_are_read_for_few_tokens() -> None:
    spec, roof, wl = _overhead_bound_cpu_run()
    dec = roof["phases"]["decode"]
    ridge = CPU.peak_flops["fp16"] / CPU.mem_bw_bytes_s
    assert dec["intensity"] > 5 * ridge  # the case: decode far above the ridge
    got = {a.technique: a for a in advise(roof, spec, CPU, wl, calibration=())}
    why = got["larger batches / continuous batching"].why
    assert "few tokens" not in why and "reads the" not in why
    m = re.search(r"is already ([\d.]+)x the ridge ([\d.]+)", why)
    assert m, why
    assert float(m.group(1)) == pytest.approx(dec["intensity"] / ridge, rel=0.01)
    assert "shares each step's fixed overhead" in why


def test_batching_below_the_ridge_quotes_intensity_and_ridge_that_agree() -> None:
    spec = ModelSpec.from_preset("llama-2-7b")
    roof, wl = _run(spec, A100, batch=1, prompt=512, out=64, eff_prefill=0.6, eff_decode=0.6)
    got = {a.technique: a for a in advise(roof, spec, A100, wl, calibration=())}
    why = got["larger batches / continuous batching"].why
    m = re.search(r"intensity ([\d.]+) FLOP/B, ([\d.]+)x the ridge ([\d.]+)\)", why)
    assert m, why
    intensity, times, ridge = (float(g) for g in m.groups())
    assert intensity < ridge
    assert times == pytest.approx(intensity / ridge, rel=0.05)
    # the throughput it quotes is the gain's low end (overhead kept fixed)
    m2 = re.search(r"rises from ([\d.,]+) to ([\d.,]+) tok/s", why)
    assert m2, why
    a, b = (float(g.replace(",", "")) for g in m2.groups())
    gain = got["larger batches / continuous batching"].projected_gain
    assert b / a == pytest.approx(gain.low, rel=0.01)


@pytest.mark.parametrize(
    ("knee", "current", "limit", "target", "decided_by"),
    [
        (2, 8, 86768, 16, "twice the current batch"),  # the "batch 16 = min(2, 86768)"
        (153, 1, 86768, 153, "the ridge knee"),
        (153, 1, 40, 40, "the memory limit"),
        (4, 1, None, 4, "the ridge knee"),
    ],
)
def test_the_batch_target_text_states_the_rule_that_produced_it(
    knee: int, current: int, limit: int | None, target: int, decided_by: str
) -> None:
    got, text = batch_target(knee, current, limit)
    assert got == target
    assert text.startswith(f"batch {target} = min(max(ridge knee {knee}, 2 x current batch ")
    assert f"set by {decided_by}" in text
    m = re.match(r"batch (\d+) = min\(max\(ridge knee (\d+), 2 x current batch (\d+)\), ", text)
    assert m
    n, k, c = (int(g) for g in m.groups())
    assert n == min(max(k, 2 * c), limit if limit is not None else max(k, 2 * c))


def test_the_advice_assumption_for_batching_is_the_rule_with_its_numbers() -> None:
    spec, roof, wl = _overhead_bound_cpu_run()
    got = {a.technique: a for a in advise(roof, spec, CPU, wl, calibration=())}
    a = got["larger batches / continuous batching"].assumptions
    m = re.match(
        r"batch (\d+) = min\(max\(ridge knee (\d+), 2 x current batch (\d+)\), "
        r"memory limit (\d+)\)",
        a,
    )
    assert m, a
    n, k, c, lim = (int(g) for g in m.groups())
    assert n == min(max(k, 2 * c), lim)


def test_a_threads_study_that_measured_more_threads_slower_removes_the_threads_lever() -> None:
    spec, roof, wl = _overhead_bound_cpu_run()
    before = advise(roof, spec, CPU, wl, calibration=())
    cut = next(a for a in before if a.technique.startswith("cut decode"))
    assert "torch.set_num_threads to the physical cores" in cut.technique
    # 1 thread 5.4x faster than 2 on this machine class (the threads study)
    slower = _entry("threads", "threads", "1", "2", "output_tok_s", 1 / 5.4, (0.12, 0.25))
    after = advise(roof, spec, CPU, wl, calibration=(slower,))
    cut = next(a for a in after if a.technique.startswith("cut decode"))
    assert "set_num_threads" not in cut.technique
    assert "threads 1 -> 2 5.4x worse on output_tok_s" in cut.why
    assert "x-study-threads.json" in cut.why


def test_a_threads_study_on_another_machine_class_changes_nothing_here() -> None:
    spec, roof, wl = _overhead_bound_cpu_run()
    elsewhere = MachineClass("Test CPU", 64, None, "reference")
    slower = _entry(
        "threads", "threads", "1", "2", "output_tok_s", 0.2, (0.1, 0.3), machine=elsewhere
    )
    advice = advise(roof, spec, CPU, wl, engine="reference", calibration=(slower,))
    cut = next(a for a in advice if a.technique.startswith("cut decode"))
    assert "torch.set_num_threads to the physical cores" in cut.technique
    assert cut.calibration.text.startswith("uncalibrated here: no stored study")
    assert "Test CPU, 2 cores, reference engine" in cut.calibration.text


def test_a_suggestion_a_stored_study_measured_worse_is_reworded_and_ranked_last() -> None:
    spec, roof, wl = _overhead_bound_cpu_run()
    worse = _entry("batching", "batch-size", "1", "8", "output_tok_s", 0.5, (0.3, 0.8))
    advice = advise(roof, spec, CPU, wl, calibration=(worse,))
    batching = next(a for a in advice if a.technique.startswith("larger batches"))
    assert batching.rank == len(advice)
    assert "but contradicted here" in batching.why
    assert "batch-size 1 -> 8 2x worse on output_tok_s" in batching.why
    assert batching.contradicted_by["measured_ratio"] == 0.5
    # a study that measured a gain calibrates instead of contradicting
    better = dataclasses.replace(worse, measured_ratio=4.0, interval=(2.0, 8.0), error=-0.75)
    advice = advise(roof, spec, CPU, wl, calibration=(better,))
    batching = next(a for a in advice if a.technique.startswith("larger batches"))
    assert batching.contradicted_by is None and "contradicted_by" not in batching.to_dict()
    cal = batching.calibration
    assert cal.calibrated and cal.significant
    assert "measured batch-size 1 -> 8 output_tok_s 4x [2, 8], significant" in cal.text
    assert machine_of_device(CPU, "reference") == HERE
