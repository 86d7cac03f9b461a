"""Advisor calibration: generated from stored studies (never typed), keyed by machine class,
and every suggestion carries the entry of its technique and machine class beside an
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
    CalibrationEntry,
    MachineClass,
    build_calibration,
    calibration_document,
    calibration_for,
    load_calibration,
    technique_of_change,
)
from perfscope.analysis.modelspec import ModelSpec
from perfscope.api.study import APPLIES
from perfscope.cli.advisor import load_studies, table_text, with_table
from perfscope.hwdb.spec import DeviceSpec
from tests.conftest import PERFSCOPE, ROOT, subprocess_env
from tests.test_advisor_suggestions import A100, _run

STUDIES = ROOT / "samples" / "studies" / "results"


def test_the_packaged_calibration_is_the_rebuild_of_the_stored_studies() -> None:
    """Generated, never typed: rebuilding from the stored study JSON gives the file."""
    studies = load_studies([STUDIES])
    assert studies, "the repository stores the studies its calibration comes from"
    entries = build_calibration(studies, root=ROOT)
    assert json.loads(CALIBRATION_FILE.read_text()) == calibration_document(entries)
    assert load_calibration() == tuple(entries)
    data = json.loads(CALIBRATION_FILE.read_text())
    assert data["schema"] == SCHEMA == "perfscope.calibration/2"
    for e in entries:
        assert (ROOT / e.study_file).is_file()
        assert e.technique in TECHNIQUES
        assert e.significant == (e.interval is not None and not e.interval[0] <= 1 <= e.interval[1])
        if e.error is not None and e.projected_ratio is not None:
            assert e.error == pytest.approx(e.projected_ratio / e.measured_ratio - 1, abs=1e-3)
        assert e.machine.cores and e.machine.engine  # keyed by machine class


#: Where the docs show the technique table (``perfscope advisor table --write`` keeps them).
TABLE_DOCS = (ROOT / "samples" / "studies" / "README.md", ROOT / "docs" / "projections.md")


def test_the_technique_tables_in_the_docs_are_what_the_stored_studies_give() -> None:
    """No hand-copied figure: each document's table (between the markers) is the one the
    stored studies give, median error line included."""
    text = table_text(build_calibration(load_studies([STUDIES]), root=ROOT))
    for doc in TABLE_DOCS:
        md = doc.read_text(encoding="utf-8")
        assert with_table(md, text, doc) == md, f"{doc.name}: perfscope advisor table --write"
    assert "median absolute projection error over significant effects" in text


def test_advisor_table_write_and_check_keep_a_document_in_step(tmp_path: Path) -> None:
    from perfscope.cli.advisor import TABLE_END, TABLE_START

    doc = tmp_path / "doc.md"
    doc.write_text(f"# Studies\n\n{TABLE_START}\n| typed | by hand |\n{TABLE_END}\n\nafter\n")
    one = min(STUDIES.glob("*.json"))  # any stored study: the table's rows are not the point
    run = [*PERFSCOPE, "advisor", "table", str(one), "--write", str(doc)]
    check = subprocess.run([*run, "--check"], capture_output=True, text=True, env=subprocess_env())
    assert check.returncode == 1 and "differs" in check.stdout
    wrote = subprocess.run(run, capture_output=True, text=True, env=subprocess_env())
    assert wrote.returncode == 0, wrote.stderr
    md = doc.read_text()
    assert "| typed | by hand |" not in md and md.endswith("after\n")
    assert "| technique | change | metric |" in md
    again = subprocess.run([*run, "--check"], capture_output=True, text=True, env=subprocess_env())
    assert again.returncode == 0, again.stdout
    (tmp_path / "bare.md").write_text("no markers\n")
    bare = subprocess.run(
        [*run[:-1], str(tmp_path / "bare.md")], capture_output=True, text=True, env=subprocess_env()
    )
    assert bare.returncode == 2 and "no table markers" in bare.stderr
    assert "Traceback" not in bare.stderr


def test_a_stored_study_s_projections_are_re_derived_from_the_record_alone() -> None:
    """The records keep what a projection is made from (each setting's ``inputs``: its
    first run's model, device, roofline, load and shape, the baseline's fitted cost model,
    the measured kernel calls), so the calibration re-makes every projection with the
    current model from the record alone, and gets the stored numbers back while the model
    is unchanged; a record without inputs keeps its projection."""
    from perfscope.analysis.study import rederive_study

    studies = load_studies([STUDIES])
    with_inputs = [(p, st) for p, st in studies if st.settings[0].inputs]
    assert len(with_inputs) >= 15
    for _, st in with_inputs:
        again = rederive_study(st)
        for old, new in zip(st.settings, again.settings, strict=True):
            assert [e.projected_ratio for e in new.effects] == pytest.approx(
                [e.projected_ratio for e in old.effects]
            ), f"{st.knob} {old.value}"
    older = next(st for _, st in studies if not st.settings[0].inputs)
    assert rederive_study(older) is older
    # a changed model changes what the calibration says: the fit is read from the record
    _, quant = next((p, st) for p, st in with_inputs if st.knob == "quant")
    base = dict(quant.settings[0].inputs or {})
    slower = dict(base["fit"])  # type: ignore[call-overload]
    slower["per_sequence_s"] = float(slower["per_sequence_s"]) + 1.0
    first = dataclasses.replace(quant.settings[0], inputs={**base, "fit": slower})
    moved = dataclasses.replace(quant, settings=[first, *quant.settings[1:]])
    assert rederive_study(moved).settings[1].projection != quant.settings[1].projection


def test_every_reference_engine_study_knob_is_a_calibration_technique() -> None:
    """A stored study of any reference knob calibrates a named technique; the distill study
    (layers with per-depth trained weights) is distillation, cutting a model's layers is not."""
    knobs = [k for k, engines in APPLIES.items() if "reference" in engines]
    assert {"compile", "prune-heads", "kv-paged", "kv-cache", "threads"} <= set(knobs)
    for knob in knobs:
        assert technique_of_change(knob, "1") in TECHNIQUES, knob
    assert technique_of_change("layers", "2", {"weights": "trained"}) == "distillation"
    assert technique_of_change("layers", "2", {"weights": "/models/teacher.pt"}) == "layers"
    assert technique_of_change("num-speculative-tokens", "4") == "speculative"


def test_every_entry_is_the_number_its_study_record_holds() -> None:
    for path, st in load_studies([STUDIES]):
        rel = path.relative_to(ROOT).as_posix()
        for e in (e for e in load_calibration() if e.study_file == rel):
            eff = st.effect(e.value, e.metric)
            assert eff is not None and eff.change.ratio is not None
            assert e.measured_ratio == pytest.approx(eff.change.ratio, rel=1e-3)
            if eff.change.ci is None:  # e.g. an interval the paired test could not give
                assert e.interval is None and not e.significant
            else:
                assert e.interval == pytest.approx(eff.change.ci, rel=1e-3)


def test_advisor_calibrate_rebuilds_the_file_and_check_notices_a_typed_edit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from perfscope.cli import main

    out = tmp_path / "calibration.json"
    assert main(["advisor", "calibrate", str(STUDIES), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["entries"]
    assert main(["advisor", "calibrate", str(STUDIES), "-o", str(out), "--check"]) == 0
    data = json.loads(out.read_text())
    data["entries"][0]["measured_ratio"] = 9.99  # a hand-copied figure
    out.write_text(json.dumps(data))
    assert main(["advisor", "calibrate", str(STUDIES), "-o", str(out), "--check"]) == 1
    capsys.readouterr()
    assert main(["advisor", "table", str(STUDIES)]) == 0
    text = capsys.readouterr().out
    assert "| technique | change | metric | machine | projected | speed of light " in text
    assert "median absolute projection error over significant effects" in text


def test_advisor_calibrate_without_studies_says_what_to_do(tmp_path: Path) -> None:
    out = subprocess.run(
        [*PERFSCOPE, "advisor", "calibrate", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
    )
    assert out.returncode != 0
    assert "perfscope study KNOB --values ... --save" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["entries"][0].pop("machine"), "lacks 'machine'"),
        (lambda d: d["entries"][0].update(error=5.0), "projected / measured - 1"),
        (lambda d: d["entries"][0].update(interval=[1.0]), "two positive ratios"),
        (lambda d: d["entries"][0].update(technique="magic"), "unknown technique"),
        (
            lambda d: d["entries"][0].update(significant=not d["entries"][0]["significant"]),
            "significant disagrees",
        ),
        (lambda d: d.update(schema="other/1"), "not a perfscope.calibration/2"),
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


def _cpu_twin(dev: DeviceSpec, entry: CalibrationEntry) -> DeviceSpec:
    """A CPU with the GPU's ceilings on the machine class of ``entry``."""
    fp = {"cpu_model": entry.machine.cpu_model, "cores": entry.machine.cores}
    return dataclasses.replace(
        dev,
        key="cpu-twin",
        name=f"{entry.machine.cpu_model} (calibrated)",
        vendor="amd",
        kind="cpu",
        extra={"calibration": {"fingerprint": fp}},
    )


def test_advice_quotes_the_entry_of_its_machine_class_beside_an_unchanged_projection() -> None:
    spec = ModelSpec.from_preset("llama-2-7b")
    roof, wl = _run(spec, A100, batch=1, prompt=512, out=64, eff_prefill=0.6, eff_decode=0.6)
    entry = next(
        e for e in load_calibration() if e.technique == "batching" and e.metric == "output_tok_s"
    )
    cpu = _cpu_twin(A100, entry)
    on_gpu = {a.technique: a for a in advise(roof, spec, A100, wl)}
    on_cpu = {a.technique: a for a in advise(roof, spec, cpu, wl, engine="reference")}
    batching = "larger batches / continuous batching"
    assert batching in on_gpu and batching in on_cpu
    for name in set(on_gpu) & set(on_cpu):
        assert on_cpu[name].projected_gain == on_gpu[name].projected_gain
        assert on_gpu[name].calibration.text.startswith("uncalibrated here")
        assert on_gpu[name].calibration.calibrated is False
    cal = on_cpu[batching].calibration
    assert cal.calibrated and cal.significant is entry.significant
    assert cal.error == entry.error
    assert cal.text.startswith(f"on this machine class ({entry.machine.describe()})")
    assert entry.study_file in cal.text and entry.measured_text() in cal.text
    # another engine on the same CPU is another machine class
    other = advise(roof, spec, cpu, wl, engine="hf")
    assert all(a.calibration.text.startswith("uncalibrated here") for a in other)


def test_an_error_whose_projection_lies_inside_the_measured_interval_says_so() -> None:
    """The issue's case: "off by +82%" for a significant batching entry whose projection
    (7.94x) lay inside its measured interval [1.92, 9.87]: the note says the projection is
    inside, next to the error; one outside the interval does not."""
    machine = MachineClass("AMD EPYC", 2, None, "reference")

    def entry(projected: float) -> CalibrationEntry:
        return CalibrationEntry(
            technique="batching",
            machine=machine,
            metric="output_tok_s",
            knob="batch-size",
            baseline="1",
            value="8",
            projected_ratio=projected,
            sol_ratio=3.69,
            measured_ratio=4.35,
            interval=(1.92, 9.87),
            confidence=0.95,
            significant=True,
            error=projected / 4.35 - 1,
            runs_per_setting=3,
            method="paired",
            study_file="samples/studies/results/x.json",
            created_at="2026-12-01T23:17:22+00:00",
        )

    inside = calibration_for("larger batches", machine, "decode_tok_s", [entry(7.94)])
    assert "off by +83%" in inside.text
    assert "the projection lies inside the measured interval" in inside.text
    outside = calibration_for("larger batches", machine, "decode_tok_s", [entry(12.0)])
    assert "inside" not in outside.text and outside.significant


def test_calibration_for_an_unknown_technique_says_it_is_uncalibrated_here() -> None:
    c = calibration_for("something new", MachineClass("X", 2, None, "reference"), "tpot_s")
    assert c.technique is None and not c.calibrated and c.error is None
    assert (
        c.text
        == "uncalibrated here: no stored study of something new on X, 2 cores, reference engine"
    )


@pytest.mark.slow  # about 4 s on a quiet 2-core machine
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
    assert all(t.startswith(("on this machine class", "uncalibrated here")) for t in texts)
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


def test_an_effect_with_too_few_rounds_for_an_interval_says_so_not_one_run() -> None:
    entry = dataclasses.replace(load_calibration()[0], interval=None, significant=False)
    four = dataclasses.replace(entry, runs_per_setting=4, confidence=0.95)
    assert "4 runs a setting: too few for a 95% interval" in four.measured_text()
    assert "one run a setting" in dataclasses.replace(entry, runs_per_setting=1).measured_text()


def test_one_change_measured_at_two_operating_points_keeps_both_entries(tmp_path: Path) -> None:
    """A paged KV cache won under a 1 MB budget and lost under 4 MB: the calibration keeps
    both findings, each naming its operating point, instead of letting the newer overwrite
    the other; a re-run at the same point still replaces the older record."""
    paged = sorted(STUDIES.glob("*-study-kv-paged*.json"))
    entries = build_calibration(load_studies(paged), root=ROOT)
    tput = {e.conditions: e for e in entries if e.metric == "output_tok_s"}
    assert set(tput) == {
        "kv_budget_mb=1.0, kv_block_tokens=16",
        "kv_budget_mb=4.0, kv_block_tokens=16",
    }
    assert tput["kv_budget_mb=1.0, kv_block_tokens=16"].measured_ratio > 1
    assert tput["kv_budget_mb=4.0, kv_block_tokens=16"].measured_ratio < 1
    assert (
        "(kv_budget_mb=4.0, kv_block_tokens=16)"
        in tput["kv_budget_mb=4.0, kv_block_tokens=16"].change
    )
    # Three stored records ran at 1 MB: the newest stands for that point.
    newest = max((p for p in paged if "4mb" not in p.name), key=lambda p: p.name)
    assert tput["kv_budget_mb=1.0, kv_block_tokens=16"].study_file.endswith(newest.name)
    # The file round-trips the operating point; techniques without one write no key.
    doc = tmp_path / "calibration.json"
    doc.write_text(json.dumps(calibration_document(entries)))
    assert load_calibration(doc) == tuple(entries)
    batching = build_calibration(load_studies(sorted(STUDIES.glob("*-study-batch-size.json"))))
    assert batching and all("conditions" not in e.to_dict() for e in batching)


def test_a_prefix_cache_on_two_workloads_is_two_entries_and_older_unnamed_records_give_way() -> (
    None
):
    """Shared system prompts and multi-turn histories are different operating points of one
    change; the records from before studies named their dataset are superseded by the newer
    ones that do, rather than standing beside them as a third, unlabelled finding."""
    records = sorted(STUDIES.glob("*-study-prefix-cache*.json"))
    studies = load_studies(records)
    assert any(not st.args.get("dataset") for _, st in studies)  # the older records
    entries = build_calibration(studies, root=ROOT)
    ttft = {e.conditions: e for e in entries if e.metric == "ttft_p50_s"}
    assert set(ttft) == {"dataset=shared-prefix", "dataset=multi-turn"}
    # Both cut TTFT; the shared 256-token prompt far more than a conversation's history.
    assert (
        ttft["dataset=shared-prefix"].measured_ratio < ttft["dataset=multi-turn"].measured_ratio < 1
    )
