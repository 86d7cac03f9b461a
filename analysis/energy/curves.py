"""Cumulative energy curves E(t) per device, and the window arithmetic over them.

Energy between two instants comes from a per-device cumulative curve E(t):

- ``counter``: NVML's total-energy counter (or RAPL), linear between the samples where the
  counter changed. The counter updates about every 100 ms on NVIDIA GPUs (zeus), so a sample
  that repeats the previous value is not a knot: the energy of one update period is spread over
  that period instead of landing in the sampling interval that saw the update. Window edges are
  interpolated.
- ``integrated``: trapezoid integral of the instantaneous power samples, exact for power that
  is linear between samples, with interpolated edges.

Times are run-relative nanoseconds (the telemetry and the token events share the clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "EnergyCurve",
    "column",
    "energy_between",
    "finite",
    "merge_windows",
    "pick_curves",
    "ratio",
    "windowed_mean",
]


@dataclass
class EnergyCurve:
    """Cumulative energy E(t) (J) of one device, evaluable at any run time (ns).

    Attributes:
        t: knot times (ns, increasing).
        e: cumulative energy at the knots (J).
        p: power at the knots (W) for the ``integrated`` method; None for ``counter``.
        method: ``counter`` or ``integrated``.
    """

    t: np.ndarray
    e: np.ndarray
    p: np.ndarray | None
    method: str

    @classmethod
    def from_counter(cls, t: np.ndarray, energy_j: np.ndarray) -> EnergyCurve | None:
        """Curve from counter samples (sorted by t); None with fewer than two samples."""
        if len(t) < 2:
            return None
        changed = np.concatenate(([True], np.diff(energy_j) != 0))
        kt, ke = t[changed].astype(np.float64), energy_j[changed].astype(np.float64)
        if t[-1] > kt[-1]:
            # Trailing samples repeat the last update: extend at the last known slope rather
            # than a flat tail (the counter had simply not updated yet).
            slope = (ke[-1] - ke[-2]) / (kt[-1] - kt[-2]) if len(kt) >= 2 else 0.0
            kt = np.append(kt, float(t[-1]))
            ke = np.append(ke, ke[-1] + slope * (float(t[-1]) - kt[-2]))
        return cls(kt, ke, None, "counter")

    @classmethod
    def from_power(cls, t: np.ndarray, power_w: np.ndarray) -> EnergyCurve | None:
        """Curve from instantaneous power samples (sorted by t); None with fewer than two."""
        if len(t) < 2:
            return None
        tt = t.astype(np.float64)
        p = power_w.astype(np.float64)
        seg = np.diff(tt) * (p[1:] + p[:-1]) / 2.0 / 1e9
        return cls(tt, np.concatenate(([0.0], np.cumsum(seg))), p, "integrated")

    @property
    def start(self) -> float:
        """First knot (ns)."""
        return float(self.t[0])

    @property
    def end(self) -> float:
        """Last knot (ns)."""
        return float(self.t[-1])

    def at(self, ts: np.ndarray) -> np.ndarray:
        """E at times ``ts`` (ns), clamped to the curve's span."""
        x = np.clip(np.asarray(ts, dtype=np.float64), self.t[0], self.t[-1])
        if self.p is None:
            return np.asarray(np.interp(x, self.t, self.e), dtype=np.float64)
        i = np.clip(np.searchsorted(self.t, x, side="right") - 1, 0, len(self.t) - 2)
        t0, t1 = self.t[i], self.t[i + 1]
        p0, p1 = self.p[i], self.p[i + 1]
        dt = x - t0
        span = np.where(t1 > t0, t1 - t0, 1.0)
        px = p0 + (p1 - p0) * dt / span
        return np.asarray(self.e[i] + dt * (p0 + px) / 2.0 / 1e9)

    def between(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Energy (J) in each window [a, b] (ns)."""
        return np.asarray(self.at(b) - self.at(a), dtype=np.float64)

    def total(self, w0: float, w1: float) -> float:
        """Energy (J) in the one window [w0, w1] (ns)."""
        return float(self.between(np.array([w0]), np.array([w1]))[0])

    def power_at_knots(self) -> tuple[np.ndarray, np.ndarray]:
        """(t, W): the sampled power, or the counter's slope per segment (at segment ends)."""
        if self.p is not None:
            return self.t, self.p
        dt = np.diff(self.t) / 1e9
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(dt > 0, np.diff(self.e) / dt, np.nan)
        return self.t[1:], w


def finite(x: Any) -> float | None:
    """``x`` as a JSON-ready float: ``None`` for ``None``, NaN, infinities and non-numbers."""
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if np.isnan(v) or np.isinf(v) else v


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``; ``None`` when either is missing or ``b`` is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def column(df: pd.DataFrame | None, name: str) -> np.ndarray:
    """Column ``name`` of ``df`` as float64 (NaN where missing or not numeric; all NaN when
    the frame has no such column, empty for an empty or absent frame)."""
    if df is None or len(df) == 0:
        return np.array([], dtype=np.float64)
    if name not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def merge_windows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals [a_i, b_i] as sorted, disjoint (starts, ends)."""
    if len(a) == 0:
        return a, b
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    run_end = np.maximum.accumulate(b)
    # A window starts a new block where it begins after every earlier window has ended.
    new = np.concatenate(([True], a[1:] > run_end[:-1]))
    first = np.flatnonzero(new)
    return a[first], np.maximum.reduceat(b, first)


def _covered(starts: np.ndarray, ends: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Length of the union of [starts, ends] that lies before each x."""
    if len(starts) == 0:
        return np.zeros_like(x, dtype=np.float64)
    cum = np.concatenate(([0.0], np.cumsum(ends - starts)))
    i = np.searchsorted(starts, x, side="right")  # windows starting at or before x
    before = cum[np.maximum(i - 1, 0)]
    last_start = starts[np.maximum(i - 1, 0)]
    last_end = ends[np.maximum(i - 1, 0)]
    partial = np.clip(x - last_start, 0, last_end - last_start)
    return np.where(i > 0, before + partial, 0.0)


def windowed_mean(
    t: np.ndarray, v: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> float | None:
    """Mean of a per-interval metric (sample i covers (t[i-1], t[i]]) over the given disjoint
    windows (:func:`merge_windows`), weighted by how much of each interval they cover."""
    ok = ~np.isnan(v)
    t, v = t[ok], v[ok]
    if len(t) < 2 or len(starts) == 0:
        return None
    w = _covered(starts, ends, t[1:]) - _covered(starts, ends, t[:-1])
    total = w.sum()
    return finite((w * v[1:]).sum() / total) if total > 0 else None


def energy_between(curves: dict[str, EnergyCurve], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Energy (J) of all ``curves`` together in each window [a, b] (ns)."""
    total = np.zeros(len(a), dtype=np.float64)
    for c in curves.values():
        total += c.between(a, b)
    return total


def pick_curves(
    frames: dict[str, pd.DataFrame], devices: list[str], *, partial: bool = False
) -> tuple[dict[str, EnergyCurve], str]:
    """Per-device curves, all by counter if every device has one, else all integrated;
    ``({}, "unavailable")`` when neither covers every device.

    ``partial`` (a cluster): when no method covers every device, the method that covers
    the most devices is used for those it covers; the caller names the devices left out.
    """
    counter: dict[str, EnergyCurve] = {}
    integ: dict[str, EnergyCurve] = {}
    for d in devices:
        df = frames[d]
        t = column(df, "t")
        e = column(df, "energy_j")
        p = column(df, "power_w")
        ce = EnergyCurve.from_counter(t[~np.isnan(e)], e[~np.isnan(e)])
        cp = EnergyCurve.from_power(t[~np.isnan(p)], p[~np.isnan(p)])
        if ce is not None:
            counter[d] = ce
        if cp is not None:
            integ[d] = cp
    if counter and len(counter) == len(devices):
        return counter, "counter"
    if integ and len(integ) == len(devices):
        return integ, "integrated"
    if partial and (counter or integ):
        return (counter, "counter") if len(counter) >= len(integ) else (integ, "integrated")
    return {}, "unavailable"
