"""Session state of the pytest plugin: options, the loaded baseline and every perf test's
record (its runs, assertion outcomes and baseline comparisons), and what happens when a
test body ends (marker SLOs, key metrics, the regression gate)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from perfscope.checks.expect import Outcome
    from perfscope.checks.grammar import Assertion
    from perfscope.pytest_plugin._baseline import (
        Baseline,
        KeyMetric,
        MachineInfo,
        MetricComparison,
        Tolerance,
    )

__all__ = [
    "KEY_METRICS",
    "MARK",
    "STATE",
    "MarkerOptions",
    "Measurement",
    "SessionState",
    "TestRecord",
    "finish_test",
    "is_perf_test",
    "marker_options",
    "observer_for",
    "state_of",
]

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
MARKER_KWARGS = ("slo", "repeat", "stat", "confidence", "tolerance")


@dataclass
class Measurement:
    """A run (or RunSet) a perf test made or asserted on."""

    key: str
    label: str
    target: Any
    run_dirs: list[str]
    asserted: list[str] = field(default_factory=list)
    metrics: dict[str, KeyMetric] = field(default_factory=dict)


@dataclass
class MarkerOptions:
    """What ``@pytest.mark.perfscope(...)`` asked for."""

    assertions: list[Assertion] = field(default_factory=list)
    repeat: int | None = None
    stat: str = "median"
    confidence: float = 0.95
    tolerances: list[Tolerance] = field(default_factory=list)
    marked: bool = False


@dataclass
class TestRecord:
    """One perf test: its measurements, assertion outcomes and baseline comparisons."""

    __test__ = False  # not a test class, whatever its name

    nodeid: str
    outcome: str = "passed"
    measurements: list[Measurement] = field(default_factory=list)
    outcomes: list[tuple[Measurement, Outcome, str]] = field(default_factory=list)
    comparisons: list[MetricComparison] = field(default_factory=list)

    def add(self, target: Any, label: str | None = None) -> Measurement:
        """The measurement of ``target`` (made on first sight; keyed by node id and label)."""
        from perfscope.api.runset import run_dirs

        dirs = run_dirs(target)
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
        m = Measurement(key=key, label=tag, target=target, run_dirs=dirs)
        self.measurements.append(m)
        return m


class SessionState:
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
        self.records: dict[str, TestRecord] = {}
        self.baseline: Baseline | None = None
        self.baseline_file: Path | None = None
        self.mismatch: str | None = None
        self._machine: MachineInfo | None = None
        self.notes: list[str] = []
        self.strict: bool = bool(getattr(opt, "perfscope_strict", False))
        #: Measurements that found their test in the baseline, and the keys that did not.
        self.matched = 0
        self.unmatched: list[str] = []

    def no_match(self) -> str | None:
        """The note for a gate where no measured test matched the baseline, else None."""
        if self.baseline is None or self.matched or not self.unmatched:
            return None
        have = len(self.baseline.tests)
        return (
            f"no test matched baseline {self.compare!r} ({have} tests in it, "
            f"{len(self.unmatched)} measured now, e.g. {self.unmatched[0]!r}): nothing was "
            "gated; was the baseline saved from another folder or with other test names?"
        )

    def machine(self) -> MachineInfo:
        if self._machine is None:
            from perfscope.pytest_plugin._baseline import machine_info

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
        from perfscope.errors import UsageError
        from perfscope.pytest_plugin._baseline import (
            baseline_path,
            hardware_mismatch,
            load_baseline,
        )

        try:
            self.baseline_file = baseline_path(self.storage, self.compare)
            self.baseline = load_baseline(self.baseline_file)
        except UsageError as exc:
            raise pytest.UsageError(f"perfscope: {exc}") from None
        self.mismatch = hardware_mismatch(self.baseline, self.machine())
        if self.mismatch and not self.force:
            raise pytest.UsageError(f"perfscope: {self.mismatch}")

    def record_for(self, item: pytest.Item) -> TestRecord:
        rec = self.records.get(item.nodeid)
        if rec is None:
            rec = self.records[item.nodeid] = TestRecord(item.nodeid)
        return rec

    def perf_records(self) -> list[TestRecord]:
        return [r for r in self.records.values() if r.measurements or r.outcomes]

    def regressions(self) -> list[MetricComparison]:
        return [c for r in self.records.values() for c in r.comparisons if c.regressed]


STATE = pytest.StashKey[SessionState]()
MARK = pytest.StashKey[MarkerOptions]()


def state_of(config: pytest.Config) -> SessionState | None:
    """The session's state (``None`` on an xdist worker or before configure)."""
    return config.stash.get(STATE, None)


def is_perf_test(item: pytest.Item) -> bool:
    """A test that uses the ``perfscope`` fixture or the ``perfscope`` marker."""
    names = getattr(item, "fixturenames", ())
    return "perfscope" in names or item.get_closest_marker("perfscope") is not None


def observer_for(item: pytest.Item) -> Any:
    """The assertion observer active while ``item`` runs: it records every
    ``perfscope.expect``/``check`` outcome on the test's record."""

    def observe(target: Any, outcomes: Sequence[Outcome]) -> None:
        # Only perf tests are recorded: a plain test that calls perfscope.expect asserts,
        # but stays out of the table and the baselines.
        state = state_of(item.config)
        if state is None or not is_perf_test(item):
            return
        rec = state.record_for(item)
        m = rec.add(target)
        for o in outcomes:
            if o.metric not in m.asserted:
                m.asserted.append(o.metric)
            rec.outcomes.append((m, o, "assert"))

    return observe


# --------------------------------------------------------------------------- marker


#: Latency distributions: an SLO must name one of their percentiles (``tpot.p99``).
_DISTRIBUTIONS = ("ttft", "tpot", "itl", "e2e", "ntpot", "latency.ttft", "latency.tpot")


def marker_options(item: pytest.Item) -> MarkerOptions:
    """Parse the test's ``@pytest.mark.perfscope``; raises UsageError on bad arguments."""
    from perfscope.checks.grammar import parse_assertions
    from perfscope.errors import SLOError, UsageError
    from perfscope.pytest_plugin._baseline import parse_fail_option

    marker = item.get_closest_marker("perfscope")
    if marker is None:
        return MarkerOptions()
    unknown = sorted(set(marker.kwargs) - set(MARKER_KWARGS))
    if unknown:
        raise UsageError(
            f"@pytest.mark.perfscope got unknown argument(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(MARKER_KWARGS)}"
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
    for a in assertions:
        if a.metric in _DISTRIBUTIONS:
            raise UsageError(
                f"@pytest.mark.perfscope: {a.metric!r} is a distribution, not one number: name "
                f"a percentile, e.g. {a.metric}.p50 or {a.metric}.p99"
            )
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
    return MarkerOptions(assertions, repeat, stat, confidence, tolerances, marked=True)


# --------------------------------------------------------------------------- end of a test


def finish_test(item: pytest.Item, *, body_passed: bool) -> list[str]:
    """After a test body: marker SLOs, key metrics and the baseline comparison; returns
    the failure messages (empty when the test passes)."""
    state = state_of(item.config)
    opts = item.stash.get(MARK, None)
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
        from perfscope.pytest_plugin._baseline import contention_lines

        extra = [ln for m in rec.measurements for ln in contention_lines(m.run_dirs)]
        if extra:
            problems.append("perfscope: " + "\n  ".join(["measured under contention:", *extra]))
    return problems


def _check_marker_slos(rec: TestRecord, opts: MarkerOptions) -> list[str]:
    from perfscope.checks.expect import evaluate, failure_message

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
            text = failure_message(outs, single=False).replace(
                "perfscope:", "perfscope: marker SLOs:", 1
            )
            problems.append(text)
    return problems


def _compare_with_baseline(
    state: SessionState, rec: TestRecord, opts: MarkerOptions | None
) -> list[str]:
    from perfscope.pytest_plugin._baseline import compare_metrics

    assert state.baseline is not None
    tests = state.baseline.tests
    tolerances = [*state.fail, *(opts.tolerances if opts else [])]
    problems = []
    for m in rec.measurements:
        saved = tests.get(m.key)
        base = saved.metrics if saved is not None else None
        if base:
            state.matched += 1
        elif m.metrics:
            state.unmatched.append(m.key)
        comps = compare_metrics(m.key, m.metrics, base, tolerances, gate_all=not state.fail)
        rec.comparisons.extend(comps)
        bad = [c for c in comps if c.regressed]
        if bad:
            commit = (state.baseline.commit.id if state.baseline.commit else None) or "no commit"
            lines = [
                f"perfscope: performance regressed against baseline {state.compare!r} "
                f"(commit {str(commit)[:10]}):"
            ]
            lines += [f"  {c.describe()}" for c in bad]
            lines.append("  runs: " + ", ".join(m.run_dirs))
            problems.append("\n".join(lines))
    return problems


def _metrics_of(target: Any, asserted: Sequence[str]) -> dict[str, KeyMetric]:
    """The key metrics and asserted metrics of a run: value (median), samples, kind."""
    from perfscope.analysis.catalogue import better_of, kind_of, value_at
    from perfscope.api.runset import runs_of, summary_of
    from perfscope.checks.grammar import MetricNotFoundError, resolve_metric
    from perfscope.errors import SLOError
    from perfscope.pytest_plugin._baseline import KeyMetric

    try:
        summary = summary_of(target)
    except TypeError:
        return {}
    has_slos = bool(value_at(summary, "goodput.slos"))
    out: dict[str, KeyMetric] = {}
    seen: set[str] = set()
    for name in [*KEY_METRICS, *asserted]:
        if name == "goodput.attainment" and not has_slos and name not in asserted:
            continue
        samples: list[float] = []
        path = None
        try:
            for run in runs_of(target):
                path, raw = resolve_metric(summary_of(run), name)
                if isinstance(raw, int | float) and not isinstance(raw, bool):
                    samples.append(float(raw))
        except (MetricNotFoundError, SLOError, TypeError):
            continue
        if path is None or not samples or path in seen:
            continue
        seen.add(path)
        out[name] = KeyMetric(
            path=path,
            value=float(statistics.median(samples)),
            samples=tuple(samples),
            kind=kind_of(path),
            direction=better_of(path),
        )
    return out
