"""The metric catalogue: every metric's summary path, unit kind, better direction, label and
display format, plus the one unit parser and the one value formatter of perfscope.

Values live in SI units everywhere (seconds, bytes, FLOP, J, W, per-second rates, fractions);
units appear only when a value is read from text (:func:`parse_quantity`) or shown
(:func:`format_value`). Display picks the unit by magnitude and never uses exponent notation:
``2.84 s`` not ``2.84e+03 ms``, ``8.4 MB`` not ``0.00839 GB``, counts as integers.

Consumers (CLI tables, HTML report, dashboard, comparisons, sweeps, baselines, the pytest
grammar) read names, units, directions and formats from here; :func:`value_at` is the one
dotted getter, over a typed :class:`~perfscope.analysis.summary.Summary` or its JSON form.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from perfscope.errors import UsageError
from perfscope.units import MISSING, UNITS, Kind

__all__ = [
    "KINDS",
    "LATENCY_METRICS",
    "LATENCY_STATS",
    "METRICS",
    "NA",
    "UNITS",
    "Better",
    "Kind",
    "Metric",
    "better_of",
    "find_metric",
    "format_bytes",
    "format_change",
    "format_count",
    "format_duration_short",
    "format_metric",
    "format_number",
    "format_ratio",
    "format_seconds",
    "format_si",
    "format_value",
    "kind_of",
    "metric",
    "metrics",
    "parse_duration",
    "parse_quantity",
    "to_float",
    "unit_of",
    "value_at",
]

#: What a number measures, which decides its display unit:
#: ``seconds``; ``rate`` (per second, with a noun: tok/s, req/s); ``ratio`` (a fraction 0..1,
#: shown as %); ``percent`` (already 0..100); ``bytes``; ``flop``; ``flop_per_s``;
#: ``bytes_per_s``; ``intensity`` (FLOP/byte); ``joules``; ``watts``; ``joules_per_token``;
#: ``tokens_per_joule``; ``count`` (an integer); ``factor`` (a multiplier, 1.8x); ``number``.
KINDS: tuple[Kind, ...] = get_args(Kind)  # the one list lives in perfscope.units
#: ``lower`` or ``higher`` is better; ``None``: neither (a count, a configuration value).
Better = Literal["lower", "higher"] | None

#: The missing-value marker (:data:`perfscope.units.MISSING`).
NA = MISSING


@dataclass(frozen=True)
class Metric:
    """One metric of the summary.

    Attributes:
        name: short name users type (``ttft.p99``, ``output_tok_s``, ``decode.mbu``).
        path: dotted path in the summary (``latency.ttft.p99``).
        kind: unit kind (see :data:`Kind`); the stored value is in its SI unit.
        better: which direction is an improvement (``None``: neither).
        label: display label (``TTFT p99``).
        unit: noun of a ``rate`` (``tok/s``, ``req/s``); empty for other kinds.
    """

    name: str
    path: str
    kind: Kind
    better: Better
    label: str
    unit: str = ""

    def format(self, value: Any) -> str:
        """``value`` (SI) for display, unit chosen by magnitude."""
        return format_value(value, self.kind, unit=self.unit)

    def value(self, summary: Any) -> Any:
        """This metric's value in ``summary`` (typed or JSON form); ``None`` when absent."""
        return value_at(summary, self.path)


#: Latency metrics (seconds) and their display names, in display order.
LATENCY_METRICS: dict[str, str] = {
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL/chunk",
    "itl_per_token": "ITL/token",
    "e2e": "E2E",
    "ntpot": "E2E/token",
}
#: Statistics of each latency distribution, in display order.
LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99", "max", "min", "std")


def _build() -> tuple[Metric, ...]:
    out: list[Metric] = []
    for key, label in LATENCY_METRICS.items():
        out.append(Metric(f"{key}.count", f"latency.{key}.count", "count", None, f"{label} count"))
        for stat in LATENCY_STATS:
            better: Better = None if stat == "std" else "lower"
            out.append(
                Metric(
                    f"{key}.{stat}", f"latency.{key}.{stat}", "seconds", better, f"{label} {stat}"
                )
            )
    for stat in LATENCY_STATS:
        out.append(
            Metric(
                f"driver_lag.{stat}", f"driver_lag.{stat}", "seconds", "lower", f"driver lag {stat}"
            )
        )
    out += [
        Metric(
            "output_tok_s", "throughput.output_tok_s", "rate", "higher", "output tokens/s", "tok/s"
        ),
        Metric(
            "total_tok_s", "throughput.total_tok_s", "rate", "higher", "total tokens/s", "tok/s"
        ),
        Metric("req_s", "throughput.req_s", "rate", "higher", "requests/s", "req/s"),
        Metric("busy_s", "throughput.busy_s", "seconds", None, "engine busy time"),
        Metric(
            "busy_tok_s", "throughput.busy_tok_s", "rate", "higher", "tokens/s while busy", "tok/s"
        ),
        Metric("attainment", "goodput.attainment", "ratio", "higher", "SLO attainment"),
        Metric("goodput_req_s", "goodput.goodput_req_s", "rate", "higher", "goodput", "req/s"),
        Metric("good_requests", "goodput.good_requests", "count", "higher", "requests within SLOs"),
        Metric("window_s", "window_s", "seconds", None, "measured window"),
    ]
    for key, better in (
        ("requests", None),
        ("completed", "higher"),
        ("failed", "lower"),
        ("warmup", None),
        ("output_tokens", None),
        ("prompt_tokens", None),
    ):
        out.append(Metric(f"counts.{key}", f"counts.{key}", "count", better, key.replace("_", " ")))
    for phase in ("prefill", "decode"):
        base = f"roofline.phases.{phase}"
        for key, kind, better, label in (
            ("mfu", "ratio", "higher", "MFU"),
            ("mbu", "ratio", "higher", "MBU"),
            ("efficiency", "ratio", "higher", "efficiency"),
            ("intensity", "intensity", None, "intensity"),
            ("time_s", "seconds", "lower", "time"),
            ("time_per_step_s", "seconds", "lower", "time per step"),
            ("sol_time_s", "seconds", None, "speed-of-light time"),
            ("flops", "flop", None, "FLOPs"),
            ("bytes", "bytes", None, "bytes moved"),
            ("achieved_flops_s", "flop_per_s", "higher", "achieved FLOP/s"),
            ("achieved_bytes_s", "bytes_per_s", "higher", "achieved bandwidth"),
            ("working_set_bytes", "bytes", None, "working set"),
            ("batch_size_mean", "number", None, "mean batch"),
            ("steps", "count", None, "steps"),
        ):
            out.append(
                Metric(f"{phase}.{key}", f"{base}.{key}", kind, better, f"{phase} {label}")  # type: ignore[arg-type]
            )
        out.append(
            Metric(
                f"energy.{phase}.energy_j",
                f"energy.phases.{phase}.energy_j",
                "joules",
                "lower",
                f"{phase} energy",
            )
        )
        out.append(
            Metric(
                f"energy.{phase}.j_per_token",
                f"energy.phases.{phase}.j_per_token",
                "joules_per_token",
                "lower",
                f"{phase} energy per token",
            )
        )
        out.append(
            Metric(
                f"steps.{phase}.time_s",
                f"steps.{phase}.time_s",
                "seconds",
                "lower",
                f"{phase} step time",
            )
        )
        out.append(
            Metric(
                f"steps.{phase}.mean_step_s",
                f"steps.{phase}.mean_step_s",
                "seconds",
                "lower",
                f"{phase} mean step",
            )
        )
    out += [
        Metric("energy.total_j", "energy.total_j", "joules", "lower", "energy"),
        Metric(
            "j_per_token",
            "energy.j_per_output_token",
            "joules_per_token",
            "lower",
            "energy per output token",
        ),
        Metric("tokens_per_j", "energy.tokens_per_j", "tokens_per_joule", "higher", "tokens per J"),
        Metric("avg_power_w", "energy.avg_power_w", "watts", None, "average power"),
        Metric("peak_power_w", "energy.power.peak_w", "watts", None, "peak power"),
        Metric("idle_baseline_w", "energy.idle_baseline_w", "watts", None, "idle power"),
        Metric("dynamic_energy_j", "energy.dynamic_energy_j", "joules", "lower", "dynamic energy"),
    ]
    return tuple(out)


#: Every metric of the summary, by short name.
METRICS: tuple[Metric, ...] = _build()
_BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
_BY_PATH: dict[str, Metric] = {m.path: m for m in METRICS}


def find_metric(name: str) -> Metric | None:
    """The metric with short name or summary path ``name``, or ``None``."""
    return _BY_NAME.get(name) or _BY_PATH.get(name)


def metric(name: str) -> Metric:
    """The metric with short name or summary path ``name``.

    Raises:
        UsageError: not in the catalogue (the message names a few close ones).
    """
    m = find_metric(name)
    if m is None:
        head = name.split(".")[0]
        close = [n for n in _BY_NAME if n.startswith(head)][:6]
        hint = f"; did you mean: {', '.join(close)}?" if close else ""
        raise UsageError(f"unknown metric {name!r}{hint}")
    return m


def metrics(names: Iterable[str]) -> list[Metric]:
    """:func:`metric` of each name, in order."""
    return [metric(n) for n in names]


# ---------------------------------------------------------------------- any summary path

_STAT_RE = re.compile(r"^(?:mean|std|min|max|median|p[0-9]+(?:_[0-9]+)?)$")
_LATENCY_BASES = (*LATENCY_METRICS, "driver_lag")
_RATIOS = ("attainment", "mfu", "mfu_useful", "mbu", "mbu_dram", "efficiency", "share")
_NEUTRAL = ("window_s", "busy_s", "time_share", "requests", "output_tokens", "prompt_tokens")
_SUFFIX_KINDS: tuple[tuple[str, Kind], ...] = (
    ("tok_s", "rate"),
    ("req_s", "rate"),
    ("bytes_s", "bytes_per_s"),
    ("flops_s", "flop_per_s"),
    ("_s", "seconds"),
    ("_j", "joules"),
    ("_w", "watts"),
    ("bytes", "bytes"),
    ("flops", "flop"),
)


def kind_of(path: str) -> Kind | None:
    """The unit kind of any summary path: the catalogue's entry, else read from the name
    (``*_s`` seconds, ``*_tok_s`` rate, ``*_bytes`` bytes, ``mfu`` ratio, ``*_pct`` percent,
    ...); ``None`` when the name says nothing."""
    m = find_metric(path)
    if m is not None:
        return m.kind
    parts = path.split(".")
    leaf = parts[-1]
    if leaf == "count":
        return "count"
    base = parts[-2] if _STAT_RE.match(leaf) and len(parts) > 1 else leaf
    if base in _RATIOS or "per_slo" in parts[:-1] or base.endswith("_share"):
        return "ratio"
    if base in _LATENCY_BASES:
        return "seconds"
    if base.endswith("_pct") or "_pct_of_" in base:
        return "percent"
    if base.startswith("j_per_"):
        return "joules_per_token"
    if base.startswith(("tokens_per_j", "tok_per_j")):
        return "tokens_per_joule"
    for suffix, kind in _SUFFIX_KINDS:
        if base.endswith(suffix) or base == suffix.lstrip("_"):
            return kind
    if parts[0] == "counts":
        return "count"
    return None


def better_of(path: str) -> Better:
    """Which direction is better for any summary path: the catalogue's entry, else from its
    kind (latency, energy, power: lower; rates, ratios: higher); ``None`` when neither."""
    m = find_metric(path)
    if m is not None:
        return m.better
    parts = path.split(".")
    leaf = parts[-1]
    base = parts[-2] if _STAT_RE.match(leaf) and len(parts) > 1 else leaf
    if base in _NEUTRAL or leaf in _NEUTRAL or leaf == "count":
        return None
    if base in ("failed", "errors") or leaf == "std":
        return "lower"
    kind = kind_of(path)
    if kind in ("seconds", "joules_per_token", "joules", "watts"):
        return "lower"
    if kind in ("rate", "tokens_per_joule", "flop_per_s", "bytes_per_s", "ratio"):
        return "higher"
    if base in ("completed", "good_requests"):
        return "higher"
    return None


def unit_of(path: str) -> str:
    """The noun of a ``rate`` path (``tok/s``, ``req/s``): the catalogue's entry, else read
    from the name (``*_tok_s``, ``*_req_s``); empty for other kinds or when unknown."""
    m = find_metric(path)
    if m is not None:
        return m.unit
    if kind_of(path) != "rate":
        return ""
    parts = path.split(".")
    base = parts[-2] if _STAT_RE.match(parts[-1]) and len(parts) > 1 else parts[-1]
    if base.endswith("tok_s"):
        return "tok/s"
    if base.endswith("req_s"):
        return "req/s"
    return ""


# ---------------------------------------------------------------------- the dotted getter


def value_at(tree: Any, path: str | Iterable[str], default: Any = None) -> Any:
    """The value at dotted ``path`` (``"latency.ttft.p99"``) in a typed summary record or a
    JSON-form mapping; ``default`` when any step is missing (a stored ``None`` is returned as
    ``None``, so ``default=`` tells "absent" from "present without a value")."""
    parts = path.split(".") if isinstance(path, str) else path
    node = tree
    for part in parts:
        if type(node) is dict:  # JSON as parsed: skips the slower ABC check below
            if part not in node:
                return default
            node = node[part]
            continue
        if isinstance(node, Mapping):
            if part not in node:
                return default
            node = node[part]
            continue
        if node is not None and hasattr(type(node), "__dataclass_fields__"):
            if part in node.__dataclass_fields__:
                node = getattr(node, part)
                continue
            extra = getattr(node, "extra", None)
            if isinstance(extra, Mapping) and part in extra:
                node = extra[part]
                continue
        return default
    return node


def to_float(x: Any) -> float | None:
    """``x`` as a finite float, or ``None`` (missing, bool, text, NaN, inf)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


# ---------------------------------------------------------------------- formatting


def format_number(x: Any, digits: int = 3) -> str:
    """``x`` with about ``digits`` significant digits, fixed-point with thousands separators
    (``1,234``, ``12.3``, ``0.0123``), never exponent notation."""
    v = to_float(x)
    if v is None:
        return NA
    if v == 0:
        return "0"
    mag = math.floor(math.log10(abs(v)))
    decimals = max(0, digits - 1 - mag)
    text = f"{v:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


_SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_si(x: Any, unit: str = "", digits: int = 3) -> str:
    """``3.2e12, "FLOP/s"`` → ``"3.2 TFLOP/s"`` (k, M, G, T, P prefixes)."""
    v = to_float(x)
    if v is None:
        return NA
    for factor, prefix in _SI_PREFIXES:
        if abs(v) >= factor:
            return f"{format_number(v / factor, digits)} {prefix}{unit}".rstrip()
    return f"{format_number(v, digits)} {unit}".rstrip()


def format_bytes(x: Any) -> str:
    """Bytes with decimal prefixes: ``8.4 MB``, ``1.5 GB``, ``512 B``."""
    return format_si(x, "B")


def format_seconds(x: Any, digits: int = 3) -> str:
    """Seconds in the unit its magnitude asks for: ``2.84 s``, ``12.3 ms``, ``850 µs``,
    ``40 ns``; durations of a minute or more stay in seconds (``3,600 s``)."""
    v = to_float(x)
    if v is None:
        return NA
    a = abs(v)
    if a == 0:
        return "0 s"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if a >= factor:
            return f"{format_number(v / factor, digits)} {unit}"
    return f"{format_number(v / 1e-9, digits)} ns"


def format_ratio(x: Any) -> str:
    """A fraction as a percentage, 3 significant digits (2 below 1%): ``0.4213`` → ``42.1%``,
    ``0.5`` → ``50%``, ``0.00061`` → ``0.061%``."""
    v = to_float(x)
    if v is None:
        return NA
    p = 100.0 * v
    return f"{format_number(p, 3 if abs(p) >= 1 else 2)}%"


def format_change(x: Any) -> str:
    """A relative change with its sign: ``0.125`` → ``+12.5%``, ``-0.03`` → ``-3%``."""
    v = to_float(x)
    if v is None:
        return NA
    return ("+" if v > 0 else "") + format_ratio(v)


def format_count(x: Any) -> str:
    """An integer with thousands separators (``12,345``)."""
    v = to_float(x)
    if v is None:
        return NA
    return f"{round(v):,}"


def format_duration_short(seconds: float) -> str:
    """SLO-style compact duration: ``0.2`` → ``200ms``, ``1.5`` → ``1.5s``."""
    text = format_seconds(seconds, digits=4)
    # Compact and readable back by parse_duration: no spaces, no thousands separators.
    return text.replace(" ", "").replace(",", "")


def format_value(value: Any, kind: Kind, *, unit: str = "") -> str:
    """``value`` (SI) shown for its unit kind; ``"n/a"`` for missing or non-finite."""
    if kind == "seconds":
        return format_seconds(value)
    if kind == "ratio":
        return format_ratio(value)
    if kind == "count":
        return format_count(value)
    v = to_float(value)
    if v is None:
        return NA
    if kind == "rate":
        return f"{format_number(v)} {unit or '/s'}".replace(" /s", "/s")
    if kind == "percent":
        return f"{format_number(v)}%"
    if kind == "bytes":
        return format_bytes(v)
    if kind == "flop":
        return format_si(v, "FLOP")
    if kind == "flop_per_s":
        return format_si(v, "FLOP/s")
    if kind == "bytes_per_s":
        return format_si(v, "B/s")
    if kind == "intensity":
        return f"{format_number(v)} FLOP/B"
    if kind == "joules":
        return format_si(v, "J") if abs(v) >= 1 or v == 0 else f"{format_number(v * 1e3)} mJ"
    if kind == "watts":
        return format_si(v, "W")
    if kind == "joules_per_token":
        return (
            f"{format_number(v)} J/token" if abs(v) >= 1 else f"{format_number(v * 1e3)} mJ/token"
        )
    if kind == "tokens_per_joule":
        return f"{format_number(v)} tok/J"
    if kind == "factor":
        return f"{format_number(v)}x"
    return format_number(v)


def format_metric(value: Any, path: str) -> str:
    """``value`` (SI) shown as the metric at summary ``path`` is shown (kind and rate noun
    from :func:`kind_of` and :func:`unit_of`; a plain number when the name says nothing)."""
    return format_value(value, kind_of(path) or "number", unit=unit_of(path))


# ---------------------------------------------------------------------- parsing


_QUANTITY = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([^\s0-9][^\s]*)?\s*$")


_RATE_NOUNS = {"tok/s": "tok/s", "tokens/s": "tok/s", "ktok/s": "tok/s", "req/s": "req/s"}


def parse_quantity(
    text: str, *, kind: Kind | None = None, unit: str = ""
) -> tuple[float, Kind | None]:
    """``"200ms"`` → ``(0.2, "seconds")``; ``"8.4 MB"`` → ``(8.4e6, "bytes")``; a bare number
    → ``(value, None)``.

    Args:
        kind: when given, the unit must be of this kind (a bare number is taken as SI).
        unit: for ``rate`` metrics, the metric's noun (``tok/s``): ``req/s`` is refused.

    Raises:
        UsageError: not a number with a known unit, or a unit of another kind.
    """
    m = _QUANTITY.match(text)
    if not m:
        raise UsageError(f"cannot read {text!r}: write a number with a unit, e.g. 200ms, 8 GB")
    value = float(m.group(1))
    written = m.group(2)
    if not math.isfinite(value):
        raise UsageError(f"{text.strip()!r} is too large to be a limit or a measurement")
    if written is None:
        return value, kind
    found = UNITS.get(written.lower())
    if found is None:
        raise UsageError(
            f"unknown unit {written!r} in {text!r}: use one of {', '.join(sorted(UNITS))}"
        )
    unit_kind, factor = found
    if kind == "percent" and written == "%":
        return value, kind
    if kind is not None and unit_kind != kind:
        raise UsageError(f"{text!r} is not a {kind.replace('_', ' ')} value")
    noun = _RATE_NOUNS.get(written.lower())
    if unit_kind == "rate" and unit and noun and noun != unit:
        raise UsageError(f"{text!r} is in {noun}, this metric is in {unit}")
    if not math.isfinite(value * factor):
        raise UsageError(f"{text.strip()!r} is too large to be a limit or a measurement")
    return value * factor, unit_kind


def parse_duration(text: str) -> float:
    """``"200ms"`` → 0.2 (seconds). A unit (ns, us, µs, ms, s) is required.

    Raises:
        UsageError: no unit, or not a duration.
    """
    m = _QUANTITY.match(text)
    unit = UNITS.get(m.group(2).lower()) if m and m.group(2) else None
    if unit is None or unit[0] != "seconds":
        raise UsageError(
            f"cannot read duration {text!r}: write a number with a unit, e.g. 200ms, 1.5s, 800us"
        )
    return parse_quantity(text, kind="seconds")[0]
