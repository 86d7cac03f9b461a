"""Latency, throughput and goodput from the raw records (docs/architecture.md).

Everything is vectorised over pandas/numpy columns. Inputs are the run's tables with the
columns of ``profiler/records.py`` (times in ns); outputs are in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfscope.analysis.summary import (
    Counts,
    Distribution,
    ErrorCount,
    Goodput,
    Latency,
    Record,
    Throughput,
)

__all__ = [
    "PERCENTILES",
    "RunMetrics",
    "busy_seconds",
    "compute_metrics",
    "distribution",
    "itl_gaps",
    "per_request",
]

PERCENTILES = (50, 90, 95, 99)
_NS = 1e-9


def distribution(values: np.ndarray | pd.Series | list[float]) -> dict[str, float | int | None]:
    """count, mean, std, min, p50, p90, p95, p99, max of the finite values.

    ``std`` is the sample standard deviation (ddof=1; 0 for one value). Empty → count 0
    and every statistic ``None``.
    """
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return {
            "count": 0,
            "mean": None,
            "std": None,
            "min": None,
            **{f"p{p}": None for p in PERCENTILES},
            "max": None,
        }
    pct = np.percentile(arr, PERCENTILES)
    return {
        "count": int(arr.size),
        "mean": float(arr.mean()),
        "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
        "min": float(arr.min()),
        **{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)},
        "max": float(arr.max()),
    }


def per_request(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per request with ``ok``, ``ttft``, ``tpot``, ``e2e``, ``ntpot`` (seconds).

    ``ok`` = finished without error and produced at least one token. Metrics of requests
    that are not ok are NaN; ``tpot`` is NaN for single-token outputs.
    """
    r = requests
    ok = r["error"].isna() & r["t_first_token"].notna() & (r["output_tokens"] > 0)
    sent = r["t_sent"].astype("float64")
    first = r["t_first_token"].astype("float64")
    last = r["t_last_token"].astype("float64")
    n = r["output_tokens"].astype("float64")
    ttft = (first - sent) * _NS
    e2e = (last - sent) * _NS
    tpot = ((last - first) * _NS / (n - 1)).where(n > 1)
    out = pd.DataFrame(
        {
            "request_id": r["request_id"].to_numpy(),
            "is_warmup": r["is_warmup"].astype(bool).to_numpy(),
            "ok": ok.to_numpy(),
            "ttft": ttft.where(ok).to_numpy(),
            "tpot": tpot.where(ok).to_numpy(),
            "e2e": e2e.where(ok).to_numpy(),
            "ntpot": (e2e / n).where(ok & (n > 0)).to_numpy(),
            "output_tokens": n.to_numpy(),
            "prompt_tokens": r["prompt_tokens"].astype("float64").to_numpy(),
        }
    )
    return out


def itl_gaps(chunks: pd.DataFrame, request_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gaps between consecutive chunks of the given requests, pooled (seconds), and each
    gap divided by the later chunk's token count."""
    rid = chunks["request_id"].to_numpy(dtype=np.int64)
    keep = np.isin(rid, np.asarray(request_ids, dtype=np.int64))
    if not keep.any():
        return np.empty(0), np.empty(0)
    rid = rid[keep]
    t = chunks["t"].to_numpy(dtype=np.int64)[keep]
    ntok = chunks["n_tokens"].to_numpy(dtype=float)[keep]
    # By request, then time; chunks with the same timestamp in their streamed order, so the
    # result does not depend on the order of the rows.
    if "index" in chunks.columns:
        index = chunks["index"].to_numpy(dtype=np.int64)[keep]
        order = np.lexsort((index, t, rid))
    else:
        order = np.lexsort((t, rid))
    rid, t, ntok = rid[order], t[order], ntok[order]
    same = rid[1:] == rid[:-1]
    gaps = (t[1:] - t[:-1])[same] * _NS
    per_tok = gaps / np.maximum(ntok[1:][same], 1)
    return gaps, per_tok


def _union_length_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total length of the union of intervals [start, end)."""
    if starts.size == 0:
        return 0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    # A new disjoint block starts where the start exceeds every earlier end.
    new_block = np.empty(s.size, dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > run_end[:-1]
    block_id = np.cumsum(new_block) - 1
    block_start = s[new_block]
    block_end = np.zeros(block_start.size, dtype=np.int64)
    np.maximum.at(block_end, block_id, e)
    return int((block_end - block_start).sum())


def busy_seconds(requests: pd.DataFrame, steps: pd.DataFrame) -> tuple[float, str]:
    """Engine-busy time in seconds and how it was found.

    With step records: the union of forward-pass intervals (``steps``). Without (HTTP and
    callable engines): the union of [sent, last token] of the requests
    (``request_intervals``), which still contains server-side queueing.
    """
    if not steps.empty:
        ns = _union_length_ns(
            steps["t_start"].to_numpy(dtype=np.int64), steps["t_end"].to_numpy(dtype=np.int64)
        )
        return ns * _NS, "steps"
    r = requests.dropna(subset=["t_sent", "t_last_token"])
    ns = _union_length_ns(
        r["t_sent"].to_numpy(dtype=np.int64), r["t_last_token"].to_numpy(dtype=np.int64)
    )
    return ns * _NS, "request_intervals"


@dataclass(frozen=True, kw_only=True)
class RunMetrics(Record):
    """What :func:`compute_metrics` measures of a run: the summary's ``counts``,
    ``window_s`` (the measured window, s), ``latency``, ``throughput``, ``goodput``,
    ``driver_lag`` (send - scheduled, s) and ``errors`` (the ten most frequent)."""

    counts: Counts = field(default_factory=Counts)
    window_s: float = 0.0
    latency: Latency = field(default_factory=Latency)
    throughput: Throughput = field(default_factory=Throughput)
    goodput: Goodput = field(default_factory=Goodput)
    driver_lag: Distribution = field(default_factory=Distribution)
    errors: tuple[ErrorCount, ...] = ()


def compute_metrics(
    requests: pd.DataFrame,
    chunks: pd.DataFrame,
    steps: pd.DataFrame,
    slos: dict[str, float] | None = None,
    *,
    per_request_rows: pd.DataFrame | None = None,
) -> RunMetrics:
    """Counts, latency distributions, throughput, goodput and driver lag of a run.

    ``per_request_rows`` is :func:`per_request` of ``requests`` when the caller has it already.

    Warmup requests are left out of everything. The measured window runs from the first
    measured send to the last measured token. Steps are restricted to that window for
    the busy time.
    """
    slos = slos or {}
    pr = per_request(requests) if per_request_rows is None else per_request_rows
    measured_mask = ~pr["is_warmup"].to_numpy()
    m = pr[measured_mask]
    ok = m[m["ok"]]
    mreq = requests[measured_mask]

    sent = mreq["t_sent"].dropna()
    last = mreq["t_last_token"].dropna()
    if len(sent) and len(last):
        w_start, w_end = int(sent.min()), int(last.max())
        window_s = max(w_end - w_start, 0) * _NS
    else:
        w_start = w_end = 0
        window_s = 0.0

    gaps, gaps_tok = itl_gaps(chunks, ok["request_id"].to_numpy())
    out_tokens = float(ok["output_tokens"].sum())
    prompt_tokens = float(ok["prompt_tokens"].sum())

    def rate(x: float) -> float | None:
        return x / window_s if window_s > 0 else None

    win_steps = steps
    if not steps.empty and window_s > 0:
        win_steps = steps[(steps["t_end"] > w_start) & (steps["t_start"] < w_end)]
    busy_s, busy_source = busy_seconds(mreq, win_steps)

    n_failed = int((~m["ok"]).sum())
    n_total = len(m)
    good = pd.Series(m["ok"].to_numpy(), index=m.index)
    per_slo: dict[str, float | None] = {}
    for key, limit in slos.items():
        vals = m[key]
        # A single-token request has no TPOT; it cannot violate a TPOT SLO.
        met = m["ok"] & ((vals <= limit) | (vals.isna() & (key == "tpot")))
        per_slo[key] = float(met.sum() / n_total) if n_total else None
        good &= met
    n_good = int(good.sum())

    errors = (
        mreq["error"].dropna().value_counts().head(10) if "error" in mreq else pd.Series(dtype=int)
    )
    lag = (mreq["t_sent"] - mreq["t_scheduled"]).dropna().astype("float64") * _NS

    return RunMetrics(
        counts=Counts(
            requests=n_total,
            completed=len(ok),
            failed=n_failed,
            warmup=int((~measured_mask).sum()),
            output_tokens=int(out_tokens),
            prompt_tokens=int(prompt_tokens),
            # Completed requests the server cut short (finish_reason "length" before the
            # tokens asked for); they stay in every latency statistic (issue 20).
            truncated=int(mreq["truncated"].fillna(False).astype(bool).sum())
            if "truncated" in mreq
            else 0,
        ),
        window_s=window_s,
        latency=Latency(
            ttft=_distribution(ok["ttft"]),
            tpot=_distribution(ok["tpot"]),
            itl=_distribution(gaps),
            itl_per_token=_distribution(gaps_tok),
            e2e=_distribution(ok["e2e"]),
            ntpot=_distribution(ok["ntpot"]),
        ),
        throughput=Throughput(
            output_tok_s=rate(out_tokens),
            total_tok_s=rate(out_tokens + prompt_tokens),
            req_s=rate(float(len(ok))),
            busy_s=busy_s,
            busy_tok_s=out_tokens / busy_s if busy_s > 0 else None,
            busy_source=busy_source,
        ),
        goodput=Goodput(
            slos=dict(slos),
            good_requests=n_good,
            attainment=(n_good / n_total) if n_total else None,
            goodput_req_s=rate(float(n_good)),
            per_slo=per_slo,
        ),
        driver_lag=_distribution(lag),
        errors=tuple(ErrorCount(error=str(k), count=int(v)) for k, v in errors.items()),
    )


def _distribution(values: np.ndarray | pd.Series) -> Distribution:
    """:func:`distribution` as the summary's record."""
    return Distribution.from_dict(distribution(values))
