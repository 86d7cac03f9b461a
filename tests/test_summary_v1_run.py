"""A run directory written by perfscope 0.1.0 (summary schema ``perfscope.summary/1``) still
shows, re-analyses, reports and compares.

``tests/data/runs/v1`` was made with the 0.1.0 code by
``perfscope run --requests 6 --output-len 8 --prompt-len 16 --hw l4 --slo ttft=200ms,tpot=50ms``
(reference engine on a CPU, no GPU telemetry) and is copied, never modified, by each test.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from perfscope.analysis.summary import Counts
from perfscope.cli import main
from tests.conftest import DATA

V1 = DATA / "runs" / "v1"


def _copy(tmp_path: Path, run_id: str | None = None) -> Path:
    manifest = json.loads((V1 / "manifest.json").read_text())
    rid = run_id or manifest["run_id"]
    dest = tmp_path / "runs" / rid
    shutil.copytree(V1, dest)
    if run_id is not None:
        manifest["run_id"] = run_id
        (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def _main(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


@pytest.fixture
def v1_run(tmp_path: Path) -> Path:
    return _copy(tmp_path)


def test_the_stored_v1_summary_says_it_is_v1() -> None:
    summary = json.loads((V1 / "summary.json").read_text())
    assert summary["schema"] == "perfscope.summary/1"


def test_show_prints_a_v1_run_without_reanalysing_it(v1_run: Path) -> None:
    before = (v1_run / "summary.json").read_bytes()
    code, out = _main("show", str(v1_run))
    assert code == 0
    for text in ("TTFT", "TPOT", "output tokens/s", "SLO attainment", "decode", v1_run.name):
        assert text in out
    assert (v1_run / "summary.json").read_bytes() == before


def _holds(new: object, old: object) -> bool:
    """``new`` has every key and value of ``old`` (recursively); it may have more keys."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and _holds(new[k], v) for k, v in old.items())
    return new == old


def test_analyse_of_a_v1_run_reproduces_its_numbers(v1_run: Path) -> None:
    old = json.loads((v1_run / "summary.json").read_text())
    code, out = _main("analyze", str(v1_run), "--json")
    assert code == 0
    new = json.loads(out)
    # Every number the /1 summary holds comes back the same; fields added since (e.g.
    # counts.truncated) may be new.
    for key in ("counts", "latency", "throughput", "goodput", "steps", "window_s", "errors"):
        assert _holds(new[key], old[key]), key
    for phase in ("prefill", "decode"):
        assert new["roofline"]["phases"][phase]["mbu"] == pytest.approx(
            old["roofline"]["phases"][phase]["mbu"]
        )
    assert new["hardware"]["spec"]["key"] == "l4"
    assert [a["technique"] for a in new["advice"]] == [a["technique"] for a in old["advice"]]
    written = json.loads((v1_run / "summary.json").read_text())
    assert written["latency"] == old["latency"]


def test_report_of_a_v1_run_holds_its_headline_numbers(v1_run: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "r.html"
    code, _ = _main("report", str(v1_run), "-o", str(out_file))
    assert code == 0
    html = out_file.read_text()
    assert v1_run.name in html
    assert "TTFT" in html
    assert "overhead-bound" in html


def test_compare_of_two_v1_runs_gives_ratios_of_one(tmp_path: Path) -> None:
    a = _copy(tmp_path)
    b = _copy(tmp_path, "20261201-095609-v1-fixture-copy")
    code, out = _main("compare", str(a), str(b), "--json")
    assert code == 0
    result = json.loads(out)
    # compare works on run sets: one single-run set per argument
    assert result["runs"] == [[a.name], [b.name]]
    assert result["paths"] == [[str(a)], [str(b)]]
    text = json.dumps(result)
    assert "ttft" in text
    code, out = _main("compare", str(a), str(b))
    assert code == 0
    assert "TTFT" in out


def test_load_run_of_a_v1_run_reads_typed_attributes(v1_run: Path) -> None:
    import perfscope

    run = perfscope.load_run(v1_run)
    old = json.loads((V1 / "summary.json").read_text())
    assert run.ttft.p99 == old["latency"]["ttft"]["p99"]
    assert run.roofline.decode.mbu == old["roofline"]["phases"]["decode"]["mbu"]
    assert run.summary.hardware.device is not None
    assert run.summary.counts == Counts.from_dict(old["counts"])
    assert run.advice[0].technique == old["advice"][0]["technique"]  # records, not dicts


def test_a_v1_manifest_reads_into_the_typed_manifest_and_keeps_every_value() -> None:
    from perfscope.profiler.records import Manifest

    old = json.loads((V1 / "manifest.json").read_text())
    m = Manifest.from_dict(old)
    assert (m.run_id, m.status) == (old["run_id"], "complete")
    assert m.engine["kind"] == old["engine"]["kind"] and m.slos == old["slos"]
    out = m.to_dict()
    assert {k: out[k] for k in old} == old  # every value it had comes back
    assert out["warnings"] == [] and out["process"] == {}  # keys it lacked: their defaults


def test_a_v1_run_reads_its_requests_with_null_actor_and_host(v1_run: Path) -> None:
    """Written before the requests table had ``actor``/``host`` (issue 29): it loads, and
    the columns read as nulls, as on any run without load actors."""
    import pyarrow.parquet as pq

    from perfscope.profiler.store import read_run

    assert "actor" not in pq.read_schema(v1_run / "requests.parquet").names
    run = read_run(v1_run)
    assert len(run.requests) == 6
    assert run.requests["actor"].isna().all() and run.requests["host"].isna().all()


def test_segments_written_before_the_actor_and_host_columns_still_read(v1_run: Path) -> None:
    """A run killed under an older perfscope left segments without the newer request
    columns: its requests read from them (the columns null), never dropped as a stranger
    table's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from perfscope.profiler.segments import SEGMENTS_DIR
    from perfscope.profiler.store import read_run

    old = pq.read_table(v1_run / "requests.parquet")
    old = old.append_column("final", pa.array([True] * old.num_rows))
    (v1_run / SEGMENTS_DIR).mkdir()
    path = v1_run / SEGMENTS_DIR / "requests.arrows"
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, old.schema) as writer:
        writer.write_table(old)
    (v1_run / "requests.parquet").unlink()
    run = read_run(v1_run)
    assert "requests" in run.from_segments
    assert sorted(run.requests["request_id"]) == list(range(6))
    assert run.requests["actor"].isna().all() and run.requests["host"].isna().all()
    assert not any("segment ignored" in n for n in run.notes), run.notes
