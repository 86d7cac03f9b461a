"""Run comparison with between-run statistics: is a change bigger than run-to-run noise?

A comparison is made between *run sets*: the same configuration run one or more times. Each
metric (a latency percentile, a throughput, MFU...) is one number per run, read from the
runs' own summaries (never recomputed). Whether two sets differ is decided from those
per-run numbers only:

- **Welch's t-test on log per-run values** (default, ``method="t"``): the ratio is the ratio
  of the sets' geometric means, and its ``confidence`` interval is
  ``exp(d ± t · se)`` with ``d`` the difference of mean logs, ``se`` from each set's sample
  variance and Welch's degrees of freedom (rounded down: conservative). Metrics that can be
  zero (goodput, attainment) use the raw values and the ratio of arithmetic means.
- **Bootstrap over runs** (``method="bootstrap"``): the runs of each set are resampled with
  replacement; the interval is read off the resampled ratios of geometric means. With few
  runs it is too narrow, so it needs :data:`MIN_BOOTSTRAP_RUNS` runs per set and otherwise
  falls back to the t interval (the result says so).

A change is ``better`` or ``worse`` only when its interval excludes 1; otherwise it is ``no
significant change``. A set of one run has no measured noise: the comparison shows the
ratio and says ``noise unknown`` -- never a significance claim. (Resampling the requests
of a single run measures the spread *within* that run, not the variation between runs
that decides whether a change is real; :func:`bootstrap_percentile_ratio` is kept for
that within-run question only.)

Every compared run's CPU contention (other processes' share of the machine while it was
measured) travels with the result, and a comparison involving a contended run says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfscope.analysis.catalogue import Metric, metric, to_float, value_at
from perfscope.analysis.metrics import itl_gaps, per_request

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_CONFIDENCE",
    "MIN_BOOTSTRAP_RUNS",
    "MetricDef",
    "SetChange",
    "between_run_change",
    "bootstrap_percentile_ratio",
    "compare_run_sets",
    "compare_runs",
    "comparison_metrics",
    "contention_of",
    "latency_samples",
    "t_quantile",
]

DEFAULT_BOOTSTRAP = 1000
DEFAULT_CONFIDENCE = 0.95
#: Fewer measured requests than this in either run: no within-run interval.
MIN_SAMPLES = 10
#: Fewer runs than this in a set: the bootstrap over runs falls back to the t interval.
MIN_BOOTSTRAP_RUNS = 8
#: Other processes' share of the machine's CPU above which a run counts as contended
#: (the same threshold as the run's own warning).
CONTENTION_SHARE = 0.15
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
#: Metrics that mean something only when the run set SLOs.
_SLO_JUDGED = ("goodput.goodput_req_s", "goodput.attainment")


def _has_slos(summary: Mapping[str, Any]) -> bool:
    return bool(value_at(summary, "goodput.slos"))


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


# --------------------------------------------------------------------------- t distribution


def _t_cdf_two_sided(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with integer ``df`` (closed forms of Abramowitz and
    Stegun 26.7.3 for odd and 26.7.4 for even ``df``)."""
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    if df == 1:
        return 2.0 * theta / math.pi
    if df % 2 == 1:
        term = math.cos(theta)
        acc = term
        for k in range(1, (df - 1) // 2):
            term *= cos2 * (2 * k) / (2 * k + 1)
            acc += term
        return 2.0 / math.pi * (theta + math.sin(theta) * acc)
    term, acc = 1.0, 1.0
    for k in range(1, df // 2):
        term *= cos2 * (2 * k - 1) / (2 * k)
        acc += term
    return math.sin(theta) * acc


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (``0.5 < p < 1``) of Student's t with ``df`` degrees of freedom,
    ``df`` rounded down to an integer of at least 1 (wider, so conservative, for Welch's
    fractional degrees of freedom)."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"quantile must be between 0.5 and 1, got {p}")
    k = max(1, math.floor(df))
    if k > 300:
        return statistics.NormalDist().inv_cdf(p)
    target = 2.0 * p - 1.0
    lo, hi = 0.0, 1.0
    while _t_cdf_two_sided(hi, k) < target:
        hi *= 2.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if _t_cdf_two_sided(mid, k) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------- between runs


@dataclass(frozen=True)
class SetChange:
    """How one metric moved from a baseline run set to a candidate run set.

    Attributes:
        ratio: candidate / baseline (ratio of geometric means; of arithmetic means for
            metrics that can be zero); ``None`` when not computable.
        ci: ``(lo, hi)`` interval of ``ratio`` at the confidence used; ``None`` without a
            noise estimate (a set of one run).
        noise: half-width of the noise band as a fraction of the baseline (0.05 = ±5%):
            how big a change must be to count; ``None`` when unknown.
        verdict: ``better``, ``worse``, ``no significant change``, ``noise unknown`` (single
            runs: ratio only) or ``n/a`` (a value is missing).
        n: runs with a value in the baseline and candidate sets.
        method: how the interval was made, in words.
    """

    ratio: float | None
    ci: tuple[float, float] | None
    noise: float | None
    verdict: str
    n: tuple[int, int]
    method: str

    @property
    def significant(self) -> bool | None:
        """True for better/worse, False for no significant change, None when unknown."""
        if self.verdict in ("better", "worse"):
            return True
        if self.verdict == "no significant change":
            return False
        return None


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _direction(ci: tuple[float, float], better: str | None) -> str:
    lo, hi = ci
    if lo <= 1.0 <= hi:
        return "no significant change"
    if better not in ("lower", "higher"):
        return "changed"
    up = lo > 1.0
    return "better" if up == (better == "higher") else "worse"


def between_run_change(
    baseline: Sequence[float | None],
    candidate: Sequence[float | None],
    better: str | None,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    method: str = "t",
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
) -> SetChange:
    """Judge one metric between two run sets from their per-run values.

    Args:
        baseline, candidate: one value per run (SI units); ``None`` entries are skipped.
        better: ``lower`` or ``higher`` (anything else: ``changed`` instead of a direction).
        confidence: two-sided confidence of the interval (0-1); the false-alarm rate on
            identical configurations is at most ``1 - confidence``.
        method: ``t`` (Welch on logs) or ``bootstrap`` (over runs; needs
            :data:`MIN_BOOTSTRAP_RUNS` per set, else the t interval is used).
        n_boot, seed: resamples and seed of the bootstrap.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    a, b = _finite(baseline), _finite(candidate)
    n = (len(a), len(b))
    if not a or not b:
        return SetChange(None, None, None, "n/a", n, "a value is missing")
    logs = all(v > 0 for v in a + b)
    if logs:
        la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
        ratio: float | None = math.exp(statistics.fmean(lb) - statistics.fmean(la))
    else:
        la, lb = a, b
        ma = statistics.fmean(a)
        ratio = statistics.fmean(b) / ma if ma else None
    if len(a) < 2 or len(b) < 2:
        return SetChange(
            ratio,
            None,
            None,
            "noise unknown",
            n,
            "single run: run-to-run noise unknown, ratio only (repeat runs to test it)",
        )
    alpha = 1.0 - confidence
    if method == "bootstrap" and min(n) >= MIN_BOOTSTRAP_RUNS and logs:
        rng = np.random.default_rng(seed)
        xa, xb = np.asarray(la), np.asarray(lb)
        ia = rng.integers(0, xa.size, size=(n_boot, xa.size))
        ib = rng.integers(0, xb.size, size=(n_boot, xb.size))
        d = xb[ib].mean(axis=1) - xa[ia].mean(axis=1)
        qlo, qhi = np.quantile(d, [alpha / 2, 1 - alpha / 2])
        ci = (math.exp(float(qlo)), math.exp(float(qhi)))
        noise = math.exp(float(qhi - qlo) / 2) - 1.0
        how = f"bootstrap over runs ({n_boot} resamples, seed {seed}) of the geometric-mean ratio"
        return SetChange(ratio, ci, noise, _direction(ci, better), n, how)
    va = statistics.variance(la) / len(la)
    vb = statistics.variance(lb) / len(lb)
    se = math.sqrt(va + vb)
    how = "Welch t-test on " + ("log per-run values" if logs else "per-run values")
    if method == "bootstrap":
        how += f" (bootstrap over runs needs {MIN_BOOTSTRAP_RUNS}+ runs per set)"
    if se == 0.0:
        # Every run of both sets gave the same value (e.g. 100% attainment): no noise.
        same = (ratio == 1.0) if ratio is not None else True
        ci0 = (ratio, ratio) if ratio is not None else (1.0, 1.0)
        verdict = "no significant change" if same else _direction(ci0, better)
        return SetChange(ratio, ci0, 0.0, verdict, n, how)
    df = (va + vb) ** 2 / (
        (va**2 / (len(la) - 1) if va else 0.0) + (vb**2 / (len(lb) - 1) if vb else 0.0)
    )
    half = t_quantile(1.0 - alpha / 2, df) * se
    d = statistics.fmean(lb) - statistics.fmean(la)
    if logs:
        ci = (math.exp(d - half), math.exp(d + half))
        noise = math.exp(half) - 1.0
    else:
        ma = statistics.fmean(a)
        if not ma:
            return SetChange(ratio, None, None, "n/a", n, how + "; baseline mean is zero")
        ci = (1.0 + (d - half) / ma, 1.0 + (d + half) / ma)
        noise = half / abs(ma)
    return SetChange(ratio, ci, noise, _direction(ci, better), n, how)


def contention_of(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The run's CPU contention record (``summary["contention"]``, else rebuilt from its
    warnings), with ``contended`` set when others took more than :data:`CONTENTION_SHARE`
    of the machine or the hypervisor stole that much. ``None`` when not recorded."""
    c = summary.get("contention")
    if isinstance(c, dict):
        out = dict(c)
        if "contended" not in out:
            share = out.get("others_share")
            steal = out.get("steal_share")
            out["contended"] = bool(
                (share is not None and share > CONTENTION_SHARE)
                or (steal is not None and steal > CONTENTION_SHARE)
            )
        return out
    warned = [w for w in summary.get("warnings") or [] if "CPU capacity" in str(w)]
    if warned:
        return {"contended": True, "note": str(warned[0])}
    return None


def _center(values: Sequence[float | None]) -> float | None:
    xs = _finite(values)
    if not xs:
        return None
    if all(v > 0 for v in xs):
        return math.exp(statistics.fmean(math.log(v) for v in xs))
    return statistics.fmean(xs)


def compare_run_sets(
    labels: Sequence[str],
    sets: Sequence[Sequence[dict[str, Any]]],
    *,
    run_ids: Sequence[Sequence[str]] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    method: str = "t",
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
) -> dict[str, Any]:
    """Compare run sets against the first one (the baseline). JSON-ready.

    Args:
        labels: one display name per set.
        sets: per set, the summaries of its runs (one or more).
        run_ids: per set, its runs' ids (default: each summary's ``run_id``).
        confidence, method, n_boot, seed: see :func:`between_run_change`.

    Returns:
        ``{"baseline", "labels", "runs", "confidence", "method", "n_boot", "seed",
        "noise_known", "contention", "notes", "metrics": [{"key", "label", "unit",
        "better", "values", "per_run", "ratios", "ci", "noise", "change", "n"}]}``.
        ``values`` holds each set's centre (geometric mean of its runs, arithmetic for
        metrics that can be zero); ``ratios``, ``ci``, ``noise`` and ``change`` hold
        ``None`` for the baseline; ``n`` the runs per set. ``contention`` lists, per set,
        the contended runs; ``notes`` says what limits the conclusions.
    """
    if len(labels) != len(sets) or len(sets) < 2:
        raise ValueError("compare_run_sets needs two or more run sets with one label each")
    if any(len(s) == 0 for s in sets):
        raise ValueError("every run set needs at least one run")
    if method not in ("t", "bootstrap"):
        raise ValueError(f"method must be 't' or 'bootstrap', got {method!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    ids = (
        [list(x) for x in run_ids]
        if run_ids is not None
        else [[str(s.get("run_id") or f"run {j}") for j, s in enumerate(g)] for g in sets]
    )
    rows: list[dict[str, Any]] = []
    methods: set[str] = set()
    # A run without SLOs counts every completed request as good (100% attainment): that
    # is no measurement, so its goodput and attainment are left out rather than compared.
    judged = [[_has_slos(s) for s in g] for g in sets]
    slo_less = sum(not j for g in judged for j in g)
    for m in comparison_metrics():
        per_run = [
            [
                to_float(value_at(s, m.key)) if ok or m.key not in _SLO_JUDGED else None
                for s, ok in zip(g, js, strict=True)
            ]
            for g, js in zip(sets, judged, strict=True)
        ]
        if all(v is None for g in per_run for v in g):
            continue
        changes: list[SetChange | None] = [None]
        for i in range(1, len(sets)):
            ch = between_run_change(
                per_run[0],
                per_run[i],
                m.better,
                confidence=confidence,
                method=method,
                n_boot=n_boot,
                seed=seed,
            )
            changes.append(ch)
            if ch.ci is not None:
                methods.add(ch.method)
        rows.append(
            {
                "key": m.key,
                "label": m.label,
                "unit": m.unit,
                "better": m.better,
                "values": [_center(g) for g in per_run],
                "per_run": per_run,
                "ratios": [None] + [c.ratio if c else None for c in changes[1:]],
                "ci": [None] + [list(c.ci) if c and c.ci else None for c in changes[1:]],
                "noise": [None] + [c.noise if c else None for c in changes[1:]],
                "change": [None] + [c.verdict if c else None for c in changes[1:]],
                "n": [len(_finite(g)) for g in per_run],
            }
        )
    contention: list[list[dict[str, Any]]] = []
    for g, gid in zip(sets, ids, strict=True):
        hits = []
        for s, rid in zip(g, gid, strict=True):
            c = contention_of(s)
            if c and c.get("contended"):
                hits.append({"run_id": rid, **c})
        contention.append(hits)
    noise_known = all(len(g) >= 2 for g in sets)
    notes: list[str] = []
    if slo_less:
        total = sum(len(g) for g in sets)
        notes.append(
            "goodput and SLO attainment: no SLOs set in "
            + ("any run" if slo_less == total else f"{slo_less} of {total} runs")
            + " (left out: without SLOs every completed request counts as good)"
        )
    if not noise_known:
        single = [lab for lab, g in zip(labels, sets, strict=True) if len(g) < 2]
        notes.append(
            f"run-to-run noise unknown ({', '.join(single)}: "
            f"{'a single run' if len(single) == 1 else 'single runs'}): ratios only, no "
            "better/worse claims; repeat each configuration (perfscope run --repeat N) and "
            "compare the run sets"
        )
    for lab, hits in zip(labels, contention, strict=True):
        if hits:
            shares = [
                f"{h['run_id']} ({h['others_share']:.0%} of the CPU)"
                if isinstance(h.get("others_share"), float)
                else str(h["run_id"])
                for h in hits
            ]
            who = "" if [h["run_id"] for h in hits] == [lab] else f"{lab}: "
            notes.append(
                f"{who}other processes competed for the CPU during {', '.join(shares)}; "
                "its timings are likely inflated and the comparison is unreliable"
            )
    return {
        "baseline": labels[0],
        "labels": list(labels),
        "runs": ids,
        "confidence": confidence,
        "method": "; ".join(sorted(methods))
        or "single runs: ratios only, run-to-run noise unknown",
        "n_boot": n_boot,
        "seed": seed,
        "noise_known": noise_known,
        "contention": contention,
        "notes": notes,
        "metrics": rows,
    }


def compare_runs(
    labels: Sequence[str],
    summaries: Sequence[dict[str, Any]],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict[str, Any]:
    """Compare single runs against the first: ratios only, run-to-run noise unknown (a
    :func:`compare_run_sets` of one-run sets)."""
    return compare_run_sets(labels, [[s] for s in summaries], confidence=confidence)
