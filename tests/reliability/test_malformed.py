"""A malformed run is shown as broken (file, field, problem) and breaks nothing else."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.reliability.helpers import cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One good run and three broken copies of it."""
    root = tmp_path_factory.mktemp("malformed") / "runs"
    res = cli(
        "run",
        "python:logged_engines:half_fail",
        "--requests",
        "4",
        "--output-len",
        "4",
        "--no-progress",
        "--no-report",
        runs=root,
    )
    assert res.returncode == 0, res.stderr
    (good,) = list(root.iterdir())
    stem = good.name[:15]

    def copy(tag: str) -> Path:
        dst = root / f"{stem}-{tag}-0000"
        shutil.copytree(good, dst)
        return dst

    bad_manifest = copy("badmanifest")
    m = json.loads((bad_manifest / "manifest.json").read_text())
    m["workload"] = ["not", "an", "object"]
    m["status"] = 7
    (bad_manifest / "manifest.json").write_text(json.dumps(m))

    foreign_summary = copy("foreignsummary")
    (foreign_summary / "summary.json").write_text(json.dumps({"schema": "acme/9", "x": 1}))

    foreign_cols = copy("foreigncols")
    pq.write_table(
        pa.table({"id": [1, 2], "latency": ["fast", "slow"], "t_sent": ["a", "b"]}),
        foreign_cols / "requests.parquet",
    )
    return root


@pytest.mark.fault(
    fault="a manifest with wrong-typed fields; a parquet with foreign columns",
    before="not recorded (guard older than issue 26)",
    after="listed `broken` naming file, field and type",
    kept="every run listed",
)
def test_ls_lists_every_run_and_says_what_is_broken(runs: Path) -> None:
    res = cli("ls", "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    rows = {e["run_id"].split("-")[2]: e for e in json.loads(res.stdout)}
    assert rows["badmanifest"]["state"] == "broken"
    assert "manifest.json: field 'status' is int" in rows["badmanifest"]["reason"]
    assert "field 'workload' is list" in rows["badmanifest"]["reason"]
    assert rows["foreigncols"]["state"] == "broken"
    assert "requests.parquet: column 'request_id' is missing" in rows["foreigncols"]["reason"]
    assert "column 't_sent' is string, expected int64" in rows["foreigncols"]["reason"]
    fs = rows["foreignsummary"]
    assert fs["state"] == "complete" and fs["summary"] is None
    assert "summary.json: schema 'acme/9' is not a perfscope summary" in fs["reason"]
    table = cli("ls", runs=runs)
    assert table.returncode == 0 and "broken" in table.stdout


@pytest.mark.parametrize("cmd", ["show", "analyze", "report", "export"])
@pytest.mark.fault(
    fault="show/export/report/analyze on a broken run",
    before="not recorded (guard older than issue 26)",
    after="one line naming file and field, exit 2",
    kept="read-only commands: nothing written",
)
def test_commands_on_a_broken_run_give_one_line_naming_file_and_field(
    runs: Path, cmd: str, tmp_path: Path
) -> None:
    for tag, words in (
        ("badmanifest", ("manifest.json", "'workload'")),
        ("foreigncols", ("requests.parquet", "'request_id'")),
    ):
        (run,) = [p for p in runs.iterdir() if f"-{tag}-" in p.name]
        args = [cmd, str(run)]
        if cmd == "export":
            args += ["--format", "json", "-o", str(tmp_path / "x.json")]
        if cmd == "report":
            args += ["-o", str(tmp_path / "r.html")]
        res = cli(*args, runs=runs)
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr
        line = res.stderr.strip()
        assert line.startswith("error: ") and "broken" in line and "\n" not in line, line
        for w in words:
            assert w in line, line


@pytest.mark.fault(
    fault="a summary.json of another schema",
    before="not recorded (guard older than issue 26)",
    after="ignored with a note; recomputed in memory",
    kept="the foreign summary.json as it was; the 2 completed requests counted",
)
def test_a_foreign_summary_is_ignored_and_recomputed_in_memory(runs: Path) -> None:
    (run,) = [p for p in runs.iterdir() if "-foreignsummary-" in p.name]
    res = cli("show", str(run), "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    assert "summary.json: schema 'acme/9' is not a perfscope summary" in res.stderr
    assert json.loads(res.stdout)["counts"]["completed"] == 2
    assert json.loads((run / "summary.json").read_text())["schema"] == "acme/9"  # not written


@pytest.mark.fault(
    fault="`compare` with one broken run",
    before="not recorded (guard older than issue 26)",
    after="exit 2 naming `requests.parquet`",
    kept="the good run still reads",
)
def test_compare_names_the_broken_run_and_the_good_run_still_reads(runs: Path) -> None:
    good = next(p for p in runs.iterdir() if "-python-" in p.name)
    bad = next(p for p in runs.iterdir() if "-foreigncols-" in p.name)
    res = cli("compare", str(good), str(bad), runs=runs)
    assert res.returncode == 2 and "requests.parquet" in res.stderr, res.stderr
    assert cli("show", str(good), runs=runs).returncode == 0


@pytest.mark.fault(
    fault="the dashboard over broken runs",
    before="not recorded (guard older than issue 26)",
    after="HTTP 200; the broken rows say why",
    kept="every run listed",
)
def test_the_dashboard_lists_broken_runs_without_failing(runs: Path) -> None:
    from perfscope.dashboard.app import create_app

    app = create_app(runs)
    client = app.server.test_client()
    resp = client.get("/api/runs")
    assert resp.status_code == 200
    rows = {r["run_id"].split("-")[2]: r for r in resp.get_json()}
    assert rows["badmanifest"]["state"] == "broken"
    assert "field 'workload'" in rows["badmanifest"]["status"]
    assert rows["foreigncols"]["state"] == "broken"
    assert "requests.parquet" in rows["foreigncols"]["status"]
    page = client.get("/")
    assert page.status_code == 200


@pytest.mark.fault(
    fault="a 1 GiB manifest or summary",
    before="`ls` took 11.5 s and 2.2 GB (issue 26)",
    after="listed broken with its size and the cap in under 30 s; `show` one line",
    kept="the other run listed `complete`",
)
def test_an_oversized_manifest_or_summary_is_listed_broken_with_its_size_and_the_cap(
    runs: Path, tmp_path: Path
) -> None:
    good = next(p for p in runs.iterdir() if "-python-" in p.name)
    root = tmp_path / "runs"
    stem = good.name[:15]
    huge_m = shutil.copytree(good, root / f"{stem}-hugemanifest-0000")
    huge_s = shutil.copytree(good, root / f"{stem}-hugesummary-0000")
    shutil.copytree(good, root / f"{stem}-small-0000")
    for f in (huge_m / "manifest.json", huge_s / "summary.json"):
        with open(f, "r+b") as fh:
            fh.truncate(1 << 30)  # 1 GiB, sparse: costs nothing to write
    started = time.monotonic()
    res = cli("ls", "--json", runs=root)
    took = time.monotonic() - started
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    rows = {e["run_id"].split("-")[2]: e for e in json.loads(res.stdout)}
    assert rows["small"]["state"] == "complete"
    for tag, fname in (("hugemanifest", "manifest.json"), ("hugesummary", "summary.json")):
        reason = rows[tag]["reason"]
        assert rows[tag]["state"] == "broken", rows[tag]
        assert fname in reason and "1.0 GiB (1073741824 bytes)" in reason, reason
        assert "over the 8.0 MiB cap" in reason and "PERFSCOPE_MAX_JSON_BYTES" in reason
    assert took < 30  # bounded reads: reading 1 GiB of JSON took 11.5 s and 2.2 GB
    shown = cli("show", str(huge_m), runs=root)
    assert shown.returncode == 2 and "Traceback" not in shown.stderr
    line = shown.stderr.strip()
    assert "\n" not in line and "manifest.json: 1.0 GiB" in line, line
    # The cap is configurable; the index (ls --where) reads through the same cap.
    where = cli(
        "ls", "--where", "state = 'broken'", "--json", runs=root, PERFSCOPE_MAX_JSON_BYTES="1k"
    )
    assert where.returncode == 0, where.stderr
    broken = {e["run_id"].split("-")[2]: e for e in json.loads(where.stdout)}
    assert set(broken) == {"hugemanifest", "hugesummary", "small"}
    assert "over the 1.0 KiB cap" in str(broken["small"]), broken["small"]
    assert (huge_m / "manifest.json").stat().st_size == 1 << 30  # nothing rewritten


@pytest.mark.fault(
    fault="a manifest.json that is not JSON",
    before="not recorded (guard older than issue 26)",
    after="`show` exits 2 with `cannot read`, no traceback",
    kept="read-only command: nothing written",
)
def test_unreadable_manifest_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken-run"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    res = cli("show", str(bad), runs=tmp_path)
    assert res.returncode == 2
    assert "cannot read" in res.stderr and "Traceback" not in res.stderr
