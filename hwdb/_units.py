"""Datasheet units accepted in device files and their factors to SI base units.

Decimal prefixes are taken literally (``MB`` = 1e6 bytes, ``GB/s`` = 1e9 bytes/s); binary
ones are spelled with ``i`` (``MiB``, ``GiB``). Datasheets print cache sizes as "MB" even
when the hardware size is a power of two; the difference (under 5 %) is irrelevant to a
roofline, and converting what the datasheet says keeps every value checkable.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["DIMENSION_SI_UNIT", "UNITS", "Dimension", "to_si"]

Dimension = Literal["flops", "bandwidth", "bytes", "power", "time", "count"]

#: unit spelling (lowercase) → (dimension, factor to SI)
UNITS: dict[str, tuple[Dimension, float]] = {
    # throughput: FLOP/s (integer ops counted the same way)
    "flops": ("flops", 1.0),
    "gflops": ("flops", 1e9),
    "tflops": ("flops", 1e12),
    "pflops": ("flops", 1e15),
    "ops": ("flops", 1.0),
    "gops": ("flops", 1e9),
    "tops": ("flops", 1e12),
    "pops": ("flops", 1e15),
    # bandwidth: bytes/s
    "b/s": ("bandwidth", 1.0),
    "mb/s": ("bandwidth", 1e6),
    "gb/s": ("bandwidth", 1e9),
    "gbps": ("bandwidth", 1e9),  # Google's "GBps" = gigabytes per second
    "tb/s": ("bandwidth", 1e12),
    "mib/s": ("bandwidth", 2.0**20),
    "gib/s": ("bandwidth", 2.0**30),
    "gibps": ("bandwidth", 2.0**30),
    "tib/s": ("bandwidth", 2.0**40),
    "gbit/s": ("bandwidth", 1e9 / 8),
    # sizes: bytes
    "b": ("bytes", 1.0),
    "kb": ("bytes", 1e3),
    "mb": ("bytes", 1e6),
    "gb": ("bytes", 1e9),
    "tb": ("bytes", 1e12),
    "kib": ("bytes", 2.0**10),
    "mib": ("bytes", 2.0**20),
    "gib": ("bytes", 2.0**30),
    "tib": ("bytes", 2.0**40),
    # power: watts
    "w": ("power", 1.0),
    "kw": ("power", 1e3),
    # time: seconds (collective latencies)
    "s": ("time", 1.0),
    "ms": ("time", 1e-3),
    "us": ("time", 1e-6),
    "ns": ("time", 1e-9),
}

#: SI unit name per dimension, for display.
DIMENSION_SI_UNIT: dict[Dimension, str] = {
    "flops": "FLOP/s",
    "bandwidth": "B/s",
    "bytes": "B",
    "power": "W",
    "time": "s",
    "count": "",
}


def to_si(value: float, unit: str, dimension: Dimension) -> float:
    """Convert ``value`` given in ``unit`` to the SI base unit of ``dimension``.

    Raises:
        ValueError: the unit is unknown or belongs to another dimension; the message lists
            the accepted spellings.
    """
    if dimension == "count":
        return float(value)
    entry = UNITS.get(unit.strip().lower())
    if entry is None or entry[0] != dimension:
        accepted = sorted(u for u, (d, _) in UNITS.items() if d == dimension)
        raise ValueError(
            f"unit {unit!r} is not a {dimension} unit (accepted: {', '.join(accepted)})"
        )
    return float(value) * entry[1]
