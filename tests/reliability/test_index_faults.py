"""Faults in the runs folder and its index: a symlinked index file, a run seen broken whose
files are then completed, SQL that tries to reach files or run several statements, and run
names that are not valid UTF-8."""

from __future__ import annotations

import json
import os
import shutil
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


@pytest.mark.fault(
    fault="the index file is a symlink (to a user's DuckDB file, or dangling)",
    before=(
        "`index` and the dashboard wrote through it, replacing the user's `runs` table (issue 26)"
    ),
    after="an in-memory index with a note; the link never opened",
    kept="the user's file unchanged; nothing created at a dangling target",
)
def test_a_symlinked_index_file_is_never_opened_and_its_target_is_untouched(
    template: Path, tmp_path: Path
) -> None:
    import duckdb

    runs = tmp_path / "runs"
    runs.mkdir()
    copy_run(template, runs, "20261201-100000-a-0001")
    users_db = tmp_path / "mine.duckdb"
    with duckdb.connect(str(users_db)) as con:
        con.execute("CREATE TABLE runs AS SELECT 42 AS precious")
    (runs / INDEX_FILE).symlink_to(users_db)
    dangling = tmp_path / "runs2"
    dangling.mkdir()
    copy_run(template, dangling, "20261201-100000-b-0001")
    (dangling / INDEX_FILE).symlink_to(tmp_path / "would-be-created.duckdb")

    for root in (runs, dangling):
        with open_index(root) as index:
            assert not index.persistent
            assert index.note is not None and "symbolic link" in index.note
            assert index.query("SELECT count(*) FROM runs")[1] == [(1,)]
    with duckdb.connect(str(users_db), read_only=True) as con:
        assert con.execute("SELECT * FROM runs").fetchall() == [(42,)]
    assert not (tmp_path / "would-be-created.duckdb").exists()


@pytest.mark.fault(
    fault="a run folder named in non-UTF-8 bytes; a lone surrogate in a manifest name",
    before="index, query, `ls --where`, dashboard and /api/runs failed for every run (issue 26)",
    after="names escaped; the folder listed broken naming UTF-8",
    kept="all 3 runs in query, `ls --where` and the dashboard's JSON",
)
def test_a_run_with_an_undecodable_name_is_listed_and_hides_no_other_run(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = copy_run(template, tmp_path, "20261201-100000-good-0001")
    bad = os.fsencode(tmp_path) + b"/20261201-100001-caf\xe9-0002"
    shutil.copytree(good, os.fsdecode(bad))
    # A lone surrogate in the manifest's name (valid JSON, not valid UTF-8 text).
    odd = copy_run(template, tmp_path, "20261201-100002-odd-0003")
    m = (odd / "manifest.json").read_text().replace('"name": "tmpl"', '"name": "x\\ud800y"')
    (odd / "manifest.json").write_text(m)

    with open_index(tmp_path) as index:
        _, rows = index.query("SELECT run_id, name, state, problem FROM runs ORDER BY run_id")
    assert rows[1][2] == "broken" and "not valid UTF-8" in rows[1][3]
    assert [r[0] for r in rows] == [
        "20261201-100000-good-0001",
        "20261201-100001-caf\\xe9-0002",
        "20261201-100002-odd-0003",
    ]
    assert rows[2][1] == "x\\ud800y"

    rd = ["--runs-dir", str(tmp_path)]
    assert main(["query", "SELECT count(*) AS n FROM runs", "--json", *rd]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 3}]
    assert main(["ls", "--where", "run_id IS NOT NULL", "--json", *rd]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
    # The dashboard's runs list (and so /api/runs) serves every row as JSON.
    from perfscope.dashboard.app.data import RunRepository

    records = [r.to_record() for r in RunRepository(tmp_path).rows()]
    assert len(records) == 3
    json.dumps(records).encode("utf-8")


@pytest.mark.fault(
    fault="a run seen broken whose table file is then completed in place",
    before="stayed broken: the refresh key was only manifest/summary mtime and size (issue 26)",
    after="re-read on the table file's identity: `complete`",
    kept="the run, complete, one row updated",
)
def test_a_run_seen_broken_is_reread_when_only_a_table_file_changes(
    template: Path, tmp_path: Path
) -> None:
    run = copy_run(template, tmp_path, "20261201-100000-a-0001")
    requests = run / "requests.parquet"
    saved = requests.read_bytes()
    requests.write_bytes(b"not parquet yet (a copy in progress)")
    with open_index(tmp_path) as index:
        assert index.query("SELECT state FROM runs")[1] == [("broken",)]
    with requests.open("r+b") as fh:  # rewritten in place: same inode, other size
        fh.truncate(0)
        fh.write(saved)
    with open_index(tmp_path) as index:
        assert index.last_stats is not None and index.last_stats.updated == 1
        assert index.query("SELECT state, problem FROM runs")[1] == [("complete", None)]


@pytest.mark.fault(
    fault="SQL with `COPY ... TO`, `read_csv`, `SET`, `INSTALL`, or several statements",
    before="external access on: files written and read, several statements run (issue 26)",
    after="`query failed:` in one line; `--allow-files` opts in to file functions",
    kept="no file written; the index and its `runs` table intact",
)
def test_query_runs_one_statement_without_file_access_unless_allowed(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy_run(template, tmp_path / "runs", "20261201-100000-a-0001")
    root = tmp_path / "runs"
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    out = tmp_path / "written.csv"
    with open_index(root) as index:
        for sql in (
            f"COPY (SELECT * FROM runs) TO '{out}'",
            f"SELECT * FROM read_csv('{secret}')",
            "SET enable_external_access = true",
            "INSTALL httpfs",
        ):
            with pytest.raises(UsageError, match=r"^query failed: "):
                index.query(sql)
        with pytest.raises(UsageError, match="exactly one SQL statement"):
            index.query("SELECT 1; SELECT 2")
    assert not out.exists()

    rd = ["--runs-dir", str(root)]
    assert main(["ls", "--where", "true) LIMIT 1; DROP TABLE runs; SELECT (1", *rd]) == 2
    assert "exactly one SQL statement" in capsys.readouterr().err
    assert main(["query", f"SELECT a FROM read_csv('{secret}')", "--json", *rd]) == 2
    assert capsys.readouterr().err.startswith("error: query failed:")
    sql = f"SELECT a FROM read_csv('{secret}')"
    assert main(["query", sql, "--json", "--allow-files", *rd]) == 0
    assert json.loads(capsys.readouterr().out) == [{"a": 1}]
