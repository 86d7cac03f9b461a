"""The assertion grammar: metric names, their kinds and better directions, values with
units, and ``METRIC OP VALUE`` expressions.

- ``METRIC`` is a dotted path into the run's summary.json. It is looked up from the top
  (``throughput.output_tok_s``), then under ``latency`` (``ttft.p99``), then as the unique
  path of the summary that ends with it (``decode.mbu`` → ``roofline.phases.decode.mbu``)
  or that holds its words in order (``roofline.decode.mbu``).
- ``OP`` is one of ``< <= > >= == !=``.
- ``VALUE`` is a number with an optional unit: durations ``ns us ms s`` (a duration metric
  needs one), ``%`` (95% = 0.95; on ``*_pct`` metrics 95% = 95), ``tok/s``, ``req/s``,
  ``J/tok``, ``J``, ``W``, ``B``/``GB``, ``GB/s``, ``TFLOPS``, ``x``. Values are converted
  to the summary's SI units (seconds, tokens/s, fractions, ...). Nothing is ever ``eval``-ed.

Grammar errors raise :class:`perfscope.errors.SLOError` before anything is evaluated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfscope.errors import SLOError

__all__ = [
    "OPERATORS",
    "Assertion",
    "MetricNotFoundError",
    "compare_op",
    "direction",
    "format_value",
    "get_path",
    "is_metric_name",
    "metric_kind",
    "number_or_none",
    "parse_assertion",
    "parse_assertions",
    "parse_tolerance",
    "parse_value",
    "resolve_metric",
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
    if not math.isfinite(number):
        raise SLOError(f"value {text!r}{where} is too large: a limit must be a finite number")
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


def get_path(tree: Any, parts: Sequence[str]) -> tuple[bool, Any]:
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
        ok, value = get_path(summary, (*prefix, *parts))
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
        return ".".join(path), get_path(summary, path)[1]
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
            ok, node = get_path(summary, full[:i])
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


def number_or_none(name: str, path: str, value: Any, summary: Mapping[str, Any]) -> float | None:
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


# --------------------------------------------------------------------------- expressions


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


def compare_op(op: str, measured: float, threshold: float) -> bool:
    """Whether ``measured OP threshold`` holds."""
    return bool(_OP_FUNCS[op](measured, threshold))


def is_metric_name(name: str) -> bool:
    """Whether ``name`` is a dotted metric name (``ttft.p99``)."""
    return bool(_METRIC_RE.match(name))
