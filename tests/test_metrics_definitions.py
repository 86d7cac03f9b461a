"""Metric definitions (docs/architecture.md) checked on hand-built records."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from perfscope.analysis.metrics import compute_metrics, distribution
from perfscope.analysis.slo import parse_slos
from perfscope.errors import SLOError
from perfscope.profiler.records import CHUNK_SCHEMA, REQUEST_SCHEMA, STEP_SCHEMA

MS = 1_000_000  # ns


def _requests(rows: list[dict]) -> pd.DataFrame:
    base = {
        "prompt_tokens": 10,
        "max_output_tokens": 10,
        "t_scheduled": 0,
        "t_sent": 0,
        "t_first_token": None,
        "t_last_token": None,
        "output_tokens": 0,
        "error": None,
        "is_warmup": False,
    }
    df = pd.DataFrame([{**base, **r} for r in rows], columns=REQUEST_SCHEMA.names)
    for col in ("t_first_token", "t_last_token", "t_sent"):
        df[col] = df[col].astype("Int64")
    return df


def _chunks(rows: list[tuple[int, int, int]]) -> pd.DataFrame:
    out = []
    idx: dict[int, int] = {}
    for rid, t, n in rows:
        out.append({"request_id": rid, "t": t, "n_tokens": n, "index": idx.get(rid, 0)})
        idx[rid] = idx.get(rid, 0) + 1
    return pd.DataFrame(out, columns=CHUNK_SCHEMA.names)


NO_STEPS = pd.DataFrame(columns=STEP_SCHEMA.names)


def test_multi_token_chunks_give_tpot_from_token_counts_and_itl_per_chunk_and_per_token() -> None:
    # Request 0: sent at 0, chunks at 100 ms (1 token), 130 ms (3 tokens), 190 ms (3 tokens).
    reqs = _requests(
        [{"request_id": 0, "t_first_token": 100 * MS, "t_last_token": 190 * MS, "output_tokens": 7}]
    )
    chunks = _chunks([(0, 100 * MS, 1), (0, 130 * MS, 3), (0, 190 * MS, 3)])
    m = compute_metrics(reqs, chunks, NO_STEPS)
    lat = m["latency"]
    assert lat["ttft"]["p50"] == pytest.approx(0.100)
    assert lat["tpot"]["p50"] == pytest.approx(0.090 / 6)
    assert lat["e2e"]["p50"] == pytest.approx(0.190)
    assert lat["ntpot"]["p50"] == pytest.approx(0.190 / 7)
    assert lat["itl"]["count"] == 2
    assert lat["itl"]["min"] == pytest.approx(0.030)
    assert lat["itl"]["max"] == pytest.approx(0.060)
    assert lat["itl_per_token"]["min"] == pytest.approx(0.010)
    assert lat["itl_per_token"]["max"] == pytest.approx(0.020)


def test_itl_is_pooled_over_requests_not_averaged_per_request() -> None:
    # Request 0 has 3 gaps of 10 ms, request 1 has 1 gap of 50 ms: pooled mean = 20 ms.
    reqs = _requests(
        [
            {
                "request_id": 0,
                "t_first_token": 10 * MS,
                "t_last_token": 40 * MS,
                "output_tokens": 4,
            },
            {
                "request_id": 1,
                "t_first_token": 10 * MS,
                "t_last_token": 60 * MS,
                "output_tokens": 2,
            },
        ]
    )
    chunks = _chunks(
        [
            (0, 10 * MS, 1),
            (0, 20 * MS, 1),
            (0, 30 * MS, 1),
            (0, 40 * MS, 1),
            (1, 10 * MS, 1),
            (1, 60 * MS, 1),
        ]
    )
    m = compute_metrics(reqs, chunks, NO_STEPS)
    assert m["latency"]["itl"]["count"] == 4
    assert m["latency"]["itl"]["mean"] == pytest.approx(0.020)
    # TPOT is request-weighted: (10 ms + 50 ms) / 2.
    assert m["latency"]["tpot"]["mean"] == pytest.approx(0.030)


def test_single_token_output_has_ttft_and_e2e_but_no_tpot() -> None:
    reqs = _requests(
        [{"request_id": 0, "t_first_token": 20 * MS, "t_last_token": 20 * MS, "output_tokens": 1}]
    )
    m = compute_metrics(reqs, _chunks([(0, 20 * MS, 1)]), NO_STEPS)
    assert m["latency"]["ttft"]["count"] == 1
    assert m["latency"]["e2e"]["p50"] == pytest.approx(0.020)
    assert m["latency"]["tpot"]["count"] == 0
    assert m["latency"]["tpot"]["p50"] is None


def test_failed_requests_are_excluded_from_latency_and_count_as_goodput_misses() -> None:
    reqs = _requests(
        [
            {
                "request_id": 0,
                "t_first_token": 10 * MS,
                "t_last_token": 50 * MS,
                "output_tokens": 5,
            },
            {
                "request_id": 1,
                "t_first_token": 10 * MS,
                "t_last_token": 20 * MS,
                "output_tokens": 2,
                "error": "ConnectionResetError: server went away",
            },
            {"request_id": 2, "error": "HTTP 500"},
        ]
    )
    chunks = _chunks([(0, 10 * MS, 1), (0, 50 * MS, 4), (1, 10 * MS, 1), (1, 20 * MS, 1)])
    m = compute_metrics(reqs, chunks, NO_STEPS, slos={"ttft": 1.0})
    assert m.counts.to_dict() == {
        "requests": 3,
        "completed": 1,
        "failed": 2,
        "warmup": 0,
        "output_tokens": 5,
        "prompt_tokens": 10,
        "truncated": 0,
    }
    assert m["latency"]["ttft"]["count"] == 1
    assert m["latency"]["itl"]["count"] == 1  # only the completed request's gap
    assert m["goodput"]["good_requests"] == 1
    assert m["goodput"]["attainment"] == pytest.approx(1 / 3)
    assert {e["error"] for e in m["errors"]} == {
        "ConnectionResetError: server went away",
        "HTTP 500",
    }


def test_warmup_requests_are_excluded_from_every_statistic_and_the_window() -> None:
    reqs = _requests(
        [
            {
                "request_id": 0,
                "is_warmup": True,
                "t_sent": 0,
                "t_first_token": 500 * MS,
                "t_last_token": 900 * MS,
                "output_tokens": 10,
            },
            {
                "request_id": 1,
                "t_sent": 1000 * MS,
                "t_scheduled": 1000 * MS,
                "t_first_token": 1100 * MS,
                "t_last_token": 1500 * MS,
                "output_tokens": 5,
            },
        ]
    )
    chunks = _chunks([(0, 500 * MS, 1), (0, 900 * MS, 9), (1, 1100 * MS, 1), (1, 1500 * MS, 4)])
    m = compute_metrics(reqs, chunks, NO_STEPS)
    assert m["counts"]["warmup"] == 1
    assert m["counts"]["requests"] == 1
    assert m["latency"]["ttft"]["p50"] == pytest.approx(0.100)
    assert m["window_s"] == pytest.approx(0.5)
    assert m["throughput"]["output_tok_s"] == pytest.approx(5 / 0.5)
    assert m["throughput"]["total_tok_s"] == pytest.approx(15 / 0.5)


def test_goodput_counts_requests_meeting_every_slo_and_single_token_requests_meet_tpot() -> None:
    reqs = _requests(
        [
            # ttft 100 ms, tpot 10 ms: meets both
            {
                "request_id": 0,
                "t_first_token": 100 * MS,
                "t_last_token": 140 * MS,
                "output_tokens": 5,
            },
            # ttft 300 ms: misses ttft
            {
                "request_id": 1,
                "t_first_token": 300 * MS,
                "t_last_token": 340 * MS,
                "output_tokens": 5,
            },
            # tpot 50 ms: misses tpot
            {
                "request_id": 2,
                "t_first_token": 100 * MS,
                "t_last_token": 300 * MS,
                "output_tokens": 5,
            },
            # single token: no TPOT, meets ttft
            {
                "request_id": 3,
                "t_first_token": 150 * MS,
                "t_last_token": 150 * MS,
                "output_tokens": 1,
            },
        ]
    )
    chunks = _chunks(
        [
            (0, 100 * MS, 1),
            (0, 140 * MS, 4),
            (1, 300 * MS, 1),
            (1, 340 * MS, 4),
            (2, 100 * MS, 1),
            (2, 300 * MS, 4),
            (3, 150 * MS, 1),
        ]
    )
    m = compute_metrics(reqs, chunks, NO_STEPS, slos=parse_slos(["ttft=200ms", "tpot=20ms"]))
    g = m["goodput"]
    assert g["good_requests"] == 2
    assert g["attainment"] == pytest.approx(0.5)
    assert g["per_slo"] == {"ttft": pytest.approx(0.75), "tpot": pytest.approx(0.75)}
    assert g["goodput_req_s"] == pytest.approx(2 / 0.340)


def test_driver_lag_is_sent_minus_scheduled() -> None:
    reqs = _requests(
        [
            {
                "request_id": 0,
                "t_scheduled": 0,
                "t_sent": 2 * MS,
                "t_first_token": 10 * MS,
                "t_last_token": 10 * MS,
                "output_tokens": 1,
            },
            {
                "request_id": 1,
                "t_scheduled": 5 * MS,
                "t_sent": 9 * MS,
                "t_first_token": 20 * MS,
                "t_last_token": 20 * MS,
                "output_tokens": 1,
            },
        ]
    )
    m = compute_metrics(reqs, _chunks([(0, 10 * MS, 1), (1, 20 * MS, 1)]), NO_STEPS)
    assert m["driver_lag"]["max"] == pytest.approx(0.004)
    assert m["driver_lag"]["min"] == pytest.approx(0.002)


def test_busy_throughput_leaves_out_idle_gaps_between_steps() -> None:
    reqs = _requests(
        [
            {
                "request_id": 0,
                "t_first_token": 10 * MS,
                "t_last_token": 1000 * MS,
                "output_tokens": 100,
            }
        ]
    )
    steps = pd.DataFrame(
        [
            (0, "prefill", 0, 10 * MS, 1, 10, 0, [0]),
            (1, "decode", 10 * MS, 20 * MS, 1, 1, 10, [0]),
            (2, "decode", 15 * MS, 30 * MS, 1, 1, 11, [0]),  # overlaps the previous one
            (3, "decode", 990 * MS, 1000 * MS, 1, 1, 12, [0]),
        ],
        columns=STEP_SCHEMA.names,
    )
    m = compute_metrics(reqs, _chunks([(0, 10 * MS, 1), (0, 1000 * MS, 99)]), steps)
    assert m["throughput"]["busy_s"] == pytest.approx(0.040)
    assert m["throughput"]["busy_tok_s"] == pytest.approx(100 / 0.040)
    assert m["throughput"]["output_tok_s"] == pytest.approx(100 / 1.0)


def test_distribution_statistics_and_empty_input() -> None:
    d = distribution([1.0, 2.0, 3.0, 4.0, float("nan")])
    assert d["count"] == 4
    assert d["mean"] == pytest.approx(2.5)
    assert d["p50"] == pytest.approx(2.5)
    assert d["std"] == pytest.approx(math.sqrt(5 / 3))
    assert distribution([])["p99"] is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("ttft=200ms", 0.2), ("tpot=50us", 50e-6), ("e2e=5s", 5.0), ("ntpot=1500ns", 1.5e-6)],
)
def test_slo_units_are_parsed(text: str, seconds: float) -> None:
    (value,) = parse_slos([text]).values()
    assert value == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["ttft", "ttft=200", "ttft=fast", "latency=2s", "ttft=-1ms"])
def test_malformed_slos_are_rejected_with_a_message(text: str) -> None:
    with pytest.raises(SLOError, match=r"ttft|SLO|duration|metric"):
        parse_slos([text])
