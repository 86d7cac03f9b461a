"""What each device measured over the run's window: peak power, memory, throttling, the host
CPU, the GPU counters, and a ``--ray`` cluster's nodes.

Devices are keyed ``gpu0``, ``cpu`` on one host and ``node/gpu0`` on a cluster
(:func:`device_keys`); every function here returns the typed record the energy section keeps.
Times are run-relative nanoseconds; power in W, energy in J, memory in bytes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from perfscope.analysis.energy.curves import (
    EnergyCurve,
    column,
    energy_between,
    finite,
    ratio,
    windowed_mean,
)
from perfscope.analysis.manifest import TelemetryManifest
from perfscope.analysis.summary import (
    ClusterEnergy,
    EnergyCpu,
    HardwareCounters,
    MemoryUse,
    NodeEnergy,
    Throttle,
    ThrottleShare,
)

__all__ = [
    "THROTTLE_REASONS",
    "cluster_energy",
    "cluster_note",
    "cpu_use",
    "device_frames",
    "device_keys",
    "hardware_counters",
    "kind_of",
    "memory_use",
    "node_of",
    "peak_power",
    "throttle",
]

#: NVML's clock-throttle reasons the section reports, by their bit in the throttle mask.
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

#: Telemetry columns of the measured GPU counters (the fields of :class:`HardwareCounters`).
_COUNTER_COLUMNS = HardwareCounters.field_names()


def kind_of(key: str) -> str:
    """The device part of a device key: ``gpu0`` of ``node-a/gpu0`` (or of ``gpu0``)."""
    return key.rsplit("/", 1)[-1]


def node_of(key: str) -> str | None:
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


def device_frames(tele: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    """Samples per device key (:func:`device_keys`), each sorted by time."""
    if tele is None or len(tele) == 0 or "device" not in tele.columns:
        return {}
    keys = device_keys(tele)
    out: dict[str, pd.DataFrame] = {}
    for dev, df in tele.groupby(keys.to_numpy(), sort=True):
        out[str(dev)] = df.sort_values("t", kind="stable")
    return out


def _peak(values: np.ndarray) -> float | None:
    return finite(np.nanmax(values)) if len(values) and not np.all(np.isnan(values)) else None


def _mean(values: np.ndarray) -> float | None:
    return finite(np.nanmean(values)) if len(values) and not np.all(np.isnan(values)) else None


def peak_power(
    frames: dict[str, pd.DataFrame], curves: dict[str, EnergyCurve], w0: float, w1: float
) -> tuple[float | None, dict[str, float | None]]:
    """Peak power (W) in [w0, w1] of the ``curves``' devices together, and of each:
    sampled power where recorded, else the counter's slope.

    A window with no sample inside uses the power interpolated at its edges.
    """
    per_dev: dict[str, float | None] = {}
    series: list[tuple[np.ndarray, np.ndarray]] = []
    grids: list[np.ndarray] = [np.array([w0, w1])]
    for d, c in curves.items():
        t = column(frames[d], "t")
        w = column(frames[d], "power_w")
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
        per_dev[d] = finite(max(w[inside].max() if inside.any() else -np.inf, edge.max()))
        series.append((t, w))
        grids.append(t[inside])
    if not series:
        return None, per_dev
    grid = np.unique(np.concatenate(grids))
    total = np.zeros(len(grid))
    for t, w in series:
        total += np.interp(grid, t, w)
    return finite(total.max()), per_dev


def memory_use(
    frames: dict[str, pd.DataFrame],
    devices: list[str],
    manifest: TelemetryManifest,
    capacity: float | None,
) -> dict[str, MemoryUse]:
    """Peak memory of each device against ``capacity`` (bytes; the hardware database's, for
    GPUs) or, without one, the total the telemetry recorded."""
    totals = manifest.mem_total_bytes
    per: dict[str, MemoryUse] = {}
    for d in devices:
        df = frames[d]
        cap = capacity if capacity is not None else finite(totals.get(d))
        peak = _peak(column(df, "mem_used_bytes"))
        per[d] = MemoryUse(
            peak_used_bytes=peak,
            capacity_bytes=cap,
            peak_pct_of_capacity=100.0 * peak / cap if peak is not None and cap else None,
            torch_peak_allocated_bytes=_peak(column(df, "torch_peak_allocated_bytes")),
            torch_peak_reserved_bytes=_peak(column(df, "torch_reserved_bytes")),
        )
    return per


def throttle(frames: dict[str, pd.DataFrame], devices: list[str], w0: float, w1: float) -> Throttle:
    """Share of each GPU's samples in [w0, w1] with a throttle reason set, and their mean."""
    shares: dict[str, ThrottleShare] = {}
    for d in devices:
        df = frames[d]
        t = column(df, "t")
        thr = column(df, "throttle")
        m = (t >= w0) & (t <= w1) & ~np.isnan(thr)
        if not m.any():
            continue
        bits = thr[m].astype(np.int64)
        shares[d] = ThrottleShare.from_dict(
            {
                "any": float(np.mean((bits & _THROTTLE_MASK) != 0)),
                **{
                    name: float(np.mean((bits & bit) != 0))
                    for name, bit in THROTTLE_REASONS.items()
                },
            }
        )
    if not shares:
        return Throttle(share=None, per_device={})
    return Throttle(share=float(np.mean([s.any for s in shares.values()])), per_device=shares)


def _cpu_key(frames: dict[str, pd.DataFrame], manifest: TelemetryManifest) -> str | None:
    """The host whose CPU the top-level ``cpu`` section describes: this host on a single-host
    run, the driver's node on a cluster (every node's is under ``nodes``)."""
    if "cpu" in frames:
        return "cpu"
    driver = manifest.driver_node
    if driver and f"{driver}/cpu" in frames:
        return f"{driver}/cpu"
    return next((d for d in frames if kind_of(d) == "cpu"), None)


def cpu_use(
    frames: dict[str, pd.DataFrame], manifest: TelemetryManifest, w0: float, w1: float
) -> EnergyCpu:
    """The host CPU over [w0, w1]: process and system CPU and memory, RAPL energy."""
    key = _cpu_key(frames, manifest)
    df = frames.get(key) if key is not None else None
    if df is None:
        return EnergyCpu(sampled=False)
    t = column(df, "t")
    m = (t >= w0) & (t <= w1)
    common = EnergyCpu(
        sampled=True,
        peak_rss_bytes=_peak(column(df, "peak_rss_bytes")),
        avg_process_cpu_pct=_mean(column(df, "proc_cpu_pct")[m]),
        avg_system_cpu_pct=_mean(column(df, "util_pct")[m]),
        peak_system_mem_used_bytes=_peak(column(df, "mem_used_bytes")),
        system_mem_total_bytes=finite(manifest.mem_total_bytes.get("cpu")),
    )
    e = column(df, "energy_j")
    ok = ~np.isnan(e)
    curve = EnergyCurve.from_counter(t[ok], e[ok])
    if curve is None:
        return dataclasses.replace(
            common,
            energy_available=False,
            energy_reason=manifest.cpu_energy_unavailable
            or "cpu energy unavailable: no RAPL samples",
        )
    de = column(df, "dram_energy_j")
    okd = ~np.isnan(de)
    dcurve = EnergyCurve.from_counter(t[okd], de[okd])
    return dataclasses.replace(
        common,
        package_energy_j=curve.total(w0, w1),
        dram_energy_j=dcurve.total(w0, w1) if dcurve else None,
        energy_available=True,
    )


def hardware_counters(
    frames: dict[str, pd.DataFrame],
    devices: list[str],
    windows: dict[str, tuple[np.ndarray, np.ndarray]],
) -> dict[str, HardwareCounters]:
    """The measured GPU counters of ``devices`` per named set of disjoint windows (starts,
    ends in ns): the mean over the devices of each one's time-weighted mean; a window no
    counter was sampled in is left out."""
    out: dict[str, HardwareCounters] = {}
    for name, (starts, ends) in windows.items():
        row: dict[str, float | None] = {}
        for name_ in _COUNTER_COLUMNS:
            vals = [
                windowed_mean(column(frames[d], "t"), column(frames[d], name_), starts, ends)
                for d in devices
            ]
            vals_ok = [v for v in vals if v is not None]
            row[name_] = float(np.mean(vals_ok)) if vals_ok else None
        if any(v is not None for v in row.values()):
            out[str(name)] = HardwareCounters.from_dict(row)
    return out


def cluster_energy(
    frames: dict[str, pd.DataFrame],
    curves: dict[str, EnergyCurve],
    manifest: TelemetryManifest,
    w0: float,
    w1: float,
    source: str | None,
) -> tuple[dict[str, NodeEnergy], ClusterEnergy]:
    """Per-node power and memory of a cluster run, and the cluster totals.

    A node's energy counts only its headline devices (the ones in ``curves``), so the nodes'
    energies add up to the run's total; a node none of whose devices has a power reading
    is listed in ``nodes_without_power``.
    """
    window_s = (w1 - w0) / 1e9
    wa, wb = np.array([w0]), np.array([w1])
    nodes: dict[str, NodeEnergy] = {}
    names = sorted({n for d in frames if (n := node_of(d)) is not None})
    for node in names:
        devs = sorted(d for d in frames if node_of(d) == node)
        mine = {d: c for d, c in curves.items() if node_of(d) == node}
        gpus = [d for d in devs if kind_of(d).startswith("gpu")]
        gpu_peaks = [p for d in gpus if (p := _peak(column(frames[d], "mem_used_bytes")))]
        energy = float(energy_between(mine, wa, wb)[0]) if mine else None
        nodes[node] = NodeEnergy(
            devices=tuple(kind_of(d) for d in devs),
            gpus=len(gpus),
            power_source=source if mine else None,
            power_devices=tuple(kind_of(d) for d in sorted(mine)),
            energy_j=energy,
            avg_power_w=ratio(energy, window_s),
            peak_power_w=peak_power(frames, mine, w0, w1)[0] if mine else None,
            # Sum of each GPU's own peak: an upper bound of what was in use at one moment.
            gpu_mem_used_peak_bytes=float(sum(gpu_peaks)) if gpu_peaks else None,
            gpu_mem_total_bytes=finite(
                sum(float(manifest.mem_total_bytes.get(d) or 0) for d in gpus)
            )
            or None,
            system_mem_used_peak_bytes=_peak(column(frames.get(f"{node}/cpu"), "mem_used_bytes")),
            system_mem_total_bytes=finite(manifest.mem_total_bytes.get(f"{node}/cpu")),
        )
    with_power = [n for n, e in nodes.items() if e.energy_j is not None]
    total = float(sum(nodes[n].energy_j or 0.0 for n in with_power)) if with_power else None
    cluster = ClusterEnergy(
        nodes=tuple(names),
        nodes_with_power=tuple(with_power),
        nodes_without_power=tuple(n for n in names if n not in with_power),
        energy_j=total,
        avg_power_w=ratio(total, window_s),
        gpu_mem_used_peak_bytes=finite(sum(e.gpu_mem_used_peak_bytes or 0 for e in nodes.values()))
        or None,
        system_mem_used_peak_bytes=finite(
            sum(e.system_mem_used_peak_bytes or 0 for e in nodes.values())
        )
        or None,
    )
    return nodes, cluster


def cluster_note(cluster: ClusterEnergy, source: str | None) -> str:
    """The sentence saying what a cluster's headline energy counts (and leaves out)."""
    names = cluster.nodes
    missing = cluster.nodes_without_power
    what = {"gpu": "GPUs'", "cpu": "CPU packages' (RAPL)"}.get(source or "", "")
    if source is None:
        return (
            f"no node of the cluster ({', '.join(names)}) had a power reading: energy is "
            "unavailable"
        )
    text = (
        f"energy and energy per token are the cluster total of {len(cluster.nodes_with_power)}"
        f" of {len(names)} nodes' {what} energy ({', '.join(cluster.nodes_with_power)})"
    )
    if missing:
        text += f"; no power reading on {', '.join(missing)} (not counted)"
    return text
