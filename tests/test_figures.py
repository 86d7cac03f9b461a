"""Figure builders: the plotted numbers are the summary's numbers."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from perfscope.dashboard.figures import (
    MAX_CDF_POINTS,
    RunTables,
    advice_figure,
    comparison_cdf_figure,
    comparison_metrics_figure,
    comparison_roofline_figure,
    comparison_throughput_figure,
    latency_cdf_figure,
    phase_breakdown_figure,
    roofline_figure,
    run_figures,
    throughput_figure,
    timeline_figure,
)
from perfscope.profiler.store import StoredRun, read_run
from tests.data.runs.builders import manual_run, small_model, synthetic_run


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        yield


@pytest.fixture(scope="module")
def steps_run(tmp_path_factory: pytest.TempPathFactory, cache_env: None) -> StoredRun:
    root = tmp_path_factory.mktemp("fig-runs")
    return read_run(manual_run(root, n_requests=9, fail_every=4, model=small_model()))


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory, cache_env: None) -> StoredRun:
    return read_run(synthetic_run(tmp_path_factory.mktemp("fig-big"), 3_000))


def _traces(fig: Any, **meta: str) -> list[Any]:
    return [
        t
        for t in fig.data
        if isinstance(t.meta, dict) and all(t.meta.get(k) == v for k, v in meta.items())
    ]


@pytest.mark.parametrize("which", ["steps_run", "big_run"])
def test_latency_percentile_markers_are_the_summary_percentiles(
    which: str, request: pytest.FixtureRequest
) -> None:
    run: StoredRun = request.getfixturevalue(which)
    s = run.summary
    assert s is not None
    fig = latency_cdf_figure(s, run.requests, run.chunks)
    for key in ("ttft", "tpot", "itl", "e2e"):
        (markers,) = _traces(fig, metric=key, kind="percentiles")
        want = [s["latency"][key][f"p{p}"] for p in (50, 90, 99)]  # seconds, SI ticks
        assert list(markers.x) == pytest.approx(want, rel=1e-12)
        assert list(markers.y) == [0.5, 0.9, 0.99]
    for key, limit in s["goodput"]["slos"].items():
        (label,) = _traces(fig, metric=key, kind="slo")
        assert label.x[0] == pytest.approx(limit)


def test_cdf_of_many_values_is_downsampled_but_keeps_its_ends(big_run: StoredRun) -> None:
    assert big_run.summary is not None
    fig = latency_cdf_figure(big_run.summary, big_run.requests, big_run.chunks)
    itl = next(t for t in fig.data if t.name == "ITL CDF")
    assert len(itl.x) <= MAX_CDF_POINTS
    assert big_run.summary["latency"]["itl"]["count"] > MAX_CDF_POINTS
    assert float(itl.y[-1]) == 1.0
    assert float(itl.x[-1]) == pytest.approx(big_run.summary["latency"]["itl"]["max"], rel=1e-6)


def test_roofline_points_and_ceilings_are_the_summary_numbers(steps_run: StoredRun) -> None:
    s = steps_run.summary
    assert s is not None and s["roofline"]["available"]
    fig = roofline_figure(s)
    assert fig is not None
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    for phase, p in s["roofline"]["phases"].items():
        (measured,) = _traces(fig, phase=phase, kind="measured")
        assert measured.x[0] == pytest.approx(p["intensity"])
        assert measured.y[0] == pytest.approx(p["achieved_flops_s"])
        assert "MFU" in measured.text[0] and "MBU" in measured.text[0]
        (pred,) = _traces(fig, phase=phase, kind="predicted")
        assert pred.y[1] == pytest.approx(p["flops"] / p["sol_time_s"])
    peak = s["roofline"]["ceilings"]["peak_flops"]
    flat = [t for t in fig.data if t.mode == "lines" and len(set(t.y)) == 1]
    assert any(t.y[0] == pytest.approx(peak) for t in flat)
    # Ridge annotations sit at log10 coordinates (plotly's log-axis convention).
    ridge = s["roofline"]["ceilings"]["ridge_point"]
    assert any(a.x == pytest.approx(math.log10(ridge)) for a in fig.layout.annotations)


def test_roofline_is_absent_without_a_roofline_section() -> None:
    assert roofline_figure({}) is None
    assert roofline_figure({"roofline": {"available": False, "reason": "no model"}}) is None


def test_timeline_rows_and_error_marks(steps_run: StoredRun) -> None:
    fig = timeline_figure(steps_run.requests, steps_run.steps)
    names = {t.name for t in fig.data}
    assert {"queued", "prefill", "decode", "error"} <= names
    err = next(t for t in fig.data if t.name == "error")
    assert len(err.x) == steps_run.summary["counts"]["failed"]  # type: ignore[index]
    decode = next(t for t in fig.data if t.name == "decode")
    r = steps_run.requests.set_index("request_id")
    for rid, base, dur in zip(decode.y, decode.base, decode.x, strict=True):
        assert float(base) == pytest.approx(r.at[rid, "t_first_token"] * 1e-9, abs=1e-6)
        assert float(base) + float(dur) == pytest.approx(r.at[rid, "t_last_token"] * 1e-9, abs=1e-6)


def test_timeline_switches_to_a_density_view_for_many_requests(big_run: StoredRun) -> None:
    fig = timeline_figure(big_run.requests, big_run.steps, max_rows=200)
    assert "density view" in fig.layout.title.text
    stacked = [t for t in fig.data if t.type == "scatter" and t.stackgroup == "states"]
    assert {t.name for t in stacked} == {"queued", "prefill", "decode"}
    rows = {int(y) for t in fig.data if t.type == "bar" for y in t.y}
    assert len(rows) < len(big_run.requests) / 5
    failed = set(big_run.requests.loc[big_run.requests["error"].notna(), "request_id"])
    assert failed <= rows  # every failed request keeps its row


def test_throughput_bins_add_up_to_every_token(big_run: StoredRun) -> None:
    fig = throughput_figure(big_run.requests, big_run.chunks, big_run.telemetry)
    tok = fig.data[0]
    width = float(tok.x[1]) - float(tok.x[0])
    assert float(np.sum(np.asarray(tok.y, dtype=float)) * width) == pytest.approx(
        float(big_run.chunks["n_tokens"].sum()), rel=1e-3
    )
    names = " ".join(t.name for t in fig.data)
    assert "gpu0 power (W)" in names and "gpu0 SM clock (MHz)" in names


def test_phase_breakdown_equals_the_roofline_and_energy_sections(big_run: StoredRun) -> None:
    s = big_run.summary
    assert s is not None
    fig = phase_breakdown_figure(s)
    assert fig is not None
    panels = {t.meta["panel"]: dict(zip(t.x, t.y, strict=True)) for t in fig.data}
    for phase, p in s["roofline"]["phases"].items():
        assert panels["time (s)"][phase] == pytest.approx(p["time_s"])
        assert panels["FLOPs"][phase] == pytest.approx(p["flops"])
        assert panels["bytes moved"][phase] == pytest.approx(p["bytes"])
    for phase, e in s["energy"]["phases"].items():
        if e.get("energy_j"):
            assert panels["energy (J)"][phase] == pytest.approx(e["energy_j"])


def test_advice_figure_shows_speedups_only() -> None:
    summary = {
        "advice": [
            {"technique": "<b>batch</b>", "projected_gain": {"value": 2.5, "unit": "x decode"}},
            {"technique": "tp", "projected_gain": {"value": 2, "unit": "devices needed"}},
        ]
    }
    fig = advice_figure(summary)
    assert fig is not None
    assert list(fig.data[0].y) == ["&lt;b&gt;batch&lt;/b&gt;"]
    assert advice_figure({}) is None


def test_run_figures_lists_every_figure_with_reasons_for_missing_ones(
    steps_run: StoredRun, big_run: StoredRun
) -> None:
    for run in (steps_run, big_run):
        figs = run_figures(
            RunTables(run.summary or {}, run.requests, run.chunks, run.steps, run.telemetry)
        )
        keys = [f.key for f in figs]
        assert keys[:7] == [
            "roofline",
            "latency",
            "latency-over-time",
            "offered-achieved",
            "timeline",
            "throughput",
            "phases",
        ]
        assert all(f.figure is not None or f.missing for f in figs)
    bare = run_figures(
        RunTables({}, steps_run.requests, steps_run.chunks, steps_run.steps, steps_run.telemetry)
    )
    assert bare[0].figure is None and "no roofline section" in (bare[0].missing or "")


def test_latency_over_time_has_one_point_per_completed_request(steps_run: StoredRun) -> None:
    from perfscope.dashboard.figures import latency_over_time_figure

    fig = latency_over_time_figure(steps_run.requests)
    r = steps_run.requests
    ok = r[~r["is_warmup"].astype(bool) & r["error"].isna() & r["t_last_token"].notna()]
    e2e = next(t for t in fig.data if t.name == "E2E")
    assert len(e2e.x) == len(ok) > 0
    expected = sorted((ok["t_last_token"] - ok["t_sent"]).to_numpy(dtype=float) * 1e-9)
    assert sorted(e2e.y) == pytest.approx(expected, rel=1e-5)


def test_offered_and_achieved_counts_end_at_the_requests_sent_and_completed(
    steps_run: StoredRun,
) -> None:
    from perfscope.dashboard.figures import offered_achieved_figure

    fig = offered_achieved_figure(steps_run.requests, {"rate": None})
    r = steps_run.requests
    measured = r[~r["is_warmup"].astype(bool)]
    sent, done = fig.data
    assert sent.y[-1] == measured["t_sent"].notna().sum()
    assert done.y[-1] == (measured["error"].isna() & measured["t_last_token"].notna()).sum()
    assert "req/s" in done.name
    assert fig.layout.yaxis.tickformat == ",d"  # a count axis shows whole numbers


def test_an_offered_rate_that_is_not_a_number_is_not_shown(steps_run: StoredRun) -> None:
    from perfscope.dashboard.figures import offered_achieved_figure

    fig = offered_achieved_figure(steps_run.requests, {"rate": "fast"})
    assert "offered" not in fig.data[0].name and "fast" not in fig.data[0].name
    fig = offered_achieved_figure(steps_run.requests, {"rate": 2.0})
    assert fig.data[0].name == "sent (offered 2 req/s)"


def test_comparison_figures_have_one_series_per_run(
    steps_run: StoredRun, big_run: StoredRun
) -> None:
    runs = [
        RunTables(r.summary or {}, r.requests, r.chunks, r.steps, r.telemetry)
        for r in (steps_run, big_run)
    ]
    labels = ["a<script>", "b"]
    fig = comparison_metrics_figure(labels, [r.summary for r in runs])
    bars = [t for t in fig.data if t.xaxis in (None, "x")]
    assert [t.name for t in bars] == ["a&lt;script&gt;", "b"]
    assert bars[1].y[0] == pytest.approx(big_run.summary["latency"]["ttft"]["p50"] * 1e3)  # type: ignore[index]
    cdf = comparison_cdf_figure(labels, runs)
    assert len(cdf.data) == 2 * 4


def test_comparison_roofline_puts_each_runs_phases_at_their_summary_numbers(
    steps_run: StoredRun, big_run: StoredRun
) -> None:
    summaries = [steps_run.summary or {}, big_run.summary or {}]
    fig = comparison_roofline_figure(["a", "b"], summaries)
    assert fig is not None
    points = {t.name: (t.x[0], t.y[0]) for t in fig.data if t.mode == "markers"}
    for label, summary in zip(["a", "b"], summaries, strict=True):
        roof = summary.get("roofline") or {}
        if not roof.get("available"):
            continue
        for phase, p in roof["phases"].items():
            x, y = points[f"{label} · {phase}"]
            assert x == pytest.approx(p["intensity"])
            assert y == pytest.approx(p["achieved_flops_s"])
    assert any(t.name.startswith("roof: ") for t in fig.data)
    assert comparison_roofline_figure(["x"], [{}]) is None


def test_comparison_roofline_axes_read_in_si_units_not_billions(
    steps_run: StoredRun, big_run: StoredRun
) -> None:
    fig = comparison_roofline_figure(["a", "b"], [steps_run.summary or {}, big_run.summary or {}])
    assert fig is not None
    y_ticks = list(fig.layout.yaxis.ticktext)
    assert y_ticks and all(t.endswith("FLOP/s") for t in y_ticks)
    assert not any(t.endswith("B") for t in [*y_ticks, *fig.layout.xaxis.ticktext])


def test_comparison_throughput_integrates_to_each_runs_measured_tokens(
    steps_run: StoredRun, big_run: StoredRun
) -> None:
    runs = [
        RunTables(r.summary or {}, r.requests, r.chunks, r.steps, r.telemetry)
        for r in (steps_run, big_run)
    ]
    fig = comparison_throughput_figure(["a", "b"], runs)
    assert [t.name for t in fig.data] == ["a", "b"]
    for trace, run in zip(fig.data, runs, strict=True):
        width = float(trace.x[1] - trace.x[0]) if len(trace.x) > 1 else None
        measured = run.requests[~run.requests["is_warmup"].astype(bool)]
        tokens = run.chunks[run.chunks["request_id"].isin(measured["request_id"])]["n_tokens"]
        if width:
            assert float(np.sum(trace.y) * width) == pytest.approx(tokens.sum(), rel=1e-3)
