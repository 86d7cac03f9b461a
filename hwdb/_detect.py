"""What is this machine's compute device? NVML name when a GPU is present, CPU model otherwise."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.hwdb.spec import DeviceSpec

if TYPE_CHECKING:
    from perfscope.hwdb._loader import HardwareDatabase

__all__ = [
    "DetectedDevice",
    "cpu_llc_bytes",
    "cpu_model_name",
    "detect_local_device",
    "nvml_gpu_names",
    "total_memory_bytes",
]

_SYS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class DetectedDevice:
    """The local device as found on this machine.

    Attributes:
        name: raw name string (NVML ``nvmlDeviceGetName`` or the CPU model name).
        kind: ``"gpu"`` or ``"cpu"``.
        spec: the database entry for ``name``, or ``None`` when the database does not know it.
        source: where the name came from: ``"nvml"``, ``"cpuinfo"``, ``"lscpu"``,
            ``"sysctl"`` or ``"platform"``.
        count: number of such devices (GPUs seen by NVML; 1 for the CPU).
        mem_bytes: device memory (GPU) or total system RAM (CPU), bytes.
        cores: logical CPU count (CPU only).
        llc_bytes: last-level cache size of the CPU, bytes, summed over cache instances.
    """

    name: str
    kind: str
    spec: DeviceSpec | None = None
    source: str = "cpuinfo"
    count: int = 1
    mem_bytes: float | None = None
    cores: int | None = None
    llc_bytes: float | None = None


def nvml_gpu_names() -> list[tuple[str, float | None]]:
    """``(name, memory bytes)`` of every NVIDIA GPU NVML reports; empty without GPU or driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver/library: this is the normal CPU-only case
        return []
    out: list[tuple[str, float | None]] = []
    try:
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            raw = pynvml.nvmlDeviceGetName(handle)
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            try:
                mem: float | None = float(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            except Exception:
                mem = None
            out.append((name.strip(), mem))
    except Exception:
        return out
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return out


def _cpuinfo_field(field: str) -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip().lower() == field and v.strip():
            return v.strip()
    return None


def _lscpu() -> str:
    try:
        return subprocess.run(
            ["lscpu"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_model_name() -> tuple[str, str]:
    """``(model name, where it came from)``: /proc/cpuinfo, then lscpu, sysctl (macOS), platform."""
    name = _cpuinfo_field("model name")
    if name:
        return re.sub(r"\s+", " ", name), "cpuinfo"
    m = re.search(r"^Model name:\s*(.+)$", _lscpu(), re.MULTILINE)
    if m and m.group(1).strip() not in ("", "-"):
        return m.group(1).strip(), "lscpu"
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            ).stdout.strip()
            if out:
                return out, "sysctl"
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU", "platform"


def _parse_size(text: str) -> float | None:
    m = re.match(r"^\s*([\d.]+)\s*([KMGkmg]?)(i?B)?", text)
    if not m:
        return None
    return float(m.group(1)) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[m.group(2).lower()]


def cpu_llc_bytes() -> float | None:
    """Total last-level cache of the CPU in bytes (size × number of distinct instances).

    Read from sysfs (``cpu*/cache/index*``); falls back to ``lscpu``'s "L3/L2 cache" line.
    """
    best_level, size, instances = -1, None, set()
    for cpu in sorted(_SYS_CPU.glob("cpu[0-9]*")):
        for idx in cpu.glob("cache/index[0-9]*"):
            try:
                level = int((idx / "level").read_text())
                ctype = (idx / "type").read_text().strip()
                if ctype == "Instruction":
                    continue
                s = _parse_size((idx / "size").read_text())
                shared = (idx / "shared_cpu_list").read_text().strip()
            except (OSError, ValueError):
                continue
            if s is None:
                continue
            if level > best_level:
                best_level, size, instances = level, s, {shared}
            elif level == best_level:
                instances.add(shared)
    if size is not None:
        return size * max(1, len(instances))
    text = _lscpu()
    for label in ("L3", "L2"):
        m = re.search(
            rf"^{label} cache:\s*([\d.]+\s*[KMG]i?B?)(?:\s*\((\d+) instances?\))?",
            text,
            re.MULTILINE,
        )
        if m:
            s = _parse_size(m.group(1))
            if s is not None:
                # lscpu prints the total when it shows an instance count
                return s
    return None


def total_memory_bytes() -> float | None:
    """Total system RAM in bytes (psutil)."""
    try:
        import psutil

        return float(psutil.virtual_memory().total)
    except Exception:
        return None


def detect_local_device(
    user_dirs: list[Path] | None = None, *, database: HardwareDatabase | None = None
) -> DetectedDevice:
    """Find the local device: the first NVIDIA GPU (NVML) if any, else the CPU.

    ``spec`` is filled when the hardware database (``database``, else loaded from
    ``user_dirs``) knows the raw name exactly (aliases and raw names only; no fuzzy guess).
    """
    from perfscope.hwdb._loader import load_database

    db = database if database is not None else load_database(user_dirs)
    gpus = nvml_gpu_names()
    if gpus:
        name, mem = gpus[0]
        return DetectedDevice(
            name=name, kind="gpu", spec=db.find(name), source="nvml", count=len(gpus), mem_bytes=mem
        )
    name, source = cpu_model_name()
    return DetectedDevice(
        name=name,
        kind="cpu",
        spec=db.find(name),
        source=source,
        count=1,
        mem_bytes=total_memory_bytes(),
        cores=os.cpu_count(),
        llc_bytes=cpu_llc_bytes(),
    )
