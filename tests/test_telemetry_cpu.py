"""Host telemetry on this machine (real psutil, real reference engine) and RAPL from sysfs files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import pytest

from perfscope.analysis.energy import energy_section
from perfscope.errors import UsageError
from perfscope.profiler.clock import ManualClock, MonotonicClock
from perfscope.profiler.telemetry import (
    MIN_INTERVAL_S,
    TelemetryConfig,
    parse_gpus,
    start_telemetry,
)
from perfscope.profiler.telemetry.cpu import RaplReader


def _reference_run(clock: MonotonicClock) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    from perfscope.profiler.driver import Driver, LoadConfig
    from perfscope.profiler.engines.base import EngineOptions, Inbox, create_engine
    from perfscope.profiler.recorder import Recorder
    from perfscope.profiler.workload import LengthDist, WorkloadConfig, build_workload

    specs = build_workload(
        WorkloadConfig(
            requests=4,
            prompt_len=LengthDist("constant", 64),
            output_len=LengthDist("constant", 40),
        )
    )
    engine = create_engine(
        "reference", EngineOptions(model_preset="small", batch_size=4, max_seq_len=104)
    )
    recorder = Recorder(clock)
    inbox = Inbox()
    driver = Driver(specs, LoadConfig(), inbox, recorder)
    driver.start()
    engine.serve(inbox, recorder)
    driver.join()
    engine.close()
    return (
        recorder.steps_table().to_pandas(),
        recorder.requests_table().to_pandas(),
        recorder.chunks_table().to_pandas(),
    )


def test_cpu_sampler_traces_a_reference_engine_run_on_this_machine() -> None:
    clock = MonotonicClock()
    session = start_telemetry(clock, TelemetryConfig(interval_s=0.05, baseline_s=0.0))
    try:
        steps, requests, chunks = _reference_run(clock)
    finally:
        table = session.stop()
    tele = table.to_pandas()
    info = session.manifest_info()
    cpu = tele[tele["device"] == "cpu"]
    assert len(cpu) >= 5
    assert cpu["t"].is_monotonic_increasing
    # Plausible values: RSS of a Python+torch process is tens of MB to a few GB; this process
    # keeps the model, so its RSS is at least the fp32 weights (~79 MB for "small").
    assert (cpu["rss_bytes"] > 80e6).all()
    assert (cpu["rss_bytes"] < 16e9).all()
    assert (cpu["peak_rss_bytes"] >= cpu["rss_bytes"]).all()
    assert cpu["peak_rss_bytes"].is_monotonic_increasing
    assert cpu["util_pct"].between(0, 100).all()
    # The engine computes the whole time: this process used CPU (how much of a core it got
    # depends on what else the machine runs).
    assert cpu["proc_cpu_pct"].iloc[1:].median() > 0.0
    total = info["cpu"]["mem_total_bytes"]
    assert (cpu["mem_used_bytes"] > 0).all()
    assert (cpu["mem_used_bytes"] < total).all()
    # The telemetry clock is the run clock: samples span the steps.
    assert cpu["t"].min() <= steps["t_start"].min()
    assert cpu["t"].max() >= steps["t_end"].max()

    # No NVIDIA driver here: honest "unavailable", never invented numbers.
    assert info["gpu_unavailable"].startswith("gpu telemetry unavailable: NVML library not found")
    sec = energy_section(tele, steps, requests, chunks, info)
    assert sec.available is False
    assert sec.method == "unavailable"
    assert "NVML library not found" in sec.reason
    assert sec.cpu.sampled
    assert sec.cpu.peak_rss_bytes > 80e6
    assert sec.cpu.avg_process_cpu_pct > 0.0


def test_gpu_absence_is_reported_with_the_reason() -> None:
    session = start_telemetry(ManualClock(), TelemetryConfig(baseline_s=1.0), background=False)
    session.stop()
    info = session.manifest_info()
    assert info["gpu"]["available"] is False
    assert "NVML library not found" in info["gpu"]["reason"]
    assert info["devices"] == ["cpu"]
    # No power sensor at all here, so no idle baseline was waited for.
    assert "skipped" in info["idle_baseline"]


def test_interval_below_the_sensor_period_is_refused() -> None:
    with pytest.raises(UsageError, match=r"below 20 ms.*sensors"):
        start_telemetry(ManualClock(), TelemetryConfig(interval_s=0.005))
    assert MIN_INTERVAL_S == 0.02


def test_gpu_list_parsing() -> None:
    assert parse_gpus("0,1") == [0, 1]
    assert parse_gpus(" 2 ") == [2]
    assert parse_gpus(None) is None
    assert parse_gpus("all") is None
    with pytest.raises(UsageError, match="CUDA device indices"):
        parse_gpus("0,x")
    with pytest.raises(UsageError, match="twice"):
        parse_gpus("1,1")


def _zone(root: Path, name: str, label: str, energy_uj: int, max_uj: int) -> Path:
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(label + "\n")
    (z / "energy_uj").write_text(f"{energy_uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


def test_rapl_package_and_dram_energy_with_counter_wraparound(tmp_path: Path) -> None:
    max_uj = 262_143_328_850
    pkg0 = _zone(tmp_path, "intel-rapl:0", "package-0", max_uj - 3_000_000, max_uj)
    pkg1 = _zone(tmp_path, "intel-rapl:1", "package-1", 1_000_000, max_uj)
    dram = _zone(tmp_path, "intel-rapl:0:1", "dram", 5_000_000, max_uj)
    _zone(tmp_path, "intel-rapl:0:0", "core", 0, max_uj)  # nested in the package: not added
    clock = ManualClock()
    session = start_telemetry(
        clock, TelemetryConfig(baseline_s=0.0, powercap_root=tmp_path), background=False
    )
    clock.advance_ns(100_000_000)
    # package 0 wrapped: +5 J (3 J up to the range, 2 J after); package 1 +1 J; DRAM +0.5 J.
    (pkg0 / "energy_uj").write_text("2000000\n")
    (pkg1 / "energy_uj").write_text("2000000\n")
    (dram / "energy_uj").write_text("5500000\n")
    session.sample_once()
    tele = session.stop().to_pandas()
    cpu = tele[tele["device"] == "cpu"].set_index("t")
    assert cpu.loc[0, "energy_j"] == 0.0
    assert cpu.loc[100_000_000, "energy_j"] == pytest.approx(6.0)
    assert cpu.loc[100_000_000, "power_w"] == pytest.approx(60.0)
    assert cpu.loc[100_000_000, "dram_energy_j"] == pytest.approx(0.5)
    rapl = session.manifest_info()["cpu"]["rapl"]
    assert rapl["available"]
    assert rapl["wraps"] == 1
    assert rapl["package_zones"] == ["intel-rapl:0", "intel-rapl:1"]

    # With RAPL and no GPU, the headline energy is the CPU packages', by counter.
    steps = pd.DataFrame(
        {"step_id": [0], "kind": ["decode"], "t_start": [0], "t_end": [100_000_000],
         "batch_size": [1], "new_tokens": [3], "context_tokens": [0], "request_ids": [[0]]}
    )  # fmt: skip
    sec = energy_section(tele, steps, pd.DataFrame(), pd.DataFrame(), session.manifest_info())
    assert sec.source == "cpu"
    assert sec.method == "counter"
    assert sec.total_j == pytest.approx(6.0)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of mode bits")
def test_unreadable_rapl_is_reported_not_estimated(tmp_path: Path) -> None:
    z = _zone(tmp_path, "intel-rapl:0", "package-0", 1, 10)
    (z / "energy_uj").chmod(0)
    r = RaplReader.open(tmp_path)
    assert not r.available
    assert "root" in (r.reason or "")


def test_missing_powercap_is_reported(tmp_path: Path) -> None:
    r = RaplReader.open(tmp_path / "nope")
    assert not r.available
    assert "does not exist" in (r.reason or "")


def test_sampler_thread_costs_little_cpu() -> None:
    session = start_telemetry(MonotonicClock(), TelemetryConfig(baseline_s=0.0, interval_s=0.02))
    time.sleep(0.4)
    session.stop()
    cost = session.manifest_info()["sampler_cost"]
    # ~0.1 ms of CPU per round here; a generous bound that still catches a pathological loop.
    assert cost["cpu_mean_us"] < 5000
