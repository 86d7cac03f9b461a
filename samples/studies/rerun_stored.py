"""Re-run the studies behind the stored records (``results/*.json``) with adaptive rounds and
store each (``perfscope study ... --save``): what ``perfscope advisor calibrate`` and
``perfscope advisor table --all`` read.

Every study runs the tiny model with one intra-op thread (two threads wait for each other on a
loaded 2-core machine; the ``threads`` study measures that, with OpenMP threads waiting
passively as on the command line), interleaved rounds, at least 6
of them, then more until the primary metric's interval (TPOT p50, paired by round) is within
``--precision`` of every candidate, ``--max-repeats`` rounds or ``--budget`` seconds a study.

Run::

    python samples/studies/rerun_stored.py threads speculative ... [--precision 0.1]
        [--budget 300] [--runs-dir RUNS] [--save samples/studies/results]
    python samples/studies/rerun_stored.py --smoke threads     # seconds: 1 round, tiny

The settings are each write-up's, cut to the tiny model where the write-up used ``small``
(the knob's effect, not the model, is what the calibration checks).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from perfscope.profiler.engines.threads import prefer_passive_wait

# As `perfscope` on the command line, before torch loads: OpenMP threads that wait sleep
# instead of spinning on the cores their partners need (docs/performance.md).
prefer_passive_wait()

import perfscope  # noqa: E402

#: Fixed options every study shares (the stored 03:xx studies' workload).
COMMON: dict[str, Any] = {
    "model_preset": "tiny",
    "requests": 8,
    "prompt_len": 32,
    "output_len": 16,
    "warmup": 1,
    "batch_size": 8,
    "threads": 1,
}


def _spec_prompts(n: int, length: int) -> str:
    """A JSONL prompts file of ``n`` held-out corpus sequences (speculative.py's prompts)."""
    from perfscope.profiler.engines.reference.train import corpus

    rows = corpus(n, length, alphabet=48, seed=4242)
    path = Path(tempfile.mkdtemp(prefix="perfscope-spec-")) / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt_token_ids": r.tolist()}) + "\n" for r in rows))
    return str(path)


#: name → (knob, values, options over :data:`COMMON`).
STUDIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "batch-size": ("batch-size", "1,8", {}),
    "quant": ("quant", "none,int8,int8-wo", {}),
    "threads": ("threads", "1,2", {"threads": None}),
    "speculative": (
        "num-speculative-tokens",
        "0,2,4",
        {
            "requests": 16,
            "prompt_len": 16,
            "output_len": 32,
            "batch_size": 4,
            "weights": "trained",
            "draft": "tiny",
            "draft_layers": "1",
        },
    ),
    "kv-dtype": ("kv-dtype", "auto,int8,fp8", {"prompt_len": 128, "output_len": 32}),
    "dtype": ("dtype", "float32,bfloat16", {"prompt_len": 64}),
    "compile": ("compile", "off,on", {"warmup": 8}),
    "kv-paged": (
        "kv-paged",
        "off,on",
        {
            "requests": 24,
            "warmup": 2,
            "batch_size": 32,
            "prompt_len": "uniform:16:112",
            "max_seq_len": 512,
            "kv_budget_mb": 1.0,
            "kv_block_tokens": 16,
        },
    ),
    "prune-heads": ("prune-heads", "0,1,2", {"model_overrides": {"n_kv_heads": 4}}),
    "sparsity": ("sparsity", "none,unstructured:0.5,unstructured:0.9", {}),
    "chunked-prefill": (
        "max-batched-tokens",
        "unlimited,128,32",
        {
            "batch_size": 4,
            "concurrency": 4,
            "requests": 16,
            "prompt_len": "uniform:32:240",
            "output_len": 24,
        },
    ),
    "kv-cache": ("kv-cache", "on,off", {"prompt_len": 64}),
    "kv-heads": ("kv-heads", "4,1", {}),
    # prefix_caching.py's shared-prefix workload on the tiny model
    "prefix-cache": (
        "prefix-cache",
        "off,on",
        {
            "dataset": "shared-prefix",
            "prefix_len": 256,
            "prompt_len": 32,
            "requests": 16,
            "batch_size": 4,
            "concurrency": 4,
        },
    ),
    # prefix_caching.py's multi-turn workload on the tiny model: each turn resends its history
    "prefix-cache-multiturn": (
        "prefix-cache",
        "off,on",
        {
            "dataset": "multi-turn",
            "turns": 3,
            "prompt_len": 64,
            "requests": 18,
            "batch_size": 4,
            "concurrency": 4,
        },
    ),
    "scheduler": (
        "scheduler",
        "continuous,static",
        {"requests": 12, "batch_size": 4, "output_len": "uniform:4:28"},
    ),
    "attention": ("attention", "explicit,sdpa", {"prompt_len": 128}),
    "distill": ("layers", "4,2", {"weights": "trained"}),
    "layers": ("layers", "4,2", {}),
    "concurrency": ("concurrency", "1,4", {}),
    "rate": ("rate", "2,50", {}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("studies", nargs="+", choices=sorted(STUDIES))
    ap.add_argument("--smoke", action="store_true", help="1 round, 2 requests, random weights")
    ap.add_argument("--precision", type=float, default=0.1, help="target ± of TPOT (0.1)")
    ap.add_argument("--max-repeats", type=int, default=16)
    ap.add_argument("--budget", type=float, default=300.0, help="most seconds a study (300)")
    ap.add_argument("--runs-dir", type=Path, default=None)
    ap.add_argument("--save", type=Path, default=None, help="store the records here")
    a = ap.parse_args()
    runs_dir = a.runs_dir or Path(tempfile.mkdtemp(prefix="perfscope-studies-"))
    for name in a.studies:
        knob, values, extra = STUDIES[name]
        opts = {**COMMON, **extra}
        opts = {k: v for k, v in opts.items() if v is not None}
        if knob == "num-speculative-tokens":
            opts["prompts"] = _spec_prompts(4 if a.smoke else 20, 16)
        adaptive: dict[str, Any] = {
            "repeat": 6,
            "precision": a.precision,
            "max_repeats": a.max_repeats,
            "budget_s": a.budget,
        }
        if a.smoke:
            opts.update(requests=2, prompt_len=8, output_len=4, warmup=0)
            opts.pop("weights", None)
            adaptive = {"repeat": 1}
        s = perfscope.study(
            knob,
            values,
            runs_dir=runs_dir,
            telemetry=False,
            seed=0,
            name=f"study-{name}",
            log=print,
            **adaptive,
            **opts,
        )
        print("\n".join(f"note: {n}" for n in s.notes))
        print(f"study: {s.path}")
        if a.save is not None:
            target = perfscope.save_study(s, a.save)
            print(f"saved: {target}")


if __name__ == "__main__":
    main()
