"""Exports of a run: Perfetto/Chrome trace JSON, CSV and JSON.

Perfetto trace (opens in https://ui.perfetto.dev or ``chrome://tracing`` next to Nsight or
PyTorch traces): times are microseconds (``ts``, ``dur``) since the run's start.

- process "requests": each request is a complete (``X``) slice from send to last token, with
  child slices ``queue`` (send to its first prefill step, local engines only), ``prefill``
  (to the first token) and ``decode`` (to the last token). Requests overlap in time, and
  Perfetto requires slices on one thread track to nest, so requests are packed greedily into
  lanes (threads "lane N"), each lane holding requests that do not overlap. Token arrivals
  are thread-scoped instant events (``i``) on the request's lane; failures are an ``error``
  instant at the request's end. A counter track "active requests" counts requests in flight.
- process "engine": forward passes (``X`` slices named by kind: prefill, decode, mixed) with
  batch size and token counts in ``args``, and a "batch" counter.
- one process per telemetry device: counter (``C``) events, one track per quantity
  (``power_w``, ``util_pct``, ...).
- ``M`` metadata names every process and thread.

CSV: ``requests.csv`` (one row per request with its derived latencies in seconds) and
``summary.csv`` (every summary.json value as a dotted key and its value).
"""

from __future__ import annotations

import heapq
import io
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, Protocol, TypeAlias, TypedDict

import numpy as np
import pandas as pd

from perfscope.analysis.energy import device_keys
from perfscope.analysis.manifest import manifest_view
from perfscope.analysis.metrics import per_request
from perfscope.analysis.run_records import RunRecords
from perfscope.jsontypes import JsonObject, JsonValue
from perfscope.profiler.output import write_output, write_output_text

__all__ = [
    "EXPORT_SCHEMA",
    "MAX_TOKEN_EVENTS",
    "CompleteEvent",
    "CounterEvent",
    "ExportableRun",
    "InstantEvent",
    "MetadataEvent",
    "PerfettoTrace",
    "TraceEvent",
    "TraceOtherData",
    "export_json",
    "flatten_summary",
    "pack_lanes",
    "perfetto_trace",
    "requests_frame",
    "stream_perfetto",
    "write_csv",
    "write_json",
    "write_perfetto",
]

EXPORT_SCHEMA = "perfscope.export/1"
#: Token-arrival instants written at most; requests beyond this get slices only (noted in
#: the trace's ``otherData``).
MAX_TOKEN_EVENTS = 500_000

_PID_REQUESTS = 1
_PID_ENGINE = 2
_PID_TELEMETRY = 10
_TELEMETRY_FIELDS = (
    "power_w",
    "energy_j",
    "mem_used_bytes",
    "util_pct",
    "mem_util_pct",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temp_c",
    "rss_bytes",
    "proc_cpu_pct",
    "sm_util_pct",
    "tensor_util_pct",
    "dram_bw_util_pct",
    "torch_allocated_bytes",
)


class ExportableRun(RunRecords, Protocol):
    """What the exporters read: a run's records (the one protocol,
    :class:`~perfscope.analysis.RunRecords`) and its summary.json object, ``None`` before it
    was analysed (``perfscope.profiler.store.StoredRun`` fits)."""

    @property
    def summary(self) -> Mapping[str, JsonValue] | None: ...


# ---------------------------------------------------------------------- trace event shapes
# The Chrome trace-event format dictates these dicts' keys; each ``args`` is what Perfetto shows
# in a slice's or counter's details.


class _NameArgs(TypedDict):
    name: str


class RequestArgs(TypedDict):
    """A request slice's details; ``ttft_ms`` once it has a first token, ``error`` when it
    failed, ``actor`` and ``host`` on a ``--ray`` run."""

    request_id: int
    prompt_tokens: int
    max_output_tokens: int
    output_tokens: int
    warmup: bool
    driver_lag_us: float | None
    ttft_ms: NotRequired[float]
    error: NotRequired[str]
    actor: NotRequired[int]
    host: NotRequired[str | None]


class _RequestIdArgs(TypedDict):
    request_id: int


class _TokenArgs(TypedDict):
    request_id: int
    n_tokens: int
    index: int


class _ErrorArgs(TypedDict):
    request_id: int
    error: str


class _StepArgs(TypedDict):
    step_id: int
    batch_size: int
    new_tokens: int
    context_tokens: int
    request_ids: list[int]  # the first 64


class _ActiveArgs(TypedDict):
    count: int


class _BatchArgs(TypedDict):
    batch_size: int


class MetadataEvent(TypedDict):
    """``M``: names a process (``tid`` 0) or a thread."""

    ph: Literal["M"]
    name: Literal["process_name", "thread_name"]
    pid: int
    tid: int
    args: _NameArgs


class CompleteEvent(TypedDict):
    """``X``: a slice from ``ts`` lasting ``dur`` (microseconds)."""

    ph: Literal["X"]
    name: str
    cat: str
    pid: int
    tid: int
    ts: float
    dur: float
    args: RequestArgs | _RequestIdArgs | _StepArgs


class InstantEvent(TypedDict):
    """``i``: a thread-scoped (``s`` = ``t``) instant at ``ts``."""

    ph: Literal["i"]
    s: Literal["t"]
    name: str
    cat: str
    pid: int
    tid: int
    ts: float
    args: _TokenArgs | _ErrorArgs


class CounterEvent(TypedDict):
    """``C``: counter values at ``ts``, one track per ``args`` key (telemetry: a quantity each)."""

    ph: Literal["C"]
    name: str
    pid: int
    tid: int
    ts: float
    args: _ActiveArgs | _BatchArgs | dict[str, float]


TraceEvent: TypeAlias = MetadataEvent | CompleteEvent | InstantEvent | CounterEvent


class TraceOtherData(TypedDict):
    """The trace's ``otherData``: where it came from and what it holds."""

    perfscope_run_id: str
    started_at: str | None
    status: str | None
    time_origin: str
    request_lanes: int
    step_lanes: int
    telemetry_devices: list[str]
    token_events: int
    note: NotRequired[str]


class PerfettoTrace(TypedDict):
    """A whole trace as :func:`perfetto_trace` returns it."""

    traceEvents: list[TraceEvent]
    displayTimeUnit: str
    otherData: TraceOtherData


@dataclass
class _TraceInfo:
    """What the event generators learn while they run, for ``otherData`` (filled as they are
    consumed)."""

    run_id: str = "run"
    lanes: int = 0
    step_lanes: int = 0
    telemetry_devices: list[str] = field(default_factory=list)
    token_events: int = 0
    token_events_dropped: int = 0


class _Writable(Protocol):
    """A binary stream (file, gzip file, ``sys.stdout.buffer``)."""

    def write(self, data: bytes, /) -> int: ...


def _us(ns: float) -> float:
    """Nanoseconds → microseconds, kept to whole nanoseconds."""
    return round(float(ns) / 1000.0, 3)


def pack_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Greedy interval partitioning: a lane index per interval so that intervals in one
    lane never overlap (an interval may start exactly where the previous one ended).
    Uses the fewest lanes possible (the maximum overlap)."""
    order = np.argsort(starts, kind="stable")
    lanes = np.zeros(len(starts), dtype=np.int64)
    free: list[tuple[float, int]] = []  # (end, lane) of the lanes' last intervals
    n_lanes = 0
    for i in order:
        s, e = float(starts[i]), float(ends[i])
        if free and free[0][0] <= s:
            _, lane = heapq.heappop(free)
        else:
            lane = n_lanes
            n_lanes += 1
        lanes[i] = lane
        heapq.heappush(free, (max(e, s), lane))
    return lanes


def _meta(pid: int, name: str, tid: int | None = None) -> MetadataEvent:
    if tid is None:
        return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def _opt_int(v: Any) -> int | None:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return None
    return int(v)


def _prefill_starts(steps: pd.DataFrame) -> dict[int, int]:
    """Request id → start (ns) of the first prefill (or mixed) step that served it."""
    if steps.empty:
        return {}
    pre = steps[steps["kind"].isin(("prefill", "mixed"))]
    lists = [np.asarray(x if x is not None else [], dtype=np.int64) for x in pre["request_ids"]]
    counts = np.array([len(x) for x in lists], dtype=np.int64)
    if not len(lists) or counts.sum() == 0:
        return {}
    ids = np.concatenate(lists)
    t = np.repeat(pre["t_start"].to_numpy(dtype=np.int64), counts)
    order = np.lexsort((t, ids))
    ids, t = ids[order], t[order]
    first = np.concatenate(([True], ids[1:] != ids[:-1]))
    return dict(zip(ids[first].tolist(), t[first].tolist(), strict=True))


def _column(df: pd.DataFrame, name: str) -> list[Any]:
    """A column as Python values with missing values as None."""
    col = df[name]
    return [None if v is None or v is pd.NA or v != v else v for v in col.tolist()]


def _request_events(run: ExportableRun, info: _TraceInfo) -> Iterator[TraceEvent]:
    """Request slices, token instants and the "active requests" counter, in trace order.

    Fills ``info`` with ``lanes``, ``token_events`` and ``token_events_dropped`` once the
    events are consumed. Holds O(requests) state; chunks are read from sorted arrays.
    """
    info.lanes = info.token_events = info.token_events_dropped = 0
    req = run.requests.sort_values("request_id", kind="stable")
    if req.empty:
        return
    prefill_start = _prefill_starts(run.steps)
    rids = [int(x) for x in req["request_id"].tolist()]
    sched_l = [int(x) for x in req["t_scheduled"].tolist()]
    sent_l = [_opt_int(x) for x in _column(req, "t_sent")]
    first_l = [_opt_int(x) for x in _column(req, "t_first_token")]
    last_l = [_opt_int(x) for x in _column(req, "t_last_token")]
    starts: list[int] = []
    ends: list[int] = []
    for rid, sched, sent, first, last in zip(rids, sched_l, sent_l, first_l, last_l, strict=True):
        start = sent if sent is not None else sched
        ps = prefill_start.get(rid)
        starts.append(start)
        ends.append(max(x for x in (start, sent, first, last, ps) if x is not None))
    lanes = pack_lanes(np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64))
    n_lanes = int(lanes.max()) + 1 if len(lanes) else 0
    info.lanes = n_lanes
    for lane in range(n_lanes):
        yield _meta(_PID_REQUESTS, f"lane {lane}", lane + 1)

    # Chunks sorted by (request, time); each request's chunks are one slice of the arrays.
    c = run.chunks
    c_rid = c["request_id"].to_numpy(dtype=np.int64)
    c_t = c["t"].to_numpy(dtype=np.int64)
    order = np.lexsort((c_t, c_rid))
    c_rid, c_t = c_rid[order], c_t[order]
    c_n = c["n_tokens"].to_numpy(dtype=np.int64)[order]
    c_idx = c["index"].to_numpy(dtype=np.int64)[order]
    lo = np.searchsorted(c_rid, rids, side="left").tolist()
    hi = np.searchsorted(c_rid, rids, side="right").tolist()
    del c_rid

    errors = _column(req, "error")
    placed = _placed(req)
    actor_l = [_opt_int(x) for x in _column(req, "actor")] if placed else []
    host_l = _column(req, "host") if placed else []
    warm_l = [bool(x) for x in req["is_warmup"].tolist()]
    prompt_l = [int(x) for x in req["prompt_tokens"].tolist()]
    max_out_l = [int(x) for x in req["max_output_tokens"].tolist()]
    out_l = [int(x) for x in req["output_tokens"].tolist()]
    token_events = dropped = 0
    for k, rid in enumerate(rids):
        tid = int(lanes[k]) + 1
        start, end = starts[k], ends[k]
        sent, first, last = sent_l[k], first_l[k], last_l[k]
        error = None if errors[k] is None else str(errors[k])
        warm = warm_l[k]
        args: RequestArgs = {
            "request_id": rid,
            "prompt_tokens": prompt_l[k],
            "max_output_tokens": max_out_l[k],
            "output_tokens": out_l[k],
            "warmup": warm,
            "driver_lag_us": _us(sent - sched_l[k]) if sent is not None else None,
        }
        if sent is not None and first is not None:
            args["ttft_ms"] = (first - sent) / 1e6
        if error:
            args["error"] = error
        actor = actor_l[k] if placed else None
        if actor is not None:
            args["actor"], args["host"] = actor, host_l[k]
        name = f"{'warmup ' if warm else ''}request {rid}" + (" (failed)" if error else "")
        yield {
            "ph": "X",
            "name": name,
            "cat": "request",
            "pid": _PID_REQUESTS,
            "tid": tid,
            "ts": _us(start),
            "dur": _us(end - start),
            "args": args,
        }
        ps = prefill_start.get(rid)
        if sent is not None:
            parts: list[tuple[str, int, int | None]] = []
            if ps is not None and ps >= sent and (first is None or ps <= first):
                parts.append(("queue", sent, ps))
                parts.append(("prefill", ps, first))
            else:
                parts.append(("prefill", sent, first))
            parts.append(("decode", first if first is not None else end, last))
            for label, a, b in parts:
                if b is None or a is None or b < a:
                    continue
                yield {
                    "ph": "X",
                    "name": label,
                    "cat": "request." + label,
                    "pid": _PID_REQUESTS,
                    "tid": tid,
                    "ts": _us(a),
                    "dur": _us(b - a),
                    "args": {"request_id": rid},
                }
        n_chunks = hi[k] - lo[k]
        if n_chunks:
            if token_events + n_chunks > MAX_TOKEN_EVENTS:
                dropped += n_chunks
            else:
                token_events += n_chunks
                sl = slice(lo[k], hi[k])
                for t, n, idx in zip(
                    c_t[sl].tolist(), c_n[sl].tolist(), c_idx[sl].tolist(), strict=True
                ):
                    yield {
                        "ph": "i",
                        "s": "t",
                        "name": "token" if n == 1 else f"{n} tokens",
                        "cat": "token",
                        "pid": _PID_REQUESTS,
                        "tid": tid,
                        "ts": _us(t),
                        "args": {"request_id": rid, "n_tokens": n, "index": idx},
                    }
        if error:
            yield {
                "ph": "i",
                "s": "t",
                "name": "error",
                "cat": "error",
                "pid": _PID_REQUESTS,
                "tid": tid,
                "ts": _us(end),
                "args": {"request_id": rid, "error": error},
            }
    info.token_events, info.token_events_dropped = token_events, dropped
    # Requests in flight (sent, not finished) as a counter track.
    sent_mask = np.array([x is not None for x in sent_l], dtype=bool)
    times = np.concatenate(
        (np.array(starts, dtype=np.int64)[sent_mask], np.array(ends, dtype=np.int64)[sent_mask])
    )
    delta = np.concatenate(
        (np.ones(sent_mask.sum(), np.int64), -np.ones(sent_mask.sum(), np.int64))
    )
    order = np.lexsort((delta, times))
    active = np.cumsum(delta[order])
    for t, count in zip(times[order].tolist(), active.tolist(), strict=True):
        yield {
            "ph": "C",
            "name": "active requests",
            "pid": _PID_REQUESTS,
            "tid": 0,
            "ts": _us(t),
            "args": {"count": count},
        }


def _step_events(run: ExportableRun, info: _TraceInfo) -> Iterator[TraceEvent]:
    """Forward-pass slices and the "batch" counter; sets ``info.step_lanes``."""
    info.step_lanes = 0
    st = run.steps
    if st.empty:
        return
    st = st.sort_values("t_start", kind="stable")
    t0 = st["t_start"].to_numpy(dtype=np.int64)
    t1 = np.maximum(st["t_end"].to_numpy(dtype=np.int64), t0)
    lanes = pack_lanes(t0, t1)
    n_lanes = int(lanes.max()) + 1
    info.step_lanes = n_lanes
    for lane in range(n_lanes):
        yield _meta(_PID_ENGINE, "forward passes" + (f" {lane}" if lane else ""), lane + 1)
    columns = zip(
        st["kind"].tolist(),
        st["request_ids"].tolist(),
        st["step_id"].tolist(),
        st["batch_size"].tolist(),
        st["new_tokens"].tolist(),
        st["context_tokens"].tolist(),
        t0.tolist(),
        t1.tolist(),
        lanes.tolist(),
        strict=True,
    )
    for kind, rids, step_id, batch, new, ctx, a, b, lane in columns:
        ids = [int(i) for i in (rids[:64] if rids is not None else [])]
        yield {
            "ph": "X",
            "name": str(kind),
            "cat": "step",
            "pid": _PID_ENGINE,
            "tid": int(lane) + 1,
            "ts": _us(a),
            "dur": _us(b - a),
            "args": {
                "step_id": int(step_id),
                "batch_size": int(batch),
                "new_tokens": int(new),
                "context_tokens": int(ctx),
                "request_ids": ids,
            },
        }
        yield {
            "ph": "C",
            "name": "batch",
            "pid": _PID_ENGINE,
            "tid": 0,
            "ts": _us(a),
            "args": {"batch_size": int(batch)},
        }


def _telemetry_events(run: ExportableRun, info: _TraceInfo) -> Iterator[TraceEvent]:
    """One counter event per sample per device; sets ``info.telemetry_devices``."""
    info.telemetry_devices = []
    tele = run.telemetry
    if tele is None or tele.empty:
        return
    tele = tele.assign(device=device_keys(tele))  # node/device on a cluster run
    devices = sorted(str(d) for d in tele["device"].dropna().unique())
    info.telemetry_devices = devices
    fields = [f for f in _TELEMETRY_FIELDS if f in tele.columns]
    for i, dev in enumerate(devices):
        pid = _PID_TELEMETRY + i
        yield _meta(pid, f"telemetry {dev}")
        d = tele[tele["device"] == dev].sort_values("t")
        values = d[fields].to_numpy(dtype=np.float64, na_value=np.nan)
        for t, row in zip(d["t"].to_numpy(dtype=np.int64).tolist(), values.tolist(), strict=True):
            args: dict[str, float] = {
                f: v for f, v in zip(fields, row, strict=True) if math.isfinite(v)
            }
            if args:
                yield {"ph": "C", "name": dev, "pid": pid, "tid": 0, "ts": _us(t), "args": args}


def _trace_events(run: ExportableRun, info: _TraceInfo) -> Iterator[TraceEvent]:
    """Every event of the trace, in order; ``info`` holds the counts once consumed."""
    manifest = manifest_view(run.manifest)
    info.run_id = manifest.run_id or "run"
    yield _meta(_PID_REQUESTS, f"requests ({info.run_id})")
    yield from _request_events(run, info)
    if not run.steps.empty:
        yield _meta(_PID_ENGINE, f"engine {manifest.engine.uri or ''}")
    yield from _step_events(run, info)
    yield from _telemetry_events(run, info)


def _other_data(run: ExportableRun, info: _TraceInfo) -> TraceOtherData:
    manifest = manifest_view(run.manifest)
    other: TraceOtherData = {
        "perfscope_run_id": info.run_id,
        "started_at": manifest.started_at,
        "status": manifest.status,
        "time_origin": "run start (ts 0); ts and dur in microseconds",
        "request_lanes": info.lanes,
        "step_lanes": info.step_lanes,
        "telemetry_devices": info.telemetry_devices,
        "token_events": info.token_events,
    }
    if info.token_events_dropped:
        other["note"] = (
            f"{info.token_events_dropped} token arrivals were left out "
            f"(more than {MAX_TOKEN_EVENTS}); their requests keep their slices"
        )
    return other


def perfetto_trace(run: ExportableRun) -> PerfettoTrace:
    """The run as a Chrome/Perfetto JSON trace (``{"traceEvents": [...], ...}``), in memory.

    For big runs prefer :func:`stream_perfetto`, which never holds the event list.
    """
    info = _TraceInfo()
    events = list(_trace_events(run, info))
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": _other_data(run, info)}


#: Events encoded per write by :func:`stream_perfetto` (bounds its memory).
_STREAM_BATCH = 20_000


def stream_perfetto(run: ExportableRun, out: _Writable) -> int:
    """Write the trace of :func:`perfetto_trace` to ``out`` as compact JSON, event batch by
    event batch, holding at most ``_STREAM_BATCH`` events; returns the bytes written."""
    info = _TraceInfo()
    written = out.write(b'{"traceEvents":[')
    batch: list[TraceEvent] = []
    sep = b""

    def flush() -> int:
        text = json.dumps(batch, separators=(",", ":"), allow_nan=False)[1:-1].encode()
        batch.clear()
        return out.write(sep + text)

    for event in _trace_events(run, info):
        batch.append(event)
        if len(batch) >= _STREAM_BATCH:
            written += flush()
            sep = b","
    if batch:
        written += flush()
    tail = {"displayTimeUnit": "ms", "otherData": _other_data(run, info)}
    written += out.write(b"]," + json.dumps(tail, separators=(",", ":"))[1:].encode())
    return written


def write_perfetto(run: ExportableRun, path: Path) -> Path:
    """Write the run's Perfetto trace to ``path`` (gzip-compressed when it ends in ``.gz``),
    streamed; a regular file is replaced only when complete (``profiler/output.py``)."""
    # The one -o writer: streamed; atomic for a regular file, in place for a device or pipe.
    write_output(path, lambda f: stream_perfetto(run, f))
    return path


# ---------------------------------------------------------------------- CSV / JSON


def requests_frame(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per request: the recorded columns (times in seconds since run start) and its
    derived ``ttft_s``, ``tpot_s``, ``e2e_s``, ``ntpot_s`` and ``ok``; a ``--ray`` run's
    also the ``actor`` and ``host`` that served each (to group latency by)."""
    if requests.empty:
        cols = ["request_id", "is_warmup", "prompt_tokens", "max_output_tokens", "output_tokens"]
        return pd.DataFrame(columns=cols)
    r = requests.sort_values("request_id", kind="stable").reset_index(drop=True)
    pr = per_request(r)
    out = pd.DataFrame(
        {
            "request_id": r["request_id"].astype(np.int64),
            "is_warmup": r["is_warmup"].astype(bool),
            "prompt_tokens": r["prompt_tokens"].astype(np.int64),
            "max_output_tokens": r["max_output_tokens"].astype(np.int64),
            "output_tokens": r["output_tokens"].astype(np.int64),
        }
    )
    for c in ("t_scheduled", "t_sent", "t_first_token", "t_last_token"):
        out[c + "_s"] = r[c].astype("float64") * 1e-9
    for c in ("ttft", "tpot", "e2e", "ntpot"):
        out[c + "_s"] = pr[c].to_numpy()
    out["ok"] = pr["ok"].to_numpy()
    out["error"] = r["error"].map(_csv_safe)
    if _placed(r):
        out["actor"] = r["actor"].astype("Int64")
        out["host"] = r["host"].map(_csv_safe)
    return out


def _placed(requests: pd.DataFrame) -> bool:
    """Whether the requests carry the load actor that served them (a ``--ray`` run)."""
    return "actor" in requests and bool(requests["actor"].notna().any())


def _csv_safe(v: Any) -> Any:
    """Neutralise spreadsheet formulas in free text (a leading = + - @ is quoted)."""
    if isinstance(v, str) and v[:1] in ("=", "+", "-", "@"):
        return "'" + v
    return v


def flatten_summary(summary: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Every leaf of a summary (a typed :class:`~perfscope.analysis.Summary` reads as its JSON
    form) as ``(dotted.key, value)``; lists index by position."""
    if isinstance(summary, Mapping):
        for k, v in summary.items():
            yield from flatten_summary(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(summary, list | tuple):
        if not summary:
            yield prefix, ""
        for i, v in enumerate(summary):
            yield from flatten_summary(v, f"{prefix}.{i}")
    else:
        yield prefix, summary


def write_csv(run: ExportableRun, out_dir: Path) -> list[Path]:
    """Write ``requests.csv`` and ``summary.csv`` into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    req_path = out_dir / "requests.csv"
    requests_frame(run.requests).to_csv(req_path, index=False, float_format="%.9g")
    rows = [(k, _csv_safe(v)) for k, v in flatten_summary(run.summary or {})]
    sum_path = out_dir / "summary.csv"
    pd.DataFrame(rows, columns=["key", "value"]).to_csv(sum_path, index=False)
    return [req_path, sum_path]


def export_json(run: ExportableRun) -> JsonObject:
    """Manifest, summary and per-request rows in one JSON-ready dict."""
    frame = requests_frame(run.requests)
    buf = io.StringIO()
    frame.to_json(buf, orient="records", double_precision=15)
    return {
        "schema": EXPORT_SCHEMA,
        "manifest": dict(run.manifest),
        "summary": None if run.summary is None else dict(run.summary),
        "requests": json.loads(buf.getvalue()),
    }


def write_json(run: ExportableRun, path: Path) -> Path:
    """Write :func:`export_json` to ``path``."""
    write_output_text(path, json.dumps(export_json(run), indent=1, default=str))
    return path
