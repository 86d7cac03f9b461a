"""Noise-aware change detection: did a metric move between two sets of runs by more than
the run-to-run noise measured from their repeats?

:func:`compare_samples` judges per-repeat values, :func:`compare_runs` two Runs or RunSets,
and :func:`assert_no_regression` fails only when a metric got worse beyond both a tolerance
and the noise. :func:`t_quantile` and :func:`confidence_bound` are the Student-t statistics
they (and ``stat="bound"`` assertions) use.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from perfscope.analysis.catalogue import better_of, format_change, format_metric, format_ratio
from perfscope.api.runset import samples_of
from perfscope.checks.grammar import parse_tolerance
from perfscope.errors import PerfAssertionError, UsageError

__all__ = [
    "Change",
    "assert_no_regression",
    "compare_runs",
    "compare_samples",
    "confidence_bound",
    "t_quantile",
]


def _t_cdf_abs(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)
        if df > 1:
            total = term
            for k in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
        return (2 / math.pi) * (theta + math.sin(theta) * total) if df > 1 else 2 * theta / math.pi
    total, term = 1.0, 1.0
    for k in range(1, (df - 2) // 2 + 1):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom
    (rounded down, at least 1: conservative for Welch's fractional df)."""
    if not 0.5 < p < 1:
        raise UsageError(f"confidence must be between 0.5 and 1, got {p}")
    k = max(1, math.floor(df))
    if k > 200:
        return statistics.NormalDist().inv_cdf(p)
    target = 2 * p - 1
    lo, hi = 0.0, 1.0
    while _t_cdf_abs(hi, k) < target:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if _t_cdf_abs(mid, k) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def confidence_bound(samples: Sequence[float], side: str, confidence: float) -> float:
    n = len(samples)
    mean = statistics.fmean(samples)
    half = t_quantile(confidence, n - 1) * statistics.stdev(samples) / math.sqrt(n)
    return mean + half if side == "upper" else mean - half


@dataclass
class Change:
    """How a metric moved between two sets of runs, judged against their noise.

    Attributes:
        metric: the metric name.
        before, after: medians over the repeats (SI units).
        change: relative change of the medians, ``(after - before) / |before|``.
        direction: ``lower``/``higher`` is better, or ``None``.
        tolerance: relative change allowed before it counts.
        noise: the relative half-width of the one-sided confidence interval of the
            difference of the medians (``None`` without two repeats on each side).
        significant: the difference of the medians exceeds that noise (``None`` if unknown).
        verdict: ``regressed``, ``improved``, ``unchanged``, ``within noise`` or ``changed``
            (a metric with no better direction).
    """

    metric: str
    before: float
    after: float
    change: float | None
    direction: str | None
    tolerance: float
    confidence: float
    noise: float | None
    significant: bool | None
    verdict: str
    before_samples: list[float] = field(default_factory=list)
    after_samples: list[float] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return self.verdict == "regressed"

    def describe(self) -> str:
        ch = "n/a" if self.change is None else format_change(self.change)
        noise = "noise unknown" if self.noise is None else f"noise ±{format_ratio(self.noise)}"
        before, after = (
            format_metric(self.before, self.metric),
            format_metric(self.after, self.metric),
        )
        return (
            f"{self.metric}: {before} → {after} "
            f"({ch}; tolerance {format_ratio(self.tolerance)}, {noise}): {self.verdict}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "before": self.before,
            "after": self.after,
            "change": self.change,
            "direction": self.direction,
            "tolerance": self.tolerance,
            "confidence": self.confidence,
            "noise": self.noise,
            "significant": self.significant,
            "verdict": self.verdict,
            "before_samples": self.before_samples,
            "after_samples": self.after_samples,
        }


def _median_variance(samples: Sequence[float]) -> float:
    """Variance of the median of ``samples`` from a robust spread: sigma = 1.4826 * MAD
    (the normal-consistent median absolute deviation), var(median) = pi/2 * sigma^2 / n.
    One stalled repeat barely moves it, where it would dominate the sample variance."""
    med = statistics.median(samples)
    sigma = 1.4826 * statistics.median([abs(x - med) for x in samples])
    return math.pi / 2 * sigma**2 / len(samples)


def compare_samples(
    metric: str,
    before: Sequence[float],
    after: Sequence[float],
    *,
    tolerance: float = 0.0,
    confidence: float = 0.95,
    better: str | None = None,
) -> Change:
    """Judge the change of ``metric`` from ``before`` to ``after`` (per-repeat values).

    A change counts when the medians differ by more than ``tolerance`` (relative) and,
    with two or more samples on each side, by more than the noise: the one-sided
    ``confidence`` bound of the difference of the medians, with each median's spread
    estimated robustly from the median absolute deviation (so one stalled repeat does not
    hide a real change) and Welch's degrees of freedom. ``better`` defaults to
    :func:`~perfscope.analysis.catalogue.better_of` the metric."""
    if not before or not after:
        raise UsageError(f"{metric}: nothing to compare (no values before or after)")
    better = better if better is not None else better_of(metric)
    b_med, a_med = float(statistics.median(before)), float(statistics.median(after))
    if b_med != 0:
        rel: float | None = (a_med - b_med) / abs(b_med)
    else:
        rel = 0.0 if a_med == 0 else None
    noise: float | None = None
    significant: bool | None = None
    if len(before) >= 2 and len(after) >= 2:
        vb, va = _median_variance(before), _median_variance(after)
        nb, na = len(before), len(after)
        se = math.sqrt(vb + va)
        if se > 0:
            df = (vb + va) ** 2 / (vb**2 / (nb - 1) + va**2 / (na - 1))
            half = t_quantile(confidence, df) * se
        else:
            half = 0.0
        significant = abs(a_med - b_med) > half
        noise = half / abs(b_med) if b_med else None
    beyond = (abs(rel) > tolerance) if rel is not None else (a_med != b_med)
    if not beyond:
        verdict = "unchanged"
    elif significant is False:
        verdict = "within noise"
    elif better is None:
        verdict = "changed"
    else:
        worse = (a_med > b_med) if better == "lower" else (a_med < b_med)
        verdict = "regressed" if worse else "improved"
    return Change(
        metric,
        b_med,
        a_med,
        rel,
        better,
        tolerance,
        confidence,
        noise,
        significant,
        verdict,
        list(before),
        list(after),
    )


def compare_runs(
    before: Any,
    after: Any,
    metric: str,
    *,
    tolerance: str | float = "0%",
    confidence: float = 0.95,
) -> Change:
    """:func:`compare_samples` on two Runs or RunSets."""
    return compare_samples(
        metric,
        samples_of(before, metric),
        samples_of(after, metric),
        tolerance=parse_tolerance(tolerance),
        confidence=confidence,
    )


def assert_no_regression(
    before: Any,
    after: Any,
    *metrics: str,
    tolerance: str | float = "0%",
    confidence: float = 0.95,
) -> list[Change]:
    """Fail only when a metric got worse by more than ``tolerance`` *and* by more than the
    noise measured across the repeats (both sides need ``repeat >= 2``).

    ::

        base = perfscope.run(engine_a, repeat=5)
        new = perfscope.run(engine_b, repeat=5)
        perfscope.assert_no_regression(base, new, "ttft.p99", "throughput.output_tok_s")
    """
    __tracebackhide__ = True
    if not metrics:
        raise UsageError("name the metrics to compare, e.g. 'ttft.p99'")
    changes: list[Change] = []
    for metric in metrics:
        b, a = samples_of(before, metric), samples_of(after, metric)
        if len(b) < 2 or len(a) < 2:
            raise UsageError(
                f"{metric}: measuring noise needs at least 2 repeats on each side, got "
                f"{len(b)} and {len(a)}; run the workloads with repeat=3 or more"
            )
        changes.append(
            compare_samples(
                metric, b, a, tolerance=parse_tolerance(tolerance), confidence=confidence
            )
        )
    bad = [c for c in changes if c.regressed]
    if bad:
        lines = [f"perfscope: {len(bad)} of {len(changes)} metrics regressed beyond the noise"]
        lines += [f"  {c.describe()}" for c in changes]
        raise PerfAssertionError("\n".join(lines))
    return changes
