"""Study: chunked prefill, unlimited vs 128 vs 32 tokens per step (``max_batched_tokens``).

Four users in a closed loop with prompts of 32 to 480 tokens and 24 output tokens: long
prompts keep arriving while other requests decode. Without a budget each prompt is one
prefill pass and every request decoding at that moment waits for it; with a budget each
step carries the running batch's decode tokens first and then chunks of pending prompts
(``mixed`` steps), so no step is longer than the budget allows.

Run: `python samples/studies/chunked_prefill.py` (a few minutes) or `--smoke` (seconds).
The write-up with the measured table is `chunked_prefill.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "max-batched-tokens",
        "unlimited,128,32",
        doc=__doc__ or "",
        smoke_values="unlimited,4",
        smoke={"prompt_len": 12, "concurrency": 2},
        model_preset="small",
        batch_size=4,
        concurrency=4,
        requests=16,
        prompt_len="uniform:32:480",
        output_len=24,
        repeat=3,
    )
