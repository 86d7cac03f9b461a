"""Per-phase breakdown (time, FLOPs, bytes, energy) and the advisor's projected gains."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from perfscope.analysis.summary import Summary
from perfscope.dashboard._fmt import esc, finite, fmt_si
from perfscope.dashboard.figures.common import (
    _COLORS,
    FIGURE_LAYOUT,
)
from perfscope.dashboard.view import as_summary

__all__ = ["advice_figure", "phase_breakdown_figure"]


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
