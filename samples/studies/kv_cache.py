"""Study: KV cache on vs off (every decode step recomputes the whole sequence).

Run: `python samples/studies/kv_cache.py` (about a minute) or `--smoke` (seconds).
The write-up with the measured table is `kv_cache.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "kv-cache",
        "on,off",
        doc=__doc__ or "",
        smoke_values="on,off",
        model_preset="small",
        requests=8,
        prompt_len=64,
        output_len=16,
        repeat=3,
    )
