"""Study: static vs continuous batching with uneven output lengths.

Run: `python samples/studies/scheduler.py` (about a minute) or `--smoke` (seconds).
The write-up with the measured table is `scheduler.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "scheduler",
        "continuous,static",
        doc=__doc__ or "",
        smoke_values="continuous,static",
        model_preset="small",
        requests=12,
        batch_size=4,
        prompt_len=32,
        output_len="uniform:4:28",
        repeat=3,
    )
