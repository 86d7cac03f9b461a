"""Study: two cores used two ways, 1 replica x 2 threads against 2 replicas x 1 thread.

The replicas study (`replicas.py`) compares 2 one-thread replicas with 1 one-thread replica:
two cores against one. This one holds the cores fixed: setting ``1`` is one engine process
with two torch threads (``threads=2``), setting ``2`` is two engine processes of one thread
each (``replicas=2``, ``threads=1`` per process), on the replicas study's workload (small
preset, batch 4 per replica, 4 closed-loop users, prompts of 64 tokens, 16 output tokens).

OpenMP's threads wait passively (``OMP_WAIT_POLICY=PASSIVE``, set before torch loads, as the
command line sets it; the run manifests record it as ``omp_wait_policy``); the first two
records in ``results/replicas_threads/`` ran with OpenMP's default policy instead (threads
spin a while before they sleep), see the write-up.

`perfscope.study` varies one knob with the others fixed, and here two options change
together (replicas and threads per process), so this script runs the two settings itself
in the study's balanced order (`block_order`: ABBA rounds) and assembles the record with the
study's own `build_study`: the same paired effects, intervals, verdicts and the replicas
projection (one replica decoding half the batch, throughput x2) from the baseline's fitted
cost model. The record's values are the replica counts; which threads each used is in its
``args`` and notes. It is stored under ``results/replicas_threads/``, apart from the stored
studies `perfscope advisor calibrate` reads: its change, replicas 1 -> 2, would otherwise
replace the replicas study's entry, whose baseline has one thread.

Run from the repository root: `python samples/studies/replicas_threads.py` (about a minute
on an idle machine) or `--smoke` (seconds); `--save` stores the record. The write-up is
`replicas_threads.md`.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from perfscope.profiler.engines.threads import prefer_passive_wait

prefer_passive_wait()  # as `perfscope` on the command line: before torch loads, so the
# two threads of setting 1 sleep while they wait for each other instead of spinning

from _common import SMOKE, markdown, sample_args  # noqa: E402

import perfscope  # noqa: E402
from perfscope.analysis.experiment import block_order  # noqa: E402
from perfscope.analysis.overhead import fit_baseline  # noqa: E402
from perfscope.analysis.study import build_study  # noqa: E402
from perfscope.profiler.store import write_json_atomic  # noqa: E402

#: The fixed workload: the replicas study's.
WORKLOAD: dict[str, Any] = {
    "model_preset": "small",
    "batch_size": 4,
    "concurrency": 4,
    "requests": 8,
    "warmup": 2,
    "prompt_len": 64,
    "output_len": 16,
    "seed": 0,
    "telemetry": False,
}
#: Per setting (label = replica count): the engine options that differ.
SETTINGS: dict[str, dict[str, str]] = {
    "1": {"threads": "2"},
    "2": {"replicas": "2", "threads": "1"},
}
ROUNDS = 8  # even (whole ABBA pairs) and enough blocks for a 99% interval on secondaries


def main() -> Any:
    a = sample_args(
        __doc__ or "",
        smoke="a few seconds: tiny, 2 rounds",
        save_to="samples/studies/results/replicas_threads",
    )
    work = dict(WORKLOAD)
    rounds = ROUNDS
    if a.smoke:
        work.update({k: v for k, v in SMOKE.items() if k != "repeat"}, concurrency=2)
        rounds = 2
    runs_dir = a.runs_dir or tempfile.mkdtemp(prefix="perfscope-study-")
    labels = list(SETTINGS)
    runs: list[tuple[int, int, str, dict[str, Any]]] = []
    baseline_runs = []
    for rnd, order in enumerate(block_order(2, rounds, sum(map(ord, "replicas-threads")))):
        for i in order:
            # perfscope.run raises (naming the stored run) when the engine fails
            out = perfscope.run(
                "reference",
                runs_dir=runs_dir,
                name=f"study-replicas-threads-{labels[i]}",
                **work,
                **SETTINGS[labels[i]],
            )
            if out.status != "complete":
                raise SystemExit(f"the run of setting {labels[i]} ended {out.status}")
            summary = out.summary.to_dict()
            runs.append((rnd, i, str(out.path), summary))
            if i == 0:
                spec = (summary.get("hardware") or {}).get("spec")
                baseline_runs.append((out.steps, summary.get("model"), spec))
    fit, fit_note = fit_baseline(baseline_runs)
    batch = min(work["batch_size"], work["concurrency"], work["requests"])
    stamp = datetime.now(UTC)
    args = {
        "engine": "reference",
        **{k: v for k, v in work.items() if k != "telemetry"},
        "engine_options": {f"setting {t}": str(o) for t, o in SETTINGS.items()},
    }
    study = build_study(
        "replicas",
        labels,
        rounds,
        runs,
        batches=[batch, batch],
        prompt_len=int(work["prompt_len"]),
        output_len=int(work["output_len"]),
        args=args,
        created_at=stamp.isoformat(timespec="seconds"),
        fit=fit,
    )
    notes = [
        "replicas=1: one process, threads=2; replicas=2: two processes, threads=1 each "
        "(both settings use the 2 cores)",
        *study.notes,
        fit_note,
    ]
    path = Path(runs_dir) / "studies" / f"{stamp.strftime('%Y%m%d-%H%M%S')}-replicas-threads.json"
    study = replace(study, notes=notes, path=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, study.to_dict())
    print(markdown(study))
    if a.save is not None:
        print(f"- saved: `{perfscope.save_study(study, a.save)}`")
    return study


if __name__ == "__main__":
    main()
