"""TTFT/TPOT of ``vllm:MODEL`` (vLLM's engine stepped by perfscope, no HTTP) next to the same
model served by ``vllm serve`` and measured over HTTP with ``openai:``; and the delay the
worker pipe adds to each step event (worker's write stamp to perfscope's receipt, one
CLOCK_MONOTONIC).

Same model (the tiny random Llama of tests/live_models.py), same vLLM settings
(``max_model_len`` 512, ``max_num_seqs`` 64, bf16, 1 GiB KV cache), same workload; the
server is stopped before the ``vllm:`` runs so the two never share the CPU.

    .venv/bin/python benchmarks/vllm_engine_vs_serve.py [--repeat 3] [--requests 16]
        [--concurrency 16]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _wire_module() -> Any:
    """scripts/wire_accuracy.py (its vLLM server launcher), loaded by path."""
    spec = importlib.util.spec_from_file_location(
        "wire_accuracy", ROOT / "scripts/wire_accuracy.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["wire_accuracy"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _workload(args: argparse.Namespace) -> list[str]:
    return [
        *("--requests", str(args.requests), "--prompt-len", "64", "--output-len", "32"),
        *("--concurrency", str(args.concurrency), "--seed", "0", "--warmup", "4"),
    ]


def _row(summary: dict[str, Any]) -> dict[str, float]:
    lat = summary["latency"]
    return {
        "ttft_mean": lat["ttft"]["mean"],
        "ttft_p50": lat["ttft"]["p50"],
        "tpot_mean": lat["tpot"]["mean"],
        "tpot_p50": lat["tpot"]["p50"],
        "failed": summary["counts"]["failed"],
    }


def run_openai(port: int, model: Path, runs: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-m",
        "perfscope.cli",
        "run",
        f"openai:http://127.0.0.1:{port}/v1",
        *("--model", "tiny-llama", "--tokenizer", str(model)),
        *("--engine-opt", f"hf_config={model}"),
        *_workload(args),
        *("--no-progress", "--no-report", "--no-telemetry", "--json", "--runs-dir", str(runs)),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"openai run failed ({out.returncode}): {out.stderr[-2000:]}")
    return _row(json.loads(out.stdout))


def run_engine(model: Path, runs: Path, args: argparse.Namespace) -> dict[str, float]:
    from perfscope.api.runner import RunOptions, execute_run
    from perfscope.profiler.driver import LoadConfig
    from perfscope.profiler.engines.base import Engine, EngineOptions, create_engine
    from perfscope.profiler.telemetry import TelemetryConfig
    from perfscope.profiler.workload import LengthDist, WorkloadConfig

    engines: list[Any] = []

    def factory(uri: str, options: EngineOptions) -> Engine:
        engines.append(create_engine(uri, options))
        return engines[-1]  # type: ignore[no-any-return]

    opts = RunOptions(
        engine=f"vllm:{model}",
        workload=WorkloadConfig(
            requests=args.requests,
            prompt_len=LengthDist("constant", 64),
            output_len=LengthDist("constant", 32),
            seed=0,
            warmup=4,
        ),
        load=LoadConfig(mode="online", concurrency=args.concurrency),
        engine_options=EngineOptions(
            batch_size=64, dtype="bfloat16", extra={"max_model_len": "512", "kv_cache_gib": "1"}
        ),
        runs_dir=runs,
        telemetry=TelemetryConfig(enabled=False),
    )
    out = execute_run(opts, engine_factory=factory)
    row = _row(dict(json.loads((out.path / "summary.json").read_text())))
    delays = sorted(engines[0].pipe_delays_ns)
    row["pipe_p50"] = delays[len(delays) // 2] * 1e-9
    row["pipe_p95"] = delays[int(0.95 * (len(delays) - 1))] * 1e-9
    row["pipe_max"] = delays[-1] * 1e-9
    row["steps"] = len(delays)
    steps = json.loads((out.path / "summary.json").read_text())["steps"]
    row["decode_step_mean"] = steps.get("decode", {}).get("mean_step_s", float("nan"))
    return row


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    wire = _wire_module()
    tmp = Path(tempfile.mkdtemp(prefix="perfscope-vllm-bench-"))
    http: list[dict[str, float]] = []
    local: list[dict[str, float]] = []
    # Interleaved (server, engine, server, engine, ...): a shared machine's load drifts.
    for _ in range(args.repeat):
        proc, port, model, _ = wire.start_vllm(tmp)
        try:
            run_openai(port, model, tmp / "warm", args)  # the server's first requests are slow
            http.append({**run_openai(port, model, tmp / "runs", args), "load": os.getloadavg()[0]})
        finally:
            wire._stop(proc)
        local.append({**run_engine(model, tmp / "runs", args), "load": os.getloadavg()[0]})
    print(f"{args.requests} requests, 64 prompt / 32 output tokens, concurrency {args.concurrency}")
    loads = ", ".join(f"{r['load']:.1f}" for r in (*http, *local))
    print(f"medians of {args.repeat} interleaved runs each (ms); 1-min load averages: {loads}")
    print("| engine | TTFT mean | TTFT p50 | TPOT mean | TPOT p50 | failed |")
    print("|---|---|---|---|---|---|")
    for name, rows in (("openai: → vllm serve", http), ("vllm: (worker)", local)):
        cells = [
            f"{_median(rows, k) * 1e3:.2f}"
            for k in ("ttft_mean", "ttft_p50", "tpot_mean", "tpot_p50")
        ]
        print(f"| {name} | {' | '.join(cells)} | {int(sum(r['failed'] for r in rows))} |")
    print(
        f"worker pipe delay per step event: p50 {_median(local, 'pipe_p50') * 1e6:.0f} us, "
        f"p95 {_median(local, 'pipe_p95') * 1e6:.0f} us, "
        f"max {max(r['pipe_max'] for r in local) * 1e6:.0f} us "
        f"over {int(_median(local, 'steps'))} steps; decode step mean "
        f"{_median(local, 'decode_step_mean') * 1e3:.2f} ms"
    )
    print(json.dumps({"http": http, "vllm": local}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
