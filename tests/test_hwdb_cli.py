"""``perfscope hw list/show/detect/calibrate`` through their argparse registration."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from perfscope.cli.hw import register
from perfscope.errors import UnknownDeviceError, UsageError

DATA = Path(__file__).parent / "data" / "hwdb"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PERFSCOPE_HWDB", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML here: the CPU is the device


def run(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    buf = io.StringIO()
    code = args.handler(args, Console(file=buf, width=200))
    return code, buf.getvalue()


def test_list_shows_at_least_35_devices(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["hw", "list"])
    assert code == 0
    assert "h100-sxm5-80gb" in out
    assert "tpu-v6e" in out
    assert "apple-m4-max" in out
    code, _ = run(["hw", "list", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert len(data["devices"]) >= 35
    assert data["errors"] == []


def test_list_filters_by_vendor_and_kind(capsys: pytest.CaptureFixture[str]) -> None:
    run(["hw", "list", "--vendor", "google", "--json"])
    devices = json.loads(capsys.readouterr().out)["devices"]
    assert devices
    assert {d["vendor"] for d in devices} == {"google"}
    run(["hw", "list", "--kind", "cpu", "--json"])
    assert {d["kind"] for d in json.loads(capsys.readouterr().out)["devices"]} == {"cpu"}


def test_show_accepts_a_raw_nvml_name_and_prints_sources(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(["hw", "show", "NVIDIA A100-SXM4-80GB"])
    assert code == 0
    assert "a100-sxm4-80gb" in out
    assert "2039 GB/s" in out
    assert "stas00/ml-engineering" in out
    run(["hw", "show", "h100", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["peak_flops"]["bf16"] == pytest.approx(989.4e12)
    assert data["extra"]["fields"]["dense.bf16"]["sources"]


def test_show_marks_sparse_peaks() -> None:
    _, out = run(["hw", "show", "h100"])
    assert "sparse.bf16 (sparse, not a ceiling)" in out


def test_show_unknown_device_is_a_usage_error_with_suggestions() -> None:
    with pytest.raises(UnknownDeviceError) as info:
        run(["hw", "show", "rtx 4080"])
    assert isinstance(info.value, UsageError)
    assert "rtx-4090" in info.value.suggestions


def test_show_reads_user_overlays() -> None:
    code, out = run(["hw", "show", "lab accel", "--hwdb-dir", str(DATA / "overlay")])
    assert code == 0
    assert "Lab Accelerator One" in out
    with pytest.raises(UsageError, match="no such directory"):
        run(["hw", "list", "--hwdb-dir", str(DATA / "does-not-exist")])


def test_calibrate_then_detect_report_measured_cpu_ceilings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(["hw", "calibrate", "--quick"])
    assert code == 0
    assert "matmul fp32" in out
    assert "memory bandwidth" in out
    assert "measured" in out
    run(["hw", "detect", "--json"])
    det = json.loads(capsys.readouterr().out)
    assert det["kind"] == "cpu"
    assert det["ceilings"]["source"] == "calibrated"
    assert det["ceilings"]["extra"]["calibration"]["from_cache"] is True
    code, out = run(["hw", "detect"])
    assert code == 0
    assert "calibrated" in out
    assert "matmul bf16" in out
    run(["hw", "calibrate", "--quick", "--json"])
    cal = json.loads(capsys.readouterr().out)
    assert cal["from_cache"] is True
    assert cal["peak_flops"]["fp32"] > 0


def test_detect_without_calibration_does_not_measure(capsys: pytest.CaptureFixture[str]) -> None:
    run(["hw", "detect", "--no-calibrate", "--json"])
    det = json.loads(capsys.readouterr().out)
    assert det["kind"] == "cpu"
    assert det["ceilings"] is None
