"""Turn a stored run into summary.json: metrics, hardware, roofline, energy, advice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfscope.analysis.advisor import advise
from perfscope.analysis.energy import energy_section
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.roofline import roofline_section
from perfscope.analysis.summary import build_summary
from perfscope.analysis.whatif import project_run
from perfscope.errors import PerfscopeError
from perfscope.hwdb import load_database, lookup, resolve_device
from perfscope.hwdb.spec import DeviceSpec
from perfscope.profiler.store import StoredRun, read_run, write_json_atomic

__all__ = ["analyze_path", "analyze_stored", "resolve_hardware"]

_REMOTE_KINDS = {"openai"}


def resolve_hardware(engine: dict[str, Any], hw: str | None) -> dict[str, Any]:
    """The device a run is analysed against, as stored in ``manifest["hardware"]``.

    ``hw`` (anything the hardware lookup accepts) wins. Otherwise: a CUDA engine is looked up
    by its device name; a remote server is unknown (``spec`` None, with the reason); anything
    else ran on this machine and gets its detected device (calibrated on CPUs).
    Raises UsageError for a ``hw`` the database cannot resolve.
    """
    if hw:
        spec = resolve_device(hw)
        return {"spec": spec.to_dict(), "resolved_from": f"--hw {hw}"}
    kind = engine.get("kind")
    if kind in _REMOTE_KINDS:
        return {
            "spec": None,
            "resolved_from": None,
            "reason": "the engine is a remote server: pass --hw DEVICE to analyse against "
            "the server's accelerator",
        }
    device = str(engine.get("device") or "")
    name = (engine.get("config") or {}).get("device_name")
    try:
        if device.startswith("cuda") and name:
            try:
                return {"spec": lookup(str(name)).to_dict(), "resolved_from": f"CUDA {name}"}
            except PerfscopeError:
                pass
        spec = resolve_device(None)
    except PerfscopeError as exc:
        return {"spec": None, "resolved_from": None, "reason": str(exc)}
    return {"spec": spec.to_dict(), "resolved_from": "detected"}


def _device_of(run: StoredRun, hw: str | None) -> tuple[DeviceSpec | None, dict[str, Any]]:
    if hw:
        hardware = resolve_hardware(run.manifest.get("engine") or {}, hw)
        measured = ((run.manifest.get("hardware") or {}).get("spec") or {}).get("key")
        if measured and measured != (hardware.get("spec") or {}).get("key"):
            hardware["measured_on"] = measured  # a what-if: see roofline_section
    else:
        hardware = run.manifest.get("hardware") or {"spec": None, "reason": "not recorded"}
    spec = hardware.get("spec")
    return (DeviceSpec.from_dict(spec) if spec else None), hardware


#: Devices a measured run is projected onto ("the same workload on other devices").
PROJECTION_DEVICES = ("l4", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb")


def _workload_stats(run: StoredRun) -> dict[str, Any]:
    r = run.requests
    measured = r[~r["is_warmup"].astype(bool)] if not r.empty else r
    ok = measured[measured["error"].isna()] if not measured.empty else measured
    cfg = (run.manifest.get("engine") or {}).get("config") or {}
    return {
        "prompt_tokens_mean": float(ok["prompt_tokens"].mean()) if len(ok) else None,
        "output_tokens_mean": float(ok["output_tokens"].mean()) if len(ok) else None,
        "batch_size": cfg.get("batch_size"),
        "requests": len(measured),
    }


def _roofline_sections(
    run: StoredRun, device: DeviceSpec | None, measured_on: str | None = None
) -> dict[str, Any]:
    """``energy``, ``roofline``, ``advice`` and ``projections`` of the summary."""
    model_dict = (run.manifest.get("engine") or {}).get("model")
    model = ModelSpec.from_dict(model_dict) if model_dict else None
    energy = energy_section(
        run.telemetry,
        run.steps,
        run.requests,
        run.chunks,
        run.manifest.get("telemetry") or {},
        tdp_w=device.tdp_w if device else None,
        mem_capacity_bytes=device.mem_bytes if device else None,
    )
    roofline = roofline_section(
        run.steps,
        run.requests,
        run.chunks,
        model,
        device,
        energy=energy.get("phases"),
        measured_on=measured_on,
    )
    out: dict[str, Any] = {"roofline": roofline, "energy": energy, "advice": [], "projections": []}
    if not roofline.get("available") or model is None or device is None:
        return out
    workload = _workload_stats(run)
    if not roofline.get("what_if"):  # advice needs measured efficiencies
        out["advice"] = advise(roofline, model, device, workload)
    db = load_database()
    targets = [db.devices[k] for k in PROJECTION_DEVICES if k in db.devices and k != device.key]
    out["projections"] = project_run(
        roofline, model, workload, targets, measured_on=measured_on or device.key
    )
    return out


def analyze_stored(
    run: StoredRun,
    *,
    slos: dict[str, float] | None = None,
    hw: str | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """Compute (and by default write) the summary of ``run``.

    Args:
        slos: SLO limits in seconds; ``None`` keeps the ones recorded in the manifest.
        hw: device to analyse against (anything the hardware lookup accepts); ``None`` keeps
            the device recorded in the manifest.
    """
    device, hardware = _device_of(run, hw)
    extra: dict[str, Any] = {"hardware": hardware}
    extra.update(_roofline_sections(run, device, hardware.get("measured_on")))
    summary = build_summary(
        run.manifest,
        run.requests,
        run.chunks,
        run.steps,
        run.telemetry,
        slos=slos,
        extra_sections=extra,
    )
    if write:
        write_json_atomic(run.path / "summary.json", summary)
    run.summary = summary
    return summary


def analyze_path(
    path: Path | str, *, slos: dict[str, float] | None = None, hw: str | None = None
) -> dict[str, Any]:
    """Read the run at ``path``, recompute and write its summary."""
    return analyze_stored(read_run(path), slos=slos, hw=hw)
