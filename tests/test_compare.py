"""Run comparison: ratios from the summaries, bootstrap intervals that tell change from noise."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from perfscope.analysis.compare import bootstrap_percentile_ratio, compare_runs, latency_samples
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
    """Baseline, the same system again (other seed), and a 1.5x slower system."""
    root = tmp_path_factory.mktemp("compare-runs")
    return [
        synthetic_run(root, 400, seed=1, name="base", telemetry=False),
        synthetic_run(root, 400, seed=2, name="again", telemetry=False),
        synthetic_run(root, 400, seed=3, name="slower", scale=1.5, telemetry=False),
    ]


def test_bootstrap_interval_separates_a_real_change_from_noise() -> None:
    rng = np.random.default_rng(0)
    a = rng.lognormal(np.log(0.1), 0.4, 500)
    same = rng.lognormal(np.log(0.1), 0.4, 500)
    slower = rng.lognormal(np.log(0.13), 0.4, 500)
    for q in (50.0, 90.0):
        lo, hi = bootstrap_percentile_ratio(a, same, q, n_boot=500)  # type: ignore[misc]
        assert lo < 1.0 < hi
        lo, hi = bootstrap_percentile_ratio(a, slower, q, n_boot=500)  # type: ignore[misc]
        assert lo > 1.0
        assert lo < 1.3 < hi  # and it covers the true ratio


def test_bootstrap_covers_the_true_ratio_at_about_the_nominal_rate() -> None:
    rng = np.random.default_rng(7)
    hits = 0
    trials = 60
    for _ in range(trials):
        a = rng.exponential(1.0, 300)
        b = rng.exponential(2.0, 300)  # true median ratio 2
        ci = bootstrap_percentile_ratio(
            a, b, 50.0, n_boot=300, confidence=0.9, seed=int(rng.integers(1 << 30))
        )
        assert ci is not None
        hits += ci[0] <= 2.0 <= ci[1]
    assert hits / trials >= 0.75  # nominal 90%; loose bound keeps the test stable


def test_too_few_samples_give_no_interval() -> None:
    assert bootstrap_percentile_ratio(np.ones(3), np.ones(100), 50.0) is None


def test_compare_runs_ratios_come_from_the_summaries(three_runs: list[Path]) -> None:
    runs = [read_run(p) for p in three_runs]
    result = compare_runs(
        ["base", "again", "slower"],
        [r.summary for r in runs],  # type: ignore[misc]
        [latency_samples(r.requests, r.chunks) for r in runs],
        n_boot=400,
    )
    rows = {row["key"]: row for row in result["metrics"]}
    ttft = rows["latency.ttft.p50"]
    base = runs[0].summary["latency"]["ttft"]["p50"]  # type: ignore[index]
    slow = runs[2].summary["latency"]["ttft"]["p50"]  # type: ignore[index]
    assert ttft["values"][0] == base and ttft["ratios"][2] == pytest.approx(slow / base)
    assert ttft["ci"][0] is None and ttft["change"][0] is None
    assert ttft["change"][1] == "no significant change"
    assert ttft["change"][2] == "worse"
    lo, hi = ttft["ci"][2]
    assert lo <= ttft["ratios"][2] <= hi
    assert rows["throughput.output_tok_s"]["ci"] == [None, None, None]
    assert rows["latency.itl.p50"]["ci"] == [None, None, None]  # pooled gaps: ratio only


def test_compare_command_prints_a_table_and_writes_a_page(
    three_runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp.html"
    a, _, c = (str(p) for p in three_runs)
    code = main(["compare", a, c, "--bootstrap", "300", "--report", "-o", str(out), "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["report"] == str(out) and data["n_boot"] == 300
    assert [r["path"] for r in data["runs"]] == [a, c]
    html = out.read_text(encoding="utf-8")
    checker = parse(html)
    assert {"comparison-table", "runs", "figures"} <= checker.ids
    # plotly.js inlined once (the basic bundle: the comparison draws scatters and bars).
    assert len(re.findall(r"\* plotly\.js (\(basic - minified\) )?v\d", html)) == 1
    assert "worse" in html
    assert main(["compare", a, c, "--bootstrap", "200", "--confidence", "90"]) == 0
    text = capsys.readouterr().out
    assert "TTFT p99" in text and "90% CI" in text


def test_compare_needs_two_different_runs(
    three_runs: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a = str(three_runs[0])
    assert main(["compare", a]) == 2
    assert main(["compare", a, a]) == 2
    assert "the same run is given twice" in capsys.readouterr().err
