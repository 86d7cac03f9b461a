"""Display formatting of the figures, the HTML report and the comparison.

Every helper is the metric catalogue's formatter (:mod:`perfscope.analysis.catalogue`) under
the short name the presentation code uses, plus HTML escaping. Values arrive in SI base units;
``None`` and non-finite numbers render as ``"n/a"``; no exponent notation.
"""

from __future__ import annotations

import html
from typing import Any

from perfscope.analysis.catalogue import (
    NA,
    format_bytes,
    format_count,
    format_number,
    format_ratio,
    format_seconds,
    format_si,
    format_value,
    to_float,
)

__all__ = [
    "NA",
    "esc",
    "finite",
    "fmt_bytes",
    "fmt_count",
    "fmt_num",
    "fmt_pct",
    "fmt_rate",
    "fmt_si",
    "fmt_time",
]

finite = to_float
fmt_time = format_seconds
fmt_pct = format_ratio
fmt_si = format_si
fmt_bytes = format_bytes
fmt_num = format_number
fmt_count = format_count


def esc(text: Any) -> str:
    """HTML-escape any value (quotes too), for text and attribute positions alike."""
    return html.escape("" if text is None else str(text), quote=True)


def fmt_rate(x: Any, unit: str) -> str:
    """``50.123, "tok/s"`` → ``"50.1 tok/s"``."""
    return format_value(x, "rate", unit=unit)
