"""Study: torch.set_num_threads 2 vs 1 on a shared 2-core CPU.

Run: `python samples/studies/threads.py` (about a minute) or `--smoke` (seconds).
The write-up with the measured table is `threads.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "threads",
        "2,1",
        doc=__doc__ or "",
        smoke_values="2,1",
        model_preset="small",
        requests=8,
        prompt_len=64,
        output_len=16,
        repeat=3,
    )
