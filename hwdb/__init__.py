"""Hardware database: device specs, lookup, detection and calibrated ceilings.

Importing this package does not import torch; only :func:`calibrate` does.
"""

from perfscope.hwdb._detect import DetectedDevice, detect_local_device
from perfscope.hwdb._loader import BUILTIN_DIR, ENV_HWDB, HardwareDatabase, load_database
from perfscope.hwdb._lookup import normalize_name
from perfscope.hwdb._resolve import lookup, resolve_device, resolve_hardware
from perfscope.hwdb._schema import DeviceFileError, Entry, Quantity
from perfscope.hwdb.calibrate import (
    ENV_CACHE_DIR,
    CalibrationResult,
    cache_dir_default,
    cached_calibration,
    calibrate,
)
from perfscope.hwdb.spec import DTYPES, CeilingSource, DeviceSpec, normalize_dtype

__all__ = [
    "BUILTIN_DIR",
    "DTYPES",
    "ENV_CACHE_DIR",
    "ENV_HWDB",
    "CalibrationResult",
    "CeilingSource",
    "DetectedDevice",
    "DeviceFileError",
    "DeviceSpec",
    "Entry",
    "HardwareDatabase",
    "Quantity",
    "cache_dir_default",
    "cached_calibration",
    "calibrate",
    "detect_local_device",
    "load_database",
    "lookup",
    "normalize_dtype",
    "normalize_name",
    "resolve_device",
    "resolve_hardware",
    "spec_to_dict",
]


def spec_to_dict(spec: DeviceSpec) -> dict[str, object]:
    """JSON-ready form of a :class:`DeviceSpec` (SI units; ``extra`` included)."""
    from dataclasses import asdict

    d = asdict(spec)
    d["aliases"] = list(spec.aliases)
    return d
