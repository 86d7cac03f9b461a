"""Study: request parallelism, 1 vs 2 replicas of the engine (``--engine-opt replicas=N``).

Four users in a closed loop, prompts of 64 tokens, 16 output tokens. One replica: one engine
process with one thread. Two replicas: two engine processes, one thread each, requests
dispatched to the one with the fewest in flight, so each decodes about half the batch. On
this 2-core machine that is the fair comparison against one replica with two threads, not
one thread: both use two cores (the threads study measures that other side).

Run: `python samples/studies/replicas.py` (a few minutes) or `--smoke` (seconds); `--save`
stores the study in samples/studies/results. The write-up is `replicas.md`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "replicas",
        "1,2",
        doc=__doc__ or "",
        smoke={"concurrency": 2},
        model_preset="small",
        batch_size=4,
        concurrency=4,
        requests=8,
        prompt_len=64,
        output_len=16,
        repeat=8,  # 6 rounds cannot give the secondaries (tested at 99%) an interval
        threads=1,
    )
