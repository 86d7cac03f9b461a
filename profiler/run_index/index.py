"""The index itself: :class:`RunIndex` over the ``runs`` table, and :func:`open_index`.

The index file lives at ``<runs root>/.perfscope-index.duckdb`` (:data:`INDEX_FILE`). The
index is a cache: deleting the file loses nothing, and a runs folder that cannot be written
(read-only, or locked by another perfscope) gets an in-memory index built for this call
instead. An index that is up to date is answered from a read-only connection, and every
connection handed out is locked down for SQL typed by a user or sent by a browser
(:func:`_lock_down`). Counts in :class:`RefreshStats` are runs.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from perfscope.errors import UsageError
from perfscope.profiler.run_index.columns import (
    _BOOKKEEPING,
    ALL_COLUMN_NAMES,
    INDEX_COLUMNS,
    INDEX_SCHEMA_VERSION,
    FileKey,
)
from perfscope.profiler.run_index.rows import Lookup, _read_json, safe_text
from perfscope.profiler.run_index.scan import Scanned, _newest_candidates, _read_runs, _scan

if TYPE_CHECKING:
    import duckdb

__all__ = ["INDEX_FILE", "NewestRun", "RefreshStats", "RunIndex", "open_index"]

INDEX_FILE = ".perfscope-index.duckdb"


@dataclass(frozen=True)
class NewestRun:
    """One of the newest runs as the index holds it (:meth:`RunIndex.newest`).

    Attributes:
        path: the run directory (as the OS spells it).
        state: the ``state`` column (complete, partial, ..., crashed, broken).
        problem: the ``problem`` column: why the state is not complete, else None.
        has_summary: summary.json exists and is perfscope's.
    """

    path: Path
    state: str
    problem: str | None
    has_summary: bool


@dataclass(frozen=True)
class RefreshStats:
    """What one refresh did.

    Attributes:
        runs: rows in the index after the refresh.
        added: runs read for the first time.
        updated: runs re-read because a file changed.
        removed: rows dropped because the run directory is gone.
        persistent: False when the index lives only in memory for this call.
        note: why the index is not persistent, if it is not.
    """

    runs: int
    added: int
    updated: int
    removed: int
    persistent: bool
    note: str | None = None


def _create_sql() -> str:
    cols = [f'"{n}" {t}' for n, t in _BOOKKEEPING]
    cols += [f'"{c.name}" {c.sql_type}' for c in INDEX_COLUMNS]
    return "CREATE TABLE runs (" + ", ".join(cols) + ")"


class RunIndex:
    """The ``runs`` table over one runs folder. Use :func:`open_index`."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, root: Path, persistent: bool, lookup: Lookup
    ) -> None:
        self._con = con
        self._lookup = lookup
        self.root = root
        self.persistent = persistent
        self.note: str | None = None
        #: What the last refresh of this folder did (None before one).
        self.last_stats: RefreshStats | None = None
        #: Run id -> the directory's real path (as the OS spells it), from the last refresh.
        self._paths: dict[str, str] = {}
        #: What the last :meth:`up_to_date` found on disk (for a refresh that follows it).
        self.scanned: Scanned | None = None

    # -- maintenance ------------------------------------------------------------------------

    def _ensure_schema(self) -> None:
        con = self._con
        con.execute("CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        got = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if got is not None and got[0] == str(INDEX_SCHEMA_VERSION):
            return
        con.execute("DROP TABLE IF EXISTS runs")
        con.execute(_create_sql())
        con.execute(
            "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(INDEX_SCHEMA_VERSION)]
        )

    def _schema_current(self) -> bool:
        """Whether the file holds a ``runs`` table of this schema version (read only)."""
        import duckdb

        try:
            got = self._con.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'"
            ).fetchone()
        except duckdb.Error:  # no meta table yet
            return False
        return got is not None and got[0] == str(INDEX_SCHEMA_VERSION)

    def _known(self) -> tuple[dict[str, FileKey], set[str]]:
        """Each indexed run's :data:`FileKey`, and the runs held as broken."""
        con = self._con
        known: dict[str, FileKey] = {
            r[0]: (r[1], r[2], r[3], r[4], r[5])
            for r in con.execute(
                "SELECT run_id, manifest_mtime_ns, manifest_size, summary_mtime_ns, "
                "summary_size, files_key FROM runs"
            ).fetchall()
        }
        broken = {
            r[0] for r in con.execute("SELECT run_id FROM runs WHERE state = 'broken'").fetchall()
        }
        return known, broken

    def _answer_as_is(self, runs: int, on_disk: dict[str, tuple[str, FileKey]]) -> bool:
        """Whether the runs of ``on_disk`` (held unchanged) can be answered as the index
        holds them: none held as running has stopped or reads differently. When they can,
        :attr:`last_stats` and the run paths are set as a refresh would set them."""
        died, reasons = self._recheck_running(on_disk, set())
        if died or reasons:
            return False
        self._paths = {rid: path for rid, (path, _) in on_disk.items()}
        self.last_stats = RefreshStats(
            runs=runs, added=0, updated=0, removed=0, persistent=self.persistent
        )
        return True

    def up_to_date(self) -> bool:
        """Whether a refresh would change nothing (read only: the schema is current, no run
        was added, changed or removed, no run held as running has stopped or reads
        differently). When it is, :attr:`last_stats` and the run paths are set as a
        refresh would set them, so a read-only connection can answer without one."""
        if not self._schema_current():
            return False
        known, broken = self._known()
        on_disk = _scan(self.root, broken)
        self.scanned = (frozenset(broken), on_disk)
        if known.keys() != on_disk.keys() or any(
            known[rid] != st for rid, (_, st) in on_disk.items()
        ):
            return False
        return self._answer_as_is(len(known), on_disk)

    def newest_up_to_date(self, limit: int) -> bool:
        """Whether the index holds the ``limit`` newest runs (``perfscope ls`` order) as they
        are now (read only): every folder that can be among them is indexed with its files
        unchanged, no indexed run among them is gone, and none of them held as running has
        stopped. Only those folders are looked at, not the whole runs folder, so plain
        ``perfscope ls`` answers in the same time at 100 runs and at 10,000. When it holds,
        :meth:`newest` answers for them (other rows may be stale until the next refresh)."""
        if not self._schema_current():
            return False
        known, broken = self._known()
        found = _newest_candidates(self.root, limit, broken)
        if found is None:
            return False
        _, on_disk = found
        if any(known.get(rid) != st for rid, (_, st) in on_disk.items()):
            return False
        # An indexed run that sorts among them but whose folder is gone or no longer a run.
        floor = min((rid[:15] for rid in on_disk), default="")
        gone = [r for r in known if r[:15] >= floor and r not in on_disk]
        if gone:
            return False
        return self._answer_as_is(len(known), on_disk)

    def refresh(self, *, rebuild: bool = False, scanned: Scanned | None = None) -> RefreshStats:
        """Bring the table up to date with the folder; ``rebuild`` re-reads every run.

        ``scanned``: the folder as :meth:`up_to_date` just found it (on another connection
        to the same file), used instead of looking at every run folder again when it was
        made against the same broken runs."""
        self._ensure_schema()
        con = self._con
        if rebuild:
            con.execute("DELETE FROM runs")
        known, broken = self._known()
        if scanned is not None and not rebuild and scanned[0] == broken:
            on_disk = scanned[1]
        else:
            on_disk = _scan(self.root, broken)
        self._paths = {rid: path for rid, (path, _) in on_disk.items()}
        stale = [rid for rid in known if rid not in on_disk]
        changed = [rid for rid, (_, st) in on_disk.items() if known.get(rid) != st]
        added = sum(1 for rid in changed if rid not in known)
        # A run that says "running" may have died since: look at its writer every time, and
        # re-read the run only when it did (its manifest alone says; no table footers).
        died, reasons = self._recheck_running(on_disk, set(changed))
        redo = changed + died
        con.execute("BEGIN TRANSACTION")
        try:
            drop = stale + [rid for rid in redo if rid in known]
            if drop:
                con.execute(
                    "DELETE FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [drop]
                )
            for rid, reason in reasons:  # still running, said differently (another host)
                con.execute("UPDATE runs SET problem = ? WHERE run_id = ?", [reason, rid])
            if redo:
                items = [(rid, *on_disk[rid]) for rid in redo]
                incoming = _read_runs(items, self._lookup, self.root.resolve(), broken)
                con.register("incoming_runs", incoming)
                try:
                    con.execute(
                        "INSERT INTO runs SELECT "
                        + ", ".join(_cast(n) for n in ALL_COLUMN_NAMES)
                        + " FROM incoming_runs"
                    )
                finally:
                    con.unregister("incoming_runs")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        total = con.execute("SELECT count(*) FROM runs").fetchone()
        self.last_stats = RefreshStats(
            runs=int(total[0]) if total else 0,
            added=added,
            updated=len(changed) - added,
            removed=len(stale),
            persistent=self.persistent,
            note=self.note,
        )
        return self.last_stats

    def _recheck_running(
        self, on_disk: dict[str, tuple[str, FileKey]], changed: set[str]
    ) -> tuple[list[str], list[tuple[str, str | None]]]:
        """The runs the index holds as ``running`` (files unchanged) whose writer has
        stopped since (to re-read), and ``(run_id, reason)`` of those still running whose
        reason now reads differently (to update in place)."""
        died: list[str] = []
        reasons: list[tuple[str, str | None]] = []
        rows = self._con.execute(
            "SELECT run_id, problem FROM runs WHERE state = 'running'"
        ).fetchall()
        if not rows:
            return died, reasons  # the common case: no store (and pyarrow) import
        from perfscope.profiler.store import run_state

        for rid, problem in rows:
            if rid not in on_disk or rid in changed:
                continue
            manifest, _ = _read_json(Path(on_disk[rid][0]) / "manifest.json")
            state = run_state(manifest) if manifest is not None else None
            if state is None or state.state != "running":
                died.append(rid)
            else:
                reason = safe_text(state.reason) if state.reason else None
                if reason != problem:
                    reasons.append((rid, reason))
        return died, reasons

    # -- queries ----------------------------------------------------------------------------

    def query(
        self, sql: str, params: Sequence[Any] = ()
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run ``sql`` (over the table ``runs``); returns column names and rows.

        Raises UsageError with DuckDB's one-line message when the SQL is wrong.
        """
        import duckdb

        try:
            statements = self._con.extract_statements(sql)
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"query failed: {first}") from None
        if len(statements) != 1:
            raise UsageError(
                f"query failed: give exactly one SQL statement (got {len(statements)})"
            )
        try:
            cur = self._con.execute(sql, list(params))
            names = [d[0] for d in (cur.description or [])]
            rows = cur.fetchall() if cur.description else []
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"query failed: {first}") from None
        return names, rows

    def select_where(
        self, where: str | None, *, limit: int | None = None
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Rows of ``runs`` matching the SQL condition ``where``, newest first."""
        sql = "SELECT * FROM runs"
        if where:
            sql += f" WHERE ({where})"
        sql += " ORDER BY started_at DESC NULLS LAST, run_id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self.query(sql)

    def newest(self, limit: int) -> list[NewestRun]:
        """The ``limit`` newest runs with their state, in ``perfscope ls`` order (the run
        id's timestamp prefix, then the start time), as the last refresh found them."""
        _, rows = self.query(
            "SELECT run_id, state, problem, has_summary FROM runs ORDER BY left(run_id, 15) "
            f"DESC, started_at DESC NULLS LAST, run_id DESC LIMIT {int(limit)}"
        )
        return [
            NewestRun(Path(self._paths.get(r[0], self.root / r[0])), r[1], r[2], bool(r[3]))
            for r in rows
        ]

    def newest_paths(self, limit: int) -> list[Path]:
        """The ``limit`` newest run directories, in ``perfscope ls`` order (the run id's
        timestamp prefix, then the start time), as the last refresh found them."""
        _, rows = self.query(
            "SELECT run_id FROM runs ORDER BY left(run_id, 15) DESC, "
            f"started_at DESC NULLS LAST, run_id DESC LIMIT {int(limit)}"
        )
        return [Path(self._paths.get(r[0], self.root / r[0])) for r in rows]

    def close(self) -> None:
        self._con.close()


def _cast(name: str) -> str:
    types = dict(_BOOKKEEPING)
    types.update({c.name: c.sql_type for c in INDEX_COLUMNS})
    sql_type = types[name].split()[0]
    if sql_type == "TIMESTAMPTZ":
        return f'TRY_CAST("{name}" AS TIMESTAMPTZ)'
    return f'CAST("{name}" AS {sql_type})'


def _lock_down(con: duckdb.DuckDBPyConnection, *, allow_files: bool) -> None:
    """Make ``con`` safe for SQL typed by a user or sent by a browser: no extension is
    installed or loaded behind the query's back, no Python variable is scanned by name, and
    (unless ``allow_files``) no file or URL outside the index can be read or written
    (``COPY ... TO``, ``read_csv``, ``ATTACH``). The configuration is then locked, so the
    query cannot ``SET`` it back."""
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET python_enable_replacements = false")
    if not allow_files:
        con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _memory_copy(db: Any, path: Path) -> duckdb.DuckDBPyConnection | None:
    """An in-memory database holding a copy of the saved index at ``path`` (opened
    read-only), or ``None`` when it cannot be read either."""
    if not path.is_file():
        return None
    con = cast("duckdb.DuckDBPyConnection", db.connect(":memory:"))
    try:
        con.execute("ATTACH ? AS saved (READ_ONLY)", [str(path)])
        con.execute("CREATE TABLE meta AS SELECT * FROM saved.meta")
        con.execute("CREATE TABLE runs AS SELECT * FROM saved.runs")
        con.execute("DETACH saved")
    except db.Error:
        con.close()
        return None
    return con


def _index_file_problem(path: Path) -> str | None:
    """Why the index file (or its write-ahead log) must not be opened: a symlink (which
    could make the index drop the ``runs`` table of a user's own DuckDB file at the link's
    target) or anything but a regular file. ``None`` when absent or a plain file."""
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{p.name}: {exc.strerror or exc}"
        if stat.S_ISLNK(st.st_mode):
            return f"{p.name} is a symbolic link; not followed"
        if not stat.S_ISREG(st.st_mode):
            return f"{p.name} is not a regular file"
    return None


def _open_problem(exc: BaseException) -> str:
    """Why the index file could not be opened for writing, short: DuckDB's lock conflict
    is a paragraph (with a link) that the dashboard's status line would carry whole."""
    text = str(exc)
    held = re.search(r"Conflicting lock is held in .*?\(PID (\d+)\)", text)
    if held:
        return f"another process, PID {held[1]}, holds the index file"
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _import_duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise UsageError(
            "the run index needs duckdb: pip install 'perfscope[index]' (or pip install duckdb)"
        ) from None
    return duckdb


def _read_only_index(
    db: Any, path: Path, root: Path, lookup: Lookup, newest: int | None = None
) -> tuple[RunIndex | None, Scanned | None]:
    """The index at ``path`` opened read-only when it is up to date with ``root``
    (:meth:`RunIndex.up_to_date`; with ``newest``, for the ``newest`` newest runs only:
    :meth:`RunIndex.newest_up_to_date`), else ``None`` (also when it cannot be opened so),
    with what the check found on disk (for the refresh that follows a failed check)."""
    try:
        con = db.connect(str(path), read_only=True)
    except (db.Error, OSError):
        return None, None
    index = RunIndex(con, root, True, lookup)
    try:
        if index.newest_up_to_date(newest) if newest is not None else index.up_to_date():
            return index, None
    except (db.Error, OSError):
        pass
    index.close()
    return None, index.scanned


@contextmanager
def open_index(
    root: Path,
    *,
    lookup: Lookup,
    refresh: bool = True,
    rebuild: bool = False,
    on_refresh: Callable[[RefreshStats], None] | None = None,
    allow_files: bool = False,
    newest: int | None = None,
) -> Iterator[RunIndex]:
    """Open (and by default refresh) the index of runs folder ``root``.

    ``newest``: the caller reads only the ``newest`` newest runs (:meth:`RunIndex.newest`,
    plain ``perfscope ls``), so an index that holds those as they are is used as it is,
    without looking at the other runs' files; otherwise it is refreshed as usual.

    The connection handed out is locked down for untrusted SQL (:func:`_lock_down`): no
    extension auto-loading and, unless ``allow_files``, no access to files outside the
    index. A symlinked index file is never opened (the index is built in memory instead).

    The index file lives at ``root/.perfscope-index.duckdb``. When it cannot be written (a
    read-only folder, a full disk, another process holding DuckDB's lock) the index is built in
    memory for this call and ``RunIndex.note`` says why. After the refresh the connection is
    reopened read-only, so a query cannot change the index. ``lookup`` reads a dotted path
    of a manifest or summary (the catalogue's ``value_at``).
    """
    duckdb = _import_duckdb()
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise UsageError(f"runs folder {str(root)!r} is a file; pass a folder with --runs-dir")
    path = root / INDEX_FILE
    note: str | None = None
    con = None
    con_is_copy = False
    scanned: Scanned | None = None
    problem = _index_file_problem(path) if root.is_dir() else None
    if problem is None and refresh and not rebuild and path.is_file():
        # The common case (nothing changed since the last refresh): answer from a read-only
        # connection, without opening the file for writing and reopening it (each open of
        # the file costs tens of milliseconds).
        ro, scanned = _read_only_index(duckdb, path, root, lookup, newest)
        if ro is not None:
            try:
                if on_refresh is not None and ro.last_stats is not None:
                    on_refresh(ro.last_stats)
                _lock_down(ro._con, allow_files=allow_files)
                yield ro
            finally:
                ro.close()
            return
    if problem is not None:
        note = f"index not saved ({problem}); built in memory"
    elif root.is_dir():
        try:
            con = duckdb.connect(str(path))
        except (duckdb.Error, OSError) as exc:
            first = _open_problem(exc)
            # Another process holds the file (a query, a DuckDB shell): start from a copy
            # of what it holds, so the refresh below is incremental, not a full rebuild.
            con = _memory_copy(duckdb, path)
            note = f"index not saved ({first}); " + (
                "refreshed in memory from the saved index" if con is not None else "built in memory"
            )
            con_is_copy = con is not None
    else:
        note = f"runs folder {str(root)!r} does not exist"
    persistent = con is not None and not con_is_copy
    if con is None:
        con = duckdb.connect(":memory:")
    index = RunIndex(con, root, persistent, lookup)
    index.note = note
    try:
        if refresh:
            try:
                stats = index.refresh(rebuild=rebuild, scanned=scanned)
            except (duckdb.IOException, OSError) as exc:
                if not persistent:
                    raise
                # A full disk or similar while writing the cache: fall back to memory.
                con.close()
                con = duckdb.connect(":memory:")
                index = RunIndex(con, root, False, lookup)
                index.note = f"index not saved ({str(exc).splitlines()[0]}); built in memory"
                stats = index.refresh()
            if on_refresh is not None:
                on_refresh(stats)
        if index.persistent:
            index.close()
            last = index.last_stats
            try:
                paths = index._paths
                index = RunIndex(duckdb.connect(str(path), read_only=True), root, True, lookup)
                index.last_stats = last
                index._paths = paths
            except duckdb.Error:
                # Another writer got the lock between close and reopen: answer from memory.
                mem = RunIndex(duckdb.connect(":memory:"), root, False, lookup)
                mem.note = "index busy; built in memory"
                mem.refresh()
                index = mem
        _lock_down(index._con, allow_files=allow_files)
        yield index
    finally:
        index.close()
