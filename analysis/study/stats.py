"""Between runs: the change of one metric from a study's first setting, and what it could detect.

:func:`between` judges one metric's per-run values (SI units: seconds, tokens/s, requests/s,
J/token) by the rule every comparison uses (:func:`perfscope.analysis.experiment.judge_metric`),
paired by round or not; :func:`detectable_cell` says as a table cell the smallest change the
rounds could detect; :data:`DEFAULT_PRIMARY` is the metric whose verdict leads when none is
named. ``_median`` is the median of a metric's finite per-run values (``None`` without any).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from perfscope.analysis.experiment import MIN_BLOCKS, SetChange, fewest_for_interval, judge_metric

__all__ = ["DEFAULT_PRIMARY", "between", "detectable_cell"]


#: The primary metric of a study's effects when none is named: its verdict leads, the
#: others are corrected for multiplicity (``docs/experiments.md``).
DEFAULT_PRIMARY = "tpot_p50_s"


def between(
    baseline: Sequence[float | None],
    candidate: Sequence[float | None],
    better: str | None,
    confidence: float = 0.95,
    *,
    paired: bool = False,
) -> SetChange:
    """The between-run change of one metric (per-run values, SI units), by the rule every
    comparison uses (:func:`perfscope.analysis.experiment.judge_metric`): paired by round
    when ``paired``, else unpaired."""
    if paired:
        return judge_metric(baseline, candidate, better, paired=True, confidence=confidence)
    a = [float(v) for v in baseline if v is not None and math.isfinite(float(v))]
    b = [float(v) for v in candidate if v is not None and math.isfinite(float(v))]
    return judge_metric(a, b, better, confidence=confidence)


def detectable_cell(change: SetChange, repeat: int) -> str:
    """The smallest change an effect's rounds could detect, as a table cell: ``±7%``;
    ``none (3 rounds; 6+ detect)`` when too few rounds detect any; ``noise unknown`` with
    one run per setting; ``n/a`` when a value is missing."""
    if change.ratio is None:
        return "n/a"
    if repeat < 2:
        return "noise unknown"
    if change.detectable is None:
        level = change.verdict_level
        need = (
            fewest_for_interval(level, paired=change.paired) if level is not None else None
        ) or MIN_BLOCKS
        return f"none ({min(change.n) or repeat} rounds; {need}+ detect)"
    return f"±{100 * change.detectable:.0f}%"


def _median(values: Sequence[float | None]) -> float | None:
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(xs) if xs else None
