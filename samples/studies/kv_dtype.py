"""Study: KV-cache storage dtype (fp32 as the model, int8 per-token scales, fp8 e4m3) of a
trained tiny model.

Run: `python samples/studies/kv_dtype.py` (about a minute) or `--smoke` (seconds).
`--quality-only --save` measures only each setting's quality on the trained model (no
speed run) and stores it in `results/kv_dtype/`, which the write-up's quality table renders.
The write-up with the measured table is `kv_dtype.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "kv-dtype",
        "auto,int8,fp8",
        doc=__doc__ or "",
        smoke_values="auto,int8",
        model_preset="tiny",
        requests=8,
        prompt_len=128,
        output_len=32,
        repeat=3,
        with_quality=True,
        weights="trained",
        threads=1,
    )
