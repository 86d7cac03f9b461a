"""How much of the machine other processes used while a run was being measured.

On a shared host, CPU time taken by other processes slows the engine and inflates every
latency perfscope reports (on a busy 2-core VM, a torch decode pass was seen to take 100x
longer). The measurement is cheap: system-wide busy CPU time and this process's CPU time
(children included) at the start and end of the run; the difference is what others used.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import psutil

__all__ = ["ContentionMeter"]


def _busy_s(t: Any) -> float:
    """Busy seconds of all CPUs from ``psutil.cpu_times()`` (everything but idle/iowait)."""
    idle = getattr(t, "idle", 0.0) + getattr(t, "iowait", 0.0)
    total = sum(float(v) for v in t)
    # guest time is already counted in user time on Linux
    total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    return total - idle


def _own_s(p: psutil.Process) -> float:
    """CPU seconds of this process and its waited-for children (an engine's workers are
    part of what is measured, not competition)."""
    c = p.cpu_times()
    return float(
        c.user + c.system + getattr(c, "children_user", 0.0) + getattr(c, "children_system", 0.0)
    )


@dataclass
class ContentionMeter:
    """Start at the run's start, :meth:`stop` at its end."""

    _t0: float = 0.0
    _busy0: float = 0.0
    _own0: float = 0.0
    _steal0: float = 0.0

    def start(self) -> ContentionMeter:
        t = psutil.cpu_times()
        self._t0 = time.monotonic()
        self._busy0 = _busy_s(t)
        self._steal0 = float(getattr(t, "steal", 0.0))
        self._own0 = _own_s(psutil.Process())
        return self

    def stop(self) -> dict[str, Any]:
        """JSON-ready: window, this process's and other processes' CPU seconds, their share
        of the machine's capacity, hypervisor steal, and the 1-minute load average."""
        t = psutil.cpu_times()
        window = max(time.monotonic() - self._t0, 1e-9)
        cores = psutil.cpu_count() or os.cpu_count() or 1
        busy = max(_busy_s(t) - self._busy0, 0.0)
        own = max(_own_s(psutil.Process()) - self._own0, 0.0)
        others = max(busy - own, 0.0)
        steal = max(float(getattr(t, "steal", 0.0)) - self._steal0, 0.0)
        try:
            load1 = os.getloadavg()[0]
        except OSError:  # not on every platform
            load1 = None
        return {
            "window_s": window,
            "cpu_count": cores,
            "own_cpu_s": own,
            "others_cpu_s": others,
            "others_share": others / (window * cores),
            "steal_s": steal,
            "steal_share": steal / (window * cores),
            "loadavg_1m": load1,
        }
