"""User overlays add and override devices; broken files are reported and skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.errors import HardwareDatabaseError
from perfscope.hwdb import DeviceFileError, load_database, lookup, resolve_device

DATA = Path(__file__).parent / "data" / "hwdb"


@pytest.fixture(autouse=True)
def _no_env_overlay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERFSCOPE_HWDB", raising=False)


def test_overlay_overrides_one_field_and_keeps_the_rest() -> None:
    db = load_database([DATA / "overlay"])
    assert db.errors == []
    h100 = db.lookup("NVIDIA H100 80GB HBM3")
    assert h100.mem_bw_bytes_s == pytest.approx(3.0e12)
    assert h100.extra["fields"]["memory.bandwidth"]["sources"] == ["our lab measurement, 2026-11"]
    assert h100.peak_flops["bf16"] == pytest.approx(989.4e12)  # untouched built-in value
    assert db.lookup("our-h100").key == "h100-sxm5-80gb"  # added alias
    assert db.lookup("h100-sxm").key == "h100-sxm5-80gb"  # built-in aliases kept
    assert len(h100.extra["files"]) == 2


def test_overlay_adds_a_new_device_with_default_sources() -> None:
    spec = lookup("ACME LabAccel 1 (rev B)", user_dirs=[DATA / "overlay"])
    assert spec.key == "lab-accel-1"
    assert spec.kind == "npu"
    assert spec.peak_flops["bf16"] == pytest.approx(0.5e15)
    assert spec.mem_bw_bytes_s == pytest.approx(2.5e12)
    assert spec.mem_bytes == pytest.approx(64 * 2**30)
    src = spec.extra["fields"]["dense.bf16"]["sources"][0]
    assert src.startswith("user file ")
    assert src.endswith("lab-accel.toml")


def test_later_overlay_wins_and_argument_dirs_beat_env_dirs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = load_database([DATA / "overlay", DATA / "overlay2"])
    assert db.lookup("h100").mem_bw_bytes_s == pytest.approx(3.1e12)
    monkeypatch.setenv("PERFSCOPE_HWDB", str(DATA / "overlay2"))
    db = load_database([DATA / "overlay"])  # env first, then the argument
    assert db.lookup("h100").mem_bw_bytes_s == pytest.approx(3.0e12)
    assert db.user_dirs == [DATA / "overlay2", DATA / "overlay"]


def test_env_overlay_is_used_by_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFSCOPE_HWDB", str(DATA / "overlay"))
    assert resolve_device("lab accel").key == "lab-accel-1"


def test_builtin_database_is_unchanged_without_overlays() -> None:
    assert load_database().lookup("h100").mem_bw_bytes_s == pytest.approx(3.35e12)


def _errors_by_file(db) -> dict[str, DeviceFileError]:  # type: ignore[no-untyped-def]
    out = {}
    for err in db.errors:
        assert isinstance(err, HardwareDatabaseError)
        assert isinstance(err, DeviceFileError)
        out[err.path.name] = err
    return out


def test_malformed_files_are_reported_by_file_and_field_and_the_rest_loads() -> None:
    db = load_database([DATA / "malformed"])
    errors = _errors_by_file(db)
    assert set(errors) == {
        "bad-syntax.toml",
        "missing-bandwidth.toml",
        "bad-unit.toml",
        "bad-value.toml",
        "alias-clash.toml",
        "z-duplicate-of-good.toml",
        "unknown-source.toml",
    }
    assert "not valid TOML" in str(errors["bad-syntax.toml"])
    assert errors["missing-bandwidth.toml"].field == "memory.bandwidth"
    assert "required" in str(errors["missing-bandwidth.toml"])
    assert errors["bad-unit.toml"].field == "memory.bandwidth"
    assert "'W' is not a bandwidth unit" in str(errors["bad-unit.toml"])
    assert "must be a number" in str(errors["bad-value.toml"])
    assert "bad-value.toml" in str(errors["bad-value.toml"])
    assert "h100-sxm5-80gb" in str(errors["alias-clash.toml"])
    assert "duplicate key 'good-device'" in str(errors["z-duplicate-of-good.toml"])
    assert "unknown source key(s) 'DS'" in str(errors["unknown-source.toml"])
    # the valid file and the whole bundled database still load
    assert db.lookup("good-device").mem_bw_bytes_s == pytest.approx(1e12)
    assert db.lookup("NVIDIA H100 80GB HBM3").key == "h100-sxm5-80gb"
    assert "fake-h100" not in db.devices


def test_bundled_files_require_sources(tmp_path: Path) -> None:
    from perfscope.hwdb._schema import entry_from_document

    doc = {
        "key": "x",
        "name": "X",
        "vendor": "acme",
        "kind": "gpu",
        "memory": {"bandwidth": {"value": 1, "unit": "TB/s"}},
        "dense": {"bf16": {"value": 1, "unit": "TFLOPS", "source": "https://example.com"}},
    }
    with pytest.raises(DeviceFileError) as info:
        entry_from_document(doc, tmp_path / "x.toml")
    assert info.value.field == "memory.bandwidth"
    assert "missing 'source'" in str(info.value)


def test_unknown_fields_and_dtypes_are_rejected(tmp_path: Path) -> None:
    (tmp_path / "typo.toml").write_text(
        'key = "typo"\nname = "Typo"\nvendor = "acme"\nkind = "gpu"\n'
        '[memory]\nbandwith = { value = 1, unit = "TB/s" }\n'
        'bandwidth = { value = 1, unit = "TB/s" }\n'
        '[dense]\nbf17 = { value = 1, unit = "TFLOPS" }\nbf16 = { value = 1, unit = "TFLOPS" }\n'
    )
    db = load_database([tmp_path])
    (err,) = db.errors
    assert "memory.bandwith" in str(err)
    assert "dense.bf17" in str(err)
    assert "typo" not in db.devices


def test_missing_overlay_directory_is_an_error_not_a_crash(tmp_path: Path) -> None:
    db = load_database([tmp_path / "nope"])
    assert len(db.errors) == 1
    assert "does not exist" in str(db.errors[0])
    assert len(db.devices) >= 35


def test_extends_creates_a_variant_of_a_builtin_device(tmp_path: Path) -> None:
    (tmp_path / "h100-capped.toml").write_text(
        'key = "h100-capped"\nname = "H100 SXM at 500 W"\nextends = "h100-sxm5-80gb"\n'
        '[power]\ntdp = { value = 500, unit = "W", source = "nvidia-smi -pl 500" }\n'
    )
    db = load_database([tmp_path])
    assert db.errors == []
    spec = db.lookup("h100-capped")
    assert spec.tdp_w == 500
    assert spec.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert db.lookup("h100").key == "h100-sxm5-80gb"  # aliases stay with the original
