"""Study: MHA (8 KV heads) vs GQA (2) vs MQA (1) at 8 query heads.

Run: `python samples/studies/kv_heads.py` (about a minute) or `--smoke` (seconds).
The write-up with the measured table is `kv_heads.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "kv-heads",
        "8,2,1",
        doc=__doc__ or "",
        smoke_values="4,1",
        model_preset="small",
        requests=8,
        prompt_len=128,
        output_len=16,
        repeat=3,
    )
