"""From "what the user asked for" (or nothing) to the ceilings the analysis should use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from perfscope.errors import PerfscopeError, UnknownDeviceError
from perfscope.hwdb._detect import detect_local_device
from perfscope.hwdb._loader import HardwareDatabase, load_database
from perfscope.hwdb.calibrate import cached_calibration, calibrate
from perfscope.hwdb.spec import DeviceSpec

__all__ = ["lookup", "resolve_device", "resolve_hardware"]

#: ``--hw`` values that ask for measured ceilings instead of a database entry.
_CALIBRATED_WORDS = {"cpu": "cpu", "calibrated": None, "calibrate": None}


def lookup(name: str, user_dirs: Sequence[Path | str] | None = None) -> DeviceSpec:
    """The database device that ``name`` (key, alias or raw driver name) denotes.

    Raises:
        UnknownDeviceError: with ``.suggestions``, the nearest keys.
    """
    return load_database(user_dirs).lookup(name)


def _calibrated(device: str, *, calibrate_if_missing: bool, quick: bool, what: str) -> DeviceSpec:
    hit = cached_calibration(device, quick=True)
    if hit is not None:
        return hit.to_device_spec()
    if not calibrate_if_missing:
        raise UnknownDeviceError(
            f"{what} has no datasheet ceilings and no cached calibration; run "
            "`perfscope hw calibrate` or pass --hw DEVICE"
        )
    return calibrate(device, quick=quick).to_device_spec()


def resolve_device(
    hw: str | None,
    *,
    user_dirs: Sequence[Path | str] | None = None,
    calibrate_if_unknown: bool = True,
    quick: bool = True,
    database: HardwareDatabase | None = None,
) -> DeviceSpec:
    """The device spec a run or analysis should use.

    * ``hw`` given: database lookup (key, alias or raw name); ``"cpu"`` asks for the CPU's
      calibrated ceilings, ``"calibrated"`` for the detected device's.
    * ``hw`` is ``None``: detect; a known GPU gives its datasheet spec; a CPU or an unknown
      GPU gives calibrated ceilings (``source="calibrated"``), read from the cache when
      present, else measured (``quick`` settings by default) when ``calibrate_if_unknown``.

    ``database`` is an already loaded database (else it is loaded from ``user_dirs``).

    Raises:
        UnknownDeviceError: ``hw`` is not in the database, or no ceilings can be had
            without calibrating and ``calibrate_if_unknown`` is false.
    """
    db = database if database is not None else load_database(user_dirs)
    if hw is not None:
        spec = db.find(hw)
        if spec is not None:
            return spec
        word = hw.strip().lower()
        if word in _CALIBRATED_WORDS:
            if _CALIBRATED_WORDS[word] == "cpu":
                return _calibrated("cpu", calibrate_if_missing=True, quick=quick, what="the CPU")
            hw = None
            calibrate_if_unknown = True
            force_calibrated = True
        else:
            return db.lookup(hw)  # raises with suggestions
    else:
        force_calibrated = False
    detected = detect_local_device(list(map(Path, user_dirs)) if user_dirs else None, database=db)
    if detected.kind == "gpu" and detected.spec is not None and not force_calibrated:
        return detected.spec
    device = "cpu" if detected.kind == "cpu" else "cuda:0"
    what = f"the detected {detected.kind} {detected.name!r}"
    return _calibrated(device, calibrate_if_missing=calibrate_if_unknown, quick=quick, what=what)


#: Engine kinds that talk to a remote server: the accelerator is not this machine's.
_REMOTE_KINDS = frozenset({"openai"})


def resolve_hardware(
    engine: Mapping[str, Any], hw: str | None, *, database: HardwareDatabase | None = None
) -> dict[str, Any]:
    """The device a run is analysed against, in the form stored as ``manifest["hardware"]``:
    ``{"spec": DeviceSpec JSON or None, "resolved_from": str or None, "reason"?: str}``.

    ``engine`` is the engine's info (``kind``, ``device``, ``config.device_name``). ``hw``
    (anything :func:`resolve_device` accepts) wins. Otherwise a CUDA engine is looked up by its
    device name; a remote server is unknown (``spec`` None, with the reason); anything else ran
    on this machine and gets its detected device (calibrated on CPUs). ``database`` is an
    already loaded database, so a run loads it once.

    Raises:
        UnknownDeviceError: ``hw`` is given and the database cannot resolve it.
    """
    db = database if database is not None else load_database()
    if hw:
        spec = resolve_device(hw, database=db)
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
                return {"spec": db.lookup(str(name)).to_dict(), "resolved_from": f"CUDA {name}"}
            except PerfscopeError:
                pass
        spec = resolve_device(None, database=db)
    except PerfscopeError as exc:
        return {"spec": None, "resolved_from": None, "reason": str(exc)}
    return {"spec": spec.to_dict(), "resolved_from": "detected"}
