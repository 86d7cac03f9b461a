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

import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import plotly
import plotly.io as pio

from perfscope.analysis.metrics import per_request
from perfscope.dashboard._fmt import (
    esc,
    fmt_bytes,
    fmt_count,
    fmt_num,
    fmt_pct,
    fmt_rate,
    fmt_si,
    fmt_time,
)
from perfscope.dashboard.exporters import ExportableRun
from perfscope.dashboard.figures import FigureSpec, RunTables, run_figures

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

_PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


class ReportRun(ExportableRun, Protocol):
    """What the report reads: an exportable run that also knows its directory."""

    @property
    def path(self) -> Path: ...


# ---------------------------------------------------------------------- page frame

_CSS = """
:root { --fg:#1d2430; --muted:#5f6b7a; --line:#dde3ea; --bg:#fff; --card:#f6f8fa;
        --ok:#2e7d32; --warn:#b26a00; --bad:#c62828; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--fg); background: var(--bg); margin: 0 auto; max-width: 1200px;
       padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 4px; word-break: break-word; }
h2 { font-size: 18px; margin: 28px 0 8px; padding-bottom: 4px;
     border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 4px; }
.sub { color: var(--muted); }
nav { margin: 8px 0 12px; font-size: 13px; }
nav a { margin-right: 12px; color: #2f5d8a; text-decoration: none; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
         font-weight: 600; color: #fff; vertical-align: middle; }
.badge.complete { background: var(--ok); } .badge.interrupted { background: var(--warn); }
.badge.failed, .badge.unknown, .badge.running { background: var(--bad); }
.banner { border-left: 4px solid var(--warn); background: #fff8e1; padding: 8px 12px;
          margin: 10px 0; }
.banner.bad { border-color: var(--bad); background: #fdecea; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr));
         gap: 10px; margin: 10px 0; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
        padding: 8px 10px; }
.card .k { font-size: 12px; color: var(--muted); }
.card .v { font-size: 19px; font-weight: 600; }
.card .s { font-size: 12px; color: var(--muted); }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px 3px 0; text-align: left;
         vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { color: var(--muted); font-weight: 500; width: 210px; }
td.err { color: var(--bad); word-break: break-word; }
.verdict { padding: 6px 10px; margin: 6px 0; background: var(--card);
           border-left: 4px solid #4e79a7; }
.verdict b { text-transform: capitalize; }
.figure { margin: 10px 0 22px; break-inside: avoid; page-break-inside: avoid; }
.figure .plot { width: 100%; min-height: 200px; }
.caption { color: var(--muted); font-size: 12.5px; margin: 2px 0 4px; }
.missing { color: var(--muted); font-style: italic; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
              font-size: 12px; word-break: break-all; }
#render-errors { color: var(--bad); }
footer { margin-top: 36px; color: var(--muted); font-size: 12px; }
@media print {
  nav, .noprint { display: none !important; }
  body { max-width: none; padding: 0; font-size: 11px; }
  h2 { break-after: avoid; page-break-after: avoid; }
  section { break-inside: auto; }
  .card, table, .verdict { break-inside: avoid; page-break-inside: avoid; }
  a { color: inherit; text-decoration: none; }
}
"""

# Collects uncaught errors from the moment the page starts parsing.
_ERROR_HOOK = """
window.__perfscopeErrors = [];
window.__perfscopeError = function (text) {
  window.__perfscopeErrors.push(text);
  var b = document.body;
  if (b && b.getAttribute('data-render') !== 'pending') { b.setAttribute('data-render', 'error'); }
};
window.addEventListener('error', function (e) { window.__perfscopeError(String(e.message || e)); });
window.addEventListener('unhandledrejection', function (e) {
  window.__perfscopeError('unhandled rejection: ' + String(e.reason));
});
"""

# Draws every figure from its JSON block, then marks the body with the outcome.
_RENDER = """
(function () {
  var errors = window.__perfscopeErrors;
  var body = document.body;
  function finish(n) {
    body.setAttribute('data-figures-rendered', String(n));
    if (errors.length) {
      body.setAttribute('data-render', 'error');
      var box = document.getElementById('render-errors');
      if (box) { box.textContent = 'Some figures failed to draw: ' + errors.join('; '); }
    } else {
      body.setAttribute('data-render', 'ok');
    }
  }
  if (typeof Plotly === 'undefined') {
    errors.push('plotly.js did not load'); finish(0); return;
  }
  var config = __CONFIG__;
  var divs = document.querySelectorAll('div[data-figure]');
  var jobs = [];
  var drawn = 0;
  for (var i = 0; i < divs.length; i++) {
    var div = divs[i];
    try {
      var spec = JSON.parse(document.getElementById(div.getAttribute('data-figure')).textContent);
      jobs.push(Plotly.newPlot(div, spec.data, spec.layout, config).then(function () {
        drawn += 1;
      }));
    } catch (e) {
      errors.push(div.id + ': ' + e.message);
    }
  }
  function settle() {
    Promise.all(jobs).then(function () { finish(drawn); }, function (e) {
      errors.push(String(e)); finish(drawn);
    });
  }
  // Finish after the whole page has run, so errors in later scripts are counted too.
  if (document.readyState === 'complete') { settle(); }
  else { window.addEventListener('load', settle); }
})();
"""


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
    from plotly.offline import get_plotlyjs

    has_figures = any(f.figure is not None for f in figures)
    scripts = ""
    if has_figures:
        scripts = (
            f"<script>{get_plotlyjs()}</script>\n"
            f"<script>{_RENDER.replace('__CONFIG__', json.dumps(_PLOTLY_CONFIG))}</script>"
        )
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
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style>\n"
        f"<script>{_ERROR_HOOK}</script>\n</head>\n"
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


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


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


def _headline(summary: dict[str, Any]) -> str:
    lat = summary.get("latency") or {}
    tp = summary.get("throughput") or {}
    gp = summary.get("goodput") or {}
    counts = summary.get("counts") or {}
    cards = []
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
        d = lat.get(key) or {}
        cards.append(
            _card(
                f"{label} p50 / p99",
                f"{fmt_time(d.get('p50'))} / {fmt_time(d.get('p99'))}",
                f"mean {fmt_time(d.get('mean'))}, n={fmt_count(d.get('count'))}",
            )
        )
    cards.append(
        _card(
            "output throughput",
            fmt_rate(tp.get("output_tok_s"), "tok/s"),
            f"{fmt_rate(tp.get('req_s'), 'req/s')}; busy {fmt_rate(tp.get('busy_tok_s'), 'tok/s')}",
        )
    )
    slos = gp.get("slos") or {}
    slo_txt = ", ".join(f"{k}≤{fmt_time(v)}" for k, v in slos.items()) or "no SLOs set"
    cards.append(
        _card(
            "goodput / SLO attainment",
            f"{fmt_rate(gp.get('goodput_req_s'), 'req/s')} / {fmt_pct(gp.get('attainment'))}",
            slo_txt,
        )
    )
    roof = summary.get("roofline") or {}
    for phase, p in (roof.get("phases") or {}).items() if roof.get("available") else []:
        cards.append(
            _card(
                f"MFU / MBU {phase}",
                f"{fmt_pct(p.get('mfu'))} / {fmt_pct(p.get('mbu'))}",
                str(p.get("verdict") or "") + (" (estimated)" if p.get("estimated") else ""),
            )
        )
    if not roof.get("available"):
        cards.append(_card("MFU / MBU", "n/a", "no roofline (needs model and device)"))
    en = summary.get("energy") or {}
    if en.get("available"):
        cards.append(
            _card(
                "energy per output token",
                f"{fmt_num(en.get('j_per_output_token'))} J",
                f"{fmt_num(en.get('total_j'))} J total, avg {fmt_num(en.get('avg_power_w'))} W "
                f"({en.get('method')})",
            )
        )
    else:
        cards.append(_card("energy per output token", "n/a", "no energy telemetry"))
    cards.append(
        _card(
            "requests",
            f"{fmt_count(counts.get('completed'))} ok / {fmt_count(counts.get('failed'))} failed",
            f"{fmt_count(counts.get('warmup'))} warmup; window {fmt_time(summary.get('window_s'))}",
        )
    )
    # The static table: every latency distribution and the throughput numbers.
    rows = [
        '<table id="headline-table"><thead><tr><th>metric</th>'
        + "".join(
            f'<th class="n">{c}</th>' for c in ("n", "mean", "p50", "p90", "p95", "p99", "max")
        )
        + "</tr></thead><tbody>"
    ]
    for key, label in (
        ("ttft", "TTFT"),
        ("tpot", "TPOT"),
        ("itl", "ITL"),
        ("e2e", "E2E"),
        ("ntpot", "E2E per token"),
    ):
        d = lat.get(key) or {}
        rows.append(
            f"<tr><td>{label}</td><td class='n'>{fmt_count(d.get('count'))}</td>"
            + "".join(
                f"<td class='n' data-key='{key}.{c}'>{fmt_time(d.get(c))}</td>"
                for c in ("mean", "p50", "p90", "p95", "p99", "max")
            )
            + "</tr>"
        )
    rows.append("</tbody></table>")
    tp_rows = [
        ("output tokens/s", fmt_rate(tp.get("output_tok_s"), "tok/s")),
        ("total tokens/s (prompt + output)", fmt_rate(tp.get("total_tok_s"), "tok/s")),
        ("requests/s", fmt_rate(tp.get("req_s"), "req/s")),
        (
            f"busy tokens/s (busy {fmt_time(tp.get('busy_s'))}, from {tp.get('busy_source')})",
            fmt_rate(tp.get("busy_tok_s"), "tok/s"),
        ),
        ("goodput", fmt_rate(gp.get("goodput_req_s"), "req/s")),
        ("SLO attainment", fmt_pct(gp.get("attainment"))),
        (
            "output / prompt tokens",
            f"{fmt_count(counts.get('output_tokens'))} / {fmt_count(counts.get('prompt_tokens'))}",
        ),
        (
            "driver lag p50 / max",
            f"{fmt_time(_get(summary, 'driver_lag', 'p50'))} / "
            f"{fmt_time(_get(summary, 'driver_lag', 'max'))}",
        ),
    ]
    return (
        '<section id="headline"><h2>Headline</h2><div class="cards">'
        + "".join(cards)
        + "</div>"
        + "".join(rows)
        + _kv_table(tp_rows)
        + "</section>"
    )


def _hardware_rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    section = summary.get("hardware")
    roof = summary.get("roofline") or {}
    # summary["hardware"] is {"spec": DeviceSpec.to_dict() | None, "resolved_from", "reason"}.
    hw = section.get("spec") if isinstance(section, dict) and "spec" in section else section
    if isinstance(hw, dict) and (hw.get("name") or hw.get("key")):
        resolved = section.get("resolved_from") if isinstance(section, dict) else None
        peaks = hw.get("peak_flops") or {}
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
    c = roof.get("ceilings") or {}
    dev = roof.get("device") or {}
    if c:
        return [
            ("device", f"{dev.get('name')} ({dev.get('key')}, {dev.get('kind')})"),
            ("ceilings source", c.get("source")),
            ("peak", f"{c.get('dtype')} {fmt_si(c.get('peak_flops'), 'FLOP/s')}"),
            ("memory bandwidth", fmt_si(c.get("mem_bw_bytes_s"), "B/s")),
            (
                "last-level cache",
                f"{fmt_bytes(c.get('cache_bytes'))} at {fmt_si(c.get('cache_bw_bytes_s'), 'B/s')}"
                if c.get("cache_bytes")
                else None,
            ),
            ("ridge point", f"{fmt_num(c.get('ridge_point'))} FLOP/byte"),
        ]
    reason = section.get("reason") if isinstance(section, dict) else None
    return [("device", f"not available: {reason or 'analyse with --hw KEY for ceilings'}")]


def _run_header(run: ReportRun, summary: dict[str, Any]) -> str:
    m = run.manifest
    engine = m.get("engine") or {}
    model = engine.get("model") or summary.get("model") or {}
    cfg = engine.get("config") or {}
    model_rows: list[tuple[str, Any]] = []
    if isinstance(model, dict) and model:
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
            ("parameters", fmt_count(cfg.get("n_params")) if cfg.get("n_params") else None),
        ]
    elif model:
        model_rows = [("model", model)]
    slos = (summary.get("goodput") or {}).get("slos") or m.get("slos") or {}
    status = str(m.get("status") or summary.get("status") or "unknown")
    errors = list(m.get("errors") or [])
    err_counts = summary.get("errors") or []
    parts = [
        '<section id="run"><h2>Run</h2>',
        _kv_table(
            [
                ("run id", m.get("run_id")),
                ("name", m.get("name")),
                ("status", status),
                ("started", m.get("started_at")),
                ("ended", m.get("ended_at")),
                ("command", " ".join(str(c) for c in (m.get("command") or []))),
                ("engine", engine.get("uri")),
                ("engine kind", engine.get("kind")),
                ("engine device / dtype", f"{engine.get('device')} / {engine.get('dtype')}"),
                ("engine scheduler / batch", _sched(cfg)),
                *model_rows,
            ]
        ),
        "<h3>Hardware and ceilings</h3>",
        _kv_table(_hardware_rows(summary)),
        "<h3>Workload and load</h3>",
        _kv_table(
            [
                *[(f"workload {k}", v) for k, v in (m.get("workload") or {}).items()],
                *[(f"load {k}", v) for k, v in (m.get("load") or {}).items()],
                ("SLOs", ", ".join(f"{k} ≤ {fmt_time(v)}" for k, v in slos.items()) or "none"),
            ]
        ),
    ]
    if errors or err_counts:
        parts.append("<h3>Errors</h3><table><tr><th>error</th><th class='n'>requests</th></tr>")
        for e in errors:
            parts.append(f"<tr><td class='err'>{esc(e)}</td><td class='n'>run</td></tr>")
        for e in err_counts:
            parts.append(
                f"<tr><td class='err'>{esc(e.get('error'))}</td>"
                f"<td class='n'>{fmt_count(e.get('count'))}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</section>")
    return "".join(parts)


def _sched(cfg: dict[str, Any]) -> str | None:
    if not cfg.get("scheduler") and not cfg.get("batch_size"):
        return None
    return f"{cfg.get('scheduler')} / {cfg.get('batch_size')}"


def _verdicts(summary: dict[str, Any]) -> str:
    roof = summary.get("roofline") or {}
    out = ['<section id="verdicts"><h2>Verdicts</h2>']
    if not roof.get("available"):
        reason = roof.get("reason") if roof else "the summary has no roofline section"
        out.append(f'<p class="missing">Not available: {esc(reason or "no phase data")}.</p>')
    else:
        for phase, p in (roof.get("phases") or {}).items():
            out.append(
                f'<div class="verdict" data-phase="{esc(phase)}"><b>{esc(phase)}: '
                f"{esc(p.get('verdict'))}</b> — {esc(p.get('evidence'))}</div>"
            )
        out.append(
            f"<p class='caption'>FLOPs counted {esc(roof.get('flops_convention'))}; "
            f"overhead-bound below {fmt_pct(roof.get('overhead_threshold'))} MFU and MBU.</p>"
        )
        lat = roof.get("latency") or {}
        if lat.get("decode_stall_share") is not None:
            out.append(
                f"<p>Decode stalled by prefill: {fmt_pct(lat.get('decode_stall_share'))} of "
                f"decode time (longest stall {fmt_time(lat.get('prefill_stall_max_s'))}).</p>"
            )
    out.append(_energy_block(summary))
    out.append("</section>")
    return "".join(out)


def _energy_block(summary: dict[str, Any]) -> str:
    en = summary.get("energy")
    if not isinstance(en, dict):
        return "<h3>Energy</h3><p class='missing'>Not available: no energy section.</p>"
    if not en.get("available"):
        return f"<h3>Energy</h3><p class='missing'>Not available: {esc(en.get('reason'))}.</p>"
    power = en.get("power") or {}
    rows: list[tuple[str, Any]] = [
        ("method / source", f"{en.get('method')} / {en.get('source')}"),
        ("devices", ", ".join(str(d) for d in en.get("devices") or [])),
        ("total", f"{fmt_num(en.get('total_j'))} J"),
        ("per output token", f"{fmt_num(en.get('j_per_output_token'))} J"),
        ("tokens per joule", fmt_num(en.get("tokens_per_j"))),
        (
            "average / peak power",
            f"{fmt_num(power.get('avg_w'))} / {fmt_num(power.get('peak_w'))} W",
        ),
        ("power limit", f"{fmt_num(power.get('limit_w'))} W" if power.get("limit_w") else None),
        (
            "idle baseline",
            f"{fmt_num(en.get('idle_baseline_w'))} W" if en.get("idle_baseline_w") else None,
        ),
    ]
    for phase, p in (en.get("phases") or {}).items():
        rows.append((f"phase {phase}", f"{fmt_num(p.get('energy_j'))} J"))
    notes = "".join(f"<li>{esc(n)}</li>" for n in en.get("notes") or [])
    return (
        "<h3>Energy</h3>" + _kv_table(rows) + (f"<ul class='caption'>{notes}</ul>" if notes else "")
    )


def _advice(summary: dict[str, Any]) -> str:
    advice = summary.get("advice")
    out = ['<section id="advice"><h2>Advice</h2>']
    if not isinstance(advice, list):
        out.append("<p class='missing'>Not available: the summary has no advice section.</p>")
    elif not advice:
        out.append("<p>No suggestions for this run.</p>")
    else:
        out.append(
            "<table><thead><tr><th>#</th><th>technique</th><th>why</th>"
            "<th class='n'>projected gain</th><th>assumptions</th></tr></thead><tbody>"
        )
        for i, a in enumerate(advice, start=1):
            g = a.get("projected_gain") or {}
            out.append(
                f"<tr><td>{esc(a.get('rank', i))}</td><td>{esc(a.get('technique'))}</td>"
                f"<td>{esc(a.get('why'))}</td>"
                f"<td class='n'>{esc(_gain_text(g))} {esc(g.get('unit'))}</td>"
                f"<td>{esc(a.get('assumptions'))}</td></tr>"
            )
        out.append("</tbody></table>")
    out.append(_projections(summary))
    out.append("</section>")
    return "".join(out)


def _gain_text(g: dict[str, Any]) -> str:
    """``low–high`` of a projected gain (just the value when there is no range)."""
    value, low = g.get("value"), g.get("low")
    if low is not None and value is not None and low < value:
        return f"{fmt_num(low)}–{fmt_num(value)}"
    return str(fmt_num(value))


def _projections(summary: dict[str, Any]) -> str:
    proj = summary.get("projections")
    if not isinstance(proj, list) or not proj:
        return ""
    out = [
        "<h3>The same workload on other devices (what-if)</h3>"
        "<table><thead><tr><th>device</th><th class='n'>TTFT</th><th class='n'>TPOT</th>"
        "<th class='n'>throughput</th><th>prefill / decode bound</th><th>basis</th></tr>"
        "</thead><tbody>"
    ]

    def span(p: dict[str, Any], key: str, fmt: Any) -> str:
        rng = p.get("range") or {}
        lo, hi = (rng.get("compiled") or {}).get(key), (rng.get("eager") or {}).get(key)
        if lo is not None and hi is not None:
            return f"{fmt(lo)} – {fmt(hi)}"
        return str(fmt(p.get(key)))

    for p in proj:
        dev = p.get("device") or {}
        out.append(
            f"<tr><td>{esc(dev.get('name') or dev.get('key'))}</td>"
            f"<td class='n'>{esc(span(p, 'ttft_s', fmt_time))}</td>"
            f"<td class='n'>{esc(span(p, 'tpot_s', fmt_time))}</td>"
            f"<td class='n'>{esc(span(p, 'throughput_tok_s', lambda v: fmt_rate(v, 'tok/s')))}</td>"
            f"<td>{esc(_get(p, 'prefill', 'bound'))} / {esc(_get(p, 'decode', 'bound'))}</td>"
            f"<td class='caption'>{esc(p.get('basis'))}</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def _ms(x: Any) -> str:
    return "" if x is None or not math.isfinite(x) else f"{x * 1e3:.2f}"


def _request_table(run: ReportRun, max_requests: int) -> str:
    req = run.requests
    out = ['<section id="requests"><h2>Requests</h2>']
    if req.empty:
        out.append("<p class='missing'>No requests recorded.</p></section>")
        return "".join(out)
    r = req.sort_values("request_id", kind="stable").reset_index(drop=True)
    pr = per_request(r)
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


def _environment(run: ReportRun, summary: dict[str, Any]) -> str:
    m = run.manifest
    host = m.get("host") or {}
    cfg = (m.get("engine") or {}).get("config") or {}
    rows: list[tuple[str, Any]] = [
        ("perfscope", m.get("perfscope_version") or summary.get("perfscope_version")),
        ("summary schema", summary.get("schema")),
        ("python", host.get("python")),
        ("torch", host.get("torch") or cfg.get("torch")),
        ("platform", host.get("platform")),
        ("machine / CPUs", f"{host.get('machine')} / {host.get('cpu_count')}"),
        ("host", host.get("hostname")),
        ("plotly (report)", plotly.__version__),
    ]
    rows += [
        (k, v)
        for k, v in host.items()
        if k not in {"python", "torch", "platform", "machine", "cpu_count", "hostname"}
    ]
    tele = m.get("telemetry")
    if isinstance(tele, dict):
        rows.append(("telemetry", f"{tele.get('status')}; devices {tele.get('devices')}"))
    return '<section id="environment"><h2>Environment</h2>' + _kv_table(rows) + "</section>"


# ---------------------------------------------------------------------- report


def render_report(
    run: ReportRun,
    *,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    timeline_max_rows: int | None = None,
    generated_at: datetime | None = None,
) -> str:
    """The complete report of ``run`` as an HTML string.

    Args:
        run: a stored run with its summary (``perfscope.profiler.store.StoredRun``).
        max_requests: rows of the per-request table.
        timeline_max_rows: above this many requests the timeline is a density view.
        generated_at: timestamp printed in the footer (default: now).

    Raises:
        ValueError: the run has no summary (run ``perfscope analyze`` first).
    """
    summary = run.summary
    if summary is None:
        raise ValueError(f"run {run.path} has no summary.json; run 'perfscope analyze' first")
    tables = RunTables(summary, run.requests, run.chunks, run.steps, run.telemetry)
    kw = {} if timeline_max_rows is None else {"timeline_max_rows": timeline_max_rows}
    figures = run_figures(tables, **kw)
    m = run.manifest
    status = str(m.get("status") or summary.get("status") or "unknown")
    title_name = m.get("name") or m.get("run_id") or run.path.name
    banner = ""
    if status != "complete":
        errs = "; ".join(str(e) for e in (m.get("errors") or [])) or "no error recorded"
        banner = (
            f'<div class="banner{" bad" if status == "failed" else ""}">'
            f"This run is <b>{esc(status)}</b>: {esc(errs)}. The numbers cover the requests "
            "captured before it stopped.</div>"
        )
    failed = int(_get(summary, "counts", "failed") or 0)
    if failed:
        banner += (
            f'<div class="banner">{failed:,} request(s) failed; see Errors and the request '
            "table.</div>"
        )
    for warning in summary.get("warnings") or []:
        banner += f'<div class="banner">Warning: {esc(warning)}.</div>'
    when = (generated_at or datetime.now(UTC)).isoformat(timespec="seconds")
    engine = m.get("engine") or {}
    model_name = _get(engine, "model", "name") or summary.get("model")
    header = (
        f"<header><h1>{esc(title_name)} "
        f'<span class="badge {esc(status)}">{esc(status)}</span></h1>'
        f'<div class="sub">run <span class="mono">{esc(m.get("run_id"))}</span> · '
        f"engine {esc(engine.get('uri'))} · "
        f"model {esc(model_name if isinstance(model_name, str) else '')} · "
        f"started {esc(m.get('started_at'))}</div></header>"
        '<nav class="noprint"><a href="#run">Run</a><a href="#headline">Headline</a>'
        '<a href="#verdicts">Verdicts</a><a href="#figures">Figures</a>'
        '<a href="#advice">Advice</a><a href="#requests">Requests</a>'
        '<a href="#environment">Environment</a></nav>'
    )
    body = "\n".join(
        [
            header,
            banner,
            _run_header(run, summary),
            _headline(summary),
            _verdicts(summary),
            '<section id="figures"><h2>Figures</h2>' + figures_html(figures) + "</section>",
            _advice(summary),
            _request_table(run, max_requests),
            _environment(run, summary),
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
) -> Path:
    """Render and write the report atomically; default ``<run dir>/report.html``."""
    out = Path(path) if path is not None else Path(run.path) / "report.html"
    text = render_report(run, max_requests=max_requests, timeline_max_rows=timeline_max_rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out
