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

import gzip
import heapq
import io
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from perfscope.analysis.catalogue import value_at
from perfscope.analysis.metrics import per_request
from perfscope.profiler.store import write_bytes_atomic, write_text_atomic

__all__ = [
    "EXPORT_SCHEMA",
    "MAX_TOKEN_EVENTS",
    "ExportableRun",
    "export_json",
    "flatten_summary",
    "pack_lanes",
    "perfetto_trace",
    "requests_frame",
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


class ExportableRun(Protocol):
    """What the exporters read (``perfscope.profiler.store.StoredRun`` fits)."""

    @property
    def manifest(self) -> dict[str, Any]: ...
    @property
    def summary(self) -> dict[str, Any] | None: ...
    @property
    def requests(self) -> pd.DataFrame: ...
    @property
    def chunks(self) -> pd.DataFrame: ...
    @property
    def steps(self) -> pd.DataFrame: ...
    @property
    def telemetry(self) -> pd.DataFrame: ...


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


def _meta(pid: int, name: str, tid: int | None = None) -> dict[str, Any]:
    if tid is None:
        return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def _opt_int(v: Any) -> int | None:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return None
    return int(v)


def _request_events(run: ExportableRun, events: list[dict[str, Any]]) -> dict[str, Any]:
    req = run.requests.sort_values("request_id", kind="stable")
    if req.empty:
        return {"lanes": 0, "token_events": 0, "token_events_dropped": 0}
    prefill_start: dict[int, int] = {}
    steps = run.steps
    if not steps.empty:
        pre = steps[steps["kind"].isin(("prefill", "mixed"))][["t_start", "request_ids"]]
        ex = pre.explode("request_ids").dropna(subset=["request_ids"])
        if not ex.empty:
            g = ex.groupby(ex["request_ids"].astype(np.int64))["t_start"].min()
            prefill_start = dict(
                zip(g.index.astype(np.int64).tolist(), g.astype(np.int64).tolist(), strict=True)
            )
    rows = []
    records: list[dict[str, Any]] = req.to_dict(orient="records")  # type: ignore[assignment]
    for r in records:
        sched = int(r["t_scheduled"])
        sent = _opt_int(r["t_sent"])
        first = _opt_int(r["t_first_token"])
        last = _opt_int(r["t_last_token"])
        start = sent if sent is not None else sched
        ps = prefill_start.get(int(r["request_id"]))
        end = max(x for x in (start, sent, first, last, ps) if x is not None)
        rows.append((int(r["request_id"]), start, end, sent, first, last, r))
    lanes = pack_lanes(
        np.array([x[1] for x in rows], dtype=np.int64),
        np.array([x[2] for x in rows], dtype=np.int64),
    )
    n_lanes = int(lanes.max()) + 1 if len(lanes) else 0
    for lane in range(n_lanes):
        events.append(_meta(_PID_REQUESTS, f"lane {lane}", lane + 1))
    chunks_by_req: dict[int, pd.DataFrame] = {}
    if not run.chunks.empty:
        ordered = run.chunks.sort_values(["request_id", "t"], kind="stable")
        chunks_by_req = {
            int(np.asarray(k).item()): g for k, g in ordered.groupby("request_id", sort=False)
        }
    token_events = dropped = 0
    for (rid, start, end, sent, first, last, r), lane in zip(rows, lanes, strict=True):
        tid = int(lane) + 1
        error = None if r["error"] is None or r["error"] != r["error"] else str(r["error"])
        warm = bool(r["is_warmup"])
        args: dict[str, Any] = {
            "request_id": rid,
            "prompt_tokens": int(r["prompt_tokens"]),
            "max_output_tokens": int(r["max_output_tokens"]),
            "output_tokens": int(r["output_tokens"]),
            "warmup": warm,
            "driver_lag_us": _us(sent - int(r["t_scheduled"])) if sent is not None else None,
        }
        if sent is not None and first is not None:
            args["ttft_ms"] = (first - sent) / 1e6
        if error:
            args["error"] = error
        name = f"{'warmup ' if warm else ''}request {rid}" + (" (failed)" if error else "")
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": "request",
                "pid": _PID_REQUESTS,
                "tid": tid,
                "ts": _us(start),
                "dur": _us(end - start),
                "args": args,
            }
        )
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
                events.append(
                    {
                        "ph": "X",
                        "name": label,
                        "cat": "request." + label,
                        "pid": _PID_REQUESTS,
                        "tid": tid,
                        "ts": _us(a),
                        "dur": _us(b - a),
                        "args": {"request_id": rid},
                    }
                )
        c = chunks_by_req.get(rid)
        if c is not None:
            if token_events + len(c) > MAX_TOKEN_EVENTS:
                dropped += len(c)
            else:
                token_events += len(c)
                for t, n, idx in zip(c["t"], c["n_tokens"], c["index"], strict=True):
                    events.append(
                        {
                            "ph": "i",
                            "s": "t",
                            "name": "token" if int(n) == 1 else f"{int(n)} tokens",
                            "cat": "token",
                            "pid": _PID_REQUESTS,
                            "tid": tid,
                            "ts": _us(int(t)),
                            "args": {"request_id": rid, "n_tokens": int(n), "index": int(idx)},
                        }
                    )
        if error:
            events.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": "error",
                    "cat": "error",
                    "pid": _PID_REQUESTS,
                    "tid": tid,
                    "ts": _us(end),
                    "args": {"request_id": rid, "error": error},
                }
            )
    # Requests in flight (sent, not finished) as a counter track.
    sends = [(x[1], 1) for x in rows if x[3] is not None]
    ends = [(x[2], -1) for x in rows if x[3] is not None]
    active = 0
    for t, d in sorted(sends + ends, key=lambda e: (e[0], e[1])):
        active += d
        events.append(
            {
                "ph": "C",
                "name": "active requests",
                "pid": _PID_REQUESTS,
                "tid": 0,
                "ts": _us(t),
                "args": {"count": active},
            }
        )
    return {"lanes": n_lanes, "token_events": token_events, "token_events_dropped": dropped}


def _step_events(run: ExportableRun, events: list[dict[str, Any]]) -> int:
    st = run.steps
    if st.empty:
        return 0
    st = st.sort_values("t_start", kind="stable")
    t0 = st["t_start"].to_numpy(dtype=np.int64)
    t1 = np.maximum(st["t_end"].to_numpy(dtype=np.int64), t0)
    lanes = pack_lanes(t0, t1)
    n_lanes = int(lanes.max()) + 1
    for lane in range(n_lanes):
        events.append(_meta(_PID_ENGINE, "forward passes" + (f" {lane}" if lane else ""), lane + 1))
    for r, a, b, lane in zip(st.to_dict(orient="records"), t0, t1, lanes, strict=True):
        ids = [int(i) for i in (r["request_ids"] if r["request_ids"] is not None else [])]
        events.append(
            {
                "ph": "X",
                "name": str(r["kind"]),
                "cat": "step",
                "pid": _PID_ENGINE,
                "tid": int(lane) + 1,
                "ts": _us(int(a)),
                "dur": _us(int(b - a)),
                "args": {
                    "step_id": int(r["step_id"]),
                    "batch_size": int(r["batch_size"]),
                    "new_tokens": int(r["new_tokens"]),
                    "context_tokens": int(r["context_tokens"]),
                    "request_ids": ids[:64],
                },
            }
        )
        events.append(
            {
                "ph": "C",
                "name": "batch",
                "pid": _PID_ENGINE,
                "tid": 0,
                "ts": _us(int(a)),
                "args": {"batch_size": int(r["batch_size"])},
            }
        )
    return n_lanes


def _telemetry_events(run: ExportableRun, events: list[dict[str, Any]]) -> list[str]:
    tele = run.telemetry
    if tele is None or tele.empty:
        return []
    devices = sorted(str(d) for d in tele["device"].dropna().unique())
    fields = [f for f in _TELEMETRY_FIELDS if f in tele.columns]
    for i, dev in enumerate(devices):
        pid = _PID_TELEMETRY + i
        events.append(_meta(pid, f"telemetry {dev}"))
        d = tele[tele["device"] == dev].sort_values("t")
        values = d[fields].to_numpy(dtype=np.float64, na_value=np.nan)
        for t, row in zip(d["t"].to_numpy(dtype=np.int64), values, strict=True):
            args = {f: float(v) for f, v in zip(fields, row, strict=True) if math.isfinite(v)}
            if args:
                events.append(
                    {"ph": "C", "name": dev, "pid": pid, "tid": 0, "ts": _us(int(t)), "args": args}
                )
    return devices


def perfetto_trace(run: ExportableRun) -> dict[str, Any]:
    """The run as a Chrome/Perfetto JSON trace (``{"traceEvents": [...], ...}``)."""
    manifest = run.manifest
    run_id = str(value_at(manifest, "run_id", default="run"))
    events: list[dict[str, Any]] = [
        _meta(_PID_REQUESTS, f"requests ({run_id})"),
    ]
    req_info = _request_events(run, events)
    if not run.steps.empty:
        events.append(_meta(_PID_ENGINE, f"engine {value_at(manifest, 'engine.uri', default='')}"))
    step_lanes = _step_events(run, events)
    devices = _telemetry_events(run, events)
    other: dict[str, Any] = {
        "perfscope_run_id": run_id,
        "started_at": value_at(manifest, "started_at"),
        "status": value_at(manifest, "status"),
        "time_origin": "run start (ts 0); ts and dur in microseconds",
        "request_lanes": req_info["lanes"],
        "step_lanes": step_lanes,
        "telemetry_devices": devices,
        "token_events": req_info["token_events"],
    }
    if req_info["token_events_dropped"]:
        other["note"] = (
            f"{req_info['token_events_dropped']} token arrivals were left out "
            f"(more than {MAX_TOKEN_EVENTS}); their requests keep their slices"
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_perfetto(run: ExportableRun, path: Path) -> Path:
    """Write :func:`perfetto_trace` to ``path`` (gzip-compressed when it ends in ``.gz``)."""
    data = json.dumps(perfetto_trace(run), separators=(",", ":"), allow_nan=False).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, gzip.compress(data) if path.suffix == ".gz" else data)
    return path


# ---------------------------------------------------------------------- CSV / JSON


def requests_frame(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per request: the recorded columns (times in seconds since run start) and its
    derived ``ttft_s``, ``tpot_s``, ``e2e_s``, ``ntpot_s`` and ``ok``."""
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
    return out


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


def export_json(run: ExportableRun) -> dict[str, Any]:
    """Manifest, summary and per-request rows in one JSON-ready dict."""
    frame = requests_frame(run.requests)
    buf = io.StringIO()
    frame.to_json(buf, orient="records", double_precision=15)
    return {
        "schema": EXPORT_SCHEMA,
        "manifest": run.manifest,
        "summary": None if run.summary is None else dict(run.summary),
        "requests": json.loads(buf.getvalue()),
    }


def write_json(run: ExportableRun, path: Path) -> Path:
    """Write :func:`export_json` to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(export_json(run), indent=1, default=str))
    return path
