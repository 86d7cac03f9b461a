"""Study: a smaller student (2 layers) trained on the same corpus vs the 4-layer teacher.

Run: `python samples/studies/distill.py` (about a minute) or `--smoke` (seconds).
`--quality-only --save` measures only each setting's quality on the trained model (no
speed run) and stores it in `results/distill/`, which the write-up's quality table renders.
The write-up with the measured table is `distill.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "layers",
        "4,2",
        doc=__doc__ or "",
        smoke_values="2,1",
        model_preset="tiny",
        requests=8,
        prompt_len=32,
        output_len=16,
        repeat=3,
        with_quality=True,
        weights="trained",
    )
