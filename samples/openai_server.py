"""Profile an OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, `transformers serve`).

Start a server, e.g. ``transformers serve MODEL_DIR --port 8000``, then either run the CLI:

    perfscope run openai:http://127.0.0.1:8000/v1 --model MODEL --rate 4 --requests 50 \\
        --prompt-len 128 --output-len 64 --slo ttft=500ms --slo tpot=100ms
    perfscope sweep openai:http://127.0.0.1:8000/v1 --model MODEL --rates auto \\
        --slo ttft=500ms --slo tpot=100ms

or this script (same thing from Python): ``python samples/openai_server.py URL MODEL``.
The API key, if the server needs one, comes from $OPENAI_API_KEY and is never stored.
"""

from __future__ import annotations

import sys

from perfscope._runner import RunOptions, execute_run
from perfscope.profiler.driver import LoadConfig
from perfscope.profiler.engines.base import EngineOptions
from perfscope.profiler.workload import LengthDist, WorkloadConfig


def main(url: str, model: str) -> None:
    out = execute_run(
        RunOptions(
            engine=f"openai:{url}",
            workload=WorkloadConfig(
                requests=50,
                prompt_len=LengthDist("constant", 128),
                output_len=LengthDist("constant", 64),
                dataset="synthetic",
            ),
            load=LoadConfig(mode="online", rate=4.0),
            engine_options=EngineOptions(extra={"model": model, "endpoint": "completions"}),
            slos={"ttft": 0.5, "tpot": 0.1},
        )
    )
    s = out.summary
    print(f"run {out.path} ({out.status})")
    lat, thr = s["latency"], s["throughput"]
    print(f"TTFT p50 {lat['ttft']['p50']:.3f} s, TPOT p50 {lat['tpot']['p50']:.4f} s")
    print(f"output {thr['output_tok_s']:.1f} tok/s, attainment {s['goodput']['attainment']:.0%}")


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1",
        sys.argv[2] if len(sys.argv) > 2 else "default",
    )
