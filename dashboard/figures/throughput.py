"""Throughput over time: output tokens per second in bins with requests in flight and the
telemetry below, the offered against the achieved rate, and several runs compared."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from perfscope.analysis.energy import device_keys
from perfscope.dashboard._fmt import esc, fmt_num
from perfscope.dashboard.figures.common import (
    _NS,
    _PALETTE,
    FIGURE_LAYOUT,
    MAX_SERIES_POINTS,
    RunTables,
    _empty,
)
from perfscope.dashboard.figures.latency import _measured_ok
from perfscope.jsontypes import json_float

__all__ = ["comparison_throughput_figure", "offered_achieved_figure", "throughput_figure"]


def _bin_width(span_s: float) -> float:
    """A round bin width giving about 100 bins over ``span_s`` (at least 1 ms)."""
    raw = max(span_s / 100.0, 1e-3)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return float(m * mag)
    return float(10 * mag)


_TELEMETRY_ROWS: tuple[tuple[str, str, float], ...] = (
    ("power_w", "power (W)", 1.0),
    ("mem_used_bytes", "memory used (GB)", 1e-9),
    ("rss_bytes", "process RSS (GB)", 1e-9),
    ("util_pct", "utilisation (%)", 1.0),
    ("sm_clock_mhz", "SM clock (MHz)", 1.0),
)


def throughput_figure(
    requests: pd.DataFrame,
    chunks: pd.DataFrame,
    telemetry: pd.DataFrame | None = None,
) -> go.Figure:
    """Output tokens/s and active requests over time, with telemetry (power, memory,
    utilisation, clocks) below on the same time axis (seconds since run start)."""
    if requests.empty or chunks.empty:
        return _empty("no tokens recorded")
    tele = telemetry if telemetry is not None else pd.DataFrame()
    tele_rows = [
        (c, label, scale)
        for c, label, scale in _TELEMETRY_ROWS
        if c in tele.columns and tele[c].notna().any()
    ]
    n_rows = 1 + len(tele_rows)
    fig = make_subplots(
        rows=n_rows,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.04 if n_rows > 2 else 0.08,
        row_heights=[2.0] + [1.0] * len(tele_rows),
        specs=[[{"secondary_y": True}]] + [[{}] for _ in tele_rows],
    )
    measured = requests[~requests["is_warmup"].astype(bool)]
    t = chunks["t"].to_numpy(dtype=np.float64) * _NS
    ntok = chunks["n_tokens"].to_numpy(dtype=np.float64)
    lo, hi = float(t.min()), float(t.max())
    sent = measured["t_sent"].dropna().to_numpy(dtype=np.float64) * _NS
    if sent.size:
        lo = min(lo, float(sent.min()))
    width = _bin_width(hi - lo)
    edges = np.arange(math.floor(lo / width) * width, hi + width, width)
    if edges.size < 2:
        edges = np.array([lo, lo + width])
    tok, _ = np.histogram(t, bins=edges, weights=ntok)
    fig.add_trace(
        go.Scatter(
            x=edges[:-1].astype(np.float32),
            y=(tok / width).astype(np.float32),
            mode="lines",
            line={"shape": "hv", "color": _PALETTE[0]},
            name=f"output tokens/s ({width * 1e3:g} ms bins)",
            hovertemplate="%{x:.3f} s: %{y:.1f} tok/s<extra></extra>",
        ),
        row=1,
        col=1,
    )
    a = requests["t_sent"].astype("float64").to_numpy() * _NS
    b = requests["t_last_token"].astype("float64").to_numpy() * _NS
    b = np.where(np.isfinite(b), b, a)
    ok = np.isfinite(a)
    grid = np.linspace(edges[0], edges[-1], min(MAX_SERIES_POINTS, max(edges.size * 4, 50)))
    active = np.searchsorted(np.sort(a[ok]), grid, side="right") - np.searchsorted(
        np.sort(b[ok]), grid, side="right"
    )
    fig.add_trace(
        go.Scatter(
            x=grid.astype(np.float32),
            y=active.astype(np.float32),
            mode="lines",
            line={"shape": "hv", "color": _PALETTE[1], "dash": "dot"},
            name="active requests",
            hovertemplate="%{x:.3f} s: %{y} active<extra></extra>",
        ),
        row=1,
        col=1,
        secondary_y=True,
    )
    fig.update_yaxes(title_text="tokens/s", row=1, col=1, secondary_y=False, rangemode="tozero")
    fig.update_yaxes(
        title_text="active requests",
        row=1,
        col=1,
        secondary_y=True,
        rangemode="tozero",
        tickformat=",d",
        showgrid=False,
    )
    if tele_rows:
        tele = tele.assign(device=device_keys(tele))  # node/device on a cluster run
    devices = sorted(str(d) for d in tele["device"].dropna().unique()) if tele_rows else []
    for i, (column, label, scale) in enumerate(tele_rows, start=2):
        for j, dev in enumerate(devices):
            d = tele[(tele["device"] == dev) & tele[column].notna()].sort_values("t")
            if d.empty:
                continue
            step = max(1, math.ceil(len(d) / MAX_SERIES_POINTS))
            d = d.iloc[::step]
            fig.add_trace(
                go.Scatter(
                    x=(d["t"].to_numpy(dtype=np.float64) * _NS).astype(np.float32),
                    y=(d[column].to_numpy(dtype=np.float64) * scale).astype(np.float32),
                    mode="lines",
                    name=f"{esc(dev)} {label}",
                    # One colour per telemetry line, one dash per device.
                    line={
                        "color": _PALETTE[(i + 1) % len(_PALETTE)],
                        "dash": ("solid", "dash", "dot", "dashdot")[j % 4],
                    },
                    legendgroup=dev,
                ),
                row=i,
                col=1,
            )
        fig.update_yaxes(title_text=label, row=i, col=1)
    fig.update_xaxes(title_text="time since run start (s)", row=n_rows, col=1)
    fig.update_layout(
        **FIGURE_LAYOUT,
        height=360 + 170 * len(tele_rows),
        title={"text": "Throughput over time" + (" and telemetry" if tele_rows else "")},
    )
    return fig


def offered_achieved_figure(requests: pd.DataFrame, load: Mapping[str, object]) -> go.Figure:
    """Cumulative requests sent and completed over time (counts, y; seconds, x), with the
    offered and achieved rates (requests/s) in the legend; ``load`` is the summary's load
    section (its ``rate``, requests/s, when a number, is the offered rate)."""
    if requests.empty:
        return _empty("no requests recorded")
    m = requests[~requests["is_warmup"].astype(bool)]
    sent = np.sort(m["t_sent"].dropna().to_numpy(dtype=np.float64) * _NS)
    ok = _measured_ok(requests)
    done = np.sort(ok["t_last_token"].to_numpy(dtype=np.float64) * _NS)
    if sent.size == 0:
        return _empty("no measured requests were sent")
    span_sent = float(sent[-1] - sent[0])
    span_done = float(done[-1] - sent[0]) if done.size else 0.0
    offered = json_float(load.get("rate"))
    if offered:
        offered_txt = f"offered {fmt_num(offered)} req/s"
    elif span_sent > 0:
        offered_txt = f"sent at {fmt_num(sent.size / span_sent)} req/s"
    else:
        offered_txt = "all at once"
    achieved = f"{fmt_num(done.size / span_done)} req/s" if span_done > 0 else "n/a"
    fig = go.Figure()
    for name, xs, color in (
        (f"sent ({offered_txt})", sent, _PALETTE[0]),
        (f"completed (achieved {achieved})", done, _PALETTE[2]),
    ):
        fig.add_trace(
            go.Scatter(
                x=xs.astype(np.float32),
                y=np.arange(1, xs.size + 1, dtype=np.float32),
                mode="lines",
                line={"shape": "hv", "color": color},
                name=name,
                hovertemplate="%{y:,d} by %{x:.2f} s<extra></extra>",
            )
        )
    fig.update_xaxes(title_text="time since run start (s)")
    fig.update_yaxes(title_text="requests", tickformat=",d", rangemode="tozero")
    fig.update_layout(**FIGURE_LAYOUT, height=320, title={"text": "Offered and achieved rate"})
    return fig


def comparison_throughput_figure(labels: Sequence[str], runs: Sequence[RunTables]) -> go.Figure:
    """Output tokens/s over time of several runs, each from its own first measured send."""
    fig = go.Figure()
    spans: list[float] = []
    series: list[tuple[np.ndarray, np.ndarray] | None] = []
    for run in runs:
        measured = run.requests[~run.requests["is_warmup"].astype(bool)]
        sent = measured["t_sent"].dropna()
        c = run.chunks[run.chunks["request_id"].isin(measured["request_id"])]
        if c.empty or sent.empty:
            series.append(None)
            continue
        t = (c["t"].to_numpy(dtype=np.float64) - float(sent.min())) * _NS
        series.append((t, c["n_tokens"].to_numpy(dtype=np.float64)))
        spans.append(float(t.max()))
    if not spans:
        return _empty("no tokens recorded")
    width = _bin_width(max(spans))
    for j, (label, s) in enumerate(zip(labels, series, strict=True)):
        if s is None:
            continue
        t, ntok = s
        edges = np.arange(0.0, float(t.max()) + width, width)
        if edges.size < 2:
            edges = np.array([0.0, width])
        tok, _ = np.histogram(t, bins=edges, weights=ntok)
        fig.add_trace(
            go.Scatter(
                x=edges[:-1].astype(np.float32),
                y=(tok / width).astype(np.float32),
                mode="lines",
                line={"shape": "hv", "color": _PALETTE[j % len(_PALETTE)]},
                name=esc(label),
                hovertemplate=f"{esc(label)} %{{x:.3f}} s: %{{y:.1f}} tok/s<extra></extra>",
            )
        )
    fig.update_xaxes(title_text="time since the run's first measured request (s)")
    fig.update_yaxes(title_text=f"output tokens/s ({width * 1e3:g} ms bins)", rangemode="tozero")
    fig.update_layout(**FIGURE_LAYOUT, height=380, title={"text": "Throughput over time compared"})
    return fig
