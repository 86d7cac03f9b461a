"""Study: batch size (continuous batching, 1 vs 4 vs 8 sequences per decode step).

Run: `python samples/studies/batch_size.py` (about a minute) or `--smoke` (seconds).
The write-up with the measured table is `batch_size.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "batch-size",
        "1,4,8",
        doc=__doc__ or "",
        smoke_values="1,2",
        model_preset="small",
        requests=8,
        prompt_len=64,
        output_len=16,
        repeat=3,
    )
