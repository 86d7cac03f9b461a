"""How analysis, report and export scale with the size of a run.

Builds a synthetic HTTP-like run (no steps: energy is attributed by concurrency, the costly
path) of ``--requests`` requests and about ``--chunks`` token chunks, with GPU telemetry
(power and energy counter every 100 ms) and CPU samples, written with the run store's own
writers. Then runs, each in a fresh subprocess, and measures wall time and peak resident
memory (``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a wrapper process that runs only that
command):

- ``perfscope analyze RUN --json``
- ``perfscope report RUN -o report.html``
- ``perfscope export RUN --format perfetto -o trace.json``
- ``perfscope export RUN --format csv``

Each command is repeated ``--repeats`` times; the median time and the largest peak RSS are
reported. The issue's targets on the 2-core development machine: ``analyze`` under 5 s and
1 GB for 1 M chunks and 50 k requests; report and export in bounded memory.

    .venv/bin/python benchmarks/analysis_scale.py [--requests 50000] [--chunks 1000000]
        [--repeats 3] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import perfscope
from perfscope.analysis.modelspec import ModelSpec
from perfscope.hwdb import lookup
from perfscope.profiler.records import CHUNK_SCHEMA, REQUEST_SCHEMA, STEP_SCHEMA, TELEMETRY_SCHEMA
from perfscope.profiler.store import write_json_atomic, write_table_atomic

MS = 1_000_000

#: Runs one command and prints {"wall_s", "maxrss_bytes", "rc"} of that command alone.
_WRAPPER = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "maxrss_bytes": rss, "rc": rc}))
"""


def build_run(
    root: Path,
    n_requests: int = 50_000,
    n_chunks: int = 1_000_000,
    *,
    seed: int = 0,
    steps: bool = False,
) -> Path:
    """Write a synthetic run of ``n_requests`` requests and about ``n_chunks`` chunks.

    Requests arrive as a Poisson process at 200/s (about 40 in flight at once); each streams
    1 to ``2 · n_chunks / n_requests`` chunks of 1-3 tokens; 1% fail half-way. Vectorised, so
    building a million chunks takes seconds. ``steps`` adds a local engine's step records
    (the energy and roofline paths that read steps): one prefill step per request and one
    decode step per later chunk, each serving that one request (about ``n_chunks`` steps).
    """
    rng = np.random.default_rng(seed)
    path = root / f"20260101-000000-scale-{seed:04x}"
    path.mkdir(parents=True)
    n = n_requests
    rate = 200.0
    sched = np.cumsum(rng.exponential(1.0 / rate, n) * 1e9).astype(np.int64)
    sent = sched + rng.integers(50_000, 200_000, n)
    ttft = (rng.lognormal(np.log(0.08), 0.4, n) * 1e9).astype(np.int64)
    first = sent + ttft
    per_req = rng.integers(1, max(2, 2 * n_chunks // n), n, endpoint=True)
    failed = rng.random(n) < 0.01
    per_req = np.where(failed, np.maximum(1, per_req // 2), per_req)
    total = int(per_req.sum())
    rid = np.repeat(np.arange(n, dtype=np.int64), per_req)
    starts = np.concatenate(([0], np.cumsum(per_req)[:-1]))
    index = np.arange(total, dtype=np.int64) - np.repeat(starts, per_req)
    ntok = rng.integers(1, 4, total).astype(np.int64)
    ntok[index == 0] = 1
    gap = (rng.lognormal(np.log(0.012), 0.2, total) * ntok * 1e9).astype(np.int64)
    gap[index == 0] = 0
    csum = np.cumsum(gap)
    t = first[rid] + csum - np.repeat(csum[starts], per_req)
    last = t[starts + per_req - 1]
    produced = np.bincount(rid, weights=ntok, minlength=n).astype(np.int64)
    errors = np.array([None] * n, dtype=object)
    errors[failed] = "HTTP 500: upstream timeout"
    requests = pa.table(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "prompt_tokens": rng.integers(64, 512, n).astype(np.int64),
            "max_output_tokens": np.full(n, 256, dtype=np.int64),
            "t_scheduled": sched,
            "t_sent": sent,
            "t_first_token": first,
            "t_last_token": pa.array(last, mask=failed),
            "output_tokens": produced,
            "error": errors.tolist(),
            "is_warmup": np.zeros(n, dtype=bool),
        },
        schema=REQUEST_SCHEMA,
    )
    # Chunks as they arrive on the wire: interleaved across requests, ordered by time.
    order = np.argsort(t, kind="stable")
    chunks = pa.table(
        {"request_id": rid[order], "t": t[order], "n_tokens": ntok[order], "index": index[order]},
        schema=CHUNK_SCHEMA,
    )
    write_table_atomic(path / "requests.parquet", requests)
    write_table_atomic(path / "chunks.parquet", chunks)
    if steps:
        write_table_atomic(path / "steps.parquet", _steps_table(rid, t, ntok, index, sent, first))
    else:
        write_table_atomic(path / "steps.parquet", STEP_SCHEMA.empty_table())

    t_end = int(last.max())
    ts = np.arange(0, t_end + 100 * MS, 100 * MS, dtype=np.int64)
    m = ts.size
    power = 350.0 + 100.0 * np.sin(ts / 3e9) + rng.normal(0, 5, m)
    energy = np.concatenate([[0.0], np.cumsum(power[1:] * 0.1)])
    cols: dict[str, Any] = {name: [None] * (2 * m) for name in TELEMETRY_SCHEMA.names}
    cols.update(
        t=np.concatenate((ts, ts)),
        device=["gpu0"] * m + ["cpu"] * m,
        power_w=np.concatenate((power, np.full(m, np.nan))),
        energy_j=np.concatenate((energy, np.full(m, np.nan))),
        mem_used_bytes=np.concatenate((np.full(m, 60e9), np.full(m, 8e9))),
        util_pct=np.concatenate((np.clip(80 + rng.normal(0, 5, m), 0, 100), np.full(m, 50.0))),
        sm_clock_mhz=np.concatenate((np.full(m, 1980.0), np.full(m, np.nan))),
        rss_bytes=np.concatenate((np.full(m, np.nan), np.full(m, 2e9))),
        proc_cpu_pct=np.concatenate((np.full(m, np.nan), np.full(m, 30.0))),
    )
    write_table_atomic(path / "telemetry.parquet", pa.table(cols, schema=TELEMETRY_SCHEMA))

    model = ModelSpec.from_preset("llama-3-8b").to_dict()
    h100 = lookup("h100-sxm5-80gb")
    manifest = {
        "schema": "perfscope.manifest/1",
        "run_id": path.name,
        "name": "scale",
        "perfscope_version": perfscope.__version__,
        "command": ["perfscope", "run", "openai:http://localhost:8000/v1"],
        "started_at": "2026-01-01T00:00:00+00:00",
        "ended_at": "2026-01-01T00:05:00+00:00",
        "status": "complete",
        "engine": {
            "uri": "openai:http://localhost:8000/v1",
            "kind": "openai",
            "model": model,
            "device": None,
            "dtype": None,
            "config": {},
        },
        "workload": {"requests": n, "prompt_len": "uniform:64:512", "output_len": "synthetic"},
        "load": {"mode": "online", "rate": rate, "arrival": "poisson"},
        "slos": {"ttft": 0.15, "tpot": 0.02},
        "hw": "h100-sxm5-80gb",
        "hardware": {"spec": h100.to_dict(), "resolved_from": "--hw h100-sxm5-80gb"},
        "host": {"python": "3.11", "platform": "synthetic"},
        "errors": [],
        "telemetry": {"status": "ok", "devices": ["gpu0", "cpu"]},
    }
    write_json_atomic(path / "manifest.json", manifest)
    return path


def _steps_table(
    rid: np.ndarray,
    t: np.ndarray,
    ntok: np.ndarray,
    index: np.ndarray,
    sent: np.ndarray,
    first: np.ndarray,
) -> pa.Table:
    """Prefill steps (send to first token) and one decode step per later chunk."""
    n = len(sent)
    dec = index > 0
    d_rid, d_end, d_new = rid[dec], t[dec], ntok[dec]
    d_start = t[np.flatnonzero(dec) - 1]  # the previous chunk of the same request
    p_rid = np.arange(n, dtype=np.int64)
    kind = ["prefill"] * n + ["decode"] * len(d_rid)
    ids = np.concatenate((p_rid, d_rid))
    m = len(ids)
    return pa.table(
        {
            "step_id": np.arange(m, dtype=np.int64),
            "kind": kind,
            "t_start": np.concatenate((sent, d_start)),
            "t_end": np.concatenate((first, d_end)),
            "batch_size": np.ones(m, dtype=np.int64),
            "new_tokens": np.concatenate((np.full(n, 256, dtype=np.int64), d_new)),
            "context_tokens": np.concatenate((np.zeros(n, dtype=np.int64), 256 + index[dec])),
            "request_ids": pa.ListArray.from_arrays(np.arange(m + 1, dtype=np.int32), ids),
        },
        schema=STEP_SCHEMA,
    )


def measure(cmd: list[str], repeats: int) -> dict[str, Any]:
    """Median wall time and largest peak RSS of ``cmd`` over ``repeats`` fresh processes."""
    walls, rss = [], []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", _WRAPPER, *cmd], capture_output=True, text=True, check=True
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if r["rc"] != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {r['rc']}")
        walls.append(r["wall_s"])
        rss.append(r["maxrss_bytes"])
    return {
        "wall_s_median": statistics.median(walls),
        "wall_s_all": walls,
        "peak_rss_bytes": max(rss),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--chunks", type=int, default=1_000_000, help="about this many chunks")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", action="store_true", help="add step records (a local engine's run)")
    ap.add_argument("--keep", type=Path, default=None, help="build the run here and keep it")
    ap.add_argument(
        "--only", action="append", default=None, help="analyze|report|perfetto|csv (repeatable)"
    )
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="perfscope-scale-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        path = build_run(root, args.requests, args.chunks, steps=args.steps)
        exe = [sys.executable, "-m", "perfscope"]
        out_dir = Path(tmp)
        # analyze first: report and export read the summary it writes.
        commands = {
            "analyze": [*exe, "analyze", str(path), "--json"],
            "report": [*exe, "report", str(path), "-o", str(out_dir / "report.html")],
            "perfetto": [
                *exe,
                "export",
                str(path),
                "--format",
                "perfetto",
                "-o",
                str(out_dir / "trace.json"),
            ],
            "csv": [*exe, "export", str(path), "--format", "csv", "-o", str(out_dir / "csv")],
        }
        results: dict[str, Any] = {
            "requests": args.requests,
            "steps": args.steps,
            "chunks": int(pq.read_metadata(path / "chunks.parquet").num_rows),
            "cpu_count": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0],
        }
        for name, cmd in commands.items():
            if args.only and name not in args.only and name != "analyze":
                continue
            results[name] = measure(cmd, args.repeats)
        sizes = {
            "report_bytes": out_dir / "report.html",
            "perfetto_bytes": out_dir / "trace.json",
        }
        for key, p in sizes.items():
            if p.exists():
                results[key] = p.stat().st_size

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{results['requests']} requests, {results['chunks']} chunks")
        for name in commands:
            if name in results:
                r = results[name]
                print(
                    f"{name:>9}: {r['wall_s_median']:7.2f} s (median of {len(r['wall_s_all'])}),"
                    f" peak RSS {r['peak_rss_bytes'] / 1e6:7.0f} MB"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
