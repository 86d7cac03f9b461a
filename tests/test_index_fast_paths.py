"""The run index's fast paths: table schemas judged once per distinct footer schema, an
up-to-date index answered read-only, and ``ls``/``query`` that import only what they need."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("duckdb")

from perfscope.api.index import open_index
from perfscope.profiler.parquet_footer import SchemaKeys, schema_key
from perfscope.profiler.store import TableCheck, table_problems
from tests.data.runs.builders import copy_run, manual_run


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run (manual API) to copy."""
    return manual_run(tmp_path_factory.mktemp("template"), name="tmpl", n_requests=4)


def test_footer_schema_key_tells_schemas_apart_and_ignores_row_counts(tmp_path: Path) -> None:
    def write(name: str, table: pa.Table) -> Path:
        pq.write_table(table, tmp_path / name)
        return tmp_path / name

    a = write("a.parquet", pa.table({"x": [1, 2], "s": ["p", "q"]}))
    more_rows = write("b.parquet", pa.table({"x": [1, 2, 3], "s": ["p", "q", "r"]}))
    floats = write("c.parquet", pa.table({"x": [1.0, 2.0], "s": ["p", "q"]}))
    dictionary = write(
        "d.parquet", pa.table({"x": [1, 2], "s": pa.array(["p", "q"]).dictionary_encode()})
    )
    keys = [schema_key(p) for p in (a, more_rows, floats, dictionary)]
    assert None not in keys
    assert keys[0] == keys[1]  # rows and statistics differ, the schema does not
    assert len({keys[0], keys[2], keys[3]}) == 3  # a type, or only the Arrow type, differs
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not a footer PAR1")
    (tmp_path / "cut.parquet").write_bytes(a.read_bytes()[:-20])
    cache = SchemaKeys()
    assert cache.key(tmp_path / "junk.parquet") is None  # the caller asks pyarrow
    assert cache.key(tmp_path / "cut.parquet") is None
    assert cache.key(more_rows) == cache.key(a) == keys[0]  # remembered ranges read alike


def test_a_shared_table_check_gives_each_run_the_verdict_pyarrow_gives(
    template: Path, tmp_path: Path
) -> None:
    good = copy_run(template, tmp_path, "20261201-100000-good-0001")
    bad_type = copy_run(template, tmp_path, "20261201-100001-type-0002")
    req = pq.read_table(bad_type / "requests.parquet")
    i = req.schema.get_field_index("request_id")
    pq.write_table(
        req.set_column(i, "request_id", req["request_id"].cast(pa.string())),
        bad_type / "requests.parquet",
    )
    torn = copy_run(template, tmp_path, "20261201-100002-torn-0003")
    (torn / "steps.parquet").write_bytes((torn / "steps.parquet").read_bytes()[:-30])
    check = TableCheck()
    for run in (good, bad_type, torn, good, bad_type):  # verdicts reused across runs
        assert check.problems(run) == table_problems(run)
    assert check.problems(good) == []
    assert any("request_id" in p for p in check.problems(bad_type))
    assert any("cannot be read as Parquet" in p for p in check.problems(torn))


def test_a_table_name_that_is_not_a_regular_file_counts_as_no_table_and_never_blocks(
    template: Path, tmp_path: Path
) -> None:
    fifo = copy_run(template, tmp_path, "20261201-100000-fifo-0001")
    (fifo / "steps.parquet").unlink()
    os.mkfifo(fifo / "steps.parquet")  # an open for reading without O_NONBLOCK would wait
    folder = copy_run(template, tmp_path, "20261201-100001-dir-0002")
    (folder / "chunks.parquet").unlink()
    (folder / "chunks.parquet").mkdir()
    unreadable = copy_run(template, tmp_path, "20261201-100002-unreadable-0003")
    (unreadable / "requests.parquet").chmod(0)
    check = TableCheck()
    assert check.problems(fifo) == [] and check.problems(folder) == []
    if os.geteuid() != 0:  # root reads it anyway
        assert any("requests.parquet" in p for p in check.problems(unreadable))
    assert check.problems(unreadable) == table_problems(unreadable)


def test_an_unchanged_index_answers_and_an_edit_in_place_is_still_seen(
    template: Path, tmp_path: Path
) -> None:
    runs = [copy_run(template, tmp_path, f"20261201-10000{i}-r-000{i}") for i in range(3)]
    with open_index(tmp_path) as index:
        assert index.last_stats is not None and index.last_stats.added == 3
    with open_index(tmp_path) as index:  # nothing changed: the read-only path
        assert index.last_stats is not None
        assert (index.last_stats.added, index.last_stats.updated) == (0, 0)
        assert index.persistent and index.note is None
    summary = runs[1] / "summary.json"
    data = json.loads(summary.read_text())
    data["throughput"]["output_tok_s"] = 12345.0
    st = os.stat(summary)
    summary.write_text(json.dumps(data))  # in place: the folder's mtime does not move
    os.utime(summary, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with open_index(tmp_path) as index:
        assert index.last_stats is not None and index.last_stats.updated == 1
        _, rows = index.query(f"SELECT output_tok_s FROM runs WHERE run_id = '{runs[1].name}'")
    assert rows == [(12345.0,)]


def test_ls_and_query_from_the_index_import_no_pyarrow_pandas_hwdb_or_summary_records(
    template: Path, tmp_path: Path
) -> None:
    for i in range(3):
        copy_run(template, tmp_path, f"20261201-10000{i}-r-000{i}")
    with open_index(tmp_path):
        pass
    code = (
        "import sys; from perfscope.cli import main; "
        f"root = {str(tmp_path)!r}; "
        "assert main(['ls', '--limit', '2', '--runs-dir', root]) == 0; "
        "assert main(['query', 'SELECT count(*) FROM runs', '--runs-dir', root]) == 0; "
        "print(sorted(m for m in ('pyarrow', 'pandas', 'perfscope.hwdb', 'torch', "
        "'perfscope.analysis.summary') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "20261201-100002-r-0002" in out and "20261201-100000-r-0000" not in out
    assert out.strip().splitlines()[-1] == "[]", out


def _ls_ids(root: Path, limit: int) -> list[str]:
    with open_index(root, newest=limit) as index:
        return [r.path.name for r in index.newest(limit)]


def test_plain_ls_checks_only_the_newest_runs_and_still_sees_every_change_among_them(
    template: Path, tmp_path: Path
) -> None:
    ids = [f"20261201-10000{i}-r-000{i}" for i in range(6)]
    runs = [copy_run(template, tmp_path, rid, name=rid[-4:]) for rid in ids]
    # Two runs started in the same second: the start time, then the id, orders them.
    twin = copy_run(template, tmp_path, "20261201-100005-q-0009", name="twin")
    with open_index(tmp_path):
        pass
    newest = ["20261201-100005-r-0005", "20261201-100005-q-0009", "20261201-100004-r-0004"]
    assert _ls_ids(tmp_path, 3) == newest
    # An old run changed (or removed): the newest are still held as they are, read only.
    old = runs[0] / "summary.json"
    old.write_text(old.read_text().replace('"output_tok_s"', '"output_tok_s" '))
    os.utime(old, ns=(0, 1))
    with open_index(tmp_path, newest=3) as index:
        assert index.newest_up_to_date(3) and index.persistent
    # A change among the newest is seen: a new run, one removed, an edit in place.
    copy_run(template, tmp_path, "20261201-100009-late-0010", name="late")
    assert _ls_ids(tmp_path, 3)[0] == "20261201-100009-late-0010"
    import shutil

    shutil.rmtree(twin)
    assert _ls_ids(tmp_path, 3) == [
        "20261201-100009-late-0010",
        "20261201-100005-r-0005",
        "20261201-100004-r-0004",
    ]
    manifest = runs[4] / "manifest.json"
    data = json.loads(manifest.read_text())
    data["status"] = "failed"
    st = os.stat(manifest)
    manifest.write_text(json.dumps(data))  # in place
    os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with open_index(tmp_path, newest=3) as index:
        rows = index.newest(3)
    assert [(r.path.name, r.state) for r in rows][2] == ("20261201-100004-r-0004", "failed")
    # A folder that is not a run (no manifest) takes no place among the newest.
    (tmp_path / "20261201-100010-notarun").mkdir()
    assert _ls_ids(tmp_path, 1) == ["20261201-100009-late-0010"]


def test_a_large_refresh_read_in_worker_processes_holds_what_one_process_reads(
    template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfscope.analysis.catalogue import value_at
    from perfscope.profiler.run_index import scan as run_index

    for i in range(5):
        copy_run(template, tmp_path, f"20261201-10000{i}-r-000{i}", name=f"r{i}")
    broken = copy_run(template, tmp_path, "20261201-100009-bad-0009")
    (broken / "requests.parquet").write_bytes(b"not parquet")
    root = tmp_path.resolve()
    items = [(rid, path, key) for rid, (path, key) in sorted(run_index._scan(root).items())]

    def rows(table: object) -> list[dict[str, object]]:
        return sorted(table.to_pylist(), key=lambda r: str(r["run_id"]))  # type: ignore[attr-defined]

    alone = rows(run_index._read_table(items, value_at, root, set()))
    monkeypatch.setattr(run_index, "PARALLEL_MIN_RUNS", 2)
    here: list[int] = []  # runs read in this process (workers are processes of their own)
    read_here = run_index._read_table
    monkeypatch.setattr(
        run_index, "_read_table", lambda it, *a: here.append(len(it)) or read_here(it, *a)
    )
    spread = rows(run_index._read_runs(items, value_at, root, set()))
    assert spread == alone and len(alone) == 6
    assert here == []  # every run was read by a worker
    assert [r["state"] for r in alone if r["run_id"] == broken.name] == ["broken"]
    # A lookup that cannot be sent to a worker is read here, to the same rows.
    local = rows(run_index._read_runs(items, lambda tree, path: value_at(tree, path), root, set()))
    assert local == alone and here == [6]
    monkeypatch.setattr(run_index, "_read_table", read_here)
    # Through the index: a first build read by workers answers like any other.
    with open_index(tmp_path) as index:
        _, got = index.query("SELECT run_id, state FROM runs ORDER BY run_id")
    assert [s for _, s in got] == ["complete"] * 5 + ["broken"]


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)

#: Documents where orjson and json part ways, or that neither reads.
_EDGE_DOCUMENTS = [
    b'{"a": NaN, "b": Infinity, "c": -Infinity}',
    b'{"a": "\\ud800"}',  # a lone surrogate escape
    b"[18446744073709551615, 18446744073709551616, -9223372036854775808]",
    b'{"ns": -9223372036854775809}',
    b"123456789012345678901234567890",
    b"[1e400, 0.000111803398874989581234]",
    b"[99999999999999999999, -99999999999999999999, 123456789012345678901.5]",
    b"[0.12345678901234567890123, 1e12345678901234567890, 1E-00000000000000000000001]",
    b'{"s": "x99999999999999999999", "n": 99999999999999999999}',
    b"99999999999999999999",
    b'{"a": 1, "a": 2}',
    b"\xef\xbb\xbf[1]",  # a byte order mark
    b'["\xff"]',  # not UTF-8
    b'["a\tb"]',  # a raw control character
    b"[00]",
    b"[1.]",
    b"",
    b'{"x": 1} trailing',
]


def _parsed(loads: Callable[[bytes], object], raw: bytes) -> tuple[str, str]:
    """What ``loads`` makes of ``raw``: its value's repr (types included), or the error's
    type and message."""
    try:
        return "value", repr(loads(raw))
    except Exception as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "json-only"])
def test_the_index_reads_json_exactly_as_the_json_module_does(
    fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfscope.profiler import run_files

    if not fast:
        monkeypatch.setattr(run_files, "_fast_loads", lambda: None)
    elif run_files._fast_loads() is None:
        pytest.skip("orjson is not installed")

    def stdlib(raw: bytes) -> object:
        return json.loads(raw.decode("utf-8"))

    for raw in _EDGE_DOCUMENTS:
        assert _parsed(run_files.loads_json, raw) == _parsed(stdlib, raw), raw

    @given(value=_JSON_VALUES)
    @settings(max_examples=200, deadline=None)
    def same(value: object) -> None:
        raw = json.dumps(value, ensure_ascii=bool(hash(repr(value)) % 2)).encode(
            "utf-8", "surrogatepass"
        )
        assert _parsed(run_files.loads_json, raw) == _parsed(stdlib, raw)

    same()
