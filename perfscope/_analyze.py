"""Turn a stored run into summary.json: metrics, hardware, roofline, energy, advice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfscope.analysis.summary import build_summary
from perfscope.errors import PerfscopeError
from perfscope.hwdb import lookup, resolve_device
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
    else:
        hardware = run.manifest.get("hardware") or {"spec": None, "reason": "not recorded"}
    spec = hardware.get("spec")
    return (DeviceSpec.from_dict(spec) if spec else None), hardware


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
