"""Comparison of run sets: the rich table of ``perfscope compare`` and its HTML page.

The statistics (paired intervals, detectable change, contention) live in
:mod:`perfscope.analysis.compare`; this module groups the runs into sets, presents the
result and draws the comparison figures. Runs made together by ``perfscope run --repeat``
carry their set (``summary["run_set"]``) and are grouped by it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.text import Text

from perfscope.analysis import Summary
from perfscope.analysis.catalogue import find_metric, format_value, value_at
from perfscope.analysis.compare import (
    DEFAULT_CONFIDENCE,
    ComparedMetric,
    Comparison,
    SummaryLike,
    compare_run_sets,
)
from perfscope.analysis.manifest import RunManifest
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
from perfscope.dashboard.terminal import FitTable

__all__ = [
    "ConfigDiff",
    "compare_sets",
    "compare_tables",
    "comparison_html",
    "comparison_table",
    "comparison_title",
    "config_diff",
    "format_metric",
    "group_by_run_set",
    "ratio_cells",
    "run_label",
    "set_label",
    "short_labels",
    "side_name",
]


def run_label(summary: Summary | Mapping[str, Any], fallback: str) -> str:
    """How a run is named in a comparison: its run id (unique), else ``fallback``.

    ``summary`` is a typed :class:`~perfscope.analysis.Summary` or its JSON form."""
    return str(value_at(summary, "run_id") or fallback)


def group_by_run_set(summaries: Sequence[SummaryLike]) -> list[list[int]]:
    """Indices of ``summaries`` (typed, or summary.json objects) grouped by their run set (its
    id and label), in first-seen order; a run outside any set is a set of its own."""
    groups: dict[Any, list[int]] = {}
    for i, s in enumerate(summaries):
        sid = value_at(s, "run_set.id")
        key: Any = (sid, value_at(s, "run_set.label")) if sid else ("run", i)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def set_label(summaries: Sequence[SummaryLike], ids: Sequence[str]) -> str:
    """How a run set is named: its run's id for one run; else its set label with the run
    count and the set's id (the id ``perfscope compare`` accepts, so two sets of the same
    engine are told apart), or its first id with the run count."""
    if len(ids) == 1:
        return str(ids[0])
    first = summaries[0]
    set_id, label = value_at(first, "run_set.id"), value_at(first, "run_set.label")
    if set_id and label and label != set_id:
        return f"{label} ({len(ids)} runs, set {set_id})"
    name = set_id or label or f"{ids[0]}…"
    return f"{name} ({len(ids)} runs)"


def side_name(i: int | None, sides: int) -> str:
    """What a compared side is called in headers and captions: ``baseline`` for the first,
    ``other`` for the second of two, ``other 1``, ``other 2``, ... beside three or more
    (``?`` for a run in no side). Each side's label says what it is."""
    if i is None:
        return "?"
    if i == 0:
        return "baseline"
    return "other" if sides == 2 else f"other {i}"


def compare_sets(
    sets: Sequence[Sequence[RunTables]],
    labels: Sequence[str] | None = None,
    *,
    run_ids: Sequence[Sequence[str]] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    primary: str | None = None,
    exclude_contended: bool = False,
    detect: float | None = None,
) -> Comparison:
    """:func:`perfscope.analysis.compare.compare_run_sets` over stored run sets (first set =
    baseline); ``detect`` is the change of interest (fraction) a "no detectable change"
    says the blocks needed for."""
    ids = (
        [list(g) for g in run_ids]
        if run_ids is not None
        else [[run_label(r.summary, f"run {j}") for j, r in enumerate(g)] for g in sets]
    )
    labels = (
        list(labels)
        if labels
        else [set_label([r.summary for r in g], gid) for g, gid in zip(sets, ids, strict=True)]
    )
    return compare_run_sets(
        labels,
        [[r.summary for r in g] for g in sets],
        run_ids=ids,
        confidence=confidence,
        primary=primary,
        exclude_contended=exclude_contended,
        detect=detect,
    )


def compare_tables(
    runs: Sequence[RunTables],
    labels: Sequence[str] | None = None,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    primary: str | None = None,
) -> Comparison:
    """Compare stored runs, grouped into their run sets (:func:`group_by_run_set`; the set
    of the first run is the baseline). Runs from no set each stand alone: ratios only.
    ``labels`` names the runs (default: their ids)."""
    ids = list(labels) if labels else [run_label(r.summary, f"run {i}") for i, r in enumerate(runs)]
    groups = group_by_run_set([r.summary for r in runs])
    if len(groups) < 2:  # all in one set: compare the runs one by one
        groups = [[i] for i in range(len(runs))]
    return compare_sets(
        [[runs[i] for i in g] for g in groups],
        run_ids=[[ids[i] for i in g] for g in groups],
        confidence=confidence,
        primary=primary,
    )


def format_metric(value: Any, row: ComparedMetric) -> str:
    """A compared value in its display unit (the catalogue entry of ``row.key``)."""
    m = find_metric(row.key)
    if m is not None:
        return m.format(value)
    return format_value(value, row.unit or "number")


def ratio_cells(row: ComparedMetric, i: int) -> tuple[str, str, str, str]:
    """Display texts of set ``i`` against the baseline: ratio, interval, detectable change
    and verdict (``better``, ``worse``, ``no detectable change``)."""
    r, ci = row.ratios[i], row.ci[i]
    det = row.detectable[i] if i < len(row.detectable) else None
    ratio = "n/a (a value is missing)" if r is None else f"{r:.3f}x"
    text = row.interval[i] if i < len(row.interval) else None
    if text:  # names the level the verdict was tested at
        interval = str(text)
    elif ci:
        interval = f"[{ci[0]:.3f}, {ci[1]:.3f}]"
    elif r is None:
        interval = "n/a (a value is missing)"
    else:
        interval = "n/a (too few runs)"
    band = "none (too few runs)" if det is None else f"±{100 * det:.0f}%"
    return ratio, interval, band, str(row.change[i] or "n/a (a value is missing)")


_CHANGE_STYLE = {
    "better": "green",
    "worse": "red",
    "no detectable change": "dim",
}


def comparison_title(result: Comparison) -> str:
    """One line saying what the ratios and intervals are."""
    conf = f"{100 * result.confidence:g}%"
    if not result.noise_known:
        return (
            f"Compared with {result.labels[0]} (ratios to the baseline; single runs: "
            "run-to-run noise unknown, no significance claimed)"
        )
    paired = result.paired
    design = "paired by block" if paired and all(paired) else "unpaired"
    return (
        f"Compared with {result.labels[0]} (ratios of run-set centres, {design}; each "
        f"interval at the level its verdict is tested at, {conf} family-wise over all "
        f"metrics: {result.method})"
    )


def comparison_table(result: Comparison) -> FitTable:
    """The comparison as a terminal table: each set's value, then ratio, interval,
    detectable change and verdict of each set against the baseline; the primary verdict
    and notes (noise unknown, contention) in the caption. Too wide for the terminal, it is
    drawn stacked (one block per metric)."""
    labels = result.labels
    n = len(labels)
    cols = ["metric"]
    cols += [side_name(i, n) for i in range(n)]
    right = set(cols[1:])
    for i in range(1, len(labels)):
        suffix = f" {i}" if len(labels) > 2 else ""
        more = [f"ratio{suffix}", f"interval{suffix}", f"detectable{suffix}"]
        cols += [*more, f"change{suffix}"]
        right.update(more)
    lines = [" · ".join(f"{side_name(i, n)} = {lab}" for i, lab in enumerate(labels))]
    lines += [
        f"{'→ ' if n == 2 else f'{side_name(i + 1, n)}: '}{h}"
        for i, h in enumerate(result.headlines)
    ]
    lines += [f"⚠ {n}" for n in result.notes]
    table = FitTable(
        cols,
        title=comparison_title(result),
        right=frozenset(right),
        caption="\n".join(lines),
        hoist_constant=True,  # single runs: the same "no interval" in every row, said once
    )
    for row in result.metrics:
        cells: list[str | Text] = [f"{row.label} (primary)" if row.primary else row.label]
        cells += [format_metric(v, row) for v in row.values]
        for i in range(1, len(labels)):
            ratio, interval, band, change = ratio_cells(row, i)
            cells += [ratio, interval, band, Text(change, style=_CHANGE_STYLE.get(change, ""))]
        table.add_row(*cells)
    return table


def _flat_ids(result: Comparison, runs: Sequence[RunTables]) -> list[str]:
    ids = [rid for g in result.runs for rid in g]
    if len(ids) != len(runs):
        ids = [run_label(r.summary, f"run {i}") for i, r in enumerate(runs)]
    return ids


def comparison_html(
    runs: Sequence[RunTables],
    result: Comparison,
    *,
    generated_at: datetime | None = None,
) -> str:
    """A self-contained comparison page: the table (static HTML) and the comparison
    figures (metrics side by side, overlaid latency CDFs)."""
    n_sets = len(result.labels)
    head = ["<tr><th>metric</th>"]
    head += [f"<th class='n'>{side_name(i, n_sets)}</th>" for i in range(n_sets)]
    for i in range(1, n_sets):
        sfx = f" {i}" if n_sets > 2 else ""
        head.append(f"<th class='n'>ratio{sfx}</th><th class='n'>interval{sfx}</th>")
        head.append(f"<th class='n'>detectable{sfx}</th><th>change{sfx}</th>")
    head.append("</tr>")
    rows = []
    for row in result.metrics:
        cells = [f"<td>{esc(row.label)}</td>"]
        cells += [f"<td class='n'>{esc(format_metric(v, row))}</td>" for v in row.values]
        for i in range(1, n_sets):
            ratio, interval, band, change = ratio_cells(row, i)
            cells.append(
                f"<td class='n'>{esc(ratio)}</td><td class='n'>{esc(interval)}</td>"
                f"<td class='n'>{esc(band)}</td>"
                f"<td class='change {esc(change.replace(' ', '-'))}'>{esc(change)}</td>"
            )
        rows.append(f"<tr data-key='{esc(row.key)}'>" + "".join(cells) + "</tr>")
    set_of = {rid: i for i, g in enumerate(result.runs) for rid in g}
    contended = {h["run_id"] for hits in result.contention for h in hits}
    legend = "".join(
        f"<tr><th>{esc(side_name(set_of.get(rid), n_sets))}</th>"
        f"<td class='mono'>{esc(rid)}</td>"
        f"<td>{esc(value_at(r.summary, 'status'))}</td>"
        f"<td>{esc(value_at(r.summary, 'engine.uri'))}</td>"
        f"<td>{'contended' if rid in contended else ''}</td></tr>"
        for rid, r in zip(_flat_ids(result, runs), runs, strict=True)
    )
    notes_html = "".join(f"<p class='headline'>{esc(h)}</p>" for h in result.headlines)
    notes_html += "".join(f"<p class='warning'>{esc(n)}</p>" for n in result.notes)
    labels = _flat_ids(result, runs)
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
        f"<p class='caption'>{esc(comparison_title(result))}. A change is better or worse "
        "only when its multiplicity-corrected test rejects no change (its interval, at the "
        "level named in the cell, excludes 1); single runs get a ratio only; 'detectable' "
        "is the smallest change this experiment detects with 80% probability.</p>"
        f"{notes_html}"
        f"<table id='comparison-table'><thead>{''.join(head)}</thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
        f'<section id="figures"><h2>Figures</h2>{figures_html(figures)}</section>'
        f"<footer>Generated by perfscope on {esc(when)}.</footer>"
    )
    return str(render_page(f"perfscope comparison — {' vs '.join(labels)}", body, figures))


_STAMP_PREFIX = re.compile(r"^\d{8}-\d{6}-")


def short_labels(run_ids: Sequence[str]) -> list[str]:
    """Run ids without their ``YYYYMMDD-HHMMSS-`` start stamp (``alpha-050b``), for legends
    and headers; a run whose short form another run shares keeps its full id."""
    short = [_STAMP_PREFIX.sub("", r) or r for r in run_ids]
    return [s if short.count(s) == 1 else r for s, r in zip(short, run_ids, strict=True)]


@dataclass(frozen=True)
class ConfigDiff:
    """One configuration field that differs between compared runs.

    Attributes:
        group: what it configures (engine, model shape, dtype, workload, batch, options,
            device, versions, SLOs).
        field: the manifest path (``engine.config.batch_size``).
        values: the field's value in each run, as text (``absent`` when a run has none).
    """

    group: str
    field: str
    values: tuple[str, ...]


#: Manifest sections compared, as (path prefix, group); the first matching prefix wins.
_DIFF_GROUPS: tuple[tuple[str, str], ...] = (
    ("engine.uri", "engine"),
    ("engine.kind", "engine"),
    ("engine.model.weight_dtype", "dtype"),
    ("engine.model.kv_dtype", "dtype"),
    ("engine.model.act_dtype", "dtype"),
    ("engine.dtype", "dtype"),
    ("engine.config.shape.dtype", "dtype"),
    ("engine.config.quant", "dtype"),
    ("engine.model", "model shape"),
    ("engine.config.preset", "model shape"),
    ("engine.config.n_params", "model shape"),
    ("engine.device", "device"),
    ("engine.config.device_name", "device"),
    ("engine.config.torch_threads", "device"),
    ("hardware.spec.key", "device"),
    ("host.hostname", "device"),
    ("host.cpu_count", "device"),
    ("host.machine", "device"),
    ("host.cuda_available", "device"),
    ("engine.config.batch_size", "batch"),
    ("engine.config.scheduler", "batch"),
    ("engine.config.batch_timeout_s", "batch"),
    ("engine.config.torch", "versions"),
    ("engine.config", "options"),
    ("engine.options", "options"),
    ("workload", "workload"),
    ("load", "workload"),
    ("slos", "SLOs"),
    ("perfscope_version", "versions"),
    ("host.python", "versions"),
    ("host.torch", "versions"),
    ("host.platform", "versions"),
    ("request_timeout_s", "options"),
)
#: Fields that differ between any two runs by construction (per-run salts, the model
#: shape repeated under ``engine.config.shape``, byte widths that follow the dtypes).
_DIFF_SKIP = (
    "workload.prompt_salt",
    "engine.config.shape",
    "engine.model.weight_bytes_per_param",
    "engine.model.kv_bytes_per_element",
    "engine.model.act_bytes_per_element",
    # how the thread count was chosen quotes the load seen at start: a reading, not a setting
    # (the count itself, engine.config.torch_threads, is compared)
    "engine.config.threads_rule",
    # KV slots and blocks follow the batch size and the KV budget (both compared)
    "engine.config.kv_slots",
    "engine.config.kv_blocks",
)


def _flatten(tree: object, prefix: str, out: dict[str, object]) -> None:
    if isinstance(tree, Mapping):  # an empty mapping adds nothing: same as absent
        for k, v in tree.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = tree


def _group_of(path: str) -> str | None:
    for prefix, group in _DIFF_GROUPS:
        if path == prefix or path.startswith(prefix + "."):
            return group
    return None


def _text(value: object, path: str = "") -> str:
    if path.startswith("slos.") and isinstance(value, int | float):
        return format_value(value, "seconds")
    if isinstance(value, float):
        return format_value(value, "number")
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return "none" if value is None else str(value)


def config_diff(manifests: Sequence[Mapping[str, Any] | RunManifest]) -> list[ConfigDiff]:
    """The configuration fields (engine, model shape, dtype, workload, batch, options,
    device, versions, SLOs) whose value is not the same in every manifest, in group order.
    An empty list means the configurations are identical. The manifests are walked by path
    as they were read (a :class:`RunManifest`'s ``source``), so a field one run lacks is
    ``absent``."""
    flat: list[dict[str, object]] = []
    for given in manifests:
        m = given.source if isinstance(given, RunManifest) else given
        f: dict[str, object] = {}  # dotted path -> leaf (narrowed by _text)
        sections = {
            "engine",
            "workload",
            "load",
            "slos",
            "perfscope_version",
            "host",
            "request_timeout_s",
        }
        _flatten({k: v for k, v in m.items() if k in sections}, "", f)
        hw_key = value_at(m, "hardware.spec.key")
        if hw_key is not None:
            f["hardware.spec.key"] = hw_key
        flat.append(f)
    order = [g for _, g in _DIFF_GROUPS]
    rows: list[ConfigDiff] = []
    fields = sorted({k for f in flat for k in f})
    for path in fields:
        group = _group_of(path)
        if group is None or any(path == s or path.startswith(s + ".") for s in _DIFF_SKIP):
            continue
        values = tuple(_text(f[path], path) if path in f else "absent" for f in flat)
        if len(set(values)) > 1:
            rows.append(ConfigDiff(group, path, values))
    rows.sort(key=lambda r: (order.index(r.group), r.field))
    return rows
