"""Study: parallel decoding on the trained tiny model: plain greedy decoding against lookahead
(Jacobi iteration with an n-gram pool), Medusa heads and a trained 1-layer draft model, each
proposing 4 tokens per step and verified by one target pass (outputs identical to plain).

The prompts are held-out sequences of the training corpus (16 tokens each). Run:
`python samples/studies/parallel_decoding.py` (a few minutes) or `--smoke` (seconds, random
weights, untrained heads). The write-up with the measured table is
`parallel_decoding.md`.
"""

import sys
from typing import Any

from _common import run_study
from speculative import corpus_prompts


def _f(v: object) -> str:
    return "–" if not isinstance(v, int | float) else f"{v:.3f}"


def _effect(st: Any, metric: str) -> str:
    e = next((e for e in st.effects if e.metric == metric), None)
    if e is None or e.change.ratio is None:
        return "–"
    err = "" if e.error is None else f", error {100 * e.error:+.0f}%"
    return (
        f"{e.change.ratio:.3f} {e.change.interval_text()} ({e.change.verdict}; "
        f"projected {_f(e.projected_ratio)}{err})"
    )


def table(s: Any) -> str:
    """Acceptance, tokens per step, the verify pass's cost (priced at the roofline and by the
    fitted cost model before the run, measured after) and the speed-up projected before the
    run (alpha 0.7 assumed) and after it (measured alpha, c and verify cost), next to the
    measured TPOT and throughput ratios."""
    lines = [
        "| decoding | acceptance rate | tokens / step | alpha | c "
        "| verify / plain step: roofline / fitted / measured "
        "| projected before (alpha 0.7): roofline / fitted | projected after (measured) "
        "| after, with host time "
        "| TPOT ratio, interval at the verdict's level | output tok/s ratio, the same |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for st in s.settings[1:]:
        sp = (st.projection or {}).get("speculative") or {}
        before, after = sp.get("before_run") or {}, sp.get("after_run") or {}
        acc = after.get("mean_accepted_per_step")
        lines.append(
            f"| {st.value} | {_f(after.get('acceptance_rate'))} "
            f"| {_f(None if acc is None else acc + 1)} | {_f(after.get('alpha'))} "
            f"| {_f(after.get('cost_ratio'))} | {_f(before.get('verify_cost_roofline'))} / "
            f"{_f(before.get('verify_cost_fitted'))} / {_f(after.get('verify_cost'))} "
            f"| {_f(before.get('sol'))} / {_f(before.get('fitted'))} "
            f"| {_f(after.get('speedup'))} | {_f(after.get('speedup_with_host'))} "
            f"| {_effect(st, 'tpot_p50_s')} | {_effect(st, 'output_tok_s')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    smoke = "--smoke" in sys.argv
    s = run_study(
        "decoding",
        "plain,lookahead,medusa,draft",
        doc=__doc__ or "",
        smoke_values="plain,lookahead,medusa",  # the draft's smoke is speculative.py's
        model_preset="tiny",
        prompts=corpus_prompts(4 if smoke else 20, 16),
        requests=16,
        prompt_len=16,
        output_len=32,
        batch_size=4,
        repeat=6,
        weights="trained",
        draft="tiny",
        draft_layers="1",
        num_speculative_tokens="4",
        lookahead_window="4",
        lookahead_ngram="2",
        medusa_heads="4",
        threads="1",
        with_quality=not smoke,
    )
    print()
    print(table(s))
