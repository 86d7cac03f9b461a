"""Run comparison: key metrics side by side, ratios to a baseline, and bootstrap confidence
intervals for latency percentiles.

The point values are the runs' own summary numbers (never recomputed). For TTFT, TPOT, E2E
and normalised TPOT percentiles, the uncertainty comes from a percentile bootstrap over the
per-request values: each run's requests are resampled with replacement ``n_boot`` times, the
percentile is taken on every resample, and the ``confidence`` interval of the ratio
``candidate / baseline`` is read off the resampled ratios. An interval that excludes 1 is a
change beyond resampling noise at that confidence; one that contains 1 is reported as
``no significant change``. ITL percentiles pool many gaps per request, which are not
independent, so they get a ratio but no interval. Throughput, goodput and utilisation are one
number per run and get a ratio only (repeat runs are needed for their noise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfscope.analysis.catalogue import Metric, metric, to_float, value_at
from perfscope.analysis.metrics import itl_gaps, per_request

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_CONFIDENCE",
    "MetricDef",
    "bootstrap_percentile_ratio",
    "compare_runs",
    "comparison_metrics",
    "latency_samples",
]

DEFAULT_BOOTSTRAP = 1000
DEFAULT_CONFIDENCE = 0.95
#: Fewer measured requests than this in either run: no interval.
MIN_SAMPLES = 10
_BATCH_ELEMENTS = 2_000_000  # resampled values held in memory at once


@dataclass(frozen=True)
class MetricDef:
    """One compared metric: a catalogue :class:`~perfscope.analysis.catalogue.Metric` and,
    for latency percentiles, the per-request sample to bootstrap.

    Attributes:
        key: dotted path in the summary (``latency.ttft.p99``).
        label: display name (from the catalogue).
        unit: the catalogue unit kind (``seconds``, ``rate``, ``ratio``, ...).
        better: ``lower`` or ``higher``.
        sample: per-request sample to bootstrap (``ttft``, ``tpot``, ``e2e``, ``ntpot``), or
            ``None`` for ratio only.
        percentile: the percentile of ``sample`` the key holds.
        metric: the catalogue entry (name, format).
    """

    key: str
    label: str
    unit: str
    better: str
    sample: str | None = None
    percentile: float | None = None
    metric: Metric | None = None


#: Compared metrics (catalogue names), in order; latency percentiles of these samples get a
#: bootstrap interval (ITL pools dependent gaps: ratio only).
COMPARED = (
    *(f"{m}.p{p}" for m in ("ttft", "tpot", "itl", "e2e") for p in (50, 90, 99)),
    "output_tok_s",
    "total_tok_s",
    "req_s",
    "goodput_req_s",
    "attainment",
    "prefill.mfu",
    "prefill.mbu",
    "decode.mfu",
    "decode.mbu",
    "j_per_token",
)
_BOOTSTRAPPED = ("ttft", "tpot", "e2e")


def comparison_metrics() -> list[MetricDef]:
    """The metrics ``perfscope compare`` shows, in order (names, units, directions from the
    catalogue)."""
    out: list[MetricDef] = []
    for name in COMPARED:
        m = metric(name)
        head, _, stat = name.partition(".")
        boot = head in _BOOTSTRAPPED and stat.startswith("p")
        out.append(
            MetricDef(
                m.path,
                m.label,
                m.kind,
                m.better or "higher",
                head if boot else None,
                float(stat[1:]) if boot else None,
                m,
            )
        )
    return out


def latency_samples(
    requests: pd.DataFrame, chunks: pd.DataFrame, *, rows: pd.DataFrame | None = None
) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT, E2E, NTPOT and pooled ITL gaps (seconds) of the measured,
    completed requests (the same selection the summary's distributions use).

    Args:
        rows: the run's per-request rows (:func:`~perfscope.analysis.metrics.per_request`,
            or the dashboard's ``request_rows``) when the caller has them already; they are
            derived from ``requests`` otherwise.
    """
    keys = ("ttft", "tpot", "e2e", "ntpot", "itl")
    if requests.empty:
        return {k: np.empty(0) for k in keys}
    pr = per_request(requests) if rows is None else rows
    ok = pr[pr["ok"] & ~pr["is_warmup"]]
    out = {k: ok[k].to_numpy(dtype=float) for k in ("ttft", "tpot", "e2e", "ntpot")}
    gaps, _ = itl_gaps(chunks, ok["request_id"].to_numpy())
    out["itl"] = np.asarray(gaps, dtype=float)
    return {k: v[np.isfinite(v)] for k, v in out.items()}


def _boot_percentiles(
    values: np.ndarray, qs: Sequence[float], n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """``n_boot`` x ``len(qs)`` percentiles of resamples of ``values``."""
    n = values.size
    out = np.empty((n_boot, len(qs)))
    batch = max(1, min(n_boot, _BATCH_ELEMENTS // max(n, 1)))
    for start in range(0, n_boot, batch):
        stop = min(n_boot, start + batch)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = np.percentile(values[idx], qs, axis=1).T
    return out


def bootstrap_percentile_ratio(
    baseline: np.ndarray,
    candidate: np.ndarray,
    q: float,
    *,
    n_boot: int = DEFAULT_BOOTSTRAP,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Confidence interval of ``percentile(candidate, q) / percentile(baseline, q)``.

    Percentile bootstrap with independent resamples of each run. ``None`` when either
    sample has fewer than :data:`MIN_SAMPLES` values or a baseline percentile is zero.
    """
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(candidate, dtype=float)
    if a.size < MIN_SAMPLES or b.size < MIN_SAMPLES:
        return None
    rng = np.random.default_rng(seed)
    pa = _boot_percentiles(a, [q], n_boot, rng)[:, 0]
    pb = _boot_percentiles(b, [q], n_boot, rng)[:, 0]
    if np.any(pa <= 0):
        return None
    ratio = pb / pa
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(ratio, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def _change(ratio_ci: tuple[float, float] | None, better: str) -> str | None:
    if ratio_ci is None:
        return None
    lo, hi = ratio_ci
    if lo <= 1.0 <= hi:
        return "no significant change"
    higher = lo > 1.0
    good = higher if better == "higher" else not higher
    return "better" if good else "worse"


def compare_runs(
    labels: Sequence[str],
    summaries: Sequence[Any],
    samples: Sequence[dict[str, np.ndarray]] | None = None,
    *,
    n_boot: int = DEFAULT_BOOTSTRAP,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> dict[str, Any]:
    """Compare runs against the first one (the baseline). JSON-ready.

    Args:
        labels: one display name per run.
        summaries: the runs' summaries (typed, or their summary.json form).
        samples: per run, :func:`latency_samples`; ``None`` → no intervals.
        n_boot: bootstrap resamples per run and metric.
        confidence: two-sided confidence of the intervals (0-1).
        seed: seeds the resampling, so a comparison is reproducible.

    Returns:
        ``{"baseline", "labels", "confidence", "n_boot", "seed", "method", "metrics": [{"key",
        "label", "unit", "better", "values", "ratios", "ci", "change", "n"}]}``; ``ratios``,
        ``ci`` and ``change`` hold ``None`` for the baseline; ``ci`` is ``[lo, hi]`` of the
        ratio; ``change`` is ``better``, ``worse`` or ``no significant change`` (or ``None``
        without an interval); ``n`` the sample sizes the interval used.
    """
    if len(labels) != len(summaries) or len(summaries) < 2:
        raise ValueError("compare_runs needs two or more runs with one label each")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    rows: list[dict[str, Any]] = []
    boot_cache: dict[tuple[int, str], np.ndarray] = {}
    qs = [50.0, 90.0, 99.0]

    def boot(run: int, sample: str) -> np.ndarray | None:
        # All percentiles of one run's sample come from the same resamples; a fixed seed
        # per (run, sample) keeps the result independent of the metric order.
        assert samples is not None
        key = (run, sample)
        if key not in boot_cache:
            values = samples[run].get(sample, np.empty(0))
            if values.size < MIN_SAMPLES:
                return None
            rng = np.random.default_rng([seed, run, sum(map(ord, sample))])
            boot_cache[key] = _boot_percentiles(values, qs, n_boot, rng)
        return boot_cache[key]

    alpha = (1.0 - confidence) / 2.0
    for m in comparison_metrics():
        values = [to_float(value_at(s, m.key)) for s in summaries]
        if all(v is None for v in values):
            continue
        base = values[0]
        ratios: list[float | None] = [None]
        cis: list[list[float] | None] = [None]
        changes: list[str | None] = [None]
        ns: list[int | None] = [
            int(samples[i].get(m.sample, np.empty(0)).size) if samples and m.sample else None
            for i in range(len(summaries))
        ]
        for i in range(1, len(summaries)):
            v = values[i]
            ratios.append(v / base if v is not None and base else None)
            ci: tuple[float, float] | None = None
            if samples is not None and m.sample and m.percentile in qs:
                j = qs.index(float(m.percentile or 0))
                ba, bb = boot(0, m.sample), boot(i, m.sample)
                if ba is not None and bb is not None and np.all(ba[:, j] > 0):
                    r = bb[:, j] / ba[:, j]
                    lo, hi = np.quantile(r, [alpha, 1.0 - alpha])
                    ci = (float(lo), float(hi))
            cis.append([ci[0], ci[1]] if ci else None)
            changes.append(_change(ci, m.better))
        rows.append(
            {
                "key": m.key,
                "label": m.label,
                "unit": m.unit,
                "better": m.better,
                "values": values,
                "ratios": ratios,
                "ci": cis,
                "change": changes,
                "n": ns,
            }
        )
    return {
        "baseline": labels[0],
        "labels": list(labels),
        "confidence": confidence,
        "n_boot": n_boot,
        "seed": seed,
        "method": (
            "percentile bootstrap over per-request values, independent resamples per run; "
            "interval of the ratio run / baseline; ITL, throughput, goodput, MFU/MBU and "
            "energy: ratio only"
        ),
        "metrics": rows,
    }
