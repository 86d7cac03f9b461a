"""Sweeps page (``/sweeps?sweep=ID``): throughput-latency curves and goodput against the
offered load, for the sweeps ``perfscope sweep`` wrote.

``perfscope sweep`` stores one run directory per point and a sweep summary
(``perfscope.sweep/1``, from :func:`perfscope.analysis.sweep.summarize_sweep`) at
``<runs dir>/sweeps/<stamp>-<name>.json``; its ``points`` carry the per-point numbers (and
the run directory), its ``knee`` and ``max_goodput_rate`` are plotted as they are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import SupportsFloat, SupportsIndex, TypedDict

import plotly.graph_objects as go
from dash import Dash, Input, Output, dcc, html
from dash.dash_table.DataTable import DataTable
from plotly.subplots import make_subplots

from perfscope.analysis.catalogue import format_number, format_ratio, format_seconds
from perfscope.analysis.sweep import SweepPoint, SweepSummary
from perfscope.dashboard._fmt import esc
from perfscope.dashboard.app.data import RUN_ID_PATTERN, InvalidRunIdError, inside_root
from perfscope.dashboard.app.pages._common import (
    CARD_STYLE,
    TABLE_CELL,
    TABLE_HEADER,
    DashboardContext,
    Page,
    PageRequest,
    column,
    data_table,
    error_box,
    figure_block,
    note,
)
from perfscope.dashboard.figures import FIGURE_LAYOUT
from perfscope.errors import RunNotFoundError

__all__ = ["PAGE", "goodput_figure", "list_sweeps", "load_sweep", "sweep_curve_figure"]

SWEEPS_DIR = "sweeps"
_LAT = (
    ("ttft_p50", "TTFT p50", "#f28e2b", "solid"),
    ("ttft_p99", "TTFT p99", "#f28e2b", "dash"),
    ("tpot_p50", "TPOT p50", "#4e79a7", "solid"),
    ("tpot_p99", "TPOT p99", "#4e79a7", "dash"),
    ("e2e_p50", "E2E p50", "#59a14f", "solid"),
    ("e2e_p99", "E2E p99", "#59a14f", "dash"),
)


def list_sweeps(dctx: DashboardContext) -> list[str]:
    """Sweep ids (file stems under ``<runs dir>/sweeps``), newest first."""
    d = dctx.runs_dir / SWEEPS_DIR
    try:
        names = [p.stem for p in d.iterdir() if p.suffix == ".json" and p.is_file()]
    except OSError:
        return []
    return sorted((n for n in names if RUN_ID_PATTERN.fullmatch(n)), reverse=True)


def load_sweep(dctx: DashboardContext, sweep_id: str) -> SweepSummary:
    """A sweep summary by id (validated like a run id).

    Raises:
        InvalidRunIdError: the id is not a plain file stem.
        RunNotFoundError: no such sweep, or unreadable.
    """
    if not isinstance(sweep_id, str) or not RUN_ID_PATTERN.fullmatch(sweep_id) or ".." in sweep_id:
        raise InvalidRunIdError(f"invalid sweep id {repr(sweep_id)[:80]}")
    path = dctx.runs_dir / SWEEPS_DIR / f"{sweep_id}.json"
    if not inside_root(dctx.runs_dir, path):
        raise InvalidRunIdError(f"sweep {sweep_id!r} points outside the runs directory; not read")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunNotFoundError(f"no sweep {sweep_id!r} in {str(path.parent)!r}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunNotFoundError(f"sweep {sweep_id!r} is unreadable: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise RunNotFoundError(f"sweep {sweep_id!r} has no points")
    if not all(isinstance(p, dict) for p in data["points"]) or not isinstance(
        data.get("knee"), dict | None
    ):
        raise RunNotFoundError(
            f"sweep {sweep_id!r} is malformed: a point or its knee is not an object"
        )
    return SweepSummary.from_dict(data)


def _f(x: object) -> float | None:
    """``x`` as a float (a number, or a number as text); ``None`` for anything else or NaN."""
    if not isinstance(x, str | SupportsFloat | SupportsIndex):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None


def _offered_label(kind: str) -> str:
    return "offered rate (req/s)" if kind == "rate" else "concurrency (users)"


def sweep_curve_figure(summary: SweepSummary) -> go.Figure:
    """Latency percentiles (ms) against achieved throughput (req/s), one point per sweep
    point, labelled with its offered load; the knee is circled."""
    pts = summary.points
    kind = str(summary.kind or "rate")
    knee = summary.knee
    fig = go.Figure()
    x = [_f(p.req_s) for p in pts]
    offered = [format_number(p.offered) for p in pts]
    load_name = "rate" if kind == "rate" else "concurrency"
    for key, label, color, dash in _LAT:
        y = [(_f(p.column(key)) or float("nan")) * 1e3 for p in pts]
        if all(v != v for v in y):
            continue
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines+markers",
                name=label,
                line={"color": color, "dash": dash},
                customdata=offered,
                hovertemplate=(
                    f"{label} %{{y:.2f}} ms at %{{x:.3g}} req/s ({load_name} "
                    "%{customdata})<extra></extra>"
                ),
            )
        )
    if knee:
        metric = str(knee.metric or "e2e_p50")
        column = metric if metric in SweepPoint.field_names() else "e2e_p50"
        kx, ky = _f(knee.point.req_s), _f(knee.point.column(column))
        if kx is not None and ky is not None:
            fig.add_trace(
                go.Scatter(
                    x=[kx],
                    y=[ky * 1e3],
                    mode="markers+text",
                    marker={"size": 18, "symbol": "circle-open", "color": "#e15759"},
                    text=[f"knee ({esc(metric)})"],
                    textposition="top left",
                    name="knee",
                )
            )
    fig.update_layout(
        **FIGURE_LAYOUT,
        height=420,
        title={"text": "Throughput-latency curve"},
    )
    fig.update_xaxes(title_text="achieved throughput (req/s)")
    fig.update_yaxes(title_text="latency (ms)", rangemode="tozero")
    return fig


def goodput_figure(summary: SweepSummary) -> go.Figure:
    """Achieved throughput and goodput (req/s) against the offered load, SLO attainment on
    the right axis with the 90 % target; ``max_goodput_rate`` marked."""
    pts = summary.points
    kind = str(summary.kind or "rate")
    x = [_f(p.offered) for p in pts]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[_f(p.req_s) for p in pts],
            mode="lines+markers",
            name="achieved req/s",
            line={"color": "#4e79a7"},
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[_f(p.goodput_req_s) for p in pts],
            mode="lines+markers",
            name="goodput req/s",
            line={"color": "#59a14f"},
        ),
        secondary_y=False,
    )
    if kind == "rate":
        lo, hi = (
            min((v for v in x if v is not None), default=0),
            max((v for v in x if v is not None), default=1),
        )
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo, hi],
                mode="lines",
                name="offered = achieved",
                line={"color": "#bbb", "dash": "dot"},
            ),
            secondary_y=False,
        )
    att = [_f(p.attainment) for p in pts]
    if any(a is not None for a in att):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[None if a is None else a * 100 for a in att],
                mode="lines+markers",
                name="SLO attainment %",
                line={"color": "#f28e2b", "dash": "dash"},
            ),
            secondary_y=True,
        )
        target = _f(summary.attainment_target)
        if target is not None:
            fig.add_hline(
                y=target * 100,
                line={"color": "#f28e2b", "dash": "dot", "width": 1},
                secondary_y=True,
            )
    key = "max_goodput_rate" if kind == "rate" else "max_goodput_concurrency"
    best = _f(summary.max_goodput)
    if best is not None:
        fig.add_vline(x=best, line={"color": "#e15759", "dash": "dash"})
        fig.add_annotation(
            x=best,
            y=1.0,
            yref="paper",
            yanchor="bottom",
            xanchor="left",
            text=f"{key} = {format_number(best)}",
            showarrow=False,
        )
    fig.update_layout(
        **{**FIGURE_LAYOUT, "margin": {"l": 60, "r": 60, "t": 50, "b": 50}},
        height=420,
        title={"text": "Goodput against offered load"},
    )
    fig.update_xaxes(title_text=_offered_label(kind), **_count_ticks(kind, x))
    fig.update_yaxes(title_text="requests/s", secondary_y=False, rangemode="tozero")
    # Round percentages on the right axis, with no second grid over the left one's.
    fig.update_yaxes(
        title_text="SLO attainment (%)",
        secondary_y=True,
        range=[0, 105],
        tickmode="array",
        tickvals=[0, 25, 50, 75, 100],
        showgrid=False,
    )
    return fig


class AxisTicks(TypedDict, total=False):
    """Tick settings of a plotly axis: values at ``tickvals``, written as ``ticktext``."""

    tickmode: str
    tickvals: list[int]
    ticktext: list[str]


def _count_ticks(kind: str, x: list[float | None]) -> AxisTicks:
    """Concurrency is a count: ticks at the tested values, as integers."""
    if kind == "rate":
        return {}
    vals = sorted({int(v) for v in x if v is not None})
    return {"tickmode": "array", "tickvals": vals, "ticktext": [f"{v:,}" for v in vals]}


def _points_table(dctx: DashboardContext, summary: SweepSummary) -> DataTable:
    kind = str(summary.kind or "rate")
    rows = []
    root = dctx.runs_dir.resolve()
    for p in summary.points:
        run = p.run
        link = ""
        if run:
            rp = Path(str(run))
            if RUN_ID_PATTERN.fullmatch(rp.name) and (root / rp.name).is_dir():
                link = f"[{rp.name}](/run/{rp.name})"

        def sec(k: str, p: SweepPoint = p) -> str:
            return format_seconds(p.column(k))

        has_slos = bool(summary.slos)
        rows.append(
            {
                "offered": format_number(p.offered),
                "req_s": format_number(p.req_s),
                "output_tok_s": format_number(p.output_tok_s),
                "ttft_p50": sec("ttft_p50"),
                "ttft_p99": sec("ttft_p99"),
                "tpot_p50": sec("tpot_p50"),
                "e2e_p99": sec("e2e_p99"),
                "attainment": format_ratio(p.attainment) if has_slos else "no SLOs",
                "status": str(p.status or ""),
                "run": link,
            }
        )
    cols = [
        ("offered", _offered_label(kind)),
        ("req_s", "done req/s"),
        ("output_tok_s", "out tok/s"),
        ("ttft_p50", "TTFT p50"),
        ("ttft_p99", "TTFT p99"),
        ("tpot_p50", "TPOT p50"),
        ("e2e_p99", "E2E p99"),
        ("attainment", "SLO met"),
        ("status", "status"),
        ("run", "run"),
    ]
    return data_table(
        id="sweeps-points",
        columns=[column(c, n, markdown=c == "run") for c, n in cols],
        data=rows,
        markdown_options={"link_target": "_self"},
        css=[{"selector": ".dash-cell p", "rule": "margin: 0"}],
        style_cell=TABLE_CELL,
        style_header=TABLE_HEADER,
    )


def sweep_body(dctx: DashboardContext, sweep_id: str | None) -> html.Div:
    """Figures and point table of one sweep."""
    if not sweep_id:
        return note("No sweep selected.")
    try:
        summary = load_sweep(dctx, sweep_id)
    except (InvalidRunIdError, RunNotFoundError) as exc:
        return error_box(str(exc))
    kind = str(summary.kind or "rate")
    key = "max_goodput_rate" if kind == "rate" else "max_goodput_concurrency"
    knee = summary.knee
    good = summary.max_goodput
    facts = [
        f"engine {summary.engine or '?'}",
        f"{len(summary.points)} points ({kind})",
        "SLOs "
        + (
            ", ".join(f"{k} ≤ {format_seconds(v)}" for k, v in (summary.slos or {}).items())
            or "none"
        ),
        f"{key} {format_number(good)}"
        if good is not None
        else f"{key} n/a ({'no point met 90% of SLOs' if summary.slos else 'no SLOs'})",
        f"knee at {format_number(knee.point.offered)}" if knee else "no knee in the range tested",
        f"max {format_number(summary.max_req_s)} req/s",
    ]
    return html.Div(
        [
            html.Div(" · ".join(facts), id="sweeps-facts", style=CARD_STYLE),
            figure_block("sweeps-fig-curve", "Throughput-latency", sweep_curve_figure(summary)),
            figure_block("sweeps-fig-goodput", "Goodput", goodput_figure(summary)),
            html.Div([html.H3("Points"), _points_table(dctx, summary)], style=CARD_STYLE),
        ]
    )


def layout(dctx: DashboardContext, req: PageRequest) -> html.Div:
    sweeps = list_sweeps(dctx)
    chosen = req.get("sweep") or (sweeps[0] if sweeps else None)
    if not sweeps:
        return html.Div(
            [
                html.H2("Sweeps"),
                note(
                    f"No sweeps in {dctx.runs_dir / SWEEPS_DIR}. Run 'perfscope sweep ENGINE "
                    "--rates 1,2,4' (or --concurrencies) to make one."
                ),
            ]
        )
    return html.Div(
        [
            html.H2("Sweeps"),
            dcc.Dropdown(
                id="sweeps-select",
                options=[{"label": s, "value": s} for s in sweeps],
                value=chosen,
                clearable=False,
            ),
            html.Div(sweep_body(dctx, chosen), id="sweeps-body"),
        ]
    )


def register(app: Dash, dctx: DashboardContext) -> None:
    @app.callback(
        Output("sweeps-body", "children"),
        Input("sweeps-select", "value"),
        prevent_initial_call=True,
    )
    def show_sweep(sweep_id: str | None) -> html.Div:
        return sweep_body(dctx, sweep_id)


PAGE = Page(key="sweeps", path="/sweeps", title="Sweeps", layout=layout, register=register)
