"""The DuckDB run index: one row per run, incremental refresh, broken and crashed runs, CLI."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from perfscope.api.index import INDEX_FILE, open_index
from perfscope.cli import main
from perfscope.errors import UsageError
from tests.data.runs.builders import copy_run, manual_run


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run (manual API, exact times) to copy."""
    root = tmp_path_factory.mktemp("template")
    return manual_run(root, name="tmpl", n_requests=6, fail_every=3)


def test_index_holds_one_row_per_run_with_the_summary_metrics(
    template: Path, tmp_path: Path
) -> None:
    copy_run(template, tmp_path, "20261201-100000-a-0001")
    copy_run(template, tmp_path, "20261201-100001-b-0002", name="other")
    summary = json.loads((template / "summary.json").read_text())
    with open_index(tmp_path) as index:
        _, rows = index.query(
            "SELECT run_id, name, state, requests, failed, ttft_p50_s, output_tok_s "
            "FROM runs ORDER BY run_id"
        )
    assert [r[0] for r in rows] == ["20261201-100000-a-0001", "20261201-100001-b-0002"]
    assert rows[1][1] == "other"
    assert rows[0][2] == "complete"
    assert rows[0][3] == summary["counts"]["requests"] == 6
    assert rows[0][4] == summary["counts"]["failed"] == 2
    assert rows[0][5] == pytest.approx(summary["latency"]["ttft"]["p50"])
    assert rows[0][6] == pytest.approx(summary["throughput"]["output_tok_s"])
    assert (tmp_path / INDEX_FILE).is_file()


def test_refresh_rereads_only_runs_whose_files_changed(template: Path, tmp_path: Path) -> None:
    a = copy_run(template, tmp_path, "20261201-100000-a-0001")
    copy_run(template, tmp_path, "20261201-100001-b-0002")
    with open_index(tmp_path) as index:
        assert index.last_stats is not None
        assert (index.last_stats.added, index.last_stats.updated) == (2, 0)
    with open_index(tmp_path) as index:
        assert index.last_stats is not None
        assert (index.last_stats.added, index.last_stats.updated, index.last_stats.removed) == (
            0,
            0,
            0,
        )
    summary = json.loads((a / "summary.json").read_text())
    summary["latency"]["ttft"]["p50"] = 12.5
    (a / "summary.json").write_text(json.dumps(summary))
    copy_run(template, tmp_path, "20261201-100002-c-0003")
    shutil.rmtree(tmp_path / "20261201-100001-b-0002")
    with open_index(tmp_path) as index:
        stats = index.last_stats
        assert stats is not None
        assert (stats.added, stats.updated, stats.removed, stats.runs) == (1, 1, 1, 2)
        _, rows = index.query("SELECT ttft_p50_s FROM runs WHERE run_id LIKE '%a-0001'")
    assert rows == [(12.5,)]


def test_a_malformed_run_is_listed_as_broken_and_does_not_hide_the_others(
    template: Path, tmp_path: Path
) -> None:
    copy_run(template, tmp_path, "20261201-100000-good-0001")
    bad = copy_run(template, tmp_path, "20261201-100001-bad-0002")
    (bad / "manifest.json").write_text('{"status": 7, "run_id": ["x"]}')
    garbled = copy_run(template, tmp_path, "20261201-100002-garbled-0003")
    (garbled / "summary.json").write_text("{not json")
    with open_index(tmp_path) as index:
        _, rows = index.query("SELECT run_id, state, problem FROM runs ORDER BY run_id")
    by_id = {r[0]: r for r in rows}
    assert by_id["20261201-100000-good-0001"][1] == "complete"
    assert by_id["20261201-100001-bad-0002"][1] == "broken"
    assert "status" in by_id["20261201-100001-bad-0002"][2]
    assert by_id["20261201-100002-garbled-0003"][1] == "broken"
    assert "summary.json" in by_id["20261201-100002-garbled-0003"][2]


def test_a_running_run_whose_process_is_gone_reads_as_crashed(
    template: Path, tmp_path: Path
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    copy_run(
        template,
        tmp_path,
        "20261201-100000-dead-0001",
        status="running",
        process={"pid": dead.pid, "host": socket.gethostname()},
    )
    copy_run(
        template,
        tmp_path,
        "20261201-100001-alive-0002",
        status="running",
        process={"pid": os.getpid(), "host": socket.gethostname()},
    )
    with open_index(tmp_path) as index:
        _, rows = index.query("SELECT run_id, state FROM runs ORDER BY run_id")
    assert rows == [
        ("20261201-100000-dead-0001", "crashed"),
        ("20261201-100001-alive-0002", "running"),
    ]


def test_an_indexed_running_run_reads_crashed_once_its_writer_dies_with_no_file_changed(
    template: Path, tmp_path: Path
) -> None:
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        copy_run(
            template,
            tmp_path,
            "20261201-100000-live-0001",
            status="running",
            process={"pid": writer.pid, "host": socket.gethostname()},
        )
        copy_run(template, tmp_path, "20261201-100001-done-0002")
        sql = "SELECT run_id, state FROM runs ORDER BY run_id"
        with open_index(tmp_path) as index:
            assert index.query(sql)[1][0] == ("20261201-100000-live-0001", "running")
        with open_index(tmp_path) as index:  # still alive: re-checked, not re-read
            assert index.last_stats is not None and index.last_stats.updated == 0
            assert index.query(sql)[1][0][1] == "running"
    finally:
        writer.kill()
        writer.wait()
    with open_index(tmp_path) as index:
        _, rows = index.query(sql)
    assert rows == [
        ("20261201-100000-live-0001", "crashed"),
        ("20261201-100001-done-0002", "complete"),
    ]


def test_an_unwritable_index_falls_back_to_memory_with_a_note(
    template: Path, tmp_path: Path
) -> None:
    copy_run(template, tmp_path, "20261201-100000-a-0001")
    (tmp_path / INDEX_FILE).mkdir()  # cannot be opened as a database file
    with open_index(tmp_path) as index:
        assert not index.persistent
        assert index.note and "in memory" in index.note
        _, rows = index.query("SELECT count(*) FROM runs")
    assert rows == [(1,)]


def test_bad_sql_and_writes_are_refused_with_one_line(template: Path, tmp_path: Path) -> None:
    copy_run(template, tmp_path, "20261201-100000-a-0001")
    with open_index(tmp_path) as index:
        with pytest.raises(UsageError, match=r"^query failed: .*SELEC"):
            index.query("SELEC 1")
        with pytest.raises(UsageError, match="read-only"):
            index.query("DELETE FROM runs")


def test_cli_query_and_ls_where_answer_from_the_index(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy_run(template, tmp_path, "20261201-100000-fast-0001")
    slow = copy_run(template, tmp_path, "20261201-100001-slow-0002")
    summary = json.loads((slow / "summary.json").read_text())
    summary["latency"]["ttft"]["p99"] = 3.0
    (slow / "summary.json").write_text(json.dumps(summary))

    rd = ["--runs-dir", str(tmp_path)]
    assert main(["query", "SELECT run_id FROM runs WHERE ttft_p99_s > 1", "--json", *rd]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == [{"run_id": "20261201-100001-slow-0002"}]

    assert main(["ls", "--where", "ttft_p99_s < 1", "--json", *rd]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in listed] == ["20261201-100000-fast-0001"]

    assert main(["query", "SELECT nosuchcolumn FROM runs", *rd]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: query failed:") and err.count("\n") == 1

    assert main(["index", *rd]) == 0
    assert "2 run(s)" in capsys.readouterr().out


def test_an_index_held_open_elsewhere_is_refreshed_from_its_copy_not_rebuilt(
    template: Path, tmp_path: Path
) -> None:
    for i in range(3):
        copy_run(template, tmp_path, f"20261201-10000{i}-a-000{i}")
    with open_index(tmp_path):
        pass
    copy_run(template, tmp_path, "20261201-100009-new-0009")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True); "
            "print('open', flush=True); time.sleep(60)",
            str(tmp_path / INDEX_FILE),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with open_index(tmp_path) as index:
            stats = index.last_stats
            assert stats is not None and not index.persistent
            assert (stats.added, stats.runs) == (1, 4)  # only the new run was read
            assert index.note is not None and "from the saved index" in index.note
            # Short enough for the dashboard's status line: who holds it, not DuckDB's page.
            assert f"PID {holder.pid}, holds the index file" in index.note, index.note
            assert len(index.note) < 120
    finally:
        holder.kill()
        holder.wait()


def test_plain_ls_with_an_index_lists_the_same_newest_runs_as_a_scan(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(4):
        copy_run(template, tmp_path, f"20261201-10000{i}-r-000{i}", name=f"r{i}")
    rd = ["--runs-dir", str(tmp_path), "--limit", "2", "--json"]
    assert main(["ls", *rd]) == 0
    scanned = json.loads(capsys.readouterr().out)
    assert main(["index", "--runs-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    copy_run(template, tmp_path, "20261201-100009-late-0009", name="late")
    assert main(["ls", *rd]) == 0
    indexed = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in scanned] == ["20261201-100003-r-0003", "20261201-100002-r-0002"]
    assert [r["run_id"] for r in indexed] == [
        "20261201-100009-late-0009",
        "20261201-100003-r-0003",
    ]
    assert indexed[1] == scanned[0]  # same record, whichever way the run was found


def test_query_columns_documents_every_column_including_state_ray_and_lengths(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["query", "--columns", "--json", "--runs-dir", str(tmp_path)]) == 0
    documented = {r["column"]: r for r in json.loads(capsys.readouterr().out)}
    copy_run(template, tmp_path, "20261201-100000-a-0001")
    with open_index(tmp_path) as index:
        names, rows = index.query("SELECT * FROM runs")
    assert set(documented) == set(names)
    assert all(r["type"] and r["unit"] and len(r["meaning"]) >= 5 for r in documented.values())
    units = {c: documented[c]["unit"] for c in ("ttft_p99_s", "output_tok_s", "ray_never_sent")}
    assert units == {"ttft_p99_s": "s", "output_tok_s": "tokens/s", "ray_never_sent": "count"}
    # Every measured number says its unit: no DOUBLE column is "text".
    assert all(r["unit"] != "text" for r in documented.values() if r["type"] == "DOUBLE")
    for col in ("state", "problem", "ray_lost_actors", "ray_never_sent", "prompt_len_spec"):
        assert col in documented
    row = dict(zip(names, rows[0], strict=True))
    summary = json.loads((template / "summary.json").read_text())
    counts = summary["counts"]
    assert row["prompt_tokens_per_request"] == pytest.approx(
        counts["prompt_tokens"] / counts["requests"]
    )
    assert row["distributed_backend"] is None and row["ray_actors"] is None
