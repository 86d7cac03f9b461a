"""Study: prefix caching off vs on, on a shared-prefix and on a multi-turn workload.

The reference engine's ``prefix_cache=on`` keeps the K/V of 16-token prompt blocks it has
computed (LRU-bounded) and prefills only the uncached suffix of a later prompt. Four users
in a closed loop send prompts that share a 256-token system prompt (then a 32-token
question), and, separately, three-turn conversations that resend their history.

Run: `python samples/studies/prefix_caching.py` (a few minutes) or `--smoke` (seconds).
The write-up with the measured table is `prefix_caching.md`.
"""

from _common import run_study

if __name__ == "__main__":
    common = {
        "doc": __doc__ or "",
        "smoke_values": "off,on",
        "model_preset": "small",
        "batch_size": 4,
        "concurrency": 4,
        "output_len": 16,
        "repeat": 3,
    }
    print("## Shared prefix (256-token system prompt + 32-token question)\n")
    run_study(
        "prefix-cache",
        "off,on",
        name="study-prefix-cache-shared",
        dataset="shared-prefix",
        prefix_len=256,
        prompt_len=32,
        requests=16,
        smoke={"prefix_len": 32, "requests": 4, "concurrency": 1},
        **common,
    )
    print("\n## Multi-turn (3 turns, each resends the history)\n")
    run_study(
        "prefix-cache",
        "off,on",
        name="study-prefix-cache-multiturn",
        dataset="multi-turn",
        turns=3,
        prompt_len=64,
        requests=18,
        smoke={"requests": 4, "concurrency": 2},
        **common,
    )
