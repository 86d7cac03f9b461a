"""Run comparison: ratios from the summaries; better/worse only beyond run-to-run noise."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfscope.analysis.compare import (
    compare_run_sets,
    compare_runs,
    t_quantile,
)
from perfscope.analysis.experiment import (
    block_order,
    fewest_for_interval,
    judge_experiment,
    judge_metric,
)
from perfscope.cli import main
from perfscope.profiler.store import read_run
from tests.data.runs.builders import synthetic_run
from tests.test_report import parse


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        yield


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory, cache_env: None) -> list[Path]:
    """Baseline twice, then a 1.5x slower system twice (other seeds: other run-to-run
    draws)."""
    root = tmp_path_factory.mktemp("compare-runs")
    return [
        synthetic_run(root, 200, seed=1, name="base", telemetry=False),
        synthetic_run(root, 200, seed=2, name="base", telemetry=False),
        synthetic_run(root, 200, seed=3, name="slower", scale=1.5, telemetry=False),
        synthetic_run(root, 200, seed=4, name="slower", scale=1.5, telemetry=False),
    ]


def test_t_quantiles_match_the_tables() -> None:
    for df, q in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-3)
    assert t_quantile(0.95, 5) == pytest.approx(2.015, abs=1e-3)


def _summary(rng: np.random.Generator, scale: float, noise: float) -> dict[str, Any]:
    """A run's summary with TTFT/TPOT percentiles and throughput, each drawn with
    run-to-run noise (lognormal, ``noise`` = sigma of the log)."""

    def draw(v: float) -> float:
        return float(v * scale * rng.lognormal(0.0, noise))

    return {
        "latency": {
            "ttft": {"p50": draw(0.08), "p90": draw(0.15), "p99": draw(0.3)},
            "tpot": {"p50": draw(0.012), "p90": draw(0.015), "p99": draw(0.02)},
        },
        "throughput": {"output_tok_s": float(1000 / scale * rng.lognormal(0.0, noise))},
    }


def _blocked(summaries: list[dict[str, Any]], arm: str, order: list[list[int]]) -> None:
    """Mark summaries as made in blocks (what ``run --repeat --vs`` records)."""
    for i, s in enumerate(summaries):
        s["run_set"] = {
            "id": f"20260101-000000-abcd-{arm}",
            "experiment": "20260101-000000-abcd",
            "interleaved": True,
            "block": i,
            "index": i,
            "position": order[i].index(0 if arm == "A" else 1),
        }


@pytest.mark.parametrize(
    ("runs", "noise", "paired"), [(4, 0.05, False), (6, 0.2, True), (8, 0.1, True)]
)
def test_identical_configurations_raise_family_wise_false_alarms_at_most_at_the_stated_rate(
    runs: int, noise: float, paired: bool
) -> None:
    # Synthetic run sets of one configuration: any better/worse on any metric is an alarm.
    rng = np.random.default_rng(runs * 1000 + int(noise * 100))
    trials, alarms = 300, 0
    for t in range(trials):
        a = [_summary(rng, 1.0, noise) for _ in range(runs)]
        b = [_summary(rng, 1.0, noise) for _ in range(runs)]
        if paired:
            order = block_order(2, runs, t)
            _blocked(a, "A", order)
            _blocked(b, "B", order)
        result = compare_run_sets(["a", "b"], [a, b], confidence=0.95)
        assert result.noise_known and result.paired == (paired,)
        changes = [row.change[1] for row in result.metrics]
        assert set(changes) <= {"better", "worse", "no detectable change"}
        alarms += any(c != "no detectable change" for c in changes)
    rate = alarms / trials
    # stated family-wise level 5%; three binomial standard errors of slack
    assert rate <= 0.05 + 3 * (0.05 * 0.95 / trials) ** 0.5, rate


def test_normal_not_lognormal_noise_still_keeps_the_false_alarm_rate() -> None:
    rng = np.random.default_rng(11)
    alarms, trials = 0, 2000
    for _ in range(trials):
        a = list(100 + rng.normal(0, 5, 6))
        b = list(100 + rng.normal(0, 5, 6))
        alarms += judge_metric(a, b, "lower").verdict != "no detectable change"
    assert alarms / trials <= 0.05 + 3 * (0.05 * 0.95 / trials) ** 0.5


def test_a_real_30_percent_slowdown_is_called_worse_with_its_interval() -> None:
    rng = np.random.default_rng(5)
    a = [_summary(rng, 1.0, 0.03) for _ in range(6)]
    b = [_summary(rng, 1.3, 0.03) for _ in range(6)]
    result = compare_run_sets(["a", "b"], [a, b])
    rows = {r.key: r for r in result.metrics}
    assert result.primary.key == "latency.tpot.p50" and result.primary.default
    assert result.metrics[0].primary
    for key in ("latency.ttft.p50", "latency.tpot.p50", "throughput.output_tok_s"):
        assert rows[key].change[1] == "worse", key
        lo, hi = rows[key].ci[1]
        assert lo <= rows[key].ratios[1] <= hi
        assert rows[key].detectable[1] is not None and rows[key].detectable[1] < 0.3
    ratio = rows["latency.ttft.p50"].ratios[1]
    assert ratio == pytest.approx(1.3, rel=0.08)
    assert result.headlines[0].startswith("TPOT p50: worse (1.")
    assert "not detectable at this noise" in result.headlines[0]


def test_every_shown_interval_is_the_one_its_verdict_was_tested_at() -> None:
    # A 30% slowdown over 6 paired blocks: the primary is tested at 96% and shows its 96%
    # interval; a secondary tested at 99% (the primary changed: α carries over at 95%)
    # shows the interval at that level, so no cell shows a looser interval than its verdict.
    rng = np.random.default_rng(5)
    order = block_order(2, 6, 3)
    a = [_summary(rng, 1.0, 0.03) for _ in range(6)]
    b = [_summary(rng, 1.3, 0.03) for _ in range(6)]
    _blocked(a, "A", order)
    _blocked(b, "B", order)
    result = compare_run_sets(["a", "b"], [a, b], confidence=0.9)
    for row in result.metrics:
        level = row.ci_level[1]
        if row.ratios[1] is None:
            continue
        expect = 1 - 0.8 * 0.1 if row.primary else None
        if expect is not None:
            assert level == pytest.approx(expect)
        text = row.interval[1]
        if row.ci[1] is not None:
            assert text.endswith(f"at {100 * level:.3g}%") or "correction" in text
            lo, hi = row.ci[1]
            excludes = not lo <= 1.0 <= hi
            assert (row.change[1] != "no detectable change") <= excludes, row.key
    lead = result.metrics[0]
    assert lead.interval[1].endswith("at 92%") and lead.change[1] == "worse"


def test_an_experiment_too_small_for_the_corrected_level_says_so_instead_of_a_looser_interval() -> (
    None
):
    # 6 blocks reach 96% (the primary's level) but not 99% (a secondary's when the primary
    # did not change): the secondary gets no interval and the cell says how many it needs.
    rng = np.random.default_rng(2)
    base = [float(rng.lognormal(0, 0.02)) for _ in range(6)]
    same = [x * float(rng.lognormal(0, 0.02)) for x in base]
    half = [x * 0.56 for x in base]
    exp = judge_experiment(
        {"p": (base, same, "lower"), "s": (base, half, "higher")}, "p", paired=True
    )
    sec = next(c for c in exp.changes if c.metric == "s")
    assert sec.ci is None and sec.verdict == "no detectable change"
    assert sec.interval_text() == "none at 99%: 6 blocks are too few, 8+ needed"
    assert fewest_for_interval(0.96, paired=True) == 6
    assert fewest_for_interval(0.99, paired=True) == 8
    assert fewest_for_interval(0.95, paired=False) == 4


def test_three_runs_a_side_say_they_cannot_detect_a_change_instead_of_claiming_one() -> None:
    # The case: identical configurations, 3 runs a side, one slow run.
    rng = np.random.default_rng(8)
    a = [_summary(rng, 1.0, 0.3) for _ in range(3)]
    b = [_summary(rng, 1.0, 0.3) for _ in range(3)]
    result = compare_run_sets(["a", "b"], [a, b])
    assert {r.change[1] for r in result.metrics} == {"no detectable change"}
    assert "no change is detectable with 3 runs a side" in result.headlines[0]


def test_blocks_are_paired_and_a_wild_block_is_named_not_averaged() -> None:
    rng = np.random.default_rng(4)
    order = block_order(2, 8, 1)
    load = [float(rng.lognormal(0, 0.3)) for _ in range(8)]  # shared by both runs of a block
    a = [_summary(rng, load[i], 0.02) for i in range(8)]
    b = [_summary(rng, 1.1 * load[i], 0.02) for i in range(8)]
    b[5]["latency"]["tpot"]["p50"] *= 50
    _blocked(a, "A", order)
    _blocked(b, "B", order)
    result = compare_run_sets(
        ["a", "b"], [a, b], run_ids=[[f"a{i}" for i in range(8)], [f"b{i}" for i in range(8)]]
    )
    assert result.paired == (True,)
    tpot = next(r for r in result.metrics if r.key == "latency.tpot.p50")
    # Pairing cancels the 30% load swings; the wild block does not stretch the interval.
    assert tpot.change[1] == "worse"
    lo, hi = tpot.ci[1]
    assert lo > 1.0 and hi < 1.25
    assert tpot.outliers[1] == ("a5/b5",)
    assert any("outlier runs" in n and "a5/b5" in n for n in result.notes)
    # Unpaired, the same load swings hide the change.
    for s in a + b:
        del s["run_set"]
    loose = compare_run_sets(["a", "b"], [a, b])
    assert next(r for r in loose.metrics if r.key == "latency.tpot.p50").change[1] == (
        "no detectable change"
    )


def test_a_named_primary_leads_and_an_unknown_one_is_refused() -> None:
    rng = np.random.default_rng(2)
    a = [_summary(rng, 1.0, 0.05) for _ in range(4)]
    b = [_summary(rng, 1.0, 0.05) for _ in range(4)]
    result = compare_run_sets(["a", "b"], [a, b], primary="ttft.p99")
    assert result.metrics[0].key == "latency.ttft.p99" and not result.primary.default
    with pytest.raises(ValueError, match="not a compared metric"):
        compare_run_sets(["a", "b"], [a, b], primary="banana")


def test_contended_runs_are_counted_in_the_verdict_and_can_be_left_out() -> None:
    rng = np.random.default_rng(6)
    a = [_summary(rng, 1.0, 0.05) for _ in range(6)]
    b = [_summary(rng, 1.0, 0.05) for _ in range(6)]
    b[0]["contention"] = {"others_share": 0.73, "contended": True}
    result = compare_run_sets(["a", "b"], [a, b])
    assert "1 of 12 runs contended (others used 73% of the CPU)" in result.headlines[0]
    dropped = compare_run_sets(["a", "b"], [a, b], exclude_contended=True)
    assert next(r for r in dropped.metrics if r.primary).n == (6, 6)
    assert any("left out 1 contended" in n for n in dropped.notes)


def test_single_runs_never_get_a_significance_claim(three_runs: list[Path]) -> None:
    runs = [read_run(p) for p in three_runs]
    result = compare_runs(["base", "slower"], [runs[0].summary, runs[2].summary])  # type: ignore[list-item]
    assert not result.noise_known
    assert any("noise unknown" in n for n in result.notes)
    rows = {row.key: row for row in result.metrics}
    ttft = rows["latency.ttft.p50"]
    base = runs[0].summary["latency"]["ttft"]["p50"]  # type: ignore[index]
    slow = runs[2].summary["latency"]["ttft"]["p50"]  # type: ignore[index]
    assert ttft.values == (pytest.approx(base), pytest.approx(slow))
    assert ttft.ratios[1] == pytest.approx(slow / base)
    for row in result.metrics:
        assert row.change[1] in ("no detectable change", "n/a"), row.key
        assert row.ci[1] is None and row.noise[1] is None
    # a set of one against a set of many is still a single run: no claim
    one_vs_two = compare_run_sets(
        ["a", "b"],
        [[runs[0].summary], [runs[2].summary, runs[3].summary]],  # type: ignore[list-item]
    )
    assert {r.change[1] for r in one_vs_two.metrics} <= {"no detectable change", "n/a"}


def test_compare_command_takes_run_sets_as_lists_and_globs(
    three_runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp.html"
    a1, a2, _, _ = (str(p) for p in three_runs)
    root = str(three_runs[0].parent)
    code = main(
        [
            "compare",
            f"{a1},{a2}",
            "*-slower-*",
            "--runs-dir",
            root,
            "--report",
            "-o",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["report"] == str(out) and data["noise_known"]
    assert [len(g) for g in data["runs"]] == [2, 2]
    assert data["paths"][0] == [a1, a2]
    rows = {r["key"]: r for r in data["metrics"]}
    assert rows["latency.ttft.p50"]["n"] == [2, 2]
    assert rows["latency.ttft.p50"]["ratios"][1] == pytest.approx(1.5, rel=0.1)
    html = out.read_text(encoding="utf-8")
    checker = parse(html)
    assert {"comparison-table", "runs", "figures"} <= checker.ids
    # plotly.js inlined once (the basic bundle: the comparison draws scatters and bars).
    assert len(re.findall(r"\* plotly\.js (\(basic - minified\) )?v\d", html)) == 1
    assert "noise" in html
    assert main(["compare", a1, str(three_runs[2]), "--confidence", "90"]) == 0
    text = capsys.readouterr().out
    assert "TTFT p99" in text and "noise unknown" in text and "interval" in text


def test_compare_needs_two_different_runs(
    three_runs: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a = str(three_runs[0])
    assert main(["compare", a]) == 2
    assert main(["compare", a, a]) == 2
    assert "the same run is given twice" in capsys.readouterr().err
    assert main(["compare", a, "nothing-matches-*", "--runs-dir", str(three_runs[0].parent)]) == 2


def test_goodput_and_attainment_are_not_compared_for_runs_without_slos() -> None:
    """Without SLOs every completed request is good (100%): not a measurement to compare."""
    rng = np.random.default_rng(3)
    a = [_summary(rng, 1.0, 0.05) for _ in range(3)]
    b = [_summary(rng, 1.0, 0.05) for _ in range(3)]
    for s in a + b:
        s["goodput"] = {"slos": {}, "goodput_req_s": 4.0, "attainment": 1.0}
    result = compare_run_sets(["a", "b"], [a, b])
    keys = {row["key"] for row in result["metrics"]}
    assert "goodput.attainment" not in keys and "goodput.goodput_req_s" not in keys
    assert any("no SLOs set in any run" in n for n in result["notes"])
    # With SLOs on every run the rows are back and no such note is made.
    for s in a + b:
        s["goodput"] = {"slos": {"ttft": 0.2}, "goodput_req_s": 4.0, "attainment": 1.0}
    result = compare_run_sets(["a", "b"], [a, b])
    assert "goodput.attainment" in {row["key"] for row in result["metrics"]}
    assert not any("no SLOs" in n for n in result["notes"])


def test_typed_summaries_compare_as_their_json_objects_do() -> None:
    """``compare_sets`` hands the analysis' typed summaries to the comparison as they are (no
    JSON round trip per run): the result is the one their summary.json objects give."""
    from perfscope.analysis.summary import Summary

    rng = np.random.default_rng(11)
    a = [_summary(rng, 1.0, 0.05) for _ in range(5)]
    b = [_summary(rng, 1.2, 0.05) for _ in range(5)]
    _blocked(a, "A", block_order(2, 5, 1))
    _blocked(b, "B", block_order(2, 5, 1))
    b[2]["contention"] = {"others_share": 0.6, "steal_share": 0.0, "contended": True}
    typed = [[Summary.from_dict(s) for s in g] for g in (a, b)]
    as_json = [[s.to_dict() for s in g] for g in typed]
    got = compare_run_sets(["a", "b"], typed, detect=0.1)
    assert got == compare_run_sets(["a", "b"], as_json, detect=0.1)
    assert got.paired == (True,) and len(got.contention[1]) == 1
