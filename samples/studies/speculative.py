"""Study: speculative decoding, a trained 1-layer draft proposing K tokens per step for the
trained 2-layer target (both fitted to the same synthetic corpus, so acceptance is real).

The prompts are held-out sequences of that corpus (16 tokens each), so the continuation is
what both models learned to predict. Run: `python samples/studies/speculative.py` (a few
minutes) or `--smoke` (seconds, random weights: acceptance near zero). The write-up with the
measured table is `speculative.md`.
"""

import json
import sys
import tempfile
from pathlib import Path

from _common import run_study

from perfscope.profiler.engines.reference.train import corpus


def corpus_prompts(n: int, length: int) -> str:
    """A JSONL prompts file of ``n`` held-out corpus sequences of ``length`` tokens."""
    rows = corpus(n, length, alphabet=48, seed=4242)
    path = Path(tempfile.mkdtemp(prefix="perfscope-spec-")) / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt_token_ids": r.tolist()}) + "\n" for r in rows))
    return str(path)


if __name__ == "__main__":
    smoke = "--smoke" in sys.argv
    s = run_study(
        "num-speculative-tokens",
        "0,1,2,4",
        doc=__doc__ or "",
        smoke_values="0,2",
        model_preset="tiny",
        prompts=corpus_prompts(4 if smoke else 20, 16),
        requests=16,
        prompt_len=16,
        output_len=32,
        batch_size=4,
        repeat=5,
        weights="trained",
        draft="tiny",
        draft_layers="1",
        threads="1",
    )
    print(
        "\n| K | acceptance rate | accepted / step | alpha | c (draft / plain step) "
        "| verify / plain step | projected before (alpha 0.7, c from the cost model) "
        "| projected after (measured alpha, c, verify) | after, with host time between passes "
        "| measured 1 / TPOT ratio | measured output tok/s ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for st in s.settings[1:]:
        sp = (st.projection or {}).get("speculative") or {}
        before, after = sp.get("before_run") or {}, sp.get("after_run") or {}
        measured = next((e.change.ratio for e in st.effects if e.metric == "output_tok_s"), None)
        tpot = next((e.change.ratio for e in st.effects if e.metric == "tpot_p50_s"), None)

        def f(v: object) -> str:
            return "–" if not isinstance(v, int | float) else f"{v:.3f}"

        print(
            f"| {st.value} | {f(after.get('acceptance_rate'))} "
            f"| {f(after.get('mean_accepted_per_step'))} | {f(after.get('alpha'))} "
            f"| {f(after.get('cost_ratio'))} | {f(after.get('verify_cost'))} "
            f"| {f(before.get('derated'))} (c = {f(before.get('cost_ratio_derated'))}) "
            f"| {f(after.get('speedup'))} | {f(after.get('speedup_with_host'))} "
            f"| {f(1 / tpot if tpot else None)} | {f(measured)} |"
        )
