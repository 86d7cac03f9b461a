"""Runs page: every run directory in a sortable, filterable table; pick runs to compare.

The table is rebuilt from :meth:`RunRepository.rows` on a timer, so runs written while
the dashboard is open appear without a restart. Broken and partial directories are rows
like the others, marked by their ``state`` and the reason in ``status``.

Paging, sorting and filtering happen on the server: the browser receives one page of
:data:`PAGE_SIZE` rows, not every run (10,000 runs were megabytes of JSON per poll and per
client). One listing is shared by every client (:class:`_Listings`): it is made again
only when the runs folder gains or loses a run, or when it is older than
:data:`LISTING_MAX_AGE_S` (or three times what making it took), and clients that ask
while it is being made wait for it instead of making their own. The selection lives in
``runs-selection``, so runs picked on one page stay picked on the others.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from dash import Dash, Input, Output, State, dcc, html, no_update

from perfscope.dashboard.app.data import RunRecord, RunRepository, RunRow
from perfscope.dashboard.app.pages._common import (
    CARD_STYLE,
    CellTooltip,
    Column,
    ColumnFormat,
    ColumnType,
    ConditionalStyle,
    DashboardContext,
    Page,
    PageRequest,
    Style,
    data_table,
    sort_keys,
)
from perfscope.jsontypes import JsonArray, JsonValue, json_object

__all__ = [
    "COLUMNS",
    "HIDDEN_BY_DEFAULT",
    "LISTING_MAX_AGE_S",
    "PAGE",
    "PAGE_SIZE",
    "TableRow",
    "filter_records",
    "hidden_columns",
    "page_of",
    "sort_records",
    "table_records",
]


class TableRow(RunRecord):
    """One row of the runs table as the DataTable receives it: the run's record
    (:meth:`RunRow.to_record`) plus the page's own columns: the short ``outcome``, the
    ``problem`` text (empty for a complete run) and the latencies in seconds (the cells
    show them with SI prefixes)."""

    outcome: str
    problem: str
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None


#: A row of a table the filter, sort and page helpers work on (column id -> cell); they
#: read cells by column id and give back the rows they were given.
R = TypeVar("R", bound=Mapping[str, object])

#: Rows of the runs table sent to the browser at a time.
PAGE_SIZE = 50
#: How long one listing of the runs folder serves every client, in seconds, while no run
#: folder is added or removed (a run changing in place shows after at most this long).
LISTING_MAX_AGE_S = 1.0

#: (column id, header, type) of the runs table: identity and the contention marker (a
#: contended run's timings are suspect), then the metrics, then the metadata (at 1,440 px
#: every metric is visible without scrolling).
COLUMNS: tuple[tuple[str, str, ColumnType], ...] = (
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

#: Column widths: text columns wrap at their width; the run id wraps at its hyphens, and an
#: error text's long words (exception names, paths) break anywhere.
_WIDTHS: list[ConditionalStyle] = [
    {"if": {"column_id": cid}, "maxWidth": f"{px}px", "minWidth": "60px"}
    for cid, px in _WRAP_PX.items()
]
_WIDTHS += [
    {"if": {"column_id": "link"}, "minWidth": "105px", "maxWidth": "115px"},
    {"if": {"column_id": "problem"}, "wordBreak": "break-word", "minWidth": "100px"},
]

#: d3 formats of the numeric columns: SI prefixes with the unit ("820ms", "179s"), numbers
#: with thousands separators, percentages; the cell keeps its number, so sorting is numeric.
_FORMATS: dict[str, ColumnFormat] = {
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


def _state(row: RunRow) -> str:
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


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3


def table_records(ctx: DashboardContext) -> list[TableRow]:
    """The runs table's rows, newest first (latencies in seconds, ratios in %)."""
    out: list[TableRow] = []
    for row in ctx.repo.rows():
        rec = row.to_record()
        out.append(
            {
                **rec,
                "outcome": _state(row),  # state and status in one short column
                "problem": row.problem or "",
                "ttft_p50_s": _seconds(rec["ttft_p50_ms"]),
                "ttft_p99_s": _seconds(rec["ttft_p99_ms"]),
                "tpot_p50_s": _seconds(rec["tpot_p50_ms"]),
            }
        )
    return out


def _tooltips(records: Sequence[TableRow]) -> list[dict[str, CellTooltip]]:
    """The reason of a partial or broken run on its state cell."""
    return [
        {"outcome": {"value": r["problem"], "type": "text"}} if r["problem"] else {}
        for r in records
    ]


def _columns() -> list[Column]:
    cols: list[Column] = []
    for cid, name, kind in COLUMNS:
        col: Column = {"id": cid, "name": name, "type": kind}
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


# --- server-side paging -----------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    """One listing of the runs folder, shared by every client until it is made again.

    Attributes:
        records: every run's table record, newest first.
        hidden: the columns hidden when the page opens (:func:`hidden_columns`).
        source: where the list was read from, as the page says it (:func:`_source_text`).
        made_at: ``time.monotonic()`` when it was made.
        root_mtime_ns: the runs folder's modification time then (a run added or removed
            changes it).
        took_s: how long making it took, in seconds.
    """

    records: Sequence[TableRow]
    hidden: list[str]
    source: str
    made_at: float
    root_mtime_ns: int
    took_s: float = 0.0


def _root_mtime_ns(root: Path) -> int:
    try:
        return os.stat(root).st_mtime_ns
    except OSError:
        return -1


class _Listings:
    """The newest :class:`Listing` of one repository, made by one caller at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: Listing | None = None

    def get(self, ctx: DashboardContext, max_age_s: float) -> Listing:
        # Callers that arrive while a listing is being made wait on the lock, then find it
        # fresh: 20 clients polling at once cost one listing, not twenty.
        with self._lock:
            last = self._last
            mtime = _root_mtime_ns(ctx.runs_dir)
            # A listing that took long to make (10,000 runs on a busy machine: about a
            # second) is kept for three times as long, so polls never keep the server
            # making listings more than a quarter of the time.
            if (
                last is not None
                and time.monotonic() - last.made_at < max(max_age_s, 3 * last.took_s)
                and last.root_mtime_ns == mtime
            ):
                return last
            t0 = time.monotonic()
            records = table_records(ctx)
            self._last = Listing(
                records=records,
                hidden=hidden_columns(records),
                source=_source_text(ctx, records),
                made_at=time.monotonic(),
                root_mtime_ns=mtime,
                took_s=time.monotonic() - t0,
            )
            return self._last


_LISTINGS: weakref.WeakKeyDictionary[RunRepository, _Listings] = weakref.WeakKeyDictionary()
_LISTINGS_LOCK = threading.Lock()


def listing(ctx: DashboardContext, max_age_s: float = LISTING_MAX_AGE_S) -> Listing:
    """The runs list shared by every client of ``ctx``'s app (see the module docstring)."""
    with _LISTINGS_LOCK:
        cache = _LISTINGS.get(ctx.repo)
        if cache is None:
            cache = _LISTINGS[ctx.repo] = _Listings()
    return cache.get(ctx, max_age_s)


#: One part of a DataTable filter query: ``{column} operator value``; operators may carry
#: the table's ``s`` (case-sensitive) or ``i`` (case-insensitive) prefix.
_FILTER_PART = re.compile(
    r"^\s*\{(?P<col>[^}]+)\}\s+(?P<case>[si]?)"
    r"(?P<op>contains|datestartswith|eq|ne|lt|le|gt|ge|>=|<=|!=|=|<|>)\s*(?P<value>.*?)\s*$"
)
_OPS = {"eq": "=", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    try:
        f = float(str(value))
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"`":
        return text[1:-1].replace("\\" + text[0], text[0])
    return text


def _matches(cell: object, op: str, value: str, insensitive: bool) -> bool:
    if op in ("contains", "datestartswith"):
        have, want = ("" if cell is None else str(cell)), value
        if insensitive:
            have, want = have.lower(), want.lower()
        return want in have if op == "contains" else have.startswith(want)
    a, b = _number(cell), _number(value)
    if a is None or b is None:  # text: compared as text; a blank cell matches nothing
        if cell is None or cell == "":
            return False
        a_t, b_t = str(cell), value
        if insensitive:
            a_t, b_t = a_t.lower(), b_t.lower()
        return {
            "=": a_t == b_t,
            "!=": a_t != b_t,
            "<": a_t < b_t,
            "<=": a_t <= b_t,
            ">": a_t > b_t,
            ">=": a_t >= b_t,
        }[op]
    return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def filter_records(records: Sequence[R], query: str | None) -> list[R]:
    """The records matching a DataTable ``filter_query`` (parts joined by ``&&``, each
    ``{column} operator value`` as the table's filter row writes them); a part this reader
    does not follow is ignored, as the table itself ignores an invalid filter."""
    parts: list[tuple[str, str, str, bool]] = []
    for text in (query or "").split("&&"):
        m = _FILTER_PART.match(text)
        if m is None:
            continue
        op = _OPS.get(m["op"], m["op"])
        parts.append((m["col"], op, _unquote(m["value"]), m["case"] == "i"))
    if not parts:
        return list(records)
    return [r for r in records if all(_matches(r.get(c), op, v, i) for c, op, v, i in parts)]


def sort_records(records: Sequence[R], sort_by: JsonValue) -> list[R]:
    """``records`` in the order of a DataTable's ``sort_by`` as the browser sent it (first
    key first; an entry that names no column is skipped); numbers sort as numbers, text as
    text, and blank cells last either way."""
    out = list(records)
    for key in reversed(sort_keys(sort_by)):
        col, desc = key.column_id, key.descending

        def rank(r: R, col: str = col) -> tuple[int, float, str]:
            v = r.get(col)
            if v is None or v == "":
                return (2, 0.0, "")
            n = _number(v) if col in _NUMERIC and not isinstance(v, str) else None
            return (0, n, "") if n is not None else (1, 0.0, str(v))

        present = [r for r in out if rank(r)[0] < 2]
        blank = [r for r in out if rank(r)[0] == 2]
        present.sort(key=rank, reverse=desc)
        out = present + blank
    return out


#: Columns that hold numbers (sorted numerically; a text cell such as "no SLOs" after them).
_NUMERIC = frozenset(cid for cid, _, kind in COLUMNS if kind == "numeric")


def page_of(records: Sequence[R], page: int | None, size: int | None) -> tuple[list[R], int, int]:
    """One page of ``records``: (its rows, the page number shown, the number of pages);
    a page past the end shows the last one."""
    size = max(1, int(size or PAGE_SIZE))
    pages = max(1, math.ceil(len(records) / size))
    current = min(max(0, int(page or 0)), pages - 1)
    return list(records[current * size : (current + 1) * size]), current, pages


def _count_text(shown: Listing, matched: int) -> str:
    total = len(shown.records)
    return shown.source + (f" · {matched} match the filter" if matched != total else "")


def layout(ctx: DashboardContext, req: PageRequest) -> html.Div:
    shown = listing(ctx)
    records, _, pages = page_of(shown.records, 0, PAGE_SIZE)
    return html.Div(
        [
            html.H2("Runs"),
            html.Div(
                [
                    html.Span(_count_text(shown, len(shown.records)), id="runs-count"),
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
                # Sorted, filtered and paged on the server (see the module docstring).
                sort_action="custom",
                sort_mode="multi",
                sort_by=[],
                filter_action="custom",
                filter_query="",
                page_action="custom",
                page_current=0,
                page_size=PAGE_SIZE,
                page_count=pages,
                markdown_options={"link_target": "_self"},
                css=[{"selector": ".dash-cell p", "rule": "margin: 0"}],
                hidden_columns=shown.hidden,
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
                style_cell_conditional=_WIDTHS,
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
            dcc.Store(id="runs-selection", data=[]),
        ]
    )


def register(app: Dash, ctx: DashboardContext) -> None:
    @app.callback(
        Output("runs-table", "data"),
        Output("runs-table", "tooltip_data"),
        Output("runs-table", "selected_rows"),
        Output("runs-count", "children"),
        Output("runs-table", "page_count"),
        Output("runs-table", "page_current"),
        Input("runs-poll", "n_intervals"),
        Input("runs-table", "page_current"),
        Input("runs-table", "page_size"),
        Input("runs-table", "sort_by"),
        Input("runs-table", "filter_query"),
        State("runs-table", "data"),
        State("runs-selection", "data"),
        prevent_initial_call=True,
    )
    def refresh_runs(
        _n: int,
        page: int | None,
        size: int | None,
        sort_by: JsonArray | None,
        query: str | None,
        current: JsonArray | None,
        selected_ids: JsonArray | None,
    ) -> tuple[object, ...]:
        shown = listing(ctx)
        matched = filter_records(shown.records, query)
        records, at, pages = page_of(sort_records(matched, sort_by), page, size)
        if current == records and at == (page or 0):
            return (no_update,) * 6
        # Selection is by row index in the DataTable: mark the picked runs on this page.
        wanted = {str(i) for i in selected_ids or []}
        selected = [i for i, r in enumerate(records) if r["id"] in wanted]
        return (
            records,
            _tooltips(records),
            selected,
            _count_text(shown, len(matched)),
            pages,
            at,
        )

    @app.callback(
        Output("runs-selection", "data"),
        Input("runs-table", "selected_row_ids"),
        State("runs-table", "data"),
        State("runs-selection", "data"),
        prevent_initial_call=True,
    )
    def remember_selection(
        picked: JsonArray | None, page: JsonArray | None, kept: JsonArray | None
    ) -> list[str]:
        """The runs picked on every page: this page's picks replace this page's part."""
        rows = [r for r in map(json_object, page or []) if r is not None and "id" in r]
        here = {str(r["id"]) for r in rows}
        now = [str(i) for i in picked or []]
        out = [i for i in map(str, kept or []) if i not in here or i in now]
        return out + [i for i in now if i not in out]

    @app.callback(
        Output("runs-compare-link", "href"),
        Output("runs-compare-link", "children"),
        Output("runs-compare-link", "style"),
        Input("runs-selection", "data"),
    )
    def compare_link(selected_ids: JsonArray | None) -> tuple[str, str, Style]:
        ids = [str(i) for i in (selected_ids or [])]
        if len(ids) < 2:
            text = "Select two or more runs to compare"
            if len(ids) == 1:
                return f"/run/{quote(ids[0])}", f"Open {ids[0]}", {"fontWeight": "bold"}
            return "/compare", text, {"pointerEvents": "none", "color": "#999"}
        href = "/compare?runs=" + quote(",".join(ids), safe=",")
        return href, f"Compare {len(ids)} selected runs", {"fontWeight": "bold"}


PAGE = Page(key="runs", path="/", title="Runs", layout=layout, register=register)
