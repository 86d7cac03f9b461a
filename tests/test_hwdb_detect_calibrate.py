"""Detection of the local device and measured (calibrated) ceilings on this machine."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import types
from pathlib import Path

import pytest

from perfscope.errors import UnknownDeviceError
from perfscope.hwdb import (
    cached_calibration,
    calibrate,
    detect_local_device,
    resolve_device,
)
from perfscope.hwdb._detect import cpu_model_name


def _fake_pynvml(names: list[str]) -> types.ModuleType:
    """Stand-in for the NVML binding (no NVIDIA driver on this machine)."""
    mod = types.ModuleType("pynvml")
    mod.nvmlInit = lambda: None  # type: ignore[attr-defined]
    mod.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: len(names)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetName = lambda h: names[h].encode()  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30)  # type: ignore[attr-defined]
    return mod


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PERFSCOPE_HWDB", raising=False)


def test_detects_nvml_gpu_and_its_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(["NVIDIA A100-SXM4-80GB"] * 8))
    det = detect_local_device()
    assert (det.kind, det.name, det.source, det.count) == (
        "gpu",
        "NVIDIA A100-SXM4-80GB",
        "nvml",
        8,
    )
    assert det.spec is not None
    assert det.spec.key == "a100-sxm4-80gb"
    spec = resolve_device(None)
    assert spec.key == "a100-sxm4-80gb"
    assert spec.source == "datasheet"


def test_unknown_gpu_is_detected_without_a_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(["NVIDIA Future GPU 9000"]))
    det = detect_local_device()
    assert det.kind == "gpu"
    assert det.spec is None
    with pytest.raises(UnknownDeviceError, match="no cached calibration"):
        resolve_device(None, calibrate_if_unknown=False)


def test_falls_back_to_the_cpu_when_nvml_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = _fake_pynvml([])

    def fail() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = fail  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    det = detect_local_device()
    assert det.kind == "cpu"
    assert det.name == cpu_model_name()[0]
    assert det.name
    assert det.cores
    assert det.cores >= 1
    assert det.mem_bytes
    assert det.mem_bytes > 2**30
    assert det.llc_bytes
    assert det.llc_bytes >= 2**20


def test_hw_argument_overrides_detection() -> None:
    assert resolve_device("NVIDIA H100 80GB HBM3").key == "h100-sxm5-80gb"
    with pytest.raises(UnknownDeviceError) as info:
        resolve_device("H1000")
    assert info.value.suggestions


def test_quick_cpu_calibration_measures_every_ceiling_and_is_cached(tmp_path: Path) -> None:
    # Behaviour only: how fast calibration runs, and whether the cache copy beats the
    # DRAM copy, depend on the machine's load; benchmarks/calibration.py measures those.
    cache = tmp_path / "calib"
    first = calibrate("cpu", quick=True, cache_dir=cache)
    assert not first.from_cache
    assert set(first.peak_flops) >= {"fp32", "bf16"}
    assert all(v > 0 for v in first.peak_flops.values())
    assert first.mem_bw_bytes_s > 0
    assert first.cache_bw_bytes_s > 0
    assert first.cache_bytes
    assert first.cache_bytes > 0
    assert first.details["copy"]["memory"]["working_set_bytes"] >= 4 * first.cache_bytes
    assert first.details["copy"]["cache"]["working_set_bytes"] <= first.cache_bytes
    assert first.fingerprint["torch_threads"] >= 1
    assert first.fingerprint["cpu_model"]
    assert first.seconds > 0

    # every ceiling comes with the spread of its trials
    assert {"fp32", "memory", "cache"} <= set(first.spread)
    assert all(0 <= v < 10 for v in first.spread.values())
    files = list((cache / "calibration").glob("*.json"))
    assert len(files) == 1
    # on a busy machine it is only provisional (see the contention test below)
    assert files[0].name.endswith("-provisional.json") == (not first.contention["cached"])
    mtime = files[0].stat().st_mtime_ns
    second = calibrate("cpu", quick=True, cache_dir=cache)
    assert second.from_cache
    assert second.peak_flops == first.peak_flops
    assert second.created_at == first.created_at
    assert files[0].stat().st_mtime_ns == mtime  # not measured again

    # a full calibration is not satisfied by a quick result
    assert cached_calibration("cpu", quick=False, cache_dir=cache) is None

    spec = second.to_device_spec()
    assert spec.source == "calibrated"
    assert spec.kind == "cpu"
    assert spec.peak_flops_for("bfloat16") == first.peak_flops["bf16"]
    assert spec.extra["calibration"]["created_at"] == first.created_at


def test_resolve_device_uses_the_cached_calibration_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: no NVML at all
    with pytest.raises(UnknownDeviceError):
        resolve_device(None, calibrate_if_unknown=False)
    measured = calibrate("cpu", quick=True)  # default cache dir = $PERFSCOPE_CACHE_DIR
    spec = resolve_device(None, calibrate_if_unknown=False)
    assert spec.source == "calibrated"
    assert spec.peak_flops == measured.peak_flops
    assert spec.extra["calibration"]["from_cache"] is True
    assert resolve_device("cpu").peak_flops == measured.peak_flops


def test_a_calibration_taken_under_contention_is_only_provisional(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex
    import subprocess

    calibrate_module = sys.modules["perfscope.hwdb.calibrate"]  # the function shadows it

    spin = "import time; end = time.time() + 25\nwhile time.time() < end: pass"
    # (stdout to /dev/null: a spinner holding the pipe would make subprocess.run wait 25 s)
    cmd = f"{sys.executable} -c {shlex.quote(spin)} >/dev/null 2>&1 & echo $!; "
    # two spinning strangers (not our children) on this machine's cores; their pids are
    # kept so they stop with the test instead of loading the tests that follow
    out = subprocess.run(["sh", "-c", cmd + cmd], check=True, capture_output=True, text=True)
    spinners = [int(x) for x in out.stdout.split()]
    try:
        cache = tmp_path / "calib"
        result = calibrate("cpu", quick=True, cache_dir=cache, retries=0)
        assert result.contention["others_share"] is not None
        assert result.contention["others_share"] > 0.15
        assert result.contention["cached"] is False
        assert "measured again" in result.details["not_cached"]
        (kept,) = (cache / "calibration").glob("*.json")
        assert kept.name.endswith("-provisional.json")
        assert result.spread  # still measured, with its spread, for this analysis
        # reused for a short while only: past its time it no longer counts as a calibration
        assert cached_calibration("cpu", quick=True, cache_dir=cache) is not None
        monkeypatch.setattr(calibrate_module, "PROVISIONAL_TTL_S", 0.0)
        assert cached_calibration("cpu", quick=True, cache_dir=cache) is None
    finally:
        for pid in spinners:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
