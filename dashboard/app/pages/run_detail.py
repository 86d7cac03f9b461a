"""Run detail page (``/run/<run id>``): every figure of the report, interactive.

The figures come from :func:`perfscope.dashboard.figures.run_figures` (the same builders as
the HTML report), built once per run and cached. What only a live page adds:

* the request timeline and the throughput/telemetry figure share one time range: zoom or
  select on one and the other follows (a ``Patch`` of the other figure's x axes, so the
  figure is never sent back to the server);
* a request table paged and sorted on the server (a 10,000-request run sends 15 rows at a
  time), and a drill-down to one request's token arrivals.
"""

from __future__ import annotations

import math
import re
from typing import SupportsFloat, TypedDict

import numpy as np
import plotly.graph_objects as go
from dash import Dash, Input, NoUpdate, Output, Patch, State, dcc, html, no_update
from dash.development.base_component import Component

from perfscope.analysis.summary import Summary
from perfscope.dashboard._fmt import esc
from perfscope.dashboard.app.data import LoadedRun, per_request_frame
from perfscope.dashboard.app.pages._common import (
    CARD_STYLE,
    GRAPH_CONFIG,
    TABLE_CELL,
    TABLE_HEADER,
    ColumnType,
    DashboardContext,
    Page,
    PageRequest,
    column,
    data_table,
    error_box,
    figure_block,
    note,
    sort_keys,
)
from perfscope.dashboard.figures import FIGURE_LAYOUT, FigureSpec
from perfscope.dashboard.queueing import queueing_line
from perfscope.dashboard.view import as_summary, headline_cards, latency_rows, throughput_rows
from perfscope.errors import PerfscopeError
from perfscope.jsontypes import JsonArray, JsonObject, JsonValue, json_float

__all__ = [
    "PAGE",
    "RequestRow",
    "advice_block",
    "axis_patch",
    "linked_range",
    "request_figure",
    "requests_page",
]

#: Figures whose x axis is time since run start and which follow each other's range.
LINKED = ("timeline", "throughput")
REQUEST_PAGE_SIZE = 15
_REQ_COLUMNS: tuple[tuple[str, str, ColumnType], ...] = (
    ("request_id", "request", "numeric"),
    ("prompt_tokens", "prompt tok", "numeric"),
    ("output_tokens", "output tok", "numeric"),
    ("ttft_ms", "TTFT ms", "numeric"),
    ("tpot_ms", "TPOT ms", "numeric"),
    ("e2e_ms", "E2E ms", "numeric"),
    ("warmup", "warmup", "text"),
    ("error", "error", "text"),
)
_SORTABLE = {
    "request_id": "request_id",
    "prompt_tokens": "prompt_tokens",
    "output_tokens": "output_tokens",
    "ttft_ms": "ttft",
    "tpot_ms": "tpot",
    "e2e_ms": "e2e",
}
_X_KEY = re.compile(r"^(xaxis\d*)\.(range\[0\]|range\[1\]|range|autorange)$")


class RequestRow(TypedDict):
    """One request of the request table: token counts, latencies in ms (``None`` when not
    measured), ``warmup`` ``yes`` or empty, and the error text (empty when it succeeded)."""

    id: int
    request_id: int
    prompt_tokens: int
    output_tokens: int
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    warmup: str
    error: str


def _figures(loaded: LoadedRun) -> list[FigureSpec]:
    from perfscope.dashboard.figures import run_figures

    with loaded.lock:
        if loaded.cache.figures is None:
            loaded.cache.figures = tuple(run_figures(loaded.tables))
        return list(loaded.cache.figures)


def _x_axes(fig: go.Figure | None) -> list[str]:
    if fig is None:
        return []
    names = [k for k in fig.layout.to_plotly_json() if re.fullmatch(r"xaxis\d*", k)]
    return sorted(names) or ["xaxis"]


def _metrics_table(summary: Summary) -> html.Table:
    s = as_summary(summary)
    cells = [(c.title, c.value) for c in headline_cards(s)]
    cells += [
        (f"{r.label} p50 / p99", f"{r.values['p50']} / {r.values['p99']}")
        for r in latency_rows(s, ("itl", "e2e"))
    ]
    cells += [
        (r.label, r.value) for r in throughput_rows(s) if r.metric in ("req_s", "goodput_req_s")
    ]
    cells += [(f"{phase}: verdict", p.verdict or "n/a") for phase, p in s.roofline.phases.items()]
    rows = [html.Tr([html.Th(k, style={"textAlign": "left"}), html.Td(v)]) for k, v in cells]
    return html.Table(html.Tbody(rows), id="detail-metrics", style={"fontSize": "14px"})


def advice_block(summary: Summary) -> html.Div:
    """The advisor's suggestions as text, as the report words them: rank, technique and
    projected gain, why it applies, what the number assumes and how far the studies found
    that kind of projection off (the bar chart above shows only the gains)."""
    from perfscope.dashboard.report import _gain_text

    s = as_summary(summary)
    if not s.advice:
        why = "" if s.roofline.available else f" (no roofline: {s.roofline.reason})"
        return html.Div(
            [html.H3("Advice"), note(f"No suggestions for this run{why}.")],
            id="detail-advice",
            style=CARD_STYLE,
        )
    items = []
    for i, a in enumerate(s.advice, start=1):
        g = a.projected_gain
        parts: list[Component] = [
            html.B(f"{a.technique or '?'}: {_gain_text(g)} {g.unit}".rstrip()),
            html.Div(a.why),
        ]
        if a.assumptions:
            parts.append(html.Div(f"assumes: {a.assumptions}", style={"color": "#555"}))
        if a.calibration is not None and a.calibration.text:
            parts.append(html.Div(f"calibration: {a.calibration.text}", style={"color": "#555"}))
        items.append(html.Li(parts, value=str(a.rank or i), style={"marginBottom": "8px"}))
    return html.Div(
        [html.H3("Advice"), html.Ol(items)],
        id="detail-advice",
        style={**CARD_STYLE, "overflowWrap": "anywhere"},
    )


def layout(ctx_: DashboardContext, req: PageRequest) -> html.Div:
    run_id = req.rest.strip("/")
    try:
        loaded = ctx_.repo.load(run_id)
        specs = _figures(loaded)
    except PerfscopeError as exc:
        return error_box(str(exc), title=f"Run {run_id[:80]!r} cannot be shown")
    m = loaded.manifest
    s = loaded.summary
    hw = (s.hardware.spec or {}).get("name") or "unknown device"
    header = html.Div(
        [
            html.H2(f"Run {loaded.run_id}", id="detail-title"),
            html.Div(
                f"status {m.status or 'unknown'} · engine {m.engine.uri or '?'} · "
                f"hardware {hw} · started {(m.started_at or '?')[:19]}"
            ),
            *(
                [note("summary computed in memory: this run has no summary.json yet")]
                if loaded.summary_computed
                else []
            ),
            *[error_box(e, title="Run error") for e in m.errors[:5]],
            *[
                html.Div(
                    error_box(str(w), title="Measurement warning"),
                    id="detail-contention" if i == 0 else f"detail-warning-{i}",
                )
                for i, w in enumerate(s.warnings)
            ],
            *(
                [html.Div(note(queue + "."), id="detail-queueing")]
                if (queue := queueing_line(s.load_mode, loaded.path))
                else []
            ),
            html.A(
                "summary.json",
                href=f"/api/runs/{loaded.run_id}/summary.json",
                target="_blank",
            ),
            html.Span(" · "),
            dcc.Link("compare with…", href=f"/compare?runs={loaded.run_id}"),
        ],
        style=CARD_STYLE,
    )
    blocks: list[Component] = []
    axes: dict[str, list[str]] = {}
    for spec in specs:
        blocks.append(
            figure_block(
                f"detail-fig-{spec.key}",
                spec.title,
                spec.figure,
                caption=spec.caption,
                missing=spec.missing,
            )
        )
        if spec.key in LINKED:
            axes[spec.key] = _x_axes(spec.figure)
            if spec.key == LINKED[0]:
                blocks.append(
                    note(
                        "Zoom or box-select a time range on the timeline or the throughput "
                        "figure: the other follows. Double-click resets."
                    )
                )
    n_req = len(loaded.tables.requests)
    table = html.Div(
        [
            html.H3("Requests"),
            note(f"{n_req} requests; click a row for its token arrivals."),
            data_table(
                id="detail-requests",
                columns=[column(c, n, t) for c, n, t in _REQ_COLUMNS],
                data=[],
                page_action="custom",
                page_current=0,
                page_size=REQUEST_PAGE_SIZE,
                page_count=max(1, math.ceil(n_req / REQUEST_PAGE_SIZE)),
                sort_action="custom",
                sort_mode="single",
                sort_by=[],
                style_cell=TABLE_CELL,
                style_header=TABLE_HEADER,
                style_data_conditional=[
                    {"if": {"filter_query": '{error} != ""'}, "backgroundColor": "#fdecea"}
                ],
            ),
            html.Div(
                note("No request selected."),
                id="detail-request-view",
            ),
        ],
        style=CARD_STYLE,
    )
    return html.Div(
        [
            dcc.Store(id="detail-run-id", data=loaded.run_id),
            dcc.Store(id="detail-axes", data=axes),
            header,
            html.Div(_metrics_table(s), style=CARD_STYLE),
            html.Div(id="detail-range-text", style={"color": "#555"}),
            *blocks,
            advice_block(s),
            table,
        ]
    )


# ---------------------------------------------------------------------- callbacks' logic


def _axis_value(value: JsonValue) -> float | None:
    """An axis end as plotly sends it (a number, or a number as text); ``None`` otherwise."""
    number = json_float(value)
    if number is None and isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    return number


def linked_range(relayout: JsonObject | None) -> tuple[float, float] | str | None:
    """The x range a plotly ``relayoutData`` event sets: ``(lo, hi)`` in seconds,
    ``"auto"`` for a reset, or ``None`` when the event does not touch an x axis (or sets
    it to something that is not a pair of numbers)."""
    if not relayout:
        return None
    lo: JsonValue = None
    hi: JsonValue = None
    auto = False
    for key, value in relayout.items():
        m = _X_KEY.match(key)
        if not m:
            continue
        part = m.group(2)
        if part == "autorange":
            auto = auto or bool(value)
        elif part == "range" and isinstance(value, list) and len(value) == 2:
            lo, hi = value
        elif part == "range[0]":
            lo = value
        elif part == "range[1]":
            hi = value
    if lo is not None and hi is not None:
        a, b = _axis_value(lo), _axis_value(hi)
        if a is None or b is None:
            return None
        if math.isfinite(a) and math.isfinite(b):
            return (min(a, b), max(a, b))
    return "auto" if auto else None


def requests_page(loaded: LoadedRun, page: int, size: int, sort_by: JsonValue) -> list[RequestRow]:
    """One page of the request table (latencies in ms), sorted on the server by the first
    key of the table's ``sort_by`` (as the browser sent it; a key naming no sortable
    column leaves the table in request order)."""
    frame = per_request_frame(loaded)
    keys = sort_keys(sort_by)
    if keys:
        col = _SORTABLE.get(keys[0].column_id)
        if col is not None and col in frame.columns:
            asc = not keys[0].descending
            frame = frame.sort_values(col, ascending=asc, na_position="last", kind="stable")
    size = max(1, min(int(size or REQUEST_PAGE_SIZE), 200))
    part = frame.iloc[max(0, int(page or 0)) * size :][:size]
    out: list[RequestRow] = []
    for r in part.itertuples(index=False):
        rid = int(str(r.request_id))

        def ms(v: object) -> float | None:
            if not isinstance(v, SupportsFloat):
                return None
            f = float(v)
            return round(f * 1e3, 3) if math.isfinite(f) else None

        err = getattr(r, "error", None)
        err = err if isinstance(err, str) else None
        out.append(
            {
                "id": rid,
                "request_id": rid,
                "prompt_tokens": int(float(str(r.prompt_tokens))),
                "output_tokens": int(float(str(r.output_tokens))),
                "ttft_ms": ms(r.ttft),
                "tpot_ms": ms(r.tpot),
                "e2e_ms": ms(r.e2e),
                "warmup": "yes" if bool(r.is_warmup) else "",
                "error": "" if err is None else str(err)[:200],
            }
        )
    return out


def request_figure(loaded: LoadedRun, request_id: int) -> go.Figure | None:
    """Token arrivals of one request: cumulative tokens against ms since it was sent,
    one marker per streamed chunk, with its queue/first-token/last-token moments."""
    req = loaded.tables.requests
    row = req[req["request_id"] == request_id]
    if row.empty:
        return None
    r = row.iloc[0]
    ch = loaded.tables.chunks
    ch = ch[ch["request_id"] == request_id].sort_values("index")
    t0 = r["t_sent"] if r["t_sent"] == r["t_sent"] else r["t_scheduled"]
    t0 = float(t0)
    x = (ch["t"].to_numpy(dtype=np.float64) - t0) * 1e-6
    y = np.cumsum(ch["n_tokens"].to_numpy(dtype=np.int64))
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=y,
            mode="lines+markers",
            line={"shape": "hv", "color": "#4e79a7"},
            marker={"size": 5},
            name="tokens received",
            customdata=ch["n_tokens"].to_numpy(),
            hovertemplate="%{x:.3f} ms: %{y} tokens (+%{customdata})<extra></extra>",
        )
    )
    if x.size > 1:
        gaps = np.diff(x)
        fig.add_trace(
            go.Bar(
                x=x[1:],
                y=gaps,
                name="gap to previous chunk (ms)",
                yaxis="y2",
                marker={"color": "#f28e2b"},
                opacity=0.5,
                hovertemplate="gap %{y:.3f} ms<extra></extra>",
            )
        )
    sched = float(r["t_scheduled"])
    if math.isfinite(sched) and sched < t0:
        fig.add_vline(x=(sched - t0) * 1e-6, line={"dash": "dot", "color": "#999"})
    err = r["error"]
    title = f"Request {request_id}: {int(r['output_tokens'])} tokens in {len(ch)} chunks"
    if isinstance(err, str):
        title += f" (failed: {esc(err[:80])})"
    fig.update_layout(
        **{
            **FIGURE_LAYOUT,
            "margin": {"l": 60, "r": 60, "t": 50, "b": 50},
            "legend": {"orientation": "h", "y": -0.25},
        },
        height=340,
        title={"text": title},
        xaxis={"title": {"text": "ms since sent"}},
        yaxis={"title": {"text": "tokens received"}},
        yaxis2={"title": {"text": "gap (ms)"}, "overlaying": "y", "side": "right"},
    )
    return fig


def axis_patch(axes: list[str], rng: tuple[float, float] | str) -> Patch:
    """A ``Patch`` setting the x range (or autorange for ``"auto"``) of every x axis of a
    figure; the figure itself never travels back to the server."""
    patch = Patch()
    for ax in axes or ["xaxis"]:
        if isinstance(rng, tuple):
            patch["layout"][ax]["range"] = list(rng)
            patch["layout"][ax]["autorange"] = False
        else:
            patch["layout"][ax]["autorange"] = True
    return patch


def _link(app: Dash, source: str, target: str) -> None:
    """Zooming ``source`` moves ``target``. One callback per direction: Dash drops the
    answer of a callback call that a newer call of the same callback overtook, so a resize
    event of one figure must not share a callback with a zoom of the other."""

    @app.callback(
        Output(f"detail-fig-{target}", "figure", allow_duplicate=True),
        Output("detail-range-text", "children", allow_duplicate=True),
        Input(f"detail-fig-{source}", "relayoutData"),
        State("detail-axes", "data"),
        prevent_initial_call=True,
    )
    def follow(
        relayout: JsonObject | None, axes: JsonObject | None
    ) -> tuple[Patch | NoUpdate, str | NoUpdate]:
        rng = linked_range(relayout)
        if rng is None:
            return no_update, no_update
        text = (
            f"time range {rng[0]:.3f} s – {rng[1]:.3f} s (from the {source} figure)"
            if isinstance(rng, tuple)
            else "full time range"
        )
        names = (axes or {}).get(target)
        # The figure's x axes as the layout stored them; anything else patches ``xaxis``.
        target_axes = [a for a in names if isinstance(a, str)] if isinstance(names, list) else []
        return axis_patch(target_axes, rng), text

    follow.__name__ = f"link_{source}_to_{target}"


def register(app: Dash, dctx: DashboardContext) -> None:
    _link(app, "timeline", "throughput")
    _link(app, "throughput", "timeline")

    @app.callback(
        Output("detail-requests", "data"),
        Input("detail-requests", "page_current"),
        Input("detail-requests", "page_size"),
        Input("detail-requests", "sort_by"),
        State("detail-run-id", "data"),
    )
    def request_rows(
        page: int | None, size: int | None, sort_by: JsonArray | None, run_id: str
    ) -> list[RequestRow]:
        try:
            loaded = dctx.repo.load(str(run_id))
            return requests_page(loaded, int(page or 0), int(size or REQUEST_PAGE_SIZE), sort_by)
        except (PerfscopeError, TypeError, ValueError, AttributeError):
            return []  # a bad run id, page or sort spec shows an empty table, not a 500

    @app.callback(
        Output("detail-request-view", "children"),
        Input("detail-requests", "active_cell"),
        State("detail-run-id", "data"),
        prevent_initial_call=True,
    )
    def drill_down(active_cell: JsonObject | None, run_id: str) -> Component:
        rid = active_cell.get("row_id") if isinstance(active_cell, dict) else None
        if rid is None:
            return note("No request selected.")
        if isinstance(rid, bool) or not isinstance(rid, int | str):
            return error_box(f"invalid request id {repr(rid)[:40]}")
        try:
            loaded = dctx.repo.load(str(run_id))
            fig = request_figure(loaded, int(rid))
        except PerfscopeError as exc:
            return error_box(str(exc))
        except (ValueError, OverflowError):
            return error_box(f"invalid request id {repr(rid)[:40]}")
        if fig is None:
            return error_box(f"request {rid} is not in this run")
        return dcc.Graph(id="detail-request-fig", figure=fig, config=GRAPH_CONFIG)


PAGE = Page(
    key="run",
    path="/run/",
    title="Run",
    layout=layout,
    register=register,
    nav=False,
    prefix=True,
)
