"""Energy join: telemetry samples × steps and requests → energy per run, phase, request, token.

Energy between two instants comes from a per-device cumulative curve E(t):

- ``counter``: NVML's total-energy counter (or RAPL), linear between the samples where the
  counter changed. The counter updates about every 100 ms on NVIDIA GPUs (zeus), so a sample
  that repeats the previous value is not a knot: the energy of one update period is spread over
  that period instead of landing in the sampling interval that saw the update. Window edges are
  interpolated.
- ``integrated``: trapezoid integral of the instantaneous power samples, exact for power that
  is linear between samples, with interpolated edges.

The counter is preferred wherever every headline device has one; the method is named in the
result. Headline devices are the GPUs when GPU telemetry exists, else the CPU packages (RAPL),
else energy is ``unavailable`` with the reason — never estimated from TDP.

Attribution: the whole-run window is the measured window (first non-warmup send to the last
token). With steps (local engines) a phase's energy is the sum over its step windows, the rest of
the window is ``between_steps``, and each step's energy is split among its requests by tokens
(decode: one each; prefill: prompt lengths; mixed: equally). Without steps (HTTP engines), every
moment's energy is split equally among the requests in flight, and counted as prefill before a
request's first token and decode after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfscope.analysis.manifest import TelemetryManifest

__all__ = ["THROTTLE_REASONS", "EnergyCurve", "device_keys", "energy_section"]

THROTTLE_REASONS: dict[str, int] = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}
_THROTTLE_MASK = 0
for _bit in THROTTLE_REASONS.values():
    _THROTTLE_MASK |= _bit

_COUNTER_COLUMNS = ("util_pct", "mem_util_pct", "sm_util_pct", "sm_occupancy_pct",
                    "tensor_util_pct", "dram_bw_util_pct", "sm_clock_mhz")  # fmt: skip


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

    def power_at_knots(self) -> tuple[np.ndarray, np.ndarray]:
        """(t, W): the sampled power, or the counter's slope per segment (at segment ends)."""
        if self.p is not None:
            return self.t, self.p
        dt = np.diff(self.t) / 1e9
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(dt > 0, np.diff(self.e) / dt, np.nan)
        return self.t[1:], w


# -- small helpers ------------------------------------------------------------------------------


def _f(x: Any) -> float | None:
    """JSON-ready float (None for NaN/None)."""
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if np.isnan(v) or np.isinf(v) else v


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _stats(values: np.ndarray) -> dict[str, float | None]:
    v = values[~np.isnan(values)] if len(values) else values
    if len(v) == 0:
        return {"mean": None, "p50": None, "p90": None, "max": None}
    return {
        "mean": _f(np.mean(v)),
        "p50": _f(np.percentile(v, 50)),
        "p90": _f(np.percentile(v, 90)),
        "max": _f(np.max(v)),
    }


def _col(df: pd.DataFrame | None, name: str) -> np.ndarray:
    if df is None or len(df) == 0:
        return np.array([], dtype=np.float64)
    if name not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _merge_windows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _windowed_mean(
    t: np.ndarray, v: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> float | None:
    """Mean of a per-interval metric (sample i covers (t[i-1], t[i]]) over the given windows."""
    ok = ~np.isnan(v)
    t, v = t[ok], v[ok]
    if len(t) < 2 or len(starts) == 0:
        return None
    w = _covered(starts, ends, t[1:]) - _covered(starts, ends, t[:-1])
    total = w.sum()
    return _f((w * v[1:]).sum() / total) if total > 0 else None


# -- the section --------------------------------------------------------------------------------


def _kind(key: str) -> str:
    """The device part of a device key: ``gpu0`` of ``node-a/gpu0`` (or of ``gpu0``)."""
    return key.rsplit("/", 1)[-1]


def _node_of(key: str) -> str | None:
    """The node part of a device key (``node-a`` of ``node-a/gpu0``); None on one host."""
    return key.rsplit("/", 1)[0] if "/" in key else None


def device_keys(tele: pd.DataFrame) -> pd.Series:
    """Each telemetry row's device key: ``device``, or ``node/device`` for rows that carry a
    ``node`` (a ``--ray`` run's telemetry agents), so ``gpu0`` of two nodes stay two devices."""
    keys = tele["device"].astype(str)
    if "node" in tele.columns and tele["node"].notna().any():
        node = tele["node"].astype("string").fillna("")
        keys = keys.where(node == "", node + "/" + keys).astype(str)
    return keys


def _device_frames(tele: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Samples per device key (:func:`device_keys`)."""
    if tele is None or len(tele) == 0 or "device" not in tele.columns:
        return {}
    keys = device_keys(tele)
    out: dict[str, pd.DataFrame] = {}
    for dev, df in tele.groupby(keys.to_numpy(), sort=True):
        out[str(dev)] = df.sort_values("t", kind="stable")
    return out


def _curves(
    frames: dict[str, pd.DataFrame], devices: list[str], *, partial: bool = False
) -> tuple[dict[str, EnergyCurve], str]:
    """Per-device curves, all by counter if every device has one, else all integrated.

    ``partial`` (a cluster): when no method covers every device, the method that covers
    the most devices is used for those it covers; the caller names the devices left out.
    """
    counter: dict[str, EnergyCurve] = {}
    integ: dict[str, EnergyCurve] = {}
    for d in devices:
        df = frames[d]
        t = _col(df, "t")
        e = _col(df, "energy_j")
        p = _col(df, "power_w")
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


def _measured_window(
    requests: pd.DataFrame | None, steps: pd.DataFrame | None, frames: dict[str, pd.DataFrame]
) -> tuple[float, float] | None:
    if requests is not None and len(requests):
        req = requests
        if "is_warmup" in req.columns:
            req = req[~req["is_warmup"].fillna(False).astype(bool)]
        sent = _col(req, "t_sent")
        last = _col(req, "t_last_token")
        if len(sent) and not np.all(np.isnan(sent)) and not np.all(np.isnan(last)):
            return float(np.nanmin(sent)), float(np.nanmax(last))
    if steps is not None and len(steps):
        return float(np.nanmin(_col(steps, "t_start"))), float(np.nanmax(_col(steps, "t_end")))
    ts = [_col(df, "t") for df in frames.values()]
    if ts and any(len(x) for x in ts):
        allt = np.concatenate(ts)
        return float(allt.min()), float(allt.max())
    return None


def _energy_between(curves: dict[str, EnergyCurve], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    total = np.zeros(len(a), dtype=np.float64)
    for c in curves.values():
        total += c.between(a, b)
    return total


def _step_phases(
    steps: pd.DataFrame, curves: dict[str, EnergyCurve], w0: float, w1: float
) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    st = steps.copy()
    a = np.maximum(_col(st, "t_start"), w0)
    b = np.minimum(_col(st, "t_end"), w1)
    keep = b > a
    st = st[keep].copy()
    a, b = a[keep], b[keep]
    st["_a"], st["_b"] = a, b
    st["_e"] = _energy_between(curves, a, b)
    phases: dict[str, dict[str, Any]] = {}
    for kind, g in st.groupby("kind", sort=False):
        e = float(g["_e"].sum())
        dur = float((g["_b"] - g["_a"]).sum()) / 1e9
        tokens = int(pd.to_numeric(g["new_tokens"], errors="coerce").fillna(0).sum())
        phases[str(kind)] = {
            "energy_j": e,
            "time_s": dur,
            "steps": len(g),
            "tokens": tokens,
            "j_per_token": _ratio(e, float(tokens)),
            "avg_power_w": _ratio(e, dur),
        }
    return st, phases


def _split_steps_to_requests(st: pd.DataFrame, requests: pd.DataFrame | None) -> dict[int, float]:
    """Each step's energy split among its requests by tokens processed in the step.

    Prefill steps split by prompt length (at least 1 per request), other steps equally.
    """
    if "request_ids" not in st.columns or len(st) == 0:
        return {}
    lists = [np.asarray(x if x is not None else [], dtype=np.int64) for x in st["request_ids"]]
    counts = np.array([len(x) for x in lists], dtype=np.int64)
    if counts.sum() == 0:
        return {}
    ids = np.concatenate(lists)
    step = np.repeat(np.arange(len(lists)), counts)
    w = np.ones(len(ids), dtype=np.float64)
    is_prefill = (st["kind"].to_numpy(dtype=object) == "prefill")[step]
    if (
        is_prefill.any()
        and requests is not None
        and len(requests)
        and "prompt_tokens" in requests.columns
    ):
        prompt = pd.Series(
            pd.to_numeric(requests["prompt_tokens"], errors="coerce").fillna(1.0).to_numpy(),
            index=requests["request_id"].astype(int).to_numpy(),
        )
        prompt = prompt[~prompt.index.duplicated(keep="last")]
        looked_up = prompt.reindex(ids[is_prefill]).fillna(1.0).to_numpy(dtype=np.float64)
        w[is_prefill] = np.maximum(looked_up, 1.0)
    w_sum = np.bincount(step, weights=w, minlength=len(lists))
    energy = st["_e"].to_numpy(dtype=np.float64)
    share = energy[step] * (w / w_sum[step])
    uniq, inv = np.unique(ids, return_inverse=True)
    total = np.bincount(inv, weights=share, minlength=len(uniq))
    return {int(i): float(v) for i, v in zip(uniq, total, strict=True)}


def _split_concurrency(
    requests: pd.DataFrame, curves: dict[str, EnergyCurve], w0: float, w1: float
) -> tuple[dict[int, float], dict[str, float]]:
    """Energy of each moment split equally among requests in flight; phase by first token.

    The window is cut at every send, first-token and last-token time. Within one piece the set
    of requests in flight is fixed: those with ``sent <= piece < last``, in prefill while the
    piece lies before their first token. A piece's share (its energy over the number in
    flight) is summed into a running total, so a request's energy is the difference of that
    total between its last-token and send pieces: O(n log n) in the number of requests.
    """
    req = requests.dropna(subset=["t_sent", "t_last_token"])
    if len(req) == 0:
        return {}, {}
    ids = req["request_id"].astype(int).to_numpy()
    s = np.clip(_col(req, "t_sent"), w0, w1)
    f = np.clip(_col(req, "t_first_token"), w0, w1)
    f = np.where(np.isnan(f), s, f)
    e_ = np.clip(_col(req, "t_last_token"), w0, w1)
    bounds = np.unique(np.concatenate((s, f, e_, [w0, w1])))
    energy = _energy_between(curves, bounds[:-1], bounds[1:])
    # Piece k is (bounds[k], bounds[k+1]); a request spans pieces js..je-1 (none if it ends
    # before it starts), and is in prefill over js..min(jf, je)-1.
    js = np.searchsorted(bounds, s)
    je = np.maximum(np.searchsorted(bounds, e_), js)
    jf = np.clip(np.searchsorted(bounds, f), js, je)
    delta = np.zeros(len(bounds), dtype=np.int64)
    np.add.at(delta, js, 1)
    np.add.at(delta, je, -1)
    n = np.cumsum(delta)[:-1]
    share = np.where(n > 0, energy / np.maximum(n, 1), 0.0)
    cum = np.concatenate(([0.0], np.cumsum(share)))
    per_req = cum[je] - cum[js]
    pre = cum[jf] - cum[js]
    phase = {
        "prefill": float(pre.sum()),
        "decode": float((per_req - pre).sum()),
        "idle": float(energy[n == 0].sum()),
    }
    return {int(i): float(v) for i, v in zip(ids, per_req, strict=True)}, phase


def _peak_power(
    frames: dict[str, pd.DataFrame], curves: dict[str, EnergyCurve], w0: float, w1: float
) -> tuple[float | None, dict[str, float | None]]:
    """Peak power in [w0, w1]: sampled power where recorded, else the counter's slope.

    A window with no sample inside uses the power interpolated at its edges.
    """
    per_dev: dict[str, float | None] = {}
    series: list[tuple[np.ndarray, np.ndarray]] = []
    grids: list[np.ndarray] = [np.array([w0, w1])]
    for d, c in curves.items():
        t = _col(frames[d], "t")
        w = _col(frames[d], "power_w")
        ok = ~np.isnan(w)
        if ok.sum() >= 1:
            t, w = t[ok], w[ok]
        else:
            t, w = c.power_at_knots()
            ok = ~np.isnan(w)
            t, w = t[ok], w[ok]
        if len(t) == 0:
            per_dev[d] = None
            continue
        inside = (t >= w0) & (t <= w1)
        edge = np.interp([w0, w1], t, w)
        per_dev[d] = _f(max(w[inside].max() if inside.any() else -np.inf, edge.max()))
        series.append((t, w))
        grids.append(t[inside])
    if not series:
        return None, per_dev
    grid = np.unique(np.concatenate(grids))
    total = np.zeros(len(grid))
    for t, w in series:
        total += np.interp(grid, t, w)
    return _f(total.max()), per_dev


def _memory(
    frames: dict[str, pd.DataFrame],
    devices: list[str],
    manifest: TelemetryManifest,
    capacity: float | None,
) -> dict[str, Any]:
    totals = manifest.mem_total_bytes
    per: dict[str, Any] = {}
    for d in devices:
        df = frames[d]
        used = _col(df, "mem_used_bytes")
        cap = capacity if capacity is not None else _f(totals.get(d))
        peak = _f(np.nanmax(used)) if len(used) and not np.all(np.isnan(used)) else None
        entry: dict[str, Any] = {
            "peak_used_bytes": peak,
            "capacity_bytes": cap,
            "peak_pct_of_capacity": (100.0 * peak / cap if peak is not None and cap else None),
        }
        tp = _col(df, "torch_peak_allocated_bytes")
        if len(tp) and not np.all(np.isnan(tp)):
            entry["torch_peak_allocated_bytes"] = _f(np.nanmax(tp))
        tr = _col(df, "torch_reserved_bytes")
        if len(tr) and not np.all(np.isnan(tr)):
            entry["torch_peak_reserved_bytes"] = _f(np.nanmax(tr))
        per[d] = entry
    return per


def _throttle(
    frames: dict[str, pd.DataFrame], devices: list[str], w0: float, w1: float
) -> dict[str, Any]:
    shares: dict[str, Any] = {}
    for d in devices:
        df = frames[d]
        t = _col(df, "t")
        thr = _col(df, "throttle")
        m = (t >= w0) & (t <= w1) & ~np.isnan(thr)
        if not m.any():
            continue
        bits = thr[m].astype(np.int64)
        shares[d] = {
            "any": float(np.mean((bits & _THROTTLE_MASK) != 0)),
            **{name: float(np.mean((bits & bit) != 0)) for name, bit in THROTTLE_REASONS.items()},
        }
    if not shares:
        return {"share": None, "per_device": {}}
    return {"share": float(np.mean([s["any"] for s in shares.values()])), "per_device": shares}


def _cpu_key(frames: dict[str, pd.DataFrame], manifest: TelemetryManifest) -> str | None:
    """The host whose CPU the top-level ``cpu`` section describes: this host on a single-host
    run, the driver's node on a cluster (every node's is under ``nodes``)."""
    if "cpu" in frames:
        return "cpu"
    driver = manifest.driver_node
    if driver and f"{driver}/cpu" in frames:
        return f"{driver}/cpu"
    return next((d for d in frames if _kind(d) == "cpu"), None)


def _cpu_section(
    frames: dict[str, pd.DataFrame],
    manifest: TelemetryManifest,
    w0: float,
    w1: float,
    key: str | None = "cpu",
) -> dict[str, Any]:
    df = frames.get(key) if key is not None else None
    if df is None:
        return {"sampled": False}
    t = _col(df, "t")
    m = (t >= w0) & (t <= w1)
    out: dict[str, Any] = {"sampled": True}
    rss = _col(df, "peak_rss_bytes")
    out["peak_rss_bytes"] = _f(np.nanmax(rss)) if len(rss) and not np.all(np.isnan(rss)) else None
    cpu = _col(df, "proc_cpu_pct")[m]
    out["avg_process_cpu_pct"] = (
        _f(np.nanmean(cpu)) if len(cpu) and not np.all(np.isnan(cpu)) else None
    )
    sysu = _col(df, "util_pct")[m]
    out["avg_system_cpu_pct"] = (
        _f(np.nanmean(sysu)) if len(sysu) and not np.all(np.isnan(sysu)) else None
    )
    mem = _col(df, "mem_used_bytes")
    out["peak_system_mem_used_bytes"] = (
        _f(np.nanmax(mem)) if len(mem) and not np.all(np.isnan(mem)) else None
    )
    out["system_mem_total_bytes"] = _f(manifest.mem_total_bytes.get("cpu"))
    e = _col(df, "energy_j")
    ok = ~np.isnan(e)
    curve = EnergyCurve.from_counter(t[ok], e[ok])
    if curve is not None:
        out["package_energy_j"] = float(curve.between(np.array([w0]), np.array([w1]))[0])
        de = _col(df, "dram_energy_j")
        okd = ~np.isnan(de)
        dcurve = EnergyCurve.from_counter(t[okd], de[okd])
        out["dram_energy_j"] = (
            float(dcurve.between(np.array([w0]), np.array([w1]))[0]) if dcurve else None
        )
        out["energy_available"] = True
    else:
        out["energy_available"] = False
        out["energy_reason"] = manifest.cpu_energy_unavailable or (
            "cpu energy unavailable: no RAPL samples"
        )
    return out


def _peak(values: np.ndarray) -> float | None:
    return _f(np.nanmax(values)) if len(values) and not np.all(np.isnan(values)) else None


def _nodes_section(
    frames: dict[str, pd.DataFrame],
    curves: dict[str, EnergyCurve],
    manifest: TelemetryManifest,
    w0: float,
    w1: float,
    source: str | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-node power and memory of a cluster run, and the cluster totals.

    A node's energy counts only its headline devices (the ones in ``curves``), so the nodes'
    energies add up to the run's total; a node none of whose devices has a power reading
    is listed in ``nodes_without_power``.
    """
    window_s = (w1 - w0) / 1e9
    wa, wb = np.array([w0]), np.array([w1])
    nodes: dict[str, Any] = {}
    names = sorted({n for d in frames if (n := _node_of(d)) is not None})
    for node in names:
        devs = sorted(d for d in frames if _node_of(d) == node)
        mine = {d: c for d, c in curves.items() if _node_of(d) == node}
        gpus = [d for d in devs if _kind(d).startswith("gpu")]
        gpu_peaks = [p for d in gpus if (p := _peak(_col(frames[d], "mem_used_bytes")))]
        cpu = frames.get(f"{node}/cpu")
        entry: dict[str, Any] = {
            "devices": [_kind(d) for d in devs],
            "gpus": len(gpus),
            "power_source": source if mine else None,
            "power_devices": [_kind(d) for d in sorted(mine)],
            "energy_j": None,
            "avg_power_w": None,
            "peak_power_w": None,
            # Sum of each GPU's own peak: an upper bound of what was in use at one moment.
            "gpu_mem_used_peak_bytes": float(sum(gpu_peaks)) if gpu_peaks else None,
            "gpu_mem_total_bytes": _f(
                sum(float(manifest.mem_total_bytes.get(d) or 0) for d in gpus)
            )
            or None,
            "system_mem_used_peak_bytes": _peak(_col(cpu, "mem_used_bytes")),
            "system_mem_total_bytes": _f(manifest.mem_total_bytes.get(f"{node}/cpu")),
        }
        if mine:
            e = float(_energy_between(mine, wa, wb)[0])
            entry["energy_j"] = e
            entry["avg_power_w"] = _ratio(e, window_s)
            entry["peak_power_w"] = _peak_power(frames, mine, w0, w1)[0]
        nodes[node] = entry
    with_power = [n for n, e in nodes.items() if e["energy_j"] is not None]
    cluster: dict[str, Any] = {
        "nodes": names,
        "nodes_with_power": with_power,
        "nodes_without_power": [n for n in names if n not in with_power],
        "energy_j": float(sum(nodes[n]["energy_j"] for n in with_power)) if with_power else None,
        "gpu_mem_used_peak_bytes": _f(
            sum(e["gpu_mem_used_peak_bytes"] or 0 for e in nodes.values())
        )
        or None,
        "system_mem_used_peak_bytes": _f(
            sum(e["system_mem_used_peak_bytes"] or 0 for e in nodes.values())
        )
        or None,
    }
    cluster["avg_power_w"] = _ratio(cluster["energy_j"], window_s)
    return nodes, cluster


def _cluster_note(cluster: dict[str, Any], source: str | None) -> str:
    names = cluster["nodes"]
    missing = cluster["nodes_without_power"]
    what = {"gpu": "GPUs'", "cpu": "CPU packages' (RAPL)"}.get(source or "", "")
    if source is None:
        return (
            f"no node of the cluster ({', '.join(names)}) had a power reading: energy is "
            "unavailable"
        )
    text = (
        f"energy and energy per token are the cluster total of {len(cluster['nodes_with_power'])}"
        f" of {len(names)} nodes' {what} energy ({', '.join(cluster['nodes_with_power'])})"
    )
    if missing:
        text += f"; no power reading on {', '.join(missing)} (not counted)"
    return text


def energy_section(
    telemetry: pd.DataFrame,
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    chunks: pd.DataFrame,
    manifest_telemetry: Mapping[str, Any] | TelemetryManifest | None,
    *,
    tdp_w: float | None = None,
    mem_capacity_bytes: float | None = None,
) -> dict[str, Any]:
    """Join telemetry with the run's steps and requests (JSON-ready dict; see module docs).

    Args:
        telemetry: TELEMETRY_SCHEMA rows (long format).
        steps: STEP_SCHEMA rows (may be empty: HTTP engines).
        requests: REQUEST_SCHEMA rows.
        chunks: CHUNK_SCHEMA rows; used for output-token counts when ``requests`` lacks them.
        manifest_telemetry: the manifest's ``telemetry`` (``TelemetrySession.manifest_info()``
            as stored), as the record or the JSON object.
        tdp_w: thermal design power of one device (hardware database), W.
        mem_capacity_bytes: memory capacity of one device (hardware database), bytes.

    Returns:
        ``available``/``reason``, ``method`` (counter | integrated | unavailable), ``source``
        (gpu | cpu), window, ``total_j``, ``j_per_output_token``, ``tokens_per_j``, power
        average/peak against limit and TDP, ``phases``, ``requests``, idle baseline and dynamic
        energy, ``memory``, ``throttle``, measured hardware counters per phase, ``cpu``, notes.
    """
    manifest = TelemetryManifest.of(manifest_telemetry)
    frames = _device_frames(telemetry)
    gpus = [d for d in frames if _kind(d).startswith("gpu")]
    cpus = [d for d in frames if _kind(d) == "cpu"]
    clustered = any(_node_of(d) is not None for d in frames)
    notes: list[str] = []

    req = requests if requests is not None else pd.DataFrame()
    if len(req) and "is_warmup" in req.columns:
        req = req[~req["is_warmup"].fillna(False).astype(bool)]
    window = _measured_window(requests, steps, frames)
    out_tokens = float(np.nansum(_col(req, "output_tokens"))) if len(req) else 0.0
    if out_tokens == 0 and chunks is not None and len(chunks) and window is not None:
        ct = _col(chunks, "t")
        out_tokens = float(
            np.nansum(_col(chunks, "n_tokens")[(ct >= window[0]) & (ct <= window[1])])
        )

    # Which devices carry the headline energy?
    gpu_curves, gpu_method = (
        _curves(frames, gpus, partial=clustered) if gpus else ({}, "unavailable")
    )
    source: str | None = None
    curves: dict[str, EnergyCurve] = {}
    method = "unavailable"
    if gpu_curves:
        source, curves, method = "gpu", gpu_curves, gpu_method
    elif cpus:
        cpu_curves, cpu_method = _curves(frames, cpus, partial=clustered)
        if cpu_curves and cpu_method == "counter":
            source, curves, method = "cpu", cpu_curves, "counter"

    if clustered and source is not None:
        left_out = [d for d in (gpus if source == "gpu" else cpus) if d not in curves]
        if left_out:
            notes.append(f"no power reading from {', '.join(left_out)}: not counted")
    reasons: list[str] = []
    if source is None:
        if gpus:
            reasons.append("gpu telemetry has neither an energy counter nor power samples")
        else:
            reasons.append(
                manifest.gpu_unavailable or "gpu telemetry unavailable: no GPU samples in this run"
            )
        reasons.append(manifest.cpu_energy_unavailable or "cpu energy unavailable: no RAPL samples")
    elif source == "cpu":
        notes.append(
            (manifest.gpu_unavailable or "no GPU samples") + "; energy is the CPU packages' (RAPL)"
        )

    section: dict[str, Any] = {
        "available": source is not None and window is not None,
        "reason": "; ".join(reasons) if reasons else None,
        "method": method if source is not None else "unavailable",
        "source": source,
        "devices": sorted(curves),
        "window_s": _f((window[1] - window[0]) / 1e9) if window else None,
        "output_tokens": int(out_tokens),
    }
    if window is None:
        section["available"] = False
        section["reason"] = section["reason"] or "no requests, steps or samples to define a window"
        section["cpu"] = {"sampled": "cpu" in frames}
        section["notes"] = notes
        return section
    w0, w1 = window
    wa, wb = np.array([w0]), np.array([w1])
    all_devices = gpus or cpus
    section["memory"] = _memory(frames, all_devices, manifest, mem_capacity_bytes if gpus else None)
    section["throttle"] = _throttle(frames, gpus, w0, w1)
    section["cpu"] = _cpu_section(frames, manifest, w0, w1, _cpu_key(frames, manifest))
    window_s = (w1 - w0) / 1e9
    if clustered:
        section["nodes"], section["cluster"] = _nodes_section(
            frames, curves, manifest, w0, w1, source
        )
        notes.append(_cluster_note(section["cluster"], source))

    if source is None:
        section["notes"] = notes
        return section

    total = float(_energy_between(curves, wa, wb)[0])
    section["total_j"] = total
    section["avg_power_w"] = _ratio(total, window_s)
    section["j_per_output_token"] = _ratio(total, out_tokens)
    section["tokens_per_j"] = _ratio(out_tokens, total)

    coverage = min(
        (min(c.end, w1) - max(c.start, w0)) / (w1 - w0) if w1 > w0 else 1.0 for c in curves.values()
    )
    section["coverage"] = max(0.0, float(coverage))
    if coverage < 0.95:
        notes.append(
            f"telemetry covers {100 * coverage:.0f}% of the measured window; energy outside "
            "the sampled span is not counted"
        )

    # Cross-check: counter vs integrated power, where both exist.
    if method == "counter" and source == "gpu":
        integ, integ_method = _curves(
            {d: frames[d].assign(energy_j=np.nan) for d in curves}, list(curves)
        )
        if integ_method == "integrated":
            it = float(_energy_between(integ, wa, wb)[0])
            section["integrated_total_j"] = it
            section["counter_vs_integrated_pct"] = _f(100.0 * (total - it) / it) if it else None
        # Counter update period, from the spacing of value changes.
        periods = []
        for c in curves.values():
            if len(c.t) > 3:
                periods.append(float(np.median(np.diff(c.t[:-1]))) / 1e9)
        if periods:
            section["counter_update_period_s"] = float(np.median(periods))

    # Power against limits.
    peak, peak_dev = _peak_power(frames, curves, w0, w1)
    limits = manifest.power_limits_w
    limit_total = sum(float(limits.get(d) or 0.0) for d in curves) or None
    n_dev = len(curves)
    section["power"] = {
        "avg_w": section["avg_power_w"],
        "peak_w": peak,
        "peak_per_device_w": peak_dev,
        "limit_w": limit_total,
        "tdp_w": _f(tdp_w * n_dev) if tdp_w and source == "gpu" else None,
        "avg_pct_of_limit": _f(100.0 * section["avg_power_w"] / limit_total)
        if limit_total and section["avg_power_w"] is not None
        else None,
        "peak_pct_of_limit": _f(100.0 * peak / limit_total) if limit_total and peak else None,
        "avg_pct_of_tdp": _f(100.0 * section["avg_power_w"] / (tdp_w * n_dev))
        if tdp_w and source == "gpu" and section["avg_power_w"] is not None
        else None,
        "peak_pct_of_tdp": _f(100.0 * peak / (tdp_w * n_dev))
        if tdp_w and source == "gpu" and peak
        else None,
    }

    # Idle baseline.
    baseline = manifest.idle_baseline_w
    base_w = sum(float(baseline.get(d) or 0.0) for d in curves)
    have_base = all(baseline.get(d) is not None for d in curves)
    section["idle_baseline_w"] = base_w if have_base else None
    section["idle_energy_j"] = base_w * window_s if have_base else None
    section["dynamic_energy_j"] = total - base_w * window_s if have_base else None
    if not have_base:
        notes.append("no idle baseline was sampled: dynamic energy is not separated")

    # Phases and requests.
    per_request: dict[int, float] = {}
    phases: dict[str, dict[str, Any]] = {}
    if steps is not None and len(steps):
        st, phases = _step_phases(steps, curves, w0, w1)
        in_steps = sum(p["energy_j"] for p in phases.values())
        in_steps_time = sum(p["time_s"] for p in phases.values())
        phases["between_steps"] = {
            "energy_j": total - in_steps,
            "time_s": max(0.0, window_s - in_steps_time),
            "avg_power_w": _ratio(total - in_steps, max(0.0, window_s - in_steps_time)),
        }
        per_request = _split_steps_to_requests(st, requests)
        section["attribution"] = "steps"
        period = section.get("counter_update_period_s")
        if method == "counter" and period and len(st):
            median_step = float(np.median((st["_b"] - st["_a"]).to_numpy())) / 1e9
            if median_step < period:
                notes.append(
                    f"median step ({median_step * 1e3:.1f} ms) is shorter than the energy "
                    f"counter's update period (~{period * 1e3:.0f} ms): per-step energy is "
                    "smoothed over neighbouring steps; phase totals over many steps hold"
                )
        starts_by_phase = {
            k: _merge_windows(g["_a"].to_numpy(), g["_b"].to_numpy())
            for k, g in st.groupby("kind", sort=False)
        }
    elif len(req):
        per_request, ph = _split_concurrency(req, curves, w0, w1)
        for k in ("prefill", "decode"):
            phases[k] = {"energy_j": ph.get(k, 0.0)}
        phases["idle"] = {"energy_j": ph.get("idle", 0.0)}
        section["attribution"] = "concurrency"
        starts_by_phase = {}
    else:
        starts_by_phase = {}
    if have_base:
        for p in phases.values():
            if "time_s" in p:
                p["dynamic_energy_j"] = p["energy_j"] - base_w * p["time_s"]
    section["phases"] = phases

    if per_request and len(req):
        ids = req["request_id"].astype(int).to_numpy()
        e = np.array([per_request.get(int(i), np.nan) for i in ids])
        toks = _col(req, "output_tokens")
        with np.errstate(divide="ignore", invalid="ignore"):
            jpt = np.where(toks > 0, e / toks, np.nan)
        section["requests"] = {
            "count": int(np.sum(~np.isnan(e))),
            "energy_j": _stats(e),
            "j_per_output_token": _stats(jpt),
            "attributed_share": _ratio(float(np.nansum(e)), total),
        }

    # Measured hardware counters per phase (cross-check for the roofline's MBU/MFU).
    hw: dict[str, dict[str, float | None]] = {}
    if source == "gpu":
        windows = {"run": (np.array([w0]), np.array([w1])), **starts_by_phase}
        for name, (s_, e_) in windows.items():
            row: dict[str, float | None] = {}
            for column in _COUNTER_COLUMNS:
                vals = [
                    _windowed_mean(_col(frames[d], "t"), _col(frames[d], column), s_, e_)
                    for d in curves
                ]
                vals_ok = [v for v in vals if v is not None]
                row[column] = float(np.mean(vals_ok)) if vals_ok else None
            if any(v is not None for v in row.values()):
                hw[str(name)] = row
    section["hardware_counters"] = hw
    section["notes"] = notes
    return section
