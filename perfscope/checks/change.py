"""Noise-aware change detection for scripts and tests: did a metric move between two sets
of runs by more than the run-to-run noise?

The statistics are :mod:`perfscope.analysis.experiment`'s (the rule ``perfscope compare``
uses; ``docs/experiments.md``): :func:`compare_samples` judges per-repeat values,
:func:`compare_runs` two Runs or RunSets, and :func:`assert_no_regression` fails only when
a metric got worse beyond both a tolerance and the noise. Each returns or lists
:class:`~perfscope.analysis.experiment.SetChange` records. :func:`confidence_bound` is the
one-sample Student-t bound that ``stat="bound"`` assertions use.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from perfscope.analysis.catalogue import better_of, format_change, format_metric, format_ratio
from perfscope.analysis.experiment import (
    NO_CHANGE,
    WORSE,
    SetChange,
    judge_metric,
    level_text,
    t_quantile,
)
from perfscope.api.runset import samples_of
from perfscope.checks.grammar import parse_tolerance
from perfscope.errors import PerfAssertionError, UsageError

__all__ = [
    "MIN_REPEATS",
    "SetChange",
    "assert_no_regression",
    "compare_runs",
    "compare_samples",
    "confidence_bound",
    "describe",
    "t_quantile",
]

#: Fewest repeats a side that can show a change at 95% between unpaired sets
#: (Mann–Whitney: 4 and 4 give p = 2/70).
MIN_REPEATS = 4


def confidence_bound(samples: Sequence[float], side: str, confidence: float) -> float:
    """The one-sided ``confidence`` bound (``upper`` or ``lower``) of the mean of
    ``samples``: ``mean ± t_{confidence, n-1} · sd / √n``."""
    if not 0.5 < confidence < 1:
        raise UsageError(f"confidence must be between 0.5 and 1, got {confidence}")
    n = len(samples)
    mean = statistics.fmean(samples)
    half = t_quantile(confidence, n - 1) * statistics.stdev(samples) / math.sqrt(n)
    return mean + half if side == "upper" else mean - half


def describe(c: SetChange) -> str:
    """One line: ``tpot.p50: 10 ms → 20 ms (+100% [1.9x, 2.1x]; tolerance 0%; changes
    under ±8% detectable): worse``."""
    before = format_metric(c.before, c.metric)
    after = format_metric(c.after, c.metric)
    ch = "n/a" if c.change is None else format_change(c.change)
    level = c.ci_level if c.ci_level is not None else c.verdict_level
    at = f" at {level_text(level)}" if level is not None else ""
    ci = f" [{c.ci[0]:.3g}x, {c.ci[1]:.3g}x]{at}" if c.ci else ""
    det = (
        f"changes under ±{format_ratio(c.detectable)} undetectable"
        if c.detectable is not None
        else "too few repeats to detect any change"
    )
    return (
        f"{c.metric}: {before} → {after} ({ch}{ci}; tolerance {format_ratio(c.tolerance)}; "
        f"{det}): {c.verdict}"
    )


def compare_samples(
    metric: str,
    before: Sequence[float],
    after: Sequence[float],
    *,
    tolerance: float = 0.0,
    confidence: float = 0.95,
    better: str | None = None,
    paired: bool = False,
) -> SetChange:
    """Judge the change of ``metric`` from ``before`` to ``after`` (per-repeat values).

    The change is :func:`~perfscope.analysis.experiment.judge_metric`'s (Mann–Whitney
    interval of log ratios; ``paired`` for values made in shared blocks); a significant
    change smaller than ``tolerance`` (relative) is ``no detectable change``. ``better``
    defaults to :func:`~perfscope.analysis.catalogue.better_of` the metric."""
    if not before or not after:
        raise UsageError(f"{metric}: nothing to compare (no values before or after)")
    better = better if better is not None else better_of(metric)
    c = judge_metric(
        list(before), list(after), better, paired=paired, confidence=confidence, metric=metric
    )
    c = replace(c, tolerance=tolerance)
    if c.significant and c.change is not None and abs(c.change) <= tolerance:
        c = replace(c, verdict=NO_CHANGE)
    return c


def compare_runs(
    before: Any,
    after: Any,
    metric: str,
    *,
    tolerance: str | float = "0%",
    confidence: float = 0.95,
) -> SetChange:
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
) -> list[SetChange]:
    """Fail only when a metric got worse by more than ``tolerance`` *and* by more than the
    noise measured across the repeats (both sides need :data:`MIN_REPEATS` repeats: fewer
    cannot show any change at 95% without assuming normal noise).

    The first metric named is primary, tested at 0.8 α; the others are Holm-corrected
    (``docs/experiments.md``), so the chance that identical sets fail is at most
    ``1 - confidence``.

    ::

        base = perfscope.run(engine_a, repeat=5)
        new = perfscope.run(engine_b, repeat=5)
        perfscope.assert_no_regression(base, new, "tpot.p50", "throughput.output_tok_s")
    """
    from perfscope.analysis.experiment import judge_experiment

    __tracebackhide__ = True
    if not metrics:
        raise UsageError("name the metrics to compare, e.g. 'ttft.p99'")
    tol = parse_tolerance(tolerance)
    fam: dict[str, tuple[Sequence[float | None], Sequence[float | None], str | None]] = {}
    for metric in metrics:
        b, a = samples_of(before, metric), samples_of(after, metric)
        if len(b) < MIN_REPEATS or len(a) < MIN_REPEATS:
            raise UsageError(
                f"{metric}: measuring noise needs at least {MIN_REPEATS} repeats on each side, "
                f"got {len(b)} and {len(a)}; run the workloads with repeat={MIN_REPEATS} or more"
            )
        fam[metric] = (b, a, better_of(metric))
    exp = judge_experiment(fam, metrics[0], confidence=confidence)
    changes = []
    for c in exp.changes:
        c = replace(c, tolerance=tol)
        if c.significant and c.change is not None and abs(c.change) <= tol:
            c = replace(c, verdict=NO_CHANGE)
        changes.append(c)
    bad = [c for c in changes if c.verdict == WORSE]
    if bad:
        lines = [f"perfscope: {len(bad)} of {len(changes)} metrics regressed beyond the noise"]
        lines += [f"  {describe(c)}" for c in changes]
        lines.append(f"  ({exp.correction})")
        raise PerfAssertionError("\n".join(lines))
    return changes
