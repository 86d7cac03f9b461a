"""The study report: one offline HTML page for a ``perfscope.study/1`` record.

Every setting's phases on one roofline chart (the comparison roofline builder), the metric
curves against the knob (by the tables' one statistic, :meth:`Study.estimate`, with the
effect's interval as error bars, and the what-if projection as a dashed line from the
baseline's median), and the table of measured effects with their between-run intervals next
to the projection and its error.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from html import escape as esc
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from perfscope.analysis.study import (
    METRICS,
    PhasePoint,
    SettingResult,
    Study,
    detectable_cell,
)
from perfscope.dashboard._fmt import fmt_bytes, fmt_num, fmt_pct, fmt_time
from perfscope.dashboard.figures import FIGURE_LAYOUT, FigureSpec, comparison_roofline_figure
from perfscope.dashboard.report import figures_html, render_page
from perfscope.errors import BrokenRunError
from perfscope.jsontypes import JsonObject, ReadOnlyJson, json_object
from perfscope.profiler.store import read_json_capped

__all__ = [
    "METRIC_LABELS",
    "metric_curve_figure",
    "phase_cell",
    "phase_summary",
    "render_study_report",
    "study_figures",
    "write_study_report",
]

#: Display name and unit of each compared metric.
METRIC_LABELS: dict[str, tuple[str, str]] = {
    "ttft_p50_s": ("TTFT p50", "s"),
    "tpot_p50_s": ("TPOT p50", "s"),
    "output_tok_s": ("output throughput", "tokens/s"),
    "goodput_req_s": ("goodput", "requests/s"),
    "j_per_output_token": ("energy per output token", "J"),
}


#: The tick suffix of each unit of :data:`METRIC_LABELS` (a space before word units, so
#: SI prefixes read ``1.2k tok/s``, and none before symbols: ``900µs``).
TICK_UNIT: dict[str, str] = {"s": "s", "J": "J", "tokens/s": " tok/s", "requests/s": " req/s"}


def _summary(run_dir: str) -> JsonObject:
    """The run's summary.json object; ``{}`` when it is unreadable or not a JSON object."""
    try:
        data = read_json_capped(Path(run_dir) / "summary.json")
    except (OSError, ValueError, BrokenRunError):
        return {}
    return json_object(data) or {}


def metric_curve_figure(study: Study, metric: str) -> go.Figure | None:
    """One metric against the knob, by the statistic the tables use
    (:meth:`~perfscope.analysis.study.Study.estimate`): the baseline's median with the range
    of its runs as error bars, every other setting at the baseline median times its paired
    effect ratio with the effect's interval as error bars; and the what-if projection (the
    baseline median times each setting's projected ratio) dashed. The y axis carries the
    metric's unit on its ticks (SI prefixes: ``900µs``, ``1.2s``), so each quantity has one
    unit. ``None`` when no setting measured the metric."""
    xs = [s.value for s in study.settings]
    est = [study.estimate(s, metric) for s in study.settings]
    if all(v is None for v in est):
        return None
    base = est[0]
    lo, hi = [], []
    for i, (s, m) in enumerate(zip(study.settings, est, strict=True)):
        e = next((e for e in s.effects if e.metric == metric), None) if i else None
        if e is not None and e.change.ci is not None and m is not None and base:
            band = (base * e.change.ci[0], base * e.change.ci[1])
        else:
            vals = [float(v) for r in s.runs if (v := r.metrics.get(metric)) is not None]
            band = (min(vals), max(vals)) if vals and m is not None else (m or 0.0, m or 0.0)
        lo.append(max(0.0, (m or 0.0) - band[0]))
        hi.append(max(0.0, band[1] - (m or 0.0)))
    name, unit = METRIC_LABELS[metric]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=est,
            mode="lines+markers",
            name="measured (baseline: median, bars its runs' range; others: baseline x "
            "paired ratio, bars its interval)",
            error_y={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
        )
    )
    proj = [base]
    for s in study.settings[1:]:
        e = next((e for e in s.effects if e.metric == metric), None)
        r = e.projected_ratio if e is not None else None
        proj.append(base * r if base is not None and r is not None else None)
    if METRICS[metric][1] is not None and any(p is not None for p in proj[1:]):
        fig.add_trace(
            go.Scatter(
                x=xs, y=proj, mode="lines+markers", name="what-if projection", line={"dash": "dash"}
            )
        )
    fig.update_xaxes(title_text=study.knob, type="category")
    fig.update_yaxes(
        title_text=name, ticksuffix=TICK_UNIT.get(unit, unit), exponentformat="SI", minexponent=0
    )
    fig.update_layout(**FIGURE_LAYOUT, height=360)
    return fig


def study_figures(
    study: Study, summary_of: Callable[[str], ReadOnlyJson] | None = None
) -> list[FigureSpec]:
    """The report's figures: the shared roofline, then one curve per metric.

    Args:
        summary_of: reads the ``summary.json`` of a run given the run path the study
            recorded (``{}`` when it cannot); by default the file at that path. The
            dashboard passes its own reader, which only reads inside its runs directory.
    """
    read = summary_of or _summary
    labels = [f"{study.knob}={s.value}" for s in study.settings]
    summaries: list[ReadOnlyJson] = [read(s.runs[0].run) if s.runs else {} for s in study.settings]
    specs = [
        FigureSpec(
            "study-roofline",
            "Every setting on one roofline",
            "Measured prefill (diamond) and decode (circle) points of each setting's first "
            "run against the device's ceilings.",
            comparison_roofline_figure(labels, summaries),
            "no run of this study has a roofline",
        )
    ]
    for metric in METRICS:
        name, _ = METRIC_LABELS[metric]
        specs.append(
            FigureSpec(
                f"study-{metric}",
                f"{name} against {study.knob}",
                "Baseline: the median of its runs; other settings: the baseline median times "
                "the effect's paired ratio (the tables' statistic), bars its interval; "
                "dashed: the baseline median times the what-if's projected ratio.",
                metric_curve_figure(study, metric),
                f"{name} was not measured",
            )
        )
    return specs


def _fmt(v: Any, metric: str) -> str:
    if v is None:
        return "–"
    if metric.endswith("_s"):
        return fmt_time(v)
    return fmt_num(v, 4)


def _ratio(r: float | None) -> str:
    return "–" if r is None else f"{r:.3f}x"


def phase_cell(s: SettingResult, phase: str) -> str | None:
    """One phase over *all* runs of a setting: the verdicts seen (with counts when they
    differ) and the median MFU and MBU with their range over the runs; an MFU or MBU above
    100% is shown as a ceiling to check, not as a fact. ``None`` when no run has the phase."""
    pts = [p for r in s.runs if (p := r.phases.get(phase)) is not None]
    if not pts:
        return None
    verdicts = Counter(v.verdict or "?" for v in pts)
    verdict = (
        next(iter(verdicts))
        if len(verdicts) == 1
        else ", ".join(f"{k} {n}/{len(pts)}" for k, n in verdicts.most_common())
    )
    return f"{verdict} MFU {_util(pts, 'mfu')} MBU {_util(pts, 'mbu')}" + (
        f" ({len(pts)} runs)" if len(pts) > 1 else ""
    )


def phase_summary(s: SettingResult) -> str:
    """Every phase of a setting over all its runs (:func:`phase_cell`), ``; ``-joined."""
    names = list(dict.fromkeys(name for r in s.runs for name in r.phases))
    return "; ".join(f"{name} {phase_cell(s, name)}" for name in names)


def _util(points: Sequence[PhasePoint], attr: str) -> str:
    xs = sorted(float(v) for p in points if (v := getattr(p, attr)) is not None)
    if not xs:
        return "–"
    med = statistics.median(xs)
    text = fmt_pct(med)
    if len(xs) > 1 and xs[-1] > xs[0]:
        text += f" [{fmt_pct(xs[0])}–{fmt_pct(xs[-1])}]"
    if xs[-1] > 1.0:
        text += " (over 100%: the ceiling is suspect)"
    return text


_SOL_KEY = {"ttft_p50_s": "ttft_s", "tpot_p50_s": "tpot_s", "output_tok_s": "throughput_tok_s"}


def sol_ratio(s: SettingResult, metric: str) -> float | None:
    """The bare roofline's (speed-of-light) ratio of ``metric`` for setting ``s``."""
    key = _SOL_KEY.get(metric)
    v = (json_object((s.projection or {}).get("sol_ratios")) or {}).get(key) if key else None
    return float(v) if isinstance(v, int | float) else None


def _table(study: Study) -> tuple[str, str]:
    head = "".join(f"<th>{esc(METRIC_LABELS[m][0])}</th>" for m in METRICS)
    rows = []
    for s in study.settings:
        mem = s.memory.get("total_bytes")
        verdicts = esc(phase_summary(s))
        cells = "".join(f"<td>{_fmt(study.estimate(s, m), m)}</td>" for m in METRICS)
        mem_txt = "–" if mem is None else fmt_bytes(mem)
        rows.append(f"<tr><td>{esc(s.value)}</td>{cells}<td>{mem_txt}</td><td>{verdicts}</td></tr>")
    settings = (
        f"<table><tr><th>{esc(study.knob)}</th>{head}<th>memory (weights + KV)</th>"
        f"<th>verdict per phase</th></tr>{''.join(rows)}</table>"
    )
    erows = []
    for s in study.settings[1:]:
        for e in s.effects:
            c = e.change
            ci = esc(c.interval_text())
            err = "–" if e.error is None else f"{100 * e.error:+.0f}%"
            erows.append(
                f"<tr><td>{esc(s.value)}</td><td>{esc(METRIC_LABELS[e.metric][0])}</td>"
                f"<td>{_ratio(c.ratio)}</td><td>{ci}</td>"
                f"<td>{esc(detectable_cell(c, study.repeat))}</td><td>{esc(c.verdict)}</td>"
                f"<td>{_ratio(e.projected_ratio)}</td><td>{_ratio(sol_ratio(s, e.metric))}</td>"
                f"<td>{err}</td></tr>"
            )
    effects = (
        f"<table><tr><th>{esc(study.knob)}</th><th>metric</th><th>measured ratio</th>"
        "<th>interval</th><th>detectable change</th><th>verdict</th><th>projected ratio</th>"
        "<th>speed of light</th>"
        f"<th>projection error</th></tr>{''.join(erows)}</table>"
    )
    return settings, effects


def render_study_report(study: Study) -> str:
    """The complete HTML page of ``study``."""
    settings, effects = _table(study)
    notes = "".join(f"<li>{esc(n)}</li>" for n in study.notes)
    base = esc(study.values[0])
    body = (
        f"<h1>Study: {esc(study.knob)} = {esc(', '.join(study.values))}</h1>"
        f"<p>{study.repeat} run(s) per setting, interleaved; baseline {base}. "
        f"Created {esc(study.created_at)}.</p>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + "<h2>Settings</h2>"
        + "<p>One statistic throughout: the baseline's values are the medians of its runs, "
        "every other setting's the baseline's times its paired effect ratio (the effects "
        "table's); the phase column summarises all runs of a setting.</p>"
        + settings
        + f"<h2>Effect against {base}: measured vs projected</h2>"
        + effects
        + "<h2>Figures</h2>"
        + figures_html(study_figures(study))
    )
    return render_page(f"perfscope study {study.knob}", body, study_figures(study))


def write_study_report(study: Study, path: str | Path) -> Path:
    """Write :func:`render_study_report` to ``path``; returns it."""
    from perfscope.profiler.output import write_output_text

    out = Path(path)
    write_output_text(out, render_study_report(study))  # atomic file, or device/pipe/stdout
    return out
