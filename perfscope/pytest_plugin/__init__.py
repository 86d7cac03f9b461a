"""perfscope's pytest plugin: performance assertions and regression gates for inference.

Registered through the ``pytest11`` entry point, so it is active wherever perfscope is
installed (``-p no:perfscope`` turns it off). Unused, it costs nothing: importing it loads
no torch or pandas, and a session that does not use the fixture or marker prints nothing
and writes nothing.

::

    def test_decode_is_fast(perfscope):
        run = perfscope.run("reference", model_preset="tiny", requests=16, repeat=3)
        perfscope.expect(run).ttft.p99 < "200ms"
        perfscope.check(run, "tpot.p50 < 20ms", "throughput.output_tok_s > 200 tok/s")

    @pytest.mark.perfscope(slo={"ttft.p99": "200ms", "goodput.attainment": "95%"})
    def test_slos(perfscope):
        perfscope.run(my_generate, requests=32, slos={"ttft": "200ms"})

Options (group "perfscope"): ``--perfscope-save NAME`` stores each perf test's key
metrics with the machine and commit; ``--perfscope-compare NAME`` fails tests whose
metrics regressed beyond ``--perfscope-fail METRIC:TOL`` (default: every metric at 10%);
``--perfscope-force`` compares across hardware; ``--perfscope-strict`` fails a gate where
no test matched the baseline; ``--perfscope-json PATH`` writes a report
for CI; ``--perfscope-runs-dir DIR`` keeps the runs; ``--perfscope-repeat N`` repeats every
workload that does not say otherwise.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from perfscope.checks.expect import observing
from perfscope.pytest_plugin._fixture import PerfscopeFixture, perfscope
from perfscope.pytest_plugin._report import save_baseline, write_json_report
from perfscope.pytest_plugin._state import (
    KEY_METRICS,
    MARK,
    STATE,
    SessionState,
    finish_test,
    marker_options,
    observer_for,
    state_of,
)
from perfscope.pytest_plugin._table import write_terminal_summary

if TYPE_CHECKING:
    from perfscope.pytest_plugin._baseline import Tolerance

__all__ = ["KEY_METRICS", "PerfscopeFixture", "perfscope"]

_MARKER_HELP = (
    "perfscope(*assertions, slo=None, repeat=None, stat='median', confidence=0.95, "
    "tolerance=None): performance SLOs checked on every run the test makes through the "
    "perfscope fixture, e.g. slo={'ttft.p99': '200ms', 'goodput.attainment': '95%'}; "
    "tolerance={'ttft.p99': '20%'} sets this test's regression tolerances"
)


# --------------------------------------------------------------------------- options


def _fail_option(text: str) -> Tolerance:
    from perfscope.errors import SLOError
    from perfscope.pytest_plugin._baseline import parse_fail_option

    try:
        return parse_fail_option(text)
    except SLOError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    """``--perfscope-*`` counts: a whole number of at least 1. (Kept here rather than taken
    from ``perfscope.cli``: importing that package loads rich, and the plugin loads in every
    pytest session.)"""
    import argparse

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perfscope", "perfscope: performance assertions and regression gates")
    group.addoption(
        "--perfscope-save",
        metavar="NAME",
        default=None,
        help="store each perf test's key metrics, machine and commit as baseline NAME",
    )
    group.addoption(
        "--perfscope-compare",
        metavar="NAME",
        default=None,
        help="fail perf tests whose metrics regressed against baseline NAME",
    )
    group.addoption(
        "--perfscope-fail",
        metavar="METRIC:TOL",
        action="append",
        default=[],
        type=_fail_option,
        help="regression tolerance, e.g. ttft.p99:10%% or throughput.output_tok_s:5%% or "
        "*:15%% (repeatable; default: every metric at 10%%)",
    )
    group.addoption(
        "--perfscope-force",
        action="store_true",
        default=False,
        help="compare against a baseline recorded on other hardware",
    )
    group.addoption(
        "--perfscope-storage",
        metavar="DIR",
        default=None,
        help="folder of saved baselines (default: <rootdir>/.perfscope/baselines)",
    )
    group.addoption(
        "--perfscope-json",
        metavar="PATH",
        default=None,
        help="write every perf test's metrics, assertions and verdicts as JSON for CI",
    )
    group.addoption(
        "--perfscope-runs-dir",
        metavar="DIR",
        default=None,
        help="keep the runs of perf tests here (default: pytest's temporary folder)",
    )
    group.addoption(
        "--perfscope-repeat",
        metavar="N",
        type=_positive_int,
        default=None,
        help="repeat each workload N times unless the test says otherwise",
    )
    group.addoption(
        "--perfscope-strict",
        action="store_true",
        default=False,
        help="fail the session when --perfscope-compare gated nothing (no test matched)",
    )
    parser.addini("perfscope_storage", "folder of saved perfscope baselines", default="")


# --------------------------------------------------------------------------- hooks


_SESSION_OPTIONS = ("perfscope_save", "perfscope_compare", "perfscope_json")


def _xdist_active(config: pytest.Config) -> bool:
    """Whether this controller will hand tests to pytest-xdist workers."""
    n = getattr(config.option, "numprocesses", None)
    dist = getattr(config.option, "dist", "no")
    return bool(n) or (dist not in (None, "no"))


def _refuse_separate_storage(config: pytest.Config) -> None:
    """``--perfscope-storage PATH`` as two words: pytest reads PATH as a test path before
    this plugin's options are known, which moves rootdir and so every test id."""
    args = list(config.invocation_params.args)
    if "--perfscope-storage" in args:
        raise pytest.UsageError(
            "perfscope: write --perfscope-storage=PATH (with '='): as two words pytest "
            "takes PATH for a test path and moves rootdir, so no test would match its baseline"
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)
    _refuse_separate_storage(config)
    worker = hasattr(config, "workerinput")
    if not worker and _xdist_active(config):
        used = [o for o in _SESSION_OPTIONS if getattr(config.option, o, None)]
        if used:
            names = ", ".join("--" + o.replace("_", "-") for o in used)
            raise pytest.UsageError(
                f"perfscope: {names} cannot run under pytest-xdist (-n): run the perf tests "
                "in one process (-n 0 or -p no:xdist)"
            )
    state = SessionState(config)
    if worker:
        # Marker SLOs and checks fail the test in the worker; baselines and the JSON
        # report are session-wide and refused above.
        state.save = state.compare = None
        state.json_path = None
        config.stash[STATE] = state
        return
    config.stash[STATE] = state
    state.setup()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("perfscope") is None:
        return
    from perfscope.errors import UsageError

    try:
        item.stash[MARK] = marker_options(item)
    except UsageError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    # perfscope.expect/check report to this test while its body runs.
    with observing(observer_for(item)):
        try:
            result = yield
        except BaseException:
            finish_test(item, body_passed=False)
            raise
    problems = finish_test(item, body_passed=True)
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    state = state_of(item.config)
    rec = state.records.get(item.nodeid) if state is not None else None
    if rec is not None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            rec.outcome = report.outcome
        elif report.when == "teardown" and report.failed:
            rec.outcome = "error"
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = state_of(session.config)
    if state is None:
        return
    if hasattr(session.config, "workerinput"):
        return
    if state.regressions() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    missing = state.no_match()
    if missing:
        state.notes.append(missing + (" (--perfscope-strict: failing)" if state.strict else ""))
        if state.strict and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if state.save:
        save_baseline(state)
    write_json_report(state, int(session.exitstatus))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = state_of(config)
    if state is not None and not hasattr(config, "workerinput"):
        width = config.get_terminal_writer().fullwidth
        write_terminal_summary(terminalreporter, state, width)
