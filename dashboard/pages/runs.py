"""Runs page: every run directory in a sortable, filterable table; pick runs to compare.

The table is rebuilt from :meth:`RunRepository.rows` on a timer, so runs written while
the dashboard is open appear without a restart. Broken and partial directories are rows
like the others, marked by their ``state`` and the reason in ``status``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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

__all__ = ["COLUMNS", "HIDDEN_BY_DEFAULT", "PAGE", "hidden_columns", "table_records"]

#: (column id, header, type) of the runs table: identity and the contention marker (a
#: contended run's timings are suspect), then the metrics, then the metadata (at 1,440 px
#: every metric is visible without scrolling).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("link", "run id", "text"),
    ("outcome", "state", "text"),
    ("contention", "contention", "text"),
    ("ttft_p50_s", "TTFT p50", "numeric"),
    ("ttft_p99_s", "TTFT p99", "numeric"),
    ("tpot_p50_s", "TPOT p50", "numeric"),
    ("output_tok_s", "output tok/s", "numeric"),
    ("goodput_req_s", "goodput req/s", "numeric"),
    ("slo_pct", "SLO met", "numeric"),
    ("mfu_pct", "MFU prefill", "numeric"),
    ("mbu_pct", "MBU decode", "numeric"),
    ("j_per_token", "J/token", "numeric"),
    ("requests", "requests", "numeric"),
    ("model", "model", "text"),
    ("hardware", "hardware", "text"),
    ("engine", "engine", "text"),
    ("name", "name", "text"),
    ("date", "date (UTC)", "text"),
    ("sweep", "sweep", "text"),
    ("problem", "why partial or broken", "text"),
)

#: Metadata columns hidden until the user shows them (the table's "Toggle Columns"
#: button): with every column the table needs about 2,200 px and scrolls sideways even at
#: 1,920 px. ``sweep`` and ``problem`` are hidden only while no listed run has one (the
#: state cell's tooltip carries the reason of a partial or broken run either way).
#: ``j_per_token`` likewise while no listed run has an energy reading (every cell would say
#: "no meter"; the page's line above the table says why the column is away).
HIDDEN_BY_DEFAULT: tuple[str, ...] = ("engine", "name", "sweep", "problem", "j_per_token")
_SHOWN_WHEN_SET = ("sweep", "problem", "j_per_token")


def hidden_columns(records: Sequence[Mapping[str, object]]) -> list[str]:
    """The columns hidden when the page opens: :data:`HIDDEN_BY_DEFAULT`, less those of
    :data:`_SHOWN_WHEN_SET` that some run fills."""
    return [c for c in HIDDEN_BY_DEFAULT if c not in _SHOWN_WHEN_SET or not _filled(records, c)]


def _filled(records: Sequence[Mapping[str, object]], column: str) -> bool:
    """Whether some listed run has a value in ``column`` (a number, for a metric column:
    a broken run's "n/a" is not a reading)."""
    if column == "j_per_token":
        return any(isinstance(r.get(column), int | float) for r in records)
    return any(r.get(column) for r in records)


#: The columns a user may hide or show (identity and metrics always stay).
_METADATA = ("model", "hardware", "engine", "name", "date", "sweep", "problem")

#: Widest a text column grows before its text wraps (px); run ids wrap at their hyphens.
_WRAP_PX: dict[str, int] = {
    "model": 115,
    "hardware": 110,
    "engine": 170,
    "name": 120,
    "date": 90,
    "problem": 120,
}

#: d3 formats of the numeric columns: SI prefixes with the unit ("820ms", "179s"), numbers
#: with thousands separators, percentages; the cell keeps its number, so sorting is numeric.
_FORMATS: dict[str, dict[str, Any]] = {
    **{
        c: {"specifier": "$.3~s", "locale": {"symbol": ["", "s"]}}
        for c in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s")
    },
    "output_tok_s": {"specifier": ",.4~r"},
    "goodput_req_s": {"specifier": ",.3~r"},
    "j_per_token": {"specifier": "$.3~s", "locale": {"symbol": ["", "J"]}},
    "requests": {"specifier": ",d"},
    **{
        c: {"specifier": "$.3~r", "locale": {"symbol": ["", "%"]}}
        for c in ("slo_pct", "mfu_pct", "mbu_pct")
    },
}


def _state(row: Any) -> str:
    """A word or two: ``complete``, ``running``, ``crashed``, ``failed``, ``not analysed``,
    ``broken`` (the reason is in the ``problem`` column and the cell's tooltip)."""
    if row.state == "ok":
        return str(row.status or "ok")
    if row.state == "broken":
        return "broken"
    problem = str(row.problem or "")
    if "crashed" in problem:
        return "crashed"
    if row.status == "complete" and "not analysed" in problem:
        return "not analysed"
    return str(row.status or row.state)


def table_records(ctx: DashboardContext) -> list[dict[str, Any]]:
    """The runs table's rows, newest first (latencies in seconds, ratios in %)."""
    out = []
    for row in ctx.repo.rows():
        rec = row.to_record()
        rec["outcome"] = _state(row)  # state and status in one short column
        rec["problem"] = row.problem or ""
        for key in ("ttft_p50", "ttft_p99", "tpot_p50"):
            ms = rec.get(f"{key}_ms")
            rec[f"{key}_s"] = None if ms is None else ms / 1e3
        out.append(rec)
    return out


def _tooltips(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reason of a partial or broken run on its state cell."""
    return [
        {"outcome": {"value": str(r["problem"]), "type": "text"}} if r.get("problem") else {}
        for r in records
    ]


def _columns() -> list[dict[str, Any]]:
    cols: list[dict[str, Any]] = []
    for cid, name, kind in COLUMNS:
        col: dict[str, Any] = {"id": cid, "name": name, "type": kind}
        if cid in _METADATA:
            col["hideable"] = True  # listed by the "Toggle Columns" button
        if cid == "link":
            col["presentation"] = "markdown"
        if cid in _FORMATS:
            # A missing value says so instead of leaving the cell blank (energy needs a
            # power meter, NVML or RAPL, and says so).
            nully = "no meter" if cid == "j_per_token" else "n/a"
            col["format"] = {**_FORMATS[cid], "nully": nully}
        cols.append(col)
    return cols


def _source_text(ctx: DashboardContext, records: Sequence[Mapping[str, object]]) -> str:
    """How many runs and where the list was read from (the index, or a scan and why), and
    that J/token is hidden when no listed run has an energy reading."""
    repo = ctx.repo
    text = f"{len(records)} run directories in {ctx.runs_dir}"
    if repo.listing_source == "index":
        text += " · from the run index"
    if repo.listing_note:
        text += f" · {repo.listing_note}"
    if records and "j_per_token" in hidden_columns(records):
        text += " · J/token hidden: no listed run has an energy reading (no power meter)"
    return text


def layout(ctx: DashboardContext, req: PageRequest) -> Any:
    records = table_records(ctx)
    return html.Div(
        [
            html.H2("Runs"),
            html.Div(
                [
                    html.Span(_source_text(ctx, records), id="runs-count"),
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
                hidden_columns=hidden_columns(records),
                style_table={"overflowX": "auto"},
                # Text wraps instead of being cut or widening the table: headers over two
                # lines, long names at their word (or hyphen) breaks.
                style_cell={
                    "fontFamily": "sans-serif",
                    "fontSize": "13px",
                    "padding": "4px 3px",
                    "textAlign": "left",
                    "whiteSpace": "normal",
                    "height": "auto",
                    "overflowWrap": "break-word",
                },
                style_header={
                    "fontWeight": "bold",
                    "background": "#f3f3f3",
                    "whiteSpace": "normal",
                    "height": "auto",
                },
                style_cell_conditional=[
                    {"if": {"column_id": cid}, "maxWidth": f"{px}px", "minWidth": "60px"}
                    for cid, px in _WRAP_PX.items()
                ]
                + [{"if": {"column_id": "link"}, "minWidth": "105px", "maxWidth": "115px"}]
                # An error text's long words (exception names, paths) break anywhere.
                + [
                    {"if": {"column_id": "problem"}, "wordBreak": "break-word", "minWidth": "100px"}
                ],
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
                tooltip_data=_tooltips(records),
                tooltip_duration=None,
            ),
            dcc.Interval(id="runs-poll", interval=int(ctx.poll_interval_s * 1000), n_intervals=0),
        ]
    )


def register(app: Dash, ctx: DashboardContext) -> None:
    @app.callback(
        Output("runs-table", "data"),
        Output("runs-table", "tooltip_data"),
        Output("runs-table", "selected_rows"),
        Output("runs-count", "children"),
        Input("runs-poll", "n_intervals"),
        State("runs-table", "data"),
        State("runs-table", "selected_row_ids"),
        prevent_initial_call=True,
    )
    def refresh_runs(
        _n: int, current: list[dict[str, Any]] | None, selected_ids: list[str] | None
    ) -> tuple[Any, Any, Any, Any]:
        records = table_records(ctx)
        if current == records:
            return no_update, no_update, no_update, no_update
        # Selection is by row index in the DataTable; keep it on the same runs when new
        # runs shift the rows.
        wanted = set(selected_ids or [])
        selected = [i for i, r in enumerate(records) if r["id"] in wanted]
        return records, _tooltips(records), selected, _source_text(ctx, records)

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
