"""``perfscope index`` and ``perfscope query``: SQL over thousands of stored runs.

- ``index [--rebuild]``: bring ``<runs root>/.perfscope-index.duckdb`` up to date and say what
  changed.
- ``query "SQL" [--json]``: refresh, then answer ``SQL`` over the table ``runs`` (one row per
  run; ``perfscope query --columns`` lists its columns with their units).
- ``ls --where "COND"`` (in :mod:`perfscope.cli`) filters the listing through the same index.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.cli._argtypes import add_runs_dir
from perfscope.errors import PerfscopeError

if TYPE_CHECKING:
    from rich.console import Console

    from perfscope.profiler.run_index import NewestRun
    from perfscope.profiler.store import RunEntry

__all__ = ["ListedRun", "add_allow_files", "newest_runs", "print_rows", "register", "runs_root"]


def runs_root(args: argparse.Namespace) -> Path:
    """``--runs-dir``, else the run store's default root (``$PERFSCOPE_RUNS_DIR`` or
    ``./perfscope-runs``, as :func:`perfscope.profiler.store.default_runs_root`, spelled out
    here so a query does not import the store and pyarrow)."""
    if args.runs_dir is not None:
        return Path(args.runs_dir)
    return Path(os.environ.get("PERFSCOPE_RUNS_DIR") or "perfscope-runs")


@dataclass(frozen=True)
class ListedRun:
    """One row of plain ``perfscope ls`` (the fields of the store's ``RunEntry`` it shows).

    Attributes:
        path: the run directory.
        state: complete, partial, failed, interrupted, running, crashed or broken.
        reason: why the run is not complete (or what is broken), else None.
        manifest: manifest.json as read (None when broken).
        summary: summary.json when present and perfscope's, else None.
    """

    path: Path
    state: str
    reason: str | None
    manifest: Mapping[str, Any] | None
    summary: Mapping[str, Any] | None

    @property
    def run_id(self) -> str:
        return self.path.name


def newest_runs(args: argparse.Namespace) -> tuple[Path, list[ListedRun]]:
    """The runs folder and its ``args.limit`` newest runs for plain ``perfscope ls``.

    When the folder has a run index (and duckdb is installed) the index picks the newest
    runs and says their state; only those runs' JSON files are read, and the run store
    (pyarrow, pandas) is not imported unless a run needs its full reading (broken or
    crashed by the index, or changed since the refresh). Otherwise every run folder is
    scanned by the store.
    """
    from perfscope.profiler.run_index import INDEX_FILE

    root = runs_root(args)
    if (root / INDEX_FILE).is_file() and importlib.util.find_spec("duckdb") is not None:
        from perfscope.api.index import open_index

        with open_index(root, newest=args.limit) as index:
            rows = index.newest(args.limit)
        return root, [_listed(row) for row in rows]
    from perfscope.profiler.store import scan_runs

    return root, [_entry(e) for e in scan_runs(root)[: args.limit]]


def _entry(e: RunEntry) -> ListedRun:
    return ListedRun(e.path, e.state, e.reason, e.manifest, e.summary)


def _listed(row: NewestRun) -> ListedRun:
    """The listing row of a run the index holds: its state and reason from the index, its
    manifest and summary read now (a crashed run's manifest marked as the store marks it);
    the store's own reading when the index says broken or a file no longer reads."""
    from perfscope.profiler.run_files import RUN_ID_PATTERN, mark_crashed, read_json_capped

    if RUN_ID_PATTERN.fullmatch(row.path.name) and row.state != "broken":
        summary: Any = None
        try:
            manifest = read_json_capped(row.path / "manifest.json")
            summary = read_json_capped(row.path / "summary.json") if row.has_summary else None
        except (OSError, ValueError, PerfscopeError):  # changed since the refresh
            manifest = None
        if isinstance(manifest, dict) and (summary is None or isinstance(summary, dict)):
            if row.state == "crashed":
                manifest = mark_crashed(manifest, row.problem)
            return ListedRun(row.path, row.state, row.problem, manifest, summary)
    from perfscope.profiler.store import inspect_run

    return _entry(inspect_run(row.path))


def _jsonable(v: Any) -> Any:
    if isinstance(v, _dt.datetime | _dt.date):
        return v.isoformat()
    return v


def print_rows(
    names: list[str],
    rows: list[tuple[Any, ...]],
    console: Console,
    *,
    as_json: bool,
    root: Path | None = None,
    listing: bool = False,
) -> None:
    """Query results as JSON records (raw SI values, whole ids) or as the shared table
    (:func:`perfscope.cli.tables.index_rows_table`: catalogue units, run ids shortened
    against the runs folder ``root``, fitted to the terminal; ``listing``: ``ls --where``'s
    headers, columns without a value left out)."""
    if as_json:
        print(json.dumps([{n: _jsonable(v) for n, v in zip(names, r, strict=True)} for r in rows]))
        return
    from perfscope.cli.tables import index_rows_table

    console.print(index_rows_table(names, rows, root, listing=listing))
    console.print(f"{len(rows)} row(s)")


def _cmd_index(args: argparse.Namespace, console: Console) -> int:
    from perfscope.api.index import open_index

    root = runs_root(args)
    with open_index(root, rebuild=args.rebuild) as index:
        _, rows = index.query("SELECT state, count(*) FROM runs GROUP BY state ORDER BY 1")
        total = index.query("SELECT count(*) FROM runs")[1][0][0]
        stats = index.last_stats
    where = "in memory only: " + (index.note or "") if not index.persistent else str(root)
    console.print(f"index of {total} run(s) ({where})")
    if stats is not None:
        console.print(f"added {stats.added}, updated {stats.updated}, removed {stats.removed}")
    if rows:
        console.print(", ".join(f"{state}: {n}" for state, n in rows))
    return 0


def _cmd_query(args: argparse.Namespace, console: Console) -> int:
    from perfscope.api.index import ALL_COLUMN_NAMES, BOOKKEEPING_DOCS, INDEX_COLUMNS, open_index
    from perfscope.errors import UsageError

    if args.columns:
        from perfscope.profiler.run_index import _BOOKKEEPING, COLUMN_UNITS

        docs = {c.name: (c.sql_type, c.doc) for c in INDEX_COLUMNS}
        docs.update({n: (t.split()[0], BOOKKEEPING_DOCS[n]) for n, t in _BOOKKEEPING})
        rows = [(n, docs[n][0], COLUMN_UNITS[n], docs[n][1]) for n in ALL_COLUMN_NAMES]
        print_rows(["column", "type", "unit", "meaning"], rows, console, as_json=args.json)
        return 0
    if not args.sql:
        raise UsageError('give a query, e.g. perfscope query "SELECT run_id FROM runs"')
    with open_index(runs_root(args), allow_files=args.allow_files) as index:
        names, rows = index.query(args.sql)
        if index.note:
            sys.stderr.write(f"note: {index.note}\n")
    print_rows(names, rows, console, as_json=args.json, root=runs_root(args))
    return 0


def add_allow_files(p: argparse.ArgumentParser) -> None:
    """``--allow-files``: let the SQL read and write files (off: one statement over the
    index only, no file functions, no extension loading)."""
    p.add_argument(
        "--allow-files",
        action="store_true",
        help="let the SQL use DuckDB's file functions (read_csv, COPY ... TO); off by default",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``index`` and ``query`` to the CLI."""
    p = sub.add_parser(
        "index",
        help="update the DuckDB index of the runs folder (used by query and ls --where)",
        description="Bring <runs root>/.perfscope-index.duckdb up to date: only runs whose "
        "manifest.json or summary.json changed are re-read.",
    )
    add_runs_dir(p)
    p.add_argument("--rebuild", action="store_true", help="re-read every run (default: changed)")
    p.set_defaults(handler=_cmd_index, reads_only=True)

    p = sub.add_parser(
        "query",
        help="answer SQL over the table 'runs' (one row per stored run)",
        description="Refresh the index, then run SQL over the table 'runs'. Values are SI "
        '(seconds, tokens/s, ratios 0-1). Example: perfscope query "SELECT run_id, '
        "ttft_p99_s FROM runs WHERE engine_kind = 'openai' ORDER BY started_at DESC LIMIT 5\"",
    )
    p.add_argument("sql", nargs="?", default=None, help="the SQL query")
    p.add_argument("--columns", action="store_true", help="list the columns of 'runs'")
    p.add_argument("--json", action="store_true", help="print JSON records instead of a table")
    add_allow_files(p)
    add_runs_dir(p)
    p.set_defaults(handler=_cmd_query, reads_only=True)
