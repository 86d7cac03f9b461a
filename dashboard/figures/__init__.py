"""Figure builders shared by the HTML report, the comparison and the dashboard.

Every figure is built from a run's summary.json and its Parquet tables; the numbers the
summary already holds (percentiles, MFU/MBU, ceilings, energy) are plotted as they are and
never recomputed. The tables supply what a summary cannot hold: per-request distributions
(through :func:`perfscope.analysis.metrics.per_request` and ``itl_gaps``), the timeline and
time series.

One module per kind of figure, each with its single-run and its compared form:
:mod:`~perfscope.dashboard.figures.roofline`, :mod:`~perfscope.dashboard.figures.latency`,
:mod:`~perfscope.dashboard.figures.timeline`, :mod:`~perfscope.dashboard.figures.throughput`,
:mod:`~perfscope.dashboard.figures.phases` (phases and advice); :mod:`.common` holds the
layout, colours and limits they share and :mod:`.run` puts one run's figures in report order.

Conventions: latencies are shown in milliseconds, time axes in seconds since the run's
start, FLOP/s and bytes in SI units. Every string that comes from the user or a server
(run names, error texts) is HTML-escaped before plotly sees it, because plotly renders a
subset of HTML in titles, legends and hover labels. Large runs are downsampled so a figure
stays small: CDFs keep at most :data:`MAX_CDF_POINTS` points, the timeline switches to a
density view above ``max_rows`` requests, time series keep at most
:data:`MAX_SERIES_POINTS` points.
"""

from __future__ import annotations

from perfscope.dashboard.figures.common import (
    FIGURE_LAYOUT,
    LATENCY_METRICS,
    MAX_CDF_POINTS,
    MAX_SERIES_POINTS,
    TIMELINE_MAX_ROWS,
    FigureSpec,
    RunTables,
)
from perfscope.dashboard.figures.latency import (
    comparison_cdf_figure,
    comparison_metrics_figure,
    latency_cdf_figure,
    latency_over_time_figure,
    latency_values,
)
from perfscope.dashboard.figures.phases import advice_figure, phase_breakdown_figure
from perfscope.dashboard.figures.roofline import (
    comparison_roofline_figure,
    roofline_figure,
    si_log_ticks,
)
from perfscope.dashboard.figures.run import run_figures
from perfscope.dashboard.figures.throughput import (
    comparison_throughput_figure,
    offered_achieved_figure,
    throughput_figure,
)
from perfscope.dashboard.figures.timeline import timeline_figure

__all__ = [
    "FIGURE_LAYOUT",
    "LATENCY_METRICS",
    "MAX_CDF_POINTS",
    "MAX_SERIES_POINTS",
    "TIMELINE_MAX_ROWS",
    "FigureSpec",
    "RunTables",
    "advice_figure",
    "comparison_cdf_figure",
    "comparison_metrics_figure",
    "comparison_roofline_figure",
    "comparison_throughput_figure",
    "latency_cdf_figure",
    "latency_over_time_figure",
    "latency_values",
    "offered_achieved_figure",
    "phase_breakdown_figure",
    "roofline_figure",
    "run_figures",
    "si_log_ticks",
    "throughput_figure",
    "timeline_figure",
]
