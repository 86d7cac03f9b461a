"""Study: explicit-matmul attention vs torch scaled_dot_product_attention.

Run: `python samples/studies/attention.py` (about a minute) or `--smoke` (seconds).
The write-up with the measured table is `attention.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "attention",
        "explicit,sdpa",
        doc=__doc__ or "",
        smoke_values="explicit,sdpa",
        model_preset="small",
        requests=8,
        prompt_len=128,
        output_len=16,
        repeat=3,
    )
