"""Sweep summaries: the throughput-latency curve of a series of runs, its knee, and
``max_goodput_rate`` (DistServe's goodput: the highest offered rate whose SLO attainment is
at least 90 %).

Input: one summary per point (typed, or its summary.json form) and the load each point
offered (a rate in requests/s or a closed-loop concurrency).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from perfscope.analysis._record import Record
from perfscope.analysis.catalogue import metric, value_at
from perfscope.jsontypes import JsonObject

__all__ = [
    "ATTAINMENT_TARGET",
    "SWEEP_SCHEMA",
    "SweepKnee",
    "SweepPoint",
    "SweepProbe",
    "SweepSummary",
    "find_knee",
    "summarize_sweep",
    "sweep_point",
]

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


@dataclass(frozen=True, kw_only=True)
class SweepPoint(Record):
    """One point of the curve: the load it ``offered`` (requests/s, or users for a
    concurrency sweep), its ``run`` directory and ``status``, and the columns of
    :data:`POINT_METRICS` read from its summary (counts; rates per second; latencies in
    seconds; ``attainment`` 0..1); ``None`` where the run has no value."""

    offered: float = 0.0
    run: str | None = None
    status: str | None = None
    completed: float | None = None
    failed: float | None = None
    req_s: float | None = None
    output_tok_s: float | None = None
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    tpot_p50: float | None = None
    tpot_p99: float | None = None
    e2e_p50: float | None = None
    e2e_p99: float | None = None
    attainment: float | None = None
    goodput_req_s: float | None = None

    def column(self, name: str) -> float | None:
        """The value of column ``name`` (a key of :data:`POINT_METRICS`, or ``offered``)."""
        value: float | None = getattr(self, name)
        return value


@dataclass(frozen=True, kw_only=True)
class SweepKnee(Record):
    """The knee: the latency column it was found on (``metric``) and its point. Its JSON
    form is the point's object with ``metric`` first."""

    metric: str = ""
    point: SweepPoint = field(default_factory=SweepPoint)

    def to_dict(self) -> JsonObject:
        return {"metric": self.metric, **self.point.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Self:
        rest = dict(data or {})
        return cls(metric=str(rest.pop("metric", "")), point=SweepPoint.from_dict(rest))


@dataclass(frozen=True, kw_only=True)
class SweepProbe(Record):
    """The saturation probe of an automatic rate sweep: its run and throughput (req/s)."""

    run: str = ""
    req_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class SweepSummary(Record):
    """A sweep (``<runs dir>/sweeps/<stamp>-<name>.json``, schema :data:`SWEEP_SCHEMA`).

    ``kind``: ``rate`` or ``concurrency``; ``slos`` the SLOs goodput was judged against (s);
    ``points`` in offered-load order; ``knee`` or ``None``; ``max_goodput_rate`` (a rate
    sweep) or ``max_goodput_concurrency`` (a concurrency sweep): the highest load whose SLO
    attainment reaches ``attainment_target`` (``None`` without SLOs or when none does), the
    other left out of the JSON; ``first_failing`` the first load below it; the highest
    achieved ``max_req_s`` and ``max_output_tok_s``; the ``probe`` (automatic rates), the
    ``engine`` and the file's ``path`` once written.
    """

    schema: str = SWEEP_SCHEMA
    kind: str = "rate"
    slos: dict[str, float] = field(default_factory=dict)
    attainment_target: float = ATTAINMENT_TARGET
    points: tuple[SweepPoint, ...] = ()
    knee: SweepKnee | None = None
    max_goodput_rate: float | None = None
    max_goodput_concurrency: float | None = None
    first_failing: float | None = None
    max_req_s: float | None = None
    max_output_tok_s: float | None = None
    probe: SweepProbe | None = None
    engine: str | None = None
    path: str | None = None

    def _omitted(self) -> frozenset[str]:
        return frozenset({"max_goodput_concurrency" if self.kind == "rate" else "max_goodput_rate"})

    @property
    def max_goodput(self) -> float | None:
        """``max_goodput_rate`` or ``max_goodput_concurrency``, whichever the kind has."""
        return self.max_goodput_rate if self.kind == "rate" else self.max_goodput_concurrency


def sweep_point(offered: float, summary: Any, run: str | None = None) -> SweepPoint:
    """One row of the curve from a run's summary (typed or JSON form; latencies in s)."""
    return SweepPoint.from_dict(
        {
            "offered": offered,
            "run": run,
            "status": value_at(summary, "status"),
            **{col: metric(name).value(summary) for col, name in POINT_METRICS.items()},
        }
    )


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
    points: Sequence[SweepPoint],
    slos: Mapping[str, float] | None = None,
    knee_metric: str = "e2e_p50",
) -> SweepSummary:
    """The sweep summary.

    Args:
        kind: ``rate`` (offered = requests/s) or ``concurrency``.
        points: rows from :func:`sweep_point`, any order.
        slos: the SLOs goodput was judged against (for the record).
        knee_metric: the latency column the knee is found on.
    """
    pts = sorted(points, key=lambda p: p.offered)
    knee_i = find_knee(
        [p.offered for p in pts],
        [np.nan if (v := p.column(knee_metric)) is None else v for p in pts],
    )

    def passes(p: SweepPoint) -> bool:
        return p.attainment is not None and p.attainment >= ATTAINMENT_TARGET

    max_good = max((p.offered for p in pts if passes(p)), default=None) if slos else None
    first_fail = next((p.offered for p in pts if slos and not passes(p)), None)
    rates = [p.req_s for p in pts if p.req_s is not None]
    tokens = [p.output_tok_s for p in pts if p.output_tok_s is not None]
    return SweepSummary(
        kind=kind,
        slos=dict(slos or {}),
        points=tuple(pts),
        knee=None if knee_i is None else SweepKnee(metric=knee_metric, point=pts[knee_i]),
        max_goodput_rate=max_good if kind == "rate" else None,
        max_goodput_concurrency=max_good if kind != "rate" else None,
        first_failing=first_fail,
        max_req_s=max(rates, default=None),
        max_output_tok_s=max(tokens, default=None),
    )
