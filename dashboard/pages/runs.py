"""Runs page: every run directory in a sortable, filterable table; pick runs to compare.

The table is rebuilt from :meth:`RunRepository.rows` on a timer, so runs written while
the dashboard is open appear without a restart. Broken and partial directories are rows
like the others, marked by their ``state`` and the reason in ``status``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from dash import Dash, Input, Output, State, dcc, html, no_update

from perfscope.dashboard.pages._common import (
    CARD_STYLE,
    DashboardContext,
    Page,
    PageRequest,
    data_table,
)

__all__ = ["COLUMNS", "PAGE", "table_records"]

#: (column id, header, type) of the runs table.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run_id", "run id", "text"),
    ("link", "", "text"),
    ("state", "state", "text"),
    ("status", "status", "text"),
    ("name", "name", "text"),
    ("engine", "engine", "text"),
    ("model", "model", "text"),
    ("hardware", "hardware", "text"),
    ("date", "date (UTC)", "text"),
    ("requests", "requests", "numeric"),
    ("ttft_p50_ms", "TTFT p50 ms", "numeric"),
    ("ttft_p99_ms", "TTFT p99 ms", "numeric"),
    ("tpot_p50_ms", "TPOT p50 ms", "numeric"),
    ("output_tok_s", "output tok/s", "numeric"),
    ("goodput_req_s", "goodput req/s", "numeric"),
    ("slo_pct", "SLO met %", "numeric"),
    ("mfu_pct", "MFU % (prefill)", "numeric"),
    ("mbu_pct", "MBU % (decode)", "numeric"),
    ("j_per_token", "J/token", "numeric"),
    ("sweep", "sweep", "text"),
    ("contention", "CPU contention", "text"),
)


def table_records(ctx: DashboardContext) -> list[dict[str, Any]]:
    """The runs table's rows, newest first."""
    return [row.to_record() for row in ctx.repo.rows()]


def _columns() -> list[dict[str, Any]]:
    cols: list[dict[str, Any]] = []
    for cid, name, kind in COLUMNS:
        col: dict[str, Any] = {"id": cid, "name": name, "type": kind}
        if cid == "link":
            col["presentation"] = "markdown"
        cols.append(col)
    return cols


def layout(ctx: DashboardContext, req: PageRequest) -> Any:
    records = table_records(ctx)
    return html.Div(
        [
            html.H2("Runs"),
            html.Div(
                [
                    html.Span(
                        f"{len(records)} run directories in {ctx.runs_dir}",
                        id="runs-count",
                    ),
                    html.Span(" · refreshed every "),
                    html.Span(f"{ctx.poll_interval_s:g} s"),
                ],
                style={"color": "#555"},
            ),
            html.Div(
                [
                    dcc.Link(
                        "Select two or more runs to compare",
                        id="runs-compare-link",
                        href="/compare",
                        style={"pointerEvents": "none", "color": "#999"},
                    ),
                ],
                style={**CARD_STYLE, "display": "inline-block"},
            ),
            data_table(
                id="runs-table",
                columns=_columns(),
                data=records,
                row_selectable="multi",
                selected_rows=[],
                selected_row_ids=[],
                sort_action="native",
                sort_mode="multi",
                filter_action="native",
                page_action="native",
                page_size=50,
                markdown_options={"link_target": "_self"},
                css=[{"selector": ".dash-cell p", "rule": "margin: 0"}],
                style_table={"overflowX": "auto"},
                style_cell={
                    "fontFamily": "sans-serif",
                    "fontSize": "13px",
                    "padding": "4px 8px",
                    "textAlign": "left",
                    "maxWidth": "320px",
                    "overflow": "hidden",
                    "textOverflow": "ellipsis",
                },
                style_header={"fontWeight": "bold", "background": "#f3f3f3"},
                style_data_conditional=[
                    {
                        "if": {"filter_query": '{state} = "broken"'},
                        "backgroundColor": "#fdecea",
                        "color": "#7a1c1c",
                    },
                    {
                        "if": {"filter_query": '{state} = "partial"'},
                        "backgroundColor": "#fff8e1",
                    },
                ],
                tooltip_duration=None,
            ),
            dcc.Interval(id="runs-poll", interval=int(ctx.poll_interval_s * 1000), n_intervals=0),
        ]
    )


def register(app: Dash, ctx: DashboardContext) -> None:
    @app.callback(
        Output("runs-table", "data"),
        Output("runs-table", "selected_rows"),
        Output("runs-count", "children"),
        Input("runs-poll", "n_intervals"),
        State("runs-table", "data"),
        State("runs-table", "selected_row_ids"),
        prevent_initial_call=True,
    )
    def refresh_runs(
        _n: int, current: list[dict[str, Any]] | None, selected_ids: list[str] | None
    ) -> tuple[Any, Any, Any]:
        records = table_records(ctx)
        if current == records:
            return no_update, no_update, no_update
        # Selection is by row index in the DataTable; keep it on the same runs when new
        # runs shift the rows.
        wanted = set(selected_ids or [])
        selected = [i for i, r in enumerate(records) if r["id"] in wanted]
        return records, selected, f"{len(records)} run directories in {ctx.runs_dir}"

    @app.callback(
        Output("runs-compare-link", "href"),
        Output("runs-compare-link", "children"),
        Output("runs-compare-link", "style"),
        Input("runs-table", "selected_row_ids"),
    )
    def compare_link(selected_ids: list[str] | None) -> tuple[str, str, dict[str, Any]]:
        ids = [str(i) for i in (selected_ids or [])]
        if len(ids) < 2:
            text = "Select two or more runs to compare"
            if len(ids) == 1:
                return f"/run/{quote(ids[0])}", f"Open {ids[0]}", {"fontWeight": "bold"}
            return "/compare", text, {"pointerEvents": "none", "color": "#999"}
        href = "/compare?runs=" + quote(",".join(ids), safe=",")
        return href, f"Compare {len(ids)} selected runs", {"fontWeight": "bold"}


PAGE = Page(key="runs", path="/", title="Runs", layout=layout, register=register)
