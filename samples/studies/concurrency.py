"""Study: online closed loop with 1 vs 4 users (batch size 8).

Run: `python samples/studies/concurrency.py` (about a minute) or `--smoke` (seconds).
The write-up with the measured table is `concurrency.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "concurrency",
        "1,4",
        doc=__doc__ or "",
        smoke_values="1,2",
        model_preset="small",
        requests=8,
        prompt_len=64,
        output_len=16,
        repeat=3,
    )
