"""Study: pruning attention heads of a trained model by importance (no fine-tuning), with quality.

Importance (stated in `perfscope.profiler.engines.reference.heads`): the mean L2 norm of what
each head adds to the residual stream (its attention output times its slice of the output
projection) over 32 synthetic-corpus sequences; the lowest-scoring heads of every layer go.
The model is the tiny preset with 4 KV heads (MHA, so a pruned head takes its K/V with it).

Run: `python samples/studies/prune_heads.py` (about two minutes the first time: the model
is trained and cached) or `--smoke` (seconds, random weights, GQA tiny: 2 heads removed,
one per KV group). The write-up with the measured table is `prune_heads.md`.
"""

import sys

from _common import run_study

from perfscope.profiler.engines.reference.train import TrainConfig, trained_weights

if __name__ == "__main__":
    extra = {}
    if "--smoke" not in sys.argv:
        extra["weights"] = str(trained_weights(TrainConfig(overrides=(("n_kv_heads", 4),))))
    run_study(
        "prune-heads",
        "0,1,2",
        doc=__doc__ or "",
        smoke_values="0,2",
        model_preset="tiny",
        model_overrides={"n_kv_heads": 4},
        requests=8,
        prompt_len=32,
        output_len=16,
        repeat=6,
        threads=1,
        with_quality=True,
        smoke={"model_overrides": None},
        **extra,
    )
