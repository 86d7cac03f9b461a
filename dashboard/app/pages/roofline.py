"""Roofline explorer (``/roofline``): a model on one or more devices, live.

Pick a model (a preset, or the model of a stored run) and devices from the hardware
database; the sliders set batch, prompt length, output length, weight dtype and KV-cache
dtype. Every change re-runs :func:`perfscope.analysis.whatif.predict` (a few milliseconds)
for each device and redraws: each device's ceilings, the predicted prefill and decode
points at speed of light, and a table of TTFT, TPOT, throughput, memory and the bound of
each phase. Measured runs (their summary's ``roofline`` section) can be overlaid.

The figure is specific to this page (several devices' ceilings at once, predicted and
measured points together); the single-run roofline of the report is
:func:`perfscope.dashboard.figures.roofline_figure`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import plotly.graph_objects as go
from dash import Dash, Input, Output, dcc, html
from dash.development.base_component import Component

from perfscope.analysis.catalogue import value_at
from perfscope.analysis.summary import Projection, ProjectionPhase
from perfscope.dashboard._fmt import esc, fmt_pct, fmt_si
from perfscope.dashboard.app.pages._common import (
    CARD_STYLE,
    GRAPH_CONFIG,
    TABLE_CELL,
    TABLE_HEADER,
    DashboardContext,
    Option,
    Page,
    PageRequest,
    column,
    data_table,
    error_box,
    note,
    query_list,
)
from perfscope.dashboard.figures import FIGURE_LAYOUT, si_log_ticks
from perfscope.dashboard.view import roofline_ceilings
from perfscope.errors import PerfscopeError
from perfscope.jsontypes import json_float, json_object, json_str

if TYPE_CHECKING:
    from perfscope.analysis.modelspec import ModelSpec

__all__ = [
    "DTYPES",
    "KV_DTYPES",
    "PAGE",
    "MeasuredPoint",
    "MeasuredRoof",
    "Prediction",
    "PredictionRow",
    "explore",
    "explorer_figure",
    "model_options",
    "resolve_model",
]

#: Weight dtypes of the dtype slider (the compute dtype follows, as in
#: ``ModelSpec.with_dtypes``).
DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
DEFAULT_DEVICES = ("h100-sxm5-80gb", "a100-sxm4-80gb", "l4")
_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1")
_RUN_PREFIX = "run:"

# Sliders move in powers of two: value = 2**position.
_BATCH = (0, 9, 3)  # 1 .. 512, default 8
_PROMPT = (4, 15, 10)  # 16 .. 32768, default 1024
_OUTPUT = (0, 13, 8)  # 1 .. 8192, default 256


@dataclass(frozen=True)
class Prediction:
    """The explored model on one device (``predict()`` at speed of light), with the
    ceilings it was predicted against: peak FLOP/s at the model's compute dtype
    (``compute_dtype``), memory bandwidth in bytes/s at ``memory_level`` (``cache`` or
    DRAM/HBM) and their ridge point in FLOP/byte; ``None`` where the device has none."""

    projection: Projection
    compute_dtype: str | None = None
    peak_flops: float | None = None
    mem_bw_bytes_s: float | None = None
    ridge_point: float | None = None
    memory_level: str | None = None

    @classmethod
    def of(cls, projection: Projection) -> Prediction:
        """The prediction with its ceilings and compute dtype read from the projection."""

        def at(*path: str) -> object:
            return value_at(projection, path)

        return cls(
            projection=projection,
            compute_dtype=json_str(at("dtypes", "compute")),
            peak_flops=json_float(at("ceilings", "peak_flops")),
            mem_bw_bytes_s=json_float(at("ceilings", "mem_bw_bytes_s")),
            ridge_point=json_float(at("ceilings", "ridge_point")),
            memory_level=json_str(at("ceilings", "memory_level")),
        )


#: What tells one device roof from another: device key, dtype, peak FLOP/s, bytes/s.
RoofKey = tuple[str | None, str | None, float | None, float | None]


@dataclass(frozen=True)
class MeasuredPoint:
    """One phase of a stored run on the roofline (its summary's ``roofline`` section):
    arithmetic intensity in FLOP/byte, achieved FLOP/s, MFU and MBU (ratios), and the
    device and ceilings (peak FLOP/s, bytes/s, dtype, where they come from) the run was
    analysed against."""

    run: str
    phase: str
    intensity: float
    achieved_flops_s: float
    mfu: float | None = None
    mbu: float | None = None
    device: str | None = None
    device_key: str | None = None
    peak_flops: float | None = None
    mem_bw_bytes_s: float | None = None
    dtype: str | None = None
    ceiling_source: str | None = None

    @property
    def roof_key(self) -> RoofKey:
        return (self.device_key, self.dtype, self.peak_flops, self.mem_bw_bytes_s)


@dataclass(frozen=True)
class MeasuredRoof:
    """A device roof measured runs were analysed against: peak FLOP/s and bytes/s (both
    positive), the device's name and key, the dtype and where the ceilings come from."""

    key: RoofKey
    peak_flops: float
    mem_bw_bytes_s: float
    name: str | None = None
    device_key: str | None = None
    dtype: str | None = None
    source: str | None = None


class PredictionRow(TypedDict):
    """One device and phase of the explorer's table: times in ms (rounded to 4 digits),
    intensity in FLOP/byte, throughput in output tokens/s, weights + KV cache in GB,
    ``fits`` ``yes``, ``NO`` or ``?``; ``None`` where the projection has no value."""

    device: str
    phase: str
    bound: str | None
    intensity: float | None
    time_ms: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    tok_s: float | None
    mem_gb: float | None
    fits: str
    max_batch: int | None


def model_options(dctx: DashboardContext) -> list[Option]:
    """Presets, then the models recorded in stored runs (``run:<run id>``): only runs whose
    manifest has a model shape (an engine that reports none cannot be explored)."""
    from perfscope.analysis.modelspec import preset_names
    from perfscope.dashboard.compare import short_labels

    opts: list[Option] = [{"label": f"preset: {n}", "value": n} for n in preset_names()]
    rows = [r for r in dctx.repo.rows() if r.state != "broken" and r.has_model_spec]
    for row, label in zip(rows, short_labels([r.run_id for r in rows]), strict=True):
        opts.append(
            {"label": f"run {label}: {row.model or 'model'}", "value": f"{_RUN_PREFIX}{row.run_id}"}
        )
    return opts


def resolve_model(dctx: DashboardContext, value: str) -> ModelSpec:
    """The ``ModelSpec`` of a preset name or of ``run:<run id>`` (its manifest's model)."""
    from perfscope.analysis.modelspec import ModelSpec

    if value.startswith(_RUN_PREFIX):
        run_id = value[len(_RUN_PREFIX) :]
        manifest = dctx.repo.manifest(run_id)
        model = manifest.engine.model if manifest is not None else None
        if not model or not model.get("n_layers"):
            raise PerfscopeError(f"run {run_id!r} recorded no model shape")
        return ModelSpec.from_dict(dict(model))
    return ModelSpec.from_preset(value)


def _slider(id_: str, lo: int, hi: int, value: int, step: int = 3) -> dcc.Slider:
    return dcc.Slider(
        id=id_,
        min=lo,
        max=hi,
        step=1,
        value=value,
        marks={i: f"{2**i:,}" for i in range(lo, hi + 1) if (i - lo) % step == 0 or i == hi},
        updatemode="mouseup",
        # The value is the exponent; a number box would show it raw.
        allow_direct_input=False,
    )


def _cat_slider(id_: str, values: tuple[str, ...], value: str) -> dcc.Slider:
    return dcc.Slider(
        id=id_,
        min=0,
        max=len(values) - 1,
        step=1,
        value=values.index(value),
        marks={i: v for i, v in enumerate(values)},
        allow_direct_input=False,
    )


def explore(
    dctx: DashboardContext,
    model_value: str,
    devices: list[str],
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
    dtype: str,
    kv_dtype: str,
) -> tuple[ModelSpec, list[Prediction]]:
    """The model in the chosen dtypes and ``predict()`` on each device (unknown keys are
    skipped)."""
    from perfscope.analysis.whatif import predict

    model = resolve_model(dctx, model_value).with_dtypes(weight_dtype=dtype, kv_dtype=kv_dtype)
    db = dctx.hwdb()
    out = []
    for key in devices:
        spec = db.find(key)
        if spec is None:
            continue
        p = predict(model, spec, batch=batch, prompt_len=prompt_len, output_len=output_len)
        out.append(Prediction.of(p))
    return model, out


def _measured_points(dctx: DashboardContext, run_ids: list[str]) -> list[MeasuredPoint]:
    """The phases of the runs' stored roofline sections; a run without one, and a section
    or phase that is not a JSON object or lacks a positive intensity and FLOP/s, is left
    out."""
    pts = []
    for rid in run_ids:
        try:
            s = dctx.repo.summary(rid) or {}
        except PerfscopeError:
            continue
        roof = json_object(s.get("roofline")) or {}
        if not roof.get("available"):
            continue
        ceilings = json_object(roof.get("ceilings")) or {}
        device = json_object(roof.get("device")) or {}
        for phase, raw in (json_object(roof.get("phases")) or {}).items():
            p = json_object(raw)
            if p is None:
                continue
            x, y = json_float(p.get("intensity")), json_float(p.get("achieved_flops_s"))
            if x is not None and y is not None and x > 0 and y > 0:
                pts.append(
                    MeasuredPoint(
                        run=rid,
                        phase=phase,
                        intensity=x,
                        achieved_flops_s=y,
                        mfu=json_float(p.get("mfu")),
                        mbu=json_float(p.get("mbu")),
                        device=json_str(device.get("name")),
                        device_key=json_str(device.get("key")),
                        peak_flops=json_float(ceilings.get("peak_flops")),
                        mem_bw_bytes_s=json_float(ceilings.get("mem_bw_bytes_s")),
                        dtype=json_str(ceilings.get("dtype")),
                        ceiling_source=json_str(ceilings.get("source")),
                    )
                )
    return pts


_MEASURED_PALETTE = ("#d62728", "#9467bd", "#8c564b", "#17becf")


def _measured_roofs(measured: Sequence[MeasuredPoint]) -> list[MeasuredRoof]:
    """One roof per distinct device ceiling the measured runs were analysed against (a CPU
    run's point sits under the CPU's calibrated roof, not under a GPU's)."""
    out: dict[RoofKey, MeasuredRoof] = {}
    for m in measured:
        peak, bw = m.peak_flops, m.mem_bw_bytes_s
        if peak is None or bw is None or peak <= 0 or bw <= 0:
            continue
        key = m.roof_key
        if key not in out:
            out[key] = MeasuredRoof(
                key=key,
                peak_flops=peak,
                mem_bw_bytes_s=bw,
                name=m.device,
                device_key=m.device_key,
                dtype=m.dtype,
                source=m.ceiling_source,
            )
    return list(out.values())


def message_figure(text: str) -> go.Figure:
    """A figure that shows only ``text``: no axes, no grid (an empty plot reads as data)."""
    fig = go.Figure()
    fig.update_layout(
        **FIGURE_LAYOUT,
        height=220,
        xaxis={"visible": False},
        yaxis={"visible": False},
        annotations=[
            {
                "text": esc(text),
                "xref": "paper",
                "yref": "paper",
                "x": 0.5,
                "y": 0.5,
                "showarrow": False,
                "font": {"size": 15, "color": "#555"},
            }
        ],
    )
    return fig


def _phases(p: Prediction) -> tuple[tuple[str, ProjectionPhase], ...]:
    return (("prefill", p.projection.prefill), ("decode", p.projection.decode))


def explorer_figure(
    predictions: Sequence[Prediction], measured: Sequence[MeasuredPoint] | None = None
) -> go.Figure:
    """Log-log roofline: each device's bandwidth and compute ceilings (at the model's
    compute dtype), its predicted prefill (circle) and decode (diamond) points at speed of
    light, and measured run phases (crosses)."""
    measured = measured or []
    xs: list[float] = []
    ys: list[float] = []
    for p in predictions:
        for _, d in _phases(p):
            t = d.sol_time_s or 0.0
            if d.intensity and math.isfinite(d.intensity) and t > 0 and d.flops is not None:
                xs.append(d.intensity)
                ys.append(d.flops / t)
        if p.peak_flops:
            ys.append(p.peak_flops)
        if p.ridge_point:
            xs.append(p.ridge_point)
    xs += [m.intensity for m in measured]
    ys += [m.achieved_flops_s for m in measured]
    roofs = _measured_roofs(measured)
    for r in roofs:
        ys.append(r.peak_flops)
        xs.append(r.peak_flops / r.mem_bw_bytes_s)
    if not xs:
        return message_figure("Nothing to draw: pick a model and at least one device.")
    fig = go.Figure()
    x_lo = 10 ** (math.floor(math.log10(min(xs))) - 0.5)
    x_hi = 10 ** (math.ceil(math.log10(max(xs))) + 0.5)
    for i, p in enumerate(predictions):
        color = _PALETTE[i % len(_PALETTE)]
        dev = esc(p.projection.device.name)
        bw, peak = p.mem_bw_bytes_s, p.peak_flops
        level = "cache" if p.memory_level == "cache" else "DRAM/HBM"
        roof = roofline_ceilings(peak, bw, x_lo, x_hi)
        if bw:
            fig.add_trace(
                go.Scatter(
                    x=roof.memory_x if roof else [x_lo, x_hi],
                    y=roof.memory_y if roof else [bw * x_lo, bw * x_hi],
                    mode="lines",
                    line={"color": color, "dash": "dash"},
                    name=f"{dev}: {level} {fmt_si(bw, 'B/s')}",
                    legendgroup=dev,
                    hovertemplate=f"{dev} {level} {fmt_si(bw, 'B/s')}<extra></extra>",
                )
            )
        if peak:
            fig.add_trace(
                go.Scatter(
                    x=roof.peak_x if roof else [x_lo, x_hi],
                    y=[peak, peak],
                    mode="lines",
                    line={"color": color},
                    name=f"{dev}: {esc(p.compute_dtype)} peak {fmt_si(peak, 'FLOP/s')}",
                    legendgroup=dev,
                    hovertemplate=f"{dev} peak {fmt_si(peak, 'FLOP/s')}<extra></extra>",
                )
            )
        for (ph, d), symbol in zip(_phases(p), ("circle", "diamond"), strict=True):
            t = d.sol_time_s or 0.0
            if not (t > 0 and d.intensity is not None and math.isfinite(d.intensity)):
                continue
            if d.flops is None:
                continue
            y = d.flops / t
            fig.add_trace(
                go.Scatter(
                    x=[d.intensity],
                    y=[y],
                    mode="markers",
                    marker={
                        "symbol": symbol,
                        "size": 13,
                        "color": color,
                        "line": {"width": 1, "color": "#222"},
                    },
                    name=f"{dev}: {ph} predicted ({d.bound})",
                    legendgroup=dev,
                    meta={"device": p.projection.device.key, "phase": ph, "kind": "predicted"},
                    hovertemplate=(
                        f"<b>{dev} {ph}</b> (predicted, speed of light)<br>"
                        f"intensity {d.intensity:.4g} FLOP/B<br>{fmt_si(y, 'FLOP/s')}<br>"
                        f"{d.bound}; time {fmt_si(d.time_s, 's')}<extra></extra>"
                    ),
                )
            )
    from perfscope.dashboard.compare import short_labels

    roof_color: dict[RoofKey, str] = {}
    for k, r in enumerate(roofs):
        color = _MEASURED_PALETTE[k % len(_MEASURED_PALETTE)]
        roof_color[r.key] = color
        peak, bw = r.peak_flops, r.mem_bw_bytes_s
        ceil = roofline_ceilings(peak, bw, x_lo, x_hi)
        dev = esc(r.name or r.device_key or "run device")
        src = f"{esc(r.source)}, " if r.source else ""
        fig.add_trace(
            go.Scatter(
                x=[*ceil.memory_x, *ceil.peak_x] if ceil else [x_lo, x_hi],
                y=[*ceil.memory_y, peak, peak] if ceil else [peak, peak],
                mode="lines",
                line={"color": color, "dash": "dot", "width": 2},
                name=f"{dev} roof ({src}{esc(r.dtype or '?')}): measured runs' own device",
                legendgroup=f"measured-{r.key}",
                meta={"kind": "measured-roof", "device": r.device_key},
                hovertemplate=(
                    f"{dev} ({src}{esc(r.dtype or '?')})<br>peak {fmt_si(peak, 'FLOP/s')}, "
                    f"memory {fmt_si(bw, 'B/s')}<extra></extra>"
                ),
            )
        )
    runs = list(dict.fromkeys(m.run for m in measured))
    labels = dict(zip(runs, short_labels(runs), strict=True))
    # A label only where it cannot overlap another one (within ~0.4 decade across and 0.3
    # decade up or down); the others are named in the legend and on hover. Chosen from the
    # last trace back, so a label belongs to the marker drawn on top of its cluster.
    labelled: list[tuple[float, float]] = []
    with_text: set[int] = set()
    for j in reversed(range(len(measured))):
        lx, ly = math.log10(measured[j].intensity), math.log10(measured[j].achieved_flops_s)
        if all(abs(lx - ox) > 0.4 or abs(ly - oy) > 0.3 for ox, oy in labelled):
            labelled.append((lx, ly))
            with_text.add(j)
    for j, m in enumerate(measured):
        color = roof_color.get(m.roof_key, _PALETTE[(j + 3) % len(_PALETTE)])
        label = f"{esc(labels[m.run])} {esc(m.phase)}"
        free = j in with_text
        fig.add_trace(
            go.Scatter(
                x=[m.intensity],
                y=[m.achieved_flops_s],
                mode="markers+text" if free else "markers",
                marker={"symbol": "x", "size": 12, "color": color},
                text=[label] if free else None,
                textposition="top center" if j % 2 == 0 else "bottom center",
                cliponaxis=False,
                legendgroup=f"measured-{m.roof_key}",
                name=f"measured {label}",
                meta={"run": m.run, "phase": m.phase, "kind": "measured"},
                hovertemplate=(
                    f"<b>{esc(m.run)}</b> {esc(m.phase)} measured on "
                    f"{esc(m.device or '?')}<br>MFU {fmt_pct(m.mfu)}, "
                    f"MBU {fmt_pct(m.mbu)}<extra></extra>"
                ),
            )
        )
    y_lo = min(
        [
            *ys,
            *(p.mem_bw_bytes_s * x_lo for p in predictions if p.mem_bw_bytes_s is not None),
            *(r.mem_bw_bytes_s * x_lo for r in roofs),
        ]
    )
    fig.update_xaxes(
        type="log",
        range=[math.log10(x_lo), math.log10(x_hi)],
        title_text="arithmetic intensity (FLOP/byte)",
        exponentformat="SI",
    )
    fig.update_yaxes(
        type="log",
        # Headroom above the highest roof for the point labels.
        range=(yr := [math.log10(y_lo) - 0.3, math.log10(max(ys)) + 0.5]),
        title_text="attainable FLOP/s",
        **si_log_ticks(yr, "FLOP/s"),
    )
    fig.update_layout(
        **FIGURE_LAYOUT,
        height=520,
        title={"text": "Predicted rooflines (speed of light)"},
    )
    return fig


def _g4(x: float | None) -> float | None:
    """``x`` rounded to 4 significant digits (``None`` stays ``None``)."""
    return None if x is None else float(f"{x:.4g}")


def _table_rows(predictions: Sequence[Prediction]) -> list[PredictionRow]:
    rows: list[PredictionRow] = []
    for pred in predictions:
        p = pred.projection
        mem = p.memory
        for ph, d in _phases(pred):
            rows.append(
                {
                    "device": p.device.key,
                    "phase": ph,
                    "bound": d.bound,
                    "intensity": _g4(d.intensity)
                    if d.intensity is not None and math.isfinite(d.intensity)
                    else None,
                    "time_ms": _g4(None if d.time_s is None else d.time_s * 1e3),
                    "ttft_ms": _g4(None if p.ttft_s is None else p.ttft_s * 1e3),
                    "tpot_ms": _g4(None if p.tpot_s is None else p.tpot_s * 1e3),
                    "tok_s": _g4(p.throughput_tok_s) if p.throughput_tok_s else None,
                    "mem_gb": _g4(None if mem.total_bytes is None else mem.total_bytes / 1e9),
                    "fits": {True: "yes", False: "NO", None: "?"}[mem.fits],
                    "max_batch": p.max_batch,
                }
            )
    return rows


_TABLE_COLUMNS = (
    ("device", "device"),
    ("phase", "phase"),
    ("bound", "bound"),
    ("intensity", "FLOP/B"),
    ("time_ms", "phase time ms"),
    ("ttft_ms", "TTFT ms"),
    ("tpot_ms", "TPOT ms"),
    ("tok_s", "output tok/s"),
    ("mem_gb", "weights+KV GB"),
    ("fits", "fits"),
    ("max_batch", "max batch"),
)


def layout(dctx: DashboardContext, req: PageRequest) -> html.Div:
    db = dctx.hwdb()
    devices: list[Option] = [{"label": f"{d.name} ({d.key})", "value": d.key} for d in db.filter()]
    default_devs = [k for k in DEFAULT_DEVICES if k in db.devices][:2] or [
        d["value"] for d in devices[:1]
    ]
    from perfscope.dashboard.compare import short_labels

    with_roof = [r.run_id for r in dctx.repo.rows() if r.has_roofline and r.state != "broken"]
    measured_opts: list[Option] = [
        {"label": label, "value": rid}
        for rid, label in zip(with_roof, short_labels(with_roof), strict=True)
    ]
    # /roofline?runs=A,B overlays those runs (the compare page links here).
    overlay = [o["value"] for o in measured_opts if o["value"] in query_list(req, "runs")]
    row = {
        "display": "grid",
        "gridTemplateColumns": "160px 1fr",
        "alignItems": "center",
        "gap": "6px",
        "margin": "6px 0",
    }
    controls = html.Div(
        [
            html.Div(
                [
                    html.Label("model"),
                    dcc.Dropdown(
                        id="roofline-model",
                        options=model_options(dctx),
                        value="llama-3-8b",
                        clearable=False,
                    ),
                ],
                style=row,
            ),
            html.Div(
                [
                    html.Label("devices"),
                    dcc.Dropdown(
                        id="roofline-devices", options=devices, value=default_devs, multi=True
                    ),
                ],
                style=row,
            ),
            html.Div([html.Label("batch"), _slider("roofline-batch", *_BATCH)], style=row),
            html.Div(
                [html.Label("prompt tokens"), _slider("roofline-prompt", *_PROMPT)], style=row
            ),
            html.Div(
                [html.Label("output tokens"), _slider("roofline-output", *_OUTPUT)], style=row
            ),
            html.Div(
                [html.Label("weight dtype"), _cat_slider("roofline-dtype", DTYPES, "bf16")],
                style=row,
            ),
            html.Div(
                [html.Label("KV-cache dtype"), _cat_slider("roofline-kv-dtype", KV_DTYPES, "bf16")],
                style=row,
            ),
            html.Div(
                [
                    html.Label("overlay measured runs"),
                    dcc.Dropdown(
                        id="roofline-runs",
                        options=measured_opts,
                        value=overlay,
                        multi=True,
                        placeholder="runs with a roofline section"
                        if measured_opts
                        else "no stored run has a roofline section",
                    ),
                ],
                style=row,
            ),
        ],
        style=CARD_STYLE,
    )
    return html.Div(
        [
            html.H2("Roofline explorer"),
            note(
                "Predictions at speed of light: max(FLOPs / peak, bytes / bandwidth) per "
                "phase, from the cost model; real engines reach a fraction of it."
            ),
            controls,
            html.Div(id="roofline-summary", style={"fontWeight": "bold", "margin": "6px 0"}),
            html.Div(
                dcc.Graph(id="roofline-fig", config=GRAPH_CONFIG, figure=go.Figure()),
                style=CARD_STYLE,
            ),
            data_table(
                id="roofline-table",
                columns=[column(c, n) for c, n in _TABLE_COLUMNS],
                data=[],
                style_cell=TABLE_CELL,
                style_header=TABLE_HEADER,
                style_data_conditional=[
                    {"if": {"filter_query": '{fits} = "NO"'}, "backgroundColor": "#fdecea"}
                ],
            ),
            html.Div(id="roofline-notes"),
        ]
    )


def register(app: Dash, dctx: DashboardContext) -> None:
    @app.callback(
        Output("roofline-fig", "figure"),
        Output("roofline-table", "data"),
        Output("roofline-summary", "children"),
        Output("roofline-notes", "children"),
        Input("roofline-model", "value"),
        Input("roofline-devices", "value"),
        Input("roofline-batch", "value"),
        Input("roofline-prompt", "value"),
        Input("roofline-output", "value"),
        Input("roofline-dtype", "value"),
        Input("roofline-kv-dtype", "value"),
        Input("roofline-runs", "value"),
    )
    def update(
        model_value: str | None,
        devices: list[str] | None,
        batch_pos: int | None,
        prompt_pos: int | None,
        output_pos: int | None,
        dtype_pos: int | None,
        kv_pos: int | None,
        runs: list[str] | None,
    ) -> tuple[go.Figure, list[PredictionRow], str, Component | str]:
        def pos(v: int | None, lo: int, hi: int, default: int) -> int:
            return min(max(int(v if v is not None else default), lo), hi)

        batch = 2 ** pos(batch_pos, _BATCH[0], _BATCH[1], _BATCH[2])
        prompt = 2 ** pos(prompt_pos, _PROMPT[0], _PROMPT[1], _PROMPT[2])
        output = 2 ** pos(output_pos, _OUTPUT[0], _OUTPUT[1], _OUTPUT[2])
        dtype = DTYPES[pos(dtype_pos, 0, len(DTYPES) - 1, 1)]
        kv = KV_DTYPES[pos(kv_pos, 0, len(KV_DTYPES) - 1, 1)]
        try:
            model, preds = explore(
                dctx,
                str(model_value or "llama-3-8b"),
                list(devices or []),
                batch=batch,
                prompt_len=prompt,
                output_len=output,
                dtype=dtype,
                kv_dtype=kv,
            )
        except PerfscopeError as exc:
            return message_figure(f"Nothing to draw: {exc}"), [], "", error_box(str(exc))
        fig = explorer_figure(preds, _measured_points(dctx, list(runs or [])))
        summary = (
            f"{model.name}: batch {batch}, prompt {prompt}, output {output}, weights {dtype}, "
            f"KV cache {kv} on {len(preds)} device(s)"
        )
        notes = [
            html.Li(f"{p.projection.device.key}: {n}") for p in preds for n in p.projection.notes
        ]
        return fig, _table_rows(preds), summary, html.Ul(notes) if notes else ""


PAGE = Page(
    key="roofline", path="/roofline", title="Roofline explorer", layout=layout, register=register
)
