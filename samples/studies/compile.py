"""Study: torch.compile of each decoder block (kernel fusion), off vs on, with quality.

The engine compiles lazily: the first call of each new shape traces and generates kernels.
The warmup requests (as many as the measured ones, same shapes, all at once) take that cost,
so the measured phase runs compiled kernels only; the compile time is reported apart, as the
warmup phase's step time with compile on minus the same with compile off (per round).

Run: `python samples/studies/compile.py` (several minutes on 2 shared cores: inductor
compiles each shape in C++) or `--smoke` (seconds: the ``eager`` backend traces the blocks
with dynamo but generates no kernels). The write-up with the measured table is `compile.md`.
"""

import statistics
import sys

from _common import run_study

import perfscope
from perfscope.profiler.engines.reference.train import TrainConfig, trained_weights


def warmup_step_s(run_path: str) -> float:
    """Seconds of forward passes that served only warmup requests in one stored run."""
    run = perfscope.load_run(run_path)
    req = run.requests
    warm = set(req.loc[req["is_warmup"], "request_id"].tolist())
    total = 0.0
    for _, step in run.steps.iterrows():
        ids = list(step["request_ids"])
        if ids and all(i in warm for i in ids):
            total += (step["t_end"] - step["t_start"]) / 1e9
    return total


if __name__ == "__main__":
    extra = {}
    if "--smoke" not in sys.argv:
        extra["weights"] = str(trained_weights(TrainConfig()))
    s = run_study(
        "compile",
        "off,on",
        doc=__doc__ or "",
        smoke_values="off,on",
        model_preset="tiny",
        requests=8,
        warmup=8,
        batch_size=8,
        prompt_len=32,
        output_len=16,
        repeat=6,
        threads=1,
        with_quality=True,
        smoke={"warmup": 2, "batch_size": 2, "compile_backend": "eager"},
        **extra,
    )
    per = {st.value: [warmup_step_s(r.run) for r in st.runs] for st in s.settings}
    print("\n| compile | warmup-phase forward time per run, s | mean s |\n|---|---|---|")
    for value, xs in per.items():
        print(f"| {value} | {', '.join(f'{x:.2f}' for x in xs)} | {statistics.mean(xs):.2f} |")
    extra_s = statistics.mean(per["on"]) - statistics.mean(per["off"])
    print(f"\n- compile time (warmup phase, on - off): {extra_s:.1f} s per engine")
