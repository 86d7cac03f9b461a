"""Bounded, columnar in-memory store for telemetry samples.

Rows are kept in preallocated NumPy blocks (one float64 matrix for the value columns, NaN for
null), so an append is a few microseconds and the memory per row is ~8 bytes per column instead
of a Python object per value. When ``max_rows`` is reached the buffer keeps every second
sampling round and tells the caller to double its interval: resolution stays uniform, memory
stays bounded, and energy from a cumulative counter stays exact (a counter needs no samples in
between to be right, only coarser ones).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from perfscope.profiler.records import TELEMETRY_SCHEMA

__all__ = ["VALUE_COLUMNS", "SampleBuffer"]

#: Columns a sampler does not fill with a number: the time, the device and the node name.
_LABEL_COLUMNS = ("t", "device", "node")
#: Every numeric TELEMETRY_SCHEMA column, in schema order.
VALUE_COLUMNS: tuple[str, ...] = tuple(
    name for name in TELEMETRY_SCHEMA.names if name not in _LABEL_COLUMNS
)
_INT_COLUMNS = frozenset(
    f.name for f in TELEMETRY_SCHEMA if pa.types.is_integer(f.type) and f.name != "t"
)
_BLOCK_ROWS = 4096


class SampleBuffer:
    """Thread-safe append-only table of samples with a row cap.

    Args:
        max_rows: the most rows held at once; at the cap the buffer halves itself by keeping
            even-numbered sampling rounds (see module docstring).
    """

    def __init__(self, max_rows: int = 1_000_000, node: str | None = None) -> None:
        if max_rows < 16:
            raise ValueError("max_rows must be at least 16")
        self.max_rows = max_rows
        self.node = node
        self._ncols = len(VALUE_COLUMNS)
        self._col_index = {name: i for i, name in enumerate(VALUE_COLUMNS)}
        cap = min(_BLOCK_ROWS, max_rows)
        self._t = np.empty(cap, dtype=np.int64)
        self._dev = np.empty(cap, dtype=np.int32)
        self._round = np.empty(cap, dtype=np.int64)
        self._vals = np.full((cap, self._ncols), np.nan)
        self._n = 0
        self._devices: list[str] = []
        self._device_code: dict[str, int] = {}
        self._next_round = 0
        self._lock = threading.Lock()
        self.decimations = 0

    def column_index(self, name: str) -> int:
        """Position of value column ``name`` in a row vector."""
        return self._col_index[name]

    def empty_row(self) -> np.ndarray:
        """A fresh all-null value row to fill in."""
        return np.full(self._ncols, np.nan)

    def __len__(self) -> int:
        return self._n

    def _grow(self) -> None:
        cap = len(self._t)
        new_cap = min(cap * 2, self.max_rows)
        self._t = np.resize(self._t, new_cap)
        self._dev = np.resize(self._dev, new_cap)
        self._round = np.resize(self._round, new_cap)
        vals = np.full((new_cap, self._ncols), np.nan)
        vals[:cap] = self._vals
        self._vals = vals

    def _decimate(self) -> None:
        n = self._n
        keep = (self._round[:n] % 2) == 0
        k = int(keep.sum())
        self._t[:k] = self._t[:n][keep]
        self._dev[:k] = self._dev[:n][keep]
        self._round[:k] = self._round[:n][keep] // 2
        self._vals[:k] = self._vals[:n][keep]
        self._vals[k:n] = np.nan
        self._n = k
        self._next_round = (self._next_round + 1) // 2
        self.decimations += 1

    def append_round(self, rows: Sequence[tuple[int, str, np.ndarray]]) -> bool:
        """Append one sampling round (one row ``(t_ns, device, values)`` per device).

        Returns True if the buffer had to halve itself to make room; the caller should then
        double its sampling interval so the kept history and the new samples match.
        """
        decimated = False
        with self._lock:
            if self._n + len(rows) > self.max_rows:
                self._decimate()
                decimated = True
            round_id = self._next_round
            self._next_round += 1
            while self._n + len(rows) > len(self._t):
                self._grow()
            for t_ns, device, values in rows:
                code = self._device_code.get(device)
                if code is None:
                    code = len(self._devices)
                    self._devices.append(device)
                    self._device_code[device] = code
                i = self._n
                self._t[i] = t_ns
                self._dev[i] = code
                self._round[i] = round_id
                self._vals[i] = values
                self._n += 1
        return decimated

    def to_table(self, after_t: int | None = None) -> pa.Table:
        """A copy of everything buffered so far, as a TELEMETRY_SCHEMA table; with
        ``after_t`` (ns), only the rows sampled after it (the segment flusher's increment:
        rows are in time order, so this copies only the tail)."""
        with self._lock:
            end = self._n
            start = 0 if after_t is None else int(np.searchsorted(self._t[:end], after_t, "right"))
            n = end - start
            t = self._t[start:end].copy()
            dev = self._dev[start:end].copy()
            vals = self._vals[start:end].copy()
            devices = list(self._devices)
        arrays: list[pa.Array] = []
        for f in TELEMETRY_SCHEMA:
            if f.name == "t":
                arrays.append(pa.array(t, type=pa.int64()))
            elif f.name == "device":
                names = np.array(devices, dtype=object) if devices else np.array([], dtype=object)
                arrays.append(pa.array(names[dev] if n else [], type=pa.string()))
            elif f.name == "node":
                arrays.append(pa.array([self.node] * n, type=pa.string()))
            else:
                col = vals[:, self._col_index[f.name]]
                mask = np.isnan(col)
                if f.name in _INT_COLUMNS:
                    ints = np.where(mask, 0, col).astype(np.int64)
                    arrays.append(pa.array(ints, type=f.type, mask=mask))
                else:
                    arrays.append(pa.array(col, type=f.type, mask=mask))
        return pa.Table.from_arrays(arrays, schema=TELEMETRY_SCHEMA)
