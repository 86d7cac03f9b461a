"""Display formatting shared by the figures, the HTML report and the comparison.

Values arrive in SI base units (seconds, FLOP, bytes, joules); these helpers only choose the
unit shown. ``None`` and non-finite numbers render as ``"n/a"``.
"""

from __future__ import annotations

import html
import math
from typing import Any

__all__ = ["esc", "fmt_bytes", "fmt_count", "fmt_num", "fmt_pct", "fmt_rate", "fmt_si", "fmt_time"]

NA = "n/a"


def finite(x: Any) -> float | None:
    """``x`` as a finite float, or ``None`` (missing, bool, text, NaN, inf)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def esc(text: Any) -> str:
    """HTML-escape any value (quotes too), for text and attribute positions alike."""
    return html.escape("" if text is None else str(text), quote=True)


def fmt_time(seconds: Any) -> str:
    """``0.0123`` → ``"12.3 ms"``; picks s, ms or µs."""
    v = finite(seconds)
    if v is None:
        return NA
    a = abs(v)
    if a >= 1:
        return f"{v:.3g} s" if a < 100 else f"{v:.0f} s"
    if a >= 1e-3:
        return f"{v * 1e3:.3g} ms"
    if a == 0:
        return "0 ms"
    return f"{v * 1e6:.3g} µs"


def fmt_pct(fraction: Any) -> str:
    """``0.4213`` → ``"42.1%"``."""
    v = finite(fraction)
    if v is None:
        return NA
    p = 100.0 * v
    if abs(p) >= 10:
        return f"{p:.1f}%"
    return f"{p:.2g}%"


def fmt_si(x: Any, unit: str = "") -> str:
    """``3.2e12, "FLOP/s"`` → ``"3.2 TFLOP/s"`` (k, M, G, T, P prefixes)."""
    v = finite(x)
    if v is None:
        return NA
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= factor:
            return f"{v / factor:.3g} {prefix}{unit}".rstrip()
    return f"{v:.3g} {unit}".rstrip()


def fmt_bytes(x: Any) -> str:
    """Bytes with decimal prefixes (``1.5 GB``)."""
    return fmt_si(x, "B")


def fmt_rate(x: Any, unit: str) -> str:
    """``50.123, "tok/s"`` → ``"50.1 tok/s"``."""
    v = finite(x)
    if v is None:
        return NA
    if abs(v) >= 1000:
        return f"{v:,.0f} {unit}"
    return f"{v:.3g} {unit}"


def fmt_num(x: Any, digits: int = 3) -> str:
    """A number with ``digits`` significant digits."""
    v = finite(x)
    if v is None:
        return NA
    return f"{v:.{digits}g}"


def fmt_count(x: Any) -> str:
    """An integer with thousands separators."""
    v = finite(x)
    if v is None:
        return NA
    return f"{round(v):,}"
