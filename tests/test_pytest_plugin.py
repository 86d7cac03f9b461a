"""The pytest plugin, driven through pytester: fixture, assertions, marker, baselines."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from tests.conftest import ROOT

# Imported here, in the outer session, so that pytester's in-process runs (which drop the
# modules they import) never import numpy, pandas or torch a second time.
for _module in (
    "perfscope.api.manual",
    "perfscope.api.runner",
    "perfscope.profiler.engines.python_callable",
    "perfscope.profiler.engines.reference",
    "rich.table",
):
    importlib.import_module(_module)

pytest_plugins = ["pytester"]


SAMPLES = ROOT / "samples" / "pytest"

#: A ``python:`` engine whose speed the tests set through the environment.
FAKE_ENGINE = '''
import os
import time


def generate(max_tokens):
    """FAKE_DELAY_MS per token (twice that before the first), read at call time."""
    delay = float(os.environ.get("FAKE_DELAY_MS", "4")) / 1e3
    time.sleep(2 * delay)
    yield 1
    for _ in range(max_tokens - 1):
        time.sleep(delay)
        yield 1
'''

PERF_TEST = """
import fake_engine


def test_decode(perfscope):
    run = perfscope.run(fake_engine.generate, requests=4, output_len=5, warmup=0)
    assert perfscope.expect(run).tpot.p50 < "1s"
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makepyfile(fake_engine=FAKE_ENGINE)
    pytester.syspathinsert()
    monkeypatch.setenv("FAKE_DELAY_MS", "4")
    return pytester


def test_passing_and_failing_assertions_and_their_messages(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_perf="""
        import fake_engine

        def test_fast_enough(perfscope):
            run = perfscope.run(fake_engine.generate, requests=4, output_len=5, warmup=0)
            assert perfscope.expect(run).ttft.p99 < "2s"
            perfscope.check(run, "tpot.p50 < 500ms", "throughput.output_tok_s > 1 tok/s",
                            "goodput.attainment >= 100%", "counts.completed == 4")

        def test_too_slow(perfscope):
            run = perfscope.run("python:fake_engine:generate", requests=4, output_len=5,
                                warmup=0)
            perfscope.check(run, "ttft.p99 < 1us", "tpot.p50 < 1s")
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*perfscope: 1 of 2 checks failed",
            "*FAIL  ttft.p99 < 1us: measured *ms (*x the limit)",
            "*ok    tpot.p50 < 1s: measured *ms (*% headroom)",
            "*latency.ttft: n=4  min *ms  p50 *ms*max *ms*",
            "*run: */perfscope-test_too_slow*/*-python-*",
            # the summary table of all perf tests
            "*perfscope: 2 perf test(s), 2 run(s)*",
            "*perf test / metric*measured*limit*verdict*",
            "*test_fast_enough*passed*",
            "*ttft.p99*ms*< 2 s*pass*",
            "*test_too_slow*failed*",
            "*ttft.p99*ms*< 1 µs*FAIL*",
        ]
    )


def test_grammar_errors_are_reported_clearly(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_perf="""
        import fake_engine

        def test_typo(perfscope):
            run = perfscope.run(fake_engine.generate, requests=2, output_len=2, warmup=0)
            perfscope.check(run, "ttft.p99 =< 200ms")

        def test_missing_unit(perfscope):
            run = perfscope.run(fake_engine.generate, requests=2, output_len=2, warmup=0)
            perfscope.expect(run).ttft.p99 < "200"

        def test_not_in_run(perfscope):
            run = perfscope.run(fake_engine.generate, requests=2, output_len=2, warmup=0)
            perfscope.check(run, "energy.j_per_token < 1 J/tok")
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*SLOError: cannot read*'ttft.p99 =< 200ms'*",
            "*SLOError: value '200' in 'ttft.p99 < 200' needs a unit: the metric is a duration*",
            "*FAIL  energy.j_per_token < 1 J/tok: metric 'energy.j_per_token' is not in this run*",
        ]
    )


def test_marker_slos_are_checked_after_the_test_body(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_perf="""
        import pytest
        import fake_engine

        def _run(perfscope):
            return perfscope.run(fake_engine.generate, requests=4, output_len=5, warmup=0,
                                 slos={"ttft": "2s"})

        @pytest.mark.perfscope(slo={"tpot.p50": "1s", "goodput.attainment": "100%",
                                    "counts.completed": "== 4"})
        def test_meets(perfscope):
            _run(perfscope)

        @pytest.mark.perfscope("ttft.p99 < 1ms")
        def test_misses(perfscope):
            _run(perfscope)

        @pytest.mark.perfscope(slo={"ttft.p99": "1s"})
        def test_forgets_to_run(perfscope):
            pass

        @pytest.mark.perfscope(slo={"ttft.p99": "1 parsec"})
        def test_bad_unit(perfscope):
            _run(perfscope)

        @pytest.mark.perfscope(budget=3)
        def test_unknown_argument(perfscope):
            _run(perfscope)
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(passed=1, failed=2, errors=2)
    result.stdout.fnmatch_lines_random(
        [
            "*perfscope: marker SLOs: 1 of 1 checks failed",
            "*FAIL  ttft.p99 < 1ms: measured *ms*",
            "*marked with SLOs but made no run*",
            "*@pytest.mark.perfscope: unknown unit 'parsec'*",
            "*@pytest.mark.perfscope got unknown argument(s) budget*",
            "*goodput.attainment*100%*>= 100%*pass*",
        ]
    )
    # marker failures are reported as messages, not as tracebacks into the plugin
    assert "pytest_plugin" not in result.stdout.str()


def test_save_then_compare_flags_a_slowdown_and_not_a_speedup(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite.makepyfile(test_perf=PERF_TEST)
    # 8 ms per token: far enough from 1 ms that the speedup below stays one when a loaded
    # machine wakes every sleep a few milliseconds late
    monkeypatch.setenv("FAKE_DELAY_MS", "8")
    saved = suite.runpytest("--perfscope-save", "base")
    assert saved.ret == 0
    saved.stdout.fnmatch_lines(["*perfscope: baseline 'base' created: 1 measurement(s) in *"])
    stored = json.loads((suite.path / ".perfscope" / "baselines" / "base.json").read_text())
    assert stored["schema"] == "perfscope.baseline/1"
    assert stored["machine"]["hardware_key"]
    assert {"cpu", "python", "torch", "perfscope", "platform"} <= set(stored["machine"])
    assert "id" in stored["commit"]
    entry = stored["tests"]["test_perf.py::test_decode"]
    assert entry["metrics"]["tpot.p50"]["value"] == pytest.approx(0.008, rel=0.5)
    assert entry["metrics"]["throughput.output_tok_s"]["direction"] == "higher"

    monkeypatch.setenv("FAKE_DELAY_MS", "32")  # 4x slower: an injected regression
    slower = suite.runpytest("--perfscope-compare", "base", "--perfscope-json", "perf.json")
    assert slower.ret == 1
    slower.stdout.fnmatch_lines(
        [
            "*perfscope: performance regressed against baseline 'base'*",
            "*tpot.p50: *ms vs baseline *ms (+*%, tolerance 10%, noise unknown: single runs)*",
            "*perfscope: 1 perf test(s), 1 run(s) vs baseline 'base' (cpu:*",
            "*perf test / metric*measured*limit*baseline*change*verdict*",
            "*tpot.p50*ms*ms*+*%*REGRESSED*",
            "*throughput.output_tok_s*tok/s*tok/s*-*%*REGRESSED*",
            "*perfscope: * metric(s) of * run(s) regressed against baseline*",
        ]
    )
    assert "Traceback" not in slower.stdout.str()
    report = json.loads((suite.path / "perf.json").read_text())
    assert report["schema"] == "perfscope.pytest/1"
    assert report["passed"] is False and report["regressions"] >= 2
    comparisons = report["tests"][0]["measurements"][0]["comparisons"]
    tpot = next(c for c in comparisons if c["metric"] == "tpot.p50")
    assert tpot["verdict"] == "regressed" and tpot["change"] > 1.0

    monkeypatch.setenv("FAKE_DELAY_MS", "1")  # 8x faster: an improvement, never a failure
    faster = suite.runpytest("--perfscope-compare", "base")
    assert faster.ret == 0
    faster.stdout.fnmatch_lines(["*tpot.p50*ms*ms*-*%*improved*"])
    assert "REGRESSED" not in faster.stdout.str()


def test_per_metric_tolerances_choose_what_gates(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite.makepyfile(test_perf=PERF_TEST)
    assert suite.runpytest("--perfscope-save", "base").ret == 0
    monkeypatch.setenv("FAKE_DELAY_MS", "8")  # 2x slower
    lenient = suite.runpytest("--perfscope-compare", "base", "--perfscope-fail", "tpot.p50:500%")
    assert lenient.ret == 0  # only tpot.p50 gates, and it may grow 5x
    lenient.stdout.fnmatch_lines(["*ttft.p99*+*%*info*", "*tpot.p50*+*%*pass, ok*"])
    strict = suite.runpytest("--perfscope-compare", "base", "--perfscope-fail", "ttft.p99:20%")
    assert strict.ret == 1
    strict.stdout.fnmatch_lines(["*ttft.p99*REGRESSED*"])


def test_a_baseline_from_other_hardware_is_refused_unless_forced(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(test_perf=PERF_TEST)
    assert suite.runpytest("--perfscope-save", "base").ret == 0
    path = suite.path / ".perfscope" / "baselines" / "base.json"
    data = json.loads(path.read_text())
    data["machine"]["hardware_key"] = "gpu:h100-sxm x8"
    path.write_text(json.dumps(data))

    refused = suite.runpytest("--perfscope-compare", "base")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(
        ["*baseline 'base' was recorded on gpu:h100-sxm x8 but this machine is *--perfscope-force*"]
    )
    assert "collected" not in refused.stdout.str()  # refused before running anything

    # (a tolerance no noise reaches: this test is about the hardware check, not the gate)
    forced = suite.runpytest(
        "--perfscope-compare", "base", "--perfscope-force", "--perfscope-fail", "*:1000%"
    )
    assert forced.ret == 0
    forced.stdout.fnmatch_lines(["*warning (forced): baseline 'base' was recorded on gpu:h100*"])


def test_option_errors_are_usage_errors(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_perf=PERF_TEST)
    missing = suite.runpytest("--perfscope-compare", "nothing-saved")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["*no perfscope baseline at *nothing-saved.json*"])
    alone = suite.runpytest("--perfscope-fail", "ttft.p99:10%")
    assert alone.ret == pytest.ExitCode.USAGE_ERROR
    alone.stderr.fnmatch_lines(["*--perfscope-fail needs --perfscope-compare*"])
    bad = suite.runpytest("--perfscope-compare", "x", "--perfscope-fail", "ttft.p99")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--perfscope-fail: cannot read 'ttft.p99': write METRIC:TOL*"])


def test_repeats_manual_runs_and_the_noise_helper(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_perf="""
        import pytest
        import fake_engine

        def test_repeats_and_noise(perfscope, monkeypatch):
            monkeypatch.setenv("FAKE_DELAY_MS", "2")
            fast = perfscope.run(fake_engine.generate, requests=3, output_len=4, warmup=0,
                                 repeat=5, name="fast")
            monkeypatch.setenv("FAKE_DELAY_MS", "8")
            slow = perfscope.run(fake_engine.generate, requests=3, output_len=4, warmup=0,
                                 repeat=5, name="slow")
            assert len(fast) == 5 and len(set(fast.paths)) == 5
            assert perfscope.expect(fast, stat="bound").tpot.p50 < "50ms"
            perfscope.assert_no_regression(slow, fast, "tpot.p50")
            with pytest.raises(AssertionError, match="regressed beyond the noise"):
                perfscope.assert_no_regression(fast, slow, "tpot.p50", tolerance="10%")

        def test_default_repeat_from_the_command_line(perfscope):
            runs = perfscope.run(fake_engine.generate, requests=2, output_len=2, warmup=0)
            assert len(runs) == 2

        def test_manual_instrumentation(perfscope):
            with perfscope.profile("by-hand") as p:
                for _ in range(2):
                    with p.request(prompt_tokens=8) as r:
                        r.tokens(1)
                        r.tokens(2)
            assert p.run.path.parent == perfscope.runs_dir
            perfscope.check(p.run, "counts.output_tokens == 6", "ttft.p99 < 1s")
        """
    )
    result = suite.runpytest("--perfscope-repeat", "2", "--perfscope-runs-dir", "kept")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines_random(
        ["*test_repeats_and_noise#slow*", "*test_manual_instrumentation*passed*"]
    )
    # 5 + 5 + 2 runs of the engine and one by hand, all kept where asked
    assert len(list((suite.path / "kept").iterdir())) == 13


def test_the_plugin_is_silent_and_inert_when_unused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    assert 1 + 1 == 2\n")
    # (the rewrite warning only comes from running pytest inside pytest)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"
    )
    result.assert_outcomes(passed=1)
    # pytest's own header names the plugin and the folders (a clone may sit in a folder
    # named perfscope); nothing else may mention it
    header = ("plugins:", "rootdir:", "configfile:", "cachedir:", "platform ")
    # Third-party warnings print their paths, which pass through the clone's folder: take
    # the clone's own path out before looking for the name.
    clone = (str(ROOT), os.path.relpath(ROOT, pytester.path))
    lines = [ln.replace(clone[0], "<clone>").replace(clone[1], "<clone>") for ln in result.outlines]
    mentions = [ln for ln in lines if "perfscope" in ln]
    assert [ln for ln in mentions if not ln.startswith(header)] == []
    assert sorted(p.name for p in pytester.path.iterdir()) == [
        "test_the_plugin_is_silent_and_inert_when_unused.py"
    ]


def test_the_plugin_loads_through_its_entry_point_only(pytester: pytest.Pytester) -> None:
    plugins = {e.name: e.value for e in entry_points(group="pytest11")}
    assert plugins.get("perfscope") == "perfscope.pytest_plugin"
    helped = pytester.runpytest("--help")
    helped.stdout.fnmatch_lines(
        ["perfscope: performance assertions and regression gates:", "*--perfscope-save=NAME*"]
    )
    blocked = pytester.runpytest("-p", "no:perfscope", "--perfscope-save", "x")
    assert blocked.ret == pytest.ExitCode.USAGE_ERROR
    blocked.stderr.fnmatch_lines(["*unrecognized arguments: --perfscope-save*"])


def test_importing_the_plugin_loads_neither_torch_nor_pandas() -> None:
    code = (
        "import sys, perfscope.pytest_plugin; "
        "print(sorted(m for m in ('torch', 'pandas', 'pyarrow', 'rich') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.slow  # about 15 s on a quiet 2-core machine
def test_the_sample_suite_is_green_and_fails_with_a_table_on_a_slowdown(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = pytester.path / "baselines"
    monkeypatch.delenv("PERFSCOPE_SAMPLE_SLOWDOWN_MS", raising=False)
    green = pytester.runpytest(
        str(SAMPLES), "--perfscope-save", "main", f"--perfscope-storage={storage}"
    )
    outcomes = green.parseoutcomes()
    assert green.ret == 0, green.stdout.str()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 7
    assert (storage / "main.json").exists()

    monkeypatch.setenv("PERFSCOPE_SAMPLE_SLOWDOWN_MS", "3")  # +3 ms per forward pass
    slowed = pytester.runpytest(
        str(SAMPLES), "--perfscope-compare", "main", f"--perfscope-storage={storage}"
    )
    assert slowed.ret == 1
    slowed.stdout.fnmatch_lines(
        [
            "*perfscope: * perf test(s), * run(s) vs baseline 'main'*",
            "*perf test / metric*measured*limit*baseline*change*verdict*",
            "*tpot.p50*ms*ms*+*%*REGRESSED*",
            "*perfscope: * metric(s) of * run(s) regressed against baseline*",
        ]
    )
    assert "Traceback" not in slowed.stdout.str()


TWO_TESTS = """
import fake_engine


def test_{a}(perfscope):
    perfscope.run(fake_engine.generate, requests=2, output_len=3, warmup=0)


def test_{b}(perfscope):
    perfscope.run(fake_engine.generate, requests=2, output_len=3, warmup=0)
"""


@pytest.mark.slow  # about 5 s on a quiet 2-core machine
def test_under_xdist_slos_still_fail_and_baselines_are_refused_in_one_line(
    suite: pytest.Pytester,
) -> None:
    pytest.importorskip("xdist")
    suite.makepyfile(
        test_slo="""
        import pytest
        import fake_engine

        @pytest.mark.perfscope(slo={"tpot.p50": "1us"})
        def test_too_slow(perfscope):
            perfscope.run(fake_engine.generate, requests=2, output_len=3, warmup=0)
        """
    )
    ran = suite.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    ran.assert_outcomes(failed=1)
    ran.stdout.fnmatch_lines(["*marker SLOs: 1 of 1 checks failed*", "*FAIL*tpot.p50*"])
    refused = suite.runpytest_subprocess("-n", "2", "--perfscope-save", "base")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--perfscope-save cannot run under pytest-xdist (-n)*"])
    assert not (suite.path / ".perfscope").exists()


@pytest.mark.slow  # about 7 s on a quiet 2-core machine
def test_concurrent_saves_to_one_baseline_keep_every_test(suite: pytest.Pytester) -> None:
    for i in range(4):
        suite.makepyfile(**{f"test_part{i}": TWO_TESTS.format(a=f"a{i}", b=f"b{i}")})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(suite.path), str(ROOT)]))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"test_part{i}.py",
                "--perfscope-save",
                "shared",
            ],
            cwd=suite.path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, (out, err)
    data = json.loads((suite.path / ".perfscope" / "baselines" / "shared.json").read_text())
    assert len(data["tests"]) == 8, sorted(data["tests"])


def test_a_storage_path_given_as_two_words_is_refused_before_it_moves_rootdir(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(test_one=TWO_TESTS.format(a="a", b="b"))
    (suite.path / "elsewhere").mkdir()
    result = suite.runpytest("--perfscope-save", "x", "--perfscope-storage", "elsewhere")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*write --perfscope-storage=PATH (with '=')*"])


def test_a_gate_where_no_test_matched_says_so_and_fails_when_strict(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(test_one=TWO_TESTS.format(a="a", b="b"))
    assert suite.runpytest("--perfscope-save", "base").ret == 0
    (suite.path / "test_one.py").unlink()
    suite.makepyfile(test_two=TWO_TESTS.format(a="c", b="d"))
    loose = suite.runpytest("--perfscope-compare", "base")
    assert loose.ret == 0
    loose.stdout.fnmatch_lines(["*no test matched baseline 'base' (2 tests in it*"])
    strict = suite.runpytest("--perfscope-compare", "base", "--perfscope-strict")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    strict.stdout.fnmatch_lines(["*no test matched baseline*--perfscope-strict: failing*"])


def test_a_bare_distribution_in_a_marker_slo_names_its_percentiles(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        test_slo="""
        import pytest
        import fake_engine

        @pytest.mark.perfscope(slo={"tpot": "20ms"})
        def test_bare(perfscope):
            perfscope.run(fake_engine.generate, requests=2, output_len=3, warmup=0)
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*'tpot' is a distribution*tpot.p50 or tpot.p99*"])
