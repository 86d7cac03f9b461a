"""Study: pruning 4 -> 2 layers of a trained model (no fine-tuning), with quality.

Run: `python samples/studies/prune_layers.py` (about two minutes the first time: the
4-layer teacher is trained and cached) or `--smoke` (seconds, random weights).
`--quality-only --save` measures only each setting's quality on the trained model (no
speed run) and stores it in `results/prune_layers/`, which the write-up's quality table renders.
The write-up with the measured table is `prune_layers.md`.
"""

import sys

from _common import run_study

from perfscope.profiler.engines.reference.train import TrainConfig, trained_weights

if __name__ == "__main__":
    extra = {}
    if "--smoke" not in sys.argv:
        # The 4-layer teacher, trained once and cached; the 2-layer setting keeps its
        # first two layers (and the embeddings and head) without any fine-tuning.
        extra["weights"] = str(trained_weights(TrainConfig(overrides=(("n_layers", 4),))))
    run_study(
        "layers",
        "4,2",
        doc=__doc__ or "",
        smoke_values="2,1",
        model_preset="tiny",
        model_overrides={"n_layers": 4},
        requests=8,
        prompt_len=32,
        output_len=16,
        repeat=3,
        with_quality=True,
        smoke={"model_overrides": None},
        **extra,
    )
