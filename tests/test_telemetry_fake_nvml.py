"""The NVML sampler against a scripted NVML at the pynvml binding layer (no GPU here)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from perfscope.errors import NVMLError, UsageError
from perfscope.profiler.clock import ManualClock, MonotonicClock
from perfscope.profiler.records import TELEMETRY_SCHEMA
from perfscope.profiler.telemetry import TelemetryConfig, start_telemetry
from perfscope.profiler.telemetry import gpu as gpu_mod
from perfscope.profiler.telemetry.nvml import NVMLNotSupportedError, call
from perfscope.profiler.telemetry.testing import FakeGpu, FakeNvml, PowerSchedule

MS = 1_000_000


def _cfg(**kw: object) -> TelemetryConfig:
    base: dict[str, object] = {"baseline_s": 0.0, "cpu": False}
    base.update(kw)
    return TelemetryConfig(**base)


def _drive(session: object, clock: ManualClock, n: int, step_ns: int = 10 * MS) -> None:
    for _ in range(n):
        clock.advance_ns(step_ns)
        session.sample_once()  # type: ignore[attr-defined]


def test_sampler_records_scripted_power_energy_and_memory_in_si_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock()
    sched = PowerSchedule([(0, 100.0), (200 * MS, 300.0)])
    gpu = FakeGpu(
        power_w=sched.power_w,
        energy_mj=sched.energy_mj,
        mem_used_bytes=lambda t: 1e9 + t,  # grows 1 byte per ns
        throttle=lambda t: 0x4 if t >= 200 * MS else 0,
    )
    fake = FakeNvml([gpu], clock.now_ns)
    fake.install(monkeypatch)
    s = start_telemetry(clock, _cfg(), background=False)
    _drive(s, clock, 40)
    df = s.stop().to_pandas()

    assert df.columns.tolist() == TELEMETRY_SCHEMA.names
    assert set(df["device"]) == {"gpu0"}
    at = df.set_index("t")
    assert at.loc[100 * MS, "power_w"] == pytest.approx(100.0)
    assert at.loc[300 * MS, "power_w"] == pytest.approx(300.0)
    # energy_j counts from the sampler's start, not from the driver's load (offset removed).
    assert at.loc[0, "energy_j"] == 0.0
    assert at.loc[200 * MS, "energy_j"] == pytest.approx(20.0)
    assert at.loc[400 * MS, "energy_j"] == pytest.approx(20.0 + 60.0)
    assert at.loc[300 * MS, "mem_used_bytes"] == pytest.approx(1e9 + 300 * MS)
    assert at.loc[300 * MS, "throttle"] == 0x4
    assert at.loc[100 * MS, "throttle"] == 0
    assert at.loc[300 * MS, "sm_clock_mhz"] == 1980.0
    assert fake.init_calls == 1
    assert fake.shutdown_calls == 1

    info = s.manifest_info()
    dev = info["gpu"]["devices"]["gpu0"]
    assert info["power_method"]["gpu0"] == "instant"
    assert info["power_limits_w"]["gpu0"] == 700.0
    assert info["max_clocks_mhz"]["gpu0"] == {"sm": 1980.0, "mem": 3201.0}
    assert dev["supported"]["memory"] == "nvmlDeviceGetMemoryInfo v2"
    assert "gpu_unavailable" not in info


def test_unsupported_fields_are_detected_once_and_never_polled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock()
    gpu = FakeGpu(
        architecture=7,  # Ampere: GPM needs Hopper
        unsupported={
            "power_instant",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetTemperatureV",
            "memory_v2",
        },
    )
    fake = FakeNvml([gpu], clock.now_ns)
    fake.install(monkeypatch)
    s = start_telemetry(clock, _cfg(), background=False)
    _drive(s, clock, 25)
    df = s.stop().to_pandas()
    info = s.manifest_info()["gpu"]["devices"]["gpu0"]

    # Probed once at open, never again while sampling.
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 1
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1
    assert "energy" in info["unsupported"]
    assert "Not Supported" in info["unsupported"]["energy"]
    assert "utilization" in info["unsupported"]
    assert "gpm" in info["unsupported"]
    assert "Hopper" in info["unsupported"]["gpm"]
    # Fallbacks are used and named.
    assert info["power_method"] == "power_usage_1s_average"
    assert "1 s average" in info["supported"]["power"]
    assert info["supported"]["temperature"] == "nvmlDeviceGetTemperature"
    assert info["supported"]["memory"].startswith("nvmlDeviceGetMemoryInfo v1")
    assert df["energy_j"].isna().all()
    assert df["util_pct"].isna().all()
    assert df["power_w"].notna().all()
    assert df["temp_c"].notna().all()


def test_field_failing_mid_run_is_dropped_after_repeated_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock()
    gpu = FakeGpu(fail_after={"nvmlDeviceGetUtilizationRates": 10})
    fake = FakeNvml([gpu], clock.now_ns)
    fake.install(monkeypatch)
    s = start_telemetry(clock, _cfg(), background=False)
    _drive(s, clock, 30)
    df = s.stop().to_pandas()
    info = s.manifest_info()["gpu"]["devices"]["gpu0"]
    assert df["util_pct"].notna().sum() == 9  # 10 good calls, the first was the probe
    assert "stopped after 5 consecutive failures" in info["unsupported"]["utilization"]
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 15
    assert df["power_w"].notna().all()  # the other fields keep going


def test_zero_power_readings_are_dropped_not_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    gpu = FakeGpu(power_w=lambda t: 0.0 if (t // (10 * MS)) % 2 else 150.0)
    FakeNvml([gpu], clock.now_ns).install(monkeypatch)
    s = start_telemetry(clock, _cfg(), background=False)
    _drive(s, clock, 10)
    df = s.stop().to_pandas()
    assert (df["power_w"].dropna() == 150.0).all()
    assert df["power_w"].isna().sum() == 5
    assert s.manifest_info()["gpu"]["devices"]["gpu0"]["zero_power_readings_dropped"] == 5


def test_energy_counter_reset_by_a_driver_reload_keeps_counting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock()

    def counter(t: int) -> int:  # 100 W; the driver reloads at 50 ms and restarts from 0
        return 5_000_000 + t // 10_000 if t < 50 * MS else (t - 50 * MS) // 10_000

    FakeNvml([FakeGpu(energy_mj=counter)], clock.now_ns).install(monkeypatch)
    s = start_telemetry(clock, _cfg(), background=False)
    _drive(s, clock, 10)
    df = s.stop().to_pandas().set_index("t")
    assert df.loc[40 * MS, "energy_j"] == pytest.approx(4.0)
    # At 60 ms the counter reads 1 J since the reload: 4 J before + 1 J after (the 10 ms
    # straddling the reload is lost, never invented).
    assert df.loc[60 * MS, "energy_j"] == pytest.approx(5.0)
    assert df.loc[100 * MS, "energy_j"] == pytest.approx(9.0)
    assert s.manifest_info()["gpu"]["devices"]["gpu0"]["energy_counter_resets"] == 1


def test_multi_gpu_each_gpu_gets_its_own_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    gpus = [
        FakeGpu(
            uuid=f"GPU-{i}1111111-2222-3333-4444-555555555555",
            bus_id=f"00000000:{0x1B + i:02X}:00.0",
            power_w=lambda t, w=100.0 * (i + 1): w,
        )
        for i in range(3)
    ]
    FakeNvml(gpus, clock.now_ns).install(monkeypatch)
    s = start_telemetry(clock, _cfg(), background=False)
    _drive(s, clock, 5)
    df = s.stop().to_pandas()
    assert df.groupby("device")["power_w"].mean().to_dict() == {
        "gpu0": 100.0,
        "gpu1": 200.0,
        "gpu2": 300.0,
    }
    assert len(df) == 3 * 6


def test_gpus_are_matched_by_pci_bus_order_and_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock()
    # NVML enumerates them out of PCI order; CUDA (PCI_BUS_ID order) sees bus 1B first.
    gpus = [
        FakeGpu(uuid="GPU-bbbb", bus_id="00000000:2B:00.0", power_w=lambda t: 200.0),
        FakeGpu(uuid="GPU-aaaa", bus_id="00000000:1B:00.0", power_w=lambda t: 100.0),
    ]
    FakeNvml(gpus, clock.now_ns).install(monkeypatch)

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    s = start_telemetry(clock, _cfg(), background=False)
    df = s.stop().to_pandas()
    assert df["device"].unique().tolist() == ["gpu0"]
    assert df["power_w"].iloc[0] == 200.0  # CUDA device 0 of this process is bus 2B
    dev = s.manifest_info()["gpu"]["devices"]["gpu0"]
    assert dev["nvml_index"] == 0
    assert dev["pci_bus_id"] == "00000000:2B:00.0"

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa")
    s = start_telemetry(clock, _cfg(), background=False)
    assert s.stop().to_pandas()["power_w"].iloc[0] == 100.0

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    s = start_telemetry(clock, _cfg(gpus=[1]), background=False)
    df = s.stop().to_pandas()
    assert df["device"].unique().tolist() == ["gpu1"]
    assert df["power_w"].iloc[0] == 200.0


def test_gpus_are_matched_to_cuda_devices_by_uuid_when_cuda_runs_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock()
    gpus = [
        FakeGpu(uuid="GPU-aaaa", bus_id="00000000:1B:00.0", power_w=lambda t: 100.0),
        FakeGpu(uuid="GPU-bbbb", bus_id="00000000:2B:00.0", power_w=lambda t: 200.0),
    ]
    FakeNvml(gpus, clock.now_ns).install(monkeypatch)
    # The CUDA runtime is absent here; stand in for torch's view: CUDA 0 is NVML 1.
    monkeypatch.setattr(
        gpu_mod, "_cuda_identities", lambda: [(0, "gpu-bbbb", None), (1, "gpu-aaaa", None)]
    )
    s = start_telemetry(clock, _cfg(cuda_memory=True, gpus=[0]), background=False)
    df = s.stop().to_pandas()
    assert df["device"].unique().tolist() == ["gpu0"]
    assert df["power_w"].iloc[0] == 200.0
    assert s.manifest_info()["gpu"]["devices"]["gpu0"]["matched_by"] == "uuid"


def test_asking_for_an_invisible_gpu_is_a_usage_error_and_releases_nvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock()
    fake = FakeNvml([FakeGpu()], clock.now_ns)
    fake.install(monkeypatch)
    with pytest.raises(UsageError, match=r"GPU 3 is not visible .*gpu0"):
        start_telemetry(clock, _cfg(gpus=[3]), background=False)
    assert fake.init_calls == fake.shutdown_calls == 1


def test_gpm_metrics_are_sampled_on_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    gpu = FakeGpu(
        architecture=9,
        gpm={10: lambda t: 71.0, 5: lambda t: 40.0, 3: lambda t: 25.0, 2: lambda t: 90.0},
    )
    fake = FakeNvml([gpu], clock.now_ns)
    fake.install(monkeypatch)
    s = start_telemetry(clock, _cfg(), background=False)
    _drive(s, clock, 3)
    df = s.stop().to_pandas()
    assert (df["dram_bw_util_pct"] == 71.0).all()
    assert (df["tensor_util_pct"] == 40.0).all()
    assert (df["sm_occupancy_pct"] == 25.0).all()
    assert (df["sm_util_pct"] == 90.0).all()
    assert fake.calls["nvmlGpmSampleAlloc"] == fake.calls["nvmlGpmSampleFree"] == 2


def test_lost_gpu_stops_its_sampling_but_not_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    FakeNvml([FakeGpu(lost_after_s=0.05)], clock.now_ns).install(monkeypatch)
    s = start_telemetry(clock, _cfg(cpu=True), background=False)
    _drive(s, clock, 10)
    df = s.stop().to_pandas()
    gpu_rows = df[df["device"] == "gpu0"]
    assert len(gpu_rows) == 5
    assert gpu_rows["power_w"].notna().all()
    assert (df["device"] == "cpu").sum() == 11
    assert "GPU is lost" in s.manifest_info()["gpu"]["devices"]["gpu0"]["lost"]


def test_idle_baseline_is_sampled_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    sched = PowerSchedule([(0, 80.0), (500 * MS, 400.0)])
    FakeNvml([FakeGpu(power_w=sched.power_w, energy_mj=sched.energy_mj)], clock.now_ns).install(
        monkeypatch
    )
    s = start_telemetry(clock, _cfg(baseline_s=0.5, interval_s=0.05), background=False)
    assert clock.now_ns() == 500 * MS  # start_telemetry sampled for the baseline first
    s.stop()
    info = s.manifest_info()
    assert info["idle_baseline_w"] == {"gpu0": pytest.approx(80.0)}
    assert info["idle_baseline"]["per_device"]["gpu0"]["method"] == "counter"


def test_background_thread_samples_at_the_configured_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = MonotonicClock()
    FakeNvml([FakeGpu(energy_mj=lambda t: t // 10_000)], clock.now_ns).install(monkeypatch)
    s = start_telemetry(clock, _cfg(interval_s=0.02))
    time.sleep(0.5)
    df = s.stop().to_pandas()
    assert s.stop() is s.stop()  # idempotent
    gaps = np.diff(df["t"].to_numpy()) / 1e9
    assert 15 <= len(df) <= 30
    assert np.median(gaps) == pytest.approx(0.02, abs=0.005)
    # energy_j is on the same clock: 100 W scripted → ΔE/Δt = 100 W.
    e = df["energy_j"].to_numpy()
    t = df["t"].to_numpy()
    assert (e[-1] - e[0]) / ((t[-1] - t[0]) / 1e9) == pytest.approx(100.0, rel=0.05)


def test_buffer_stays_bounded_by_halving_and_slowing_down(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    sched = PowerSchedule([(0, 250.0)])
    FakeNvml([FakeGpu(power_w=sched.power_w, energy_mj=sched.energy_mj)], clock.now_ns).install(
        monkeypatch
    )
    s = start_telemetry(clock, _cfg(max_rows=64), background=False)
    _drive(s, clock, 500)
    df = s.stop().to_pandas()
    info = s.manifest_info()
    assert len(df) <= 64
    assert info["decimations"] >= 3
    assert info["effective_interval_s"] == pytest.approx(0.05 * 2 ** info["decimations"])
    # The counter is cumulative, so thinning loses no energy.
    assert df["t"].is_monotonic_increasing
    last = df.iloc[-1]
    assert last["energy_j"] == pytest.approx(250.0 * last["t"] / 1e9)


def test_nvml_errors_map_to_one_exception_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    FakeNvml([FakeGpu(unsupported={"nvmlDeviceGetPowerUsage"})], clock.now_ns).install(monkeypatch)
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(NVMLNotSupportedError) as exc_info:
        call("nvmlDeviceGetPowerUsage", h)
    assert isinstance(exc_info.value, NVMLError)
    assert exc_info.value.code == 3
    assert isinstance(exc_info.value.__cause__, pynvml.NVMLError_NotSupported)


def test_telemetry_table_round_trips_through_parquet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    import pyarrow.parquet as pq

    clock = ManualClock()
    FakeNvml([FakeGpu(energy_mj=lambda t: t // 10_000)], clock.now_ns).install(monkeypatch)
    s = start_telemetry(clock, _cfg(cpu=True), background=False)
    _drive(s, clock, 3)
    path = f"{tmp_path}/telemetry.parquet"
    pq.write_table(s.stop(), path)
    back = pq.read_table(path)
    assert back.schema.equals(TELEMETRY_SCHEMA)
    df = back.to_pandas()
    assert isinstance(df, pd.DataFrame)
    assert set(df["device"]) == {"gpu0", "cpu"}
