"""Energy join: scripted NVML energy → exact energy per run, phase, request and token."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from perfscope.analysis.energy import EnergyCurve, energy_section
from perfscope.analysis.summary import Energy
from perfscope.dashboard.terminal import energy_table
from perfscope.profiler.clock import ManualClock
from perfscope.profiler.telemetry import TelemetryConfig, start_telemetry
from perfscope.profiler.telemetry.testing import FakeGpu, FakeNvml, PowerSchedule
from tests.conftest import DATA

MS = 1_000_000

# A scripted run on one GPU, sampled every 10 ms:
#   idle 80 W for 0.5 s (the baseline), then request 0 and 1 arrive at 0.5 s;
#   prefill step 0.5–0.6 s at 400 W (two prompts of 30 and 10 tokens),
#   decode steps every 50 ms from 0.6 s to 1.0 s at 250 W (8 steps, both requests, 1 token each),
#   a 0.1 s gap at 100 W (between steps), then one more decode step 1.1–1.2 s at 250 W for
#   request 1 alone.
SCHEDULE = PowerSchedule(
    [(0, 80.0), (500 * MS, 400.0), (600 * MS, 250.0), (1000 * MS, 100.0), (1100 * MS, 250.0)]
)


def _steps() -> pd.DataFrame:
    rows = [
        {
            "step_id": 0,
            "kind": "prefill",
            "t_start": 500 * MS,
            "t_end": 600 * MS,
            "batch_size": 2,
            "new_tokens": 40,
            "context_tokens": 0,
            "request_ids": [0, 1],
        }
    ]
    for k in range(8):
        rows.append(
            {
                "step_id": 1 + k,
                "kind": "decode",
                "t_start": (600 + 50 * k) * MS,
                "t_end": (650 + 50 * k) * MS,
                "batch_size": 2,
                "new_tokens": 2,
                "context_tokens": 80,
                "request_ids": [0, 1],
            }
        )
    rows.append(
        {
            "step_id": 9,
            "kind": "decode",
            "t_start": 1100 * MS,
            "t_end": 1200 * MS,
            "batch_size": 1,
            "new_tokens": 1,
            "context_tokens": 19,
            "request_ids": [1],
        }
    )
    return pd.DataFrame(rows)


def _requests() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": [0, 1],
            "prompt_tokens": [30, 10],
            "max_output_tokens": [9, 10],
            "t_scheduled": [500 * MS, 500 * MS],
            "t_sent": [500 * MS, 500 * MS],
            "t_first_token": [600 * MS, 600 * MS],
            "t_last_token": [1000 * MS, 1200 * MS],
            "output_tokens": [9, 10],
            "error": [None, None],
            "is_warmup": [False, False],
        }
    )


def _record(
    monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], *, end_ms: int = 1300
) -> tuple[pd.DataFrame, dict[str, object]]:
    clock = ManualClock()
    FakeNvml(gpus, clock.now_ns).install(monkeypatch)
    s = start_telemetry(
        clock, TelemetryConfig(baseline_s=0.5, interval_s=0.05, cpu=False), background=False
    )
    while clock.now_ns() < end_ms * MS:
        clock.advance_ns(10 * MS)
        s.sample_once()
    df = s.stop().to_pandas()
    return df, s.manifest_info()


# Truth, from the schedule: window 0.5–1.2 s.
PREFILL_J = 400 * 0.1  # 40 J
DECODE_J = 250 * 0.4 + 250 * 0.1  # 125 J
GAP_J = 100 * 0.1  # 10 J
TOTAL_J = PREFILL_J + DECODE_J + GAP_J  # 175 J
OUTPUT_TOKENS = 19


def test_energy_per_token_from_the_counter_matches_the_scripted_truth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tele, manifest = _record(
        monkeypatch, [FakeGpu(power_w=SCHEDULE.power_w, energy_mj=SCHEDULE.energy_mj)]
    )
    sec = energy_section(tele, _steps(), _requests(), pd.DataFrame(), manifest, tdp_w=700.0)
    assert sec.available
    assert sec.method == "counter"
    assert sec.source == "gpu"
    assert sec.window_s == pytest.approx(0.7)
    assert sec.total_j == pytest.approx(TOTAL_J)
    assert sec.j_per_output_token == pytest.approx(TOTAL_J / OUTPUT_TOKENS)
    assert sec.tokens_per_j == pytest.approx(OUTPUT_TOKENS / TOTAL_J)
    ph = sec.phases
    assert ph["prefill"].energy_j == pytest.approx(PREFILL_J)
    assert ph["prefill"].j_per_token == pytest.approx(PREFILL_J / 40)
    assert ph["prefill"].avg_power_w == pytest.approx(400.0)
    assert ph["decode"].energy_j == pytest.approx(DECODE_J)
    assert ph["decode"].j_per_token == pytest.approx(DECODE_J / 17)
    assert ph["between_steps"].energy_j == pytest.approx(GAP_J)
    assert ph["between_steps"].time_s == pytest.approx(0.1)
    # Idle baseline 80 W (sampled before the run), dynamic = total − 80 W × 0.7 s.
    assert sec.idle_baseline_w == pytest.approx(80.0)
    assert sec.dynamic_energy_j == pytest.approx(TOTAL_J - 80 * 0.7)
    assert ph["prefill"].dynamic_energy_j == pytest.approx(PREFILL_J - 80 * 0.1)
    # Power against the limit (700 W) and TDP.
    assert sec.power.avg_w == pytest.approx(TOTAL_J / 0.7)
    assert sec.power.peak_w == pytest.approx(400.0)
    assert sec.power.limit_w == 700.0
    assert sec.power.peak_pct_of_tdp == pytest.approx(100 * 400 / 700)
    json.dumps(sec.to_dict())  # JSON-ready


def test_per_request_energy_splits_steps_by_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    tele, manifest = _record(
        monkeypatch, [FakeGpu(power_w=SCHEDULE.power_w, energy_mj=SCHEDULE.energy_mj)]
    )
    sec = energy_section(tele, _steps(), _requests(), pd.DataFrame(), manifest)
    # Request 0: 30/40 of the prefill + half of 8 shared decode steps.
    r0 = PREFILL_J * 30 / 40 + 250 * 0.4 / 2
    # Request 1: 10/40 of the prefill + half of the shared decode + its lone step.
    r1 = PREFILL_J * 10 / 40 + 250 * 0.4 / 2 + 250 * 0.1
    rq = sec.requests
    assert rq.count == 2
    assert rq.energy_j.max == pytest.approx(max(r0, r1))
    assert rq.energy_j.mean == pytest.approx((r0 + r1) / 2)
    assert rq.j_per_output_token.mean == pytest.approx((r0 / 9 + r1 / 10) / 2)
    assert rq.attributed_share == pytest.approx((r0 + r1) / TOTAL_J)


def test_integrated_power_is_used_and_named_without_an_energy_counter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Power linear in time between samples makes the trapezoid rule exact.
    def ramp(t: int) -> float:
        return 100.0 + 200.0 * t / 1e9  # 100 W at 0, +200 W per second

    tele, manifest = _record(monkeypatch, [FakeGpu(power_w=ramp, energy_mj=None)])
    sec = energy_section(tele, _steps(), _requests(), pd.DataFrame(), manifest)
    assert sec.method == "integrated"

    def energy(a: float, b: float) -> float:
        return 100.0 * (b - a) + 100.0 * (b * b - a * a)

    assert sec.total_j == pytest.approx(energy(0.5, 1.2), rel=1e-9)
    assert sec.phases["prefill"].energy_j == pytest.approx(energy(0.5, 0.6), rel=1e-9)
    # A window edge inside a sampling interval is interpolated exactly too.
    curve = EnergyCurve.from_power(np.array([0.0, 1e9]), np.array([100.0, 300.0]))
    assert curve is not None
    assert curve.between(np.array([0.25e9]), np.array([0.75e9]))[0] == pytest.approx(100.0)


def test_energy_sums_over_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    half = PowerSchedule([(t, w / 2) for t, w in SCHEDULE.steps])
    gpus = [
        FakeGpu(uuid="GPU-a", bus_id="00000000:1B:00.0", power_w=SCHEDULE.power_w,
                energy_mj=SCHEDULE.energy_mj),
        FakeGpu(uuid="GPU-b", bus_id="00000000:2B:00.0", power_w=half.power_w,
                energy_mj=half.energy_mj),
    ]  # fmt: skip
    tele, manifest = _record(monkeypatch, gpus)
    sec = energy_section(tele, _steps(), _requests(), pd.DataFrame(), manifest)
    assert sec.devices == ("gpu0", "gpu1")
    assert sec.total_j == pytest.approx(1.5 * TOTAL_J)
    assert sec.j_per_output_token == pytest.approx(1.5 * TOTAL_J / OUTPUT_TOKENS)
    assert sec.power.limit_w == 1400.0
    assert sec.power.peak_w == pytest.approx(600.0)


def test_http_runs_without_steps_split_energy_by_concurrency(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tele, manifest = _record(
        monkeypatch, [FakeGpu(power_w=SCHEDULE.power_w, energy_mj=SCHEDULE.energy_mj)]
    )
    sec = energy_section(tele, pd.DataFrame(), _requests(), pd.DataFrame(), manifest)
    assert sec.attribution == "concurrency"
    assert sec.total_j == pytest.approx(TOTAL_J)
    # Before the first token (0.5–0.6 s) both requests are in prefill.
    assert sec.phases["prefill"].energy_j == pytest.approx(PREFILL_J)
    assert sec.phases["decode"].energy_j == pytest.approx(TOTAL_J - PREFILL_J)
    r0 = PREFILL_J / 2 + 250 * 0.4 / 2
    assert sec.requests.energy_j.p50 == pytest.approx(np.percentile([r0, TOTAL_J - r0], 50))


def test_throttling_share_and_peak_memory_against_capacity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = FakeGpu(
        power_w=SCHEDULE.power_w,
        energy_mj=SCHEDULE.energy_mj,
        throttle=lambda t: 0x4 | 0x1 if 600 * MS <= t < 950 * MS else 0x1,  # power cap
        mem_used_bytes=lambda t: 70e9 if t >= 500 * MS else 1e9,
    )
    tele, manifest = _record(monkeypatch, [gpu])
    sec = energy_section(
        tele, _steps(), _requests(), pd.DataFrame(), manifest, mem_capacity_bytes=140e9
    )
    # Samples at 500..1200 ms (71 of them), 35 inside 600..940 ms are power-capped.
    assert sec.throttle.share == pytest.approx(35 / 71)
    assert sec.throttle.per_device["gpu0"].sw_power_cap == pytest.approx(35 / 71)
    assert sec.throttle.per_device["gpu0"].hw_slowdown == 0.0
    mem = sec.memory["gpu0"]
    assert mem.peak_used_bytes == 70e9
    assert mem.peak_pct_of_capacity == pytest.approx(50.0)


def test_measured_hardware_counters_are_reported_per_phase(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GPM reports the window since the previous sample; script DRAM bandwidth by phase.
    def dram(t: int) -> float:
        return 30.0 if t <= 600 * MS else 71.0

    gpu = FakeGpu(power_w=SCHEDULE.power_w, energy_mj=SCHEDULE.energy_mj, gpm={10: dram})
    tele, manifest = _record(monkeypatch, [gpu])
    sec = energy_section(tele, _steps(), _requests(), pd.DataFrame(), manifest)
    hw = sec.hardware_counters
    assert hw["prefill"].dram_bw_util_pct == pytest.approx(30.0)
    assert hw["decode"].dram_bw_util_pct == pytest.approx(71.0)


def _cpu_only() -> pd.DataFrame:
    """Samples of a host without a GPU or RAPL: memory and CPU, no power, no energy."""
    return pd.DataFrame(
        {
            "t": [500 * MS, 900 * MS, 1200 * MS],
            "device": ["cpu"] * 3,
            "power_w": [np.nan] * 3,
            "energy_j": [np.nan] * 3,
            "mem_used_bytes": [2e9, 3e9, 2.5e9],
            "peak_rss_bytes": [1e8, 2e8, 2e8],
            "proc_cpu_pct": [100.0, 180.0, 150.0],
        }
    )


def test_energy_is_unavailable_with_the_reason_when_nothing_measures_it() -> None:
    tele = _cpu_only()
    manifest = {
        "gpu_unavailable": "gpu telemetry unavailable: NVML library not found",
        "cpu_energy_unavailable": "cpu energy unavailable: /sys/class/powercap does not exist",
        "mem_total_bytes": {"cpu": 16e9},
    }
    sec = energy_section(tele, _steps(), _requests(), pd.DataFrame(), manifest)
    assert sec.available is False
    assert sec.method == "unavailable"
    assert "NVML library not found" in sec.reason
    assert "powercap" in sec.reason
    assert sec.total_j is None
    assert sec.j_per_output_token is None
    assert sec.cpu.peak_rss_bytes == 2e8
    assert sec.memory["cpu"].peak_pct_of_capacity == pytest.approx(100 * 3e9 / 16e9)
    out = io.StringIO()
    Console(file=out, width=160).print(energy_table(sec))
    assert "unavailable" in out.getvalue()
    assert "NVML library not found" in out.getvalue()


def test_energy_table_renders_the_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    tele, manifest = _record(
        monkeypatch, [FakeGpu(power_w=SCHEDULE.power_w, energy_mj=SCHEDULE.energy_mj)]
    )
    sec = energy_section(tele, _steps(), _requests(), pd.DataFrame(), manifest)
    out = io.StringIO()
    Console(file=out, width=160).print(energy_table(sec))
    text = out.getvalue()
    assert "counter" in text
    assert "175 J" in text
    assert "9.211 J" in text
    assert "prefill" in text
    assert "decode" in text
    assert "idle baseline" in text


def test_counter_knots_are_its_updates_not_repeated_samples() -> None:
    # Counter updates every 100 ms at 200 W; sampled every 50 ms, every other sample repeats.
    t = np.arange(0, 1_000_000_001, 50 * MS)
    e = 200.0 * (t // (100 * MS)) * 0.1
    curve = EnergyCurve.from_counter(t, e)
    assert curve is not None
    # A 100 ms window anywhere reads 20 J, not 0 J or 40 J depending on phase.
    for a in (120 * MS, 160 * MS, 430 * MS):
        assert curve.between(np.array([a]), np.array([a + 100 * MS]))[0] == pytest.approx(20.0)


# --------------------------------------------------------------------------- the stored form

#: The energy section's JSON (and each phase's join as the roofline keeps it) for the scripted
#: runs below, as the section wrote them when it still built a dict (commit 6686e7c). A
#: summary.json written before and after the section became a record is the same file.
STORED = DATA / "energy"


def _stored_cases(monkeypatch: pytest.MonkeyPatch) -> dict[str, Energy]:
    def gpu_run(*gpus: FakeGpu) -> tuple[pd.DataFrame, dict[str, object]]:
        return _record(monkeypatch, list(gpus))

    one = FakeGpu(power_w=SCHEDULE.power_w, energy_mj=SCHEDULE.energy_mj)
    tele, man = gpu_run(one)
    ramp, ramp_man = gpu_run(FakeGpu(power_w=lambda t: 100 + 200 * t / 1e9, energy_mj=None))
    capped, capped_man = gpu_run(
        FakeGpu(
            power_w=SCHEDULE.power_w,
            energy_mj=SCHEDULE.energy_mj,
            throttle=lambda t: 0x4 | 0x1 if 600 * MS <= t < 950 * MS else 0x1,
            mem_used_bytes=lambda t: 70e9 if t >= 500 * MS else 1e9,
            gpm={10: lambda t: 30.0 if t <= 600 * MS else 71.0},
        )
    )
    half = PowerSchedule([(t, w / 2) for t, w in SCHEDULE.steps])
    two, two_man = gpu_run(
        FakeGpu(uuid="GPU-a", bus_id="00000000:1B:00.0", power_w=SCHEDULE.power_w,
                energy_mj=SCHEDULE.energy_mj),
        FakeGpu(uuid="GPU-b", bus_id="00000000:2B:00.0", power_w=half.power_w,
                energy_mj=half.energy_mj),
    )  # fmt: skip
    cpu_only = _cpu_only()
    cpu_man = {
        "gpu_unavailable": "gpu telemetry unavailable: NVML library not found",
        "cpu_energy_unavailable": "cpu energy unavailable: no powercap",
        "mem_total_bytes": {"cpu": 16e9},
    }
    none = pd.DataFrame()
    return {
        "steps_counter": energy_section(
            tele, _steps(), _requests(), none, man, tdp_w=700.0, mem_capacity_bytes=80e9
        ),
        "concurrency": energy_section(tele, none, _requests(), none, man),
        "integrated": energy_section(ramp, _steps(), _requests(), none, ramp_man),
        "throttle_gpm": energy_section(
            capped, _steps(), _requests(), none, capped_man, mem_capacity_bytes=140e9
        ),
        "two_gpus": energy_section(two, _steps(), _requests(), none, two_man),
        "unavailable": energy_section(cpu_only, _steps(), _requests(), none, cpu_man),
        "no_window": energy_section(none, none, none, none, None),
    }


def test_the_energy_record_writes_the_json_the_dict_section_wrote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cases = _stored_cases(monkeypatch)
    assert sorted(cases) == sorted(p.stem for p in STORED.glob("*.json"))
    for name, sec in cases.items():
        text = json.dumps(
            {
                "energy": sec.to_dict(),
                "join": {k: p.roofline_join() for k, p in sec.phases.items()},
            },
            indent=1,
        )
        assert text == (STORED / f"{name}.json").read_text(), name
        # Every key is a field: nothing the section writes is left to ``extra``.
        assert not sec.extra and all(not p.extra for p in sec.phases.values()), name
        # And the stored form reads back into the same record.
        assert Energy.from_dict(json.loads(text)["energy"]) == sec, name
