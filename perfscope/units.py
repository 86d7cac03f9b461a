"""The one unit table: unit text → (kind, factor to SI), its parser, and the missing marker.

On the ground floor beside :mod:`perfscope.errors`: every stage may import it. The hardware
database reads datasheet units with it (``"3.35 TB/s"`` in a device file), the analysis
catalogue parses SLOs, expectations and baselines with it (``"200ms"``, ``"8 GB"``) and
formats values for their kind, and the run index uses the catalogue's names. SI throughout:
seconds, bytes, FLOP, FLOP/s, bytes/s, J, W.

Decimal prefixes are taken literally (``MB`` = 1e6 bytes, ``GB/s`` = 1e9 bytes/s); binary
ones are spelled with ``i`` (``MiB``, ``GiB``). Datasheets print cache sizes as "MB" even
when the hardware size is a power of two; the difference (under 5 %) is irrelevant to a
roofline, and converting what the datasheet says keeps every value checkable.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["MISSING", "UNITS", "Kind", "factor_of", "units_of"]

#: What a value is, which picks its unit and display.
Kind = Literal[
    "seconds",
    "rate",
    "ratio",
    "percent",
    "bytes",
    "flop",
    "flop_per_s",
    "bytes_per_s",
    "intensity",
    "joules",
    "watts",
    "joules_per_token",
    "tokens_per_joule",
    "count",
    "factor",
    "number",
]

#: The one marker shown for a missing or non-finite value, everywhere a value is printed.
MISSING = "n/a"

#: Unit text (lowercase) → (kind, factor to the SI value). The one unit table of perfscope.
UNITS: dict[str, tuple[Kind, float]] = {
    # time: seconds
    "ns": ("seconds", 1e-9),
    "us": ("seconds", 1e-6),
    "µs": ("seconds", 1e-6),
    "ms": ("seconds", 1e-3),
    "s": ("seconds", 1.0),
    "min": ("seconds", 60.0),
    "%": ("ratio", 1e-2),
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
    # rates of requests and tokens
    "tok/s": ("rate", 1.0),
    "tokens/s": ("rate", 1.0),
    "ktok/s": ("rate", 1e3),
    "req/s": ("rate", 1.0),
    "/s": ("rate", 1.0),
    # work: FLOP
    "flop": ("flop", 1.0),
    "gflop": ("flop", 1e9),
    "tflop": ("flop", 1e12),
    # throughput: FLOP/s (integer ops counted the same way)
    "flop/s": ("flop_per_s", 1.0),
    "flops": ("flop_per_s", 1.0),
    "gflop/s": ("flop_per_s", 1e9),
    "tflop/s": ("flop_per_s", 1e12),
    "pflop/s": ("flop_per_s", 1e15),
    "gflops": ("flop_per_s", 1e9),
    "tflops": ("flop_per_s", 1e12),
    "pflops": ("flop_per_s", 1e15),
    "ops": ("flop_per_s", 1.0),
    "gops": ("flop_per_s", 1e9),
    "tops": ("flop_per_s", 1e12),
    "pops": ("flop_per_s", 1e15),
    # bandwidth: bytes/s
    "b/s": ("bytes_per_s", 1.0),
    "kb/s": ("bytes_per_s", 1e3),
    "mb/s": ("bytes_per_s", 1e6),
    "gb/s": ("bytes_per_s", 1e9),
    "gbps": ("bytes_per_s", 1e9),  # Google's "GBps" = gigabytes per second
    "tb/s": ("bytes_per_s", 1e12),
    "mib/s": ("bytes_per_s", 2.0**20),
    "gib/s": ("bytes_per_s", 2.0**30),
    "gibps": ("bytes_per_s", 2.0**30),
    "tib/s": ("bytes_per_s", 2.0**40),
    "gbit/s": ("bytes_per_s", 1e9 / 8),
    # energy: J
    "j": ("joules", 1.0),
    "mj": ("joules", 1e-3),
    "kj": ("joules", 1e3),
    "wh": ("joules", 3600.0),
    # power: W
    "w": ("watts", 1.0),
    "mw": ("watts", 1e-3),
    "kw": ("watts", 1e3),
    # energy per token
    "j/token": ("joules_per_token", 1.0),
    "j/tok": ("joules_per_token", 1.0),
    "mj/token": ("joules_per_token", 1e-3),
    "mj/tok": ("joules_per_token", 1e-3),
    "tok/j": ("tokens_per_joule", 1.0),
    "x": ("factor", 1.0),
}


def factor_of(unit: str, kind: Kind) -> float:
    """The factor that takes a value in ``unit`` to the SI unit of ``kind``.

    Raises:
        ValueError: the unit is unknown or of another kind; the message lists the spellings
            ``kind`` accepts.
    """
    entry = UNITS.get(unit.strip().lower())
    if entry is None or entry[0] != kind:
        raise ValueError(
            f"unit {unit!r} is not a {kind.replace('_', ' ')} unit "
            f"(accepted: {', '.join(units_of(kind))})"
        )
    return entry[1]


def units_of(kind: Kind) -> list[str]:
    """The spellings of ``kind``'s units, sorted."""
    return sorted(u for u, (k, _) in UNITS.items() if k == kind)
