"""Does ``perfscope noise`` predict what later comparisons can detect on this machine?

Runs ``perfscope noise`` once on a python: engine of known timing
(``tests/data/engines/timed_engines.py``: 50 ms to the first token, 10 ms per token), then
``--trials`` independent A/A comparisons of the same workload (``perfscope run ENGINE --vs
SAME --repeat N``, balanced blocks, paired), and prints, for the primary metric (TPOT
p50): the detectable change the noise command stated for ``N`` blocks next to the
detectable change each A/A comparison reported, whether any A/A comparison claimed a
change, and the wall time of each. Everything goes through the real CLI and run store
(in a temporary runs folder, removed at the end).

Usage::

    python benchmarks/noise_vs_aa.py [--blocks 8] [--trials 3] [--requests 4] [--json out.json]
    python benchmarks/noise_vs_aa.py --smoke      # 3 noise blocks, 1 trial of 6 blocks
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ROOT / "tests" / "data" / "engines"


def _cli(argv: list[str]) -> Any:
    from perfscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"perfscope {' '.join(argv[:2])} exited {code}: {err.getvalue()[-400:]}")
    return json.loads(out.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=8, help="blocks of the noise and of each A/A")
    ap.add_argument("--trials", type=int, default=3, help="independent A/A comparisons")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=6)
    ap.add_argument("--smoke", action="store_true", help="3 noise blocks, 1 trial of 6 blocks")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument(
        "--hw",
        default=None,
        help="analyse against this device (skips the CPU calibration a cold or contended "
        "cache runs in the first run)",
    )
    a = ap.parse_args()
    noise_blocks, trials, blocks = (3, 1, 6) if a.smoke else (a.blocks, a.trials, a.blocks)
    sys.path.insert(0, str(ENGINES))
    work = ["--requests", str(a.requests), "--output-len", str(a.output_len)]
    work += ["--concurrency", "1", "--no-progress", "--json"]
    work += ["--hw", a.hw] if a.hw else []
    engine = "python:timed_engines:single_tokens"
    with tempfile.TemporaryDirectory(prefix="perfscope-noise-") as tmp:
        runs = ["--runs-dir", tmp]
        t0 = time.monotonic()
        rec = _cli(
            [
                *("noise", engine, *work, *runs, "--blocks", str(noise_blocks)),
                *("--at-blocks", str(blocks), "--detect", "10%", "--warmup-runs", "1"),
            ]
        )
        noise_wall = time.monotonic() - t0
        lead = rec["metrics"][0]
        out: dict[str, Any] = {
            "engine": engine,
            "noise": {
                "blocks": rec["blocks"],
                "wall_s": round(noise_wall, 1),
                "median_s": lead["median"],
                "spread": lead["spread"],
                "spread_ci": lead["spread_ci"],
                "detectable_at": blocks,
                "detectable": lead["detectable"],
                "blocks_for_10pct": lead["needs"],
                "aa_verdict": lead["aa"]["verdict"],
            },
            "aa": [],
        }
        for t in range(trials):
            t1 = time.monotonic()
            res = _cli(
                [
                    *("run", engine, "--vs", "python:timed_engines:same_tokens", *work, *runs),
                    *("--repeat", str(blocks), "--no-report", "--order-seed", str(100 + t)),
                ]
            )
            row = next(r for r in res["metrics"] if r.get("primary"))
            flagged = [r["label"] for r in res["metrics"] if r["change"][1] in ("better", "worse")]
            out["aa"].append(
                {
                    "wall_s": round(time.monotonic() - t1, 1),
                    "detectable": row["detectable"][1],
                    "ratio": row["ratios"][1],
                    "ci": row["ci"][1],
                    "flagged": flagged,
                }
            )
    dets = [x["detectable"] for x in out["aa"] if x["detectable"] is not None]
    n = out["noise"]
    pct = lambda x: "n/a" if x is None else f"±{100 * x:.1f}%"  # noqa: E731
    rng = lambda c: "[n/a]" if not c else f"[{c[0]:.3f}, {c[1]:.3f}]"  # noqa: E731
    print(
        f"noise: {n['blocks']} A/A blocks in {n['wall_s']} s; TPOT p50 {1e3 * n['median_s']:.2f} "
        f"ms; within-block spread {pct(n['spread'])} {rng(n['spread_ci'])}; stated detectable at "
        f"{blocks} blocks {pct(n['detectable'])}; blocks for ±10%: {n['blocks_for_10pct']}"
    )
    for i, x in enumerate(out["aa"]):
        print(
            f"A/A {i + 1}: {blocks} blocks in {x['wall_s']} s; ratio {x['ratio']:.3f} "
            f"{rng(x['ci'])}; detectable {pct(x['detectable'])}; flagged: {x['flagged'] or 'none'}"
        )
    if dets:
        print(
            f"A/A detectable: median {pct(statistics.median(dets))} (range {pct(min(dets))}–"
            f"{pct(max(dets))}) against the stated {pct(n['detectable'])}"
        )
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
