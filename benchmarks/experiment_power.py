"""Measure perfscope's comparison rule on this machine: false alarms, power, order bias.

A scripted CPU engine does a fixed amount of work per token (a ``python:`` callable:
:func:`fixed_work_tokens`); a "run" streams a few requests through it and reduces the token
timestamps to per-run metrics (TPOT/TTFT/E2E percentiles, output tok/s) exactly as a run
summary does (median and percentiles over the run's requests). Runs are laid out in the
balanced blocks of :func:`perfscope.analysis.experiment.block_order` and judged by
:func:`perfscope.analysis.experiment.judge_experiment`, with the adaptive stopping rule of
``perfscope run --precision`` (at least 6 blocks; stop when the primary interval is within
the target; cap ``--max-repeats``). Runs are kept to milliseconds so that hundreds of
trials finish in minutes on a busy machine; what is measured is the decision rule on real,
noisy timings of this machine, not the CLI's per-run bookkeeping.

Measured (each with its wall time):

- family-wise false-alarm rate of A/A comparisons (any metric called better/worse);
- power for a 30% slower candidate at the default adaptive settings (``--precision 5%``,
  ``--max-repeats 20``) and for a 10% slower one at ``--precision 3%``;
- the mean A/A log ratio of the primary metric with balanced order (should be ~0).

Usage::

    python benchmarks/experiment_power.py [--trials 40] [--power-trials 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from perfscope.analysis.experiment import (
    MIN_BLOCKS,
    NO_CHANGE,
    WORSE,
    block_order,
    judge_experiment,
)

#: Metrics of one run: name -> better direction.
METRICS = {
    "tpot.p50": "lower",
    "tpot.p90": "lower",
    "tpot.p99": "lower",
    "ttft.p50": "lower",
    "ttft.p99": "lower",
    "e2e.p50": "lower",
    "e2e.p99": "lower",
    "output_tok_s": "higher",
}
PRIMARY = "tpot.p50"


def _spin(units: int) -> int:
    """Fixed CPU work: ``units`` rounds of integer arithmetic (no sleep, no I/O)."""
    x = 1
    for i in range(units):
        x = (x * 1103515245 + i) & 0xFFFFFFFF
    return x


def fixed_work_tokens(max_tokens: int, work: int = 400) -> Iterator[int]:
    """A ``python:`` engine: every token costs ``work`` units of CPU (prefill 4x that)."""
    _spin(4 * work)
    yield 1
    for _ in range(max_tokens - 1):
        _spin(work)
        yield 1


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def one_run(work: int, requests: int = 4, tokens: int = 8) -> dict[str, float]:
    """Stream ``requests`` requests through the engine; per-run metrics (seconds, tok/s)."""
    ttft, tpot, e2e = [], [], []
    t0 = time.perf_counter()
    for _ in range(requests):
        start = time.perf_counter()
        stamps = []
        for _tok in fixed_work_tokens(tokens, work):
            stamps.append(time.perf_counter())
        ttft.append(stamps[0] - start)
        tpot.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
        e2e.append(stamps[-1] - start)
    wall = time.perf_counter() - t0
    return {
        "tpot.p50": _pct(tpot, 50),
        "tpot.p90": _pct(tpot, 90),
        "tpot.p99": _pct(tpot, 99),
        "ttft.p50": _pct(ttft, 50),
        "ttft.p99": _pct(ttft, 99),
        "e2e.p50": _pct(e2e, 50),
        "e2e.p99": _pct(e2e, 99),
        "output_tok_s": requests * tokens / wall,
    }


@dataclass
class Trial:
    """One comparison: its blocks, the verdicts, the primary's estimate and interval."""

    blocks: int
    primary_verdict: str
    any_alarm: bool
    primary_log_ratio: float
    half_width: float | None
    flagged: list[str]


def trial(work_a: int, work_b: int, *, precision: float, max_blocks: int, seed: int) -> Trial:
    """One adaptive A/B experiment in balanced blocks."""
    order = block_order(2, max_blocks, seed)
    a: dict[str, list[float | None]] = {m: [] for m in METRICS}
    b: dict[str, list[float | None]] = {m: [] for m in METRICS}
    second: list[bool] = []
    exp = None
    for blk in range(max_blocks):
        for arm in order[blk]:
            vals = one_run(work_a if arm == 0 else work_b)
            for m in METRICS:
                (a if arm == 0 else b)[m].append(vals[m])
        second.append(order[blk][1] == 1)
        if blk + 1 < MIN_BLOCKS or (blk + 1) % 2:
            continue  # judge after whole AB/BA pairs only (as run --precision does)
        exp = judge_experiment(
            {m: (a[m], b[m], METRICS[m]) for m in METRICS},
            PRIMARY,
            paired=True,
            candidate_second=second,
        )
        ci = exp.lead.ci
        half = None if ci is None else math.exp((math.log(ci[1]) - math.log(ci[0])) / 2) - 1
        if half is not None and half <= precision:
            break
    assert exp is not None
    ci = exp.lead.ci
    half = None if ci is None else math.exp((math.log(ci[1]) - math.log(ci[0])) / 2) - 1
    return Trial(
        blocks=len(second),
        primary_verdict=exp.lead.verdict,
        any_alarm=any(c.verdict != NO_CHANGE for c in exp.changes),
        primary_log_ratio=math.log(exp.lead.ratio or 1.0),
        half_width=half,
        flagged=[c.metric for c in exp.changes if c.verdict != NO_CHANGE],
    )


def _calibrate(target_s: float = 0.002) -> int:
    """Work units per token so that one run takes about ``target_s``."""
    work = 200
    for _ in range(5):
        t0 = time.perf_counter()
        one_run(work)
        took = time.perf_counter() - t0
        work = max(20, int(work * target_s / max(took, 1e-6)))
    return work


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--trials", type=int, default=40, help="A/A trials (default 40)")
    ap.add_argument("--power-trials", type=int, default=20, help="trials per power case")
    ap.add_argument("--max-repeats", type=int, default=20, help="block cap (default 20)")
    ap.add_argument("--run-ms", type=float, default=2.0, help="target ms per run (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="offset of the block-order seeds")
    ap.add_argument("--only-aa", action="store_true", help="run the A/A case only")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    work = _calibrate(args.run_ms / 1000)
    load = os.getloadavg()
    out: dict[str, object] = {"work_units_per_token": work, "loadavg_start": load}

    def case(name: str, ratio: float, precision: float, n: int) -> list[Trial]:
        t0 = time.perf_counter()
        trials = [
            trial(
                work,
                round(work * ratio),
                precision=precision,
                max_blocks=args.max_repeats,
                seed=100_000 * args.seed + 1000 * len(name) + i,
            )
            for i in range(n)
        ]
        wall = time.perf_counter() - t0
        blocks = [t.blocks for t in trials]
        rec: dict[str, object] = {
            "trials": n,
            "ratio": ratio,
            "precision": precision,
            "wall_s": round(wall, 1),
            "blocks_median": statistics.median(blocks),
            "blocks_max": max(blocks),
            "capped": sum(b >= args.max_repeats for b in blocks),
            "primary_worse": sum(t.primary_verdict == WORSE for t in trials),
            "any_alarm": sum(t.any_alarm for t in trials),
            "mean_primary_log_ratio": statistics.fmean(t.primary_log_ratio for t in trials),
            "flagged_metrics": sorted({m for t in trials for m in t.flagged}),
            "trials_detail": [asdict(t) for t in trials],
        }
        out[name] = rec
        print(
            f"{name}: {n} trials in {wall:.0f}s; blocks median {rec['blocks_median']} "
            f"(max {rec['blocks_max']}, {rec['capped']} hit the cap); primary worse "
            f"{rec['primary_worse']}/{n}; any metric flagged {rec['any_alarm']}/{n}; mean "
            f"primary log ratio {rec['mean_primary_log_ratio']:+.4f}; flagged metrics "
            f"{rec['flagged_metrics']}",
            flush=True,
        )
        return trials

    case("aa", 1.0, 0.05, args.trials)
    if not args.only_aa:
        case("power_30pct", 1.3, 0.05, args.power_trials)
        case("power_10pct_precision_3pct", 1.1, 0.03, args.power_trials)
    out["loadavg_end"] = os.getloadavg()
    print(f"load average start {load}, end {out['loadavg_end']} (2-core VM)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
