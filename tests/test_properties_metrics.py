"""Property tests of the metric definitions (docs/architecture.md) on random runs (hypothesis).

Runs are drawn as the recorder writes them: each request is sent, streams chunks of 1-4
tokens at increasing times, and either completes, fails after some chunks, or is a warmup
request; ``t_first_token``/``t_last_token``/``output_tokens`` agree with its chunks.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfscope.analysis.metrics import PERCENTILES, compute_metrics, distribution, per_request
from perfscope.profiler.records import CHUNK_SCHEMA, REQUEST_SCHEMA, STEP_SCHEMA

SETTINGS = settings(max_examples=40, deadline=None)
MS = 1_000_000


@st.composite
def runs(draw: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    n = draw(st.integers(1, 10))
    reqs: list[dict[str, Any]] = []
    chunks: list[dict[str, Any]] = []
    for rid in range(n):
        sched = draw(st.integers(0, 50)) * MS
        sent = sched + draw(st.integers(0, 5)) * MS
        n_chunks = draw(st.integers(0, 6))
        t = sent + draw(st.integers(0, 40)) * MS
        produced = 0
        times = []
        for k in range(n_chunks):
            if k:
                t += draw(st.integers(0, 20)) * MS
            ntok = draw(st.integers(1, 4))
            chunks.append({"request_id": rid, "t": t, "n_tokens": ntok, "index": k})
            produced += ntok
            times.append(t)
        fate = draw(st.sampled_from(["ok", "ok", "ok", "failed", "warmup"]))
        failed = fate == "failed" or (n_chunks == 0 and draw(st.booleans()))
        reqs.append(
            {
                "request_id": rid,
                "prompt_tokens": draw(st.integers(1, 64)),
                "max_output_tokens": 64,
                "t_scheduled": sched,
                "t_sent": sent,
                "t_first_token": times[0] if times else None,
                "t_last_token": times[-1] if times and not failed else None,
                "output_tokens": produced,
                "error": "HTTP 500" if failed else None,
                "is_warmup": fate == "warmup",
            }
        )
    requests = pd.DataFrame(reqs).astype(
        {"t_first_token": "float64", "t_last_token": "float64", "error": "object"}
    )
    chunk_frame = pd.DataFrame(chunks, columns=CHUNK_SCHEMA.names).astype("int64")
    assert list(requests.columns) == REQUEST_SCHEMA.names
    return requests, chunk_frame


def _steps() -> pd.DataFrame:
    return STEP_SCHEMA.empty_table().to_pandas()


def _stat_order(d: Any) -> list[float]:
    return [d["min"], *(d[f"p{p}"] for p in PERCENTILES), d["max"]]


@given(runs())
@SETTINGS
def test_ttft_never_exceeds_e2e_and_latencies_are_not_negative(
    run: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    requests, _ = run
    pr = per_request(requests)
    both = pr.dropna(subset=["ttft", "e2e"])
    assert (both["ttft"] <= both["e2e"]).all()
    for col in ("ttft", "tpot", "e2e", "ntpot"):
        assert (pr[col].dropna() >= 0).all(), col


@given(runs())
@SETTINGS
def test_percentiles_are_monotone_in_every_distribution(
    run: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    requests, chunks = run
    m = compute_metrics(requests, chunks, _steps(), {"ttft": 0.02})
    for name, d in [*m.latency.metrics().items(), ("driver_lag", m.driver_lag)]:
        if d["count"] == 0:
            assert all(v is None for v in _stat_order(d)), name
            continue
        values = _stat_order(d)
        assert values == sorted(values), (name, values)
        assert d["min"] <= d["mean"] <= d["max"] or math.isclose(d["mean"], d["min"]), name
        assert d["std"] >= 0


@given(runs(), st.floats(0.001, 0.2), st.floats(0.001, 0.05))
@SETTINGS
def test_goodput_never_exceeds_throughput(
    run: tuple[pd.DataFrame, pd.DataFrame], ttft: float, tpot: float
) -> None:
    requests, chunks = run
    m = compute_metrics(requests, chunks, _steps(), {"ttft": ttft, "tpot": tpot})
    g, c, t = m["goodput"], m["counts"], m["throughput"]
    assert 0 <= g["good_requests"] <= c["completed"] <= c["requests"]
    assert c["completed"] + c["failed"] == c["requests"]
    if g["attainment"] is not None:
        assert 0.0 <= g["attainment"] <= 1.0
        for share in g["per_slo"].values():
            assert share is None or g["attainment"] <= share + 1e-12
    if t["req_s"] is not None:
        assert g["goodput_req_s"] <= t["req_s"] + 1e-12
    if t["busy_tok_s"] is not None and t["output_tok_s"] is not None:
        # Busy time is part of the window, so the busy rate is at least the window's rate.
        assert t["busy_s"] <= m["window_s"] + 1e-12
        assert t["busy_tok_s"] >= t["output_tok_s"] * (1 - 1e-12)


def _close(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _close(x, y)
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15)
    else:
        assert a == b


@given(runs(), st.randoms(use_true_random=False))
@SETTINGS
def test_metrics_do_not_depend_on_the_order_of_requests_or_chunks(
    run: tuple[pd.DataFrame, pd.DataFrame], rnd: Any
) -> None:
    requests, chunks = run
    slos = {"ttft": 0.02, "tpot": 0.01}
    want = compute_metrics(requests, chunks, _steps(), slos).to_dict()
    r_order = list(range(len(requests)))
    c_order = list(range(len(chunks)))
    rnd.shuffle(r_order)
    rnd.shuffle(c_order)
    got = compute_metrics(
        requests.iloc[r_order].reset_index(drop=True),
        chunks.iloc[c_order].reset_index(drop=True),
        _steps(),
        slos,
    ).to_dict()
    # Ties in the error ranking may list equal counts in another order.
    want["errors"] = sorted(want["errors"], key=lambda e: (e["count"], e["error"]))
    got["errors"] = sorted(got["errors"], key=lambda e: (e["count"], e["error"]))
    _close(want, got)


@given(
    st.lists(
        st.one_of(st.floats(-1e15, 1e15), st.sampled_from([math.nan, math.inf, -math.inf])),
        max_size=30,
    )
)
@SETTINGS
def test_distribution_of_any_values_is_ordered_and_finite(values: list[float]) -> None:
    d = distribution(values)
    finite = [v for v in values if math.isfinite(v)]
    assert d["count"] == len(finite)
    if finite:
        stats = _stat_order(d)
        assert all(math.isfinite(v) for v in stats)
        assert stats == sorted(stats)
        assert d["min"] == min(finite) and d["max"] == max(finite)
        assert np.isfinite(d["mean"])
