"""Datasheet units in device files, read through the one unit table (:mod:`perfscope.units`).

A device file's quantity is in one *dimension* (``flops``, ``bandwidth``, ``bytes``, ``power``,
``time``, ``count``); each maps to a kind of the unit table, which holds the spellings and the
factors to SI (``"3.35 TB/s"`` → 3.35e12 bytes/s).
"""

from __future__ import annotations

from typing import Literal

from perfscope.units import Kind, factor_of

__all__ = ["DIMENSION_SI_UNIT", "Dimension", "to_si"]

Dimension = Literal["flops", "bandwidth", "bytes", "power", "time", "count"]

#: The unit table's kind of each dimension.
_KIND: dict[Dimension, Kind] = {
    "flops": "flop_per_s",
    "bandwidth": "bytes_per_s",
    "bytes": "bytes",
    "power": "watts",
    "time": "seconds",
    "count": "count",
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
    try:
        return float(value) * factor_of(unit, _KIND[dimension])
    except ValueError:
        from perfscope.units import units_of

        raise ValueError(
            f"unit {unit!r} is not a {dimension} unit "
            f"(accepted: {', '.join(units_of(_KIND[dimension]))})"
        ) from None
