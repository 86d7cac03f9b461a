"""Performance assertions: ``expect`` and ``check`` on Runs, RunSets or summaries.

::

    perfscope.expect(run).ttft.p99 < "200ms"
    perfscope.check(run, "ttft.p99 < 200ms", "decode.mbu > 0.3", "goodput.attainment >= 95%")

The expression grammar (metric names, units) is :mod:`perfscope.checks.grammar`. On a
:class:`~perfscope.api.runset.RunSet` (a workload repeated N times) an assertion uses the
median over the repeats (``stat="median"``), their mean, or a one-sided Student-t
confidence bound on the mean (``stat="bound"``: the upper bound for ``<``, the lower bound
for ``>``), so a test passes only when the limit holds with that confidence.

Failures raise :class:`perfscope.errors.PerfAssertionError` (an ``AssertionError``) whose
message shows the measured value, the limit, the metric's distribution and the run
directory. Every evaluated assertion is also handed to the registered observers
(:func:`add_observer`); the pytest plugin records them per test that way.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from perfscope.analysis.catalogue import (
    format_metric,
    format_number,
    format_ratio,
    kind_of,
    value_at,
)
from perfscope.api.runset import load_if_path, run_dirs, runs_of, summary_of
from perfscope.checks.change import confidence_bound
from perfscope.checks.grammar import (
    Assertion,
    MetricNotFoundError,
    compare_op,
    number_or_none,
    parse_assertion,
    parse_assertions,
    resolve_metric,
)
from perfscope.errors import PerfAssertionError, SLOError, UsageError
from perfscope.jsontypes import JsonObject

__all__ = [
    "AssertionObserver",
    "Outcome",
    "add_observer",
    "check",
    "evaluate",
    "expect",
    "failure_message",
    "observing",
    "remove_observer",
]

#: Called with the assertion's target (Run, RunSet, summary) and its evaluated outcomes.
AssertionObserver = Callable[[Any, Sequence["Outcome"]], None]
_OBSERVERS: list[AssertionObserver] = []


def add_observer(observer: AssertionObserver) -> None:
    """Hand every assertion ``expect``/``check`` evaluates to ``observer`` from now on."""
    _OBSERVERS.append(observer)


def remove_observer(observer: AssertionObserver) -> None:
    """Stop notifying ``observer`` (no error if it was not registered)."""
    if observer in _OBSERVERS:
        _OBSERVERS.remove(observer)


@contextmanager
def observing(observer: AssertionObserver) -> Iterator[None]:
    """Register ``observer`` for the duration of a ``with`` block."""
    add_observer(observer)
    try:
        yield
    finally:
        remove_observer(observer)


def _notify(target: Any, outcomes: Sequence[Outcome]) -> None:
    for observer in list(_OBSERVERS):
        observer(target, outcomes)


@dataclass
class Outcome:
    """One evaluated assertion.

    Attributes:
        assertion: what was asserted.
        path: the metric's full path in summary.json (``None`` when not found).
        measured: the value compared (SI units), ``None`` when unavailable.
        passed: whether the assertion held.
        stat: how ``measured`` was obtained (``value``, ``median of 3``, ...).
        samples: per-repeat values (one for a single run).
        distribution: the metric's sibling statistics (``count``, ``p50``, ...) if any.
        run_dirs: the run directories.
        problem: why there is no value (metric not found, no completed request, ...).
    """

    assertion: Assertion
    path: str | None
    measured: float | None
    passed: bool
    stat: str = "value"
    samples: list[float] = field(default_factory=list)
    distribution: JsonObject | None = None
    run_dirs: list[str] = field(default_factory=list)
    problem: str | None = None

    @property
    def metric(self) -> str:
        return self.assertion.metric

    def _show(self, value: Any) -> str:
        """``value`` formatted as the catalogue shows this metric."""
        return format_metric(value, self.path if self.path else self.assertion.metric)

    def measured_text(self) -> str:
        if self.measured is None:
            return "n/a"
        text = self._show(self.measured)
        if len(self.samples) > 1:
            each = " ".join(self._show(v) for v in self.samples)
            text += f" ({self.stat}; repeats: {each})"
        return text

    def margin_text(self) -> str:
        a, m = self.assertion, self.measured
        if m is None or a.threshold == 0 or a.op in ("==", "!="):
            return ""
        rel = (m - a.threshold) / abs(a.threshold)
        if self.passed:
            return f"{format_ratio(abs(rel))} headroom"
        word = "over" if rel > 0 else "under"
        if rel > 9:  # "756266.1% over" reads badly: say how many times the limit it is
            return f"{format_number(m / a.threshold)}x the limit"
        return f"{format_ratio(abs(rel))} {word} the limit"

    def line(self) -> str:
        """``FAIL  ttft.p99 < 200ms: measured 312ms (56.2% over the limit)``."""
        tag = "ok  " if self.passed else "FAIL"
        if self.problem:
            return f"{tag}  {self.assertion.text}: {self.problem}"
        margin = self.margin_text()
        return f"{tag}  {self.assertion.text}: measured {self.measured_text()}" + (
            f" ({margin})" if margin else ""
        )

    def distribution_text(self) -> str | None:
        d = self.distribution
        if not d or self.path is None:
            return None
        group = self.path.rsplit(".", 1)[0]
        parts = []
        if "count" in d:
            parts.append(f"n={format_metric(d['count'], f'{group}.count')}")
        for key in ("min", "p50", "p90", "p95", "p99", "max", "mean", "std"):
            if key in d and d[key] is not None:
                parts.append(f"{key} {format_metric(d[key], f'{group}.{key}')}")
        if len(parts) < 2:
            return None
        return f"{self.path.rsplit('.', 1)[0]}: " + "  ".join(parts)

    def to_dict(self) -> JsonObject:
        return {
            "expression": self.assertion.text,
            "metric": self.metric,
            "path": self.path,
            "op": self.assertion.op,
            "threshold": self.assertion.threshold,
            "measured": self.measured,
            "passed": self.passed,
            "stat": self.stat,
            "samples": list(self.samples),
            "problem": self.problem,
            "run_dirs": list(self.run_dirs),
        }


def _measure(
    target: Any, metric: str, stat: str, confidence: float, op: str | None
) -> tuple[str, float | None, str, list[float], JsonObject | None]:
    """(path, value, stat label, samples, distribution) of ``metric`` on ``target``."""
    if stat not in ("median", "mean", "bound"):
        raise UsageError(f"unknown stat {stat!r}: use 'median', 'mean' or 'bound'")
    runs = runs_of(target)
    summaries = [summary_of(r) for r in runs]
    samples: list[float] = []
    path = ""
    for s in summaries:
        path, raw = resolve_metric(s, metric)
        value = number_or_none(metric, path, raw, s)
        if value is not None:
            samples.append(value)
    parent_path = path.rsplit(".", 1)[0] if "." in path else ""
    agg = summary_of(target)
    parent = value_at(agg, parent_path) if parent_path else None
    distribution = dict(parent) if isinstance(parent, Mapping) and "p50" in parent else None
    if not samples:
        return path, None, "value", [], distribution
    n = len(samples)
    if stat == "bound":
        if n < 2:
            raise UsageError(
                "a confidence bound needs repeated runs: run the workload with repeat=3 or more"
            )
        if op not in ("<", "<=", ">", ">="):
            raise UsageError("stat='bound' works with <, <=, > and >=")
        side = "upper" if op in ("<", "<=") else "lower"
        value = confidence_bound(samples, side, confidence)
        label = f"{side} {format_ratio(confidence)} bound of the mean of {n}"
    elif n == 1:
        value, label = samples[0], "value"
    elif stat == "mean":
        value, label = statistics.fmean(samples), f"mean of {n}"
    else:
        value, label = float(statistics.median(samples)), f"median of {n}"
    return path, value, label, samples, distribution


def evaluate(
    target: Any, assertion: Assertion, *, stat: str = "median", confidence: float = 0.95
) -> Outcome:
    """Evaluate one assertion on a Run, RunSet or summary dict (no exception on failure)."""
    target = load_if_path(target)
    dirs = run_dirs(target)
    try:
        path, value, label, samples, dist = _measure(
            target, assertion.metric, stat, confidence, assertion.op
        )
    except MetricNotFoundError as exc:
        return Outcome(assertion, None, None, False, run_dirs=dirs, problem=str(exc))
    if value is None:
        count = (dist or {}).get("count")
        why = " (no request completed)" if count == 0 else ""
        return Outcome(
            assertion,
            path,
            None,
            False,
            distribution=dist,
            run_dirs=dirs,
            problem=f"{path} has no value in this run{why}",
        )
    passed = compare_op(assertion.op, value, assertion.threshold)
    return Outcome(assertion, path, value, passed, label, samples, dist, dirs)


def failure_message(outcomes: Sequence[Outcome], *, single: bool) -> str:
    failed = [o for o in outcomes if not o.passed]
    if single:
        lines = [f"perfscope: {failed[0].line()[6:]}"]
    else:
        lines = [f"perfscope: {len(failed)} of {len(outcomes)} checks failed"]
        lines += [f"  {o.line()}" for o in outcomes]
    seen: set[str] = set()
    for o in failed:
        dist = o.distribution_text()
        if dist and dist not in seen:
            seen.add(dist)
            lines.append(f"  {dist}")
    dirs = outcomes[0].run_dirs if outcomes else []
    if dirs:
        label = "run" if len(dirs) == 1 else "runs"
        lines.append(f"  {label}: " + ", ".join(dirs))
    return "\n".join(lines)


def check(
    run: Any, *assertions: Any, stat: str = "median", confidence: float = 0.95
) -> list[Outcome]:
    """Assert every expression on ``run``; raise one :class:`PerfAssertionError` listing
    all of them when any fails. Returns the outcomes when all pass.

    Args:
        run: a :class:`perfscope.Run`, a :class:`RunSet`, a run directory (``Path``) or a
            summary dict.
        assertions: ``"ttft.p99 < 200ms"`` strings, ``{metric: limit}`` dicts or lists.
        stat: on a RunSet: ``median`` (default), ``mean`` or ``bound``.
        confidence: confidence level of ``stat="bound"``.
    """
    __tracebackhide__ = True
    parsed = parse_assertions(*assertions)
    if not parsed:
        raise UsageError("check() needs at least one assertion, e.g. 'ttft.p99 < 200ms'")
    run = load_if_path(run)
    outcomes = [evaluate(run, a, stat=stat, confidence=confidence) for a in parsed]
    _notify(run, outcomes)
    if not all(o.passed for o in outcomes):
        raise PerfAssertionError(failure_message(outcomes, single=False), outcomes)
    return outcomes


class _MetricRef:
    """``expect(run).ttft.p99``: a metric path waiting for a comparison."""

    __slots__ = ("_confidence", "_parts", "_stat", "_target")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, target: Any, parts: tuple[str, ...], stat: str, confidence: float) -> None:
        self._target = target
        self._parts = parts
        self._stat = stat
        self._confidence = confidence

    def __getattr__(self, name: str) -> _MetricRef:
        if name.startswith("__"):
            raise AttributeError(name)
        return _MetricRef(self._target, (*self._parts, name), self._stat, self._confidence)

    def __getitem__(self, name: str) -> _MetricRef:
        parts = tuple(p for p in str(name).split(".") if p)
        return _MetricRef(self._target, (*self._parts, *parts), self._stat, self._confidence)

    def _compare(self, op: str, other: object) -> bool:
        __tracebackhide__ = True
        metric = ".".join(self._parts)
        if not metric:
            raise UsageError("name a metric first: perfscope.expect(run).ttft.p99 < '200ms'")
        if isinstance(other, str):
            assertion = parse_assertion(f"{metric} {op} {other}")
        elif isinstance(other, int | float) and not isinstance(other, bool):
            text = f"{metric} {op} {format_metric(other, metric)}"
            assertion = Assertion(metric, op, float(other), text, kind_of(metric))
        else:
            raise SLOError(
                f"compare {metric} with a string like '200ms' or a number, not {other!r}"
            )
        outcome = evaluate(self._target, assertion, stat=self._stat, confidence=self._confidence)
        _notify(self._target, [outcome])
        if not outcome.passed:
            raise PerfAssertionError(failure_message([outcome], single=True), [outcome])
        return True

    def __lt__(self, other: object) -> bool:
        __tracebackhide__ = True
        return self._compare("<", other)

    def __le__(self, other: object) -> bool:
        __tracebackhide__ = True
        return self._compare("<=", other)

    def __gt__(self, other: object) -> bool:
        __tracebackhide__ = True
        return self._compare(">", other)

    def __ge__(self, other: object) -> bool:
        __tracebackhide__ = True
        return self._compare(">=", other)

    def __eq__(self, other: object) -> bool:
        __tracebackhide__ = True
        return self._compare("==", other)

    def __ne__(self, other: object) -> bool:
        __tracebackhide__ = True
        return self._compare("!=", other)

    def __bool__(self) -> bool:
        raise TypeError(
            f"compare the metric with a limit: perfscope.expect(run).{'.'.join(self._parts)} "
            "< '200ms'"
        )

    def __repr__(self) -> str:
        return f"expect({self._target!r}).{'.'.join(self._parts)}"


def expect(run: Any, *, stat: str = "median", confidence: float = 0.95) -> Any:
    """Readable single assertions: ``perfscope.expect(run).ttft.p99 < "200ms"``.

    The comparison returns ``True`` when it holds and raises :class:`PerfAssertionError`
    (measured value, limit, distribution, run directory) when it does not. Use
    ``expect(run)["decode.mbu"] > 0.3`` for names that are not Python identifiers. On a
    RunSet, ``stat`` picks the median (default), the mean or a confidence ``bound``.
    """
    if stat not in ("median", "mean", "bound"):
        raise UsageError(f"unknown stat {stat!r}: use 'median', 'mean' or 'bound'")
    return _MetricRef(load_if_path(run), (), stat, confidence)
