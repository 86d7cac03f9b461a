"""Performance assertions: a small grammar with units, ``expect`` and ``check``.

::

    perfscope.expect(run).ttft.p99 < "200ms"
    perfscope.check(run, "ttft.p99 < 200ms", "decode.mbu > 0.3", "goodput.attainment >= 95%")

An assertion is ``METRIC OP VALUE``:

- ``METRIC`` is a dotted path into the run's summary.json. It is looked up from the top
  (``throughput.output_tok_s``), then under ``latency`` (``ttft.p99``), then as the unique
  path of the summary that ends with it (``decode.mbu`` → ``roofline.phases.decode.mbu``)
  or that holds its words in order (``roofline.decode.mbu``).
- ``OP`` is one of ``< <= > >= == !=``.
- ``VALUE`` is a number with an optional unit: durations ``ns us ms s`` (a duration metric
  needs one), ``%`` (95% = 0.95; on ``*_pct`` metrics 95% = 95), ``tok/s``, ``req/s``,
  ``J/tok``, ``J``, ``W``, ``B``/``GB``, ``GB/s``, ``TFLOPS``, ``x``. Values are converted
  to the summary's SI units (seconds, tokens/s, fractions, ...). Nothing is ever ``eval``-ed.

On a :class:`RunSet` (a workload repeated N times) an assertion uses the median over the
repeats (``stat="median"``), their mean, or a one-sided Student-t confidence bound on the
mean (``stat="bound"``: the upper bound for ``<``, the lower bound for ``>``), so a test
passes only when the limit holds with that confidence. :func:`compare_runs` and
:func:`assert_no_regression` fail only when a change is larger than the measured noise.

Failures raise :class:`PerfAssertionError` (an ``AssertionError``) whose message shows the
measured value, the limit, the metric's distribution and the run directory. Grammar errors
raise :class:`perfscope.errors.SLOError` before anything is evaluated.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfscope.analysis.catalogue import format_number, format_ratio
from perfscope.errors import SLOError, UsageError

__all__ = [
    "OPERATORS",
    "Assertion",
    "Change",
    "MetricNotFoundError",
    "Outcome",
    "PerfAssertionError",
    "RunSet",
    "assert_no_regression",
    "check",
    "compare_runs",
    "compare_samples",
    "direction",
    "evaluate",
    "expect",
    "format_value",
    "measure",
    "metric_kind",
    "parse_assertion",
    "parse_assertions",
    "parse_tolerance",
    "parse_value",
    "resolve_metric",
    "t_quantile",
]

OPERATORS = ("<=", ">=", "==", "!=", "<", ">")
_OP_FUNCS = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}

# --------------------------------------------------------------------------- units

#: unit text → (kind, factor to the SI value stored in summary.json)
_UNITS: dict[str, tuple[str, float]] = {
    "ns": ("duration", 1e-9),
    "us": ("duration", 1e-6),
    "µs": ("duration", 1e-6),
    "ms": ("duration", 1e-3),
    "s": ("duration", 1.0),
    "min": ("duration", 60.0),
    "tok/s": ("tok_rate", 1.0),
    "tokens/s": ("tok_rate", 1.0),
    "ktok/s": ("tok_rate", 1e3),
    "req/s": ("req_rate", 1.0),
    "J/tok": ("energy_per_token", 1.0),
    "mJ/tok": ("energy_per_token", 1e-3),
    "tok/J": ("tokens_per_energy", 1.0),
    "J": ("energy", 1.0),
    "mJ": ("energy", 1e-3),
    "kJ": ("energy", 1e3),
    "Wh": ("energy", 3600.0),
    "W": ("power", 1.0),
    "mW": ("power", 1e-3),
    "kW": ("power", 1e3),
    "B": ("bytes", 1.0),
    "KB": ("bytes", 1e3),
    "MB": ("bytes", 1e6),
    "GB": ("bytes", 1e9),
    "TB": ("bytes", 1e12),
    "KiB": ("bytes", 1024.0),
    "MiB": ("bytes", 1024.0**2),
    "GiB": ("bytes", 1024.0**3),
    "B/s": ("bandwidth", 1.0),
    "KB/s": ("bandwidth", 1e3),
    "MB/s": ("bandwidth", 1e6),
    "GB/s": ("bandwidth", 1e9),
    "TB/s": ("bandwidth", 1e12),
    "FLOP": ("flops", 1.0),
    "GFLOP": ("flops", 1e9),
    "TFLOP": ("flops", 1e12),
    "FLOP/s": ("flop_rate", 1.0),
    "GFLOP/s": ("flop_rate", 1e9),
    "TFLOP/s": ("flop_rate", 1e12),
    "GFLOPS": ("flop_rate", 1e9),
    "TFLOPS": ("flop_rate", 1e12),
    "PFLOPS": ("flop_rate", 1e15),
    "x": ("number", 1.0),
}
_KIND_WORDS = {
    "duration": "a duration (write ns, us, ms or s)",
    "fraction": "a fraction (write 0.95 or 95%)",
    "percent": "a percentage (write 95 or 95%)",
    "tok_rate": "a token rate (write tok/s)",
    "req_rate": "a request rate (write req/s)",
    "energy_per_token": "energy per token (write J/tok)",
    "tokens_per_energy": "tokens per joule (write tok/J)",
    "energy": "an energy (write J)",
    "power": "a power (write W)",
    "bytes": "a size (write B, MB or GB)",
    "bandwidth": "a bandwidth (write GB/s)",
    "flops": "a FLOP count",
    "flop_rate": "a FLOP rate (write TFLOPS)",
    "count": "a count (write a plain number)",
}
_NUMBER = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_VALUE_RE = re.compile(rf"^\s*({_NUMBER})\s*(%|[A-Za-zµ/]+)?\s*$")
_METRIC_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*$")
_ASSERT_RE = re.compile(
    r"^\s*(?P<metric>[^<>=!\s]+)\s*(?P<op><=|>=|==|!=|<|>)\s*(?P<value>.*?)\s*$"
)

_LATENCY = ("ttft", "tpot", "itl", "itl_per_token", "e2e", "ntpot", "driver_lag")
_STAT_RE = re.compile(r"^(?:mean|std|min|max|median|p[0-9]+(?:_[0-9]+)?)$")
_FRACTIONS = ("attainment", "mfu", "mbu", "efficiency", "time_share", "share")


def metric_kind(path: str) -> str | None:
    """What a metric measures, from its name: ``duration`` (seconds), ``fraction``,
    ``percent``, ``tok_rate``, ``req_rate``, ``energy_per_token``, ``energy``, ``power``,
    ``bytes``, ``bandwidth``, ``flops``, ``flop_rate``, ``count`` or ``None`` (unknown)."""
    parts = path.split(".")
    leaf = parts[-1]
    if leaf == "count":
        return "count"
    base = parts[-2] if _STAT_RE.match(leaf) and len(parts) > 1 else leaf
    if base in _LATENCY:
        return "duration"
    if base in _FRACTIONS or "per_slo" in parts[:-1] or base.endswith("_share"):
        return "fraction"
    if base.endswith("_pct"):
        return "percent"
    if base.startswith("j_per_"):
        return "energy_per_token"
    if base.startswith(("tokens_per_j", "tok_per_j")):
        return "tokens_per_energy"
    for suffix, kind in (
        ("tok_s", "tok_rate"),
        ("req_s", "req_rate"),
        ("bytes_s", "bandwidth"),
        ("flops_s", "flop_rate"),
        ("_s", "duration"),
        ("_j", "energy"),
        ("_w", "power"),
        ("bytes", "bytes"),
        ("flops", "flops"),
    ):
        if base.endswith(suffix) or base == suffix.lstrip("_"):
            return kind
    if parts[0] == "counts":
        return "count"
    return None


_LOWER_BETTER_KINDS = ("duration", "energy_per_token", "energy", "power")
_HIGHER_BETTER_KINDS = ("tok_rate", "req_rate", "tokens_per_energy", "flop_rate", "bandwidth")
_NEUTRAL = ("window_s", "busy_s", "time_s", "time_share", "count", "requests", "output_tokens")


def direction(path: str) -> str | None:
    """``"lower"`` when a smaller value is better (latency, energy), ``"higher"`` when a
    larger one is (throughput, utilisation, attainment), ``None`` when neither."""
    parts = path.split(".")
    leaf = parts[-1]
    base = parts[-2] if _STAT_RE.match(leaf) and len(parts) > 1 else leaf
    if base in _NEUTRAL or leaf in _NEUTRAL:
        return None
    if base in ("failed", "errors") or leaf == "std":
        return "lower"
    kind = metric_kind(path)
    if kind in _LOWER_BETTER_KINDS:
        return "lower"
    if kind in _HIGHER_BETTER_KINDS or kind == "fraction":
        return "higher"
    if base in ("completed", "good_requests"):
        return "higher"
    return None


def parse_value(text: str, kind: str | None = None, *, context: str | None = None) -> float:
    """``"200ms"`` → 0.2, ``"95%"`` → 0.95, ``"1.5k"`` is an error. ``kind`` is the
    metric's kind (see :func:`metric_kind`); a unit of another kind is an error, and a
    duration metric needs a unit."""
    __tracebackhide__ = True
    where = f" in {context!r}" if context else ""
    m = _VALUE_RE.match(text)
    if not m:
        raise SLOError(
            f"cannot read value {text!r}{where}: expected a number with an optional unit, "
            "e.g. 200ms, 95%, 1200 tok/s, 0.3"
        )
    number, unit = float(m.group(1)), m.group(2)
    if unit is None:
        if kind == "duration":
            raise SLOError(
                f"value {text!r}{where} needs a unit: the metric is a duration "
                f"(write e.g. {m.group(1)}ms or {m.group(1)}s)"
            )
        return number
    if unit == "%":
        if kind == "percent":
            return number
        if kind in (None, "fraction", "number"):
            return number / 100.0
        raise SLOError(f"value {text!r}{where}: '%' does not fit {_KIND_WORDS[kind]}")
    found = _UNITS.get(unit) or _UNITS.get(unit.lower())
    if found is None:
        known = "ns us ms s, %, tok/s, req/s, J/tok, J, W, GB, GB/s, TFLOPS, x"
        raise SLOError(f"unknown unit {unit!r} in value {text!r}{where}: use one of {known}")
    unit_kind, factor = found
    if kind is not None and unit_kind not in (kind, "number"):
        raise SLOError(f"value {text!r}{where}: the metric is {_KIND_WORDS.get(kind, kind)}")
    return number * factor


def parse_tolerance(text: str | float) -> float:
    """A relative tolerance: ``"10%"`` → 0.1, ``0.1`` → 0.1."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _VALUE_RE.match(str(text))
        if not m or m.group(2) not in (None, "%"):
            raise SLOError(f"cannot read tolerance {text!r}: write a percentage, e.g. 10%")
        value = float(m.group(1)) / (100.0 if m.group(2) == "%" else 1.0)
    if value < 0:
        raise SLOError(f"tolerance {text!r} must not be negative")
    return value


def _sig(x: float) -> str:
    """Three significant digits, no exponent above 1e-3: 312, 41.2, 5.36, 0.25."""
    if abs(x) >= 1000:
        return f"{x:.0f}"
    return f"{x:.3g}"


def _scaled(x: float, steps: Sequence[tuple[float, str]], unit_last: str) -> str:
    for factor, unit in steps:
        if abs(x) >= factor:
            return f"{_sig(x / factor)}{unit}"
    return f"{_sig(x)}{unit_last}"


def format_value(value: float | None, kind: str | None) -> str:
    """Human form of an SI value of ``kind``: ``0.3124`` s → ``"312ms"``."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if kind == "duration":
        a = abs(value)
        if a == 0:
            return "0s"
        for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
            if a >= factor:
                return f"{_sig(value / factor)}{unit}"
        return f"{_sig(value * 1e9)}ns"
    if kind == "fraction":
        return f"{_sig(value * 100)}%"
    if kind == "percent":
        return f"{_sig(value)}%"
    simple = {
        "tok_rate": " tok/s",
        "req_rate": " req/s",
        "energy_per_token": " J/tok",
        "tokens_per_energy": " tok/J",
        "energy": " J",
        "power": " W",
    }
    if kind in simple:
        return f"{_sig(value)}{simple[kind]}"
    if kind == "bytes":
        return _scaled(value, ((1e12, " TB"), (1e9, " GB"), (1e6, " MB"), (1e3, " KB")), " B")
    if kind == "bandwidth":
        return _scaled(value, ((1e12, " TB/s"), (1e9, " GB/s"), (1e6, " MB/s")), " B/s")
    if kind in ("flops", "flop_rate"):
        u = "FLOP" if kind == "flops" else "FLOP/s"
        return _scaled(value, ((1e15, f" P{u}"), (1e12, f" T{u}"), (1e9, f" G{u}")), f" {u}")
    if kind == "count" and float(value).is_integer():
        return str(int(value))
    return _sig(value)


# --------------------------------------------------------------------------- lookup


class MetricNotFoundError(LookupError):
    """The metric is not in the run's summary (or has no value there)."""


def _get(tree: Any, parts: Sequence[str]) -> tuple[bool, Any]:
    node = tree
    for p in parts:
        if not isinstance(node, Mapping) or p not in node:
            return False, None
        node = node[p]
    return True, node


def _walk(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in tree.items():
        path = (*prefix, str(key))
        yield path
        if isinstance(value, Mapping) and len(path) < 8:
            yield from _walk(value, path)


def _is_subsequence(needle: Sequence[str], hay: Sequence[str]) -> bool:
    it = iter(hay)
    return all(tok in it for tok in needle)


def resolve_metric(summary: Mapping[str, Any], name: str) -> tuple[str, Any]:
    """The full dotted path of ``name`` in ``summary`` and the value there.

    Order: from the top, under ``latency``, the unique path ending with ``name``, the
    unique path starting with its first word and holding all its words in order. Raises
    :class:`MetricNotFoundError` (with what the run does have) when nothing, or more than
    one path, matches."""
    if not _METRIC_RE.match(name):
        raise SLOError(f"cannot read metric {name!r}: write a dotted name such as ttft.p99")
    parts = name.split(".")
    for prefix in ((), ("latency",)):
        ok, value = _get(summary, (*prefix, *parts))
        if ok:
            return ".".join((*prefix, *parts)), value
    paths = list(_walk(summary))
    n = len(parts)
    suffix = [p for p in paths if len(p) > n and p[-n:] == tuple(parts)]
    if not suffix:
        suffix = [
            p
            for p in paths
            if p[0] == parts[0] and p[-1] == parts[-1] and _is_subsequence(parts, p)
        ]
    if len(suffix) == 1:
        path = suffix[0]
        return ".".join(path), _get(summary, path)[1]
    if len(suffix) > 1:
        shown = ", ".join(".".join(p) for p in suffix[:6])
        raise MetricNotFoundError(f"metric {name!r} is ambiguous in this run: it matches {shown}")
    raise MetricNotFoundError(_not_found_message(summary, name))


def _not_found_message(summary: Mapping[str, Any], name: str) -> str:
    parts = name.split(".")
    lines = [f"metric {name!r} is not in this run"]
    best: tuple[int, str] | None = None
    for prefix in (("latency",), ()):
        full = (*prefix, *parts)
        for i in range(len(full) - 1, len(prefix), -1):
            ok, node = _get(summary, full[:i])
            if ok and isinstance(node, Mapping):
                depth = i - len(prefix)
                if best is None or depth > best[0]:
                    keys = ", ".join(sorted(str(k) for k in node)) or "nothing"
                    best = (depth, f"{'.'.join(full[:i])} has no {full[i]!r}; it has: {keys}")
                break
    if best is not None:
        lines.append(best[1])
    if parts[0] in ("roofline", "energy", "hardware", "advice") and parts[0] not in summary:
        lines.append(
            f"this run's summary has no {parts[0]!r} section (that analysis did not run or "
            "had no data)"
        )
    for key, section in summary.items():
        if isinstance(section, Mapping) and section.get("available") is False:
            lines.append(f"{key}: not available ({section.get('reason') or 'no reason given'})")
    top = ", ".join(str(k) for k, v in summary.items() if isinstance(v, Mapping))
    lines.append(f"sections: {top}")
    return "; ".join(lines)


def _number_or_none(name: str, path: str, value: Any, summary: Mapping[str, Any]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Mapping):
        keys = ", ".join(str(k) for k in value)
        raise MetricNotFoundError(
            f"{name!r} ({path}) is a group, not a number: name one of its entries ({keys}), "
            f"e.g. {name}.{'p99' if 'p99' in value else next(iter(value), 'p99')}"
        )
    raise MetricNotFoundError(f"{name!r} ({path}) is {value!r}, not a number")


# --------------------------------------------------------------------------- runs


def _summary_of(target: Any) -> Mapping[str, Any]:
    if isinstance(target, Mapping):
        return target
    summary = getattr(target, "summary", None)
    if not isinstance(summary, Mapping):
        raise TypeError(
            f"expected a perfscope Run, RunSet or summary dict, got {type(target).__name__}"
        )
    return summary


def _median_tree(trees: Sequence[Any]) -> Any:
    first = trees[0]
    if isinstance(first, Mapping):
        return {
            k: _median_tree([t[k] for t in trees if isinstance(t, Mapping) and k in t])
            for k in first
        }
    nums = [t for t in trees if isinstance(t, int | float) and not isinstance(t, bool)]
    if nums and len(nums) == len(trees) and not isinstance(first, bool):
        return float(statistics.median(nums))
    return first


class RunSet:
    """The same workload run several times (``perfscope.run(..., repeat=N)``).

    Attribute access reads the *median* over the repeats of every number in the summary
    (``runs.ttft.p99``); :meth:`values` gives the per-repeat values. ``expect`` and
    ``check`` on a RunSet assert on the median or on a confidence bound.

    Attributes:
        runs: the individual :class:`perfscope.Run` objects, in order.
        summary: element-wise median of their summaries.
    """

    def __init__(self, runs: Sequence[Any]) -> None:
        if not runs:
            raise UsageError("a RunSet needs at least one run")
        self.runs: list[Any] = list(runs)
        self.summary: dict[str, Any] = _median_tree([_summary_of(r) for r in self.runs])

    @property
    def path(self) -> Path:
        """The first run's directory."""
        return Path(self.runs[0].path)

    @property
    def paths(self) -> list[Path]:
        return [Path(r.path) for r in self.runs]

    @property
    def status(self) -> str:
        bad = [r.status for r in self.runs if r.status != "complete"]
        return bad[0] if bad else "complete"

    def values(self, metric: str) -> list[float]:
        """``metric`` (grammar name, e.g. ``ttft.p99``) in each repeat."""
        out: list[float] = []
        for r in self.runs:
            s = _summary_of(r)
            path, raw = resolve_metric(s, metric)
            value = _number_or_none(metric, path, raw, s)
            if value is not None:
                out.append(value)
        return out

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.runs)

    def __getitem__(self, index: int) -> Any:
        return self.runs[index]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        from perfscope._run import Section

        latency = self.summary.get("latency", {})
        if name in latency:
            return Section(latency[name], name)
        if name in self.summary:
            value = self.summary[name]
            return Section(value, name) if isinstance(value, dict) else value
        raise AttributeError(f"RunSet has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"RunSet({len(self.runs)} runs, first={str(self.path)!r})"


def _runs_of(target: Any) -> list[Any]:
    if isinstance(target, RunSet):
        return target.runs
    return [target]


def _run_dirs(target: Any) -> list[str]:
    out = []
    for r in _runs_of(target):
        p = getattr(r, "path", None)
        if p is not None:
            out.append(str(p))
    return out


def _load_if_path(target: Any) -> Any:
    if isinstance(target, Path):
        from perfscope._run import load_run

        return load_run(target)
    return target


# --------------------------------------------------------------------------- statistics


def _t_cdf_abs(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)
        if df > 1:
            total = term
            for k in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
        return (2 / math.pi) * (theta + math.sin(theta) * total) if df > 1 else 2 * theta / math.pi
    total, term = 1.0, 1.0
    for k in range(1, (df - 2) // 2 + 1):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom
    (rounded down, at least 1: conservative for Welch's fractional df)."""
    if not 0.5 < p < 1:
        raise UsageError(f"confidence must be between 0.5 and 1, got {p}")
    k = max(1, math.floor(df))
    if k > 200:
        return statistics.NormalDist().inv_cdf(p)
    target = 2 * p - 1
    lo, hi = 0.0, 1.0
    while _t_cdf_abs(hi, k) < target:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if _t_cdf_abs(mid, k) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _bound(samples: Sequence[float], side: str, confidence: float) -> float:
    n = len(samples)
    mean = statistics.fmean(samples)
    half = t_quantile(confidence, n - 1) * statistics.stdev(samples) / math.sqrt(n)
    return mean + half if side == "upper" else mean - half


# --------------------------------------------------------------------------- assertions


class PerfAssertionError(AssertionError):
    """A performance assertion failed; the message has the numbers.

    Attributes:
        outcomes: every evaluated assertion (failed and passed).
    """

    def __init__(self, message: str, outcomes: Sequence[Outcome] = ()) -> None:
        super().__init__(message)
        self.outcomes = list(outcomes)


@dataclass(frozen=True)
class Assertion:
    """One parsed assertion: ``metric op threshold`` (threshold in SI units)."""

    metric: str
    op: str
    threshold: float
    text: str
    kind: str | None

    def __str__(self) -> str:
        return self.text


def parse_assertion(text: str) -> Assertion:
    """Parse ``"ttft.p99 < 200ms"`` (grammar in the module docstring)."""
    __tracebackhide__ = True
    if not isinstance(text, str):
        raise SLOError(f"an assertion must be a string like 'ttft.p99 < 200ms', got {text!r}")
    m = _ASSERT_RE.match(text)
    if not m:
        raise SLOError(
            f"cannot read assertion {text!r}: expected METRIC OP VALUE, e.g. 'ttft.p99 < 200ms' "
            f"(operators: {' '.join(sorted(OPERATORS, key=len))})"
        )
    metric, op, value = m.group("metric"), m.group("op"), m.group("value")
    if not _METRIC_RE.match(metric):
        raise SLOError(
            f"cannot read metric {metric!r} in {text!r}: write a dotted name such as ttft.p99, "
            "throughput.output_tok_s or decode.mbu"
        )
    if not value:
        raise SLOError(f"assertion {text!r} has no value after {op!r}, e.g. 'ttft.p99 < 200ms'")
    kind = metric_kind(metric)
    threshold = parse_value(value, kind, context=text)
    return Assertion(metric, op, threshold, f"{metric} {op} {value}", kind)


def _from_mapping_item(metric: str, limit: Any) -> Assertion:
    __tracebackhide__ = True
    if not _METRIC_RE.match(str(metric)):
        raise SLOError(f"cannot read metric {metric!r}: write a dotted name such as ttft.p99")
    if isinstance(limit, str):
        stripped = limit.strip()
        if stripped.startswith(("<", ">", "=", "!")):
            return parse_assertion(f"{metric} {stripped}")
        value_text: str = stripped
    elif isinstance(limit, int | float) and not isinstance(limit, bool):
        value_text = ""
    else:
        raise SLOError(f"limit for {metric!r} must be a string like '200ms' or a number")
    better = direction(metric)
    if better is None:
        raise SLOError(
            f"say how to compare {metric!r}: write e.g. {{'{metric}': '< {limit}'}} "
            "(its direction is not known)"
        )
    op = "<=" if better == "lower" else ">="
    if value_text:
        return parse_assertion(f"{metric} {op} {value_text}")
    kind = metric_kind(metric)
    return Assertion(metric, op, float(limit), f"{metric} {op} {format_value(limit, kind)}", kind)


def parse_assertions(*specs: Any) -> list[Assertion]:
    """Assertions from strings, :class:`Assertion` objects, ``{metric: limit}`` dicts
    (the limit is a ceiling for lower-is-better metrics and a floor for higher-is-better
    ones; ``"< 200ms"`` gives the operator explicitly) and lists of these."""
    __tracebackhide__ = True
    out: list[Assertion] = []
    for spec in specs:
        if isinstance(spec, Assertion):
            out.append(spec)
        elif isinstance(spec, str):
            out.append(parse_assertion(spec))
        elif isinstance(spec, Mapping):
            out.extend(_from_mapping_item(str(k), v) for k, v in spec.items())
        elif isinstance(spec, Iterable):
            out.extend(parse_assertions(*spec))
        else:
            raise SLOError(f"cannot read assertion {spec!r}: use a string like 'ttft.p99 < 200ms'")
    return out


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
    distribution: dict[str, Any] | None = None
    run_dirs: list[str] = field(default_factory=list)
    problem: str | None = None

    @property
    def metric(self) -> str:
        return self.assertion.metric

    @property
    def kind(self) -> str | None:
        return self.assertion.kind or (metric_kind(self.path) if self.path else None)

    def measured_text(self) -> str:
        if self.measured is None:
            return "n/a"
        text = format_value(self.measured, self.kind)
        if len(self.samples) > 1:
            each = " ".join(format_value(v, self.kind) for v in self.samples)
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
        kind = metric_kind(self.path.rsplit(".", 1)[0] + ".p50")
        parts = []
        if "count" in d:
            parts.append(f"n={format_value(d['count'], 'count')}")
        for key in ("min", "p50", "p90", "p95", "p99", "max", "mean", "std"):
            if key in d and d[key] is not None:
                parts.append(f"{key} {format_value(d[key], kind)}")
        if len(parts) < 2:
            return None
        return f"{self.path.rsplit('.', 1)[0]}: " + "  ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "expression": self.assertion.text,
            "metric": self.metric,
            "path": self.path,
            "op": self.assertion.op,
            "threshold": self.assertion.threshold,
            "measured": self.measured,
            "passed": self.passed,
            "stat": self.stat,
            "samples": self.samples,
            "problem": self.problem,
            "run_dirs": self.run_dirs,
        }


def _measure(
    target: Any, metric: str, stat: str, confidence: float, op: str | None
) -> tuple[str, float | None, str, list[float], dict[str, Any] | None]:
    """(path, value, stat label, samples, distribution) of ``metric`` on ``target``."""
    if stat not in ("median", "mean", "bound"):
        raise UsageError(f"unknown stat {stat!r}: use 'median', 'mean' or 'bound'")
    runs = _runs_of(target)
    summaries = [_summary_of(r) for r in runs]
    samples: list[float] = []
    path = ""
    for s in summaries:
        path, raw = resolve_metric(s, metric)
        value = _number_or_none(metric, path, raw, s)
        if value is not None:
            samples.append(value)
    parent_path = path.rsplit(".", 1)[0] if "." in path else ""
    agg = _summary_of(target)
    ok, parent = _get(agg, parent_path.split(".")) if parent_path else (False, None)
    distribution = dict(parent) if ok and isinstance(parent, Mapping) and "p50" in parent else None
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
        value = _bound(samples, side, confidence)
        label = f"{side} {confidence:.0%} bound of the mean of {n}"
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
    target = _load_if_path(target)
    dirs = _run_dirs(target)
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
    passed = bool(_OP_FUNCS[assertion.op](value, assertion.threshold))
    return Outcome(assertion, path, value, passed, label, samples, dist, dirs)


def _failure_message(outcomes: Sequence[Outcome], *, single: bool) -> str:
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


def _emit(target: Any, outcomes: Sequence[Outcome]) -> None:
    # Report to the pytest plugin when it is active (it records the outcomes per test for
    # its summary table, baselines and JSON report); a no-op everywhere else.
    plugin = sys.modules.get("perfscope.pytest_plugin")
    observe = getattr(plugin, "_observe", None)
    if observe is not None:
        observe(target, outcomes)


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
    run = _load_if_path(run)
    outcomes = [evaluate(run, a, stat=stat, confidence=confidence) for a in parsed]
    _emit(run, outcomes)
    if not all(o.passed for o in outcomes):
        raise PerfAssertionError(_failure_message(outcomes, single=False), outcomes)
    return outcomes


def measure(run: Any, metric: str, *, stat: str = "median", confidence: float = 0.95) -> float:
    """The value of ``metric`` on ``run`` (SI units); raises MetricNotFoundError."""
    path, value, _, _, _ = _measure(_load_if_path(run), metric, stat, confidence, "<")
    if value is None:
        raise MetricNotFoundError(f"{path} has no value in this run")
    return value


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
        kind = metric_kind(metric)
        if isinstance(other, str):
            assertion = parse_assertion(f"{metric} {op} {other}")
        elif isinstance(other, int | float) and not isinstance(other, bool):
            assertion = Assertion(
                metric, op, float(other), f"{metric} {op} {format_value(other, kind)}", kind
            )
        else:
            raise SLOError(
                f"compare {metric} with a string like '200ms' or a number, not {other!r}"
            )
        outcome = evaluate(self._target, assertion, stat=self._stat, confidence=self._confidence)
        _emit(self._target, [outcome])
        if not outcome.passed:
            raise PerfAssertionError(_failure_message([outcome], single=True), [outcome])
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
    return _MetricRef(_load_if_path(run), (), stat, confidence)


# --------------------------------------------------------------------------- noise-aware change


@dataclass
class Change:
    """How a metric moved between two sets of runs, judged against their noise.

    Attributes:
        metric: the metric name.
        before, after: medians over the repeats (SI units).
        change: relative change of the medians, ``(after - before) / |before|``.
        direction: ``lower``/``higher`` is better, or ``None``.
        tolerance: relative change allowed before it counts.
        noise: the relative half-width of the one-sided confidence interval of the
            difference of the medians (``None`` without two repeats on each side).
        significant: the difference of the medians exceeds that noise (``None`` if unknown).
        verdict: ``regressed``, ``improved``, ``unchanged``, ``within noise`` or ``changed``
            (a metric with no better direction).
    """

    metric: str
    before: float
    after: float
    change: float | None
    direction: str | None
    tolerance: float
    confidence: float
    noise: float | None
    significant: bool | None
    verdict: str
    before_samples: list[float] = field(default_factory=list)
    after_samples: list[float] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return self.verdict == "regressed"

    def describe(self) -> str:
        kind = metric_kind(self.metric)
        ch = "n/a" if self.change is None else f"{self.change * 100:+.1f}%"
        noise = "noise unknown" if self.noise is None else f"noise ±{self.noise * 100:.1f}%"
        return (
            f"{self.metric}: {format_value(self.before, kind)} → {format_value(self.after, kind)} "
            f"({ch}; tolerance {self.tolerance * 100:.0f}%, {noise}): {self.verdict}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "before": self.before,
            "after": self.after,
            "change": self.change,
            "direction": self.direction,
            "tolerance": self.tolerance,
            "confidence": self.confidence,
            "noise": self.noise,
            "significant": self.significant,
            "verdict": self.verdict,
            "before_samples": self.before_samples,
            "after_samples": self.after_samples,
        }


def _median_variance(samples: Sequence[float]) -> float:
    """Variance of the median of ``samples`` from a robust spread: sigma = 1.4826 * MAD
    (the normal-consistent median absolute deviation), var(median) = pi/2 * sigma^2 / n.
    One stalled repeat barely moves it, where it would dominate the sample variance."""
    med = statistics.median(samples)
    sigma = 1.4826 * statistics.median([abs(x - med) for x in samples])
    return math.pi / 2 * sigma**2 / len(samples)


def compare_samples(
    metric: str,
    before: Sequence[float],
    after: Sequence[float],
    *,
    tolerance: float = 0.0,
    confidence: float = 0.95,
    better: str | None = None,
) -> Change:
    """Judge the change of ``metric`` from ``before`` to ``after`` (per-repeat values).

    A change counts when the medians differ by more than ``tolerance`` (relative) and,
    with two or more samples on each side, by more than the noise: the one-sided
    ``confidence`` bound of the difference of the medians, with each median's spread
    estimated robustly from the median absolute deviation (so one stalled repeat does not
    hide a real change) and Welch's degrees of freedom. ``better`` defaults to
    :func:`direction` of the metric."""
    if not before or not after:
        raise UsageError(f"{metric}: nothing to compare (no values before or after)")
    better = better if better is not None else direction(metric)
    b_med, a_med = float(statistics.median(before)), float(statistics.median(after))
    if b_med != 0:
        rel: float | None = (a_med - b_med) / abs(b_med)
    else:
        rel = 0.0 if a_med == 0 else None
    noise: float | None = None
    significant: bool | None = None
    if len(before) >= 2 and len(after) >= 2:
        vb, va = _median_variance(before), _median_variance(after)
        nb, na = len(before), len(after)
        se = math.sqrt(vb + va)
        if se > 0:
            df = (vb + va) ** 2 / (vb**2 / (nb - 1) + va**2 / (na - 1))
            half = t_quantile(confidence, df) * se
        else:
            half = 0.0
        significant = abs(a_med - b_med) > half
        noise = half / abs(b_med) if b_med else None
    beyond = (abs(rel) > tolerance) if rel is not None else (a_med != b_med)
    if not beyond:
        verdict = "unchanged"
    elif significant is False:
        verdict = "within noise"
    elif better is None:
        verdict = "changed"
    else:
        worse = (a_med > b_med) if better == "lower" else (a_med < b_med)
        verdict = "regressed" if worse else "improved"
    return Change(
        metric,
        b_med,
        a_med,
        rel,
        better,
        tolerance,
        confidence,
        noise,
        significant,
        verdict,
        list(before),
        list(after),
    )


def _samples(target: Any, metric: str) -> list[float]:
    target = _load_if_path(target)
    if isinstance(target, RunSet):
        return target.values(metric)
    s = _summary_of(target)
    path, raw = resolve_metric(s, metric)
    value = _number_or_none(metric, path, raw, s)
    return [] if value is None else [value]


def compare_runs(
    before: Any,
    after: Any,
    metric: str,
    *,
    tolerance: str | float = "0%",
    confidence: float = 0.95,
) -> Change:
    """:func:`compare_samples` on two Runs or RunSets."""
    return compare_samples(
        metric,
        _samples(before, metric),
        _samples(after, metric),
        tolerance=parse_tolerance(tolerance),
        confidence=confidence,
    )


def assert_no_regression(
    before: Any,
    after: Any,
    *metrics: str,
    tolerance: str | float = "0%",
    confidence: float = 0.95,
) -> list[Change]:
    """Fail only when a metric got worse by more than ``tolerance`` *and* by more than the
    noise measured across the repeats (both sides need ``repeat >= 2``).

    ::

        base = perfscope.run(engine_a, repeat=5)
        new = perfscope.run(engine_b, repeat=5)
        perfscope.assert_no_regression(base, new, "ttft.p99", "throughput.output_tok_s")
    """
    __tracebackhide__ = True
    if not metrics:
        raise UsageError("name the metrics to compare, e.g. 'ttft.p99'")
    changes: list[Change] = []
    for metric in metrics:
        b, a = _samples(before, metric), _samples(after, metric)
        if len(b) < 2 or len(a) < 2:
            raise UsageError(
                f"{metric}: measuring noise needs at least 2 repeats on each side, got "
                f"{len(b)} and {len(a)}; run the workloads with repeat=3 or more"
            )
        changes.append(
            compare_samples(
                metric, b, a, tolerance=parse_tolerance(tolerance), confidence=confidence
            )
        )
    bad = [c for c in changes if c.regressed]
    if bad:
        lines = [f"perfscope: {len(bad)} of {len(changes)} metrics regressed beyond the noise"]
        lines += [f"  {c.describe()}" for c in changes]
        raise PerfAssertionError("\n".join(lines))
    return changes
