"""What every figure module shares: the layout, colours, point limits, the record of a
run's tables (:class:`RunTables`) and of one report figure (:class:`FigureSpec`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import pandas as pd
import plotly.graph_objects as go

from perfscope.analysis.summary import PhaseRoofline, Roofline, RooflineCeilings, Summary
from perfscope.dashboard._fmt import esc

__all__ = [
    "FIGURE_LAYOUT",
    "LATENCY_METRICS",
    "MARKER_PERCENTILES",
    "MAX_CDF_POINTS",
    "MAX_SERIES_POINTS",
    "TIMELINE_MAX_ROWS",
    "FigureLayout",
    "FigureSpec",
    "RunTables",
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


class _Legend(TypedDict):
    orientation: str
    yanchor: str
    y: float
    x: float
    xanchor: str


class FigureLayout(TypedDict):
    """Plotly layout properties (passed as keyword arguments to ``update_layout``)."""

    template: str
    margin: dict[str, int]  # l, r, t, b in pixels
    font: dict[str, int]
    legend: _Legend


#: Layout every perfscope figure starts from (report and dashboard alike).
FIGURE_LAYOUT: FigureLayout = {
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
