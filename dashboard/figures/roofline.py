"""The roofline: a run's phases against its device's ceilings, and several runs on one
roofline (log-log; FLOP/s against FLOP/byte)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import plotly.graph_objects as go

from perfscope.analysis.summary import RooflineCeilings, Summary
from perfscope.dashboard._fmt import esc, finite, fmt_num, fmt_pct, fmt_si
from perfscope.dashboard.figures.common import (
    _COLORS,
    _PALETTE,
    FIGURE_LAYOUT,
    _ceilings_of,
)
from perfscope.dashboard.view import as_summary, roofline_ceilings

__all__ = ["LogTicks", "comparison_roofline_figure", "roofline_figure", "si_log_ticks"]


class LogTicks(TypedDict):
    """A log axis's ticks as plotly's axis properties: the values and their labels."""

    tickvals: list[float]
    ticktext: list[str]


def si_log_ticks(log_range: Sequence[float], unit: str) -> LogTicks:
    """``tickvals``/``ticktext`` for a log axis spanning ``log_range`` (log10 units): one
    tick per decade labelled with an SI prefix and the unit (``1 PFLOP/s``), since plotly's
    own SI format stops at T and falls back to ``10^15``."""
    lo, hi = math.floor(log_range[0]), math.ceil(log_range[1])
    vals = [10.0**e for e in range(lo, hi + 1)]
    return {"tickvals": vals, "ticktext": [fmt_si(v, unit) for v in vals]}


def _intensity_axis(fig: go.Figure, xr: Sequence[float]) -> None:
    """The log x axis of arithmetic intensity (FLOP/byte) over ``xr`` (log10 bounds), with
    one labelled tick per decade (plotly's log axis labels every 2..9 otherwise)."""
    decades = range(math.floor(xr[0]), math.ceil(xr[1]) + 1)
    fig.update_xaxes(
        type="log",
        range=list(xr),
        title_text="arithmetic intensity (FLOP/byte)",
        tickvals=[10.0**e for e in decades],
        ticktext=[fmt_num(10.0**e) for e in decades],
    )


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
    _intensity_axis(fig, xr)
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
    _intensity_axis(fig, xr)
    fig.update_yaxes(
        type="log", range=yr, title_text="attainable FLOP/s", **si_log_ticks(yr, "FLOP/s")
    )
    fig.update_layout(**FIGURE_LAYOUT, height=480, title={"text": "Roofline points compared"})
    return fig
