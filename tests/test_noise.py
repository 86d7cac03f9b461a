"""``perfscope noise``: A/A blocks measure this machine's run-to-run noise, and every
"no detectable change" says what the experiment could have seen and what it would need
(compare, run --vs, the pytest gate, study tables)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from perfscope.analysis.experiment import (
    NO_CHANGE,
    PRIMARY_SHARE,
    blocks_needed,
    detectable_change,
    judge_metric,
    spread_interval,
)
from perfscope.analysis.noise import NoiseRecord, metric_noise, read_noise
from perfscope.analysis.study import detectable_cell
from perfscope.cli import main
from perfscope.profiler.store import list_runs, read_run


def _main_json(argv: list[str]) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(out.getvalue())


def _aa(n: int, sd: float, seed: int) -> tuple[list[float], list[float]]:
    """Two arms of ``n`` blocks of the same 10 ms metric with log-normal noise ``sd``."""
    rng = random.Random(seed)
    a = [0.010 * math.exp(rng.gauss(0, sd)) for _ in range(n)]
    b = [0.010 * math.exp(rng.gauss(0, sd)) for _ in range(n)]
    return a, b


def test_noise_runs_a_a_blocks_stores_the_record_and_compare_pairs_its_runs(
    tmp_path: Path, engines_on_path: Path
) -> None:
    argv = [
        "noise",
        "python:timed_engines:single_tokens",
        "--requests",
        "1",
        "--output-len",
        "3",
        "--no-telemetry",
        "--blocks",
        "3",
        "--warmup-runs",
        "0",
        "--at-blocks",
        "12",
        "--detect",
        "5%",
        "--order-seed",
        "3",
        "--no-progress",
        "--json",
        "--runs-dir",
        str(tmp_path),
        # a named device: no CPU calibration on a cold cache (minutes on a busy machine)
        "--hw",
        "h100-sxm5-80gb",
    ]
    data = _main_json(argv)
    rec = NoiseRecord.from_dict(data)
    assert rec.blocks == 3 and [len(g) for g in rec.runs] == [3, 3]
    assert rec.primary == "tpot.p50" and rec.lead.metric == "tpot.p50"
    assert rec.at_blocks == 12 and rec.detect == 0.05 and rec.power == 0.8
    lead = rec.lead
    assert lead.median is not None and 0.009 < lead.median < 0.05  # 10 ms per token, or slower
    assert lead.spread is not None and lead.spread_ci is not None
    assert lead.spread_ci[0] <= lead.spread <= lead.spread_ci[1]
    # the stated figures follow from the spread, at compare's primary level
    assert rec.alpha == pytest.approx(PRIMARY_SHARE * 0.05)
    assert lead.detectable == pytest.approx(
        detectable_change(lead.spread, 12, confidence=1 - rec.alpha)
    )
    assert lead.needs == blocks_needed(lead.spread, 0.05, confidence=1 - rec.alpha, power=0.8)
    # stored under the runs folder, read back equal; the noise folder is not a run
    assert rec.path is not None and Path(rec.path).parent == tmp_path / "noise"
    assert read_noise(rec.path) == rec
    runs = list_runs(tmp_path)
    assert len(runs) == 6 and all(p.parent == tmp_path for p in runs)
    orders = {read_run(p, tables=False).manifest["run_set"]["order"] for p in runs}
    assert orders == {"AB", "BA"}  # balanced blocks
    # the A/A runs, compared by their run-set ids: paired, no better/worse anywhere, and
    # the "no detectable change" says what 3 blocks could not see and what 5% would need
    result = _main_json(
        [
            *("compare", f"{rec.id}-A", f"{rec.id}-B", "--detect", "5%"),
            *("--runs-dir", str(tmp_path), "--json"),
        ]
    )
    assert result["paired"] == [True]
    assert all(r["change"][1] in ("no detectable change", "n/a") for r in result["metrics"])
    head = result["headlines"][0]
    assert "no change is detectable with 3 blocks" in head
    assert "detecting ±5% needs about" in head and "no claim that it is absent" in head


def test_noise_refuses_too_few_blocks_in_one_line_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["noise", "python:timed_engines:single_tokens", "--blocks", "2"]
    assert main([*argv, "--runs-dir", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --blocks 2") and "\n" not in err
    assert list_runs(tmp_path) == []


def test_the_noise_of_a_a_values_predicts_the_detectable_change_a_comparison_reports() -> None:
    a, b = _aa(12, 0.05, seed=1)
    n = metric_noise("tpot.p50", a, b, at_blocks=12, detect=0.02)
    assert n.aa.verdict == NO_CHANGE and n.blocks == 12
    # a comparison of 12 blocks at this noise reports the same detectable change
    c = judge_metric(a, b, "lower", paired=True, alpha=PRIMARY_SHARE * 0.05)
    assert n.detectable == pytest.approx(c.detectable)
    assert n.needs is not None and n.needs > 12  # 2% is below what 12 blocks see
    # the interval of the spread holds the estimate; more blocks, narrower
    assert n.spread is not None and n.spread_ci is not None
    assert n.spread_ci[0] < n.spread < n.spread_ci[1]
    w8 = spread_interval([0.05, -0.04, 0.02, -0.01, 0.03, -0.06, 0.01, -0.02])
    w32 = spread_interval([0.05, -0.04, 0.02, -0.01, 0.03, -0.06, 0.01, -0.02] * 4)
    assert w8 is not None and w32 is not None
    assert w32[1] - w32[0] < w8[1] - w8[0]


def test_blocks_needed_with_power_inverts_the_detectable_change() -> None:
    for spread in (0.02, 0.05, 0.15):
        for change in (0.05, 0.10, 0.30):
            n = blocks_needed(spread, change, power=0.8)
            det = detectable_change(spread, n)
            assert det is not None and det <= math.log1p(change)
            before = detectable_change(spread, n - 1)
            assert n == 6 or before is None or before > math.log1p(change)
    # detecting needs more blocks than the same precision of the interval
    assert blocks_needed(0.1, 0.1, power=0.8) > blocks_needed(0.1, 0.1)


def test_no_detectable_change_says_the_blocks_a_named_change_needs() -> None:
    a, b = _aa(6, 0.08, seed=4)
    c = judge_metric(a, b, "lower", paired=True, metric="tpot.p50")
    assert c.verdict == NO_CHANGE
    text = c.needs_text(0.05)
    assert c.detectable_text() in text
    assert f"detecting ±5% needs about {c.needs(0.05)} blocks" in text
    assert "(this experiment: 6)" in text
    # an experiment that could see the change says so instead
    a, b = _aa(40, 0.01, seed=5)
    c = judge_metric(a, b, "lower", paired=True)
    assert c.verdict == NO_CHANGE
    assert "a ±10% change would have been seen (40 blocks)" in c.needs_text(0.10)
    # a single run: the noise is unknown, no block count is claimed
    one = judge_metric([0.01], [0.011], "lower")
    assert "noise unknown" in one.needs_text(0.05)


def test_the_gate_says_when_its_repeats_could_not_see_the_tolerance() -> None:
    from perfscope.pytest_plugin._baseline import KeyMetric, Tolerance, compare_metrics

    def entry(value: float, samples: list[float]) -> dict[str, KeyMetric]:
        return {
            "tpot.p50": KeyMetric(
                path="latency.tpot.p50", direction="lower", value=value, samples=tuple(samples)
            )
        }

    a, b = _aa(3, 0.06, seed=2)
    cur = entry(sorted(b)[1], b)
    base = entry(sorted(a)[1], a)
    tol = [Tolerance("*", 0.5, None, "50%")]
    wide = compare_metrics("t::x", cur, base, tol, gate_all=True)[0]
    assert wide.verdict == "ok" and wide.needs is not None
    assert wide.blind  # 3 repeats a side detect nothing, even 50%
    assert "no change is detectable with 3 repeats a side" in wide.blind_text()
    assert f"about {wide.needs} repeats a side" in wide.blind_text()
    assert "could not see ±50%" in wide.describe()
    assert wide.to_dict()["needs"] == wide.needs
    # single runs: the noise is unknown; only the tolerance gates and no count is claimed
    single = entry(0.01, [0.01])
    alone = compare_metrics("t::x", single, single, tol, gate_all=True)[0]
    assert alone.needs is None and not alone.blind


def test_study_effects_show_the_detectable_change_where_the_design_has_repeats() -> None:
    a, b = _aa(8, 0.03, seed=3)
    eight = judge_metric(a, b, "lower", paired=True)
    assert eight.detectable is not None
    assert detectable_cell(eight, 8) == f"±{100 * eight.detectable:.0f}%"
    three = judge_metric(a[:3], b[:3], "lower", paired=True)
    assert detectable_cell(three, 3) == "none (3 rounds; 6+ detect)"
    one = judge_metric(a[:1], b[:1], "lower", paired=True)
    assert detectable_cell(one, 1) == "noise unknown"
