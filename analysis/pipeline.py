"""The analysis stage: a stored run's records in, its typed :class:`Summary` out.

:func:`analyze` owns the list of sections and the order they are computed in:

1. per-request rows (once; every section that needs them reuses them),
2. ``hardware``: the device the run is analysed against,
3. ``energy``: the telemetry join,
4. ``roofline``: per phase, with the energy of each phase (a draft model's passes are
   phases of their own, costed with the draft's spec),
5. ``advice`` and ``projections`` (only with a roofline, a model and a device),
6. metrics: counts, latency, throughput, goodput, driver lag, errors
   (:class:`~perfscope.analysis.metrics.RunMetrics`), steps, warnings,
7. ``server_metrics``: the server's own metrics for the run, when they were scraped (split
   against the client's latency means),
8. ``prompt_cache``, ``client`` and ``speculative``;

then it constructs the :class:`Summary` once, from those records.

It is a pure function of the run's records and the analysis inputs (SLOs, device): it reads
and writes no file, so ``perfscope analyze`` reproduces a run's numbers exactly and can re-derive
them with other SLOs or against another device. Storing the result is the caller's business.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pandas as pd

from perfscope.analysis.advisor import advise
from perfscope.analysis.calibration import machine_of_device, projection_check
from perfscope.analysis.client import client_section
from perfscope.analysis.energy import energy_section
from perfscope.analysis.manifest import RunManifest
from perfscope.analysis.metrics import compute_metrics, per_request
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.prompt_cache import prompt_cache_section
from perfscope.analysis.roofline import roofline_section
from perfscope.analysis.run_records import RunRecords
from perfscope.analysis.server_metrics import server_metrics_section
from perfscope.analysis.speculative import speculative_config, speculative_section
from perfscope.analysis.summary import (
    Advice,
    Hardware,
    Projection,
    RunSet,
    ServerMetrics,
    Summary,
    contention_record,
    engine_info,
    run_warnings,
    step_breakdown,
)
from perfscope.analysis.whatif import project_run
from perfscope.hwdb import HardwareDatabase, load_database, resolve_hardware
from perfscope.hwdb.spec import DeviceSpec

__all__ = ["PROJECTION_DEVICES", "RunRecords", "analyze"]

#: Devices a measured run is projected onto ("the same workload on other devices").
PROJECTION_DEVICES = ("l4", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb")


def _hardware(
    manifest: RunManifest, device: str | DeviceSpec | None, database: HardwareDatabase | None
) -> Hardware:
    """The manifest's ``hardware``, or the device asked for (a name or a spec)."""
    if isinstance(device, DeviceSpec):
        return Hardware(spec=device.to_dict(), resolved_from=f"given: {device.key}")
    if device:
        return Hardware.from_dict(
            resolve_hardware(manifest.engine.to_dict(), device, database=database)
        )
    recorded = manifest.hardware
    return Hardware.from_dict(recorded) if recorded else Hardware(reason="not recorded")


def _workload_stats(run: RunRecords, manifest: RunManifest) -> dict[str, float | int | None]:
    """Mean prompt/output tokens of the completed measured requests, the configured batch."""
    r = run.requests
    measured = r[~r["is_warmup"].astype(bool)] if not r.empty else r
    ok = measured[measured["error"].isna()] if not measured.empty else measured
    return {
        "prompt_tokens_mean": float(ok["prompt_tokens"].mean()) if len(ok) else None,
        "output_tokens_mean": float(ok["output_tokens"].mean()) if len(ok) else None,
        "batch_size": manifest.engine.config.batch_size,
        "requests": len(measured),
    }


def analyze(
    stored_run: RunRecords,
    *,
    slos: Mapping[str, float] | None = None,
    device: str | DeviceSpec | None = None,
    database: HardwareDatabase | None = None,
    server_metrics: pd.DataFrame | None = None,
) -> Summary:
    """The summary of ``stored_run``.

    Args:
        stored_run: the run's manifest and tables (a ``StoredRun``).
        slos: per-request SLO limits in seconds (``{"ttft": 0.2}``); ``None`` keeps the
            manifest's.
        device: the device to analyse against: anything the hardware lookup accepts, or a
            :class:`DeviceSpec`; ``None`` keeps the device recorded in the manifest.
        database: an already loaded hardware database (else loaded once, when needed).
        server_metrics: the run's ``server_metrics.parquet`` rows (the server's own
            Prometheus metrics), when it has them; they add the ``server_metrics`` section.

    Raises:
        UnknownDeviceError: ``device`` names no known device.
    """
    manifest = RunManifest.from_dict(stored_run.manifest)
    rows = per_request(stored_run.requests)
    hardware = _hardware(manifest, device, database)
    if device is not None:
        recorded = manifest.device_key
        if recorded and recorded != (hardware.spec or {}).get("key"):
            # Analysed against a device the run did not run on: a what-if (no measured
            # MFU/MBU against it, no advice).
            hardware = dataclasses.replace(hardware, measured_on=recorded)
    measured_on = hardware.measured_on
    spec = hardware.device
    model_dict = manifest.engine.model
    model = ModelSpec.from_dict(dict(model_dict)) if model_dict else None
    spec_cfg = speculative_config(manifest) or {}
    draft_dict = spec_cfg.get("draft_model")
    draft_model = ModelSpec.from_dict(dict(draft_dict)) if draft_dict else None

    energy = energy_section(
        stored_run.telemetry,
        stored_run.steps,
        stored_run.requests,
        stored_run.chunks,
        manifest.telemetry,
        tdp_w=spec.tdp_w if spec else None,
        mem_capacity_bytes=spec.mem_bytes if spec else None,
    )
    roofline = roofline_section(
        stored_run.steps,
        stored_run.requests,
        stored_run.chunks,
        model,
        spec,
        energy=energy.phases,
        measured_on=measured_on,
        draft_model=draft_model,
        medusa_heads=(
            int(spec_cfg.get("num_speculative_tokens") or 0)
            if spec_cfg.get("method") == "medusa"
            else 0
        ),
    )
    advice: list[Advice] = []
    projections: list[Projection] = []
    if roofline.available and model is not None and spec is not None:
        workload = _workload_stats(stored_run, manifest)
        if roofline.what_if is None:  # advice needs measured efficiencies
            advice = advise(roofline, model, spec, workload)
        db = database if database is not None else load_database()
        targets = [db.devices[k] for k in PROJECTION_DEVICES if k in db.devices and k != spec.key]
        # Every projection shown says how far projections were checked on its target's
        # machine class by stored studies, or that they were not.
        kind = manifest.engine.kind
        projected = project_run(
            roofline, model, workload, targets, measured_on=measured_on or spec.key
        )
        projections = [
            dataclasses.replace(p, checked=projection_check(machine_of_device(dev, kind)))
            for p, dev in zip(projected, targets, strict=True)
        ]
    client = client_section(manifest)
    metrics = compute_metrics(
        stored_run.requests,
        stored_run.chunks,
        stored_run.steps,
        dict(manifest.slos) if slos is None else dict(slos),
        per_request_rows=rows,
    )
    server: ServerMetrics | None = None
    if server_metrics is not None or manifest.server_metrics:
        server = server_metrics_section(
            server_metrics if server_metrics is not None else pd.DataFrame(),
            manifest.server_metrics,
            client_ttft_mean_s=metrics.latency.ttft.mean,
            client_tpot_mean_s=metrics.latency.tpot.mean,
            model=model,
            requests=stored_run.requests,
            client_stall=client.stall if client is not None else None,
        )
    engine = manifest.engine
    return Summary(
        run_id=manifest.run_id,
        name=manifest.name,
        status=manifest.status,
        started_at=manifest.started_at,
        perfscope_version=manifest.perfscope_version,
        engine=engine_info(manifest),
        workload=dict(manifest.workload) if manifest.workload is not None else None,
        load=dict(manifest.load) if manifest.load is not None else None,
        counts=metrics.counts,
        window_s=float(metrics.window_s),
        latency=metrics.latency,
        throughput=metrics.throughput,
        goodput=metrics.goodput,
        driver_lag=metrics.driver_lag,
        errors=metrics.errors,
        steps=step_breakdown(stored_run.steps),
        model=dict(engine.model) if engine.model is not None else None,
        warnings=tuple(run_warnings(manifest)),
        hardware=hardware,
        roofline=roofline,
        energy=energy,
        advice=tuple(advice),
        projections=tuple(projections),
        speculative=speculative_section(stored_run.steps, manifest, roofline),
        prompt_cache=prompt_cache_section(stored_run.requests),
        client=client,
        contention=contention_record(manifest),
        run_set=RunSet.from_dict(manifest.run_set) if manifest.run_set is not None else None,
        model_spec=dict(manifest.model_spec) if manifest.model_spec is not None else None,
        server_metrics=server,
    )
