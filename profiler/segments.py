"""Records on disk while the run is going: append-only segment files and their flusher.

A run directory being captured holds ``segments/<table>.arrows``: one Arrow IPC stream per
table (requests, chunks, steps, telemetry), one record batch appended per flush. A
background thread (:class:`SegmentFlusher`, never the engine's thread) flushes at least
every ``interval_s`` and once more on close, and after each flush calls a heartbeat
(the run store rewrites the manifest's liveness record). The engine's per-chunk path is
untouched: the flusher reads the recorder's append-only lists by position.

A process killed with SIGKILL therefore loses at most the last interval; a stream cut in
the middle of a batch is read up to its last whole batch (:func:`read_segments`).

Requests are appended twice: once when registered (``final`` false: as far as known then)
and once when finished (``final`` true). The reader keeps each request's last row; one that
never got a final row is marked failed with :data:`UNFINISHED_ERROR`.

When a write fails (disk full, read-only folder), the flusher stops, keeps what it wrote,
and reports the :class:`~perfscope.errors.StorageError` to ``on_error``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfscope.errors import StorageError
from perfscope.profiler.arrow_safe import safe_arrays
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import (
    CHUNK_SCHEMA,
    REQUEST_SCHEMA,
    REQUEST_TABLE_SCHEMA,
    STEP_SCHEMA,
    STEP_TABLE_SCHEMA,
    TELEMETRY_SCHEMA,
)

__all__ = [
    "DEFAULT_FLUSH_INTERVAL_S",
    "REQUEST_SEGMENT_SCHEMA",
    "SEGMENTS_DIR",
    "UNFINISHED_ERROR",
    "SegmentFlusher",
    "SegmentRead",
    "read_segments",
    "storage_error",
]

SEGMENTS_DIR = "segments"
#: Flush period: at most this much capture is lost when the process is killed.
DEFAULT_FLUSH_INTERVAL_S = 0.5
#: Error text of a request that had started but not finished at the last flush.
UNFINISHED_ERROR = "unfinished: the run stopped before this request ended"

REQUEST_SEGMENT_SCHEMA = REQUEST_TABLE_SCHEMA.append(pa.field("final", pa.bool_()))

_SCHEMAS: dict[str, pa.Schema] = {
    "requests": REQUEST_SEGMENT_SCHEMA,
    "chunks": CHUNK_SCHEMA,
    "steps": STEP_TABLE_SCHEMA,
    "telemetry": TELEMETRY_SCHEMA,
}

#: Columns a segment must have to be its table's; the others (added over time: the
#: requests' optional columns, the steps' speculative ones, telemetry's samplers) read as
#: nulls when a segment was written before them.
_CORE: dict[str, frozenset[str]] = {
    "requests": frozenset([*REQUEST_SCHEMA.names, "final"]),
    "chunks": frozenset(CHUNK_SCHEMA.names),
    "steps": frozenset(STEP_SCHEMA.names),
    "telemetry": frozenset(("t", "device")),
}

_ERRNO_TEXT = {
    28: "the disk is full (no space left on device)",
    122: "the disk quota is exceeded",
    30: "the file system is read-only",
    13: "permission denied",
    1: "permission denied",
}


def storage_error(path: Path | str, exc: OSError) -> StorageError:
    """A one-line StorageError for an OSError raised while writing ``path``."""
    why = _ERRNO_TEXT.get(exc.errno or -1) or (exc.strerror or str(exc))
    return StorageError(f"cannot write {path}: {why}", path=str(path), errno=exc.errno)


def _rows_to_batch(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    """Rows as one batch; a value its column cannot hold never loses its row
    (:func:`~perfscope.profiler.arrow_safe.safe_arrays`)."""
    cols = [list(c) for c in zip(*rows, strict=True)]
    return pa.RecordBatch.from_arrays(safe_arrays(cols, schema), schema=schema)


def _chunk_batch(rows: list[tuple[int, int, int, int]]) -> pa.RecordBatch:
    """Chunk rows as a batch: one C-level pass over the tuples (about 5x faster than
    column lists; this runs on the flusher's thread but holds the GIL the engine needs)."""
    try:
        flat = np.fromiter(
            itertools.chain.from_iterable(rows), dtype=np.int64, count=4 * len(rows)
        ).reshape(-1, 4)
    except (TypeError, ValueError, OverflowError):  # not an int64 count (manual API misuse)
        return _rows_to_batch(rows, CHUNK_SCHEMA)
    return pa.RecordBatch.from_arrays([pa.array(flat[:, j]) for j in range(4)], schema=CHUNK_SCHEMA)


class _Stream:
    """One append-only IPC stream file (opened on its first batch)."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self._file: BinaryIO | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._file = open(self.path, "wb")  # noqa: SIM115 - kept open for the run
            self._writer = pa.ipc.new_stream(self._file, self.schema)
        self._writer.write_batch(batch)
        assert self._file is not None
        self._file.flush()  # into the page cache: a killed process loses nothing written
        self.rows += batch.num_rows

    def close(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            if self._file is not None:
                self._file.close()
            self._writer = None
            self._file = None


@dataclass
class SegmentFlusher:
    """Copies new records from a recorder (and telemetry) into segment files, periodically.

    Args:
        run_dir: the run directory (``segments/`` is created inside).
        recorder: where the records accumulate.
        telemetry: ``telemetry(after_t)`` returns the samples taken after ``after_t`` (ns),
            as a TELEMETRY_SCHEMA table (``TelemetrySession.snapshot``); None = no telemetry.
        heartbeat: called after each successful flush (the manifest's liveness record).
        on_error: called once, from the flusher's thread, when a write fails.
        interval_s: flush period in seconds.
        request_timeout_s: fail requests open longer than this after being sent (any
            engine kind; the engine's own timeout, when it has one, acts first).
    """

    run_dir: Path
    recorder: Recorder
    telemetry: Callable[[int], pa.Table] | None = None
    heartbeat: Callable[[], None] | None = None
    on_error: Callable[[StorageError], None] | None = None
    interval_s: float = DEFAULT_FLUSH_INTERVAL_S
    request_timeout_s: float | None = None
    error: StorageError | None = field(default=None, init=False)
    flushes: int = field(default=0, init=False)
    #: Rounds that failed for another reason than storage (retried at the next round).
    skipped: list[str] = field(default_factory=list, init=False)
    _streams: dict[str, _Stream] = field(default_factory=dict, init=False)
    _pos: dict[str, int] = field(default_factory=dict, init=False)
    _tele_t: int = field(default=-(2**62), init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        seg = self.run_dir / SEGMENTS_DIR
        try:
            seg.mkdir(exist_ok=True)
        except OSError as exc:
            raise storage_error(seg, exc) from None
        self._streams = {name: _Stream(seg / f"{name}.arrows", s) for name, s in _SCHEMAS.items()}
        self._pos = {"registered": 0, "finished": 0, "chunks": 0, "steps": 0}

    def start(self) -> SegmentFlusher:
        self._thread = threading.Thread(
            target=self._loop, name="perfscope-segment-flusher", daemon=True
        )
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.request_timeout_s is not None:
                    self._expire_overdue()
                if not self.flush():
                    return
            except Exception as exc:  # a bug here must not end durability for the run
                self.skipped.append(f"{type(exc).__name__}: {exc}"[:200])

    def _expire_overdue(self) -> None:
        assert self.request_timeout_s is not None
        now = self.recorder.clock.now_ns()
        # A grace period lets an engine with its own timeout report it in its own words.
        limit = int((self.request_timeout_s + 0.5) * 1e9)
        for rec in self.recorder.open_requests():
            if rec.t_sent is not None and now - rec.t_sent > limit:
                self.recorder.expire(
                    rec.request_id,
                    f"timeout: no end after {self.request_timeout_s:g} s (--timeout)",
                )

    def flush(self) -> bool:
        """Write what is new; False (and ``error`` set) once a write has failed."""
        with self._lock:
            if self.error is not None:
                return False
            try:
                self._flush_locked()
            except OSError as exc:
                bad = next(
                    (s.path for s in self._streams.values() if s._file is not None),
                    self.run_dir / SEGMENTS_DIR,
                )
                self.error = storage_error(getattr(exc, "filename", None) or bad, exc)
            except StorageError as exc:
                self.error = exc
            if self.error is not None:
                if self.on_error is not None:
                    self.on_error(self.error)
                return False
            self.flushes += 1
        if self.heartbeat is not None:
            try:
                self.heartbeat()
            except StorageError as exc:
                with self._lock:
                    self.error = exc
                if self.on_error is not None:
                    self.on_error(exc)
                return False
        return True

    def _flush_locked(self) -> None:
        rec = self.recorder
        pos = self._pos
        # Each position moves only after its rows were written: a failed write (or a row
        # that could not be converted) leaves them to the next round, never dropped.
        new, fin, reg_to, fin_to = rec.request_rows(pos["registered"], pos["finished"])
        rows = [(*r, False) for r in new] + [(*r, True) for r in fin]
        if rows:
            self._streams["requests"].write(_rows_to_batch(rows, REQUEST_SEGMENT_SCHEMA))
        pos["registered"], pos["finished"] = reg_to, fin_to
        chunks = rec.chunk_rows(pos["chunks"])
        if chunks:
            self._streams["chunks"].write(_chunk_batch(chunks))
            pos["chunks"] += len(chunks)
        steps = rec.step_rows(pos["steps"])
        if steps:
            self._streams["steps"].write(_rows_to_batch(steps, STEP_TABLE_SCHEMA))
            pos["steps"] += len(steps)
        if self.telemetry is not None:
            table = self.telemetry(self._tele_t)
            if table.num_rows:
                for batch in table.combine_chunks().to_batches():
                    self._streams["telemetry"].write(batch)
                self._tele_t = int(pc.max(table.column("t")).as_py())

    def close(self) -> StorageError | None:
        """Stop the thread, flush the rest and close the files; returns the write error,
        if any (the files hold everything flushed before it)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30.0)
        self.flush()
        with self._lock:
            for s in self._streams.values():
                try:
                    s.close()
                except OSError as exc:
                    if self.error is None:
                        self.error = storage_error(s.path, exc)
        return self.error

    @property
    def rows(self) -> dict[str, int]:
        """Rows written so far, per table."""
        return {name: s.rows for name, s in self._streams.items()}


@dataclass
class SegmentRead:
    """Tables read back from a run's segment files.

    Attributes:
        tables: table name → Arrow table with the run-store schema (requests deduplicated).
        notes: what was off (a stream cut mid-batch, unfinished requests), as sentences.
        last_t: the latest record time seen (ns since the run's start), or None.
    """

    tables: dict[str, pa.Table]
    notes: list[str]
    last_t: int | None


def _read_stream(path: Path, schema: pa.Schema, notes: list[str], core: frozenset[str]) -> pa.Table:
    """A segment stream up to its last whole batch, as ``schema`` (a column outside
    ``core`` that it lacks reads as nulls); an empty table when it is another table's."""
    batches: list[pa.RecordBatch] = []
    try:
        with pa.OSFile(str(path), "rb") as f:
            try:
                reader = pa.ipc.open_stream(f)
            except (pa.ArrowInvalid, OSError):
                notes.append(f"{path.name}: empty or unreadable segment")
                return schema.empty_table()
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
                except (pa.ArrowInvalid, OSError):
                    notes.append(f"{path.name}: cut after {len(batches)} whole batches")
                    break
    except OSError as exc:
        notes.append(f"{path.name}: {exc}")
        return schema.empty_table()
    if not batches:
        return schema.empty_table()
    table = pa.Table.from_batches(batches)
    if table.schema != schema:
        missing = [n for n in schema.names if n not in table.column_names]
        for name in [n for n in missing if n not in core]:  # written before the column
            col = schema.field(name)
            table = table.append_column(col, pa.nulls(table.num_rows, type=col.type))
        missing = [n for n in missing if n in core]
        if missing:
            shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            notes.append(
                f"{path.name}: schema of another table (no column {shown}); segment ignored"
            )
            return schema.empty_table()
        try:
            table = table.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            notes.append(f"{path.name}: schema does not match its table ({exc}); segment ignored")
            return schema.empty_table()
    return table


def read_segments(run_dir: Path) -> SegmentRead | None:
    """Tables of ``run_dir/segments`` (None when there are none). Never writes."""
    seg = run_dir / SEGMENTS_DIR
    if not seg.is_dir():
        return None
    notes: list[str] = []
    tables: dict[str, pa.Table] = {}
    last_t: int | None = None
    for name, schema in _SCHEMAS.items():
        path = seg / f"{name}.arrows"
        table = (
            _read_stream(path, schema, notes, _CORE[name])
            if path.is_file()
            else schema.empty_table()
        )
        if name == "requests":
            table = _dedupe_requests(table, notes)
        tables[name] = table
        tcol = {"chunks": "t", "telemetry": "t", "steps": "t_end"}.get(name)
        if tcol and table.num_rows:
            m = pc.max(table.column(tcol)).as_py()
            if m is not None:
                last_t = m if last_t is None else max(last_t, m)
    return SegmentRead(tables=tables, notes=notes, last_t=last_t)


def _dedupe_requests(table: pa.Table, notes: list[str]) -> pa.Table:
    """Each request's last row; a request without a final row is marked unfinished."""
    if table.num_rows == 0:
        return REQUEST_TABLE_SCHEMA.empty_table()
    frame = table.to_pandas()
    frame = frame.drop_duplicates("request_id", keep="last").sort_values("request_id")
    unfinished = ~frame["final"].astype(bool)
    if unfinished.any():
        frame.loc[unfinished, "error"] = UNFINISHED_ERROR
        notes.append(f"{int(unfinished.sum())} requests had not finished at the last flush")
    frame = frame.drop(columns=["final"])
    return pa.Table.from_pandas(frame, schema=REQUEST_TABLE_SCHEMA, preserve_index=False)
