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

from perfscope.analysis.catalogue import (
    UNITS,
    Kind,
    better_of,
    format_metric,
    kind_of,
    parse_quantity,
    unit_of,
    value_at,
)
from perfscope.errors import SLOError, UsageError

__all__ = [
    "OPERATORS",
    "Assertion",
    "MetricNotFoundError",
    "compare_op",
    "is_metric_name",
    "number_or_none",
    "parse_assertion",
    "parse_assertions",
    "parse_limit",
    "parse_tolerance",
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

# --------------------------------------------------------------------------- values

#: What a value of each catalogue kind is, and how to write one, for error messages.
_KIND_WORDS: dict[str, str] = {
    "seconds": "a duration (write ns, us, ms or s)",
    "ratio": "a fraction (write 0.95 or 95%)",
    "percent": "a percentage (write 95 or 95%)",
    "joules_per_token": "energy per token (write J/tok)",
    "tokens_per_joule": "tokens per joule (write tok/J)",
    "joules": "an energy (write J)",
    "watts": "a power (write W)",
    "bytes": "a size (write B, MB or GB)",
    "bytes_per_s": "a bandwidth (write GB/s)",
    "flop": "a FLOP count",
    "flop_per_s": "a FLOP rate (write TFLOPS)",
    "count": "a count (write a plain number)",
    "intensity": "an arithmetic intensity (a plain number of FLOP/B)",
    "factor": "a factor (write 2x or a plain number)",
    "number": "a plain number",
}
_RATE_WORDS = {"tok/s": "a token rate (write tok/s)", "req/s": "a request rate (write req/s)"}
_NUMBER = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_VALUE_RE = re.compile(rf"^\s*({_NUMBER})\s*(%|[A-Za-zµ/]+)?\s*$")
_METRIC_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*$")
_ASSERT_RE = re.compile(
    r"^\s*(?P<metric>[^<>=!\s]+)\s*(?P<op><=|>=|==|!=|<|>)\s*(?P<value>.*?)\s*$"
)


def _kind_words(kind: Kind, unit: str) -> str:
    if kind == "rate":
        return _RATE_WORDS.get(unit, "a rate (write tok/s or req/s)")
    return _KIND_WORDS.get(kind, kind.replace("_", " "))


def parse_limit(text: str, metric: str | None = None, *, context: str | None = None) -> float:
    """A limit for ``metric`` in SI units: ``"200ms"`` → 0.2, ``"95%"`` → 0.95 (95 on a
    ``*_pct`` metric). Units, kinds and rate nouns are the catalogue's
    (:data:`~perfscope.analysis.catalogue.UNITS`, :func:`kind_of`, :func:`unit_of`); a unit
    of another kind is an error, and a duration metric needs a unit. ``metric=None``
    accepts any unit.

    Raises:
        SLOError: not a number with a known unit, or a unit that does not fit the metric.
    """
    __tracebackhide__ = True
    kind = kind_of(metric) if metric else None
    noun = unit_of(metric) if metric else ""
    where = f" in {context!r}" if context else ""
    m = _VALUE_RE.match(text)
    if not m:
        raise SLOError(
            f"cannot read value {text!r}{where}: expected a number with an optional unit, "
            "e.g. 200ms, 95%, 1200 tok/s, 0.3"
        )
    number, written = float(m.group(1)), m.group(2)
    if not math.isfinite(number):
        raise SLOError(f"value {text!r}{where} is too large: a limit must be a finite number")
    if written is None:
        if kind == "seconds":
            raise SLOError(
                f"value {text!r}{where} needs a unit: the metric is a duration "
                f"(write e.g. {m.group(1)}ms or {m.group(1)}s)"
            )
        return number
    found = UNITS.get(written.lower())
    if found is None:
        known = "ns us ms s, %, tok/s, req/s, J/tok, J, W, GB, GB/s, TFLOPS, x"
        raise SLOError(f"unknown unit {written!r} in value {text!r}{where}: use one of {known}")
    unit_kind = found[0]
    if written == "%":
        if kind == "percent":
            return number
        if kind not in (None, "ratio", "number", "factor"):
            raise SLOError(f"value {text!r}{where}: '%' does not fit {_kind_words(kind, noun)}")
    elif kind is not None and unit_kind not in (kind, "factor"):
        raise SLOError(f"value {text!r}{where}: the metric is {_kind_words(kind, noun)}")
    try:
        value, _ = parse_quantity(m.group(0), unit=noun)
    except UsageError as exc:
        raise SLOError(f"value {text!r}{where}: {exc}") from None
    return value


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


# --------------------------------------------------------------------------- lookup


class MetricNotFoundError(LookupError):
    """The metric is not in the run's summary (or has no value there)."""


_ABSENT = object()


def _lookup(tree: Any, parts: Sequence[str]) -> tuple[bool, Any]:
    """(found, value) of ``parts`` in ``tree`` through the catalogue's getter."""
    value = value_at(tree, parts, default=_ABSENT)
    return (False, None) if value is _ABSENT else (True, value)


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
        ok, value = _lookup(summary, (*prefix, *parts))
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
        return ".".join(path), _lookup(summary, path)[1]
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
            ok, node = _lookup(summary, full[:i])
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
    """One parsed assertion: ``metric op threshold`` (threshold in SI units).

    ``kind`` is the metric's catalogue unit kind (:func:`kind_of`), ``None`` when unknown.
    """

    metric: str
    op: str
    threshold: float
    text: str
    kind: Kind | None

    def threshold_text(self) -> str:
        """The threshold as the catalogue shows the metric (``200 ms``, ``95%``)."""
        return format_metric(self.threshold, self.metric)

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
    threshold = parse_limit(value, metric, context=text)
    return Assertion(metric, op, threshold, f"{metric} {op} {value}", kind_of(metric))


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
    better = better_of(metric)
    if better is None:
        raise SLOError(
            f"say how to compare {metric!r}: write e.g. {{'{metric}': '< {limit}'}} "
            "(its direction is not known)"
        )
    op = "<=" if better == "lower" else ">="
    if value_text:
        return parse_assertion(f"{metric} {op} {value_text}")
    text = f"{metric} {op} {format_metric(limit, metric)}"
    return Assertion(metric, op, float(limit), text, kind_of(metric))


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
