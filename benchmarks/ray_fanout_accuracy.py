"""Stamp accuracy of the single-process client against ``--ray local:N`` at many streams.

Starts the scripted SSE server (which logs the ``perf_counter_ns`` of every chunk it writes
for prompts tagged ``id=TAG``), runs the same closed-loop workload from this process and from
N Ray actors, alternately (single, ray, single, ray, ...), and compares each run's
first-token stamps with the server's first write of that request: the TTFT error is how late
perfscope saw the first token arrive.

For each client it prints the error's p50/p95/p99 per run and the median over the runs, the
load average before and after each run, and where the client's time went: for the single
process its event-loop lag and loop-thread CPU share, for the actors each one's CPU share and
event-loop lag (from the run's manifest).

Run: ``python benchmarks/ray_fanout_accuracy.py [--streams 512] [--requests 1024]
[--actors 4] [--repeats 3] [--json out.json]``. Needs ``ray``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _errors_ms(run_path: Path, log: dict[str, dict[str, list[int]]], tag: str) -> np.ndarray:
    from perfscope.profiler.store import read_run

    run = read_run(run_path)
    origin = run.manifest["clock_origin_perf_counter_ns"]
    req = run.requests[run.requests["error"].isna()]
    errs = [
        (int(r.t_first_token) + origin - log[f"{tag}{int(r.request_id)}"]["writes"][0]) / 1e6
        for r in req.itertuples()
    ]
    return np.asarray(errs)


def _client_facts(run_path: Path) -> dict[str, Any]:
    """Where the client's time went, from the manifest."""
    from perfscope.profiler.store import read_run

    m = read_run(run_path, tables=False).manifest
    dist = m.get("distributed")
    if dist is None:
        client = (m.get("engine") or {}).get("config", {}).get("client") or {}
        lag = client.get("loop_lag_s") or {}
        return {
            "loop_lag_p50_ms": 1e3 * (lag.get("p50") or 0.0),
            "loop_lag_p99_ms": 1e3 * (lag.get("p99") or 0.0),
            "loop_cpu_share": client.get("loop_cpu_share"),
        }
    actors = []
    for a in dist["actors"]:
        lag = a.get("loop_lag") or {}
        actors.append(
            {
                "cpu_s": a.get("cpu_s"),
                "serve_s": a.get("serve_s"),
                "cpu_share": (a["cpu_s"] / a["serve_s"]) if a.get("serve_s") else None,
                "loop_lag_p50_ms": 1e3 * (lag.get("p50_s") or 0.0),
                "loop_lag_p99_ms": 1e3 * (lag.get("p99_s") or 0.0),
                "send_lag_p99_ms": 1e3 * (a.get("send_lag_p99_s") or 0.0),
            }
        )
    return {"actors": actors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=512)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--json", type=Path, default=None, help="write every number here")
    args = ap.parse_args()

    from perfscope.api.runner import RunOptions, execute_run
    from perfscope.profiler.driver import LoadConfig
    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.telemetry import TelemetryConfig
    from perfscope.profiler.workload import WorkloadConfig, parse_length
    from tests.test_openai_scripted import scripted_server

    # The actors import perfscope (and the test helpers) from this checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    clients = [("single process", None), (f"ray local:{args.actors}", f"local:{args.actors}")]
    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        scripted_server("--ttft", "0.05", "--itl", "0.02") as url,
    ):
        k = 0
        for rep in range(args.repeats):
            for label, target in clients:
                tag = f"r{k}x"
                k += 1
                prompts = Path(tmp) / f"{tag}.jsonl"
                prompts.write_text(
                    "".join(
                        json.dumps({"prompt": f"id={tag}{i} w"}) + "\n"
                        for i in range(args.requests)
                    )
                )
                urllib.request.urlopen(url.removesuffix("/v1") + "/_log").read()  # clear
                opts = RunOptions(
                    engine=f"openai:{url}",
                    workload=WorkloadConfig(
                        requests=args.requests,
                        prompt_len=parse_length(8),
                        output_len=parse_length(args.output_len),
                        prompts_file=prompts,
                    ),
                    load=LoadConfig(mode="online", concurrency=args.streams),
                    engine_options=EngineOptions(extra={"model": "m"}),
                    runs_dir=Path(tmp),
                    telemetry=TelemetryConfig(enabled=False),
                    ray=target,
                )
                load_before = os.getloadavg()[0]
                t0 = time.perf_counter()
                out = execute_run(opts)
                wall = time.perf_counter() - t0
                load_after = os.getloadavg()[0]
                log = json.loads(urllib.request.urlopen(url.removesuffix("/v1") + "/_log").read())
                errs = _errors_ms(out.path, log, tag)
                p = np.percentile(errs, [50, 95, 99])
                row = {
                    "client": label,
                    "repeat": rep,
                    "requests_ok": len(errs),
                    "p50_ms": float(p[0]),
                    "p95_ms": float(p[1]),
                    "p99_ms": float(p[2]),
                    "load_before": load_before,
                    "load_after": load_after,
                    "wall_s": wall,
                    **_client_facts(out.path),
                }
                runs.append(row)
                print(
                    f"{label:16s} #{rep}  {len(errs):5d} ok  TTFT error p50 {p[0]:7.2f} ms  "
                    f"p95 {p[1]:7.2f} ms  p99 {p[2]:7.2f} ms  load {load_before:.1f}->"
                    f"{load_after:.1f}  ({wall:.0f} s)",
                    flush=True,
                )
                if "actors" in row:
                    for i, a in enumerate(row["actors"]):
                        share = a["cpu_share"]
                        print(
                            f"    actor {i}: CPU {a['cpu_s']:.1f} s"
                            + (
                                f" over {a['serve_s']:.1f} s serving ({100 * share:.0f}% of a core)"
                                if share
                                else ""
                            )
                            + f", loop lag p50 {a['loop_lag_p50_ms']:.2f} ms"
                            f" p99 {a['loop_lag_p99_ms']:.2f} ms",
                            flush=True,
                        )
                else:
                    print(
                        f"    loop lag p50 {row['loop_lag_p50_ms']:.2f} ms "
                        f"p99 {row['loop_lag_p99_ms']:.2f} ms, loop thread "
                        f"{100 * (row['loop_cpu_share'] or 0):.0f}% of a core",
                        flush=True,
                    )
    print(f"\nmedian of {args.repeats} runs, {args.streams} streams, {os.cpu_count()} cores:")
    for label, _ in clients:
        mine = [r for r in runs if r["client"] == label]
        print(
            f"  {label:16s} TTFT error p50 {median(r['p50_ms'] for r in mine):7.2f} ms  "
            f"p95 {median(r['p95_ms'] for r in mine):7.2f} ms  "
            f"p99 {median(r['p99_ms'] for r in mine):7.2f} ms  "
            f"load {min(r['load_before'] for r in mine):.1f}-"
            f"{max(r['load_after'] for r in mine):.1f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
