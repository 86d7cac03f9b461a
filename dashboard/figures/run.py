"""Every figure of one run, in report order, with captions and reasons for absences."""

from __future__ import annotations

from perfscope.analysis.summary import Summary
from perfscope.dashboard.figures.common import (
    TIMELINE_MAX_ROWS,
    FigureSpec,
    RunTables,
)
from perfscope.dashboard.figures.latency import latency_cdf_figure, latency_over_time_figure
from perfscope.dashboard.figures.phases import advice_figure, phase_breakdown_figure
from perfscope.dashboard.figures.roofline import roofline_figure
from perfscope.dashboard.figures.throughput import offered_achieved_figure, throughput_figure
from perfscope.dashboard.figures.timeline import timeline_figure
from perfscope.dashboard.view import as_summary

__all__ = ["run_figures"]


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
