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
``--perfscope-force`` compares across hardware; ``--perfscope-json PATH`` writes a report
for CI; ``--perfscope-runs-dir DIR`` keeps the runs; ``--perfscope-repeat N`` repeats every
workload that does not say otherwise.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from perfscope._argtypes import positive_int

if TYPE_CHECKING:
    from perfscope._baseline import MetricComparison, Tolerance
    from perfscope._expect import Assertion, Change, Outcome
    from perfscope._manual import Profile
    from perfscope.profiler.engines.base import Engine, EngineOptions

__all__ = ["KEY_METRICS", "PerfscopeFixture", "perfscope"]

#: Metrics recorded for every run a perf test makes (when the run has them), besides the
#: ones the test asserts on. ``goodput.attainment`` only when the run has SLOs.
KEY_METRICS = (
    "ttft.p50",
    "ttft.p99",
    "tpot.p50",
    "tpot.p99",
    "throughput.output_tok_s",
    "goodput.attainment",
    "decode.mbu",
    "prefill.mfu",
    "energy.j_per_output_token",
)
REPORT_SCHEMA = "perfscope.pytest/1"
_MARKER_KWARGS = ("slo", "repeat", "stat", "confidence", "tolerance")
_MARKER_HELP = (
    "perfscope(*assertions, slo=None, repeat=None, stat='median', confidence=0.95, "
    "tolerance=None): performance SLOs checked on every run the test makes through the "
    "perfscope fixture, e.g. slo={'ttft.p99': '200ms', 'goodput.attainment': '95%'}; "
    "tolerance={'ttft.p99': '20%'} sets this test's regression tolerances"
)

#: The test being run (set around each test call); the assertions report to it.
_CURRENT_ITEM: pytest.Item | None = None
#: Sessions in this process, innermost last (pytester runs sessions inside sessions).
_STATES: list[_SessionState] = []


# --------------------------------------------------------------------------- options


def _fail_option(text: str) -> Tolerance:
    from perfscope._baseline import parse_fail_option
    from perfscope.errors import SLOError

    try:
        return parse_fail_option(text)
    except SLOError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
        type=positive_int,
        default=None,
        help="repeat each workload N times unless the test says otherwise",
    )
    parser.addini("perfscope_storage", "folder of saved perfscope baselines", default="")


# --------------------------------------------------------------------------- state


@dataclass
class _Measurement:
    """A run (or RunSet) a perf test made or asserted on."""

    key: str
    label: str
    target: Any
    run_dirs: list[str]
    asserted: list[str] = field(default_factory=list)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _MarkerOptions:
    assertions: list[Assertion] = field(default_factory=list)
    repeat: int | None = None
    stat: str = "median"
    confidence: float = 0.95
    tolerances: list[Tolerance] = field(default_factory=list)
    marked: bool = False


@dataclass
class _TestRecord:
    nodeid: str
    outcome: str = "passed"
    measurements: list[_Measurement] = field(default_factory=list)
    outcomes: list[tuple[_Measurement, Outcome, str]] = field(default_factory=list)
    comparisons: list[MetricComparison] = field(default_factory=list)

    def add(self, target: Any, label: str | None = None) -> _Measurement:
        from perfscope._expect import _run_dirs

        dirs = _run_dirs(target)
        for m in self.measurements:
            if m.target is target or (dirs and m.run_dirs == dirs):
                return m
        index = len(self.measurements)
        tag = label or ("" if index == 0 else str(index + 1))
        key = self.nodeid if index == 0 else f"{self.nodeid}#{tag}"
        taken = {m.key for m in self.measurements}
        n = index + 1
        while key in taken:
            n += 1
            key = f"{self.nodeid}#{tag or ''}{n}"
        m = _Measurement(key=key, label=tag, target=target, run_dirs=dirs)
        self.measurements.append(m)
        return m


class _SessionState:
    """Options, the loaded baseline and every perf test's record, for one session."""

    def __init__(self, config: pytest.Config) -> None:
        opt = config.option
        self.config = config
        self.save: str | None = opt.perfscope_save
        self.compare: str | None = opt.perfscope_compare
        self.fail: list[Tolerance] = list(opt.perfscope_fail or [])
        self.force: bool = bool(opt.perfscope_force)
        self.json_path: Path | None = Path(opt.perfscope_json) if opt.perfscope_json else None
        self.runs_dir: Path | None = (
            Path(opt.perfscope_runs_dir).resolve() if opt.perfscope_runs_dir else None
        )
        self.repeat: int | None = opt.perfscope_repeat
        # --perfscope-storage is relative to the current folder, the ini value to rootdir.
        root = Path(config.rootpath)
        ini = str(config.getini("perfscope_storage") or "")
        if opt.perfscope_storage:
            self.storage = Path(opt.perfscope_storage)
        else:
            self.storage = root / ini if ini else root / ".perfscope" / "baselines"
        self.records: dict[str, _TestRecord] = {}
        self.baseline: dict[str, Any] | None = None
        self.baseline_file: Path | None = None
        self.mismatch: str | None = None
        self._machine: dict[str, Any] | None = None
        self.notes: list[str] = []

    def machine(self) -> dict[str, Any]:
        if self._machine is None:
            from perfscope._baseline import machine_info

            self._machine = machine_info()
        return self._machine

    def setup(self) -> None:
        """Validate option combinations and load the baseline (before any test runs)."""
        if self.fail and not self.compare:
            raise pytest.UsageError(
                "--perfscope-fail needs --perfscope-compare NAME (the baseline to compare with)"
            )
        if not self.compare:
            return
        from perfscope._baseline import baseline_path, hardware_mismatch, load_baseline
        from perfscope.errors import UsageError

        try:
            self.baseline_file = baseline_path(self.storage, self.compare)
            self.baseline = load_baseline(self.baseline_file)
        except UsageError as exc:
            raise pytest.UsageError(f"perfscope: {exc}") from None
        self.mismatch = hardware_mismatch(self.baseline, self.machine())
        if self.mismatch and not self.force:
            raise pytest.UsageError(f"perfscope: {self.mismatch}")

    def record_for(self, item: pytest.Item) -> _TestRecord:
        rec = self.records.get(item.nodeid)
        if rec is None:
            rec = self.records[item.nodeid] = _TestRecord(item.nodeid)
        return rec

    def perf_records(self) -> list[_TestRecord]:
        return [r for r in self.records.values() if r.measurements or r.outcomes]

    def regressions(self) -> list[MetricComparison]:
        return [c for r in self.records.values() for c in r.comparisons if c.regressed]


_STATE = pytest.StashKey[_SessionState]()
_MARK = pytest.StashKey[_MarkerOptions]()


def _state(config: pytest.Config) -> _SessionState | None:
    return config.stash.get(_STATE, None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)
    if hasattr(config, "workerinput"):  # pytest-xdist worker: the controller reports
        return
    state = _SessionState(config)
    config.stash[_STATE] = state
    _STATES.append(state)
    state.setup()


def _observe(target: Any, outcomes: Sequence[Outcome]) -> None:
    """Called by ``perfscope.expect``/``check``: record the assertion on the running test."""
    item = _CURRENT_ITEM
    # Only perf tests (those using the fixture or the marker) are recorded: a plain test
    # that calls perfscope.expect asserts, but stays out of the table and baselines.
    if item is None or not _is_perf_test(item):
        return
    state = _state(item.config)
    if state is None:
        return
    rec = state.record_for(item)
    m = rec.add(target)
    for o in outcomes:
        if o.metric not in m.asserted:
            m.asserted.append(o.metric)
        rec.outcomes.append((m, o, "assert"))


def _is_perf_test(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "perfscope" in names or item.get_closest_marker("perfscope") is not None


# --------------------------------------------------------------------------- marker


def _marker_options(item: pytest.Item) -> _MarkerOptions:
    from perfscope._baseline import parse_fail_option
    from perfscope._expect import parse_assertions
    from perfscope.errors import SLOError, UsageError

    marker = item.get_closest_marker("perfscope")
    if marker is None:
        return _MarkerOptions()
    unknown = sorted(set(marker.kwargs) - set(_MARKER_KWARGS))
    if unknown:
        raise UsageError(
            f"@pytest.mark.perfscope got unknown argument(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(_MARKER_KWARGS)}"
        )
    kw = marker.kwargs
    try:
        assertions = parse_assertions(*marker.args, *([kw["slo"]] if kw.get("slo") else []))
        tolerance = kw.get("tolerance") or {}
        if not isinstance(tolerance, Mapping):
            raise UsageError("tolerance= takes a dict such as {'ttft.p99': '20%'}")
        tolerances = [parse_fail_option(f"{k}:{v}") for k, v in tolerance.items()]
    except SLOError as exc:
        raise UsageError(f"@pytest.mark.perfscope: {exc}") from None
    repeat = kw.get("repeat")
    if repeat is not None and (not isinstance(repeat, int) or repeat < 1):
        raise UsageError(
            f"@pytest.mark.perfscope: repeat must be a whole number >= 1, got {repeat!r}"
        )
    stat = kw.get("stat", "median")
    if stat not in ("median", "mean", "bound"):
        raise UsageError(
            f"@pytest.mark.perfscope: stat must be median, mean or bound, not {stat!r}"
        )
    confidence = float(kw.get("confidence", 0.95))
    if not 0.5 < confidence < 1:
        raise UsageError(
            f"@pytest.mark.perfscope: confidence must be in (0.5, 1), got {confidence}"
        )
    return _MarkerOptions(assertions, repeat, stat, confidence, tolerances, marked=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("perfscope") is None:
        return
    from perfscope.errors import UsageError

    try:
        item.stash[_MARK] = _marker_options(item)
    except UsageError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    global _CURRENT_ITEM
    previous, _CURRENT_ITEM = _CURRENT_ITEM, item
    try:
        try:
            result = yield
        except BaseException:
            _finish_test(item, body_passed=False)
            raise
        problems = _finish_test(item, body_passed=True)
        if problems:
            pytest.fail("\n\n".join(problems), pytrace=False)
        return result
    finally:
        _CURRENT_ITEM = previous


def _finish_test(item: pytest.Item, *, body_passed: bool) -> list[str]:
    """After a test body: marker SLOs, key metrics and the baseline comparison."""
    state = _state(item.config)
    opts = item.stash.get(_MARK, None)
    if state is None or (item.nodeid not in state.records and opts is None):
        return []
    rec = state.record_for(item)
    problems: list[str] = []
    if opts is not None and opts.marked and opts.assertions and body_passed:
        problems += _check_marker_slos(rec, opts)
    for m in rec.measurements:
        m.metrics = _metrics_of(m.target, m.asserted)
    if state.baseline is not None:
        problems += _compare_with_baseline(state, rec, opts)
    if problems:
        from perfscope._baseline import contention_lines

        extra = [ln for m in rec.measurements for ln in contention_lines(m.run_dirs)]
        if extra:
            problems.append("perfscope: " + "\n  ".join(["measured under contention:", *extra]))
    return problems


def _check_marker_slos(rec: _TestRecord, opts: _MarkerOptions) -> list[str]:
    from perfscope._expect import _failure_message, evaluate

    if not rec.measurements:
        return [
            "perfscope: the test is marked with SLOs but made no run: run the workload with "
            "the perfscope fixture (perfscope.run(...) or perfscope.profile(...))"
        ]
    problems = []
    for m in rec.measurements:
        outs = [
            evaluate(m.target, a, stat=opts.stat, confidence=opts.confidence)
            for a in opts.assertions
        ]
        for o in outs:
            if o.metric not in m.asserted:
                m.asserted.append(o.metric)
            rec.outcomes.append((m, o, "marker"))
        if not all(o.passed for o in outs):
            text = _failure_message(outs, single=False).replace(
                "perfscope:", "perfscope: marker SLOs:", 1
            )
            problems.append(text)
    return problems


def _compare_with_baseline(
    state: _SessionState, rec: _TestRecord, opts: _MarkerOptions | None
) -> list[str]:
    from perfscope._baseline import compare_metrics

    assert state.baseline is not None
    tests = state.baseline.get("tests") or {}
    tolerances = [*state.fail, *(opts.tolerances if opts else [])]
    problems = []
    for m in rec.measurements:
        base = (tests.get(m.key) or {}).get("metrics")
        comps = compare_metrics(m.key, m.metrics, base, tolerances, gate_all=not state.fail)
        rec.comparisons.extend(comps)
        bad = [c for c in comps if c.regressed]
        if bad:
            commit = (state.baseline.get("commit") or {}).get("id") or "no commit"
            lines = [
                f"perfscope: performance regressed against baseline {state.compare!r} "
                f"(commit {str(commit)[:10]}):"
            ]
            lines += [f"  {c.describe()}" for c in bad]
            lines.append("  runs: " + ", ".join(m.run_dirs))
            problems.append("\n".join(lines))
    return problems


def _metrics_of(target: Any, asserted: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The key metrics and asserted metrics of a run: value (median), samples, kind."""
    from perfscope._expect import (
        MetricNotFoundError,
        _runs_of,
        _summary_of,
        direction,
        metric_kind,
        resolve_metric,
    )
    from perfscope.errors import SLOError

    try:
        summary = _summary_of(target)
    except TypeError:
        return {}
    has_slos = bool((summary.get("goodput") or {}).get("slos"))
    out: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for name in [*KEY_METRICS, *asserted]:
        if name == "goodput.attainment" and not has_slos and name not in asserted:
            continue
        samples: list[float] = []
        path = None
        try:
            for run in _runs_of(target):
                path, raw = resolve_metric(_summary_of(run), name)
                if isinstance(raw, int | float) and not isinstance(raw, bool):
                    samples.append(float(raw))
        except (MetricNotFoundError, SLOError, TypeError):
            continue
        if path is None or not samples or path in seen:
            continue
        seen.add(path)
        out[name] = {
            "path": path,
            "value": float(statistics.median(samples)),
            "samples": samples,
            "kind": metric_kind(path),
            "direction": direction(path),
        }
    return out


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    state = _STATES[-1] if _STATES else None
    rec = state.records.get(report.nodeid) if state is not None else None
    if rec is None:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        rec.outcome = report.outcome
    elif report.when == "teardown" and report.failed:
        rec.outcome = "error"


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _state(config)
    if state is not None and state in _STATES:
        _STATES.remove(state)


# --------------------------------------------------------------------------- fixture


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "test"


class PerfscopeFixture:
    """What the ``perfscope`` fixture gives a test: run workloads, assert on them.

    Every run made here is stored under the test's runs folder, recorded for the
    session's summary table, baselines and JSON report, and checked against the test's
    ``@pytest.mark.perfscope`` SLOs when the test body ends.
    """

    def __init__(
        self,
        item: pytest.Item,
        state: _SessionState | None,
        options: _MarkerOptions,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> None:
        self._item = item
        self._state = state
        self._options = options
        self._tmp = tmp_path_factory
        self._runs_dir: Path | None = None
        self._record = state.record_for(item) if state else _TestRecord(item.nodeid)

    @property
    def runs_dir(self) -> Path:
        """Where this test's runs are stored."""
        if self._runs_dir is None:
            if self._state is not None and self._state.runs_dir is not None:
                self._runs_dir = self._state.runs_dir
            else:
                self._runs_dir = self._tmp.mktemp(f"perfscope-{_slug(self._item.name)}")
        return self._runs_dir

    @property
    def runs(self) -> list[Any]:
        """Every Run/RunSet this test has made or asserted on, in order."""
        return [m.target for m in self._record.measurements]

    def run(
        self,
        engine: Any = "reference",
        *,
        requests: int = 16,
        prompt_len: int | str = 64,
        output_len: int | str = 16,
        warmup: int = 1,
        mode: str | None = None,
        rate: float | None = None,
        concurrency: int | None = None,
        batch_size: int = 8,
        scheduler: str = "continuous",
        model_preset: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        seed: int = 0,
        slos: Mapping[str, str | float] | None = None,
        repeat: int | None = None,
        name: str | None = None,
        hw: str | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run a workload on ``engine`` and return the analysed :class:`perfscope.Run`
        (a :class:`perfscope._expect.RunSet` of the repeats when ``repeat > 1``).

        Args:
            engine: an engine URI (``"reference"``, ``"python:mod:fn"``, ``"openai:URL"``),
                a Python callable that yields tokens (see the ``python:`` engine), or an
                object implementing the Engine protocol.
            requests, prompt_len, output_len, warmup, seed: the workload (lengths as
                ``128`` or ``"uniform:64:256"``); warmup requests are not measured.
            mode, rate, concurrency: arrivals; ``rate`` or ``concurrency`` implies online.
            batch_size, scheduler, model_preset, device, dtype: engine options
                (``model_preset="tiny"`` keeps the reference model fast).
            slos: per-request limits for goodput, ``{"ttft": "200ms", "tpot": 0.05}``.
            repeat: run the workload N times (default: the marker's, then
                ``--perfscope-repeat``, then 1).
            name: short name of the run (its id and the baseline key of the second and
                later runs of a test).
            hw: device to analyse against (default: detect).
            engine_options: further ``EngineOptions`` fields or engine-specific options.
        """
        from perfscope._expect import RunSet
        from perfscope._run import load_run
        from perfscope._runner import RunOptions, execute_run
        from perfscope.analysis.slo import parse_duration
        from perfscope.errors import EngineError, UsageError
        from perfscope.profiler.driver import LoadConfig
        from perfscope.profiler.workload import WorkloadConfig, parse_length

        n = repeat or self._options.repeat or (self._state.repeat if self._state else None) or 1
        if n < 1:
            raise UsageError(f"repeat must be at least 1, got {n}")
        if mode is None:
            mode = "online" if (rate is not None or concurrency is not None) else "batch"
        workload = WorkloadConfig(
            requests=requests,
            prompt_len=parse_length(prompt_len, "prompt_len"),
            output_len=parse_length(output_len, "output_len"),
            warmup=warmup,
            seed=seed,
        )
        load = LoadConfig(mode=mode, rate=rate, concurrency=concurrency, seed=seed)
        slo_s = {
            str(k): (parse_duration(v) if isinstance(v, str) else float(v))
            for k, v in (slos or {}).items()
        }
        eopts = self._engine_options(
            batch_size, scheduler, model_preset, device, dtype, seed, engine_options
        )
        uri, factory = _engine_factory(engine)
        if n > 1 and not isinstance(engine, str) and not callable(engine):
            raise UsageError(
                "an Engine object serves one run (it is closed afterwards); for repeat > 1 "
                "pass an engine URI or a callable"
            )
        runs = []
        for _ in range(n):
            opts = RunOptions(
                engine=uri,
                workload=workload,
                load=load,
                engine_options=eopts,
                slos=slo_s,
                runs_dir=self.runs_dir,
                name=name,
                hw=hw,
                command=["pytest", self._item.nodeid],
            )
            outcome = execute_run(opts, engine_factory=factory) if factory else execute_run(opts)
            if outcome.status != "complete":
                raise EngineError(
                    f"the run on {uri} {outcome.status}: {outcome.error} (run: {outcome.path})"
                )
            runs.append(load_run(outcome.path))
        target = runs[0] if n == 1 else RunSet(runs)
        self._record.add(target, name)
        return target

    @staticmethod
    def _engine_options(
        batch_size: int,
        scheduler: str,
        model_preset: str | None,
        device: str | None,
        dtype: str | None,
        seed: int,
        extra: Mapping[str, Any] | None,
    ) -> EngineOptions:
        from dataclasses import fields

        from perfscope.profiler.engines.base import EngineOptions

        known = {f.name for f in fields(EngineOptions)}
        given: dict[str, Any] = {
            "batch_size": batch_size,
            "scheduler": scheduler,
            "model_preset": model_preset,
            "device": device,
            "dtype": dtype,
            "seed": seed,
        }
        rest: dict[str, str] = {}
        for key, value in (extra or {}).items():
            if key in known:
                given[key] = value
            else:
                rest[key] = str(value)
        if rest:
            given["extra"] = {**given.get("extra", {}), **rest}
        return EngineOptions(**given)

    @contextmanager
    def profile(self, name: str = "manual", **kwargs: Any) -> Iterator[Profile]:
        """Record a run by hand (``perfscope.profile``) into this test's runs folder::

        with perfscope.profile("my-engine") as p:
            with p.request(prompt_tokens=16) as r:
                r.tokens(1)
        run = p.run
        """
        from perfscope._manual import profile

        p = profile(name=name, runs_dir=kwargs.pop("runs_dir", None) or self.runs_dir, **kwargs)
        with p:
            yield p
        self._record.add(p.run, name)

    def record(self, run: Any, name: str | None = None) -> Any:
        """Record a run made elsewhere (``perfscope.load_run``, a module-scoped fixture) as
        one of this test's measurements; returns it."""
        self._record.add(run, name)
        return run

    def expect(self, run: Any, *, stat: str | None = None, confidence: float | None = None) -> Any:
        """``perfscope.expect(run).ttft.p99 < "200ms"`` (see :func:`perfscope.expect`)."""
        from perfscope._expect import expect

        return expect(
            run,
            stat=stat or self._options.stat,
            confidence=confidence or self._options.confidence,
        )

    def check(
        self,
        run: Any,
        *assertions: Any,
        stat: str | None = None,
        confidence: float | None = None,
    ) -> list[Outcome]:
        """``perfscope.check(run, "ttft.p99 < 200ms", ...)`` (see :func:`perfscope.check`)."""
        from perfscope._expect import check

        __tracebackhide__ = True
        return check(
            run,
            *assertions,
            stat=stat or self._options.stat,
            confidence=confidence or self._options.confidence,
        )

    def compare(
        self, before: Any, after: Any, metric: str, *, tolerance: str | float = "0%"
    ) -> Change:
        """How ``metric`` moved from ``before`` to ``after``, judged against the noise."""
        from perfscope._expect import compare_runs

        return compare_runs(
            before, after, metric, tolerance=tolerance, confidence=self._options.confidence
        )

    def assert_no_regression(
        self, before: Any, after: Any, *metrics: str, tolerance: str | float = "0%"
    ) -> list[Change]:
        """Fail only when a metric got worse by more than ``tolerance`` and the measured
        noise (both sides need ``repeat >= 2``)."""
        from perfscope._expect import assert_no_regression

        __tracebackhide__ = True
        return assert_no_regression(
            before, after, *metrics, tolerance=tolerance, confidence=self._options.confidence
        )


def _engine_factory(
    engine: Any,
) -> tuple[str, Callable[[str, EngineOptions], Engine] | None]:
    from perfscope.profiler.engines.base import Engine

    if isinstance(engine, str):
        return engine, None
    if isinstance(engine, Engine):
        instance = engine
        return instance.info().uri, lambda uri, opts: instance
    if callable(engine):
        from perfscope.profiler.engines.python_callable import PythonCallableEngine

        fn = engine
        qual = getattr(fn, "__qualname__", type(fn).__name__)
        uri = f"python:{getattr(fn, '__module__', '?')}:{qual}"
        return uri, lambda uri_, opts: PythonCallableEngine(uri_, fn)
    raise TypeError(
        f"engine must be a URI string, a callable that yields tokens or an Engine, "
        f"not {type(engine).__name__}"
    )


@pytest.fixture
def perfscope(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> PerfscopeFixture:
    """Run workloads on engines and assert on their performance (see the module doc)."""
    item = request.node
    assert isinstance(item, pytest.Item)
    options = item.stash.get(_MARK, None) or _MarkerOptions()
    return PerfscopeFixture(item, _state(request.config), options, tmp_path_factory)


# --------------------------------------------------------------------------- end of session


def _report(state: _SessionState, exitstatus: int) -> dict[str, Any]:
    tests = []
    for rec in state.perf_records():
        tests.append(
            {
                "nodeid": rec.nodeid,
                "outcome": rec.outcome,
                "measurements": [
                    {
                        "key": m.key,
                        "label": m.label,
                        "run_dirs": m.run_dirs,
                        "metrics": m.metrics,
                        "assertions": [
                            o.to_dict() | {"source": src} for mm, o, src in rec.outcomes if mm is m
                        ],
                        "comparisons": [c.to_dict() for c in rec.comparisons if c.key == m.key],
                    }
                    for m in rec.measurements
                ],
            }
        )
    failed_assertions = sum(
        1 for r in state.records.values() for _, o, _ in r.outcomes if not o.passed
    )
    regressions = state.regressions()
    baseline = None
    if state.baseline is not None:
        baseline = {
            "name": state.compare,
            "path": str(state.baseline_file),
            "created_at": state.baseline.get("created_at"),
            "machine": state.baseline.get("machine"),
            "commit": state.baseline.get("commit"),
            "forced": bool(state.mismatch),
        }
    from perfscope._baseline import commit_info

    return {
        "schema": REPORT_SCHEMA,
        "created_at": datetime.now(UTC).isoformat(),
        "passed": exitstatus == 0 and not regressions and not failed_assertions,
        "exit_status": int(exitstatus),
        "failed_assertions": failed_assertions,
        "regressions": len(regressions),
        "machine": state.machine(),
        "commit": commit_info(Path(state.config.rootpath)),
        "baseline": baseline,
        "tests": tests,
    }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = _state(session.config)
    if state is None:
        return
    if state.regressions() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if state.save:
        _save(state)
    if state.json_path is not None:
        report = _report(state, int(session.exitstatus))
        state.json_path.parent.mkdir(parents=True, exist_ok=True)
        state.json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        state.notes.append(f"JSON report written to {state.json_path}")


def _save(state: _SessionState) -> None:
    from perfscope._baseline import baseline_path, commit_info, save_baseline
    from perfscope.errors import UsageError

    assert state.save is not None
    tests: dict[str, dict[str, Any]] = {}
    for rec in state.perf_records():
        for m in rec.measurements:
            if m.metrics:
                tests[m.key] = {
                    "nodeid": rec.nodeid,
                    "label": m.label,
                    "outcome": rec.outcome,
                    "run_dirs": m.run_dirs,
                    "metrics": m.metrics,
                }
    if not tests:
        state.notes.append(f"baseline {state.save!r} not saved: no perf test made a run")
        return
    try:
        path = baseline_path(state.storage, state.save)
    except UsageError as exc:
        state.notes.append(f"baseline not saved: {exc}")
        return
    _, note = save_baseline(
        path,
        name=state.save,
        machine=state.machine(),
        commit=commit_info(Path(state.config.rootpath)),
        tests=tests,
    )
    state.notes.append(f"baseline {state.save!r} {note}: {len(tests)} measurement(s) in {path}")


def _short(nodeid: str) -> str:
    """``tests/test_x.py::test_y#label`` → ``test_y#label`` (the file is in pytest's output)."""
    return nodeid.split("::", 1)[-1]


def _table_text(state: _SessionState, width: int) -> str:
    """The summary table: one block per measured run, one row per metric."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from perfscope._expect import format_value, metric_kind

    compare = state.baseline is not None
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("perf test / metric", overflow="fold")
    table.add_column("measured", justify="right", no_wrap=True)
    table.add_column("limit", justify="right", no_wrap=True)
    if compare:
        table.add_column("baseline", justify="right", no_wrap=True)
        table.add_column("change", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    blank = [""] * (len(table.columns) - 1)
    for rec in state.perf_records():
        for m in rec.measurements:
            mine = [o for mm, o, _ in rec.outcomes if mm is m]
            names = list(m.metrics)
            names += [o.metric for o in mine if o.metric not in names]
            table.add_row(_short(m.key), *blank[:-1], rec.outcome if rec.outcome else "")
            for name in names:
                entry = m.metrics.get(name)
                kind = metric_kind(entry["path"] if entry else name)
                outs = [o for o in mine if o.metric == name]
                failed = [o for o in outs if not o.passed]
                shown = failed[0] if failed else (outs[-1] if outs else None)
                limit = ""
                if shown is not None:
                    limit = f"{shown.assertion.op} {format_value(shown.assertion.threshold, kind)}"
                value = entry["value"] if entry else (shown.measured if shown else None)
                verdicts = ["FAIL" if failed else "pass"] if outs else []
                cells = [f"  {name}", format_value(value, kind), limit]
                if compare:
                    comp = next(
                        (c for c in rec.comparisons if c.key == m.key and c.metric == name), None
                    )
                    base = comp.baseline if comp else None
                    change = comp.change if comp else None
                    cells += [
                        format_value(base, kind) if base is not None else "-",
                        f"{change * 100:+.1f}%" if change is not None else "-",
                    ]
                    if comp is not None:
                        verdicts.append(comp.verdict.upper() if comp.regressed else comp.verdict)
                cells.append(", ".join(verdicts))
                table.add_row(*cells)
    # A wide console: the table takes its natural width instead of folding metric names.
    console = Console(
        file=io.StringIO(), width=max(width, 200), color_system=None, force_terminal=False
    )
    console.print(table)
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = _state(config)
    if state is None:
        return
    records = state.perf_records()
    if not records and not state.notes:
        return
    tr = terminalreporter
    if records:
        n_runs = sum(len(m.run_dirs) for r in records for m in r.measurements)
        title = f"perfscope: {len(records)} perf test(s), {n_runs} run(s)"
        if state.baseline is not None:
            machine = (state.baseline.get("machine") or {}).get("hardware_key")
            commit = (state.baseline.get("commit") or {}).get("id")
            title += f" vs baseline {state.compare!r} ({machine}"
            title += f", commit {str(commit)[:10]})" if commit else ")"
        tr.section(title, sep="-")
        if state.mismatch:
            tr.write_line(f"warning (forced): {state.mismatch}", yellow=True)
        width = config.get_terminal_writer().fullwidth
        tr.write(_table_text(state, width))
    regressions = state.regressions()
    if regressions:
        by_key: dict[str, list[MetricComparison]] = {}
        for c in regressions:
            by_key.setdefault(c.key, []).append(c)
        tr.section(
            f"perfscope: {len(regressions)} metric(s) of {len(by_key)} run(s) regressed "
            f"against baseline {state.compare!r}",
            sep="-",
            red=True,
        )
        for key, comps in by_key.items():
            changes = ", ".join(
                f"{c.metric} {c.change * 100:+.1f}%" if c.change is not None else c.metric
                for c in comps
            )
            tr.write_line(f"{_short(key)}: {changes}", red=True)
    for note in state.notes:
        tr.write_line(f"perfscope: {note}")
