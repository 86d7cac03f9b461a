"""SLOs and durations as users type them: ``ttft=200ms``, ``tpot=50ms``, ``e2e=5s``."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from perfscope.errors import SLOError

__all__ = ["SLO_METRICS", "format_duration", "parse_duration", "parse_slos"]

#: Per-request metrics an SLO can bound (each in seconds).
SLO_METRICS = ("ttft", "tpot", "e2e", "ntpot")

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*$")


def parse_duration(text: str) -> float:
    """``"200ms"`` → 0.2 (seconds). A unit (ns, us, ms, s) is required."""
    m = _DURATION.match(text)
    if not m:
        raise SLOError(
            f"cannot read duration {text!r}: write a number with a unit, e.g. 200ms, 1.5s, 800us"
        )
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(seconds):
        raise SLOError(f"duration {text.strip()!r} is too large to be a time")
    return seconds


def parse_slos(items: Iterable[str]) -> dict[str, float]:
    """``["ttft=200ms", "tpot=50ms"]`` → ``{"ttft": 0.2, "tpot": 0.05}``.

    Each item may also hold several comma-separated SLOs (``ttft=200ms,e2e=5s``).
    """
    out: dict[str, float] = {}
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if not sep:
                raise SLOError(f"cannot read SLO {part!r}: write METRIC=DURATION, e.g. ttft=200ms")
            if key not in SLO_METRICS:
                raise SLOError(
                    f"unknown SLO metric {key!r} in {part!r}: use one of {', '.join(SLO_METRICS)}"
                )
            seconds = parse_duration(value)
            if seconds <= 0:
                raise SLOError(f"SLO {part!r} must be a positive duration")
            out[key] = seconds
    return out


def format_duration(seconds: float) -> str:
    """Short human form: ``0.2`` → ``"200ms"``."""
    if seconds >= 1:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:g}us"
    return f"{seconds * 1e9:g}ns"
