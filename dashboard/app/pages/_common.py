"""What every dashboard page shares: the per-app context, the page record, small widgets.

Pages are plain modules with a ``PAGE`` (:class:`Page`): a layout function and a function
that registers the page's callbacks on one app (``app.callback``, never the global
``dash.callback``), so every app built by :func:`perfscope.dashboard.app.create_app`
owns its callbacks and its data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NotRequired, TypeAlias, TypedDict
from urllib.parse import parse_qs

import plotly.graph_objects as go
from dash import Dash, dcc, html
from dash.dash_table.DataTable import DataTable
from dash.development.base_component import Component

from perfscope.dashboard.app.data import RunRepository
from perfscope.jsontypes import JsonValue, json_object

if TYPE_CHECKING:
    from perfscope.hwdb import HardwareDatabase

__all__ = [
    "CellTooltip",
    "Column",
    "ColumnFormat",
    "ColumnType",
    "ConditionalStyle",
    "CssRule",
    "DashboardContext",
    "MarkdownOptions",
    "Option",
    "Page",
    "PageRequest",
    "SortKey",
    "Style",
    "StyleCondition",
    "column",
    "data_table",
    "error_box",
    "figure_block",
    "note",
    "query_list",
    "sort_keys",
]

#: CSS properties of a component's or a table part's ``style`` (camelCase names, as Dash
#: takes them): ``{"fontSize": "13px", "padding": "3px 8px"}``.
Style: TypeAlias = Mapping[str, str | int]


class StyleCondition(TypedDict, total=False):
    """Which cells a conditional DataTable style applies to (its ``if``)."""

    column_id: str
    filter_query: str


#: One entry of a DataTable's ``style_*_conditional``: the ``if`` (a
#: :class:`StyleCondition`) and the CSS properties of the cells it selects.
ConditionalStyle: TypeAlias = Mapping[str, str | int | StyleCondition]

#: The type of a DataTable column (how it sorts, filters and formats).
ColumnType: TypeAlias = Literal["any", "numeric", "text", "datetime"]


class NumberLocale(TypedDict, total=False):
    """A column's number locale: ``symbol`` is the (prefix, suffix) around a value."""

    symbol: list[str]


class ColumnFormat(TypedDict, total=False):
    """A DataTable column's ``format``: a d3 ``specifier``, its locale, and the text of an
    empty (``None``) cell (``nully``)."""

    specifier: str
    locale: NumberLocale
    nully: str


class Column(TypedDict):
    """One DataTable column (Dash's ``columns`` entries): ``id`` is the row key it shows."""

    id: str
    name: str
    type: NotRequired[ColumnType]
    presentation: NotRequired[Literal["input", "dropdown", "markdown"]]
    hideable: NotRequired[bool]
    format: NotRequired[ColumnFormat]


def column(
    cid: str,
    name: str,
    kind: ColumnType | None = None,
    *,
    markdown: bool = False,
    nully: str | None = None,
) -> Column:
    """A DataTable column: ``kind`` its type, ``markdown`` to render its cells as Markdown
    (links), ``nully`` the text of an empty cell."""
    col: Column = {"id": cid, "name": name}
    if kind is not None:
        col["type"] = kind
    if markdown:
        col["presentation"] = "markdown"
    if nully is not None:
        col["format"] = {"nully": nully}
    return col


class Option(TypedDict):
    """One choice of a ``dcc.Dropdown``: the text shown and the value it stands for."""

    label: str
    value: str


class CssRule(TypedDict):
    """A rule of a DataTable's ``css``."""

    selector: str
    rule: str


class CellTooltip(TypedDict):
    """A cell's tooltip (an entry of a row of a DataTable's ``tooltip_data``)."""

    value: str
    type: Literal["text", "markdown"]


class MarkdownOptions(TypedDict, total=False):
    """A DataTable's ``markdown_options``."""

    link_target: str


GRAPH_CONFIG: dcc.Graph.Config = {"displaylogo": False, "responsive": True}

#: Cells and headers wrap their text (a cell never cuts it off or widens the page).
TABLE_CELL: Style = {
    "fontFamily": "sans-serif",
    "fontSize": "13px",
    "padding": "3px 8px",
    "textAlign": "left",
    "whiteSpace": "normal",
    "height": "auto",
}
TABLE_HEADER: Style = {
    "fontWeight": "bold",
    "background": "#f3f3f3",
    "whiteSpace": "normal",
    "height": "auto",
}

CARD_STYLE: Style = {
    "border": "1px solid #ddd",
    "borderRadius": "6px",
    "padding": "10px 14px",
    "margin": "10px 0",
    "background": "#fff",
}


@dataclass
class DashboardContext:
    """Everything one app instance reads: its runs and the hardware database.

    Attributes:
        repo: the runs directory, with its caches.
        poll_interval_s: how often the runs page rescans the directory, in seconds.
        hwdb_dirs: user overlay directories for the hardware database.
    """

    repo: RunRepository
    poll_interval_s: float = 2.0
    hwdb_dirs: Sequence[Path] = ()
    _hwdb: HardwareDatabase | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def runs_dir(self) -> Path:
        root: Path = self.repo.runs_dir
        return root

    def hwdb(self) -> HardwareDatabase:
        """The hardware database (``perfscope.hwdb.HardwareDatabase``), loaded once."""
        with self._lock:
            if self._hwdb is None:
                from perfscope.hwdb import load_database

                self._hwdb = load_database(list(self.hwdb_dirs))
            return self._hwdb


@dataclass(frozen=True)
class PageRequest:
    """The part of the URL a page reads: what follows its path prefix, and the query."""

    rest: str
    query: dict[str, list[str]]

    @classmethod
    def parse(cls, rest: str, search: str | None) -> PageRequest:
        q = parse_qs((search or "").lstrip("?"), keep_blank_values=False)
        return cls(rest=rest, query=q)

    def get(self, key: str) -> str | None:
        values = self.query.get(key)
        return values[-1] if values else None


@dataclass(frozen=True)
class Page:
    """One page of the app.

    Attributes:
        key: short identifier (also the prefix of the page's component ids).
        path: URL path; with ``prefix`` the page also serves ``path + anything``
            (the rest goes to the layout in :attr:`PageRequest.rest`).
        title: navigation label.
        layout: builds the page for one request.
        register: adds the page's callbacks to one app.
        nav: listed in the navigation bar.
    """

    key: str
    path: str
    title: str
    layout: Callable[[DashboardContext, PageRequest], Component]
    register: Callable[[Dash, DashboardContext], None]
    nav: bool = True
    prefix: bool = False


def data_table(
    *,
    id: str,
    columns: Sequence[Column],
    data: Sequence[Mapping[str, object]],
    style_table: Style | None = None,
    style_cell: Style | None = None,
    style_header: Style | None = None,
    style_cell_conditional: Sequence[ConditionalStyle] | None = None,
    style_data_conditional: Sequence[ConditionalStyle] | None = None,
    css: Sequence[CssRule] | None = None,
    markdown_options: MarkdownOptions | None = None,
    tooltip_data: Sequence[Mapping[str, CellTooltip]] | None = None,
    **props: str | int | Sequence[str | int] | None,
) -> DataTable:
    """A ``DataTable`` with typed columns, styles and rows; ``props`` are the table's other
    settings (``page_action``, ``sort_by``, ...), passed as given. A table wider than its box
    scrolls inside it (``style_table`` overflow) rather than making the page scroll
    sideways."""
    typed: dict[str, object] = {
        "style_cell": style_cell,
        "style_header": style_header,
        "style_cell_conditional": style_cell_conditional,
        "style_data_conditional": style_data_conditional,
        "css": css,
        "markdown_options": markdown_options,
        "tooltip_data": tooltip_data,
    }
    given = {k: v for k, v in typed.items() if v is not None}
    # Rows are plain JSON with ``None`` cells, and columns carry only the keys they use:
    # dash's generated hints admit neither, so the table is made through its untyped call.
    make: Callable[..., DataTable] = DataTable
    return make(
        id=id,
        columns=columns,
        data=data,
        style_table={"overflowX": "auto"} if style_table is None else style_table,
        **given,
        **props,
    )


@dataclass(frozen=True)
class SortKey:
    """One key of a DataTable's ``sort_by``: the column and whether it sorts descending."""

    column_id: str
    descending: bool = False


def sort_keys(sort_by: JsonValue) -> list[SortKey]:
    """The keys of a DataTable's ``sort_by`` as the browser sent it, first key first; an
    entry that is not an object naming a column is skipped."""
    out: list[SortKey] = []
    for entry in sort_by if isinstance(sort_by, list) else []:
        key = json_object(entry)
        column = key.get("column_id") if key is not None else None
        if key is not None and isinstance(column, str):
            out.append(SortKey(column, descending=key.get("direction") == "desc"))
    return out


def query_list(req: PageRequest, key: str) -> list[str]:
    """A comma-separated and/or repeated query parameter as a list, order kept, no dupes."""
    out: list[str] = []
    for value in req.query.get(key, []):
        for part in value.split(","):
            part = part.strip()
            if part and part not in out:
                out.append(part)
    return out


def error_box(message: str, *, title: str = "Cannot show this") -> html.Div:
    """A visible error message (text is escaped by Dash)."""
    return html.Div(
        [html.Strong(title), html.Div(message)],
        className="perfscope-error",
        style={
            **CARD_STYLE,
            "borderColor": "#e15759",
            "background": "#fdecea",
            "color": "#7a1c1c",
        },
    )


def note(message: str) -> html.Div:
    """A muted explanatory line (e.g. why a figure is not available)."""
    return html.Div(message, className="perfscope-note", style={"color": "#666", "margin": "6px 0"})


def figure_block(
    graph_id: str,
    title: str,
    figure: go.Figure | None,
    *,
    caption: str = "",
    missing: str | None = None,
) -> html.Div:
    """A titled card with a graph, or the reason the figure is not available."""
    body: list[Component] = [html.H3(title, style={"margin": "4px 0"})]
    if figure is None:
        body.append(note(missing or "not available"))
    else:
        if caption:
            body.append(note(caption))
        body.append(dcc.Graph(id=graph_id, figure=figure, config=GRAPH_CONFIG))
    return html.Div(body, style=CARD_STYLE)
