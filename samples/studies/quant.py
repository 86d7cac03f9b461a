"""Study: int8 quantisation (dynamic int8 matmuls; weight-only) of a trained tiny model.

Run: `python samples/studies/quant.py` (about a minute) or `--smoke` (seconds).
`--quality-only --save` measures only each setting's quality on the trained model (no
speed run) and stores it in `results/quant/`, which the write-up's quality table renders.
The write-up with the measured table is `quant.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "quant",
        "none,int8,int8-wo",
        doc=__doc__ or "",
        smoke_values="none,int8",
        model_preset="tiny",
        requests=8,
        prompt_len=32,
        output_len=16,
        repeat=3,
        with_quality=True,
        weights="trained",
    )
