"""What the HTTP client itself costs per run: CPU seconds and peak resident memory.

A load generator competes for the CPU with the server it measures when both share a machine,
so its own cost belongs beside its numbers. ``cpu_s`` is the perfscope process's CPU time
(all its threads: the event loop, the driver, telemetry samplers) over the serve loop, plus
the event-loop threads of ``workers=N`` processes; ``peak_rss_bytes`` is the highest resident
set of the process (or of a worker, whichever is larger) so far, in bytes.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass

__all__ = ["ClientCost", "peak_rss_bytes"]


def peak_rss_bytes() -> int:
    """This process's peak resident set so far, bytes (``ru_maxrss``: KiB on Linux, bytes
    on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


@dataclass
class ClientCost:
    """The client's CPU (s) and peak RSS (bytes) over one serve; see the module docstring."""

    cpu0_s: float = 0.0
    cpu_s: float = 0.0
    workers_cpu_s: float = 0.0
    workers_peak_rss_bytes: int = 0
    peak_rss_bytes: int = 0

    @classmethod
    def start(cls) -> ClientCost:
        """Begin measuring now."""
        return cls(cpu0_s=time.process_time())

    def stop(self) -> None:
        """End the measurement: fill ``cpu_s`` and ``peak_rss_bytes``."""
        self.cpu_s = time.process_time() - self.cpu0_s + self.workers_cpu_s
        self.peak_rss_bytes = max(peak_rss_bytes(), self.workers_peak_rss_bytes)
