"""Finding the runs a refresh must read, and reading many of them in worker processes.

Refreshing is incremental: each row remembers the modification time and size of the run's
``manifest.json`` and ``summary.json`` (its :data:`~perfscope.profiler.run_index.columns.FileKey`);
a refresh stats every run directory (cheap, :func:`_scan`), re-reads only the runs whose
files changed, and drops rows of runs that are gone. Plain ``perfscope ls`` looks only at the
folders that can be among the newest runs (:func:`_newest_candidates`). Times are
nanoseconds since the epoch (``st_mtime_ns``), sizes bytes.

A first build reads its runs in worker processes (:func:`_read_runs`), each a fresh
``python -m perfscope.profiler.run_index`` (:func:`_worker_main`) that hands its rows back as
an Arrow stream.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perfscope.profiler.run_index.columns import _TYPES, ALL_COLUMN_NAMES, FileKey
from perfscope.profiler.run_index.rows import Lookup, _row, safe_text

__all__ = ["PARALLEL_MIN_RUNS", "RunItem", "Scanned"]


def _stat_pair(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, -1)
    return (st.st_mtime_ns, st.st_size)


def _files_digest(run_path: str) -> int:
    """The digest of the identity of every file and folder at the top of ``run_path``."""
    parts: list[str] = []
    try:
        with os.scandir(run_path) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                parts.append(
                    f"{entry.name}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_size}\0{st.st_mode}"
                )
    except OSError:
        return 0
    parts.sort()
    digest = hashlib.blake2b("\n".join(parts).encode("utf-8", "surrogateescape"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1  # fits a signed BIGINT


def _scan(root: Path, strong: set[str] = frozenset()) -> dict[str, tuple[str, FileKey]]:  # type: ignore[assignment]
    """Run directories under ``root``, keyed by their :func:`safe_text` name, with their path
    and :data:`FileKey` (the digest form for the runs in ``strong``).

    Three ``stat`` calls per run and no JSON parsing: a refresh of an unchanged folder of
    10,000 runs takes a fraction of a second on a quiet machine.
    """
    out: dict[str, tuple[str, FileKey]] = {}
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        rid = safe_text(entry.name)
        key = _entry_key(entry, rid in strong)
        if key is not None:
            out[rid] = (entry.path, key)
    return out


def _entry_key(entry: os.DirEntry[str], strong: bool) -> FileKey | None:
    """The :data:`FileKey` of the run folder ``entry`` (the digest form when ``strong``), or
    ``None`` when it has no manifest.json (not a run) or cannot be read."""
    base = entry.path + os.sep
    manifest = _stat_pair(base + "manifest.json")
    if manifest[1] < 0:
        return None
    try:
        last = (
            _files_digest(entry.path) if strong else entry.stat(follow_symlinks=False).st_mtime_ns
        )
    except OSError:
        return None
    return (*manifest, *_stat_pair(base + "summary.json"), last)


def _newest_candidates(
    root: Path, limit: int, strong: set[str]
) -> tuple[int, dict[str, tuple[str, FileKey]]] | None:
    """The run folders that can be among the ``limit`` newest in ``perfscope ls`` order,
    with their :data:`FileKey`, read without looking at any other run; and how many
    folders the root holds. ``None`` when the root cannot be listed.

    The order is the run id's first 15 characters (its start stamp), then the start time,
    then the id: every folder whose first 15 characters are among the first ``limit``
    distinct prefixes of the runs (newest first) is a candidate, ties included."""
    try:
        entries = [
            e
            for e in os.scandir(root)
            if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
        ]
    except OSError:
        return None
    entries.sort(key=lambda e: safe_text(e.name)[:15], reverse=True)
    out: dict[str, tuple[str, FileKey]] = {}
    prefixes = 0
    last: str | None = None
    for entry in entries:
        rid = safe_text(entry.name)
        if rid[:15] != last:
            if prefixes >= limit:
                break
            last = rid[:15]
        key = _entry_key(entry, rid in strong)
        if key is None:
            continue  # not a run: it takes no place in the listing
        if len(out) == 0 or rid[:15] != next(reversed(out))[:15]:
            prefixes += 1
        out[rid] = (entry.path, key)
    return len(entries), out


#: A refresh that reads at least this many runs (a first build) reads them in worker
#: processes, one per core up to :data:`_MAX_WORKERS`: parsing each run's two JSON files
#: is most of a first build's time, one process uses one core, and a worker's start
#: (a Python interpreter and pyarrow, about 0.3 s here) is paid back from about a thousand.
PARALLEL_MIN_RUNS = 1000
_MAX_WORKERS = 8

#: What a worker runs, as ``python -m``: this package, whose ``__main__`` calls
#: :func:`_worker_main`.
_WORKER_MODULE = "perfscope.profiler.run_index"

#: The Arrow type of each column as a worker hands its rows over (timestamps stay text
#: until the INSERT casts them, as before).
_ARROW_TYPES = {
    "VARCHAR": "string",
    "TIMESTAMPTZ": "string",
    "BIGINT": "int64",
    "DOUBLE": "float64",
    "BOOLEAN": "bool_",
}

#: The run folders as one look found them (:func:`_scan`), with the broken runs it was
#: made against (they are keyed on a digest instead).
Scanned = tuple[frozenset[str], dict[str, tuple[str, FileKey]]]

#: One run to read: its id, its folder and its file key.
RunItem = tuple[str, str, FileKey]


def _read_table(items: Sequence[RunItem], lookup: Lookup, root: Path, broken: set[str]) -> Any:
    """The rows of the runs ``items`` (id, folder, file key) as one Arrow table."""
    import pyarrow as pa

    from perfscope.profiler.store import TableCheck

    tables = TableCheck()
    rows = []
    for rid, path, key in items:
        row = _row(rid, path, key, lookup, root, tables)
        if row["state"] == "broken" and rid not in broken:
            # A broken run is keyed on every file's identity from now on.
            row["files_key"] = _files_digest(path)
        rows.append(row)
    schema = pa.schema([(n, getattr(pa, _ARROW_TYPES[_TYPES[n]])()) for n in ALL_COLUMN_NAMES])
    return pa.table({n: [r[n] for r in rows] for n in ALL_COLUMN_NAMES}, schema=schema)


def _read_runs(items: Sequence[RunItem], lookup: Lookup, root: Path, broken: set[str]) -> Any:
    """The rows of ``items`` as one Arrow table: read here, or split over worker processes
    when there are at least :data:`PARALLEL_MIN_RUNS` and more than one core.

    A worker is ``python -m perfscope.profiler.run_index`` (a fresh interpreter: never a
    fork of this process, which may hold DuckDB's threads, and never a re-run of the
    caller's main module): it reads its share, pickled on its stdin, and writes the rows
    to its stdout as an Arrow stream. Whatever a worker could not deliver (it could not
    start, failed, or ``lookup`` cannot be pickled) is read here instead."""
    cores = os.cpu_count() or 1
    if len(items) < PARALLEL_MIN_RUNS or cores < 2:
        return _read_table(items, lookup, root, broken)
    import pickle
    import subprocess
    import sys

    import pyarrow as pa

    n = min(cores, _MAX_WORKERS)
    shares = [items[k::n] for k in range(n)]
    try:
        payloads = [pickle.dumps((share, lookup, root, broken)) for share in shares]
    except Exception:  # a lookup that is not a module-level function
        return _read_table(items, lookup, root, broken)
    procs: list[subprocess.Popen[bytes]] = []
    parts: list[Any] = []
    try:
        for _ in shares:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", _WORKER_MODULE],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C is this process's to handle
                )
            )
        for proc, payload in zip(procs, payloads, strict=True):
            assert proc.stdin is not None
            with proc.stdin:
                proc.stdin.write(payload)
        for proc, share in zip(procs, shares, strict=True):
            assert proc.stdout is not None
            try:
                with pa.ipc.open_stream(proc.stdout) as reader:
                    part = reader.read_all()
                ok = proc.wait() == 0 and part.num_rows == len(share)
            except (OSError, pa.ArrowInvalid):
                ok = False
            parts.append(part if ok else _read_table(share, lookup, root, broken))
    except OSError:  # no worker could start (no process left, no executable)
        return _read_table(items, lookup, root, broken)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return pa.concat_tables(parts)


class _NoPandas:
    """A module finder that refuses pandas (a reading worker's; see :func:`_worker_main`)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("an index worker does not import pandas", name=name)


def _worker_main() -> None:
    """A reading worker (:func:`_read_runs`): its share from stdin, its rows to stdout.

    Two costs of a plain interpreter are left out, since a worker lives for one share:
    the cyclic garbage collector (the parsed JSON holds no cycles, and its passes over the
    growing rows took a tenth of the read) and pandas, which pyarrow imports on its first
    ``pa.array`` only to ask whether the data is a DataFrame (0.15-0.25 s of a worker's
    start; pyarrow reads an import that fails as "no pandas")."""
    import gc
    import pickle
    import sys

    gc.disable()
    sys.meta_path.insert(0, _NoPandas())

    import pyarrow as pa

    items, lookup, root, broken = pickle.loads(sys.stdin.buffer.read())
    table = _read_table(items, lookup, root, broken)
    with pa.ipc.new_stream(sys.stdout.buffer, table.schema) as writer:
        writer.write_table(table)
