"""Hardware page: the hardware database as a table, and every sourced number of a device.

Values are shown in the datasheet units the device files use (GB, GB/s, TFLOPS, W); the
detail panel lists each field with its unit, whether it is an estimate, its note and its
sources, exactly as the files give them.
"""

from __future__ import annotations

from typing import TypedDict

from dash import Dash, Input, Output, html
from dash.development.base_component import Component

from perfscope.dashboard.app.pages._common import (
    CARD_STYLE,
    TABLE_CELL,
    TABLE_HEADER,
    ColumnType,
    DashboardContext,
    Page,
    PageRequest,
    column,
    data_table,
    error_box,
    note,
)
from perfscope.jsontypes import JsonObject, json_object

__all__ = ["PAGE", "DeviceRow", "device_detail", "device_records"]


class DeviceRow(TypedDict):
    """One device of the hardware table, in datasheet units (GB, GB/s, TFLOPS, MB, W);
    ``None`` where the datasheet gives no such figure."""

    id: str
    key: str
    name: str
    vendor: str
    kind: str
    mem_gb: float | None
    bw_gb_s: float | None
    bf16_tflops: float | None
    fp8_tflops: float | None
    fp32_tflops: float | None
    llc_mb: float | None
    tdp_w: float | None
    ceilings: str
    n_sources: int


def _r(x: float | None, scale: float, nd: int = 4) -> float | None:
    return None if x is None else float(f"{x / scale:.{nd}g}")


def device_records(ctx: DashboardContext) -> list[DeviceRow]:
    """One row per device of the hardware database (display units)."""
    db = ctx.hwdb()
    rows: list[DeviceRow] = []
    for d in db.filter():
        entry = db.entries.get(d.key)
        sources: set[str] = set()
        if entry is not None:
            for q in entry.quantities.values():
                sources.update(q.sources)
        pf = d.peak_flops
        rows.append(
            {
                "id": d.key,
                "key": d.key,
                "name": d.name,
                "vendor": d.vendor,
                "kind": d.kind,
                "mem_gb": _r(d.mem_bytes, 1e9),
                "bw_gb_s": _r(d.mem_bw_bytes_s, 1e9),
                "bf16_tflops": _r(pf.get("bf16") or pf.get("fp16"), 1e12),
                "fp8_tflops": _r(pf.get("fp8"), 1e12),
                "fp32_tflops": _r(pf.get("fp32"), 1e12),
                "llc_mb": _r(d.cache_bytes, 1e6),
                "tdp_w": _r(d.tdp_w, 1.0),
                "ceilings": d.source,
                "n_sources": len(sources),
            }
        )
    return rows


_COLUMNS: tuple[tuple[str, str, ColumnType], ...] = (
    ("key", "key", "text"),
    ("name", "name", "text"),
    ("vendor", "vendor", "text"),
    ("kind", "kind", "text"),
    ("mem_gb", "memory GB", "numeric"),
    ("bw_gb_s", "mem BW GB/s", "numeric"),
    ("bf16_tflops", "bf16 / fp16 TFLOPS", "numeric"),
    ("fp8_tflops", "fp8 TFLOPS", "numeric"),
    ("fp32_tflops", "fp32 TFLOPS", "numeric"),
    ("llc_mb", "LLC MB", "numeric"),
    ("tdp_w", "TDP W", "numeric"),
    ("ceilings", "ceilings", "text"),
    ("n_sources", "refs", "numeric"),
)


def _source_item(text: str) -> html.Li:
    # Sources are free text that may end in a URL; link only http(s) URLs, show the rest.
    parts: list[Component | str] = []
    for word in text.split(" "):
        if word.startswith(("https://", "http://")):
            parts.append(html.A(word, href=word, target="_blank", rel="noopener noreferrer"))
        else:
            parts.append(word)
        parts.append(" ")
    return html.Li(parts[:-1])


def device_detail(ctx: DashboardContext, key: str | None) -> html.Div:
    """Every field of one device file with its unit, note and sources."""
    db = ctx.hwdb()
    if not key:
        return note("Click a device to see every number with its sources.")
    spec = db.devices.get(key)
    entry = db.entries.get(key)
    if spec is None or entry is None:
        return error_box(f"unknown device {key!r}")
    items: list[Component] = [
        html.H3(f"{spec.name} ({spec.key})"),
        html.Div(
            f"vendor {spec.vendor} · kind {spec.kind}"
            + (f" · architecture {entry.architecture}" if entry.architecture else "")
            + f" · ceilings: {spec.source}"
        ),
    ]
    if entry.notes:
        items.append(html.P(entry.notes, style={"color": "#555"}))
    if entry.files:
        items.append(note("files: " + ", ".join(entry.files)))
    for name, text in sorted(entry.texts.items()):
        items.append(html.Div(f"{name}: {text}"))
    rows = []
    for path, q in sorted(entry.quantities.items()):
        flag = " (estimate)" if q.estimate else ""
        sparse = " (sparse: never used as a denominator)" if path.startswith("sparse.") else ""
        rows.append(
            html.Tr(
                [
                    html.Td(path),
                    html.Td(f"{q.value:g} {q.unit}{flag}{sparse}"),
                    html.Td(
                        [
                            *([html.Div(q.note, style={"color": "#555"})] if q.note else []),
                            html.Ul([_source_item(s) for s in q.sources]),
                        ]
                    ),
                ]
            )
        )
    items.append(
        html.Table(
            [
                html.Thead(html.Tr([html.Th("field"), html.Th("value"), html.Th("sources")])),
                html.Tbody(rows),
            ],
            id="hw-detail-table",
            style={"borderCollapse": "collapse", "fontSize": "13px"},
        )
    )
    return html.Div(items)


def layout(ctx: DashboardContext, req: PageRequest) -> html.Div:
    db = ctx.hwdb()
    records = device_records(ctx)
    errors = [error_box(str(e), title="Device file skipped") for e in db.errors]
    return html.Div(
        [
            html.H2("Hardware database"),
            note(
                f"{len(records)} devices; dense peaks only; – where the datasheet gives none. "
                "Click a row for every figure with "
                "its sources. Add or override devices with TOML files in $PERFSCOPE_HWDB."
            ),
            *errors,
            data_table(
                id="hw-table",
                columns=[
                    # An empty cell says the datasheet gives no such figure.
                    column(c, n, t, nully="–" if t == "numeric" else None)
                    for c, n, t in _COLUMNS
                ],
                data=records,
                sort_action="native",
                filter_action="native",
                page_action="none",
                style_table={"overflowX": "auto", "maxHeight": "520px", "overflowY": "auto"},
                style_cell=TABLE_CELL,
                # Headers wrap onto two lines rather than being cut ("bandwid").
                style_header={**TABLE_HEADER, "whiteSpace": "normal", "height": "auto"},
                # Names wrap so every column, "sources" included, fits 1,440 px.
                style_cell_conditional=[
                    {
                        "if": {"column_id": "name"},
                        "maxWidth": "240px",
                        "whiteSpace": "normal",
                    },
                    {"if": {"column_id": "mem_gb"}, "minWidth": "64px"},
                ],
                # Sticky headers by CSS rather than ``fixed_rows``: fixed rows split the
                # header into its own table sized from the first rows, which left the last
                # column wider than the viewport at 1,440 px.
                css=[
                    {
                        "selector": ".dash-spreadsheet-container th",
                        "rule": "position: sticky; top: 0; z-index: 2",
                    }
                ],
            ),
            html.Div(device_detail(ctx, req.get("device")), id="hw-detail", style=CARD_STYLE),
        ]
    )


def register(app: Dash, ctx: DashboardContext) -> None:
    @app.callback(
        Output("hw-detail", "children"),
        Input("hw-table", "active_cell"),
        prevent_initial_call=True,
    )
    def show_device(active_cell: JsonObject | None) -> html.Div:
        # What the browser sent: anything but an object picking a row picks no device.
        key = (json_object(active_cell) or {}).get("row_id")
        return device_detail(ctx, str(key) if key else None)


PAGE = Page(key="hardware", path="/hardware", title="Hardware", layout=layout, register=register)
