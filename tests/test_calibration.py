"""Advisor calibration: the measured errors of the projections are data with their source,
and every suggestion carries the one for its technique and hardware class beside an
unchanged projected gain."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from perfscope.analysis.advisor import advise
from perfscope.analysis.calibration import (
    CALIBRATION_FILE,
    SCHEMA,
    TECHNIQUES,
    calibration_for,
    load_calibration,
)
from perfscope.analysis.modelspec import ModelSpec
from perfscope.hwdb.spec import DeviceSpec
from tests.conftest import PERFSCOPE, ROOT, subprocess_env
from tests.test_advisor_suggestions import A100, _run

ENTRY_KEYS = {
    "technique",
    "hardware_class",
    "metric",
    "change",
    "projected_ratio",
    "measured_ratio",
    "interval",
    "confidence",
    "error",
    "study",
    "script",
    "write_up",
    "study_file",
    "date",
    "machine",
    "runs_per_setting",
    "cause",
}


def test_the_packaged_calibration_pins_its_schema_and_matches_the_study_write_ups() -> None:
    data = json.loads(CALIBRATION_FILE.read_text())
    assert data["schema"] == SCHEMA == "perfscope.calibration/1"
    assert data["entries"]
    for raw in data["entries"]:
        assert set(raw) == ENTRY_KEYS
    entries = load_calibration()
    assert len(entries) == len(data["entries"])
    for e in entries:
        assert e.technique in TECHNIQUES and e.hardware_class in ("cpu", "gpu")
        assert e.error == pytest.approx(e.projected_ratio / e.measured_ratio - 1, abs=5e-3)
        assert e.runs_per_setting >= 2 and 0 < e.confidence < 1
        assert (ROOT / e.script).is_file()
        # The numbers are the ones the study's write-up measured.
        lo, hi = e.interval
        row = f"| {e.metric} | {e.measured_ratio:.3f} | [{lo:.3f}, {hi:.3f}] |"
        assert row in (ROOT / e.write_up).read_text(), (e.write_up, row)
        assert e.study_file in (ROOT / e.write_up).read_text()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["entries"][0].pop("machine"), "lacks 'machine'"),
        (lambda d: d["entries"][0].update(error=0.5), "projected / measured - 1"),
        (lambda d: d["entries"][0].update(interval=[1.0]), "two positive ratios"),
        (lambda d: d["entries"][0].update(technique="magic"), "unknown technique"),
        (lambda d: d["entries"].append(dict(d["entries"][0])), "two entries for batching"),
        (lambda d: d.update(schema="other/1"), "not a perfscope.calibration/1"),
    ],
)
def test_a_malformed_calibration_file_is_refused_with_the_reason(
    tmp_path: Path, change: object, message: str
) -> None:
    data = json.loads(CALIBRATION_FILE.read_text())
    change(data)  # type: ignore[operator]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load_calibration(path)


def _cpu_twin(dev: DeviceSpec) -> DeviceSpec:
    """A CPU with the GPU's ceilings: the same projections, another hardware class."""
    return dataclasses.replace(dev, key="cpu-twin", name="CPU TWIN", vendor="amd", kind="cpu")


def test_advice_carries_the_measured_error_beside_an_unchanged_projection() -> None:
    spec = ModelSpec.from_preset("llama-2-7b")
    roof, wl = _run(spec, A100, batch=1, prompt=512, out=64, eff_prefill=0.6, eff_decode=0.6)
    on_gpu = {a["technique"]: a for a in advise(roof, spec, A100, wl)}
    on_cpu = {a["technique"]: a for a in advise(roof, spec, _cpu_twin(A100), wl)}
    batching = "larger batches / continuous batching"
    assert batching in on_gpu and batching in on_cpu
    for name in set(on_gpu) & set(on_cpu):
        assert on_cpu[name]["projected_gain"] == on_gpu[name]["projected_gain"]
        assert on_gpu[name]["calibration"]["text"] == "not calibrated on GPU"
        assert on_gpu[name]["calibration"]["calibrated"] is False

    cal = on_cpu[batching]["calibration"]
    entry = next(
        e for e in load_calibration() if e.technique == "batching" and e.metric == "output_tok_s"
    )
    assert cal["calibrated"] and cal["significant"] is True
    assert cal["error"] == entry.error
    assert cal["text"].startswith("on CPU our projections for batching were off by +82%")
    assert "batch-size study" in cal["text"] and "3 runs per setting" in cal["text"]
    assert entry.date in cal["text"]
    assert cal["source"]["machine"] == entry.machine
    assert cal["source"]["interval"] == list(entry.interval)

    int8 = on_cpu["int8 weights (W8A16)"]["calibration"]
    assert int8["calibrated"] and int8["significant"] is False
    assert "not significant: the measured interval includes 1" in int8["text"]
    int4 = next(a for n, a in on_cpu.items() if n.startswith("int4"))["calibration"]
    assert int4["text"] == "not calibrated on CPU for int4 weights (no study measured it)"


def test_calibration_for_an_unknown_technique_says_it_is_not_calibrated() -> None:
    c = calibration_for("something new", "cpu", "tpot_s")
    assert c.technique is None and not c.calibrated and c.error is None
    assert c.text == "not calibrated on CPU for something new (no study measured it)"


def test_a_cpu_run_shows_the_calibration_in_the_terminal_and_the_html_report(
    tmp_path: Path,
) -> None:
    common = ["--runs-dir", str(tmp_path), "--requests", "3", "--warmup", "0"]
    out = subprocess.run(
        [
            *PERFSCOPE,
            "run",
            "--model-preset",
            "tiny",
            "--batch-size",
            "1",
            "--prompt-len",
            "8",
            "--output-len",
            "4",
            "--hw",
            "epyc-9654",
            "--no-telemetry",
            *common[:2],
            *common[2:],
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(COLUMNS="200"),
    )
    assert out.returncode == 0, out.stderr
    run_dir = next(p for p in tmp_path.iterdir() if (p / "summary.json").is_file())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["advice"], "an overhead-bound tiny run gets advice"
    texts = [a["calibration"]["text"] for a in summary["advice"]]
    assert all(t.startswith(("on CPU", "not calibrated on CPU")) for t in texts)
    assert "calibration: " in out.stdout
    report = tmp_path / "r.html"
    rep = subprocess.run(
        [*PERFSCOPE, "report", str(run_dir), "-o", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    assert rep.returncode == 0, rep.stderr
    html = report.read_text()
    assert "calibration (measured by our studies)" in html
    assert texts[0].split(" (")[0] in html
