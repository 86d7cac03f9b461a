"""Study: a paged KV cache (16-token blocks, a block table) against contiguous slots of
``max_seq_len`` positions, at a fixed KV memory budget, for two budgets.

The reference engine's contiguous cache reserves ``max_seq_len`` (512 here) positions per
sequence, so a budget of ``M`` bytes decodes at most ``M / (512 x 1024 B)`` sequences of the
tiny model together, however short they are; the paged cache admits a request when the free
blocks cover its prompt plus its output (``kv_budget_mb``, ``kv_paged=on``). Prompts are
16-112 tokens (uniform), outputs 16, batch arrivals of 24 requests, ``batch_size`` 32 (the
scheduler's cap).

Measured per budget: the largest decode batch reached (from the stored steps), TPOT and
throughput, against the capacity the block arithmetic projects.

Run: `python samples/studies/paged_kv.py` (a few minutes) or `--smoke` (seconds: one budget,
one run per setting); `--save` stores each budget's study in samples/studies/results (run
from the repository root). The write-up with the measured tables is `paged_kv.md`.
"""

import statistics
import tempfile

from _common import SMOKE, markdown, sample_args

import perfscope
from perfscope.profiler.engines.reference.model import PRESETS
from perfscope.profiler.engines.reference.paged import plan_paged

MAX_SEQ_LEN = 512
BLOCK = 16


def max_decode_batch(run_path: str) -> int:
    """The most sequences one decode step of a stored run carried."""
    steps = perfscope.load_run(run_path).steps
    dec = steps[steps["kind"] == "decode"]
    return int(dec["batch_size"].max()) if len(dec) else 0


if __name__ == "__main__":
    a = sample_args(__doc__ or "", smoke="a few seconds: 1 budget, 1 run each")
    opts = {
        "model_preset": "tiny",
        "requests": 24,
        "warmup": 2,
        "batch_size": 32,
        "prompt_len": "uniform:16:112",
        "output_len": 16,
        "repeat": 6,
        "threads": 1,
        "max_seq_len": MAX_SEQ_LEN,
    }
    budgets = [1.0, 4.0]
    if a.smoke:
        opts.update(SMOKE)
        budgets = [1.0]
    runs_dir = a.runs_dir or tempfile.mkdtemp(prefix="perfscope-study-")
    cfg = PRESETS["tiny"]
    rows = []
    for mb in budgets:
        s = perfscope.study(
            "kv-paged",
            "off,on",
            runs_dir=runs_dir,
            telemetry=False,
            seed=0,
            name=f"study-kv-paged-{mb:g}mb",
            kv_budget_mb=mb,
            kv_block_tokens=BLOCK,
            **opts,
        )
        print(f"\n### KV budget {mb:g} MB\n")
        print(markdown(s))
        if a.save is not None:
            print(f"- saved: `{perfscope.save_study(s, a.save)}`")
        plan = plan_paged(cfg, int(mb * 1e6), MAX_SEQ_LEN, BLOCK)
        for st in s.settings:
            batches = [max_decode_batch(r.run) for r in st.runs]
            rows.append((mb, st.value, plan, batches, st.median["output_tok_s"]))
    print(
        "\n| budget MB | kv-paged | projected capacity (sequences) | measured largest decode "
        "batch per run | output tok/s (median) |\n|---|---|---|---|---|"
    )
    mean_blocks = plan_paged(cfg, 1, MAX_SEQ_LEN, BLOCK).blocks_for(64 + 16)
    for mb, value, plan, batches, tok_s in rows:
        cap = (
            f"{plan.contiguous_slots} (budget / {MAX_SEQ_LEN} positions)"
            if value == "off"
            else f"~{plan.n_blocks // mean_blocks} ({plan.n_blocks} blocks / {mean_blocks} "
            "per mean request)"
        )
        print(
            f"| {mb:g} | {value} | {cap} | {', '.join(map(str, batches))} "
            f"(mean {statistics.mean(batches):.1f}) | {tok_s:.1f} |"
        )
