"""A DuckDB index over a runs folder: one row per run, refreshed incrementally.

Teams that gate every commit on performance keep thousands of runs; listing them by reading
every ``manifest.json`` and ``summary.json`` takes seconds. The index keeps the fields people
filter and sort on (identity, state, engine, workload, the headline metrics) in one table named
``runs`` inside ``<runs root>/.perfscope-index.duckdb``, so ``perfscope query "SQL"`` and
``perfscope ls --where ...`` answer in milliseconds.

Refreshing is incremental: each row remembers the modification time and size of the run's
``manifest.json`` and ``summary.json``; a refresh stats every run directory (cheap), re-reads only
the runs whose files changed, and drops rows of runs that are gone. The index is a cache: deleting
the file loses nothing, and a runs folder that cannot be written (read-only, or locked by another
perfscope) gets an in-memory index built for this call instead.

Values are copied from the files as stored (SI units: seconds, tokens per second, ratios); a
field a run does not have is NULL. A run whose files cannot be parsed keeps a row with
``state = 'broken'`` and the reason in ``problem``, so it shows up rather than vanishing.
SLO attainment and goodput are NULL for a run without SLOs (``slo_count = 0``): a share of
requests "meeting" no limit is no measurement.

This module is the store layer's, so the front door (``perfscope index``, ``query``, ``ls
--where``) and the dashboard's runs list share it. It imports only the run store and
:mod:`perfscope.errors`; the caller passes the dotted-path reader (``lookup``), which is the
metric catalogue's :func:`~perfscope.analysis.catalogue.value_at` everywhere, so the summary
is read through the one getter.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from perfscope.errors import UsageError

if TYPE_CHECKING:
    import duckdb

    from perfscope.profiler.store import TableCheck

__all__ = [
    "ALL_COLUMN_NAMES",
    "BOOKKEEPING_DOCS",
    "COLUMN_UNITS",
    "INDEX_COLUMNS",
    "INDEX_FILE",
    "IndexColumn",
    "Lookup",
    "NewestRun",
    "RefreshStats",
    "RunIndex",
    "open_index",
]

#: Reads the value at a dotted path (or its keys, split) of a JSON object (``None`` when
#: absent): the metric catalogue's ``value_at``, passed in by the caller.
Lookup = Callable[[Any, str | tuple[str, ...]], Any]

INDEX_FILE = ".perfscope-index.duckdb"
#: Bumped whenever the columns or their meaning change; an older index file is rebuilt.
INDEX_SCHEMA_VERSION = 8


@dataclass(frozen=True)
class IndexColumn:
    """One column of the ``runs`` table.

    Attributes:
        name: SQL column name (units in the name where ambiguous).
        sql_type: DuckDB type.
        source: ``manifest`` or ``summary``: the file the value is read from.
        path: dotted path inside that file's JSON object.
        doc: what the value means, with its unit.
        reduce: ``"count"`` stores the number of entries of the object or list at ``path``,
            ``"last"`` the last item of the list there, ``"count_lost"`` the number of
            items of the list there with a true ``lost`` field, ``"ns_to_s"`` the number
            there divided by 1e9, ``"per_request"`` / ``"per_completed"`` the number there
            divided by the run's measured / completed requests; ``None`` stores the value
            itself.
    """

    name: str
    sql_type: str
    source: str
    path: str
    doc: str
    reduce: str | None = None


def _c(
    name: str, sql_type: str, source: str, path: str, doc: str, *, reduce: str | None = None
) -> IndexColumn:
    return IndexColumn(name, sql_type, source, path, doc, reduce)


#: The data columns of ``runs`` (bookkeeping columns are added after them).
INDEX_COLUMNS: tuple[IndexColumn, ...] = (
    _c("name", "VARCHAR", "manifest", "name", "run name (default: the engine kind)"),
    _c("status", "VARCHAR", "manifest", "status", "status written by the run"),
    _c("started_at", "TIMESTAMPTZ", "manifest", "started_at", "wall-clock start"),
    _c("ended_at", "TIMESTAMPTZ", "manifest", "ended_at", "wall-clock end (NULL if none)"),
    _c("perfscope_version", "VARCHAR", "manifest", "perfscope_version", "writer's version"),
    _c("engine_uri", "VARCHAR", "manifest", "engine.uri", "engine URI"),
    _c("engine_kind", "VARCHAR", "manifest", "engine.kind", "reference, hf, openai, python"),
    _c("device", "VARCHAR", "manifest", "engine.device", "engine device (cpu, cuda:0, ...)"),
    _c("dtype", "VARCHAR", "manifest", "engine.dtype", "engine compute dtype"),
    _c("model", "VARCHAR", "manifest", "engine.model.name", "model spec name"),
    _c("hardware", "VARCHAR", "manifest", "hardware.spec.key", "hwdb key analysed against"),
    _c("hostname", "VARCHAR", "manifest", "host.hostname", "machine the run ran on"),
    _c("pid", "BIGINT", "manifest", "process.pid", "process id of the writer, if recorded"),
    _c("writer_host", "VARCHAR", "manifest", "process.host", "host of the writing process"),
    _c("load_mode", "VARCHAR", "manifest", "load.mode", "batch or online"),
    _c("rate_req_s", "DOUBLE", "manifest", "load.rate", "offered rate, requests/s"),
    _c("concurrency", "BIGINT", "manifest", "load.concurrency", "closed-loop users"),
    _c(
        "others_cpu_share",
        "DOUBLE",
        "manifest",
        "host.contention.others_share",
        "share of the machine's CPU other processes used during the run",
    ),
    _c("requests", "BIGINT", "summary", "counts.requests", "measured requests"),
    _c("completed", "BIGINT", "summary", "counts.completed", "requests that completed"),
    _c("failed", "BIGINT", "summary", "counts.failed", "requests that failed"),
    _c("output_tokens", "BIGINT", "summary", "counts.output_tokens", "output tokens"),
    _c("prompt_tokens", "BIGINT", "summary", "counts.prompt_tokens", "prompt tokens"),
    _c("window_s", "DOUBLE", "summary", "window_s", "measured window, s"),
    _c("ttft_p50_s", "DOUBLE", "summary", "latency.ttft.p50", "TTFT median, s"),
    _c("ttft_p90_s", "DOUBLE", "summary", "latency.ttft.p90", "TTFT p90, s"),
    _c("ttft_p99_s", "DOUBLE", "summary", "latency.ttft.p99", "TTFT p99, s"),
    _c("tpot_p50_s", "DOUBLE", "summary", "latency.tpot.p50", "TPOT median, s"),
    _c("tpot_p99_s", "DOUBLE", "summary", "latency.tpot.p99", "TPOT p99, s"),
    _c("itl_p50_s", "DOUBLE", "summary", "latency.itl.p50", "ITL median, s"),
    _c("itl_p99_s", "DOUBLE", "summary", "latency.itl.p99", "ITL p99, s"),
    _c("e2e_p50_s", "DOUBLE", "summary", "latency.e2e.p50", "E2E median, s"),
    _c("e2e_p99_s", "DOUBLE", "summary", "latency.e2e.p99", "E2E p99, s"),
    _c("output_tok_s", "DOUBLE", "summary", "throughput.output_tok_s", "output tokens/s"),
    _c("total_tok_s", "DOUBLE", "summary", "throughput.total_tok_s", "prompt+output tokens/s"),
    _c("req_s", "DOUBLE", "summary", "throughput.req_s", "completed requests/s"),
    _c("goodput_req_s", "DOUBLE", "summary", "goodput.goodput_req_s", "requests/s meeting SLOs"),
    _c("attainment", "DOUBLE", "summary", "goodput.attainment", "share meeting every SLO"),
    _c("prefill_mfu", "DOUBLE", "summary", "roofline.phases.prefill.mfu", "prefill MFU (0-1)"),
    _c("prefill_mbu", "DOUBLE", "summary", "roofline.phases.prefill.mbu", "prefill MBU (0-1)"),
    _c("prefill_verdict", "VARCHAR", "summary", "roofline.phases.prefill.verdict", "prefill bound"),
    _c("decode_mfu", "DOUBLE", "summary", "roofline.phases.decode.mfu", "decode MFU (0-1)"),
    _c("decode_mbu", "DOUBLE", "summary", "roofline.phases.decode.mbu", "decode MBU (0-1)"),
    _c("decode_verdict", "VARCHAR", "summary", "roofline.phases.decode.verdict", "decode bound"),
    _c(
        "j_per_output_token",
        "DOUBLE",
        "summary",
        "energy.j_per_output_token",
        "energy per output token, J",
    ),
    _c("summary_schema", "VARCHAR", "summary", "schema", "summary schema of the stored file"),
    _c(
        "slo_count",
        "BIGINT",
        "summary",
        "goodput.slos",
        "SLOs the run was judged by",
        reduce="count",
    ),
    _c("last_error", "VARCHAR", "manifest", "errors", "last error the run recorded", reduce="last"),
    _c("sweep_id", "VARCHAR", "manifest", "sweep.id", "sweep the run is a point of"),
    _c("model_preset", "VARCHAR", "manifest", "engine.config.preset", "model preset name"),
    _c("model_layers", "BIGINT", "manifest", "engine.model.n_layers", "layers of the model spec"),
    _c("analysed_model", "VARCHAR", "summary", "model.name", "model spec the analysis used"),
    _c("hardware_name", "VARCHAR", "summary", "hardware.spec.name", "device analysed against"),
    _c("roofline_available", "BOOLEAN", "summary", "roofline.available", "roofline computed"),
    _c("energy_available", "BOOLEAN", "summary", "energy.available", "energy measured"),
    _c("contended", "BOOLEAN", "summary", "contention.contended", "CPU contention flagged"),
    _c(
        "steal_cpu_share",
        "DOUBLE",
        "manifest",
        "host.contention.steal_share",
        "share of the machine's CPU the hypervisor stole during the run",
    ),
    _c("dataset", "VARCHAR", "manifest", "workload.dataset", "workload dataset (synthetic, ...)"),
    _c(
        "prompt_len_spec",
        "VARCHAR",
        "manifest",
        "workload.prompt_len",
        "prompt length asked for, tokens (a number or a distribution, as given)",
    ),
    _c(
        "output_len_spec",
        "VARCHAR",
        "manifest",
        "workload.output_len",
        "output length asked for, tokens (a number or a distribution, as given)",
    ),
    _c(
        "prompt_tokens_per_request",
        "DOUBLE",
        "summary",
        "counts.prompt_tokens",
        "mean prompt length of the measured requests, tokens",
        reduce="per_request",
    ),
    _c(
        "output_tokens_per_request",
        "DOUBLE",
        "summary",
        "counts.output_tokens",
        "mean output length of the completed requests, tokens",
        reduce="per_completed",
    ),
    _c(
        "distributed_backend",
        "VARCHAR",
        "manifest",
        "distributed.backend",
        "'ray' for a --ray run, NULL for a single-process one",
    ),
    _c("ray_address", "VARCHAR", "manifest", "distributed.address", "Ray cluster the run used"),
    _c(
        "ray_actors",
        "BIGINT",
        "manifest",
        "distributed.actors",
        "load actors of a --ray run",
        reduce="count",
    ),
    _c(
        "ray_lost_actors",
        "BIGINT",
        "manifest",
        "distributed.actors",
        "load actors lost mid-run (the run is partial when > 0)",
        reduce="count_lost",
    ),
    _c(
        "ray_lost_in_flight",
        "BIGINT",
        "manifest",
        "distributed.loss.in_flight",
        "requests a lost actor had sent and not finished (recorded as failed)",
    ),
    _c(
        "ray_never_sent",
        "BIGINT",
        "manifest",
        "distributed.loss.never_sent",
        "requests planned on a lost actor that it never sent (recorded as failed)",
    ),
    _c(
        "ray_clock_uncertainty_s",
        "DOUBLE",
        "manifest",
        "distributed.clock_uncertainty_ns",
        "largest residual clock-alignment uncertainty over the load actors, s",
        reduce="ns_to_s",
    ),
)

#: Each data column as the reader walks it: (name, SQL type, source file, path split into
#: keys once, reduce), so a first build over thousands of runs does not split every path
#: of every run again.
_COLUMN_PLAN: tuple[tuple[str, str, str, tuple[str, ...], str | None], ...] = tuple(
    (c.name, c.sql_type, c.source, tuple(c.path.split(".")), c.reduce) for c in INDEX_COLUMNS
)

#: What each bookkeeping column means (``perfscope query --columns``).
BOOKKEEPING_DOCS: dict[str, str] = {
    "run_id": "run directory name (undecodable bytes shown as \\xNN)",
    "path": "run directory path",
    "state": "complete, partial, failed, interrupted, running, crashed or broken: the "
    "status as perfscope ls reads it (crashed: says running but its process is gone; "
    "broken: files cannot be read)",
    "problem": "why the state is not complete (the reason perfscope ls shows), else NULL",
    "has_summary": "summary.json exists and is perfscope's",
    "warnings": "number of warnings in summary.json",
    "manifest_mtime_ns": "manifest.json modification time, ns since the epoch (refresh key)",
    "manifest_size": "manifest.json size, bytes (refresh key)",
    "summary_mtime_ns": "summary.json modification time, ns since the epoch (refresh key)",
    "summary_size": "summary.json size, bytes; -1 when absent (refresh key)",
    "files_key": "run folder mtime, ns; for a broken run a digest of every file's identity "
    "(refresh key)",
}

_BOOKKEEPING = (
    ("run_id", "VARCHAR PRIMARY KEY"),
    ("path", "VARCHAR"),
    ("state", "VARCHAR"),
    ("problem", "VARCHAR"),
    ("has_summary", "BOOLEAN"),
    ("warnings", "BIGINT"),
    ("manifest_mtime_ns", "BIGINT"),
    ("manifest_size", "BIGINT"),
    ("summary_mtime_ns", "BIGINT"),
    ("summary_size", "BIGINT"),
    ("files_key", "BIGINT"),
)

#: The unit of every column of ``runs`` (``perfscope query --columns``): SI units for
#: measurements, ``count`` for whole numbers of things, ``fraction`` for shares 0-1,
#: ``text``/``true/false``/``timestamp`` for the rest.
_TIME_S = (
    "window_s ttft_p50_s ttft_p90_s ttft_p99_s tpot_p50_s tpot_p99_s itl_p50_s itl_p99_s "
    "e2e_p50_s e2e_p99_s ray_clock_uncertainty_s"
)
_COUNTS = (
    "warnings requests completed failed concurrency slo_count model_layers ray_actors "
    "ray_lost_actors ray_lost_in_flight ray_never_sent"
)
_FRACTIONS = (
    "others_cpu_share steal_cpu_share attainment prefill_mfu prefill_mbu decode_mfu decode_mbu"
)
COLUMN_UNITS: dict[str, str] = {
    **dict.fromkeys(_TIME_S.split(), "s"),
    **dict.fromkeys(_COUNTS.split(), "count"),
    **dict.fromkeys(_FRACTIONS.split(), "fraction (0-1)"),
    **dict.fromkeys(("manifest_mtime_ns", "summary_mtime_ns"), "ns since the epoch"),
    **dict.fromkeys(("manifest_size", "summary_size"), "bytes"),
    **dict.fromkeys(("started_at", "ended_at"), "timestamp (UTC)"),
    **dict.fromkeys(("output_tokens", "prompt_tokens"), "tokens"),
    **dict.fromkeys(("prompt_tokens_per_request", "output_tokens_per_request"), "tokens"),
    **dict.fromkeys(("prompt_len_spec", "output_len_spec"), "tokens (as given)"),
    **dict.fromkeys(("output_tok_s", "total_tok_s"), "tokens/s"),
    **dict.fromkeys(("rate_req_s", "req_s", "goodput_req_s"), "requests/s"),
    "j_per_output_token": "J/token",
    "files_key": "ns, or a digest",
    "pid": "process id",
}

#: Every column of ``runs`` in table order.
ALL_COLUMN_NAMES: tuple[str, ...] = tuple(n for n, _ in _BOOKKEEPING) + tuple(
    c.name for c in INDEX_COLUMNS
)
_TYPES = {n: t.split()[0] for n, t in _BOOKKEEPING} | {c.name: c.sql_type for c in INDEX_COLUMNS}
for _name in ALL_COLUMN_NAMES:  # the rest by type: text, true/false
    COLUMN_UNITS.setdefault(_name, {"BOOLEAN": "true/false"}.get(_TYPES[_name], "text"))


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


def _coerce(value: Any, sql_type: str) -> Any:
    """The value as the column's type, or None when it does not fit (never raises)."""
    if value is None:
        return None
    return _COERCE[sql_type](value)


def _as_double(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _as_bigint(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return int(value)
    except (ValueError, OverflowError):  # NaN, infinity
        return None


def _as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _as_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


#: Each SQL type's :func:`_coerce` (a value that does not fit becomes None).
_COERCE: dict[str, Callable[[Any], Any]] = {
    "DOUBLE": _as_double,
    "BIGINT": _as_bigint,
    "BOOLEAN": _as_bool,
    "VARCHAR": _as_text,
    "TIMESTAMPTZ": _as_text,
}


def safe_text(value: str) -> str:
    """``value`` as text any UTF-8 store accepts: undecodable file-name bytes (Python's
    surrogate escapes) become ``\\xNN``, lone surrogates from JSON ``\\uD800`` escapes
    become ``\\udNNN``; valid text is returned unchanged."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        pass
    try:
        return os.fsencode(value).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _ratio(num: Any, den: Any) -> float | None:
    """``num / den`` for real numbers with ``den > 0``, else None."""
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (num, den))
    return float(num) / float(den) if ok and float(den) > 0 else None


def _read_json(path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """A run's JSON file read to the store's size cap, or ``(None, reason)``."""
    from perfscope.errors import BrokenRunError
    from perfscope.profiler.run_files import loads_json, read_json_capped

    try:
        data = read_json_capped(path, loads=loads_json)
    except FileNotFoundError:
        return None, None
    except BrokenRunError as exc:  # over the cap: the message names file, size and cap
        return None, str(exc)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{os.path.basename(path)}: {type(exc).__name__}: {exc}"
    if not isinstance(data, dict):
        return None, f"{os.path.basename(path)}: not a JSON object"
    return data, None


def _outside(root: Path, path: str | Path) -> bool:
    """Whether ``path`` (links resolved) lies outside ``root`` (already resolved).

    ``path`` is a file in a run folder the scan found as a real folder (not a link) in the
    runs folder, so only a link can lead out: a plain file is inside without resolving."""
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return False
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        return not Path(path).resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # unreadable, or a symlink loop
        return True


def _row(
    run_id: str, run_path: str, key: FileKey, lookup: Lookup, root: Path, tables: TableCheck
) -> dict[str, Any]:
    """The ``runs`` row of one run directory (never raises on bad files).

    Every string is passed through :func:`safe_text`, so one run with an undecodable name
    or a lone surrogate in its manifest cannot fail the insert for every run. ``tables``
    checks the Parquet footers, remembering verdicts per schema across runs."""
    row = _read_row(run_id, run_path, key, lookup, root, tables)
    for name, value in row.items():
        if isinstance(value, str):
            row[name] = safe_text(value)
    return row


def _reduced(reduce: str, raw: Any, summary: Mapping[str, Any]) -> Any:
    """The value ``reduce`` (an :class:`IndexColumn`'s) makes of ``raw``."""
    if reduce == "count":
        return len(raw) if isinstance(raw, dict | list) else None
    if reduce == "last":
        return str(raw[-1])[:200] if isinstance(raw, list) and raw else None
    if reduce == "count_lost":
        if not isinstance(raw, list):
            return None
        return sum(1 for a in raw if isinstance(a, dict) and a.get("lost"))
    if reduce == "ns_to_s":
        return _ratio(raw, 1e9)
    if reduce in ("per_request", "per_completed"):
        counts = summary.get("counts")
        per = "requests" if reduce == "per_request" else "completed"
        return _ratio(raw, counts.get(per) if isinstance(counts, dict) else None)
    return raw


#: The data columns as :func:`_read_row` walks them: (name, read from the summary, path
#: split into keys, reduce, the type's :func:`_coerce`), all looked up once.
_READ_PLAN: tuple[tuple[str, bool, tuple[str, ...], str | None, Callable[[Any], Any]], ...] = tuple(
    (name, source == "summary", parts, reduce, _COERCE[sql_type])
    for name, sql_type, source, parts, reduce in _COLUMN_PLAN
)


def _read_row(
    run_id: str, run_path: str, key: FileKey, lookup: Lookup, root: Path, tables: TableCheck
) -> dict[str, Any]:
    from perfscope.profiler.store import manifest_problems, run_state, summary_problem

    row: dict[str, Any] = dict.fromkeys(ALL_COLUMN_NAMES)
    row.update(
        run_id=run_id,
        path=run_path,
        manifest_mtime_ns=key[0],
        manifest_size=key[1],
        summary_mtime_ns=key[2],
        summary_size=key[3],
        files_key=key[4],
        has_summary=False,
    )
    folder = os.path.basename(run_path)
    if safe_text(folder) != folder:
        # Listed (escaped) so it shows up; not read, since no tool downstream can open it.
        row["state"] = "broken"
        row["problem"] = "folder name is not valid UTF-8; rename the folder to read the run"
        return row
    # Strings, not Path objects: a first build makes these for every run.
    manifest_path = os.path.join(run_path, "manifest.json")
    summary_path = os.path.join(run_path, "summary.json")
    # A file linked out of the runs folder is never read (the dashboard serves this table).
    away = [os.path.basename(f) for f in (manifest_path, summary_path) if _outside(root, f)]
    if away:
        row["state"] = "broken"
        row["problem"] = f"{away[0]} points outside the runs directory; not read"
        return row
    manifest, m_problem = _read_json(manifest_path)
    summary, s_problem = _read_json(summary_path)
    row["has_summary"] = summary is not None
    problems = [p for p in (m_problem, s_problem) if p]
    if manifest is None:
        row["state"] = "broken"
        row["problem"] = m_problem or "manifest.json missing"
        return row
    # A summary.json that parses but is not perfscope's (another tool's file) reads as no
    # summary with the reason, as in `perfscope ls`; its values are not indexed.
    foreign = summary_problem(summary) if summary is not None else None
    if foreign is not None:
        summary = None
        row["has_summary"] = False
    values = summary or {}
    for name, in_summary, parts, reduce, coerce in _READ_PLAN:
        raw = lookup(values if in_summary else manifest, parts)
        if reduce is not None:
            raw = _reduced(reduce, raw, values)
        row[name] = None if raw is None else coerce(raw)
    if summary is not None and not row["slo_count"]:
        # Without SLOs every request "meets" them: no attainment, no goodput.
        row["attainment"] = row["goodput_req_s"] = None
    warnings = summary.get("warnings") if summary else None
    row["warnings"] = len(warnings) if isinstance(warnings, list) else 0
    # The run store's own reading of the state (crashed when the writer is gone), so the
    # index and `perfscope ls` never disagree.
    state = run_state(manifest)
    row["state"] = state.state
    row["problem"] = state.reason if state.state != "complete" else None
    if foreign is not None:
        row["problem"] = f"{row['problem']}; {foreign}" if row["problem"] else foreign
    # Tables whose columns are not the store's make the run unreadable (footers only).
    problems.extend(manifest_problems(manifest) + tables.problems(run_path))
    if problems:
        row["state"] = "broken"
        row["problem"] = "; ".join(problems)
    return row


#: What a refresh compares to decide whether a run must be re-read: manifest.json's and
#: summary.json's (mtime_ns, size), then the run directory's own mtime_ns (it changes when a
#: file in it is created, removed or atomically replaced, which is how the store writes its
#: tables). A run the index holds as broken gets a stronger last field instead: a 63-bit
#: digest of the identity (name, inode, mtime_ns, size) of every file at the top of its
#: folder, so a table rewritten in place (a copy still in progress) re-reads it too.
FileKey = tuple[int, int, int, int, int]


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
