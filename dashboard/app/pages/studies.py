"""Studies page (``/studies?study=ID``): the studies ``perfscope study`` wrote, and one of them.

``perfscope study`` stores its record (``perfscope.study/1``) at
``<runs dir>/studies/<stamp>-<name>.json``; the id of a study is that file's stem. The page
lists every study (knob, values, repeats, engine, when) and shows the chosen one: the
per-setting table (medians over the repeats, memory, verdict per phase), the measured
effect of each setting against the first with its between-run interval next to the what-if
projection and that projection's error, and the figures of the study report (every
setting on one roofline, the metric curves against the knob).

Files are read only inside the runs directory: the study id is validated like a run id, and
the runs a study names are read through the run repository by their directory name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dash import Dash, Input, Output, dcc, html
from dash.dash_table.DataTable import DataTable
from dash.development.base_component import Component

from perfscope.analysis.catalogue import format_number, format_seconds
from perfscope.analysis.study import METRICS, Study, detectable_cell, read_study
from perfscope.dashboard.app.data import RUN_ID_PATTERN, InvalidRunIdError, inside_root
from perfscope.dashboard.app.pages._common import (
    CARD_STYLE,
    TABLE_CELL,
    TABLE_HEADER,
    DashboardContext,
    Page,
    PageRequest,
    column,
    data_table,
    error_box,
    figure_block,
    note,
)
from perfscope.dashboard.study_report import (
    METRIC_LABELS,
    phase_summary,
    sol_ratio,
    study_figures,
)
from perfscope.errors import PerfscopeError, RunNotFoundError
from perfscope.jsontypes import JsonObject

__all__ = ["PAGE", "STUDIES_DIR", "StudyListing", "list_studies", "load_study", "study_body"]

STUDIES_DIR = "studies"


@dataclass(frozen=True)
class StudyListing:
    """One stored study as the list shows it (``error`` set when the file is unreadable)."""

    study_id: str
    knob: str | None = None
    values: tuple[str, ...] = ()
    repeat: int | None = None
    engine: str | None = None
    created_at: str | None = None
    error: str | None = None


def _study_path(dctx: DashboardContext, study_id: str) -> Path:
    if not isinstance(study_id, str) or not RUN_ID_PATTERN.fullmatch(study_id) or ".." in study_id:
        raise InvalidRunIdError(f"invalid study id {repr(study_id)[:80]}")
    path = dctx.runs_dir / STUDIES_DIR / f"{study_id}.json"
    if not inside_root(dctx.runs_dir, path):
        raise InvalidRunIdError(f"study {study_id!r} points outside the runs directory; not read")
    return path


def load_study(dctx: DashboardContext, study_id: str) -> Study:
    """A stored study by id (the file stem under ``<runs dir>/studies``).

    Raises:
        InvalidRunIdError: the id is not a plain file stem, or the file resolves outside
            the runs directory.
        RunNotFoundError: no such study, or it is not a readable ``perfscope.study/1``.
    """
    path = _study_path(dctx, study_id)
    try:
        return read_study(path)
    except FileNotFoundError:
        raise RunNotFoundError(f"no study {study_id!r} in {str(path.parent)!r}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RunNotFoundError(f"study {study_id!r} is unreadable: {exc}") from None


def list_studies(dctx: DashboardContext) -> list[StudyListing]:
    """Every study under ``<runs dir>/studies``, newest first; unreadable ones are listed
    with the reason."""
    d = dctx.runs_dir / STUDIES_DIR
    try:
        stems = [p.stem for p in d.iterdir() if p.suffix == ".json" and p.is_file()]
    except OSError:
        return []
    out: list[StudyListing] = []
    for sid in sorted((s for s in stems if RUN_ID_PATTERN.fullmatch(s)), reverse=True):
        try:
            st = load_study(dctx, sid)
        except PerfscopeError as exc:
            out.append(StudyListing(sid, error=str(exc)))
            continue
        engine = st.args.get("engine")
        out.append(
            StudyListing(
                sid,
                knob=st.knob,
                values=tuple(st.values),
                repeat=st.repeat,
                engine=None if engine is None else str(engine),
                created_at=st.created_at,
            )
        )
    return out


def _summary_reader(dctx: DashboardContext) -> Callable[[str], JsonObject]:
    """Reads a study run's summary through the repository, by its directory name."""

    def read(run: str) -> JsonObject:
        run_id = Path(run).name
        try:
            return dctx.repo.summary(run_id) or {}
        except PerfscopeError:
            return {}

    return read


def _run_link(dctx: DashboardContext, run: str) -> str:
    rid = Path(run).name
    if RUN_ID_PATTERN.fullmatch(rid) and (dctx.runs_dir / rid).is_dir():
        return f"[{rid}](/run/{rid})"
    return f"{rid} (not in this runs directory)"


#: Why a study metric can be missing from a run (shown instead of a blank cell).
_MISSING = {
    "goodput_req_s": "no SLOs set",
    "attainment": "no SLOs set",
    "j_per_output_token": "no power reading",
}


def _missing(metric: str) -> str:
    return _MISSING.get(metric, "not in the runs' summaries")


def _value(v: float | None, metric: str) -> str:
    if v is None:
        return _missing(metric)
    unit = METRIC_LABELS.get(metric, ("", ""))[1]
    if unit == "s":
        return format_seconds(v)
    return f"{format_number(v)} {unit}".strip()


def _ratio(r: float | None) -> str:
    return "–" if r is None else f"{r:.3f}x"


def _settings_table(dctx: DashboardContext, study: Study) -> DataTable:
    rows = []
    for s in study.settings:
        verdicts = phase_summary(s)
        mem = s.memory.get("total_bytes")
        # One cell per study metric besides the fixed columns: every cell is text.
        row: dict[str, str] = {"value": s.value}
        for m in METRICS:
            row[m] = _value(s.median.get(m), m)
        row["memory"] = "not estimated" if mem is None else f"{mem / 1e6:.3g} MB"
        row["verdicts"] = verdicts or "no roofline"
        row["runs"] = " ".join(_run_link(dctx, r.run) for r in s.runs)
        rows.append(row)
    cols = [("value", study.knob)]
    cols += [(m, f"{METRIC_LABELS[m][0]} (median)") for m in METRICS]
    cols += [("memory", "memory (weights + KV)"), ("verdicts", "verdict per phase")]
    cols += [("runs", "runs")]
    return data_table(
        id="studies-settings",
        columns=[column(c, n, markdown=c == "runs") for c, n in cols],
        data=rows,
        markdown_options={"link_target": "_self"},
        css=[{"selector": ".dash-cell p", "rule": "margin: 0"}],
        style_cell=TABLE_CELL,
        style_header=TABLE_HEADER,
    )


def _effects_table(study: Study) -> DataTable:
    rows = []
    for s in study.settings[1:]:
        for e in s.effects:
            c = e.change
            rows.append(
                {
                    "value": s.value,
                    "metric": METRIC_LABELS[e.metric][0] if e.metric in METRIC_LABELS else e.metric,
                    "measured": _ratio(c.ratio) if c.ratio is not None else _missing(e.metric),
                    "interval": "n/a" if c.ratio is None else c.interval_text(),
                    "detectable": detectable_cell(c, study.repeat),
                    "verdict": c.verdict,
                    "projected": (
                        _ratio(e.projected_ratio)
                        if e.projected_ratio is not None
                        else "not projected"
                    ),
                    "sol": (
                        _ratio(sol)
                        if (sol := sol_ratio(s, e.metric)) is not None
                        else "not projected"
                    ),
                    "error": "n/a" if e.error is None else f"{100 * e.error:+.0f}%",
                }
            )
    cols = [
        ("value", study.knob),
        ("metric", "metric"),
        ("measured", f"measured ratio (vs {study.values[0]})"),
        ("interval", "interval (at the verdict level)"),
        ("detectable", "detectable change"),
        ("verdict", "verdict"),
        ("projected", "projected ratio (what-if)"),
        ("sol", "speed of light (roofline alone)"),
        ("error", "projection error"),
    ]
    return data_table(
        id="studies-effects",
        columns=[column(c, n) for c, n in cols],
        data=rows,
        style_cell=TABLE_CELL,
        style_header=TABLE_HEADER,
    )


def study_body(dctx: DashboardContext, study_id: str | None) -> html.Div:
    """Facts, tables and figures of one study."""
    if not study_id:
        return note("No study selected.")
    try:
        study = load_study(dctx, study_id)
    except (InvalidRunIdError, RunNotFoundError) as exc:
        return error_box(str(exc))
    facts = [
        f"knob {study.knob}",
        f"values {', '.join(study.values)} (baseline {study.values[0]})",
        f"{study.repeat} run(s) per setting, interleaved",
        f"engine {study.args.get('engine') or '?'}",
        f"created {study.created_at or '?'}",
    ]
    blocks: list[Component] = [html.Div(" · ".join(facts), id="studies-facts", style=CARD_STYLE)]
    if study.notes:
        blocks.append(html.Ul([html.Li(n) for n in study.notes], id="studies-notes"))
    blocks.append(html.Div([html.H3("Settings"), _settings_table(dctx, study)], style=CARD_STYLE))
    blocks.append(
        html.Div(
            [
                html.H3(f"Effect against {study.knob}={study.values[0]}: measured vs projected"),
                note(
                    "Measured: candidate / baseline over the repeats (geometric means), with "
                    "the between-run interval. Error = projected / measured - 1."
                ),
                _effects_table(study),
            ],
            style=CARD_STYLE,
        )
    )
    for spec in study_figures(study, _summary_reader(dctx)):
        blocks.append(
            figure_block(
                spec.key, spec.title, spec.figure, caption=spec.caption, missing=spec.missing
            )
        )
    return html.Div(blocks)


def _list_table(studies: list[StudyListing]) -> DataTable:
    rows = [
        {
            "study": f"[{s.study_id}](/studies?study={s.study_id})",
            "knob": s.knob or "–",
            "values": ", ".join(s.values) if s.values else "–",
            "repeat": "–" if s.repeat is None else str(s.repeat),
            "engine": s.engine or "–",
            "created": s.created_at or "–",
            "status": s.error or "ok",
        }
        for s in studies
    ]
    cols = [
        ("study", "study"),
        ("knob", "knob"),
        ("values", "values"),
        ("repeat", "runs per setting"),
        ("engine", "engine"),
        ("created", "created"),
        ("status", "status"),
    ]
    return data_table(
        id="studies-list",
        columns=[column(c, n, markdown=c == "study") for c, n in cols],
        data=rows,
        markdown_options={"link_target": "_self"},
        css=[{"selector": ".dash-cell p", "rule": "margin: 0"}],
        style_cell=TABLE_CELL,
        style_header=TABLE_HEADER,
    )


def layout(dctx: DashboardContext, req: PageRequest) -> html.Div:
    studies = list_studies(dctx)
    if not studies:
        return html.Div(
            [
                html.H2("Studies"),
                note(
                    f"No studies in {dctx.runs_dir / STUDIES_DIR}. Run 'perfscope study "
                    "batch-size --values 1,4,8' (any knob) to make one."
                ),
            ]
        )
    readable = [s.study_id for s in studies if s.error is None]
    chosen = req.get("study") or (readable[0] if readable else None)
    return html.Div(
        [
            html.H2("Studies"),
            html.Div(_list_table(studies), style=CARD_STYLE),
            dcc.Dropdown(
                id="studies-select",
                options=[{"label": s.study_id, "value": s.study_id} for s in studies],
                value=chosen,
                clearable=False,
            ),
            html.Div(study_body(dctx, chosen), id="studies-body"),
        ]
    )


def register(app: Dash, dctx: DashboardContext) -> None:
    @app.callback(
        Output("studies-body", "children"),
        Input("studies-select", "value"),
        prevent_initial_call=True,
    )
    def show_study(study_id: str | None) -> html.Div:
        return study_body(dctx, study_id)


PAGE = Page(key="studies", path="/studies", title="Studies", layout=layout, register=register)
