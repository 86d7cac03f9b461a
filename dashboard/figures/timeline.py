"""The request timeline: each request's queue, prefill and decode spans, or state counts
plus a sample of rows for a large run."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from perfscope.dashboard._fmt import esc
from perfscope.dashboard.figures.common import (
    _COLORS,
    _NS,
    FIGURE_LAYOUT,
    MAX_SERIES_POINTS,
    TIMELINE_MAX_ROWS,
    _empty,
)

__all__ = ["timeline_figure"]


@dataclass
class _Segments:
    rid: np.ndarray
    sent: np.ndarray  # seconds, NaN when never sent
    start: np.ndarray  # prefill start (s): first prefill step, else NaN
    first: np.ndarray
    last: np.ndarray
    end: np.ndarray  # last known time of the request
    error: list[str | None]
    warmup: np.ndarray


def _segments(requests: pd.DataFrame, steps: pd.DataFrame) -> _Segments:
    r = requests.sort_values("request_id", kind="stable")
    rid = r["request_id"].to_numpy(dtype=np.int64)

    def col(name: str) -> np.ndarray:
        return r[name].astype("float64").to_numpy() * _NS

    sched, sent, first, last = (
        col("t_scheduled"),
        col("t_sent"),
        col("t_first_token"),
        col("t_last_token"),
    )
    start = np.full(rid.size, np.nan)
    if not steps.empty and rid.size:
        pre = steps[steps["kind"].isin(("prefill", "mixed"))][["t_start", "request_ids"]]
        if not pre.empty:
            ex = pre.explode("request_ids").dropna(subset=["request_ids"])
            if not ex.empty:
                firsts = ex.groupby(ex["request_ids"].astype(np.int64))["t_start"].min()
                start = firsts.reindex(rid).to_numpy(dtype=float) * _NS
    end = np.where(
        np.isfinite(last),
        last,
        np.where(np.isfinite(first), first, np.where(np.isfinite(sent), sent, sched)),
    )
    errors = [None if (e is None or e != e) else str(e) for e in r["error"].tolist()]
    return _Segments(
        rid=rid,
        sent=np.where(np.isfinite(sent), sent, sched),
        start=start,
        first=first,
        last=last,
        end=end,
        error=errors,
        warmup=r["is_warmup"].astype(bool).to_numpy(),
    )


def _gantt(fig: go.Figure, s: _Segments, rows: np.ndarray, *, row: int | None = None) -> None:
    """Horizontal bars (queue, prefill, decode) and error markers for the given rows."""
    kw: dict[str, int] = {"row": row, "col": 1} if row is not None else {}
    has_start = np.isfinite(s.start[rows])
    first = s.first[rows]
    sent = s.sent[rows]
    start = np.where(has_start, s.start[rows], sent)
    prefill_from = np.where(has_start, start, sent)
    segs = [
        ("queue", sent, np.where(has_start, start, np.nan), "queued"),
        (
            "prefill",
            prefill_from,
            first,
            "prefill" if has_start.any() else "waiting for first token",
        ),
        ("decode", first, s.last[rows], "decode"),
    ]
    ids = s.rid[rows]
    for kind, a, b, label in segs:
        ok = np.isfinite(a) & np.isfinite(b) & (b >= a)
        if not ok.any():
            continue
        fig.add_trace(
            go.Bar(
                x=(b[ok] - a[ok]).astype(np.float32),
                base=a[ok].astype(np.float32),
                y=ids[ok],
                orientation="h",
                name=label,
                marker={"color": _COLORS[kind], "line": {"width": 0}},
                customdata=np.stack([a[ok], b[ok]], axis=1).astype(np.float32),
                hovertemplate=(
                    f"request %{{y}} {label}<br>%{{customdata[0]:.4f}} s → "
                    "%{customdata[1]:.4f} s<extra></extra>"
                ),
                legendgroup=kind,
                showlegend=row is None or row == 2,
            ),
            **kw,
        )
    err = [i for i, r_ in enumerate(rows) if s.error[int(r_)] is not None]
    if err:
        idx = rows[err]
        fig.add_trace(
            go.Scatter(
                x=s.end[idx],
                y=s.rid[idx],
                mode="markers",
                name="error",
                marker={"symbol": "x", "color": _COLORS["error"], "size": 9},
                text=[esc(s.error[int(i)])[:200] for i in idx],
                hovertemplate="request %{y} failed: %{text}<extra></extra>",
            ),
            **kw,
        )


def _state_counts(s: _Segments, n_points: int = MAX_SERIES_POINTS) -> dict[str, np.ndarray]:
    """Requests queued, in prefill, decoding at each of ``n_points`` instants (``t``, seconds
    since run start, and a count array per state)."""
    lo = np.nanmin(s.sent) if s.sent.size else 0.0
    hi = np.nanmax(s.end) if s.end.size else 1.0
    grid = np.linspace(lo, hi if hi > lo else lo + 1e-3, n_points)

    def count(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ok = np.isfinite(a) & np.isfinite(b)
        a_, b_ = np.sort(a[ok]), np.sort(b[ok])
        return np.searchsorted(a_, grid, side="right") - np.searchsorted(b_, grid, side="right")

    has_start = np.isfinite(s.start)
    first_or_end = np.where(np.isfinite(s.first), s.first, s.end)
    queued = count(s.sent, np.where(has_start, s.start, first_or_end))
    prefill = count(np.where(has_start, s.start, np.nan), first_or_end)
    decode = count(s.first, np.where(np.isfinite(s.last), s.last, s.end))
    return {"t": grid, "queued": queued, "prefill": prefill, "decode": decode}


def timeline_figure(
    requests: pd.DataFrame, steps: pd.DataFrame, *, max_rows: int = TIMELINE_MAX_ROWS
) -> go.Figure:
    """One row per request (queue, prefill, decode; errors marked with x).

    With more than ``max_rows`` requests: a density view (how many requests are queued,
    in prefill and decoding over time) above every k-th request's row.
    """
    if requests.empty:
        return _empty("no requests recorded")
    s = _segments(requests, steps)
    n = s.rid.size
    if n <= max_rows:
        fig = go.Figure()
        _gantt(fig, s, np.arange(n))
        fig.update_layout(
            **FIGURE_LAYOUT,
            barmode="overlay",
            height=min(900, 160 + 14 * n),
            title={"text": f"Request timeline ({n} requests)"},
        )
        fig.update_xaxes(title_text="time since run start (s)")
        fig.update_yaxes(title_text="request", autorange="reversed")
        return fig
    stride = math.ceil(n / max_rows)
    rows = np.arange(0, n, stride)
    err_rows = np.array([i for i, e in enumerate(s.error) if e is not None], dtype=np.int64)
    rows = np.union1d(rows, err_rows[:max_rows])
    counts = _state_counts(s)
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.35, 0.65],
        vertical_spacing=0.06,
        subplot_titles=[
            "requests in each state",
            f"every {stride}th request (+ every failed one): {rows.size} of {n}",
        ],
    )
    for kind, key in (("queue", "queued"), ("prefill", "prefill"), ("decode", "decode")):
        fig.add_trace(
            go.Scatter(
                x=counts["t"].astype(np.float32),
                y=counts[key].astype(np.float32),
                mode="lines",
                stackgroup="states",
                name=key,
                line={"color": _COLORS[kind], "width": 0.5},
                legendgroup=kind,
                showlegend=False,
            ),
            row=1,
            col=1,
        )
    _gantt(fig, s, rows, row=2)
    fig.update_layout(
        **FIGURE_LAYOUT,
        barmode="overlay",
        height=820,
        title={"text": f"Request timeline ({n} requests, density view)"},
    )
    fig.update_xaxes(title_text="time since run start (s)", row=2, col=1)
    fig.update_yaxes(title_text="requests", row=1, col=1)
    fig.update_yaxes(title_text="request id", autorange="reversed", row=2, col=1)
    return fig
