"""The default ``perfscope run`` on a quiet CPU and under competing CPU hogs.

Runs the README's first command (``perfscope run``, the reference engine on its default
workload) as a fresh process, once on the machine as it is ("quiet") and once while
``--hogs`` busy-looping processes (default 2) compete for the CPUs, for each thread setting
given (default: ``auto`` — perfscope's rule — and ``spin``: one thread per CPU with OpenMP's
spinning wait policy, the behaviour before the rule). Reports output tok/s, wall seconds
and CPU seconds of each, and the busy/quiet slowdown:

    slowdown = tok/s quiet / tok/s under the hogs

The target is a slowdown within 3× for ``auto`` (a fair share of two CPUs against two hogs
alone explains 2×). ``--preset tiny --cold-cache --report`` times the README's first command
as a new user meets it (a fresh calibration cache, the HTML report written): the README's
figures come from this script.

    .venv/bin/python benchmarks/reference_contention.py [--requests 48] [--hogs 2] [--json]
        [--preset tiny] [--cold-cache] [--report]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from multiprocessing.synchronize import Event
from pathlib import Path


@dataclass(frozen=True)
class Measurement:
    """One default run: ``setting`` (auto|spin), ``hogs`` competing, its output tok/s,
    wall seconds, CPU seconds (user + system of the run's process) and the 1-minute load
    average when it started."""

    setting: str
    hogs: int
    tok_s: float
    wall_s: float
    cpu_s: float
    load_before: float


def _hog(stop: Event) -> None:
    """Burn one CPU until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        x += 1


def one_run(
    setting: str,
    hogs: int,
    requests: int,
    runs_dir: Path,
    *,
    preset: str | None = None,
    cold_cache: bool = False,
    report: bool = False,
) -> Measurement:
    """Run ``perfscope run`` once with ``hogs`` busy loops alongside; its tok/s and timings.

    ``preset``: ``--model-preset`` (default: the CLI's own); ``cold_cache``: a fresh, empty
    calibration cache, so the run calibrates the CPU as a first run does; ``report``: write
    the HTML report as a plain ``perfscope run`` does.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if cold_cache:
        env["PERFSCOPE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cache-", dir=runs_dir)
    cmd = [
        sys.executable,
        "-m",
        "perfscope",
        "run",
        "--requests",
        str(requests),
        "--runs-dir",
        str(runs_dir),
        "--no-progress",
        "--json",
    ]
    if not report:
        cmd.append("--no-report")
    if preset is not None:
        cmd += ["--model-preset", preset]
    if setting == "spin":
        env["OMP_WAIT_POLICY"] = "ACTIVE"
        cmd += ["--threads", str(len(os.sched_getaffinity(0)))]
    stop = mp.Event()
    procs = [mp.Process(target=_hog, args=(stop,), daemon=True) for _ in range(hogs)]
    for p in procs:
        p.start()
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out_b, err_b = proc.communicate()
        # The run is reaped, the hogs not yet: the children's CPU delta is the run's alone.
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        stop.set()
        for p in procs:
            p.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"perfscope run failed ({proc.returncode}): {err_b.decode()[-500:]}")
    out = out_b.decode()
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = json.loads(out)
    tok_s = float(summary["throughput"]["output_tok_s"])
    return Measurement(setting, hogs, tok_s, wall, cpu_s, load)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=48, help="requests per run (default 48)")
    ap.add_argument("--hogs", type=int, default=2, help="competing busy loops (default 2)")
    ap.add_argument(
        "--settings", default="auto,spin", help="comma-separated: auto, spin (default both)"
    )
    ap.add_argument("--preset", default=None, help="--model-preset of the runs (default small)")
    ap.add_argument(
        "--cold-cache", action="store_true", help="each run calibrates in an empty cache"
    )
    ap.add_argument("--report", action="store_true", help="write each run's HTML report")
    ap.add_argument("--json", action="store_true", help="print JSON lines")
    args = ap.parse_args()
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.settings.split(","):
            for hogs in (0, args.hogs):
                m = one_run(
                    setting,
                    hogs,
                    args.requests,
                    Path(tmp),
                    preset=args.preset,
                    cold_cache=args.cold_cache,
                    report=args.report,
                )
                results.append(m)
                if args.json:
                    print(json.dumps(asdict(m)))
                else:
                    print(
                        f"{m.setting:>5}  hogs={m.hogs}  {m.tok_s:8.1f} tok/s  "
                        f"{m.wall_s:6.1f} s wall  {m.cpu_s:6.1f} CPU-s  "
                        f"load before {m.load_before:.2f}",
                        flush=True,
                    )
    by = {(m.setting, m.hogs): m for m in results}
    for setting in args.settings.split(","):
        quiet, busy = by[(setting, 0)], by[(setting, args.hogs)]
        line = f"{setting}: slowdown under {args.hogs} hogs {quiet.tok_s / busy.tok_s:.1f}x"
        slow = {"setting": setting, "slowdown": quiet.tok_s / busy.tok_s}
        print(json.dumps(slow) if args.json else line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
