"""What every dashboard page shares: the per-app context, the page record, small widgets.

Pages are plain modules with a ``PAGE`` (:class:`Page`): a layout function and a function
that registers the page's callbacks on one app (``app.callback``, never the global
``dash.callback``), so every app built by :func:`perfscope.dashboard.app.create_app`
owns its callbacks and its data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import plotly.graph_objects as go
from dash import Dash, dcc, html
from dash.dash_table.DataTable import DataTable

from perfscope.dashboard.app.data import RunRepository

__all__ = [
    "DashboardContext",
    "Page",
    "PageRequest",
    "data_table",
    "error_box",
    "figure_block",
    "note",
    "query_list",
]

GRAPH_CONFIG: Any = {"displaylogo": False, "responsive": True}

#: Cells and headers wrap their text (a cell never cuts it off or widens the page).
TABLE_CELL: dict[str, Any] = {
    "fontFamily": "sans-serif",
    "fontSize": "13px",
    "padding": "3px 8px",
    "textAlign": "left",
    "whiteSpace": "normal",
    "height": "auto",
}
TABLE_HEADER: dict[str, Any] = {
    "fontWeight": "bold",
    "background": "#f3f3f3",
    "whiteSpace": "normal",
    "height": "auto",
}

CARD_STYLE: dict[str, Any] = {
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
    _hwdb: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def runs_dir(self) -> Path:
        root: Path = self.repo.runs_dir
        return root

    def hwdb(self) -> Any:
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
    layout: Callable[[DashboardContext, PageRequest], Any]
    register: Callable[[Dash, DashboardContext], None]
    nav: bool = True
    prefix: bool = False


def data_table(**props: Any) -> DataTable:
    """A ``DataTable``; rows and columns are plain JSON (``None`` cells included), which
    dash's generated type hints do not admit. A table wider than its box scrolls inside it
    (``style_table`` overflow) rather than making the page scroll sideways."""
    props.setdefault("style_table", {"overflowX": "auto"})
    return DataTable(**props)


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
    graph_id: str | dict[str, Any],
    title: str,
    figure: go.Figure | None,
    *,
    caption: str = "",
    missing: str | None = None,
) -> html.Div:
    """A titled card with a graph, or the reason the figure is not available."""
    body: list[Any] = [html.H3(title, style={"margin": "4px 0"})]
    if figure is None:
        body.append(note(missing or "not available"))
    else:
        if caption:
            body.append(note(caption))
        body.append(dcc.Graph(id=graph_id, figure=figure, config=GRAPH_CONFIG))
    return html.Div(body, style=CARD_STYLE)
