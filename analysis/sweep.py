"""Sweep summaries: the throughput-latency curve of a series of runs, its knee, and
``max_goodput_rate`` (DistServe's goodput: the highest offered rate whose SLO attainment is
at least 90 %).

Input: one summary per point (typed, or its summary.json form) and the load each point
offered (a rate in requests/s or a closed-loop concurrency).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from perfscope.analysis.catalogue import metric, value_at

__all__ = ["ATTAINMENT_TARGET", "SWEEP_SCHEMA", "find_knee", "summarize_sweep", "sweep_point"]

SWEEP_SCHEMA = "perfscope.sweep/1"
#: SLO attainment a point needs to count for ``max_goodput_rate`` (DistServe uses 90 %).
ATTAINMENT_TARGET = 0.9


#: Sweep point column → the catalogue metric it reads.
POINT_METRICS: dict[str, str] = {
    "completed": "counts.completed",
    "failed": "counts.failed",
    "req_s": "req_s",
    "output_tok_s": "output_tok_s",
    "ttft_p50": "ttft.p50",
    "ttft_p99": "ttft.p99",
    "tpot_p50": "tpot.p50",
    "tpot_p99": "tpot.p99",
    "e2e_p50": "e2e.p50",
    "e2e_p99": "e2e.p99",
    "attainment": "attainment",
    "goodput_req_s": "goodput_req_s",
}


def sweep_point(offered: float, summary: Any, run: str | None = None) -> dict[str, Any]:
    """One row of the curve from a run's summary (typed or JSON form; latencies in s)."""
    return {
        "offered": offered,
        "run": run,
        "status": value_at(summary, "status"),
        **{col: metric(name).value(summary) for col, name in POINT_METRICS.items()},
    }


def find_knee(x: Sequence[float], y: Sequence[float], min_rise: float = 0.5) -> int | None:
    """Index of the knee of a rising latency curve ``y`` over load ``x`` (Kneedle).

    Both axes are scaled to [0, 1]; the knee is the point farthest below the chord from the
    first to the last point (for a curve that stays flat and then climbs: the last point
    before the climb). ``None`` when there are fewer than 3 points or latency rises by less
    than ``min_rise`` (50 %) over the sweep: no knee in the range tested.
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(xs) & np.isfinite(ys)
    idx = np.flatnonzero(ok)
    if idx.size < 3:
        return None
    xs, ys = xs[idx], ys[idx]
    order = np.argsort(xs, kind="stable")
    xs, ys, idx = xs[order], ys[order], idx[order]
    if ys[0] <= 0 or ys.max() < ys[0] * (1 + min_rise):
        return None
    xn = (xs - xs[0]) / (xs[-1] - xs[0]) if xs[-1] > xs[0] else np.zeros_like(xs)
    yn = (ys - ys.min()) / (ys.max() - ys.min())
    diff = xn - yn
    k = int(np.argmax(diff))
    if diff[k] <= 0:
        return None
    return int(idx[k])


def summarize_sweep(
    kind: str,
    points: Sequence[dict[str, Any]],
    slos: dict[str, float] | None = None,
    knee_metric: str = "e2e_p50",
) -> dict[str, Any]:
    """The sweep summary.

    Args:
        kind: ``rate`` (offered = requests/s) or ``concurrency``.
        points: rows from :func:`sweep_point`, any order.
        slos: the SLOs goodput was judged against (for the record).
        knee_metric: the latency column the knee is found on.
    """
    pts = sorted(points, key=lambda p: p["offered"])
    knee_i = find_knee(
        [p["offered"] for p in pts],
        [np.nan if p.get(knee_metric) is None else p[knee_metric] for p in pts],
    )
    passing = [
        p for p in pts if p.get("attainment") is not None and p["attainment"] >= ATTAINMENT_TARGET
    ]
    max_good = max((p["offered"] for p in passing), default=None) if slos else None
    first_fail = next(
        (
            p["offered"]
            for p in pts
            if slos and (p.get("attainment") is None or p["attainment"] < ATTAINMENT_TARGET)
        ),
        None,
    )
    best = max(
        (p for p in pts if p.get("req_s") is not None), key=lambda p: p["req_s"], default=None
    )
    key = "max_goodput_rate" if kind == "rate" else "max_goodput_concurrency"
    return {
        "schema": SWEEP_SCHEMA,
        "kind": kind,
        "slos": dict(slos or {}),
        "attainment_target": ATTAINMENT_TARGET,
        "points": pts,
        "knee": None if knee_i is None else {"metric": knee_metric, **pts[knee_i]},
        key: max_good,
        "first_failing": first_fail,
        "max_req_s": None if best is None else best["req_s"],
        "max_output_tok_s": max(
            (p["output_tok_s"] for p in pts if p.get("output_tok_s") is not None), default=None
        ),
    }
