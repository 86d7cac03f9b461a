"""Comparison of two or more runs: the rich table of ``perfscope compare`` and its HTML page.

The statistics (ratios, bootstrap intervals) live in :mod:`perfscope.analysis.compare`;
this module gathers the runs' inputs, presents the result and draws the comparison figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from perfscope.analysis.catalogue import find_metric, format_value, value_at
from perfscope.analysis.compare import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_CONFIDENCE,
    compare_runs,
    latency_samples,
)
from perfscope.dashboard._fmt import esc
from perfscope.dashboard.figures import (
    FigureSpec,
    RunTables,
    comparison_cdf_figure,
    comparison_metrics_figure,
    comparison_roofline_figure,
    comparison_throughput_figure,
)
from perfscope.dashboard.report import figures_html, render_page

__all__ = [
    "compare_tables",
    "comparison_html",
    "comparison_table",
    "format_metric",
    "run_label",
]


def run_label(summary: Mapping[str, Any], fallback: str) -> str:
    """How a run is named in a comparison: its run id (unique), else ``fallback``.

    ``summary`` is a typed :class:`~perfscope.analysis.Summary` or its JSON form."""
    return str(value_at(summary, "run_id") or fallback)


def compare_tables(
    runs: Sequence[RunTables],
    labels: Sequence[str] | None = None,
    *,
    n_boot: int = DEFAULT_BOOTSTRAP,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> dict[str, Any]:
    """:func:`perfscope.analysis.compare.compare_runs` over stored runs (first = baseline),
    with per-request samples taken from their tables."""
    labels = (
        list(labels) if labels else [run_label(r.summary, f"run {i}") for i, r in enumerate(runs)]
    )
    result: dict[str, Any] = compare_runs(
        labels,
        [r.summary for r in runs],
        [latency_samples(r.requests, r.chunks) for r in runs],
        n_boot=n_boot,
        confidence=confidence,
        seed=seed,
    )
    return result


def format_metric(value: Any, row: Mapping[str, Any]) -> str:
    """A compared value in its display unit (the catalogue entry of ``row["key"]``)."""
    m = find_metric(str(row.get("key")))
    if m is not None:
        return m.format(value)
    return format_value(value, row.get("unit") or "number")


def _ratio_text(row: dict[str, Any], i: int) -> tuple[str, str]:
    r = row["ratios"][i]
    ci = row["ci"][i]
    ratio = "n/a" if r is None else f"{r:.3f}x"
    interval = "" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]"
    return ratio, interval


_CHANGE_STYLE = {"better": "green", "worse": "red", "no significant change": "dim"}


def comparison_table(result: dict[str, Any]) -> Table:
    """The comparison as a rich table: values per run, then ratio, CI and verdict of each
    run against the baseline."""
    labels = result["labels"]
    conf = f"{100 * result['confidence']:g}%"
    table = Table(
        title=f"Compared with {labels[0]} (ratios run / baseline; {conf} bootstrap CI, "
        f"{result['n_boot']} resamples)",
        title_justify="left",
    )
    table.add_column("metric")
    for i in range(len(labels)):
        table.add_column("baseline" if i == 0 else f"run {i}", justify="right")
    for i in range(1, len(labels)):
        suffix = f" {i}" if len(labels) > 2 else ""
        table.add_column(f"ratio{suffix}", justify="right")
        table.add_column(f"{conf} CI{suffix}", justify="right")
        table.add_column(f"change{suffix}")
    for row in result["metrics"]:
        cells: list[str | Text] = [row["label"]]
        cells += [format_metric(v, row) for v in row["values"]]
        for i in range(1, len(labels)):
            ratio, interval = _ratio_text(row, i)
            change = row["change"][i]
            cells += [
                ratio,
                interval,
                Text(change or "", style=_CHANGE_STYLE.get(change or "", "")),
            ]
        table.add_row(*cells)
    table.caption = " · ".join(
        f"{'baseline' if i == 0 else f'run {i}'} = {lab}" for i, lab in enumerate(labels)
    )
    return table


def comparison_html(
    runs: Sequence[RunTables],
    result: dict[str, Any],
    *,
    generated_at: datetime | None = None,
) -> str:
    """A self-contained comparison page: the table (static HTML) and the comparison
    figures (metrics side by side, overlaid latency CDFs)."""
    labels = result["labels"]
    conf = f"{100 * result['confidence']:g}%"
    head = ["<tr><th>metric</th>"]
    head += [
        f"<th class='n'>{'baseline' if i == 0 else f'run {i}'}</th>" for i in range(len(labels))
    ]
    for i in range(1, len(labels)):
        sfx = f" {i}" if len(labels) > 2 else ""
        head.append(f"<th class='n'>ratio{sfx}</th><th class='n'>{conf} CI{sfx}</th>")
        head.append(f"<th>change{sfx}</th>")
    head.append("</tr>")
    rows = []
    for row in result["metrics"]:
        cells = [f"<td>{esc(row['label'])}</td>"]
        cells += [f"<td class='n'>{esc(format_metric(v, row))}</td>" for v in row["values"]]
        for i in range(1, len(labels)):
            ratio, interval = _ratio_text(row, i)
            change = row["change"][i] or ""
            cells.append(
                f"<td class='n'>{esc(ratio)}</td><td class='n'>{esc(interval)}</td>"
                f"<td class='change {esc(change.replace(' ', '-'))}'>{esc(change)}</td>"
            )
        rows.append(f"<tr data-key='{esc(row['key'])}'>" + "".join(cells) + "</tr>")
    legend = "".join(
        f"<tr><th>{'baseline' if i == 0 else f'run {i}'}</th><td class='mono'>{esc(lab)}</td>"
        f"<td>{esc(value_at(r.summary, 'status'))}</td>"
        f"<td>{esc(value_at(r.summary, 'engine.uri'))}</td></tr>"
        for i, (lab, r) in enumerate(zip(labels, runs, strict=True))
    )
    figures = [
        FigureSpec(
            "compare-metrics",
            "Key metrics",
            "Latency percentiles (ms) and output throughput per run.",
            comparison_metrics_figure(labels, [r.summary for r in runs]),
        ),
        FigureSpec(
            "compare-cdf",
            "Latency distributions",
            "Empirical CDFs of each run's completed requests.",
            comparison_cdf_figure(labels, runs),
        ),
        FigureSpec(
            "compare-throughput",
            "Throughput over time",
            "Output tokens/s, each run from its own first measured request.",
            comparison_throughput_figure(labels, runs),
        ),
    ]
    roof_fig = comparison_roofline_figure(labels, [r.summary for r in runs])
    if roof_fig is not None:
        figures.append(
            FigureSpec(
                "compare-roofline",
                "Roofline points",
                "Each run's prefill (diamond) and decode (circle) against its device's ceilings.",
                roof_fig,
            )
        )
    when = (generated_at or datetime.now(UTC)).isoformat(timespec="seconds")
    body = (
        f"<header><h1>perfscope comparison of {len(labels)} runs</h1></header>"
        f'<section id="runs"><h2>Runs</h2><table class="kv">{legend}</table></section>'
        f'<section id="comparison"><h2>Metrics</h2>'
        f"<p class='caption'>{esc(result['method'])}. An interval that excludes 1 is a change "
        f"beyond resampling noise at {conf} confidence ({result['n_boot']} resamples, "
        f"seed {result['seed']}).</p>"
        f"<table id='comparison-table'><thead>{''.join(head)}</thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
        f'<section id="figures"><h2>Figures</h2>{figures_html(figures)}</section>'
        f"<footer>Generated by perfscope on {esc(when)}.</footer>"
    )
    return str(render_page(f"perfscope comparison — {' vs '.join(labels)}", body, figures))
