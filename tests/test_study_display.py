"""What ``perfscope study`` shows: measured ratio [interval], projected, speed of light and
error per effect; per-phase columns over all runs of a setting, not the first."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

from rich.console import Console

from perfscope import save_study
from perfscope.analysis.study import PhasePoint, read_study
from perfscope.cli.study import effects_table, study_table
from perfscope.dashboard.study_report import phase_summary, sol_ratio
from tests.conftest import ROOT

STUDIES = ROOT / "samples" / "studies" / "results"


def _text(renderable: object) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(renderable)
    return buf.getvalue()


def _batch_study() -> object:
    return read_study(next(STUDIES.glob("*-study-batch-size.json")))


def test_the_effects_table_shows_measured_interval_projected_sol_and_error() -> None:
    st = _batch_study()
    text = _text(effects_table(st))  # type: ignore[arg-type]
    assert "measured, interval" in text and "SoL" in text and "projected" in text
    cand = st.settings[1]  # type: ignore[attr-defined]
    e = next(x for x in cand.effects if x.metric == "output_tok_s")
    lo, hi = e.change.ci
    # An older record: its stored interval is the uncorrected 95% one, while its verdict was
    # tested at 99% (a secondary metric, the primary unchanged), which 6 rounds cannot reach:
    # the cell says so first, then shows the looser interval named as such.
    assert e.change.ci_level is None and e.change.verdict == "no detectable change"
    assert (
        f"{e.change.ratio:.3f}x none at 99%: 6 blocks are too few, 8+ needed; "
        f"uncorrected 95%: [{lo:.3f}, {hi:.3f}]"
    ) in text
    sol = sol_ratio(cand, "output_tok_s")
    assert sol is not None and f"{sol:.3f}x" in text
    assert f"{100 * e.error:+.0f}%" in text


def test_phase_columns_summarise_every_run_and_question_a_ceiling_over_100_percent() -> None:
    st = _batch_study()
    s = st.settings[0]  # type: ignore[attr-defined]
    runs = []
    for r, mfu in zip(s.runs[:3], (1.96, 0.22, 0.34), strict=True):
        ph = dict(r.phases)
        ph["decode"] = dataclasses.replace(ph["decode"], mfu=mfu)
        runs.append(dataclasses.replace(r, phases=ph))
    s = dataclasses.replace(s, runs=runs)
    text = phase_summary(s)
    dec = next(p for p in text.split("; ") if p.startswith("decode"))
    assert "MFU 34" in dec and "[22" in dec and "196" in dec  # median [min–max], not run 1
    assert "(over 100%: the ceiling is suspect)" in dec
    assert "(3 runs)" in dec
    st2 = dataclasses.replace(st, settings=[s, *st.settings[1:]])  # type: ignore[arg-type]
    assert "ceiling is suspect" in _text(study_table(st2))


def test_save_stores_a_copy_that_reads_back(tmp_path: Path) -> None:
    st = _batch_study()
    path = save_study(st, tmp_path / "stored")  # type: ignore[arg-type]
    back, orig = read_study(path).to_dict(), st.to_dict()  # type: ignore[attr-defined]
    # the copy names where it is stored; everything else reads back unchanged
    assert Path(back.pop("path")).name == path.name
    orig.pop("path")
    assert back == orig
    assert isinstance(PhasePoint, type)


def test_study_tables_name_metrics_and_units_as_the_catalogue_does() -> None:
    st = _batch_study()
    per_setting = _text(study_table(st))  # type: ignore[arg-type]
    assert "output tokens/s" in per_setting and " tok/s" in per_setting
    assert "TTFT p50" in per_setting and " ms" in per_setting
    effects = _text(effects_table(st))  # type: ignore[arg-type]
    assert "ttft_p50_s" not in effects and "output_tok_s" not in effects  # labels, not keys
    assert "TTFT p50" in effects and "output tokens/s" in effects


def test_a_study_on_provisional_ceilings_says_so(tmp_path: Path) -> None:
    import json

    from perfscope.cli.study import provisional_ceilings
    from tests.data.runs.builders import complete_run

    st = _batch_study()
    assert provisional_ceilings(st) is None  # type: ignore[arg-type]
    run = complete_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    note = "provisional ceilings: calibrated while other processes used 65% of the CPU"
    summary["roofline"]["ceilings"]["provisional"] = note  # as a contended calibration writes
    (run / "summary.json").write_text(json.dumps(summary))
    s0 = st.settings[0]  # type: ignore[attr-defined]
    point = dataclasses.replace(s0.runs[0], run=str(run))
    busy = dataclasses.replace(st, settings=[dataclasses.replace(s0, runs=[point])])  # type: ignore[arg-type]
    assert provisional_ceilings(busy) == note


def test_settings_and_effects_tables_cannot_point_opposite_ways() -> None:
    """The settings table's values come from the effects' statistic: for every stored study,
    setting and metric, the value moves from the baseline's by exactly the effect's ratio.
    Medians did not: in the stored kv-dtype study int8's output throughput median is 1.001x
    the baseline's while the paired effect is 0.764x, judged worse."""
    from perfscope.cli.study import _value

    checked = 0
    for path in sorted(STUDIES.glob("*.json")):
        st = read_study(path)
        base = st.baseline
        for s in st.settings[1:]:
            for e in s.effects:
                b, r = base.median.get(e.metric), e.change.ratio
                if not b or r is None:
                    continue
                got = st.estimate(s, e.metric)
                assert got is not None and abs(got / b - r) < 1e-9 * r, (path.name, s.value)
                checked += 1
    assert checked > 100
    st = read_study(STUDIES / "20261202-065255-study-kv-dtype.json")
    int8 = next(s for s in st.settings if s.value == "int8")
    e = next(x for x in int8.effects if x.metric == "output_tok_s")
    b = st.baseline.median["output_tok_s"]
    assert b is not None and int8.median["output_tok_s"] is not None
    assert int8.median["output_tok_s"] > b and e.change.ratio is not None and e.change.ratio < 1
    shown = _value("output_tok_s", st.estimate(int8, "output_tok_s"))
    assert shown == _value("output_tok_s", b * e.change.ratio)
    row = next(
        ln for ln in _text(study_table(st)).splitlines() if ln.lstrip("│ ").startswith("int8")
    )
    assert shown in row


def test_study_charts_give_each_quantity_one_unit_on_its_ticks() -> None:
    """The Studies page's curves carry the unit on the ticks with SI prefixes (``900µs``,
    ``1.2k tok/s``), as the other dashboard figures, not ``TTFT p50 (s)`` beside ``900µ``;
    their points are the tables' values (:meth:`Study.estimate`)."""
    from perfscope.dashboard.study_report import metric_curve_figure

    st = read_study(STUDIES / "20261202-065255-study-kv-dtype.json")
    for metric, suffix in (("ttft_p50_s", "s"), ("output_tok_s", " tok/s")):
        fig = metric_curve_figure(st, metric)
        assert fig is not None
        y = fig.layout.yaxis
        assert y.ticksuffix == suffix and y.exponentformat == "SI" and y.minexponent == 0
        assert "(" not in y.title.text
        assert list(fig.data[0].y) == [st.estimate(s, metric) for s in st.settings]


def test_write_up_markdown_uses_the_effects_statistic_and_every_run_of_a_phase() -> None:
    """The write-ups' Markdown (``samples/studies/_common.markdown``) shows the same values
    as the terminal: the settings row of a candidate is the baseline times its effect
    ratio, and its phase cells summarise all of its runs, not the first."""
    import sys

    from perfscope.dashboard.study_report import phase_cell

    sys.path.insert(0, str(ROOT / "samples" / "studies"))
    try:
        from _common import markdown  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(ROOT / "samples" / "studies"))
    st = read_study(STUDIES / "20261202-065255-study-kv-dtype.json")
    int8 = next(s for s in st.settings if s.value == "int8")
    row = next(ln for ln in markdown(st).splitlines() if ln.startswith("| int8 |"))
    tok_s = st.estimate(int8, "output_tok_s")
    assert tok_s is not None and f"| {tok_s:.3f} |" in row
    decode = phase_cell(int8, "decode")
    assert decode is not None and f"({len(int8.runs)} runs)" in decode and decode in row


def test_a_run_summary_that_is_not_a_json_object_reads_as_empty(tmp_path: Path) -> None:
    from perfscope.dashboard.study_report import _summary

    (tmp_path / "summary.json").write_text("[1, 2]")
    assert _summary(str(tmp_path)) == {}
    (tmp_path / "summary.json").write_text('{"schema": "perfscope.summary/2"}')
    assert _summary(str(tmp_path)) == {"schema": "perfscope.summary/2"}
    assert _summary(str(tmp_path / "absent")) == {}
