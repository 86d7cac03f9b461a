"""perfscope.expect / perfscope.check: the assertion grammar, units, lookup and messages."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import perfscope
from perfscope.analysis.catalogue import better_of, format_metric, kind_of
from perfscope.api.runset import RunSet
from perfscope.checks.change import assert_no_regression, compare_samples, t_quantile
from perfscope.checks.grammar import parse_assertion, parse_limit, resolve_metric
from perfscope.errors import PerfAssertionError, SLOError, UsageError
from perfscope.profiler.clock import ManualClock

MS = 1_000_000


@pytest.fixture
def run(runs_dir: Path) -> perfscope.Run:
    """Four requests with TTFTs of exactly 40, 50, 60 and 300 ms and 10 ms per token."""
    clock = ManualClock()
    with perfscope.profile(name="exact", runs_dir=runs_dir, clock=clock) as p:
        for ttft_ms in (40, 50, 60, 300):
            with p.request(prompt_tokens=16) as r:
                clock.advance_ns(ttft_ms * MS)
                r.tokens(1)
                for _ in range(4):
                    clock.advance_ns(10 * MS)
                    r.tokens(1)
    return p.run


@pytest.mark.parametrize(
    ("text", "metric", "value"),
    [
        ("200ms", "ttft.p99", 0.2),
        ("1.5s", "ttft.p99", 1.5),
        ("800us", "tpot.p50", 800e-6),
        ("250 ns", "itl.max", 250e-9),
        ("95%", "goodput.attainment", 0.95),
        ("0.3", "decode.mbu", 0.3),
        ("95%", "telemetry.gpu_util_pct", 95.0),
        ("1200 tok/s", "throughput.output_tok_s", 1200.0),
        ("1200", "throughput.output_tok_s", 1200.0),
        ("3 req/s", "throughput.req_s", 3.0),
        ("0.5 J/tok", "energy.j_per_output_token", 0.5),
        ("2 TB/s", "decode.achieved_bytes_s", 2e12),
        ("1e-3s", "ttft.p99", 1e-3),
        ("95%", "goodput.per_slo.ttft", 0.95),
        ("2x", None, 2.0),
    ],
)
def test_values_are_converted_to_the_summary_si_units(
    text: str, metric: str | None, value: float
) -> None:
    assert parse_limit(text, metric) == pytest.approx(value)


def test_per_slo_attainment_is_a_ratio_not_a_duration() -> None:
    """``goodput.per_slo.ttft`` is the share of requests within the TTFT SLO: a bare 0.9
    or 90% is its limit, and a duration is refused."""
    a = parse_assertion("goodput.per_slo.ttft >= 90%")
    assert (a.kind, a.threshold) == ("ratio", pytest.approx(0.9))
    assert parse_assertion("goodput.per_slo.ttft >= 0.9").threshold == pytest.approx(0.9)
    with pytest.raises(SLOError, match="the metric is a fraction"):
        parse_assertion("goodput.per_slo.ttft >= 200ms")


def test_a_request_rate_is_refused_on_a_token_rate_metric() -> None:
    with pytest.raises(SLOError, match="is in req/s, this metric is in tok/s"):
        parse_assertion("throughput.output_tok_s > 3 req/s")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttft.p99 200ms", "expected METRIC OP VALUE"),
        ("ttft.p99 < 200", "needs a unit: the metric is a duration"),
        ("ttft.p99 < 95%", "'%' does not fit a duration"),
        ("ttft.p99 < 3 fortnights", "unknown unit 'fortnights'"),
        ("throughput.output_tok_s > 20ms", "the metric is a token rate"),
        ("ttft.p99 <", "has no value after '<'"),
        ("ttft.p99 < 1; import os", "cannot read value '1; import os'"),
        ("__import__('os').system('true') < 1", "cannot read metric"),
        ("ttft.p99 => 1s", "cannot read"),
    ],
)
def test_grammar_errors_say_what_is_wrong_and_never_evaluate_code(text: str, message: str) -> None:
    with pytest.raises(SLOError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_assertion(text)


def test_metric_kinds_and_better_directions_come_from_the_catalogue() -> None:
    assert kind_of("ttft.p99") == "seconds"
    assert kind_of("latency.itl_per_token.max") == "seconds"
    assert kind_of("goodput.attainment") == "ratio"
    assert kind_of("roofline.phases.decode.mbu") == "ratio"
    assert kind_of("throughput.output_tok_s") == "rate"
    assert kind_of("energy.j_per_output_token") == "joules_per_token"
    assert kind_of("counts.failed") == "count"
    assert better_of("ttft.p99") == "lower"
    assert better_of("energy.j_per_output_token") == "lower"
    assert better_of("counts.failed") == "lower"
    assert better_of("throughput.output_tok_s") == "higher"
    assert better_of("decode.mbu") == "higher"
    assert better_of("window_s") is None
    assert parse_assertion("ttft.p99 < 200ms").kind == "seconds"


def test_dotted_names_resolve_generically_through_the_summary() -> None:
    summary: dict[str, Any] = {
        "latency": {"ttft": {"p99": 0.3}},
        "throughput": {"output_tok_s": 900.0},
        "roofline": {"phases": {"decode": {"mbu": 0.4, "count": 3}}},
        "steps": {"decode": {"count": 5}},
    }
    assert resolve_metric(summary, "ttft.p99") == ("latency.ttft.p99", 0.3)
    assert resolve_metric(summary, "throughput.output_tok_s") == (
        "throughput.output_tok_s",
        900.0,
    )
    assert resolve_metric(summary, "decode.mbu") == ("roofline.phases.decode.mbu", 0.4)
    assert resolve_metric(summary, "roofline.decode.mbu") == ("roofline.phases.decode.mbu", 0.4)
    assert resolve_metric(summary, "steps.decode.count") == ("steps.decode.count", 5)
    with pytest.raises(LookupError, match=r"ambiguous.*roofline\.phases\.decode\.count"):
        resolve_metric(summary, "decode.count")


def test_expect_passes_and_returns_true(run: perfscope.Run) -> None:
    assert perfscope.expect(run).ttft.p99 < "400ms"
    assert perfscope.expect(run).ttft.p50 >= 0.055  # a bare number is SI: seconds
    assert perfscope.expect(run).tpot.p50 == "10ms"
    assert perfscope.expect(run)["counts.completed"] == 4


def test_a_failing_expect_shows_value_limit_distribution_and_run_dir(run: perfscope.Run) -> None:
    with pytest.raises(PerfAssertionError) as info:
        perfscope.expect(run).ttft.p99 < "200ms"  # noqa: B015
    msg = str(info.value)
    # p99 of 40, 50, 60, 300 ms (linear interpolation) = 292.8 ms
    assert "ttft.p99 < 200ms: measured 293 ms (46.4% over the limit)" in msg
    assert "latency.ttft: n=4  min 40 ms  p50 55 ms" in msg
    assert "max 300 ms" in msg
    assert f"run: {run.path}" in msg
    assert info.value.outcomes[0].measured == pytest.approx(0.2928)


def test_check_reports_every_assertion_when_one_fails(run: perfscope.Run) -> None:
    with pytest.raises(PerfAssertionError) as info:
        perfscope.check(
            run, "ttft.p99 < 200ms", "tpot.p50 <= 10ms", "throughput.output_tok_s > 1 tok/s"
        )
    lines = str(info.value).splitlines()
    assert lines[0] == "perfscope: 1 of 3 checks failed"
    assert lines[1].startswith("  FAIL  ttft.p99 < 200ms: measured 293 ms")
    assert lines[2].startswith("  ok    tpot.p50 <= 10ms: measured 10 ms")
    assert lines[3].startswith("  ok    throughput.output_tok_s > 1 tok/s: measured")


def test_check_accepts_a_dict_of_limits_with_directions_known_per_metric(
    run: perfscope.Run,
) -> None:
    outcomes = perfscope.check(run, {"ttft.p50": "60ms", "goodput.attainment": "100%"})
    assert [o.assertion.text for o in outcomes] == [
        "ttft.p50 <= 60ms",
        "goodput.attainment >= 100%",
    ]
    with pytest.raises(SLOError, match="say how to compare 'window_s'"):
        perfscope.check(run, {"window_s": "1s"})


def test_a_metric_the_run_lacks_fails_with_what_is_there(run: perfscope.Run) -> None:
    with pytest.raises(PerfAssertionError) as info:
        perfscope.check(run, "decode.mbu > 0.3")
    msg = str(info.value)
    assert "metric 'decode.mbu' is not in this run" in msg
    assert "sections: " in msg and "latency" in msg
    with pytest.raises(PerfAssertionError, match=r"latency\.ttft has no 'p42'; it has: count"):
        perfscope.expect(run).ttft.p42 < "1s"  # noqa: B015
    with pytest.raises(PerfAssertionError, match=r"is a group, not a number.*ttft\.p99"):
        perfscope.expect(run).ttft < "1s"  # noqa: B015


def test_a_missing_roofline_says_why(run: perfscope.Run) -> None:
    summary = {**run.summary.to_dict(), "roofline": {"available": False, "reason": "no device"}}
    with pytest.raises(PerfAssertionError, match=r"roofline: not available \(no device\)"):
        perfscope.check(summary, "decode.mbu > 0.3")


def test_expect_needs_a_comparison_not_truthiness(run: perfscope.Run) -> None:
    with pytest.raises(TypeError, match="compare the metric with a limit"):
        assert perfscope.expect(run).ttft.p99


def _fake_runs(values_ms: list[float]) -> RunSet:
    runs = [
        SimpleNamespace(
            summary={"latency": {"tpot": {"count": 10, "p50": v / 1e3}}},
            path=Path(f"/runs/r{i}"),
            status="complete",
        )
        for i, v in enumerate(values_ms)
    ]
    return RunSet(runs)


def test_repeats_assert_on_the_median_or_on_a_confidence_bound() -> None:
    runs = _fake_runs([10.0, 14.0, 12.0])
    assert runs.tpot.p50 == pytest.approx(0.012)
    assert runs.values("tpot.p50") == pytest.approx([0.010, 0.014, 0.012])
    assert perfscope.expect(runs).tpot.p50 < "12.5ms"
    # upper one-sided 95% bound of the mean: 12 + t(0.95, 2) * 2 / sqrt(3) = 15.37 ms
    assert perfscope.expect(runs, stat="bound").tpot.p50 < "15.5ms"
    with pytest.raises(PerfAssertionError, match=r"upper 95% bound of the mean of 3"):
        perfscope.expect(runs, stat="bound").tpot.p50 < "15.2ms"  # noqa: B015
    with pytest.raises(UsageError, match="repeated runs"):
        perfscope.expect(runs.runs[0], stat="bound").tpot.p50 < "1s"  # noqa: B015


def test_student_t_quantiles_match_the_tables() -> None:
    assert t_quantile(0.95, 1) == pytest.approx(6.314, abs=1e-3)
    assert t_quantile(0.95, 4) == pytest.approx(2.132, abs=1e-3)
    assert t_quantile(0.975, 10) == pytest.approx(2.228, abs=1e-3)
    assert t_quantile(0.95, 1000) == pytest.approx(1.645, abs=1e-3)


def test_a_change_counts_only_beyond_tolerance_and_noise() -> None:
    slow = compare_samples(
        "tpot.p50", [0.010, 0.0101, 0.0099, 0.0102], [0.020, 0.0201, 0.0199, 0.0202]
    )
    assert slow.verdict == "worse" and slow.change == pytest.approx(1.0, rel=0.02)
    fast = compare_samples(
        "tpot.p50", [0.020, 0.0201, 0.0199, 0.0202], [0.010, 0.0101, 0.0099, 0.0102]
    )
    assert fast.verdict == "better"
    noisy = compare_samples("tpot.p50", [0.010, 0.030, 0.020, 0.015], [0.025, 0.015, 0.035, 0.02])
    assert noisy.verdict == "no detectable change" and noisy.significant is False
    # one stalled repeat among the fast runs does not hide the slowdown
    stalled = compare_samples(
        "tpot.p50",
        [0.002, 0.0021, 0.0020, 0.0022, 0.0021, 0.0020, 0.0022, 0.030],
        [0.008, 0.0081, 0.0082, 0.0080, 0.0079, 0.0081, 0.0080, 0.0082],
    )
    assert stalled.verdict == "worse"
    small = compare_samples(
        "tpot.p50", [0.010, 0.0101, 0.0099, 0.01], [0.0104, 0.0105, 0.0103, 0.0104], tolerance=0.05
    )
    assert small.verdict == "no detectable change"
    tput = compare_samples(
        "throughput.output_tok_s", [1000.0, 1010.0, 990, 1005], [500.0, 505.0, 498, 502]
    )
    assert tput.verdict == "worse"
    # three repeats a side cannot show any change at 95%: said, never claimed
    few = compare_samples("tpot.p50", [0.010, 0.0101, 0.0099], [0.020, 0.0201, 0.0199])
    assert few.verdict == "no detectable change" and few.detectable is None


def test_assert_no_regression_needs_repeats_and_fails_beyond_noise() -> None:
    base, same, slower = (
        _fake_runs([10, 10.2, 9.9, 10.1]),
        _fake_runs([10.1, 9.8, 10, 10.2]),
        _fake_runs([20, 20.5, 19.8, 20.1]),
    )
    assert [c.verdict for c in assert_no_regression(base, same, "tpot.p50")] == [
        "no detectable change"
    ]
    with pytest.raises(PerfAssertionError, match=r"tpot.p50: 10 ms → 20 ms \(\+"):
        assert_no_regression(base, slower, "tpot.p50")
    with pytest.raises(UsageError, match="at least 4 repeats on each side"):
        assert_no_regression(base.runs[0], slower, "tpot.p50")


def test_values_are_formatted_for_people() -> None:
    assert format_metric(0.3124, "ttft.p99") == "312 ms"
    assert format_metric(0.0412, "ttft.p99") == "41.2 ms"
    assert format_metric(2.5e-6, "tpot.p50") == "2.5 µs"
    assert format_metric(0.912, "goodput.attainment") == "91.2%"
    assert format_metric(1234.6, "throughput.output_tok_s") == "1,235 tok/s"
    assert format_metric(None, "ttft.p99") == "n/a"


def test_a_huge_margin_is_shown_as_a_multiple_of_the_limit() -> None:
    from perfscope.checks.expect import evaluate

    summary = {"latency": {"ttft": {"p99": 7.562661, "p50": 7.0, "count": 3}}}
    outcome = evaluate(summary, parse_assertion("ttft.p99 < 1ms"))
    # "756,166% over the limit" reads badly: past 10x the limit it says how many times over
    assert outcome.margin_text() == "7,563x the limit"
    assert "measured 7.56 s" in outcome.line()
    assert "e+" not in outcome.line()
