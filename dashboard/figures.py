"""Figure builders shared by the HTML report, the comparison and the dashboard.

Every figure is built from a run's summary.json and its Parquet tables; the numbers the
summary already holds (percentiles, MFU/MBU, ceilings, energy) are plotted as they are and
never recomputed. The tables supply what a summary cannot hold: per-request distributions
(through :func:`perfscope.analysis.metrics.per_request` and ``itl_gaps``), the timeline and
time series.

Conventions: latencies are shown in milliseconds, time axes in seconds since the run's
start, FLOP/s and bytes in SI units. Every string that comes from the user or a server
(run names, error texts) is HTML-escaped before plotly sees it, because plotly renders a
subset of HTML in titles, legends and hover labels. Large runs are downsampled so a figure
stays small: CDFs keep at most :data:`MAX_CDF_POINTS` points, the timeline switches to a
density view above ``max_rows`` requests, time series keep at most
:data:`MAX_SERIES_POINTS` points.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from perfscope.analysis.compare import latency_samples
from perfscope.analysis.energy import device_keys
from perfscope.analysis.summary import PhaseRoofline, Roofline, RooflineCeilings, Summary
from perfscope.dashboard._fmt import esc, finite, fmt_num, fmt_pct, fmt_si, fmt_time
from perfscope.dashboard.view import as_summary, roofline_ceilings

__all__ = [
    "LATENCY_METRICS",
    "MAX_CDF_POINTS",
    "MAX_SERIES_POINTS",
    "TIMELINE_MAX_ROWS",
    "FigureSpec",
    "RunTables",
    "advice_figure",
    "comparison_cdf_figure",
    "comparison_metrics_figure",
    "latency_cdf_figure",
    "latency_values",
    "phase_breakdown_figure",
    "roofline_figure",
    "run_figures",
    "throughput_figure",
    "timeline_figure",
]

#: Latency metrics drawn as CDFs: summary key → label.
LATENCY_METRICS: dict[str, str] = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
#: Percentile markers drawn on each CDF (keys of the summary's distributions).
MARKER_PERCENTILES = (50, 90, 99)
MAX_CDF_POINTS = 2000
MAX_SERIES_POINTS = 600
#: Above this many requests the timeline shows state counts plus a sample of rows.
TIMELINE_MAX_ROWS = 300

_NS = 1e-9
_COLORS = {
    "queue": "#9e9e9e",
    "prefill": "#f28e2b",
    "decode": "#4e79a7",
    "mixed": "#b07aa1",
    "error": "#e15759",
    "predicted": "#59a14f",
}
_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1")
#: Layout every perfscope figure starts from (report and dashboard alike).
FIGURE_LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
    "font": {"size": 12},
    # Below the plot, hanging from its top edge under the x-axis title: the bottom margin
    # grows with the legend's rows (plotly's automargin), so a narrow figure never cuts it
    # or draws it over the axis title.
    "legend": {"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0, "xanchor": "left"},
}


@dataclass
class RunTables:
    """What the figures read from one run: its summary and its record tables.

    ``perfscope.profiler.store.StoredRun`` has these attributes, so a stored run can be
    passed directly wherever a ``RunTables`` is expected.

    Attributes:
        rows: the run's per-request rows (``perfscope.dashboard.view.request_rows``) when the
            caller derived them already; ``None``: the figures derive them.
    """

    summary: Summary | Mapping[str, Any]
    requests: pd.DataFrame
    chunks: pd.DataFrame
    steps: pd.DataFrame
    telemetry: pd.DataFrame
    rows: pd.DataFrame | None = None


@dataclass
class FigureSpec:
    """One figure of a report: an id for its div, a title, a caption, the figure or the
    reason it is missing."""

    key: str
    title: str
    caption: str
    figure: go.Figure | None
    missing: str | None = None


def _ceilings_of(p: PhaseRoofline, roof: Roofline) -> RooflineCeilings:
    """A phase's own ceilings, or the run's when the phase carries none (older summaries)."""
    own = p.ceilings
    if own.peak_flops is not None or own.mem_bw_bytes_s is not None:
        return own
    return roof.ceilings or own


def _empty(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=esc(message), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(**FIGURE_LAYOUT, height=200)
    return fig


# ---------------------------------------------------------------------- roofline


def si_log_ticks(log_range: Sequence[float], unit: str) -> dict[str, Any]:
    """``tickvals``/``ticktext`` for a log axis spanning ``log_range`` (log10 units): one
    tick per decade labelled with an SI prefix and the unit (``1 PFLOP/s``), since plotly's
    own SI format stops at T and falls back to ``10^15``."""
    lo, hi = math.floor(log_range[0]), math.ceil(log_range[1])
    vals = [10.0**e for e in range(lo, hi + 1)]
    return {"tickvals": vals, "ticktext": [fmt_si(v, unit) for v in vals]}


def _log_range(values: Sequence[float], pad: float = 0.4) -> list[float]:
    """Axis range in log10 units (plotly log axes take their range as exponents)."""
    pos = [v for v in values if v > 0 and math.isfinite(v)]
    lo, hi = (min(pos), max(pos)) if pos else (1.0, 10.0)
    return [math.log10(lo) - pad, math.log10(hi) + pad]


def roofline_figure(summary: Summary | Mapping[str, Any]) -> go.Figure | None:
    """Log-log roofline of the run's phases (``summary["roofline"]``), or ``None``.

    Draws one flat compute ceiling per dtype in use, the DRAM/HBM bandwidth ceiling (and
    the last-level cache's when a phase's working set fits in it), ridge points, each
    phase's measured point (intensity, achieved FLOP/s) labelled with MFU and MBU, and the
    cost model's predicted point at speed of light (``flops / sol_time_s``).
    """
    roof = as_summary(summary).roofline
    phases = roof.phases
    if not roof.available or not phases:
        return None
    peaks: dict[str, float] = {}
    mems: dict[str, float] = {}
    for p in phases.values():
        c = _ceilings_of(p, roof)
        peak, dtype = finite(c.peak_flops), str(c.dtype or "?")
        if peak:
            peaks[dtype] = peak
        dram = finite(c.mem_bw_bytes_s)
        if dram:
            mems["DRAM/HBM"] = dram
        cache_bw = finite(c.cache_bw_bytes_s)
        if cache_bw and (p.memory_level == "cache" or p.fits_in_cache):
            size = fmt_si(c.cache_bytes, "B")
            mems[f"cache ({size})"] = cache_bw
    run_c = roof.ceilings or RooflineCeilings()
    if not peaks and (run_peak := finite(run_c.peak_flops)):
        peaks[str(run_c.dtype)] = run_peak
    if not mems and (bw := finite(run_c.mem_bw_bytes_s)):
        mems["DRAM/HBM"] = bw

    xs: list[float] = []
    ys: list[float] = []
    points = []
    for name, p in phases.items():
        x, y = finite(p.intensity), finite(p.achieved_flops_s)
        if x is None or y is None or x <= 0 or y <= 0:
            continue
        sol = finite(p.sol_time_s)
        flops = finite(p.flops)
        pred = flops / sol if flops and sol else None
        points.append((str(name), p, x, y, pred))
        xs.append(x)
        ys.append(y)
        if pred:
            ys.append(pred)
    ridges = {(d, m): pk / bw for d, pk in peaks.items() for m, bw in mems.items() if bw > 0}
    xs.extend(ridges.values())
    ys.extend(peaks.values())
    if not xs:
        return None
    xr = _log_range(xs, pad=0.8)
    x_lo, x_hi = 10 ** xr[0], 10 ** xr[1]
    y_top = max(ys) if ys else 1.0
    y_lo = min([*ys, *(bw * x_lo for bw in mems.values())])

    fig = go.Figure()
    top = max(peaks.values()) if peaks else y_top
    for i, (mname, bw) in enumerate(sorted(mems.items(), key=lambda kv: kv[1])):
        mem_roof = roofline_ceilings(top, bw, x_lo, x_hi)
        if mem_roof is None:
            continue
        fig.add_trace(
            go.Scatter(
                x=mem_roof.memory_x,
                y=mem_roof.memory_y,
                mode="lines",
                name=f"{mname} {fmt_si(bw, 'B/s')}",
                line={"color": "#555" if i == 0 else "#999", "dash": "solid" if i == 0 else "dash"},
                hovertemplate=f"{esc(mname)}: {fmt_si(bw, 'B/s')}<extra></extra>",
            )
        )
    max_bw = max(mems.values()) if mems else None
    for i, (dtype, pk) in enumerate(sorted(peaks.items(), key=lambda kv: -kv[1])):
        peak_roof = roofline_ceilings(pk, max_bw, x_lo, x_hi)
        fig.add_trace(
            go.Scatter(
                x=peak_roof.peak_x if peak_roof else [x_lo, x_hi],
                y=[pk, pk],
                mode="lines",
                name=f"{esc(dtype)} peak {fmt_si(pk, 'FLOP/s')}",
                line={"color": _PALETTE[(i + 4) % len(_PALETTE)], "width": 2},
                hovertemplate=f"{esc(dtype)} peak: {fmt_si(pk, 'FLOP/s')}<extra></extra>",
            )
        )
    for k, ((dtype, mname), ridge) in enumerate(sorted(ridges.items(), key=lambda kv: kv[1])):
        pk = peaks[dtype]
        # Shapes take data coordinates on log axes, annotations take log10 coordinates.
        fig.add_shape(
            type="line",
            x0=ridge,
            x1=ridge,
            y0=y_lo,
            y1=pk,
            line={"color": "#bbb", "dash": "dot", "width": 1},
        )
        fig.add_annotation(
            x=math.log10(ridge),
            y=math.log10(pk),
            text=f"ridge {fmt_num(ridge)} FLOP/B<br>{esc(dtype)} / {esc(mname)}",
            showarrow=False,
            # Stagger the labels so ridges close together (cache and DRAM) never overlap.
            yshift=16 + 28 * k,
            xanchor="right" if k % 2 else "left",
            font={"size": 10, "color": "#666"},
        )
    for name, p, x, y, pred in points:
        color = _COLORS.get(name, _PALETTE[len(name) % len(_PALETTE)])
        label = f"{esc(name)}: MFU {fmt_pct(p.mfu)}, MBU {fmt_pct(p.mbu)}"
        if p.estimated:
            label += " (est.)"
        hover = (
            f"<b>{esc(name)}</b> ({esc(p.verdict)})<br>"
            f"intensity {fmt_num(x, 4)} FLOP/B<br>achieved {fmt_si(y, 'FLOP/s')}, "
            f"{fmt_si(p.achieved_bytes_s, 'B/s')}<br>"
            f"MFU {fmt_pct(p.mfu)}, MBU {fmt_pct(p.mbu)} "
            f"({esc(p.memory_level or 'dram')})<br>"
            f"time {fmt_si(p.time_s, 's')}, FLOPs {fmt_si(p.flops)}, "
            f"bytes {fmt_si(p.bytes, 'B')}<extra></extra>"
        )
        fig.add_trace(
            go.Scatter(
                x=[x],
                y=[y],
                mode="markers+text",
                name=label,
                text=[label],
                # Labels point into the plot so the right edge never cuts them.
                # Beside the marker (not below: the lowest point sits on the x axis).
                textposition=(
                    "middle left"
                    if math.log10(max(x, 1e-30)) > (xr[0] + xr[1]) / 2
                    else "middle right"
                ),
                marker={"size": 13, "color": color, "line": {"width": 1, "color": "#222"}},
                hovertemplate=hover,
                meta={"phase": name, "kind": "measured"},
            )
        )
        if pred:
            fig.add_trace(
                go.Scatter(
                    x=[x, x],
                    y=[y, pred],
                    mode="lines+markers",
                    name=f"{esc(name)} predicted (speed of light)",
                    line={"color": color, "dash": "dot", "width": 1},
                    marker={"symbol": ["circle-open", "diamond-open"], "size": [1, 12]},
                    hovertemplate=(
                        f"<b>{esc(name)}</b> predicted at speed of light<br>"
                        f"{fmt_si(pred, 'FLOP/s')} (efficiency "
                        f"{fmt_pct(p.efficiency)})<extra></extra>"
                    ),
                    meta={"phase": name, "kind": "predicted"},
                )
            )
    dev = (roof.device.name if roof.device else None) or "device"
    src = run_c.source or "?"
    decades = range(math.floor(xr[0]), math.ceil(xr[1]) + 1)
    fig.update_xaxes(
        type="log",
        range=xr,
        title_text="arithmetic intensity (FLOP/byte)",
        # One labelled tick per decade (plotly's log axis labels every 2..9 otherwise).
        tickvals=[10.0**e for e in decades],
        ticktext=[fmt_num(10.0**e) for e in decades],
    )
    fig.update_yaxes(
        type="log",
        # Head room above the peak for the (staggered) ridge labels.
        range=(
            yr := [
                _log_range([y_lo, y_top], pad=0.3)[0],
                _log_range([y_lo, y_top], pad=0.3)[1] + 0.35 * max(1, len(ridges)),
            ]
        ),
        title_text="attainable FLOP/s",
        **si_log_ticks(yr, "FLOP/s"),
    )
    # "(calibrated)" is already in a calibrated device's name: say it once.
    title = f"Roofline on {esc(dev)}" + ("" if f"({src})" in dev else f" (ceilings: {esc(src)})")
    fig.update_layout(
        **FIGURE_LAYOUT,
        title={"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        height=480,
    )
    return fig


# ---------------------------------------------------------------------- latency


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


# ---------------------------------------------------------------------- timeline


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
    kw: dict[str, Any] = {"row": row, "col": 1} if row is not None else {}
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


def _state_counts(s: _Segments, n_points: int = MAX_SERIES_POINTS) -> dict[str, Any]:
    """Requests queued, in prefill, decoding at each of ``n_points`` instants."""
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


# ---------------------------------------------------------------------- throughput


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


# ---------------------------------------------------------------------- over time


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


def offered_achieved_figure(requests: pd.DataFrame, load: dict[str, Any]) -> go.Figure:
    """Cumulative requests sent and completed over time (counts, y; seconds, x), with the
    offered and achieved rates (requests/s) in the legend."""
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
    offered = load.get("rate")
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


# ---------------------------------------------------------------------- phases, advice


def phase_breakdown_figure(summary: Summary | Mapping[str, Any]) -> go.Figure | None:
    """Per-phase time (s), FLOPs, bytes and energy (J), from the roofline, step and energy
    sections of the summary; ``None`` when the run has no phase data."""
    typed = as_summary(summary)
    roof = typed.roofline.phases
    e_phases = typed.energy.phases if typed.energy.available else {}
    panels: list[tuple[str, dict[str, float]]] = []
    time_s = (
        {k: finite(p.time_s) for k, p in roof.items()}
        if roof
        else {k: finite(st.time_s) for k, st in typed.steps.items()}
    )
    panels.append(("time (s)", {k: v for k, v in time_s.items() if v is not None}))
    panels.append(("FLOPs", {k: v for k, p in roof.items() if (v := finite(p.flops))}))
    panels.append(("bytes moved", {k: v for k, p in roof.items() if (v := finite(p.bytes))}))
    panels.append(("energy (J)", {k: v for k, e in e_phases.items() if (v := finite(e.energy_j))}))
    panels = [(t, d) for t, d in panels if d]
    if not panels:
        return None
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for t, _ in panels])
    units = {"time (s)": "s", "FLOPs": "FLOP", "bytes moved": "B", "energy (J)": "J"}
    for i, (title, data) in enumerate(panels, start=1):
        names = list(data)
        unit = units.get(title, "")
        fig.add_trace(
            go.Bar(
                x=names,
                y=[data[k] for k in names],
                marker={"color": [_COLORS.get(k, "#bab0ac") for k in names]},
                name=title,
                showlegend=False,
                text=[fmt_si(data[k], unit) for k in names],
                textposition="auto",
                hovertemplate="%{x}: %{y:.4s}" + unit + "<extra>" + title + "</extra>",
                meta={"panel": title},
            ),
            row=1,
            col=i,
        )
        fig.update_yaxes(exponentformat="SI", minexponent=0, ticksuffix=unit, row=1, col=i)
    fig.update_layout(**FIGURE_LAYOUT, height=340, title={"text": "Per-phase breakdown"})
    return fig


def advice_figure(summary: Summary | Mapping[str, Any]) -> go.Figure | None:
    """Projected gains of the advisor's suggestions that are speed-ups (``x ...`` units)."""
    rows = []
    for a in as_summary(summary).advice:
        g = a.projected_gain
        v, unit = finite(g.value), str(g.unit or "")
        low = finite(g.low)
        if v is not None and unit.startswith("x "):
            span = f"{low:.2f}–{v:.2f}" if low is not None and low < v else f"{v:.2f}"
            rows.append((esc(a.technique or "?"), v, esc(unit), span))
    if not rows:
        return None
    rows.reverse()
    fig = go.Figure(
        go.Bar(
            x=[r[1] for r in rows],
            y=[r[0] for r in rows],
            orientation="h",
            text=[f"{r[3]}{r[2]}" for r in rows],
            textposition="auto",
            marker={"color": _COLORS["predicted"]},
            hovertemplate="%{y}: %{text}<extra></extra>",
        )
    )
    fig.add_vline(x=1.0, line={"color": "#888", "dash": "dot"})
    fig.update_layout(
        **FIGURE_LAYOUT,
        height=140 + 34 * len(rows),
        title={"text": "Advisor: projected gain (x, what-if model)"},
    )
    fig.update_xaxes(title_text="projected factor")
    return fig


# ---------------------------------------------------------------------- comparison


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


def comparison_roofline_figure(
    labels: Sequence[str], summaries: Sequence[Summary | Mapping[str, Any]]
) -> go.Figure | None:
    """Measured phase points of several runs on one log-log roofline, with each distinct
    device's ceilings (compute flat, DRAM slope) drawn once; ``None`` when no run has a
    roofline."""
    fig = go.Figure()
    xs: list[float] = []
    ys: list[float] = []
    roofs: dict[str, tuple[float, float]] = {}
    for j, (label, summary) in enumerate(zip(labels, summaries, strict=True)):
        roof = as_summary(summary).roofline
        if not roof.available:
            continue
        color = _PALETTE[j % len(_PALETTE)]
        dev = (roof.device.name if roof.device else None) or "device"
        for phase, p in roof.phases.items():
            x, y = finite(p.intensity), finite(p.achieved_flops_s)
            c = _ceilings_of(p, roof)
            peak, bw = finite(c.peak_flops), finite(c.mem_bw_bytes_s)
            if peak and bw:
                roofs.setdefault(f"{dev} ({c.dtype or '?'})", (peak, bw))
            if x is None or y is None or x <= 0 or y <= 0:
                continue
            xs.append(x)
            ys.append(y)
            fig.add_trace(
                go.Scatter(
                    x=[x],
                    y=[y],
                    mode="markers",
                    marker={
                        "size": 12,
                        "color": color,
                        "symbol": "circle" if phase == "decode" else "diamond",
                    },
                    name=f"{esc(label)} · {esc(str(phase))}",
                    legendgroup=str(j),
                    hovertemplate=(
                        f"{esc(label)} {esc(str(phase))}: %{{x:.3g}} FLOP/B, "
                        f"%{{y:.3g}} FLOP/s; MFU {fmt_pct(p.mfu)}, "
                        f"MBU {fmt_pct(p.mbu)}<extra></extra>"
                    ),
                )
            )
    if not xs:
        return None
    for peak, bw in roofs.values():
        xs.append(peak / bw)
        ys.append(peak)
    xr = _log_range(xs, pad=0.8)
    x_lo, x_hi = 10 ** xr[0], 10 ** xr[1]
    for i, (name, (peak, bw)) in enumerate(roofs.items()):
        roof_lines = roofline_ceilings(peak, bw, x_lo, x_hi)
        if roof_lines is None:
            continue
        fig.add_trace(
            go.Scatter(
                x=[*roof_lines.memory_x, x_hi],
                y=[*roof_lines.memory_y, peak],
                mode="lines",
                line={"color": "#555" if i == 0 else "#aaa", "dash": "solid" if i == 0 else "dash"},
                name=f"roof: {esc(name)}",
                hovertemplate=(
                    f"{esc(name)}: {fmt_si(peak, 'FLOP/s')}, {fmt_si(bw, 'B/s')}<extra></extra>"
                ),
            )
        )
    # Decade ticks with SI prefixes and units (plotly's default log labels read "100B/10B").
    yr = _log_range(ys, pad=0.3)
    decades = range(math.floor(xr[0]), math.ceil(xr[1]) + 1)
    fig.update_xaxes(
        type="log",
        range=xr,
        title_text="arithmetic intensity (FLOP/byte)",
        tickvals=[10.0**e for e in decades],
        ticktext=[fmt_num(10.0**e) for e in decades],
    )
    fig.update_yaxes(
        type="log", range=yr, title_text="attainable FLOP/s", **si_log_ticks(yr, "FLOP/s")
    )
    fig.update_layout(**FIGURE_LAYOUT, height=480, title={"text": "Roofline points compared"})
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


# ---------------------------------------------------------------------- all of a run


def run_figures(run: RunTables, *, timeline_max_rows: int = TIMELINE_MAX_ROWS) -> list[FigureSpec]:
    """Every figure of one run, in report order, with captions and reasons for absences."""
    s = as_summary(run.summary)
    roof = s.roofline
    roof_fig = roofline_figure(s)
    if roof_fig is None:
        absent = not isinstance(run.summary, Summary) and "roofline" not in run.summary
        why = "the summary has no roofline section" if absent else roof.reason
        roof_missing: str | None = f"roofline not available: {why or 'no phase data'}"
    else:
        roof_missing = None
    tele = run.telemetry
    has_tele = tele is not None and not tele.empty
    out = [
        FigureSpec(
            "roofline",
            "Roofline",
            "Measured points (filled) per phase against the device's ceilings; the hollow "
            "diamond above each is the cost model's prediction at speed of light. "
            f"FLOPs counted {roof.flops_convention or 'as executed'}.",
            roof_fig,
            roof_missing,
        ),
        FigureSpec(
            "latency",
            "Latency distributions",
            "Empirical CDFs of completed, non-warmup requests; diamonds are the summary's "
            "p50/p90/p99, dashed red lines the SLOs. ITL pools the gaps between chunks.",
            latency_cdf_figure(s, run.requests, run.chunks, rows=getattr(run, "rows", None)),
        ),
        FigureSpec(
            "timeline",
            "Request timeline",
            "Each row is one request: queued (grey), prefill (orange; 'waiting for first "
            "token' when the engine reports no steps), decode (blue); x marks a failure.",
            timeline_figure(run.requests, run.steps, max_rows=timeline_max_rows),
        ),
        FigureSpec(
            "throughput",
            "Throughput over time",
            "Output tokens per second in fixed bins and requests in flight"
            + ("; telemetry below on the same time axis." if has_tele else "; no telemetry."),
            throughput_figure(run.requests, run.chunks, tele if has_tele else None),
        ),
    ]
    phase = phase_breakdown_figure(s)
    out.append(
        FigureSpec(
            "phases",
            "Per-phase breakdown",
            "Time, FLOPs, bytes and energy of each phase as the analysis attributed them.",
            phase,
            None if phase is not None else "no per-phase data (no steps and no roofline)",
        )
    )
    out.insert(
        2,
        FigureSpec(
            "latency-over-time",
            "Latency over time",
            "TTFT and end-to-end latency of each completed request against the time it "
            "finished; a rising trend is a queue building up.",
            latency_over_time_figure(run.requests),
        ),
    )
    out.insert(
        3,
        FigureSpec(
            "offered-achieved",
            "Offered and achieved rate",
            "Requests sent and requests completed so far; the slopes are the offered and the "
            "achieved rate, and a widening gap is a backlog.",
            offered_achieved_figure(run.requests, s.load or {}),
        ),
    )
    adv = advice_figure(s)
    if adv is not None:
        out.append(
            FigureSpec(
                "advice",
                "Advice: projected gains",
                "Each bar re-runs the what-if model with the technique applied.",
                adv,
            )
        )
    for spec in out:
        if spec.figure is not None:
            # SI prefixes (k, M, G), never plotly's "B" for billions, which reads as bytes.
            spec.figure.update_xaxes(exponentformat="SI", automargin=True)
            spec.figure.update_yaxes(exponentformat="SI", automargin=True)
    return out
