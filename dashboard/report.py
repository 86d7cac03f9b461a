"""The self-contained HTML report of a run (``report.html``).

One file that works offline: plotly.js is inlined once at the end of the page and every
figure is a JSON block drawn by one small script, so figures carry no copy of their own.
Everything a reader needs first (status, headline numbers, verdicts, run facts, the request
table) is static HTML, readable without JavaScript and printable; the figures need
JavaScript. Every string that comes from the user, the model or a server (run names, model
paths, prompts, error texts) is HTML-escaped; figure JSON has ``<`` escaped so it cannot
close its ``<script>`` block.

When the page has drawn, ``<body>`` carries ``data-render="ok"`` (or ``"error"`` with the
messages in ``#render-errors``) and ``data-figures-rendered="N"``; the browser test reads them.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import plotly
import plotly.io as pio

from perfscope.analysis import Summary
from perfscope.analysis.catalogue import format_bytes, metric, value_at
from perfscope.analysis.manifest import EngineConfig, manifest_view
from perfscope.analysis.summary import Gain, Projection
from perfscope.dashboard._fmt import (
    esc,
    fmt_bytes,
    fmt_count,
    fmt_num,
    fmt_pct,
    fmt_si,
    fmt_time,
)
from perfscope.dashboard.exporters import ExportableRun
from perfscope.dashboard.figures import FigureSpec, RunTables, run_figures
from perfscope.dashboard.queueing import queueing_line
from perfscope.dashboard.view import (
    TABLE_STATS,
    as_summary,
    headline_cards,
    latency_rows,
    model_spec_lines,
    request_rows,
    throughput_rows,
)
from perfscope.jsontypes import json_object
from perfscope.profiler.output import write_output_text

__all__ = [
    "DEFAULT_MAX_REQUESTS",
    "ReportRun",
    "figure_json",
    "render_page",
    "render_report",
    "write_report",
]

#: Rows of the per-request table.
DEFAULT_MAX_REQUESTS = 100

_PLOTLY_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    # A short mode bar (save, zoom, pan, reset) that stays clear of a figure's title.
    "modeBarButtonsToRemove": [
        "select2d",
        "lasso2d",
        "zoomIn2d",
        "zoomOut2d",
        "autoScale2d",
        "toggleSpikelines",
        "hoverClosestCartesian",
        "hoverCompareCartesian",
    ],
}


class ReportRun(ExportableRun, Protocol):
    """What the report reads: an exportable run that also knows its directory."""

    @property
    def path(self) -> Path: ...


# ---------------------------------------------------------------------- page frame


@functools.cache
def _asset(name: str) -> str:
    """A file of ``perfscope/dashboard/assets`` (the report's CSS and scripts)."""
    return (resources.files("perfscope.dashboard") / "assets" / name).read_text(encoding="utf-8")


#: Trace types of plotly.js's "basic" partial bundle (``assets/plotly-basic.min.js``).
BASIC_TRACES = frozenset({"scatter", "bar", "pie"})


def plotly_js(figures: Sequence[Any] = ()) -> str:
    """The plotly.js to inline: the basic partial bundle (about 1.2 MB instead of 4.8 MB)
    when every trace of ``figures`` is one it draws and its version is the one plotly.py
    was built for; the full bundle otherwise."""
    from plotly.offline import get_plotlyjs

    full = str(get_plotlyjs())
    types = {
        str(getattr(t, "type", None) or "scatter")
        for f in figures
        if f is not None
        for t in getattr(f, "data", ())
    }
    if not types <= BASIC_TRACES:
        return full
    try:
        basic = _asset("plotly-basic.min.js")
    except (FileNotFoundError, OSError):
        return full
    version = full[:200].split(" v", 1)[-1].split()[0]
    return basic if f" v{version}" in basic[:200] else full


def figure_json(fig: Any) -> str:
    """Plotly figure JSON that is safe inside ``<script type="application/json">``."""
    text = str(pio.to_json(fig, validate=False))
    return text.replace("<", "\\u003c").replace(">", "\\u003e")


def _figure_block(spec: FigureSpec) -> str:
    head = f'<div class="figure" id="fig-{esc(spec.key)}"><h3>{esc(spec.title)}</h3>'
    if spec.figure is None:
        return head + f'<p class="missing">{esc(spec.missing or "not available")}</p></div>'
    return (
        head
        + f'<p class="caption">{esc(spec.caption)}</p>'
        + f'<div class="plot" id="plot-{esc(spec.key)}" data-figure="data-{esc(spec.key)}">'
        + "<noscript><p class='missing'>This figure needs JavaScript.</p></noscript></div>"
        + f'<script type="application/json" id="data-{esc(spec.key)}">'
        + figure_json(spec.figure)
        + "</script></div>"
    )


def render_page(title: str, body_html: str, figures: Sequence[FigureSpec]) -> str:
    """A complete offline HTML page: ``body_html`` (already escaped), then the figures'
    JSON, plotly.js inlined once and the render script. ``figures`` whose blocks are not
    already in ``body_html`` are not drawn: use :func:`figures_html` to place them."""
    has_figures = any(f.figure is not None for f in figures)
    scripts = ""
    if has_figures:
        render = _asset("render.js").replace("__CONFIG__", json.dumps(_PLOTLY_CONFIG))
        js = plotly_js([f.figure for f in figures])
        scripts = f"<script>{js}</script>\n<script>{render}</script>"
    else:
        scripts = (
            "<script>window.addEventListener('load', function () {"
            "document.body.setAttribute('data-figures-rendered','0');"
            "document.body.setAttribute('data-render',"
            " window.__perfscopeErrors.length ? 'error' : 'ok');});</script>"
        )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta name="generator" content="perfscope (plotly {esc(plotly.__version__)})">\n'
        f"<title>{esc(title)}</title>\n<style>{_asset('report.css')}</style>\n"
        f"<script>{_asset('error_hook.js')}</script>\n</head>\n"
        '<body data-render="pending">\n'
        f"{body_html}\n"
        '<p id="render-errors" class="noprint"></p>\n'
        f"{scripts}\n</body>\n</html>\n"
    )


def figures_html(figures: Sequence[FigureSpec]) -> str:
    """The figure blocks (title, caption, drawing area, JSON data)."""
    return (
        "<noscript><p class='banner'>JavaScript is off: the numbers above and below are "
        "complete, the figures need JavaScript.</p></noscript>\n"
        + "\n".join(_figure_block(f) for f in figures)
    )


# ---------------------------------------------------------------------- sections


def _kv_table(rows: Sequence[tuple[str, Any]]) -> str:
    out = ['<table class="kv">']
    for k, v in rows:
        if v is None or v == "" or v == {} or v == []:
            continue
        if isinstance(v, dict | list):
            v = json.dumps(v, default=str, ensure_ascii=False)
            cell = f'<span class="mono">{esc(v)}</span>'
        else:
            cell = esc(v)
        out.append(f"<tr><th>{esc(k)}</th><td>{cell}</td></tr>")
    out.append("</table>")
    return "".join(out)


def _card(label: str, value: str, sub: str = "") -> str:
    return (
        f'<div class="card"><div class="k">{esc(label)}</div>'
        f'<div class="v">{esc(value)}</div>'
        + (f'<div class="s">{esc(sub)}</div>' if sub else "")
        + "</div>"
    )


def _headline(summary: Summary) -> tuple[str, str]:
    """The headline cards, and the latency and throughput tables (placed further down)."""
    cards = [_card(c.title, c.value, c.detail) for c in headline_cards(summary)]
    # The static table: every latency distribution and the throughput numbers.
    rows = [
        '<table id="headline-table"><thead><tr><th>metric</th><th class="n">n</th>'
        + "".join(f'<th class="n">{c}</th>' for c in TABLE_STATS)
        + "</tr></thead><tbody>"
    ]
    for row in latency_rows(summary, ("ttft", "tpot", "itl", "e2e", "ntpot")):
        rows.append(
            f"<tr><td>{esc(row.label)}</td><td class='n'>{row.count}</td>"
            + "".join(
                f"<td class='n' data-key='{row.key}.{c}'>{esc(row.values[c])}</td>"
                for c in TABLE_STATS
            )
            + "</tr>"
        )
    rows.append("</tbody></table>")
    tp_rows = [(r.label, r.value) for r in throughput_rows(summary)]
    return (
        '<section id="headline"><h2>Headline</h2><div class="cards">'
        + "".join(cards)
        + "</div></section>",
        '<section id="numbers"><h2>Latency and throughput</h2>'
        + "".join(rows)
        + _kv_table(tp_rows)
        + "</section>",
    )


def _hardware_rows(summary: Summary) -> list[tuple[str, Any]]:
    section = summary.hardware
    roof = summary.roofline
    # The hardware section holds {"spec": DeviceSpec JSON form | None, "resolved_from",
    # "reason"}; a summary from before that layout kept the spec's own keys at its top.
    hw = section.spec if section.spec is not None else (dict(section.extra) or None)
    if isinstance(hw, dict) and (hw.get("name") or hw.get("key")):
        resolved = section.resolved_from
        peaks = json_object(hw.get("peak_flops")) or {}
        peak_txt = ", ".join(f"{k} {fmt_si(v, 'FLOP/s')}" for k, v in peaks.items() if v)
        return [
            ("device", f"{hw.get('name') or hw.get('key')} ({hw.get('key')}, {hw.get('kind')})"),
            ("ceilings source", hw.get("source")),
            ("resolved from", resolved),
            ("dense peaks", peak_txt or None),
            ("memory bandwidth", fmt_si(hw.get("mem_bw_bytes_s"), "B/s")),
            ("memory", fmt_bytes(hw.get("mem_bytes")) if hw.get("mem_bytes") else None),
            (
                "last-level cache",
                f"{fmt_bytes(hw.get('cache_bytes'))}"
                + (
                    f" at {fmt_si(hw.get('cache_bw_bytes_s'), 'B/s')}"
                    if hw.get("cache_bw_bytes_s")
                    else ""
                )
                if hw.get("cache_bytes")
                else None,
            ),
            ("TDP", f"{fmt_num(hw.get('tdp_w'))} W" if hw.get("tdp_w") else None),
        ]
    c = roof.ceilings
    if c is not None:
        dev = roof.device
        return [
            (
                "device",
                f"{value_at(dev, 'name')} ({value_at(dev, 'key')}, {value_at(dev, 'kind')})",
            ),
            ("ceilings source", c.source),
            ("peak", f"{c.dtype} {fmt_si(c.peak_flops, 'FLOP/s')}"),
            ("memory bandwidth", fmt_si(c.mem_bw_bytes_s, "B/s")),
            (
                "last-level cache",
                f"{fmt_bytes(c.cache_bytes)} at {fmt_si(c.cache_bw_bytes_s, 'B/s')}"
                if c.cache_bytes
                else None,
            ),
            ("ridge point", f"{fmt_num(c.ridge_point)} FLOP/byte"),
        ]
    return [
        (
            "device",
            f"not available: {section.reason or 'analyse with --hw KEY for ceilings'}",
        )
    ]


def _run_header(run: ReportRun, typed: Summary) -> str:
    m = manifest_view(run.manifest)
    engine = m.engine
    model = engine.model or typed.model or {}
    cfg = engine.config
    model_rows: list[tuple[str, Any]] = []
    if isinstance(model, Mapping) and model:
        model_rows = [
            ("model", model.get("name")),
            (
                "shape",
                ", ".join(
                    f"{k}={model[k]}"
                    for k in (
                        "n_layers",
                        "hidden_size",
                        "n_heads",
                        "n_kv_heads",
                        "intermediate_size",
                        "vocab_size",
                        "n_experts",
                    )
                    if model.get(k)
                ),
            ),
            (
                "dtypes",
                ", ".join(
                    f"{k}={model[k]}"
                    for k in ("weight_dtype", "kv_dtype", "act_dtype")
                    if model.get(k)
                ),
            ),
            ("parameters", fmt_count(cfg.n_params) if cfg.n_params else None),
        ]
    elif model:
        model_rows = [("model", model)]
    slos = typed.goodput.slos or m.slos
    status = str(m.status or typed.status or "unknown")
    errors = list(m.errors)
    err_counts = typed.errors
    parts = [
        '<section id="run"><h2>Run</h2>',
        _kv_table(
            [
                ("run id", m.run_id),
                ("name", m.name),
                ("status", status),
                ("started", m.started_at),
                ("ended", m.ended_at),
                ("command", " ".join(m.command)),
                ("engine", engine.uri),
                ("engine kind", engine.kind),
                ("engine device / dtype", f"{engine.device} / {engine.dtype}"),
                ("engine scheduler / batch", _sched(cfg)),
                *model_rows,
            ]
        ),
        "<h3>Hardware and ceilings</h3>",
        _kv_table(_hardware_rows(typed)),
        "<h3>Workload and load</h3>",
        _kv_table(
            [
                *[(f"workload {k}", v) for k, v in (m.workload or {}).items()],
                *[(f"load {k}", v) for k, v in (m.load or {}).items()],
                ("SLOs", ", ".join(f"{k} ≤ {fmt_time(v)}" for k, v in slos.items()) or "none"),
            ]
        ),
    ]
    if errors or err_counts:
        parts.append("<h3>Errors</h3><table><tr><th>error</th><th class='n'>requests</th></tr>")
        for e in errors:
            parts.append(f"<tr><td class='err'>{esc(e)}</td><td class='n'>run</td></tr>")
        for ec in err_counts:
            parts.append(
                f"<tr><td class='err'>{esc(ec.error)}</td>"
                f"<td class='n'>{fmt_count(ec.count)}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</section>")
    return "".join(parts)


def _sched(cfg: EngineConfig) -> str | None:
    if not cfg.scheduler and not cfg.batch_size:
        return None
    return f"{cfg.scheduler} / {cfg.batch_size}"


def _verdicts(summary: Summary) -> str:
    roof = summary.roofline
    out = ['<section id="verdicts"><h2>Verdicts</h2>']
    if not roof.available:
        out.append(f'<p class="missing">Not available: {esc(roof.reason or "no phase data")}.</p>')
    else:
        for phase, p in roof.phases.items():
            out.append(
                f'<div class="verdict" data-phase="{esc(phase)}"><b>{esc(phase)}: '
                f"{esc(p.verdict)}</b> — {esc(p.evidence)}</div>"
            )
        out.append(
            f"<p class='caption'>FLOPs counted {esc(roof.flops_convention)}; "
            f"overhead-bound below {fmt_pct(roof.overhead_threshold)} MFU and MBU.</p>"
        )
        spec = model_spec_lines(summary)
        if spec:
            items = "".join(f"<li>{esc(line)}</li>" for line in spec[1:])
            out.append(f"<div class='model-spec'><p>{esc(spec[0])}</p><ul>{items}</ul></div>")
        lat = roof.latency
        if lat.decode_stall_share is not None:
            out.append(
                f"<p>Decode stalled by prefill: {fmt_pct(lat.decode_stall_share)} of "
                f"decode time (longest stall {fmt_time(lat.prefill_stall_max_s)}).</p>"
            )
    out.append(_energy_block(summary))
    out.append("</section>")
    return "".join(out)


def _nodes_table(summary: Summary) -> str:
    """A cluster run (``--ray``): each node's energy, power and memory, and the total."""
    en = summary.energy
    if not en.nodes:
        return ""

    def fmt(name: str, value: Any) -> str:
        return metric(name).format(value) if value is not None else "–"

    def mem(value: float | None) -> str:
        return format_bytes(value) if value is not None else "–"

    head = (
        "<table><thead><tr><th>node</th><th class='n'>GPUs</th><th>power from</th>"
        "<th class='n'>energy</th><th class='n'>avg power</th><th class='n'>peak power</th>"
        "<th class='n'>GPU memory peak</th><th class='n'>system memory peak</th>"
        "</tr></thead><tbody>"
    )
    rows = []
    for name, n in en.nodes.items():
        rows.append(
            f"<tr><td>{esc(name)}</td><td class='n'>{n.gpus}</td>"
            f"<td>{esc(n.power_source or 'no power reading')}</td>"
            f"<td class='n'>{fmt('energy.total_j', n.energy_j)}</td>"
            f"<td class='n'>{fmt('avg_power_w', n.avg_power_w)}</td>"
            f"<td class='n'>{fmt('peak_power_w', n.peak_power_w)}</td>"
            f"<td class='n'>{mem(n.gpu_mem_used_peak_bytes)}</td>"
            f"<td class='n'>{mem(n.system_mem_used_peak_bytes)}</td></tr>"
        )
    c = en.cluster
    if c is not None:
        rows.append(
            f"<tr><th>cluster ({len(c.nodes)} nodes)</th><td></td><td></td>"
            f"<th class='n'>{fmt('energy.total_j', c.energy_j)}</th>"
            f"<th class='n'>{fmt('avg_power_w', c.avg_power_w)}</th><td></td>"
            f"<th class='n'>{mem(c.gpu_mem_used_peak_bytes)}</th>"
            f"<th class='n'>{mem(c.system_mem_used_peak_bytes)}</th></tr>"
        )
    return "<h4>Per node</h4>" + head + "".join(rows) + "</tbody></table>"


def _energy_block(summary: Summary) -> str:
    en = summary.energy
    if not en.available:
        return (
            f"<h3>Energy</h3><p class='missing'>Not available: {esc(en.reason)}.</p>"
            + _nodes_table(summary)
        )
    power = en.power

    def fmt(name: str, value: Any) -> str:
        return metric(name).format(value)

    rows: list[tuple[str, Any]] = [
        ("method / source", f"{en.method} / {en.source}"),
        ("devices", ", ".join(en.devices)),
        ("total", fmt("energy.total_j", en.total_j)),
        ("per output token", fmt("j_per_token", en.j_per_output_token)),
        ("tokens per joule", fmt("tokens_per_j", en.tokens_per_j)),
        (
            "average / peak power",
            f"{fmt('avg_power_w', power.avg_w)} / {fmt('peak_power_w', power.peak_w)}",
        ),
        ("power limit", fmt("peak_power_w", power.limit_w) if power.limit_w else None),
        (
            "idle baseline",
            fmt("idle_baseline_w", en.idle_baseline_w) if en.idle_baseline_w else None,
        ),
    ]
    for phase, p in en.phases.items():
        rows.append((f"phase {phase}", fmt("energy.total_j", p.energy_j)))
    notes = "".join(f"<li>{esc(n)}</li>" for n in en.notes)
    return (
        "<h3>Energy</h3>"
        + _kv_table(rows)
        + _nodes_table(summary)
        + (f"<ul class='caption'>{notes}</ul>" if notes else "")
    )


def _advice(summary: Summary) -> str:
    out = ['<section id="advice"><h2>Advice</h2>']
    if not summary.advice:
        why = "" if summary.roofline.available else f" (no roofline: {summary.roofline.reason})"
        out.append(f"<p>No suggestions for this run{esc(why)}.</p>")
    else:
        out.append(
            "<table><thead><tr><th>#</th><th>technique</th><th>why</th>"
            "<th class='n'>projected gain</th><th>assumptions</th>"
            "<th>calibration (measured by our studies)</th></tr></thead><tbody>"
        )
        for i, a in enumerate(summary.advice, start=1):
            g = a.projected_gain
            out.append(
                f"<tr><td>{esc(a.rank or i)}</td><td>{esc(a.technique)}</td>"
                f"<td>{esc(a.why)}</td>"
                f"<td class='n'>{esc(_gain_text(g))} {esc(g.unit)}</td>"
                f"<td>{esc(a.assumptions)}</td>"
                f"<td>{esc(a.calibration.text if a.calibration is not None else '')}</td></tr>"
            )
        out.append("</tbody></table>")
    out.append(_projections(summary))
    out.append("</section>")
    return "".join(out)


def _gain_text(g: Gain) -> str:
    """``low–high`` of a projected gain (just the value when there is no range)."""
    value, low = g.value, g.low
    if low is not None and value is not None and low < value:
        return f"{fmt_num(low)}–{fmt_num(value)}"
    return str(fmt_num(value))


def _projections(summary: Summary) -> str:
    if not summary.projections:
        return ""
    out = [
        "<h3>The same workload on other devices (what-if)</h3>"
        "<table><thead><tr><th>device</th><th class='n'>TTFT</th><th class='n'>TPOT</th>"
        "<th class='n'>throughput</th><th>prefill / decode bound</th><th>basis</th></tr>"
        "</thead><tbody>"
    ]

    def span(p: Projection, key: str, fmt: Callable[[Any], str]) -> str:
        lo, hi = p.range_value("compiled", key), p.range_value("eager", key)
        if lo is not None and hi is not None:
            return f"{fmt(lo)} – {fmt(hi)}"
        return fmt(getattr(p, key))

    rate = metric("output_tok_s").format
    for p in summary.projections:
        out.append(
            f"<tr><td>{esc(p.device.name or p.device.key)}</td>"
            f"<td class='n'>{esc(span(p, 'ttft_s', fmt_time))}</td>"
            f"<td class='n'>{esc(span(p, 'tpot_s', fmt_time))}</td>"
            f"<td class='n'>{esc(span(p, 'throughput_tok_s', rate))}</td>"
            f"<td>{esc(p.prefill.bound)} / {esc(p.decode.bound)}</td>"
            f"<td class='caption'>{esc(p.basis)}"
            + (f"<br>{esc(p.checked)}" if p.checked else "")
            + "</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def _ms(x: Any) -> str:
    return "" if x is None or not math.isfinite(x) else f"{x * 1e3:.2f}"


def _request_table(run: ReportRun, max_requests: int, rows: pd.DataFrame) -> str:
    """The first ``max_requests`` requests; ``rows`` are their per-request rows
    (:func:`request_rows` of the requests sorted by id), derived once per report."""
    req = run.requests
    out = ['<section id="requests"><h2>Requests</h2>']
    if req.empty:
        out.append("<p class='missing'>No requests recorded.</p></section>")
        return "".join(out)
    r = req.sort_values("request_id", kind="stable").reset_index(drop=True)
    pr = rows
    n = len(r)
    shown = min(n, max_requests)
    out.append(
        f"<p class='caption'>Showing the first {shown:,} of {n:,} requests "
        "(by request id). Times in ms. "
        + (
            "The full table: <code>perfscope export RUN --format csv</code>.</p>"
            if shown < n
            else "</p>"
        )
    )
    out.append(
        "<table id='request-table'><thead><tr><th class='n'>id</th><th class='n'>prompt</th>"
        "<th class='n'>output</th><th class='n'>TTFT</th><th class='n'>TPOT</th>"
        "<th class='n'>E2E</th><th class='n'>sent at (s)</th><th>status</th></tr></thead><tbody>"
    )
    sent = r["t_sent"].astype("float64").to_numpy() * 1e-9
    errs: list[Any] = r["error"].tolist()
    warm = r["is_warmup"].to_numpy()
    rid, ptok, otok = (r[c].to_numpy() for c in ("request_id", "prompt_tokens", "output_tokens"))
    ttft, tpot, e2e = (pr[c].to_numpy(dtype=float) for c in ("ttft", "tpot", "e2e"))
    for i in range(shown):
        err = errs[i]
        has_err = err is not None and err == err
        status = (
            f"<td class='err'>{esc(err)}</td>"
            if has_err
            else ("<td>warmup</td>" if bool(warm[i]) else "<td>ok</td>")
        )
        out.append(
            f"<tr><td class='n'>{int(rid[i])}</td>"
            f"<td class='n'>{int(ptok[i])}</td>"
            f"<td class='n'>{int(otok[i])}</td>"
            f"<td class='n'>{_ms(ttft[i])}</td>"
            f"<td class='n'>{_ms(tpot[i])}</td>"
            f"<td class='n'>{_ms(e2e[i])}</td>"
            f"<td class='n'>{'' if not np.isfinite(sent[i]) else f'{sent[i]:.3f}'}</td>"
            f"{status}</tr>"
        )
    out.append("</tbody></table></section>")
    return "".join(out)


def _environment(run: ReportRun, typed: Summary) -> str:
    m = manifest_view(run.manifest)
    host = m.host
    rows: list[tuple[str, Any]] = [
        ("perfscope", m.perfscope_version or typed.perfscope_version),
        # The schema the stored summary.json was written with (a typed Summary reads as /2).
        ("summary schema", value_at(run.summary, "schema")),
        ("python", host.python),
        ("torch", host.torch or m.engine.config.torch),
        ("platform", host.platform),
        ("machine / CPUs", f"{host.machine} / {host.cpu_count}"),
        ("host", host.hostname),
        ("plotly (report)", plotly.__version__),
    ]
    rows += list(host.extra.items())
    if host.contention is not None:
        rows.append(("CPU contention", _contention_text(host.contention)))
    tele = m.telemetry
    if tele is not None:
        rows.append(("telemetry", f"{tele.status}; devices {tele.devices}"))
    return '<section id="environment"><h2>Environment</h2>' + _kv_table(rows) + "</section>"


def _contention_text(c: Mapping[str, Any]) -> str:
    """The capture's CPU contention measurement as one sentence (not its JSON)."""
    window = fmt_time(c.get("window_s"))
    if c.get("too_short"):
        return (
            f"not measured: the window ({window}) is shorter than {fmt_time(c.get('min_window_s'))}"
        )
    parts = [
        f"other processes {fmt_pct(c.get('others_share'))} of {fmt_count(c.get('cpu_count'))} "
        f"cores over {window}",
        f"steal {fmt_pct(c.get('steal_share'))}",
        f"perfscope {fmt_num(c.get('own_cpu_s'))} CPU-s",
    ]
    if c.get("server_ports"):
        ports = ", ".join(str(p) for p in c["server_ports"])
        parts.append(f"server on port {ports} {fmt_num(c.get('server_cpu_s'))} CPU-s (excluded)")
    return "; ".join(parts)


# ---------------------------------------------------------------------- report


def render_report(
    run: ReportRun,
    *,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    timeline_max_rows: int | None = None,
    generated_at: datetime | None = None,
    summary: Summary | None = None,
) -> str:
    """The complete report of ``run`` as an HTML string.

    Args:
        run: a stored run with its summary (``perfscope.profiler.store.StoredRun``).
        max_requests: rows of the per-request table.
        timeline_max_rows: above this many requests the timeline is a density view.
        generated_at: timestamp printed in the footer (default: now).
        summary: the run's summary as the analysis returned it; default: ``run.summary``
            read as a record (the same summary, converted once more).

    Raises:
        ValueError: the run has no summary (run ``perfscope analyze`` first).
    """
    if summary is not None:
        typed = summary
    elif run.summary is not None:
        typed = as_summary(run.summary)
    else:
        raise ValueError(f"run {run.path} has no summary.json; run 'perfscope analyze' first")
    # Per-request rows derived once: the request table and the latency figure share them.
    ordered = run.requests.sort_values("request_id", kind="stable").reset_index(drop=True)
    rows = request_rows(ordered)
    tables = RunTables(typed, run.requests, run.chunks, run.steps, run.telemetry, rows=rows)
    kw = {} if timeline_max_rows is None else {"timeline_max_rows": timeline_max_rows}
    figures = run_figures(tables, **kw)
    m = manifest_view(run.manifest)
    status = str(m.status or typed.status or "unknown")
    title_name = m.name or m.run_id or run.path.name
    banner = ""
    if status != "complete":
        errs = "; ".join(m.errors) or "no error recorded"
        banner = (
            f'<div class="banner{" bad" if status == "failed" else ""}">'
            f"This run is <b>{esc(status)}</b>: {esc(errs)}. The numbers cover the requests "
            "captured before it stopped.</div>"
        )
    failed = typed.counts.failed
    if failed:
        banner += (
            f'<div class="banner">{failed:,} request(s) failed; see Errors and the request '
            "table.</div>"
        )
    for warning in typed.warnings:
        banner += f'<div class="banner">Warning: {esc(warning)}.</div>'
    queue_line = queueing_line(typed.load_mode, run)  # its tables, in memory
    if queue_line is not None:
        banner += f'<div class="banner" id="queueing">{esc(queue_line)}.</div>'
    when = (generated_at or datetime.now(UTC)).isoformat(timespec="seconds")
    engine = m.engine
    model_name = (engine.model or {}).get("name") or typed.model
    header = (
        f"<header><h1>{esc(title_name)} "
        f'<span class="badge {esc(status)}">{esc(status)}</span></h1>'
        f'<div class="sub">run <span class="mono">{esc(m.run_id)}</span> · '
        f"engine {esc(engine.uri)} · "
        f"model {esc(model_name if isinstance(model_name, str) else '')} · "
        f"started {esc(m.started_at)}</div></header>"
        '<nav class="noprint"><a href="#headline">Headline</a>'
        '<a href="#verdicts">Verdicts</a><a href="#figures">Figures</a>'
        '<a href="#numbers">Numbers</a><a href="#advice">Advice</a>'
        '<a href="#requests">Requests</a><a href="#run">Run</a>'
        '<a href="#environment">Environment</a></nav>'
    )
    cards, numbers = _headline(typed)
    # The answer first: cards, then verdicts beside the roofline; the rest below.
    lead = [f for f in figures if f.key == "roofline"]
    rest = [f for f in figures if f.key != "roofline"]
    body = "\n".join(
        [
            header,
            banner,
            cards,
            '<div class="lead">'
            + _verdicts(typed)
            + '<div class="lead-figure">'
            + "".join(_figure_block(f) for f in lead)
            + "</div></div>",
            '<section id="figures"><h2>Figures</h2>' + figures_html(rest) + "</section>",
            numbers,
            _advice(typed),
            _request_table(run, max_requests, rows),
            '<details class="meta"><summary>Run configuration, model, hardware and '
            "workload</summary>" + _run_header(run, typed) + "</details>",
            '<details class="meta"><summary>Environment</summary>'
            + _environment(run, typed)
            + "</details>",
            f"<footer>Generated by perfscope on {esc(when)} from {esc(run.path.name)}; "
            "works offline (plotly.js inlined). Times are seconds since the run's start "
            "unless marked.</footer>",
        ]
    )
    return render_page(f"perfscope report — {title_name}", body, figures)


def write_report(
    run: ReportRun,
    path: Path | None = None,
    *,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    timeline_max_rows: int | None = None,
    summary: Summary | None = None,
) -> Path:
    """Render and write the report (``profiler/output.py``: atomic for a regular file, in
    place for a device or pipe, ``-`` for stdout); default ``<run dir>/report.html``.
    ``summary``: the run's summary record when the caller holds it (see :func:`render_report`)."""
    out = Path(path) if path is not None else Path(run.path) / "report.html"
    text = render_report(
        run, max_requests=max_requests, timeline_max_rows=timeline_max_rows, summary=summary
    )
    write_output_text(out, text)  # atomic for a file; in place for a device, FIFO, socket
    return out
