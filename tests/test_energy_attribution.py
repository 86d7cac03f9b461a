"""Energy attribution (O(n log n)) agrees with straightforward reference implementations.

The references below are the definitions written as plainly as possible: cut the window at
every request boundary, look at each piece's midpoint, count who is in flight. They are
quadratic and only run on the small random runs hypothesis draws.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfscope.analysis.energy import EnergyCurve
from perfscope.analysis.energy.attribution import _split_concurrency, _split_steps_to_requests
from perfscope.analysis.energy.curves import merge_windows
from perfscope.analysis.roofline import _union_length

SETTINGS = settings(max_examples=60, deadline=None)


def _reference_concurrency(
    req: pd.DataFrame, curve: EnergyCurve, w0: float, w1: float
) -> tuple[dict[int, float], dict[str, float]]:
    """Per piece between consecutive boundaries: split its energy among requests in flight."""
    req = req.dropna(subset=["t_sent", "t_last_token"])
    if len(req) == 0:
        return {}, {}
    ids = [int(i) for i in req["request_id"]]
    s = np.clip(req["t_sent"].to_numpy(dtype=float), w0, w1)
    f = np.clip(req["t_first_token"].to_numpy(dtype=float), w0, w1)
    f = np.where(np.isnan(f), s, f)
    e = np.clip(req["t_last_token"].to_numpy(dtype=float), w0, w1)
    bounds = sorted(set(s) | set(f) | set(e) | {w0, w1})
    per = dict.fromkeys(ids, 0.0)
    phase = {"prefill": 0.0, "decode": 0.0, "idle": 0.0}
    for a, b in itertools.pairwise(bounds):
        energy = float(curve.between(np.array([a]), np.array([b]))[0])
        mid = (a + b) / 2
        active = [k for k in range(len(ids)) if s[k] <= mid <= e[k]]
        if not active:
            phase["idle"] += energy
            continue
        share = energy / len(active)
        for k in active:
            per[ids[k]] += share
            phase["prefill" if mid < f[k] else "decode"] += share
    return per, phase


def _reference_steps(st_: pd.DataFrame, requests: pd.DataFrame) -> dict[int, float]:
    prompt = dict(zip(requests["request_id"], requests["prompt_tokens"], strict=True))
    out: dict[int, float] = {}
    for kind, ids, e in zip(st_["kind"], st_["request_ids"], st_["_e"], strict=True):
        if not len(ids):
            continue
        w = [max(float(prompt.get(i, 1.0)), 1.0) if kind == "prefill" else 1.0 for i in ids]
        for i, wi in zip(ids, w, strict=True):
            out[int(i)] = out.get(int(i), 0.0) + e * wi / sum(w)
    return out


def _curve(draw: Any, t_max: int) -> EnergyCurve:
    n = draw(st.integers(2, 12))
    t = np.sort(np.array(draw(st.lists(st.integers(0, t_max), min_size=n, max_size=n))))
    t = np.unique(t)
    if len(t) < 2:
        t = np.array([0, t_max])
    p = np.array(draw(st.lists(st.floats(0, 500), min_size=len(t), max_size=len(t))))
    curve = EnergyCurve.from_power(t, p)
    assert curve is not None
    return curve


@st.composite
def http_runs(draw: Any) -> tuple[pd.DataFrame, EnergyCurve, float, float]:
    """Requests with send, optional first token and optional last token on a small grid
    (ties between boundaries are common), plus a power curve and a window."""
    n = draw(st.integers(1, 12))
    rows = []
    for i in range(n):
        sent = draw(st.integers(0, 40))
        first = sent + draw(st.integers(0, 20))
        last = first + draw(st.integers(0, 20))
        rows.append(
            {
                "request_id": i,
                "t_sent": float(sent),
                "t_first_token": draw(st.sampled_from([float(first), np.nan])),
                "t_last_token": draw(st.sampled_from([float(last), float(last), np.nan])),
            }
        )
    req = pd.DataFrame(rows)
    w0 = float(draw(st.integers(0, 10)))
    w1 = w0 + float(draw(st.integers(1, 80)))
    return req, _curve(draw, 100), w0, w1


@given(http_runs())
@SETTINGS
def test_concurrency_split_matches_the_per_piece_definition(
    case: tuple[pd.DataFrame, EnergyCurve, float, float],
) -> None:
    req, curve, w0, w1 = case
    got, got_phase = _split_concurrency(req, {"gpu0": curve}, w0, w1)
    want, want_phase = _reference_concurrency(req, curve, w0, w1)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-9)
    for k in want_phase:
        assert got_phase[k] == pytest.approx(want_phase[k], rel=1e-9, abs=1e-9)


@given(http_runs())
@SETTINGS
def test_concurrency_split_conserves_the_window_energy(
    case: tuple[pd.DataFrame, EnergyCurve, float, float],
) -> None:
    req, curve, w0, w1 = case
    per, phase = _split_concurrency(req, {"gpu0": curve}, w0, w1)
    if not per:
        return
    total = float(curve.between(np.array([w0]), np.array([w1]))[0])
    assert sum(phase.values()) == pytest.approx(total, rel=1e-9, abs=1e-9)
    assert sum(per.values()) == pytest.approx(phase["prefill"] + phase["decode"], abs=1e-9)


@st.composite
def step_runs(draw: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    n_req = draw(st.integers(1, 8))
    requests = pd.DataFrame(
        {
            "request_id": np.arange(n_req),
            "prompt_tokens": draw(st.lists(st.integers(0, 300), min_size=n_req, max_size=n_req)),
        }
    )
    n_steps = draw(st.integers(1, 10))
    rows = []
    for _ in range(n_steps):
        ids = draw(st.lists(st.integers(0, n_req + 2), max_size=5, unique=True))
        rows.append(
            {
                "kind": draw(st.sampled_from(["prefill", "decode", "mixed"])),
                "request_ids": np.array(ids, dtype=np.int64),
                "_e": draw(st.floats(0, 1000)),
            }
        )
    return pd.DataFrame(rows), requests


@given(step_runs())
@SETTINGS
def test_step_split_matches_the_per_step_definition(
    case: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    steps, requests = case
    got = _split_steps_to_requests(steps, requests)
    want = _reference_steps(steps, requests)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-9)


intervals = st.lists(
    st.tuples(st.integers(0, 100), st.integers(0, 30)).map(lambda x: (x[0], x[0] + x[1])),
    min_size=1,
    max_size=15,
)


@given(intervals)
@SETTINGS
def test_merged_windows_are_the_union(iv: list[tuple[int, int]]) -> None:
    a = np.array([x for x, _ in iv], dtype=float)
    b = np.array([y for _, y in iv], dtype=float)
    starts, ends = merge_windows(a, b)
    # Reference: walk the sorted intervals and extend the last block while they touch.
    ref: list[list[float]] = []
    for x, y in sorted(iv):
        if ref and x <= ref[-1][1]:
            ref[-1][1] = max(ref[-1][1], y)
        else:
            ref.append([x, y])
    assert starts.tolist() == [r[0] for r in ref]
    assert ends.tolist() == [r[1] for r in ref]
    covered = {k for x, y in iv for k in range(x, y)}
    assert _union_length(a, b) == pytest.approx(len(covered))
