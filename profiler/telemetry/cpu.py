"""Host sampling: process memory and CPU use (psutil), RAPL energy, PyTorch CUDA memory.

The ``cpu`` row of a sample uses the shared columns this way:

- ``power_w``: RAPL package power over the last interval (ΔE/Δt), null without RAPL;
- ``energy_j``: RAPL package energy since the sampler started (all packages summed), null
  without RAPL; ``dram_energy_j``: the DRAM sub-zones, where the CPU exposes them;
- ``mem_used_bytes``: system memory in use (total − available);
- ``util_pct``: system-wide CPU utilisation since the previous sample (0-100);
- ``rss_bytes`` / ``peak_rss_bytes``: this process's resident set now and its peak so far;
- ``proc_cpu_pct``: this process's CPU use since the previous sample, % of one core.

RAPL counters (``/sys/class/powercap/intel-rapl:*/energy_uj``, µJ) wrap at
``max_energy_range_uj``; a drop between two reads is counted as one wrap. Since Linux 5.10 they
are readable by root only (CVE-2020-8694); when they cannot be read, CPU energy is reported as
unavailable with the reason, never estimated.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

__all__ = ["DEFAULT_POWERCAP_ROOT", "CpuSampler", "RaplReader", "TorchCudaMemory"]

DEFAULT_POWERCAP_ROOT = Path("/sys/class/powercap")


@dataclass
class _RaplZone:
    path: Path
    name: str
    max_range_uj: int
    last_uj: int
    acc_uj: int = 0
    wraps: int = 0

    def read(self) -> int:
        """Energy since the first read, µJ, wrap-corrected."""
        raw = int((self.path / "energy_uj").read_text().strip())
        if raw < self.last_uj:
            self.wraps += 1
            self.acc_uj += raw + self.max_range_uj - self.last_uj
        else:
            self.acc_uj += raw - self.last_uj
        self.last_uj = raw
        return self.acc_uj


@dataclass
class RaplReader:
    """Package and DRAM energy from the Linux powercap RAPL interface.

    Use :meth:`open`; ``available`` tells whether anything could be read and ``reason`` why not.
    Package zones (``intel-rapl:N``, name ``package-N``) are summed; DRAM sub-zones
    (``intel-rapl:N:M`` named ``dram``) are summed separately. Core/uncore sub-zones nest inside
    the package and are not added. ``intel-rapl-mmio`` duplicates the package zone and is skipped.
    """

    packages: list[_RaplZone] = field(default_factory=list)
    dram: list[_RaplZone] = field(default_factory=list)
    reason: str | None = None

    @property
    def available(self) -> bool:
        """True when at least one package zone is readable."""
        return bool(self.packages)

    @classmethod
    def open(cls, root: Path = DEFAULT_POWERCAP_ROOT) -> RaplReader:
        """Discover and read every RAPL zone once (that read is the zero point)."""
        r = cls()
        if not root.is_dir():
            r.reason = f"{root} does not exist (no RAPL powercap interface on this machine)"
            return r
        zones = sorted(p for p in root.iterdir() if p.name.startswith("intel-rapl:"))
        if not zones:
            r.reason = f"no intel-rapl zones under {root}"
            return r
        denied: list[str] = []
        for z in zones:
            try:
                name = (z / "name").read_text().strip()
            except OSError:
                continue
            parts = z.name.split(":")
            if len(parts) == 2 and name.startswith("package"):
                target = r.packages
            elif len(parts) == 3 and name == "dram":
                target = r.dram
            else:
                continue
            try:
                raw = int((z / "energy_uj").read_text().strip())
                max_range = int((z / "max_energy_range_uj").read_text().strip())
            except PermissionError:
                denied.append(z.name)
                continue
            except (OSError, ValueError):
                continue
            target.append(_RaplZone(z, name, max_range, raw))
        if not r.packages:
            r.dram.clear()
            if denied:
                r.reason = (
                    f"RAPL energy_uj under {root} is not readable by this user (root only since "
                    "Linux 5.10, CVE-2020-8694); e.g. `sudo chmod a+r "
                    f"{root}/intel-rapl:*/energy_uj` to allow it"
                )
            else:
                r.reason = f"no readable RAPL package zone under {root}"
        return r

    def read_j(self) -> tuple[float | None, float | None]:
        """(package J, DRAM J) since :meth:`open`; None where unavailable or unreadable now."""
        try:
            pkg = sum(z.read() for z in self.packages) / 1e6 if self.packages else None
            dram = sum(z.read() for z in self.dram) / 1e6 if self.dram else None
        except (OSError, ValueError):
            return None, None
        return pkg, dram

    def info(self) -> dict[str, Any]:
        """JSON-ready description for the manifest."""
        return {
            "available": self.available,
            "reason": self.reason,
            "package_zones": [z.path.name for z in self.packages],
            "dram_zones": [z.path.name for z in self.dram],
            "wraps": sum(z.wraps for z in self.packages + self.dram),
        }


def _ru_maxrss_bytes() -> float:
    peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    # Linux reports KiB, macOS bytes.
    return peak if sys.platform == "darwin" else peak * 1024.0


@dataclass
class CpuSampler:
    """Samples this process and the host; see the module docstring for the columns."""

    rapl: RaplReader
    process: psutil.Process
    peak_rss: float = 0.0
    mem_total_bytes: float = 0.0
    cpu_count: int = 1
    _last_pkg_j: float | None = None
    _last_t_ns: int | None = None

    @classmethod
    def open(cls, powercap_root: Path = DEFAULT_POWERCAP_ROOT) -> CpuSampler:
        """Start CPU sampling (primes psutil's CPU-percent counters)."""
        proc = psutil.Process(os.getpid())
        proc.cpu_percent(None)
        psutil.cpu_percent(None)
        s = cls(
            rapl=RaplReader.open(powercap_root),
            process=proc,
            mem_total_bytes=float(psutil.virtual_memory().total),
            cpu_count=psutil.cpu_count() or 1,
        )
        return s

    def sample(self, t_ns: int, row: np.ndarray, col: Any) -> None:
        """Fill ``row`` with one reading; ``col(name)`` gives a column's position."""
        try:
            rss = float(self.process.memory_info().rss)
            self.peak_rss = max(self.peak_rss, rss, _ru_maxrss_bytes())
            row[col("rss_bytes")] = rss
            row[col("peak_rss_bytes")] = self.peak_rss
            row[col("proc_cpu_pct")] = self.process.cpu_percent(None)
        except psutil.Error:
            pass
        row[col("util_pct")] = psutil.cpu_percent(None)
        vm = psutil.virtual_memory()
        row[col("mem_used_bytes")] = float(vm.total - vm.available)
        if self.rapl.available:
            pkg, dram = self.rapl.read_j()
            if pkg is not None:
                row[col("energy_j")] = pkg
                if self._last_pkg_j is not None and self._last_t_ns is not None:
                    dt = (t_ns - self._last_t_ns) / 1e9
                    if dt > 0:
                        row[col("power_w")] = (pkg - self._last_pkg_j) / dt
                self._last_pkg_j, self._last_t_ns = pkg, t_ns
            if dram is not None:
                row[col("dram_energy_j")] = dram

    def info(self) -> dict[str, Any]:
        """JSON-ready description for the manifest."""
        return {
            "cpu_count": self.cpu_count,
            "mem_total_bytes": self.mem_total_bytes,
            "rapl": self.rapl.info(),
        }


class TorchCudaMemory:
    """PyTorch caching-allocator statistics of this process, per CUDA device.

    Reads only; never initialises CUDA (torch returns empty stats before CUDA is initialised).
    """

    def __init__(self) -> None:
        self._torch: Any = sys.modules.get("torch")

    @property
    def usable(self) -> bool:
        """True when torch is imported and has a CUDA runtime."""
        try:
            return self._torch is not None and bool(self._torch.cuda.is_available())
        except Exception:
            return False

    def sample(self, cuda_index: int, row: np.ndarray, col: Any) -> None:
        """Fill the torch_* columns for CUDA device ``cuda_index``."""
        cuda = self._torch.cuda
        try:
            if not cuda.is_initialized():
                return
            row[col("torch_allocated_bytes")] = float(cuda.memory_allocated(cuda_index))
            row[col("torch_reserved_bytes")] = float(cuda.memory_reserved(cuda_index))
            row[col("torch_peak_allocated_bytes")] = float(cuda.max_memory_allocated(cuda_index))
        except Exception:
            return
