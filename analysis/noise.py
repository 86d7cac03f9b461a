"""This machine's run-to-run noise, measured from A/A blocks (``perfscope noise``).

An A/A experiment runs one configuration as two arms, A and A', in balanced blocks
(AB, BA, ... as :func:`~perfscope.analysis.experiment.block_order` lays them out). Each
block's log ratio ``d = log(A' / A)`` has the spread a paired comparison of two *different*
configurations would see on this machine with this engine and workload, position effect
included; so from it follow, before any real comparison runs, the smallest change
``n`` blocks could detect (:func:`~perfscope.analysis.experiment.detectable_change`) and the
blocks a change of interest needs (:func:`~perfscope.analysis.experiment.blocks_needed`),
both at the level ``perfscope compare`` tests its primary metric at. The A/A comparison
itself is judged too: it should read "no detectable change".

Pure: the runs are made by :mod:`perfscope.api.noise`; the record (:class:`NoiseRecord`,
schema ``perfscope.noise/1``) is stored under ``<runs dir>/noise/``. The method is in
``docs/experiments.md``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from perfscope.analysis.catalogue import Metric, find_metric
from perfscope.analysis.experiment import (
    DEFAULT_CONFIDENCE,
    PRIMARY_SHARE,
    SetChange,
    blocks_needed,
    detectable_change,
    judge_metric,
    outlier_indices,
    robust_sd,
    spread_interval,
)

__all__ = ["NOISE_METRICS", "SCHEMA", "MetricNoise", "NoiseRecord", "metric_noise", "read_noise"]

SCHEMA = "perfscope.noise/1"
#: Metrics whose noise is measured (catalogue names); the primary's default is the first of
#: them every run has, as for ``perfscope compare``.
NOISE_METRICS = ("tpot.p50", "tpot.p99", "ttft.p50", "ttft.p99", "e2e.p50", "output_tok_s")


@dataclass(frozen=True)
class MetricNoise:
    """The run-to-run noise of one metric over A/A blocks.

    Attributes:
        metric, label, path: the catalogue name, display label and summary path.
        median: median over every A/A run (SI units: seconds, tokens/s).
        blocks: blocks with a value in both arms.
        run_spread: robust SD (1.4826 · MAD) of the per-run log values, each arm about its
            own median: ≈ one run's relative deviation (0.03 = ±3%); ``None`` when unknown.
        spread: robust SD of the within-block log ratios, outlier blocks left out (the
            ``spread`` a paired comparison's :class:`SetChange` reports); ``None`` with
            fewer than 2 blocks.
        spread_ci: interval of ``spread`` at the record's confidence
            (:func:`~perfscope.analysis.experiment.spread_interval`).
        aa: the A/A comparison (A' against A), judged as ``compare`` judges a primary.
        detectable: the smallest change ``at_blocks`` blocks detect with probability
            ``power`` at level ``alpha`` (a log ratio ≈ a fraction); ``None`` when none.
        needs: blocks that detect a change of ``detect`` with that power (``None`` when
            the spread is unknown).
        outliers: A/A blocks left out as wild (named, not averaged).
    """

    metric: str
    label: str
    path: str
    median: float | None
    blocks: int
    run_spread: float | None
    spread: float | None
    spread_ci: tuple[float, float] | None
    aa: SetChange
    detectable: float | None
    needs: int | None
    outliers: tuple[str, ...] = ()

    def absolute(self, fraction: float | None) -> float | None:
        """A relative spread in the metric's own unit (``fraction · median``)."""
        if fraction is None or self.median is None:
            return None
        return fraction * abs(self.median)


@dataclass(frozen=True)
class NoiseRecord:
    """A finished noise measurement (schema ``perfscope.noise/1``).

    Attributes:
        id: the A/A experiment id; its runs are the run sets ``ID-A`` and ``ID-B``.
        engine, label: the engine URI and the runs' name.
        created_at: ISO time the measurement finished.
        blocks: A/A blocks run (each one run of A and one of A').
        seed: seed of the block order.
        runs: run ids of arm A, then of arm A'.
        primary: the primary metric (catalogue name).
        confidence: confidence of the intervals.
        alpha: the level detectable changes are stated at (``compare``'s primary level).
        power: probability of detecting a change of the stated size.
        at_blocks: blocks of the future comparison the detectable change is stated for.
        detect: the change of interest (fraction) the blocks needed are stated for.
        metrics: the primary first.
        wall_s: wall time of the whole measurement, warm-ups included (seconds).
        stop: why it stopped before the blocks asked for (``""`` when it did not).
        contended: runs measured while other processes took the CPU.
        failed: runs that did not complete (their blocks are left out).
        notes: what limits the figures.
        machine: the machine class of the first run (CPU, GPU, engine).
        path: where the record is stored.
    """

    id: str
    engine: str
    label: str
    created_at: str
    blocks: int
    seed: int
    runs: list[list[str]]
    primary: str
    confidence: float
    alpha: float
    power: float
    at_blocks: int
    detect: float
    metrics: list[MetricNoise]
    wall_s: float
    stop: str = ""
    contended: int = 0
    failed: int = 0
    notes: list[str] = field(default_factory=list)
    machine: dict[str, object] = field(default_factory=dict)
    path: str | None = None
    schema: str = SCHEMA

    @property
    def lead(self) -> MetricNoise:
        """The primary metric's noise."""
        return self.metrics[0]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> NoiseRecord:
        """Read back :meth:`to_dict`.

        Raises:
            ValueError: not a ``perfscope.noise/1`` record, or a field is missing or
                mistyped.
        """
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} record (schema {data.get('schema')!r})")
        try:
            return _from_dict(data)
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            raise ValueError(f"a malformed {SCHEMA} record ({type(exc).__name__}: {exc})") from None


def _pair(v: object) -> tuple[float, float] | None:
    if v is None:
        return None
    if not isinstance(v, list | tuple) or len(v) != 2:
        raise TypeError(f"expected a pair, got {v!r}")
    return float(v[0]), float(v[1])


def _opt(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]


def _from_dict(data: Mapping[str, object]) -> NoiseRecord:
    known = {f.name for f in fields(SetChange)}
    metrics = []
    raw_metrics = data["metrics"]
    assert isinstance(raw_metrics, list)
    for m in raw_metrics:
        aa = {k: v for k, v in dict(m["aa"]).items() if k in known}
        aa["ci"] = _pair(aa.get("ci"))
        aa["n"] = (int(aa["n"][0]), int(aa["n"][1]))
        aa["outliers"] = tuple(str(x) for x in aa.get("outliers") or ())
        metrics.append(
            MetricNoise(
                metric=str(m["metric"]),
                label=str(m["label"]),
                path=str(m["path"]),
                median=_opt(m["median"]),
                blocks=int(m["blocks"]),
                run_spread=_opt(m["run_spread"]),
                spread=_opt(m["spread"]),
                spread_ci=_pair(m["spread_ci"]),
                aa=SetChange(**aa),
                detectable=_opt(m["detectable"]),
                needs=None if m["needs"] is None else int(m["needs"]),
                outliers=tuple(str(x) for x in m.get("outliers") or ()),
            )
        )
    runs = data["runs"]
    assert isinstance(runs, list)
    notes = data.get("notes") or []
    machine = data.get("machine") or {}
    assert isinstance(notes, list) and isinstance(machine, dict)
    return NoiseRecord(
        id=str(data["id"]),
        engine=str(data["engine"]),
        label=str(data["label"]),
        created_at=str(data["created_at"]),
        blocks=int(data["blocks"]),  # type: ignore[call-overload]
        seed=int(data["seed"]),  # type: ignore[call-overload]
        runs=[[str(r) for r in g] for g in runs],
        primary=str(data["primary"]),
        confidence=float(data["confidence"]),  # type: ignore[arg-type]
        alpha=float(data["alpha"]),  # type: ignore[arg-type]
        power=float(data["power"]),  # type: ignore[arg-type]
        at_blocks=int(data["at_blocks"]),  # type: ignore[call-overload]
        detect=float(data["detect"]),  # type: ignore[arg-type]
        metrics=metrics,
        wall_s=float(data["wall_s"]),  # type: ignore[arg-type]
        stop=str(data.get("stop") or ""),
        contended=int(data.get("contended") or 0),  # type: ignore[call-overload]
        failed=int(data.get("failed") or 0),  # type: ignore[call-overload]
        notes=[str(n) for n in notes],
        machine=dict(machine),
        path=None if data.get("path") is None else str(data.get("path")),
    )


def read_noise(path: str | Path) -> NoiseRecord:
    """Read a stored noise record (``perfscope.noise/1``).

    Raises:
        OSError: the file cannot be read.
        ValueError: not JSON, or not a well-formed ``perfscope.noise/1`` record.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"not a {SCHEMA} record (a JSON {type(data).__name__})")
    return NoiseRecord.from_dict(data)


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def metric_noise(
    m: Metric | str,
    arm_a: Sequence[float | None],
    arm_b: Sequence[float | None],
    *,
    at_blocks: int,
    detect: float,
    power: float = 0.8,
    confidence: float = DEFAULT_CONFIDENCE,
    block_ids: Sequence[str] | None = None,
) -> MetricNoise:
    """The noise of one metric from its per-run values in the two arms of A/A blocks (the
    i-th values share block i; ``None`` where a run has no value).

    The detectable change and the blocks needed are stated at the level ``perfscope
    compare`` tests a primary metric at (:data:`PRIMARY_SHARE` · (1 − ``confidence``)),
    so they predict the ``detectable`` a comparison of ``at_blocks`` blocks will report.
    """
    if isinstance(m, str):
        found = find_metric(m)
        if found is None:
            raise ValueError(f"{m!r} is not a metric; e.g. tpot.p50, ttft.p99")
        m = found
    if len(arm_a) != len(arm_b):
        raise ValueError("A/A arms need one value per block on each side")
    level = PRIMARY_SHARE * (1 - confidence)
    aa = judge_metric(
        arm_a,
        arm_b,
        m.better,
        paired=True,
        confidence=confidence,
        alpha=level,
        ids=block_ids,
        metric=m.name,
        primary=True,
    )
    pairs = [
        (x, y)
        for x, y in zip(arm_a, arm_b, strict=True)
        if x is not None and y is not None and _finite(x) and _finite(y)
    ]
    values = [v for p in pairs for v in p]
    median = float(statistics.median(values)) if values else None
    run_spread = None
    if len(pairs) >= 2:
        la = [math.log(x) for x, _ in pairs]
        lb = [math.log(y) for _, y in pairs]
        ca, cb = statistics.median(la), statistics.median(lb)
        run_spread = robust_sd([v - ca for v in la] + [v - cb for v in lb])
    d = [math.log(y / x) for x, y in pairs]
    bad = set(outlier_indices(d, center=0.0))
    kept = [x for i, x in enumerate(d) if i not in bad]
    spread = aa.spread if aa.spread is not None and len(pairs) >= 2 else None
    ci = spread_interval(kept, confidence) if spread is not None else None
    det = (
        detectable_change(spread, at_blocks, confidence=1 - level, power=power)
        if spread is not None
        else None
    )
    need = (
        blocks_needed(spread, detect, confidence=1 - level, power=power)
        if spread is not None
        else None
    )
    return MetricNoise(
        metric=m.name,
        label=m.label,
        path=m.path,
        median=median,
        blocks=len(pairs),
        run_spread=run_spread,
        spread=spread,
        spread_ci=ci,
        aa=aa,
        detectable=det,
        needs=need,
        outliers=aa.outliers,
    )
