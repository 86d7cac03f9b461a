"""Latency: CDFs of a run's per-request latencies, latency over the run, and the same for
several runs compared (percentile bars, overlaid CDFs). Latencies in seconds, drawn in ms."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from perfscope.analysis.compare import latency_samples
from perfscope.analysis.summary import Summary
from perfscope.dashboard._fmt import esc, finite, fmt_time
from perfscope.dashboard.figures.common import (
    _COLORS,
    _NS,
    _PALETTE,
    FIGURE_LAYOUT,
    LATENCY_METRICS,
    MARKER_PERCENTILES,
    MAX_CDF_POINTS,
    RunTables,
    _empty,
)
from perfscope.dashboard.view import as_summary

__all__ = [
    "comparison_cdf_figure",
    "comparison_metrics_figure",
    "latency_cdf_figure",
    "latency_over_time_figure",
    "latency_values",
]


def latency_values(
    requests: pd.DataFrame, chunks: pd.DataFrame, *, rows: pd.DataFrame | None = None
) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT, E2E and pooled ITL gaps (seconds) of the measured, completed
    requests (:func:`perfscope.analysis.compare.latency_samples`); ``rows`` are the run's
    per-request rows when the caller has them (they are derived otherwise)."""
    return dict(latency_samples(requests, chunks, rows=rows))


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values)
    n = v.size
    if n == 0:
        return v, v
    if n > MAX_CDF_POINTS:
        idx = np.unique(np.linspace(0, n - 1, MAX_CDF_POINTS).round().astype(np.int64))
    else:
        idx = np.arange(n)
    return v[idx], (idx + 1) / n


def latency_cdf_figure(
    summary: Summary | Mapping[str, Any],
    requests: pd.DataFrame,
    chunks: pd.DataFrame,
    *,
    rows: pd.DataFrame | None = None,
) -> go.Figure:
    """CDFs of TTFT, TPOT, ITL and E2E (seconds on the x axes, ticks with SI prefixes:
    ``300ms``, ``2s``) with p50/p90/p99 markers taken from the summary and the run's SLOs as
    vertical lines. ``rows``: the run's per-request rows, when the
    caller has derived them already (see :func:`latency_values`)."""
    typed = as_summary(summary)
    values = latency_values(requests, chunks, rows=rows)
    lat = typed.latency
    slos = typed.goodput.slos
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=list(LATENCY_METRICS.values()),
        vertical_spacing=0.16,
        horizontal_spacing=0.08,
    )
    for i, (key, label) in enumerate(LATENCY_METRICS.items()):
        row, col = i // 2 + 1, i % 2 + 1
        x, y = _ecdf(values[key])
        fig.add_trace(
            go.Scatter(
                x=x.astype(np.float32),
                y=y.astype(np.float32),
                mode="lines",
                line={"shape": "hv", "color": _PALETTE[i]},
                name=f"{label} CDF",
                showlegend=False,
                hovertemplate=f"{label} %{{x:.3s}}s<br>share %{{y:.3f}}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        dist = getattr(lat, key)
        px_, py_, pt_ = [], [], []
        for p in MARKER_PERCENTILES:
            v = finite(getattr(dist, f"p{p}", None))
            if v is not None:
                px_.append(v)
                py_.append(p / 100)
                pt_.append(f"p{p}")
        if px_:
            fig.add_trace(
                go.Scatter(
                    x=px_,
                    y=py_,
                    mode="markers+text",
                    text=pt_,
                    textposition="middle left",
                    marker={"size": 8, "color": "#222", "symbol": "diamond"},
                    name=f"{label} percentiles",
                    showlegend=False,
                    hovertemplate=f"{label} %{{text}} = %{{x:.3s}}s<extra></extra>",
                    meta={"metric": key, "kind": "percentiles"},
                ),
                row=row,
                col=col,
            )
        limit = finite(slos.get(key))
        if limit is not None:
            fig.add_vline(
                x=limit,
                line={"color": _COLORS["error"], "dash": "dash"},
                row=row,
                col=col,
            )
            fig.add_trace(
                go.Scatter(
                    x=[limit],
                    y=[1.02],
                    mode="text",
                    text=[f"SLO {fmt_time(limit)}"],
                    textposition="top center",
                    showlegend=False,
                    hoverinfo="skip",
                    textfont={"color": _COLORS["error"], "size": 10},
                    meta={"metric": key, "kind": "slo"},
                ),
                row=row,
                col=col,
            )
        if values[key].size == 0:
            fig.add_annotation(
                text="no data",
                showarrow=False,
                x=0.5,
                y=0.5,
                xref=f"x{i + 1 if i else ''} domain",
                yref=f"y{i + 1 if i else ''} domain",
            )
    fig.update_yaxes(range=[0, 1.1], title_text="share of requests", col=1)
    fig.update_yaxes(range=[0, 1.1])
    fig.update_xaxes(ticksuffix="s", exponentformat="SI", minexponent=0)
    fig.update_layout(**FIGURE_LAYOUT, height=560, title={"text": "Latency distributions"})
    return fig


def _measured_ok(requests: pd.DataFrame) -> pd.DataFrame:
    if requests.empty:
        return requests
    m = requests[~requests["is_warmup"].astype(bool)]
    return m[m["error"].isna() & m["t_sent"].notna() & m["t_last_token"].notna()]


def latency_over_time_figure(requests: pd.DataFrame) -> go.Figure:
    """TTFT and E2E (seconds, y) of each completed measured request against the time it
    finished (seconds since run start, x; in batch mode every request is sent at once)."""
    ok = _measured_ok(requests)
    if ok.empty:
        return _empty("no completed measured requests")
    done = ok["t_last_token"].to_numpy(dtype=np.float64) * _NS
    e2e = (ok["t_last_token"] - ok["t_sent"]).to_numpy(dtype=np.float64) * _NS
    ttft = (ok["t_first_token"] - ok["t_sent"]).to_numpy(dtype=np.float64) * _NS
    ids = ok["request_id"].to_numpy()
    fig = go.Figure()
    for name, ys, color in (("E2E", e2e, _PALETTE[0]), ("TTFT", ttft, _PALETTE[1])):
        fig.add_trace(
            go.Scatter(
                x=done.astype(np.float32),
                y=ys.astype(np.float32),
                mode="markers",
                name=name,
                marker={"size": 6, "color": color, "opacity": 0.8},
                customdata=ids,
                hovertemplate=f"request %{{customdata}}: {name} %{{y:.3s}}s at %{{x:.2f}} s"
                "<extra></extra>",
            )
        )
    fig.update_xaxes(title_text="finished at (s since run start)")
    fig.update_yaxes(
        title_text="latency", ticksuffix="s", exponentformat="SI", minexponent=0, rangemode="tozero"
    )
    fig.update_layout(**FIGURE_LAYOUT, height=340, title={"text": "Latency over time"})
    return fig


def comparison_metrics_figure(
    labels: Sequence[str], summaries: Sequence[Summary | Mapping[str, Any]]
) -> go.Figure:
    """Grouped bars: TTFT/TPOT/ITL/E2E p50 and p99 (ms) and throughput per run."""
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.72, 0.28],
        subplot_titles=["latency percentiles (ms)", "output tokens/s"],
    )
    cats = [f"{LATENCY_METRICS[m]} p{p}" for m in LATENCY_METRICS for p in (50, 99)]
    for i, (label, summary) in enumerate(zip(labels, summaries, strict=True)):
        s = as_summary(summary)
        vals = [
            (finite(getattr(getattr(s.latency, m), f"p{p}", None)) or math.nan) * 1e3
            for m in LATENCY_METRICS
            for p in (50, 99)
        ]
        color = _PALETTE[i % len(_PALETTE)]
        fig.add_trace(
            go.Bar(x=cats, y=vals, name=esc(label), marker={"color": color}, legendgroup=str(i)),
            row=1,
            col=1,
        )
        tput = finite(s.throughput.output_tok_s)
        fig.add_trace(
            go.Bar(
                x=[esc(label)],
                y=[tput],
                name=esc(label),
                marker={"color": color},
                showlegend=False,
                legendgroup=str(i),
            ),
            row=1,
            col=2,
        )
    fig.update_layout(**FIGURE_LAYOUT, barmode="group", height=420, title={"text": "Runs compared"})
    return fig


def comparison_cdf_figure(labels: Sequence[str], runs: Sequence[RunTables]) -> go.Figure:
    """TTFT, TPOT, ITL and E2E CDFs of several runs overlaid (ms)."""
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=[f"{label} (ms)" for label in LATENCY_METRICS.values()],
        vertical_spacing=0.16,
        horizontal_spacing=0.08,
    )
    for j, (label, run) in enumerate(zip(labels, runs, strict=True)):
        values = latency_values(run.requests, run.chunks)
        color = _PALETTE[j % len(_PALETTE)]
        for i, key in enumerate(LATENCY_METRICS):
            x, y = _ecdf(values[key])
            fig.add_trace(
                go.Scatter(
                    x=(x * 1e3).astype(np.float32),
                    y=y.astype(np.float32),
                    mode="lines",
                    line={"shape": "hv", "color": color},
                    name=esc(label),
                    legendgroup=str(j),
                    showlegend=i == 0,
                ),
                row=i // 2 + 1,
                col=i % 2 + 1,
            )
    fig.update_yaxes(range=[0, 1.05])
    fig.update_layout(**FIGURE_LAYOUT, height=560, title={"text": "Latency distributions compared"})
    return fig
