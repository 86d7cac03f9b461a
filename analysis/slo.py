"""SLOs and durations as users type them: ``ttft=200ms``, ``tpot=50ms``, ``e2e=5s``."""

from __future__ import annotations

from collections.abc import Iterable

from perfscope.analysis import catalogue
from perfscope.errors import SLOError, UsageError

__all__ = ["SLO_METRICS", "format_duration", "parse_duration", "parse_slos"]

#: Per-request metrics an SLO can bound (each in seconds).
SLO_METRICS = ("ttft", "tpot", "e2e", "ntpot")


def parse_duration(text: str) -> float:
    """``"200ms"`` → 0.2 (seconds). A unit (ns, us, ms, s) is required."""
    try:
        return catalogue.parse_duration(text)
    except UsageError as exc:
        raise SLOError(str(exc)) from None


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
    return catalogue.format_duration_short(seconds)
