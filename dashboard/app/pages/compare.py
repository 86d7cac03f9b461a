"""Compare page (``/compare?runs=A,B[,C...]&baseline=A``): runs overlaid, metrics with
ratios against a pinned baseline. Runs of one run set (``perfscope run --repeat``) are
grouped into that set; a change is better/worse only beyond the run-to-run noise of the
sets, single runs get ratios only (noise unknown), and contended runs are named.

Statistics come from :func:`perfscope.dashboard.compare.compare_tables` (the same numbers
as ``perfscope compare``), figures from the shared builders in
:mod:`perfscope.dashboard.figures`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from dash import Dash, Input, Output, State, dcc, html
from dash.development.base_component import Component

from perfscope.analysis.compare import Comparison
from perfscope.analysis.manifest import RunManifest
from perfscope.dashboard.app.data import LoadedRun, Signature
from perfscope.dashboard.app.pages._common import (
    CARD_STYLE,
    TABLE_CELL,
    TABLE_HEADER,
    Column,
    DashboardContext,
    Option,
    Page,
    PageRequest,
    column,
    data_table,
    error_box,
    figure_block,
    note,
    query_list,
)
from perfscope.errors import PerfscopeError
from perfscope.jsontypes import JsonValue, json_str

__all__ = ["PAGE", "ResultCache", "compare_body", "metric_records", "picked_runs"]

_RESULT_CACHE_SIZE = 8

#: What a comparison is cached under: each run's id with its files' signature.
_ResultKey = tuple[tuple[str, Signature], ...]


class ResultCache:
    """Recent comparison results of one app (comparing big runs takes a moment)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: OrderedDict[_ResultKey, Comparison] = OrderedDict()


def _run_options(dctx: DashboardContext) -> list[Option]:
    return [
        {"label": f"{r.run_id} ({r.status})", "value": r.run_id}
        for r in dctx.repo.rows()
        if r.state != "broken"
    ]


def short_label(run_id: str) -> str:
    """A run id without its ``YYYYMMDD-HHMMSS-`` prefix (``reference-730b``), for legends
    and headers; other labels unchanged."""
    from perfscope.dashboard.compare import short_labels

    return short_labels([run_id])[0]


def config_block(ids: list[str], manifests: list[RunManifest]) -> html.Div:
    """The configuration diff of the compared runs: only the fields that differ (engine,
    model shape, dtype, workload, batch, options, device, versions, SLOs), or a line saying
    the configurations are identical."""
    from perfscope.dashboard.compare import config_diff, short_labels

    diff = config_diff(manifests)
    labels = short_labels(ids)
    if not diff:
        body: Component = html.P(
            "identical: engine, model shape, dtype, workload, batch, options, device and "
            "versions are the same in every run",
            id="compare-config-identical",
        )
    else:
        cols = [column("group", "what"), column("field", "field")]
        cols += [column(f"v{i}", lab) for i, lab in enumerate(labels)]
        # One value column per run (``v0``, ``v1``, ...): every cell is text.
        rows: list[dict[str, str]] = [
            {"group": d.group, "field": d.field, **{f"v{i}": v for i, v in enumerate(d.values)}}
            for d in diff
        ]
        body = data_table(
            id="compare-config",
            columns=cols,
            data=rows,
            style_table={"overflowX": "auto"},
            style_cell=TABLE_CELL,
            style_header=TABLE_HEADER,
        )
    return html.Div(
        [
            html.H3("Configuration"),
            note(f"{len(diff)} field(s) differ" if diff else "No configuration difference."),
            body,
        ],
        style=CARD_STYLE,
        id="compare-config-block",
    )


def metric_records(result: Comparison) -> tuple[list[Column], list[dict[str, str]]]:
    """Columns and rows of the metric table: value per run set, then ratio, interval, noise
    band and change of each set against the baseline (first set). The rows' columns depend
    on how many sets are compared (``v0``, ``r1``, ``ci1``, ...); every cell is text."""
    from perfscope.dashboard.compare import format_metric, ratio_cells

    labels = result.labels
    conf = f"{100 * result.confidence:g}%"
    cols: list[Column] = [column("metric", "metric")]
    for i, lab in enumerate(labels):
        cols.append(column(f"v{i}", f"{'baseline' if i == 0 else f'run {i}'}: {short_label(lab)}"))
    for i in range(1, len(labels)):
        cols += [
            column(f"r{i}", f"ratio run {i}"),
            column(f"ci{i}", f"{conf} CI run {i}"),
            column(f"n{i}", f"detectable run {i}"),
            column(f"c{i}", f"change run {i}"),
        ]
    rows = []
    for m in result.metrics:
        row: dict[str, str] = {"metric": m.label, "key": m.key}
        for i, v in enumerate(m.values):
            row[f"v{i}"] = "n/a (not in this run's summary)" if v is None else format_metric(v, m)
        for i in range(1, len(labels)):
            row[f"r{i}"], row[f"ci{i}"], row[f"n{i}"], row[f"c{i}"] = ratio_cells(m, i)
        rows.append(row)
    return cols, rows


def _result(ids: list[str], loaded: list[LoadedRun], cache: ResultCache) -> Comparison:
    from perfscope.dashboard.compare import compare_tables

    # Keyed on the runs' file signatures: a run rewritten on disk is compared afresh.
    key = tuple((i, x.signature) for i, x in zip(ids, loaded, strict=True))
    with cache.lock:
        hit = cache.items.get(key)
        if hit is not None:
            cache.items.move_to_end(key)
            return hit
    result = compare_tables([x.tables for x in loaded], ids)
    with cache.lock:
        cache.items[key] = result
        while len(cache.items) > _RESULT_CACHE_SIZE:
            cache.items.popitem(last=False)
    return result


def compare_body(
    dctx: DashboardContext,
    run_ids: list[str],
    baseline: str | None,
    cache: ResultCache | None = None,
) -> html.Div:
    """Figures and metric table of the given runs, ``baseline`` first."""
    from perfscope.dashboard.figures import (
        comparison_cdf_figure,
        comparison_metrics_figure,
        comparison_roofline_figure,
        comparison_throughput_figure,
    )

    ids = [i for i in dict.fromkeys(run_ids) if i]
    if baseline in ids:
        ids.remove(str(baseline))
        ids.insert(0, str(baseline))
    problems: list[Component] = []
    loaded = []
    ok_ids = []
    for rid in ids:
        try:
            loaded.append(dctx.repo.load(rid))
            ok_ids.append(rid)
        except PerfscopeError as exc:
            problems.append(error_box(str(exc), title=f"Run {rid[:80]!r} left out"))
    if len(loaded) < 2:
        return html.Div(
            [*problems, note("Pick two or more runs to compare (the first is the baseline).")]
        )
    result = _result(ok_ids, loaded, cache if cache is not None else ResultCache())
    from perfscope.dashboard.compare import comparison_title

    cols, rows = metric_records(result)
    conf = f"{100 * result.confidence:g}%"
    table = html.Div(
        [
            html.H3(f"Metrics against the baseline {result.labels[0]}"),
            note(
                f"{comparison_title(result)}. A change is better or worse only when its "
                f"{conf} interval excludes 1."
            ),
            *[
                html.Div(error_box(str(n), title="Caution"), id=f"compare-note-{i}")
                for i, n in enumerate(result.notes)
            ],
            data_table(
                id="compare-table",
                columns=cols,
                data=rows,
                style_table={"overflowX": "auto"},
                style_cell=TABLE_CELL,
                style_header=TABLE_HEADER,
                style_data_conditional=[
                    {
                        "if": {"filter_query": f'{{c{i}}} = "{word}"', "column_id": f"c{i}"},
                        "color": color,
                        "fontWeight": "bold",
                    }
                    for i in range(1, len(result.labels))
                    for word, color in (("better", "#2e7d32"), ("worse", "#c62828"))
                ],
            ),
        ],
        style=CARD_STYLE,
    )
    tables = [x.tables for x in loaded]
    from perfscope.dashboard.compare import short_labels

    legend = short_labels(ok_ids)
    config = config_block(ok_ids, [x.manifest for x in loaded])
    figs = [
        figure_block(
            "compare-fig-metrics",
            "Key metrics",
            comparison_metrics_figure(legend, [t.summary for t in tables]),
            caption="Latency percentiles (ms) and output throughput per run.",
        ),
        figure_block(
            "compare-fig-cdf",
            "Latency distributions",
            comparison_cdf_figure(legend, tables),
            caption="Empirical CDFs of each run's completed, non-warmup requests.",
        ),
        figure_block(
            "compare-fig-throughput",
            "Throughput over time",
            comparison_throughput_figure(legend, tables),
            caption="Output tokens/s, each run from its own first measured request.",
        ),
    ]
    roof_fig = comparison_roofline_figure(legend, [t.summary for t in tables])
    if roof_fig is not None:
        figs.append(
            figure_block(
                "compare-fig-roofline",
                "Roofline points",
                roof_fig,
                caption="Each run's prefill (diamond) and decode (circle) against its "
                "device's ceilings; the explorer below projects them onto other devices.",
            )
        )
    roofline_link = html.Div(
        [
            "Roofline points of these runs: ",
            dcc.Link(
                "overlay them in the roofline explorer",
                href="/roofline?runs=" + ",".join(ok_ids),
                id="compare-roofline-link",
            ),
        ],
        style=CARD_STYLE,
    )
    return html.Div([*problems, config, table, *figs, roofline_link])


def picked_runs(value: JsonValue) -> list[str]:
    """The run ids of the runs dropdown's value as the browser sent it: its text entries,
    in order (anything but a list of ids picks none)."""
    return [i for i in value if isinstance(i, str)] if isinstance(value, list) else []


def layout(dctx: DashboardContext, req: PageRequest) -> html.Div:
    ids = query_list(req, "runs")
    baseline = req.get("baseline") or (ids[0] if ids else None)
    options = _run_options(dctx)
    return html.Div(
        [
            html.H2("Compare runs"),
            html.Div(
                [
                    html.Label("runs"),
                    dcc.Dropdown(id="compare-runs", options=options, value=ids, multi=True),
                    html.Label("baseline (pinned; ratios are run / baseline)"),
                    dcc.Dropdown(
                        id="compare-baseline",
                        options=[{"label": i, "value": i} for i in ids],
                        value=baseline,
                        clearable=False,
                    ),
                ],
                style=CARD_STYLE,
            ),
            dcc.Loading(html.Div(id="compare-body")),
        ]
    )


def register(app: Dash, dctx: DashboardContext) -> None:
    cache = ResultCache()

    @app.callback(
        Output("compare-baseline", "options"),
        Output("compare-baseline", "value"),
        Input("compare-runs", "value"),
        State("compare-baseline", "value"),
    )
    def baseline_choices(ids: JsonValue, current: JsonValue) -> tuple[list[Option], str | None]:
        picked = picked_runs(ids)
        if isinstance(current, str) and current in picked:
            value: str | None = current
        else:
            value = picked[0] if picked else None
        return [{"label": i, "value": i} for i in picked], value

    @app.callback(
        Output("compare-body", "children"),
        Input("compare-runs", "value"),
        Input("compare-baseline", "value"),
    )
    def update_comparison(ids: JsonValue, baseline: JsonValue) -> html.Div:
        return compare_body(dctx, picked_runs(ids), json_str(baseline), cache)


PAGE = Page(key="compare", path="/compare", title="Compare", layout=layout, register=register)
