"""Run directories: manifest.json, Parquet tables, summary.json (docs/architecture.md).

The store owns runs: it creates run directories, validates run ids, lists and reads runs,
and holds the one atomic writer every component uses (a temp file in the same folder, then
``os.replace``), so a reader never sees half a file and a failed write leaves no temp file.
A failed write raises :class:`~perfscope.errors.StorageError` with one line naming the file
and the cause (disk full, read-only, permission).

Reading never writes. A run is read in one of these states (:class:`RunState`):

- ``complete`` / ``interrupted`` / ``failed``: as the manifest says;
- ``running``: the manifest says so and the process that writes it is alive (same host:
  its pid exists and started when recorded; another host: its heartbeat advances, see
  below);
- ``crashed``: the manifest says ``running`` but that process is gone (or, on another
  host, its heartbeat stood still too long). Its tables are read from the segment files
  flushed during the
  run; the manifest read back has ``status: crashed``, ``partial: true`` and the reason
  among its ``warnings`` (in memory only);
- ``broken``: a file is malformed (a wrong-typed manifest field, a table with foreign
  columns) or larger than the cap on run files (:func:`json_cap_bytes`);
  :func:`read_run` raises :class:`~perfscope.errors.BrokenRunError` naming the file, the
  field and the problem, and :func:`scan_runs` lists it with that reason.

Another host's run is never judged by comparing its wall clock with this one's (skew made a
dead run read ``running`` for hours). The writer numbers its heartbeats (``heartbeat_seq``,
one more per flush); a reader remembers when, on this host's monotonic clock, it first saw
each sequence number (in memory, and in ``$PERFSCOPE_CACHE_DIR/heartbeats.json`` so that
one-shot commands remember too). A sequence that stood still for :data:`STALE_HEARTBEAT_S`
reads ``crashed``; one that was seen to advance reads ``running``; a reader with no earlier
look says ``running`` with the reason "heartbeat not confirmed yet" rather than guess.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import pandas as pd

from perfscope.errors import BrokenRunError, RunNotFoundError, StorageError, UsageError
from perfscope.profiler.parquet_footer import SchemaKeys
from perfscope.profiler.records import (
    ACTORS_SCHEMA,
    CHUNK_SCHEMA,
    REQUEST_SCHEMA,
    REQUEST_TABLE_SCHEMA,
    STEP_SCHEMA,
    STEP_TABLE_SCHEMA,
    TELEMETRY_SCHEMA,
    Manifest,
)
from perfscope.profiler.run_files import (
    RUN_ID_PATTERN,
    json_cap_bytes,
    mark_crashed,
    read_json_capped,
)
from perfscope.profiler.segments import SEGMENTS_DIR, SegmentRead, read_segments, storage_error

__all__ = [
    "DEFAULT_RUNS_DIR",
    "EXTRA_TABLES",
    "RESERVED_DIRS",
    "RUN_ID_PATTERN",
    "TABLES",
    "InvalidRunIdError",
    "RunEntry",
    "RunState",
    "RunWriter",
    "StoredRun",
    "TableCheck",
    "default_runs_root",
    "inspect_run",
    "json_cap_bytes",
    "list_runs",
    "liveness_record",
    "manifest_problems",
    "new_run_dir",
    "read_json_capped",
    "read_run",
    "remove_segments",
    "resolve_run_path",
    "run_state",
    "scan_runs",
    "stored_table_names",
    "summary_problem",
    "table_problems",
    "validate_run_id",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_table_atomic",
    "write_text_atomic",
]

DEFAULT_RUNS_DIR = "perfscope-runs"


def default_runs_root() -> Path:
    """``$PERFSCOPE_RUNS_DIR`` or ``./perfscope-runs``."""
    return Path(os.environ.get("PERFSCOPE_RUNS_DIR") or DEFAULT_RUNS_DIR)


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return s[:40] or "run"


#: A run id is one directory name: starts with a letter or digit, then letters, digits,
#: ``.``, ``_`` or ``-`` (what :func:`new_run_dir` creates, and nothing that could climb out
#: of the runs directory).

#: Folders under the runs root that are not runs (``perfscope sweep`` writes ``sweeps/``,
#: ``perfscope study --save`` writes ``studies/``).
RESERVED_DIRS = frozenset({"sweeps", "studies", "noise"})


class InvalidRunIdError(UsageError):
    """A run id that is not a plain directory name under the runs directory."""


def validate_run_id(runs_dir: Path, run_id: object) -> Path:
    """The run directory ``runs_dir/run_id``, after checking ``run_id`` is safe.

    Raises:
        InvalidRunIdError: ``run_id`` is not a string matching :data:`RUN_ID_PATTERN`
            (so it holds no ``/``, ``\\``, ``..`` or absolute path), or it resolves
            (through a symlink) outside ``runs_dir``.
        RunNotFoundError: it is well-formed but no such directory exists.
    """
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id) or ".." in run_id:
        shown = repr(run_id)[:80]
        raise InvalidRunIdError(
            f"invalid run id {shown}: a run id is a directory name under the runs directory"
        )
    root = runs_dir.resolve()
    path = runs_dir / run_id
    if not path.is_dir():
        raise RunNotFoundError(f"no run {run_id!r} in {str(runs_dir)!r}")
    if path.resolve().parent != root:
        raise InvalidRunIdError(f"run id {run_id!r} points outside the runs directory")
    return path


def new_run_dir(root: Path, name: str, started_at: datetime) -> Path:
    """Create ``root/<YYYYMMDD-HHMMSS>-<name>-<4 hex>`` and return it.

    Raises:
        UsageError: ``root`` exists and is not a folder.
        StorageError: the folder cannot be created (disk full, read-only, permission).
    """
    if root.exists() and not root.is_dir():
        raise UsageError(f"runs folder {str(root)!r} is a file; give a folder with --runs-dir")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(root, exc) from None
    stamp = started_at.astimezone().strftime("%Y%m%d-%H%M%S")
    for _ in range(20):
        path = root / f"{stamp}-{_slug(name)}-{secrets.token_hex(2)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise storage_error(path, exc) from None
        return path
    raise RuntimeError(f"could not create a unique run directory under {root}")


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _atomic(path: Path, write: Callable[[str], None]) -> None:
    """Write via ``write(tmp)`` then rename; no temp file survives a failure."""
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; run files are meant to be shared
        write(tmp)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise storage_error(path, exc) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (StorageError on failure, no temp left)."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    _atomic(path, write)


def write_stream_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Stream into ``path`` atomically: ``write(f)`` writes to a binary file object (gzip-
    compressed when ``path`` ends in ``.gz``), which replaces ``path`` only when complete.
    For outputs too big to hold in memory (a Perfetto trace of a million chunks)."""

    def into(tmp: str) -> None:
        if path.suffix == ".gz":
            with gzip.open(tmp, "wb") as gz:
                write(gz)  # type: ignore[arg-type]  # GzipFile is a binary stream
        else:
            with open(tmp, "wb", buffering=1 << 20) as f:
                write(f)

    _atomic(path, into)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; the report and exports use this."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON (NaN/inf written as null)."""
    write_text_atomic(path, json.dumps(_clean(obj), indent=2, allow_nan=False) + "\n")


def write_table_atomic(path: Path, table: pa.Table) -> None:
    def write(tmp: str) -> None:
        pq.write_table(table, tmp)

    _atomic(path, write)


def _clean(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats → None, numpy scalars → Python, tuples → lists."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and not isinstance(obj, str | bytes):
        try:
            obj = obj.item()
        except (ValueError, TypeError):
            return str(obj)
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


# --- bounded reads ----------------------------------------------------------------------

# The cap and the capped reader live in :mod:`perfscope.profiler.run_files` (no pyarrow),
# so the run index's listing path reads run files without importing the store.

# --- liveness ---------------------------------------------------------------------------

#: On another host, a run whose heartbeat sequence has not advanced for this long (seconds,
#: on this host's monotonic clock) reads as crashed.
STALE_HEARTBEAT_S = 60.0
#: The heartbeats this host has watched, in the user's cache folder.
HEARTBEATS_FILE = "heartbeats.json"
#: Watched heartbeats older than this (seconds) are forgotten.
_HEARTBEAT_MEMORY_S = 7 * 86400.0


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (Linux), else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


def liveness_record(interval_s: float, seq: int = 0) -> dict[str, Any]:
    """The manifest's ``process`` entry: who writes the run, and when it last flushed.

    ``heartbeat_seq`` is ``seq``, one more at every heartbeat: what another host's reader
    watches (``heartbeat_unix`` is this host's wall clock, for people, never compared)."""
    pid = os.getpid()
    now = time.time()
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "start_ticks": _proc_start_ticks(pid),
        "heartbeat_seq": seq,
        "heartbeat_unix": now,
        "heartbeat_at": datetime.fromtimestamp(now).astimezone().isoformat(),
        "flush_interval_s": interval_s,
    }


@dataclass
class _Watch:
    """One heartbeat as this host watched it: ``token`` (sequence and stamp), ``first_s``
    (this host's ``time.monotonic()`` when that token was first seen) and whether the
    heartbeat was ever seen to change."""

    token: str
    first_s: float
    advanced: bool


_WATCHED: dict[str, _Watch] = {}
_WATCH_LOCK = threading.Lock()


def _boot_id() -> str:
    """This boot's id (monotonic readings of another boot mean nothing), else ''."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _heartbeats_path() -> Path:
    env = os.environ.get("PERFSCOPE_CACHE_DIR")
    root = Path(env) if env else Path.home() / ".cache" / "perfscope"
    return root / HEARTBEATS_FILE


def _load_watched() -> dict[str, _Watch]:
    """The heartbeats other processes on this host watched (empty when none, unreadable,
    or from another boot)."""
    try:
        data = read_json_capped(_heartbeats_path(), 1 << 20)
    except (OSError, ValueError, BrokenRunError):
        return {}
    if not isinstance(data, dict) or data.get("boot_id") != _boot_id():
        return {}
    out: dict[str, _Watch] = {}
    for key, v in (data.get("watched") or {}).items():
        if isinstance(v, list) and len(v) == 3 and isinstance(v[1], int | float):
            out[str(key)] = _Watch(str(v[0]), float(v[1]), bool(v[2]))
    return out


def _save_watched(now_s: float) -> None:
    """Write the watched heartbeats (recent ones) to the cache; best effort: a cache that
    cannot be written only makes the next one-shot reader start without memory."""
    merged = {**_load_watched(), **_WATCHED}  # other readers' watches are kept too
    keep = {
        k: [w.token, w.first_s, w.advanced]
        for k, w in merged.items()
        if now_s - w.first_s < _HEARTBEAT_MEMORY_S
    }
    path = _heartbeats_path()
    with contextlib.suppress(OSError, StorageError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"boot_id": _boot_id(), "watched": keep})


def _watch(key: str, token: str, now_s: float) -> _Watch | None:
    """This host's record of heartbeat ``key`` after seeing ``token`` at ``now_s``
    (monotonic): None on the first look ever (nothing to compare with)."""
    with _WATCH_LOCK:
        seen = _WATCHED.get(key)
        if seen is None:
            seen = _load_watched().get(key)
        if seen is not None and seen.token == token:
            _WATCHED[key] = seen
            return seen
        fresh = _Watch(token, now_s, advanced=seen is not None)
        _WATCHED[key] = fresh
        _save_watched(now_s)
        return fresh if seen is not None else None


def _remote_state(
    run_id: str,
    proc: dict[str, Any],
    pid: int,
    host: str,
    stale_after_s: float,
    now_s: float | None,
) -> RunState:
    """Another host's run, judged by its heartbeat sequence as this host watched it."""
    seq = proc.get("heartbeat_seq")
    seq_txt = f"heartbeat {seq}" if isinstance(seq, int) else "heartbeat"
    # Older writers record no sequence: their stamp still changes at every beat.
    token = f"{seq}|{proc.get('heartbeat_unix')}|{proc.get('heartbeat_at')}"
    key = f"{host}|{pid}|{proc.get('start_ticks')}|{run_id}"
    now = time.monotonic() if now_s is None else now_s
    seen = _watch(key, token, now)
    who = f"process {pid} on {host}"
    if seen is None:
        return RunState(
            "running",
            f"being written by {who} (heartbeat not confirmed yet: first look from this "
            f"host; crashed if its {seq_txt} stands still for {stale_after_s:.0f} s)",
        )
    still = now - seen.first_s
    if still > stale_after_s:
        return RunState(
            "crashed",
            f"{seq_txt} of {who} has not advanced for {still:.0f} s (watched from this host)",
        )
    if not seen.advanced:
        return RunState(
            "running",
            f"being written by {who} (heartbeat not confirmed yet: {seq_txt} unchanged for "
            f"{still:.0f} s of {stale_after_s:.0f} s)",
        )
    return RunState("running", f"being written by {who} ({seq_txt} advancing)")


def _pid_gone(pid: int, start_ticks: Any) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # exists, owned by someone else
    except OSError:
        return True
    if _proc_state(pid) in ("Z", "X"):
        return True  # killed, not yet reaped by its parent
    if isinstance(start_ticks, int):
        now_ticks = _proc_start_ticks(pid)
        if now_ticks is not None and now_ticks != start_ticks:
            return True  # the pid was reused by another process
    return False


@dataclass(frozen=True)
class RunState:
    """How a run reads now: ``state`` (complete, running, interrupted, failed, crashed,
    broken) and why, when it is not complete."""

    state: str
    reason: str | None = None

    @property
    def partial(self) -> bool:
        """True when the tables hold only part of what the run meant to capture."""
        return self.state != "complete"


def run_state(
    manifest: dict[str, Any],
    *,
    stale_after_s: float = STALE_HEARTBEAT_S,
    now_s: float | None = None,
) -> RunState:
    """The state of a run from its manifest (and a look at its writer's process).

    Args:
        stale_after_s: another host's run reads crashed once its heartbeat sequence stood
            still this long (seconds of this host's monotonic clock).
        now_s: this host's ``time.monotonic()`` now (default: read it).
    """
    status = manifest.get("status")
    if not isinstance(status, str):
        return RunState("broken", f"manifest.json: field 'status' is {type(status).__name__}")
    errors = manifest.get("errors")
    last_error = str(errors[-1])[:200] if isinstance(errors, list) and errors else None
    if status != "running":
        return RunState(status, None if status == "complete" else last_error)
    proc = manifest.get("process")
    if not isinstance(proc, dict) or not isinstance(proc.get("pid"), int):
        return RunState(
            "crashed",
            "the manifest still says running but records no live process (written by an "
            "older perfscope or cut short)",
        )
    pid, host = int(proc["pid"]), str(proc.get("host") or "")
    at = str(proc.get("heartbeat_at") or "")
    beat_txt = f" (last heartbeat {at[11:19]})" if len(at) >= 19 else ""
    if host == socket.gethostname():
        if _pid_gone(pid, proc.get("start_ticks")):
            return RunState("crashed", f"process {pid} on {host} is gone{beat_txt}")
        return RunState("running", f"being written by process {pid}")
    run_id = str(manifest.get("run_id") or "")
    return _remote_state(run_id, proc, pid, host, stale_after_s, now_s)


# --- validation -------------------------------------------------------------------------

_DICT, _STR, _LIST = (dict,), (str,), (list,)
_MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "run_id": _STR,
    "name": _STR,
    "status": _STR,
    "started_at": _STR,
    "engine": _DICT,
    "workload": _DICT,
    "load": _DICT,
    "slos": _DICT,
    "telemetry": _DICT,
    "host": _DICT,
    "errors": _LIST,
    "warnings": _LIST,
    "process": _DICT,
}
_NULLABLE = {"hardware": _DICT, "ended_at": _STR}


def manifest_problems(manifest: Any) -> list[str]:
    """What is wrong with a manifest, as ``manifest.json: field 'x' ...`` sentences."""
    if not isinstance(manifest, dict):
        return [f"manifest.json: holds a {type(manifest).__name__}, not a JSON object"]
    out: list[str] = []
    for name, types in {**_MANIFEST_FIELDS, **_NULLABLE}.items():
        if name not in manifest:
            continue
        value = manifest[name]
        if value is None and (name in _NULLABLE or name in ("telemetry", "process")):
            continue
        if not isinstance(value, types) or isinstance(value, bool):
            want = {"dict": "an object", "str": "a string", "list": "a list"}[types[0].__name__]
            out.append(
                f"manifest.json: field {name!r} is {type(value).__name__} "
                f"({json.dumps(value)[:40]}), expected {want}"
            )
    engine = manifest.get("engine")
    if isinstance(engine, dict):
        for key in ("uri", "kind"):
            if key in engine and not isinstance(engine[key], str):
                out.append(
                    f"manifest.json: field 'engine.{key}' is {type(engine[key]).__name__}, "
                    "expected a string"
                )
        for key in ("model", "config"):
            if engine.get(key) is not None and not isinstance(engine[key], dict):
                out.append(
                    f"manifest.json: field 'engine.{key}' is {type(engine[key]).__name__}, "
                    "expected an object"
                )
    slos = manifest.get("slos")
    if isinstance(slos, dict):
        for k, v in slos.items():
            if not isinstance(v, int | float) or isinstance(v, bool):
                out.append(
                    f"manifest.json: field 'slos.{k}' is {type(v).__name__}, expected seconds"
                )
    return out


def _summary_problem(summary: Any) -> str | None:
    if not isinstance(summary, dict):
        return f"summary.json: holds a {type(summary).__name__}, not a JSON object"
    schema = summary.get("schema")
    if not isinstance(schema, str) or not schema.startswith("perfscope.summary/"):
        return f"summary.json: schema {schema!r} is not a perfscope summary"
    for key in ("latency", "counts", "throughput"):
        if key in summary and not isinstance(summary[key], dict):
            return (
                f"summary.json: field {key!r} is {type(summary[key]).__name__}, expected an object"
            )
    return None


def _type_ok(actual: pa.DataType, wanted: pa.DataType) -> bool:
    t = pa.types
    if t.is_null(actual):
        return True
    if t.is_integer(wanted):
        return bool(t.is_integer(actual))
    if t.is_floating(wanted):
        return bool(t.is_floating(actual) or t.is_integer(actual))
    if t.is_string(wanted):
        return bool(t.is_string(actual) or t.is_large_string(actual))
    if t.is_boolean(wanted):
        return bool(t.is_boolean(actual))
    if t.is_list(wanted):
        return bool(t.is_list(actual) or t.is_large_list(actual))
    return bool(actual == wanted)


#: Columns a table must have; the others of its schema are added as nulls when missing
#: (telemetry gained columns over time).
_REQUIRED = {
    "requests": REQUEST_SCHEMA.names,
    "chunks": CHUNK_SCHEMA.names,
    "steps": STEP_SCHEMA.names,
    "telemetry": ["t", "device"],
}


def _schema_problems(fname: str, actual: pa.Schema, schema: pa.Schema, name: str) -> list[str]:
    out = []
    for f in schema:
        idx = actual.get_field_index(f.name)
        if idx < 0:
            if f.name in _REQUIRED[name]:
                out.append(f"{fname}: column {f.name!r} is missing")
            continue
        if not _type_ok(actual.field(idx).type, f.type):
            out.append(f"{fname}: column {f.name!r} is {actual.field(idx).type}, expected {f.type}")
    return out


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    cols = []
    for f in schema:
        if f.name in table.column_names:
            cols.append(table.column(f.name).cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, type=f.type))
    return pa.Table.from_arrays(cols, schema=schema)


#: Table name → schema of the Parquet files in a run directory.
TABLES: dict[str, pa.Schema] = {
    # The core columns are required; the optional ones (send-path stamps, finish reason,
    # cached tokens; the steps' speculative-decoding columns) are added as nulls for runs
    # written before them.
    "requests": REQUEST_TABLE_SCHEMA,
    "chunks": CHUNK_SCHEMA,
    "steps": STEP_TABLE_SCHEMA,
    "telemetry": TELEMETRY_SCHEMA,
}


# --- reading ----------------------------------------------------------------------------


@dataclass
class StoredRun:
    """A run directory read back. Tables that were never written are empty frames with
    the right columns.

    Attributes:
        state: how the run reads now (see the module docstring); ``crashed`` runs also
            have ``manifest["status"] == "crashed"`` in this copy.
        notes: what a reader should know (tables read from segments, summary ignored).
        from_segments: names of the tables read from segment files (not compacted).
        server_metrics: ``server_metrics.parquet`` (the server's own Prometheus metrics)
            when the run has it and it reads; ``None`` otherwise (or ``tables=False``).
    """

    path: Path
    manifest: dict[str, Any]
    requests: pd.DataFrame
    chunks: pd.DataFrame
    steps: pd.DataFrame
    telemetry: pd.DataFrame
    summary: dict[str, Any] | None
    state: RunState = field(default_factory=lambda: RunState("complete"))
    notes: list[str] = field(default_factory=list)
    from_segments: list[str] = field(default_factory=list)
    server_metrics: pd.DataFrame | None = None

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id", self.path.name))

    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "unknown"))

    @property
    def partial(self) -> bool:
        return self.state.partial


def _read_parquet(path: Path, name: str, schema: pa.Schema) -> pa.Table:
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise BrokenRunError(f"{path}: cannot be read as Parquet ({exc})") from None
    problems = _schema_problems(path.name, table.schema, schema, name)
    if problems:
        raise BrokenRunError(f"run {path.parent.name!r} is broken: " + "; ".join(problems))
    return _conform(table, schema)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of run directory ``path``; RunNotFoundError when missing or broken."""
    mpath = path / "manifest.json"
    if not path.is_dir():
        raise RunNotFoundError(f"run directory {str(path)!r} does not exist")
    if not mpath.is_file():
        raise RunNotFoundError(
            f"{str(path)!r} is not a perfscope run (no manifest.json); "
            "give a folder listed by 'perfscope ls'"
        )
    try:
        data = read_json_capped(mpath)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BrokenRunError(f"cannot read {mpath}: {exc}") from None
    if not isinstance(data, dict):
        raise BrokenRunError(f"{mpath} does not hold a JSON object")
    return data


def _mark_state(manifest: dict[str, Any], state: RunState) -> dict[str, Any]:
    """The manifest as read: a crashed run says so (in this copy only)."""
    return mark_crashed(manifest, state.reason) if state.state == "crashed" else manifest


def read_run(path: Path | str, *, tables: bool = True) -> StoredRun:
    """Load a run directory; ``tables=False`` skips the tables (fast listing). Never writes.

    Tables come from the Parquet files, or, for a run that never compacted them (crashed,
    still running, stopped by a full disk), from its segment files.

    Raises:
        RunNotFoundError: no such run directory or no manifest.
        BrokenRunError: a malformed manifest, summary-independent table or column.
    """
    path = Path(path)
    manifest = read_manifest(path)
    problems = manifest_problems(manifest)
    if problems:
        raise BrokenRunError(f"run {path.name!r} is broken: " + "; ".join(problems))
    state = run_state(manifest)
    manifest = _mark_state(manifest, state)
    notes: list[str] = []
    frames: dict[str, pd.DataFrame] = {}
    from_segments: list[str] = []
    segs: SegmentRead | None = None
    looked = False
    for name, schema in TABLES.items():
        ppath = path / f"{name}.parquet"
        if not tables:
            frames[name] = schema.empty_table().to_pandas()
            continue
        if ppath.exists():
            frames[name] = _read_parquet(ppath, name, schema).to_pandas()
            continue
        if not looked:
            segs, looked = read_segments(path), True
        if segs is not None:
            frames[name] = _conform(segs.tables[name], schema).to_pandas()
            from_segments.append(name)
        else:
            frames[name] = schema.empty_table().to_pandas()
    if segs is not None:
        notes.append(
            "tables read from the segment files flushed during the run ("
            + ", ".join(n for n in from_segments if len(frames[n]))
            + ")"
            + (": " + "; ".join(segs.notes) if segs.notes else "")
        )
    summary: dict[str, Any] | None = None
    spath = path / "summary.json"
    if spath.is_file():
        try:
            loaded = read_json_capped(spath)
        except BrokenRunError as exc:
            notes.append(f"summary.json ignored: {exc}")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            notes.append(f"summary.json ignored: unreadable ({type(exc).__name__})")
        else:
            problem = _summary_problem(loaded)
            if problem:
                notes.append(f"{problem}; ignored (the summary is computed from the tables)")
            else:
                summary = loaded
    return StoredRun(
        path=path,
        manifest=manifest,
        summary=summary,
        state=state,
        notes=notes,
        from_segments=from_segments,
        server_metrics=_read_server_metrics(path) if tables else None,
        **frames,
    )


@dataclass(frozen=True)
class RunEntry:
    """One run directory as a listing shows it (never raises while listing).

    Attributes:
        state: see :class:`RunState`; ``broken`` when a file is malformed.
        reason: why the run is not complete (or what is broken), else None.
        manifest: the manifest as read (None when broken); crashed runs say so in it.
        summary: summary.json when present and valid.
    """

    path: Path
    state: str
    reason: str | None
    manifest: dict[str, Any] | None
    summary: dict[str, Any] | None

    @property
    def run_id(self) -> str:
        return self.path.name


class TableCheck:
    """:func:`table_problems` over many runs: the verdict on a table's schema is kept per
    schema key (:class:`~perfscope.profiler.parquet_footer.SchemaKeys`: the footer's schema
    elements and key/value metadata, read in Python in tens of microseconds), so pyarrow
    opens one footer per distinct schema instead of every file (about 0.2-0.3 ms each).
    A file whose footer the key reader does not follow is opened with pyarrow as before."""

    def __init__(self) -> None:
        self._keys = SchemaKeys()
        self._verdicts: dict[tuple[str, bytes], list[str]] = {}

    def problems(self, path: str | os.PathLike[str]) -> list[str]:
        """Why the run's tables at ``path`` do not match the store's schemas (as
        :func:`table_problems`)."""
        problems: list[str] = []
        base = os.fspath(path)
        for name, schema in TABLES.items():
            file = f"{name}.parquet"
            ppath = os.path.join(base, file)
            is_file, key = self._keys.file_key(ppath)
            if not is_file:
                continue
            if key is not None and (name, key) in self._verdicts:
                problems.extend(self._verdicts[(name, key)])
                continue
            try:
                actual = pq.read_schema(ppath)
            except (OSError, pa.ArrowInvalid) as exc:
                problems.append(f"{file}: cannot be read as Parquet ({exc})")
                continue
            verdict = _schema_problems(file, actual, schema, name)
            if key is not None:
                self._verdicts[(name, key)] = verdict
            problems.extend(verdict)
        return problems


def table_problems(path: Path, check: TableCheck | None = None) -> list[str]:
    """Why the run's Parquet tables do not match the run store's schemas (footers only);
    empty when every table present is readable and has the columns the store writes.
    ``check`` carries verdicts over from earlier runs (a listing of many runs)."""
    return (check or TableCheck()).problems(path)


def summary_problem(summary: Any) -> str | None:
    """Why a parsed ``summary.json`` is not a perfscope summary (``None`` when it is)."""
    return _summary_problem(summary)


def inspect_run(path: Path) -> RunEntry:
    """The listing entry of one run directory: its state and reason; never raises."""
    if not RUN_ID_PATTERN.fullmatch(path.name):
        return RunEntry(path, "broken", "not a run id (bad folder name)", None, None)
    if not (path / "manifest.json").is_file():
        return RunEntry(path, "broken", "no manifest.json", None, None)
    try:
        manifest = read_manifest(path)
    except RunNotFoundError as exc:
        return RunEntry(path, "broken", str(exc), None, None)
    problems = manifest_problems(manifest) + table_problems(path)
    if problems:
        return RunEntry(path, "broken", "; ".join(problems), None, None)
    state = run_state(manifest)
    manifest = _mark_state(manifest, state)
    summary: dict[str, Any] | None = None
    reason = state.reason
    spath = path / "summary.json"
    if spath.is_file():
        try:
            loaded = read_json_capped(spath)
            problem = _summary_problem(loaded)
        except BrokenRunError as exc:  # over the size cap: as the index lists it
            return RunEntry(path, "broken", str(exc), None, None)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            loaded, problem = None, f"summary.json: unreadable ({type(exc).__name__})"
        if problem:
            reason = f"{reason}; {problem}" if reason else problem
        else:
            summary = loaded
    return RunEntry(path, state.state, reason, manifest, summary)


def resolve_run_path(ref: str | Path, root: Path | None = None) -> Path:
    """A run given as a path, a run id under ``root`` or ``latest``.

    ``latest`` is the newest run that is neither broken nor still being written (a
    crashed, interrupted or failed run can be latest: it reads as such everywhere).
    """
    p = Path(ref)
    if str(ref) != "latest" and p.is_dir():
        return p
    if p.is_absolute() or len(p.parts) > 1:
        raise RunNotFoundError(f"run directory {str(p)!r} does not exist")
    base = root or default_runs_root()
    if str(ref) == "latest":
        entries = scan_runs(base)
        usable = [e for e in entries if e.state not in ("broken", "running")]
        if not usable:
            why = f" ({len(entries)} broken or still running)" if entries else ""
            raise RunNotFoundError(f"no readable finished run in {str(base)!r}{why}")
        return usable[0].path
    if RUN_ID_PATTERN.fullmatch(str(ref)) and (base / str(ref)).is_dir():
        return base / str(ref)
    matches = [
        r for r in list_runs(base) if r.name.startswith(str(ref)) or r.name.endswith(str(ref))
    ]
    if len(matches) == 1:
        return matches[0]
    raise RunNotFoundError(
        f"run {str(ref)!r} not found (looked for a folder and for a run id in {str(base)!r}); "
        "'perfscope ls' lists runs"
    )


def _mtime(p: Path) -> float:
    try:
        return (p / "manifest.json").stat().st_mtime
    except OSError:
        return 0.0


def list_runs(root: Path) -> list[Path]:
    """Run directories under ``root`` (those with a manifest), newest first; never raises."""
    try:
        if not root.is_dir():
            return []
        runs = [
            p
            for p in root.iterdir()
            if p.is_dir()
            and not p.name.startswith(".")
            and p.name not in RESERVED_DIRS
            and (p / "manifest.json").is_file()
        ]
    except OSError:
        return []
    return sorted(runs, key=lambda p: (p.name[:15], _mtime(p)), reverse=True)


def scan_runs(root: Path) -> list[RunEntry]:
    """Every run directory under ``root`` with its state, newest first; never raises."""
    return [inspect_run(p) for p in list_runs(root)]


def remove_segments(run_dir: Path) -> None:
    """Delete a run's segment files once its tables are compacted (best effort)."""
    seg = run_dir / SEGMENTS_DIR
    if not seg.is_dir():
        return
    for f in seg.iterdir():
        with contextlib.suppress(OSError):
            f.unlink()
    with contextlib.suppress(OSError):
        seg.rmdir()


# --- writing a run ------------------------------------------------------------------------


def _read_server_metrics(path: Path) -> pd.DataFrame | None:
    from perfscope.profiler.server_metrics import read_server_metrics

    return read_server_metrics(path)


def _server_metrics_schema() -> pa.Schema:
    from perfscope.profiler.server_metrics import SERVER_METRICS_SCHEMA

    schema: pa.Schema = SERVER_METRICS_SCHEMA
    return schema


#: Tables a run may have besides :data:`TABLES` (never read back from segments): the
#: server's own metrics scrapes and, for ``--ray`` runs, which actor served each request.
EXTRA_TABLES: dict[str, Callable[[], pa.Schema]] = {
    "server_metrics": _server_metrics_schema,
    "actors": lambda: ACTORS_SCHEMA,
}


def stored_table_names() -> tuple[str, ...]:
    """Every table a run directory may hold, as ``<name>.parquet`` (the store's list)."""
    return (*TABLES, *EXTRA_TABLES)


def _table_schema(name: str) -> pa.Schema:
    if name in TABLES:
        return TABLES[name]
    if name in EXTRA_TABLES:
        return EXTRA_TABLES[name]()
    raise ValueError(
        f"{name!r} is not a run table; the store knows {', '.join(stored_table_names())}"
    )


class RunWriter:
    """The run directory while a run is captured, and its finalisation.

    The writer owns the run's lifecycle on disk: :meth:`create` makes the directory and
    writes the ``running`` manifest (secrets redacted; :meth:`heartbeat` refreshes its
    liveness record from the segment flusher's thread); :meth:`compact` writes every table
    (the store's list, each checked against its schema) and removes all of them again when
    one fails, so half-compacted tables never shadow the complete segments; :meth:`finish`
    writes the final manifest, removes the segments when the tables are in place, and
    returns the stored run, read once, for analysis and the report alike.

    Attributes:
        path: the run directory.
        manifest: the run's typed manifest (capture fills it in as the run goes).
    """

    def __init__(self, path: Path, manifest: Manifest, interval_s: float) -> None:
        self.path = path
        self.manifest = manifest
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._compacted = False
        self._beats = 0

    @classmethod
    def create(
        cls, root: Path, manifest: Manifest, started_at: datetime, interval_s: float
    ) -> RunWriter:
        """A new run directory under ``root`` named after ``manifest.name``, with the
        ``running`` manifest written; ``manifest.run_id`` is set to the directory's name.

        Raises:
            StorageError: the directory or the manifest cannot be written (nothing is left).
        """
        path = new_run_dir(root, manifest.name, started_at)
        manifest.run_id = path.name
        manifest.process = liveness_record(interval_s)
        writer = cls(path, manifest, interval_s)
        try:
            writer.write()
        except StorageError:
            import shutil

            shutil.rmtree(path, ignore_errors=True)  # nothing captured yet: leave no husk
            raise
        return writer

    def write(self) -> None:
        """Write manifest.json atomically, secrets redacted."""
        from perfscope.profiler.redact import redact

        with self._lock:
            write_json_atomic(self.path / "manifest.json", redact(self.manifest.to_dict()))

    def heartbeat(self) -> None:
        """Refresh the liveness record of a running run (the flusher's thread calls it)."""
        from perfscope.profiler.redact import redact

        with self._lock:
            if self.manifest.status != "running":
                return
            self._beats += 1
            self.manifest.process = liveness_record(self.interval_s, self._beats)
            try:
                clean = redact(self.manifest.to_dict())
            except RuntimeError:
                return  # an engine thread was updating its config: next heartbeat
            write_json_atomic(self.path / "manifest.json", clean)

    def compact(self, tables: dict[str, pa.Table | None]) -> StorageError | None:
        """Write ``tables`` (name → table; ``None`` skips one) as ``<name>.parquet``.

        Every name must be one of :func:`stored_table_names` and every table must carry its
        schema's required columns with their types (a ValueError names the problem: that is
        a bug in capture, not bad input). On a write failure (disk full) every table written
        here is removed again and the error is returned: readers then use the segments.
        """
        checked: list[tuple[str, pa.Table]] = []
        for name, table in tables.items():
            if table is None:
                continue
            schema = _table_schema(name)
            problems = [
                p for f in schema for p in _column_problem(f"{name}.parquet", table.schema, f)
            ]
            if problems:
                raise ValueError("; ".join(problems))
            checked.append((name, table))
        try:
            for name, table in checked:
                write_table_atomic(self.path / f"{name}.parquet", table)
        except StorageError as exc:
            for name in stored_table_names():
                (self.path / f"{name}.parquet").unlink(missing_ok=True)
            return exc
        self._compacted = True
        return None

    def finish(self, status: str, *, error: str | None = None) -> StorageError | None:
        """Final manifest: ``status``, ``ended_at`` now, ``error`` appended, the process
        marked exited; then the segment files go when the tables were compacted. Returns
        the error of writing the manifest (the caller keeps the first storage error)."""
        m = self.manifest
        m.status = status
        m.ended_at = datetime.now(UTC).isoformat()
        if error:
            m.errors.append(error)
        m.process = {**m.process, "exited": True}
        try:
            self.write()
        except StorageError as exc:
            return exc
        if self._compacted:
            remove_segments(self.path)
        return None

    def stored(self) -> StoredRun:
        """The finished run as the store reads it (one read, shared by analysis and report)."""
        return read_run(self.path)


def _column_problem(fname: str, actual: pa.Schema, f: pa.Field) -> list[str]:
    idx = actual.get_field_index(f.name)
    if idx < 0:
        return [f"{fname}: column {f.name!r} is missing"] if not f.nullable else []
    if not _type_ok(actual.field(idx).type, f.type):
        return [f"{fname}: column {f.name!r} is {actual.field(idx).type}, expected {f.type}"]
    return []
