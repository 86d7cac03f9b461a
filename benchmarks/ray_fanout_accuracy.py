"""Stamp accuracy of the single-process client against ``--ray local:N`` at many streams.

Starts the scripted SSE server (which logs the ``perf_counter_ns`` of every chunk it writes
for prompts tagged ``id=TAG``), runs the same closed-loop workload once from this process and
once from N Ray actors, and compares each run's first-token stamps with the server's first
write of that request: the error is how late perfscope saw the token arrive.

Run: ``python benchmarks/ray_fanout_accuracy.py [--streams 512] [--requests 1024]
[--actors 4]``. Needs ``ray``. Prints p50/p95/p99 of the first-token stamp error in ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=512)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=16)
    args = ap.parse_args()

    from perfscope._runner import RunOptions, execute_run
    from perfscope.profiler.driver import LoadConfig
    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.telemetry import TelemetryConfig
    from perfscope.profiler.workload import WorkloadConfig, parse_length
    from tests.test_openai_scripted import scripted_server

    with (
        tempfile.TemporaryDirectory() as tmp,
        scripted_server("--ttft", "0.05", "--itl", "0.02") as url,
    ):
        results = {}
        for label, target in (("single process", None), (f"ray local:{args.actors}", "x")):
            tag = "s" if target is None else "r"
            prompts = Path(tmp) / f"{tag}.jsonl"
            prompts.write_text(
                "".join(
                    json.dumps({"prompt": f"id={tag}{i} w"}) + "\n" for i in range(args.requests)
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
                ray=None if target is None else f"local:{args.actors}",
            )
            out = execute_run(opts)
            log = json.loads(urllib.request.urlopen(url.removesuffix("/v1") + "/_log").read())
            errs = _errors_ms(out.path, log, tag)
            results[label] = errs
            p = np.percentile(errs, [50, 95, 99])
            print(
                f"{label:18s} {len(errs):5d} requests  first-token stamp error "
                f"p50 {p[0]:.2f} ms  p95 {p[1]:.2f} ms  p99 {p[2]:.2f} ms"
            )


if __name__ == "__main__":
    main()
