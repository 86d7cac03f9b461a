"""Study: fp32 vs bf16 weights, activations and KV cache on CPU.

Run: `python samples/studies/dtype.py` (about a minute) or `--smoke` (seconds).
The write-up with the measured table is `dtype.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "dtype",
        "float32,bfloat16",
        doc=__doc__ or "",
        smoke_values="float32,bfloat16",
        model_preset="small",
        requests=8,
        prompt_len=64,
        output_len=16,
        repeat=3,
    )
