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

import perfscope


def main(url: str, model: str, requests: int = 50) -> perfscope.Run:
    run = perfscope.run(
        f"openai:{url}",
        requests=requests,
        prompt_len=128,
        output_len=64,
        rate=4.0,  # requests per second, Poisson arrivals
        slos={"ttft": "500ms", "tpot": "100ms"},
        model=model,  # openai engine option, as --model
        endpoint="completions",
    )
    print(f"run {run.path} ({run.status})")
    print(f"TTFT p50 {run.ttft.p50:.3f} s, TPOT p50 {run.tpot.p50:.4f} s")
    thr, good = run.throughput.output_tok_s, run.goodput.attainment
    print(f"output {thr:.1f} tok/s, attainment {good:.0%}")
    return run


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1",
        sys.argv[2] if len(sys.argv) > 2 else "default",
    )
