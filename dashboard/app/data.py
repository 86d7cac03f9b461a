"""Run loading and caching for the Dash app, and run-id validation.

The dashboard reads a runs directory that other processes keep writing into. Everything
here is per :class:`RunRepository` instance (no module-level caches), so two apps in one
process never share state.

* Listing reads the run index (:mod:`perfscope.profiler.run_index`, a DuckDB table kept in
  ``<runs root>/.perfscope-index.duckdb``), refreshed incrementally on every listing: only
  runs whose ``manifest.json`` or ``summary.json`` changed are re-read. Without duckdb the
  listing falls back to scanning every run directory (rows cached per run on the files'
  modification times) and :attr:`RunRepository.listing_note` says so. Directories the index
  does not hold (no manifest, a linked folder) are read one by one as before.
* Tables (Parquet) load lazily, only when a page needs them, and stay in a small LRU
  keyed by the files' modification times.
* A directory that is not a readable run is listed with ``state="broken"`` and the
  reason; a run still being written, interrupted, failed or not yet analysed is
  ``state="partial"``. Nothing here raises for a bad run directory while listing.

Run ids come from URLs: :func:`validate_run_id` (the run store's, re-exported here)
accepts only a plain directory name directly under the runs directory (no separators, no
``..``, no absolute paths, no symlink leading elsewhere). Every file read from a run (manifest,
summary, tables) is resolved first and refused when it lies outside the runs root
(:func:`inside_root`), so a ``summary.json`` that is a symlink to ``/etc/passwd`` or another
user's file is never served. A row's state comes from the run store's
:func:`~perfscope.profiler.store.inspect_run`, so a crashed run (its process gone) and a
malformed one read the same here as in ``perfscope ls``.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import pandas as pd

from perfscope.analysis.catalogue import value_at
from perfscope.analysis.manifest import RunManifest, manifest_view
from perfscope.analysis.summary import Summary
from perfscope.dashboard._fmt import finite
from perfscope.errors import BrokenRunError, PerfscopeError, RunNotFoundError
from perfscope.jsontypes import JsonObject, JsonValue, json_float, json_int, json_object, json_str
from perfscope.profiler.store import (
    RESERVED_DIRS,
    RUN_ID_PATTERN,
    InvalidRunIdError,
    inspect_run,
    read_json_capped,
    validate_run_id,
)

if TYPE_CHECKING:
    from perfscope.dashboard.figures import FigureSpec, RunTables
    from perfscope.profiler.store import StoredRun

__all__ = [
    "RESERVED_DIRS",
    "RUN_ID_PATTERN",
    "FileStamp",
    "InvalidRunIdError",
    "LoadedRun",
    "RunCache",
    "RunRecord",
    "RunRepository",
    "RunRow",
    "Signature",
    "inside_root",
    "per_request_frame",
    "validate_run_id",
]

#: Parquet files of a run directory (for change detection).
_TABLE_FILES = ("requests", "chunks", "steps", "telemetry")

_STAMP = re.compile(r"\d{8}-\d{6}")


def inside_root(root: Path, path: Path) -> bool:
    """Whether ``path``, with every symlink resolved, lies inside ``root`` (resolved).

    A path that does not exist is inside when its resolved location is.
    """
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # unreadable, or a symlink loop
        return False


def _check_run_files(root: Path, path: Path) -> None:
    """Refuse a run whose directory or any of its files resolves outside ``root``."""
    names = ("manifest.json", "summary.json", *(f"{t}.parquet" for t in _TABLE_FILES))
    if not inside_root(root, path):
        raise InvalidRunIdError(f"run {path.name!r} points outside the runs directory")
    for name in names:
        f = path / name
        if (f.is_symlink() or f.exists()) and not inside_root(root, f):
            raise InvalidRunIdError(
                f"run {path.name!r}: {name} points outside the runs directory; not read"
            )


#: Modification time (ns) and size (bytes) of a file, ``None`` when it is absent.
FileStamp = tuple[int, int] | None


class RunRecord(TypedDict):
    """One run as the runs DataTable and ``/api/runs`` receive it (:meth:`RunRow.to_record`):
    latencies in ms, ratios in %, numbers rounded; a metric cell is ``None`` when not measured,
    or a word (``no SLOs``, ``n/a``) where a blank would mislead."""

    id: str
    run_id: str
    link: str
    state: str
    status: str
    name: str
    engine: str
    model: str
    hardware: str
    date: str
    requests: int | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    output_tok_s: float | None
    goodput_req_s: float | str | None
    slo_pct: float | str | None
    mfu_pct: float | None
    mbu_pct: float | None
    j_per_token: float | str | None
    sweep: str
    contention: str


@dataclass(frozen=True)
class RunRow:
    """One line of the runs table. Times in seconds, rates per second (SI).

    Attributes:
        run_id: directory name.
        state: ``ok`` (complete and analysed), ``partial`` (running, interrupted, failed or
            not analysed) or ``broken`` (not a readable run).
        status: the manifest's status (``complete``, ``running``, ...) or ``broken``.
        problem: why the row is partial or broken, else ``None``.
        has_model_spec: the manifest records a model shape (layers and widths), so the
            roofline explorer can project the run's model.
        sweep: the sweep this run belongs to (``manifest["sweep"]["id"]``), if any.
        slo_count: how many SLOs the run was judged by (``None`` when not analysed); with
            none, ``slo_attainment`` and ``goodput_req_s`` are ``None`` and the table says
            "no SLOs" (every request trivially "meets" an empty set of limits).
        contention: a marker when other processes competed for the CPU while the run was
            measured (``contended 63%``), else ``None``.
    """

    run_id: str
    state: str
    status: str
    problem: str | None = None
    name: str | None = None
    engine: str | None = None
    model: str | None = None
    hardware: str | None = None
    started_at: str | None = None
    requests: int | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    output_tok_s: float | None = None
    goodput_req_s: float | None = None
    slo_attainment: float | None = None
    mfu: float | None = None
    mbu: float | None = None
    j_per_token: float | None = None
    sweep: str | None = None
    has_roofline: bool = False
    contention: str | None = None
    slo_count: int | None = None
    has_model_spec: bool = False

    def to_record(self) -> RunRecord:
        """The row as the runs DataTable shows it: latencies in ms, ratios in %, rounded."""

        def r(x: float | None, scale: float = 1.0, nd: int = 3) -> float | None:
            return None if x is None else float(f"{x * scale:.{nd}g}")

        no_slos = self.slo_count == 0

        return {
            "id": self.run_id,
            "run_id": self.run_id,
            # The run id, as a link to its page (plain text for a broken directory).
            "link": f"[{self.run_id}](/run/{self.run_id})"
            if self.state != "broken"
            else _md_escape(self.run_id),
            "state": self.state,
            "status": self.status if self.problem is None else f"{self.status}: {self.problem}",
            "name": self.name or "",
            "engine": self.engine or "",
            "model": self.model or "",
            "hardware": self.hardware or "",
            "date": (self.started_at or "")[:19].replace("T", " "),
            "requests": self.requests,
            "ttft_p50_ms": r(self.ttft_p50_s, 1e3),
            "ttft_p99_ms": r(self.ttft_p99_s, 1e3),
            "tpot_p50_ms": r(self.tpot_p50_s, 1e3),
            "output_tok_s": r(self.output_tok_s, nd=4),
            "goodput_req_s": "no SLOs" if no_slos else r(self.goodput_req_s, nd=4),
            "slo_pct": "no SLOs" if no_slos else r(self.slo_attainment, 100.0),
            "mfu_pct": r(self.mfu, 100.0),
            "mbu_pct": r(self.mbu, 100.0),
            # (A broken run measured nothing: not "no meter", which the column's blank says.)
            "j_per_token": "n/a" if self.state == "broken" else r(self.j_per_token, nd=4),
            "sweep": self.sweep or "",
            "contention": self.contention or "",
        }


def _md_escape(text: str) -> str:
    """``text`` with every Markdown metacharacter backslash-escaped (shown, not rendered)."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!<>|~])", r"\\\1", text)


def _model_name(manifest: RunManifest, summary: JsonObject | None) -> str | None:
    model = (summary or {}).get("model") or manifest.engine.model or {}
    name = model.get("name") if isinstance(model, Mapping) else None
    preset = manifest.engine.config.preset
    if name and preset and str(preset) != str(name):
        return f"{name} ({preset})"
    return str(name) if name else (str(preset) if preset else None)


def _hardware_name(manifest: RunManifest, summary: JsonObject | None) -> str | None:
    hw = (summary or {}).get("hardware")
    spec = hw.get("spec") if isinstance(hw, dict) else None
    if isinstance(spec, dict):
        return str(spec.get("name") or spec.get("key") or "") or None
    return None if hw else manifest.device_name


def _phase_ratio(summary: JsonObject, phase: str, key: str) -> float | None:
    return finite(value_at(summary, ("roofline", "phases", phase, key)))


def _row_from(
    run_id: str,
    manifest: JsonObject | RunManifest,
    summary: JsonObject | None,
    problem: str | None,
) -> RunRow:
    man = manifest_view(manifest)
    status = man.status or "unknown"
    engine = man.engine
    s = summary or {}
    lat = s.get("latency") or {}
    roof = s.get("roofline") or {}
    if problem is None and status != "complete":
        problem = man.errors[-1][:200] if man.errors else None
    state = "ok" if status == "complete" and summary is not None and problem is None else "partial"
    if summary is None and problem is None:
        problem = "not analysed yet (perfscope analyze)"
    # MFU is telling in the compute-heavy prefill, MBU in the bandwidth-heavy decode.
    mfu = _phase_ratio(s, "prefill", "mfu")
    mbu = _phase_ratio(s, "decode", "mbu")
    slos = value_at(s, "goodput.slos")
    slo_count = len(slos) if isinstance(slos, dict) else None
    judged = bool(slo_count)  # attainment of no SLOs is no measurement
    return RunRow(
        run_id=run_id,
        state=state,
        status=status,
        problem=problem,
        name=man.name or None,
        engine=engine.uri or engine.kind or None,
        model=_model_name(man, summary),
        hardware=_hardware_name(man, summary),
        started_at=man.started_at or None,
        requests=int(c) if (c := finite(value_at(s, "counts.requests"))) is not None else None,
        ttft_p50_s=finite(value_at(lat, "ttft.p50")),
        ttft_p99_s=finite(value_at(lat, "ttft.p99")),
        tpot_p50_s=finite(value_at(lat, "tpot.p50")),
        output_tok_s=finite(value_at(s, "throughput.output_tok_s")),
        goodput_req_s=finite(value_at(s, "goodput.goodput_req_s")) if judged else None,
        slo_attainment=finite(value_at(s, "goodput.attainment")) if judged else None,
        mfu=mfu,
        mbu=mbu,
        j_per_token=finite(value_at(s, "energy.j_per_output_token"))
        if value_at(s, "energy.available")
        else None,
        sweep=man.sweep_id,
        has_roofline=bool(roof.get("available")) if isinstance(roof, dict) else False,
        contention=contention_marker(man, summary),
        slo_count=slo_count if summary is not None else None,
        has_model_spec=bool((engine.model or {}).get("n_layers")),
    )


def _row_from_index(rec: Mapping[str, object]) -> RunRow:
    """A runs-table row from one row of the index's ``runs`` table (same rules as a scan).

    ``rec`` maps the columns of :data:`_INDEX_SELECT` to DuckDB's values; each is read as the
    type its column has (text, number, flag), and a value of another type reads as absent.
    """
    run_id = str(rec["run_id"])
    if rec["state"] == "broken":
        broken = json_str(rec["problem"]) or "not a readable run"
        return RunRow(run_id=run_id, state="broken", status="broken", problem=broken)
    # A crashed run's manifest still says "running": the store reads it as crashed.
    status = "crashed" if rec["state"] == "crashed" else (json_str(rec["status"]) or "unknown")
    why = json_str(rec["problem"])
    # As a scan reads it: a crashed or running run's reason, or a foreign summary.json's.
    keep = rec["state"] in ("crashed", "running") or "summary.json" in (why or "")
    problem = why if keep else None
    if problem is None and status != "complete":
        problem = json_str(rec["last_error"])
    has_summary = bool(rec["has_summary"])
    state = "ok" if status == "complete" and has_summary and problem is None else "partial"
    if not has_summary and problem is None:
        problem = "not analysed yet (perfscope analyze)"
    model = json_str(rec["analysed_model"]) or json_str(rec["model"])
    preset = json_str(rec["model_preset"])
    if model and preset and preset != model:
        model = f"{model} ({preset})"
    model = model or preset
    others, steal = json_float(rec["others_cpu_share"]), json_float(rec["steal_cpu_share"])
    if rec["contended"] is not None:
        contended = bool(rec["contended"])
    else:
        from perfscope.analysis.summary import contention_record

        shares: JsonObject = {"others_share": others, "steal_share": steal}
        c = contention_record({"host": {"contention": shares}})
        contended = c is not None and c.contended
    marker = _marker(finite(others), finite(steal)) if contended else None
    return RunRow(
        run_id=run_id,
        state=state,
        status=status,
        problem=problem,
        name=json_str(rec["name"]) or None,
        engine=json_str(rec["engine_uri"]) or json_str(rec["engine_kind"]) or None,
        model=model or None,
        hardware=json_str(rec["hardware_name"]) or json_str(rec["hardware"]) or None,
        started_at=json_str(rec["started_at_text"]) or None,
        requests=json_int(rec["requests"]),
        ttft_p50_s=json_float(rec["ttft_p50_s"]),
        ttft_p99_s=json_float(rec["ttft_p99_s"]),
        tpot_p50_s=json_float(rec["tpot_p50_s"]),
        output_tok_s=json_float(rec["output_tok_s"]),
        goodput_req_s=json_float(rec["goodput_req_s"]),
        slo_attainment=json_float(rec["attainment"]),
        mfu=json_float(rec["prefill_mfu"]),
        mbu=json_float(rec["decode_mbu"]),
        j_per_token=json_float(rec["j_per_output_token"]) if rec["energy_available"] else None,
        sweep=json_str(rec["sweep_id"]) or None,
        has_roofline=bool(rec["roofline_available"]),
        contention=marker,
        slo_count=json_int(rec["slo_count"]) if has_summary else None,
        has_model_spec=bool(rec["model_layers"]),
    )


#: Columns of the index the runs list reads (``started_at_text``: the manifest's own text).
_INDEX_SELECT = (
    "SELECT run_id, state, problem, status, has_summary, last_error, name, engine_uri, "
    "engine_kind, model, analysed_model, model_preset, hardware, hardware_name, "
    "strftime(started_at AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%S') AS started_at_text, "
    "requests, ttft_p50_s, ttft_p99_s, tpot_p50_s, output_tok_s, goodput_req_s, attainment, "
    "prefill_mfu, decode_mbu, j_per_output_token, energy_available, sweep_id, "
    "roofline_available, contended, others_cpu_share, steal_cpu_share, slo_count, model_layers "
    "FROM runs"
)


def contention_marker(manifest: JsonObject | RunManifest, summary: JsonObject | None) -> str | None:
    """``⚠ others NN%`` (or ``⚠ steal NN%``) when other processes (or the hypervisor) took
    more than the warning share of the CPU during the run; ``None`` otherwise or when not
    measured."""
    from perfscope.analysis.compare import contention_of
    from perfscope.analysis.summary import contention_record

    c = contention_of(summary) if summary else None
    if c is None:
        rec = contention_record(manifest)
        c = rec.to_dict() if rec is not None else None
    if not c or not c.get("contended"):
        return None
    return _marker(finite(c.get("others_share")), finite(c.get("steal_share")))


def _marker(others: float | None, steal: float | None) -> str:
    """``⚠ others 63%`` (other processes' share of the CPU), or ``⚠ steal 40%`` when the
    hypervisor took more than the other processes did."""
    if steal is not None and steal > (others or 0.0):
        return f"⚠ steal {steal:.0%}"
    return "⚠ others" + (f" {others:.0%}" if others is not None else "")


def _stat_key(path: Path) -> FileStamp:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _read_json(path: Path, root: Path) -> tuple[JsonValue, str | None]:
    """A JSON file of a run, or ``(None, reason)``; never follows a link out of ``root``."""
    if not inside_root(root, path):
        return None, f"{path.name} points outside the runs directory"
    try:
        return read_json_capped(path), None
    except FileNotFoundError:
        return None, f"no {path.name}"
    except BrokenRunError as exc:  # over the store's size cap
        return None, str(exc)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"unreadable {path.name}: {type(exc).__name__}"


#: The stamps of a run's files a cached object was built from (:func:`_stat_key` of each).
Signature = tuple[FileStamp | int, ...]


@dataclass
class RunCache:
    """What the pages derive from a loaded run once and keep with it (``None``: not yet).

    Attributes:
        figures: the report's figures (:func:`perfscope.dashboard.figures.run_figures`).
        per_request: per-request metrics with their error text (:func:`per_request_frame`).
    """

    figures: tuple[FigureSpec, ...] | None = None
    per_request: pd.DataFrame | None = None


@dataclass
class LoadedRun:
    """A run with its tables in memory (what the detail and compare pages draw from).

    ``tables`` is a :class:`perfscope.dashboard.figures.RunTables`; ``summary`` is the typed
    :class:`~perfscope.analysis.Summary` of the stored summary.json or, when there is none
    yet, one computed in memory by the analysis (never written from the dashboard).
    ``cache`` holds per-run derived objects the pages build once (:class:`RunCache`; read and
    filled under ``lock``). ``manifest`` is the typed read view of manifest.json
    (:class:`~perfscope.analysis.manifest.RunManifest`; the JSON object as read is its
    ``source``).
    """

    run_id: str
    path: Path
    manifest: RunManifest
    summary: Summary
    tables: RunTables
    summary_computed: bool = False
    signature: Signature = ()
    cache: RunCache = field(default_factory=RunCache)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class RunRepository:
    """The runs under one directory, for one app instance.

    Args:
        runs_dir: the runs root (it may not exist yet; runs appear when it does).
        max_loaded: how many runs keep their tables in memory (LRU).
    """

    def __init__(self, runs_dir: Path, *, max_loaded: int = 6) -> None:
        self.runs_dir = Path(runs_dir)
        self.max_loaded = max_loaded
        self._lock = threading.Lock()
        self._rows: dict[str, tuple[Signature, RunRow]] = {}
        self._loaded: OrderedDict[str, tuple[Signature, LoadedRun]] = OrderedDict()
        # One index connection at a time: DuckDB refuses a second one to the same file with
        # a different mode inside one process.
        self._index_lock = threading.Lock()
        #: Each run's row of the index as last read, with the runs-table row made from it.
        self._index_cache: dict[str, tuple[tuple[object, ...], RunRow]] = {}
        #: How the last listing was made: ``index`` or ``scan``.
        self.listing_source = "scan"
        #: Why the last listing was not read from a saved index (``None`` when it was).
        self.listing_note: str | None = None

    # ------------------------------------------------------------------ listing

    def run_ids(self) -> list[str]:
        """Directory names under the runs root that could be runs (hidden ones skipped)."""
        try:
            entries = [
                e
                for e in os.scandir(self.runs_dir)
                if e.is_dir() and not e.name.startswith(".") and e.name not in RESERVED_DIRS
            ]
        except OSError:
            return []

        def newest_first(e: os.DirEntry[str]) -> str:
            # Run ids start with their start time; other folders sort by modification time.
            if _STAMP.match(e.name):
                return e.name
            try:
                return time.strftime("%Y%m%d-%H%M%S", time.localtime(e.stat().st_mtime))
            except OSError:
                return ""

        return [e.name for e in sorted(entries, key=newest_first, reverse=True)]

    def _signature(self, path: Path) -> Signature:
        # A crashed run's files do not change when its process dies: the minute is part of
        # the key so a row says "crashed" soon after.
        return (
            _stat_key(path / "manifest.json"),
            _stat_key(path / "summary.json"),
            int(time.time() // 10),
        )

    def row(self, run_id: str) -> RunRow:
        """The table row of one run directory (cached until its JSON files change)."""
        path = self.runs_dir / run_id
        sig = self._signature(path)
        with self._lock:
            hit = self._rows.get(run_id)
        if hit is not None and hit[0] == sig:
            return hit[1]
        row = self._read_row(run_id, path)
        with self._lock:
            self._rows[run_id] = (sig, row)
        return row

    def _read_row(self, run_id: str, path: Path) -> RunRow:
        if not RUN_ID_PATTERN.fullmatch(run_id):
            return RunRow(run_id=run_id, state="broken", status="broken", problem="bad name")
        if not inside_root(self.runs_dir, path) or not all(
            inside_root(self.runs_dir, path / f) for f in ("manifest.json", "summary.json")
        ):
            why = "the folder or one of its files points outside the runs directory"
            return RunRow(run_id=run_id, state="broken", status="broken", problem=why)
        entry = inspect_run(path)
        if entry.state == "broken" or entry.manifest is None:
            why = entry.reason or "not a readable run"
            return RunRow(run_id=run_id, state="broken", status="broken", problem=why)
        problem = None
        if entry.state in ("crashed", "running") or (
            entry.reason and "summary.json" in entry.reason
        ):
            problem = entry.reason
        return _row_from(run_id, entry.manifest, entry.summary, problem)

    def _index_rows(self) -> dict[str, RunRow] | None:
        """Rows of every run the index holds, after an incremental refresh; ``None`` (and
        :attr:`listing_note` set) when duckdb is not installed."""
        try:
            import duckdb  # noqa: F401
        except ImportError:
            self.listing_source = "scan"
            self.listing_note = (
                "duckdb is not installed: the list is a scan of every run folder "
                "(pip install 'perfscope[index]' for the run index)"
            )
            return None
        from perfscope.analysis.catalogue import value_at
        from perfscope.profiler.run_index import open_index

        with self._index_lock, open_index(self.runs_dir, lookup=value_at) as index:
            names, raw = index.query(_INDEX_SELECT)
            note = index.note if not index.persistent else None
        self.listing_source = "index"
        self.listing_note = note
        # A row whose index values did not change keeps its RunRow (most rows, most polls).
        old, fresh = self._index_cache, {}
        for r in raw:
            rid = str(r[0])
            hit = old.get(rid)
            fresh[rid] = (
                hit
                if hit is not None and hit[0] == r
                else (r, _row_from_index(dict(zip(names, r, strict=True))))
            )
        self._index_cache = fresh
        return {rid: row for rid, (_, row) in fresh.items()}

    def rows(self) -> list[RunRow]:
        """Every run directory's row, newest first; forgets rows of deleted directories."""
        ids = self.run_ids()
        indexed = self._index_rows() if ids else {}
        if indexed is None:
            rows = [self.row(i) for i in ids]
        else:
            rows = [indexed.get(i) or self.row(i) for i in ids]
        with self._lock:
            for gone in set(self._rows) - set(ids):
                del self._rows[gone]
        return rows

    # ------------------------------------------------------------------ loading

    def _table_signature(self, path: Path) -> Signature:
        return (
            _stat_key(path / "manifest.json"),
            _stat_key(path / "summary.json"),
            *(_stat_key(path / f"{t}.parquet") for t in _TABLE_FILES),
            *(_stat_key(path / "segments" / f"{t}.arrows") for t in _TABLE_FILES),
        )

    def load(self, run_id: str) -> LoadedRun:
        """The run with its tables, from the LRU when its files have not changed.

        Raises:
            InvalidRunIdError, RunNotFoundError: bad or unknown id, unreadable run.
        """
        from perfscope.dashboard.figures import RunTables
        from perfscope.profiler.store import read_run

        path = validate_run_id(self.runs_dir, run_id)
        _check_run_files(self.runs_dir, path)
        sig = self._table_signature(path)
        with self._lock:
            hit = self._loaded.get(run_id)
            if hit is not None and hit[0] == sig:
                self._loaded.move_to_end(run_id)
                return hit[1]
        stored = read_run(path)
        computed = False
        if isinstance(stored.summary, dict):
            summary = Summary.from_dict(stored.summary)
        else:
            summary = self._analyze(stored)
            computed = True
        tables = RunTables(
            summary=summary,
            requests=stored.requests,
            chunks=stored.chunks,
            steps=stored.steps,
            telemetry=stored.telemetry,
        )
        loaded = LoadedRun(
            run_id=run_id,
            path=path,
            manifest=RunManifest.from_dict(stored.manifest),
            summary=summary,
            tables=tables,
            summary_computed=computed,
            signature=sig,
        )
        with self._lock:
            self._loaded[run_id] = (sig, loaded)
            self._loaded.move_to_end(run_id)
            while len(self._loaded) > self.max_loaded:
                self._loaded.popitem(last=False)
        return loaded

    @staticmethod
    def _analyze(stored: StoredRun) -> Summary:
        from perfscope.analysis import analyze

        try:
            summary = analyze(stored)
        except PerfscopeError as exc:
            raise RunNotFoundError(f"run {stored.path.name!r} cannot be analysed: {exc}") from None
        except (KeyError, ValueError, TypeError) as exc:
            raise RunNotFoundError(
                f"run {stored.path.name!r} cannot be analysed: {type(exc).__name__}: {exc}"
            ) from None
        return summary

    def summary(self, run_id: str) -> JsonObject | None:
        """summary.json of a run without loading its tables (``None`` when absent, or when
        it is not a JSON object)."""
        path = validate_run_id(self.runs_dir, run_id)
        data, err = _read_json(path / "summary.json", self.runs_dir)
        return json_object(data) if err is None else None

    def manifest(self, run_id: str) -> RunManifest | None:
        """manifest.json of a run, typed (``None`` when absent or unreadable)."""
        path = validate_run_id(self.runs_dir, run_id)
        data, err = _read_json(path / "manifest.json", self.runs_dir)
        return RunManifest.from_dict(data) if err is None and isinstance(data, dict) else None


def per_request_frame(loaded: LoadedRun) -> pd.DataFrame:
    """Per-request metrics of a loaded run (``analysis.metrics.per_request``) plus its
    error text, cached on the run; times in seconds."""
    from perfscope.dashboard.view import request_rows

    with loaded.lock:
        if loaded.cache.per_request is None:
            loaded.cache.per_request = request_rows(loaded.tables.requests)
        return loaded.cache.per_request
