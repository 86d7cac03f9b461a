"""The energy section: telemetry joined with the run's steps and requests, as an
:class:`~perfscope.analysis.summary.Energy` record (see :mod:`perfscope.analysis.energy`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from perfscope.analysis.energy.attribution import attribute, request_energy
from perfscope.analysis.energy.curves import (
    EnergyCurve,
    column,
    energy_between,
    finite,
    pick_curves,
    ratio,
)
from perfscope.analysis.energy.devices import (
    cluster_energy,
    cluster_note,
    cpu_use,
    device_frames,
    hardware_counters,
    kind_of,
    memory_use,
    node_of,
    peak_power,
    throttle,
)
from perfscope.analysis.manifest import TelemetryManifest
from perfscope.analysis.summary import Energy, EnergyCpu, EnergyPower

__all__ = ["energy_section"]


def _measured(requests: pd.DataFrame | None) -> pd.DataFrame:
    """The measured requests (warmup left out); an empty frame without requests."""
    req = requests if requests is not None else pd.DataFrame()
    if len(req) and "is_warmup" in req.columns:
        req = req[~req["is_warmup"].fillna(False).astype(bool)]
    return req


def _measured_window(
    requests: pd.DataFrame | None, steps: pd.DataFrame | None, frames: dict[str, pd.DataFrame]
) -> tuple[float, float] | None:
    """The measured window (ns): first measured send to last token; else the steps' span;
    else the samples' span; ``None`` when there is nothing."""
    req = _measured(requests)
    if len(req):
        sent = column(req, "t_sent")
        last = column(req, "t_last_token")
        if len(sent) and not np.all(np.isnan(sent)) and not np.all(np.isnan(last)):
            return float(np.nanmin(sent)), float(np.nanmax(last))
    if steps is not None and len(steps):
        return float(np.nanmin(column(steps, "t_start"))), float(np.nanmax(column(steps, "t_end")))
    ts = [column(df, "t") for df in frames.values()]
    if ts and any(len(x) for x in ts):
        allt = np.concatenate(ts)
        return float(allt.min()), float(allt.max())
    return None


@dataclasses.dataclass
class _Headline:
    """The devices that carry the headline energy: ``source`` (gpu, cpu or ``None``), their
    curves and ``method``, why there are none (``reasons``) and what to note."""

    source: str | None
    curves: dict[str, EnergyCurve]
    method: str
    reasons: list[str]
    notes: list[str]


def _headline(
    frames: dict[str, pd.DataFrame], manifest: TelemetryManifest, clustered: bool
) -> _Headline:
    """The GPUs when GPU telemetry measures energy, else the CPU packages by RAPL counter,
    else none, with the reasons (never an estimate from TDP)."""
    gpus = [d for d in frames if kind_of(d).startswith("gpu")]
    cpus = [d for d in frames if kind_of(d) == "cpu"]
    gpu_curves, gpu_method = (
        pick_curves(frames, gpus, partial=clustered) if gpus else ({}, "unavailable")
    )
    source: str | None = None
    curves: dict[str, EnergyCurve] = {}
    method = "unavailable"
    if gpu_curves:
        source, curves, method = "gpu", gpu_curves, gpu_method
    elif cpus:
        cpu_curves, cpu_method = pick_curves(frames, cpus, partial=clustered)
        if cpu_curves and cpu_method == "counter":
            source, curves, method = "cpu", cpu_curves, "counter"

    notes: list[str] = []
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
    return _Headline(source, curves, method, reasons, notes)


def _power(
    frames: dict[str, pd.DataFrame],
    head: _Headline,
    manifest: TelemetryManifest,
    w0: float,
    w1: float,
    avg_w: float | None,
    tdp_w: float | None,
) -> EnergyPower:
    """Average and peak power against the devices' power limits and (GPUs) their TDP."""
    peak, peak_dev = peak_power(frames, head.curves, w0, w1)
    limits = manifest.power_limits_w
    limit_total = sum(float(limits.get(d) or 0.0) for d in head.curves) or None
    tdp = tdp_w * len(head.curves) if tdp_w and head.source == "gpu" else None
    return EnergyPower(
        avg_w=avg_w,
        peak_w=peak,
        peak_per_device_w=peak_dev,
        limit_w=limit_total,
        tdp_w=finite(tdp) if tdp else None,
        avg_pct_of_limit=finite(100.0 * avg_w / limit_total)
        if limit_total and avg_w is not None
        else None,
        peak_pct_of_limit=finite(100.0 * peak / limit_total) if limit_total and peak else None,
        avg_pct_of_tdp=finite(100.0 * avg_w / tdp) if tdp and avg_w is not None else None,
        peak_pct_of_tdp=finite(100.0 * peak / tdp) if tdp and peak else None,
    )


def _cross_check(
    frames: dict[str, pd.DataFrame], curves: dict[str, EnergyCurve], w0: float, w1: float
) -> dict[str, float | None]:
    """GPU energy by counter: the same window by integrated power (J) and the counter's
    difference from it (%), and the counter's update period seen in the data (s)."""
    out: dict[str, float | None] = {}
    integ, integ_method = pick_curves(
        {d: frames[d].assign(energy_j=np.nan) for d in curves}, list(curves)
    )
    if integ_method == "integrated":
        total = float(energy_between(curves, np.array([w0]), np.array([w1]))[0])
        it = float(energy_between(integ, np.array([w0]), np.array([w1]))[0])
        out["integrated_total_j"] = it
        out["counter_vs_integrated_pct"] = finite(100.0 * (total - it) / it) if it else None
    # The update period, from the spacing of value changes.
    periods = [float(np.median(np.diff(c.t[:-1]))) / 1e9 for c in curves.values() if len(c.t) > 3]
    if periods:
        out["counter_update_period_s"] = float(np.median(periods))
    return out


def energy_section(
    telemetry: pd.DataFrame,
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    chunks: pd.DataFrame,
    manifest_telemetry: Mapping[str, Any] | TelemetryManifest | None,
    *,
    tdp_w: float | None = None,
    mem_capacity_bytes: float | None = None,
) -> Energy:
    """Join telemetry with the run's steps and requests (see :mod:`perfscope.analysis.energy`).

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
        The :class:`~perfscope.analysis.summary.Energy` record: ``available``/``reason``,
        ``method`` (counter | integrated | unavailable), ``source`` (gpu | cpu), the window,
        ``total_j``, ``j_per_output_token``, ``tokens_per_j``, power against limit and TDP,
        ``phases``, ``requests``, idle baseline and dynamic energy, ``memory``,
        ``throttle``, measured hardware counters per phase, ``cpu``, per-node energy on a
        cluster, and notes.
    """
    manifest = TelemetryManifest.of(manifest_telemetry)
    frames = device_frames(telemetry)
    gpus = [d for d in frames if kind_of(d).startswith("gpu")]
    clustered = any(node_of(d) is not None for d in frames)

    req = _measured(requests)
    window = _measured_window(requests, steps, frames)
    out_tokens = float(np.nansum(column(req, "output_tokens"))) if len(req) else 0.0
    if out_tokens == 0 and chunks is not None and len(chunks) and window is not None:
        ct = column(chunks, "t")
        out_tokens = float(
            np.nansum(column(chunks, "n_tokens")[(ct >= window[0]) & (ct <= window[1])])
        )

    head = _headline(frames, manifest, clustered)
    notes = head.notes
    base = Energy(
        available=head.source is not None and window is not None,
        reason="; ".join(head.reasons) if head.reasons else None,
        method=head.method,
        source=head.source,
        devices=tuple(sorted(head.curves)),
        window_s=finite((window[1] - window[0]) / 1e9) if window else None,
        output_tokens=int(out_tokens),
    )
    if window is None:
        # (A host with CPU samples always has a window: the samples' span.)
        return dataclasses.replace(
            base,
            reason=base.reason or "no requests, steps or samples to define a window",
            cpu=EnergyCpu(sampled=False),
            notes=tuple(notes),
        )
    w0, w1 = window
    window_s = (w1 - w0) / 1e9
    sampled = dataclasses.replace(
        base,
        memory=memory_use(
            frames,
            gpus or [d for d in frames if kind_of(d) == "cpu"],
            manifest,
            mem_capacity_bytes if gpus else None,
        ),
        throttle=throttle(frames, gpus, w0, w1),
        cpu=cpu_use(frames, manifest, w0, w1),
    )
    if clustered:
        nodes, cluster = cluster_energy(frames, head.curves, manifest, w0, w1, head.source)
        sampled = dataclasses.replace(sampled, nodes=nodes, cluster=cluster)
        notes.append(cluster_note(cluster, head.source))
    if head.source is None:
        return dataclasses.replace(sampled, notes=tuple(notes))

    curves = head.curves
    total = float(energy_between(curves, np.array([w0]), np.array([w1]))[0])
    avg_w = ratio(total, window_s)
    coverage = min(
        (min(c.end, w1) - max(c.start, w0)) / (w1 - w0) if w1 > w0 else 1.0 for c in curves.values()
    )
    if coverage < 0.95:
        notes.append(
            f"telemetry covers {100 * coverage:.0f}% of the measured window; energy outside "
            "the sampled span is not counted"
        )
    by_counter = head.method == "counter" and head.source == "gpu"
    checks = _cross_check(frames, curves, w0, w1) if by_counter else {}

    baseline = manifest.idle_baseline_w
    base_w = sum(float(baseline.get(d) or 0.0) for d in curves)
    have_base = all(baseline.get(d) is not None for d in curves)
    if not have_base:
        notes.append("no idle baseline was sampled: dynamic energy is not separated")

    split = attribute(steps, requests, req, curves, w0, w1, total)
    period = checks.get("counter_update_period_s")
    if (
        split.method == "steps"
        and head.method == "counter"
        and period
        and split.median_step_s is not None
        and split.median_step_s < period
    ):
        notes.append(
            f"median step ({split.median_step_s * 1e3:.1f} ms) is shorter than the energy "
            f"counter's update period (~{period * 1e3:.0f} ms): per-step energy is "
            "smoothed over neighbouring steps; phase totals over many steps hold"
        )
    phases = split.phases
    if have_base:
        phases = {
            k: dataclasses.replace(p, dynamic_energy_j=(p.energy_j or 0.0) - base_w * p.time_s)
            if p.time_s is not None
            else p
            for k, p in phases.items()
        }
    counters = (
        hardware_counters(
            frames, list(curves), {"run": (np.array([w0]), np.array([w1])), **split.windows}
        )
        if head.source == "gpu"
        else {}
    )
    return dataclasses.replace(
        sampled,
        total_j=total,
        avg_power_w=avg_w,
        j_per_output_token=ratio(total, out_tokens),
        tokens_per_j=ratio(out_tokens, total),
        coverage=max(0.0, float(coverage)),
        idle_baseline_w=base_w if have_base else None,
        idle_energy_j=base_w * window_s if have_base else None,
        dynamic_energy_j=total - base_w * window_s if have_base else None,
        attribution=split.method,
        power=_power(frames, head, manifest, w0, w1, avg_w, tdp_w),
        phases=phases,
        requests=request_energy(split.per_request, req, total),
        hardware_counters=counters,
        notes=tuple(notes),
        integrated_total_j=checks.get("integrated_total_j"),
        counter_vs_integrated_pct=checks.get("counter_vs_integrated_pct"),
        counter_update_period_s=checks.get("counter_update_period_s"),
    )
