"""How many intra-op threads a torch engine on the CPU should use.

Measured on a busy 2-core VM (load average 2.3, eight other jobs; ``benchmarks/
reference_contention.py`` and docs/performance.md): a decode-sized matmul (8×512 @ 512×2048)
ran 1,310 times a second on one thread and 63 on two with OpenMP's default wait policy —
two threads spin-waiting for each other on cores someone else holds are 20× slower, not
faster. With ``OMP_WAIT_POLICY=PASSIVE`` two threads managed 467 and one 1,653; under two
extra CPU hogs one thread was still ahead. So the rule is:

* the CPUs the process may really use: its affinity mask (``os.sched_getaffinity``), capped
  by the cgroup's CPU quota (``cpu.max`` quota / period, cgroup v2; ``cpu.cfs_quota_us`` on v1);
* minus the CPUs other processes keep busy (the 1-minute load average, scaled to the share of
  the machine's CPUs this process may use), rounded down, at least one;
* and OpenMP threads wait passively (:func:`prefer_passive_wait`, before torch loads), so a
  thread that finds its partner descheduled sleeps instead of burning the core it needs.

An explicit ``--threads N`` (``--engine-opt threads=N``) always wins. The decision is a
:class:`ThreadChoice`, recorded in the run's manifest (``torch_threads``, ``threads_rule``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ThreadChoice",
    "cgroup_cpu_limit",
    "choose_threads",
    "prefer_passive_wait",
    "usable_cpus",
]


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op thread count chosen for an engine and why.

    threads: the count given to ``torch.set_num_threads``.
    usable_cpus: CPUs this process may use (affinity and cgroup quota), fractional quota
        rounded down, at least 1.
    busy_cpus: CPUs other processes were keeping busy when the engine started (1-minute load
        average scaled to ``usable_cpus``); 0 when the load is unknown.
    source: ``"--threads"`` when the user set it, ``"auto"`` otherwise.
    wait_policy: ``OMP_WAIT_POLICY`` as this process has it (``"PASSIVE"`` by default from
        the command line; ``None``: OpenMP's own default, which spins).
    """

    threads: int
    usable_cpus: int
    busy_cpus: float
    source: str
    wait_policy: str | None

    @property
    def rule(self) -> str:
        """One line for the manifest and the terminal, e.g. ``auto: 2 usable CPUs, 1.3 busy``."""
        if self.source != "auto":
            return f"{self.source} {self.threads}"
        return (
            f"auto: {self.usable_cpus} usable CPU{'s' if self.usable_cpus != 1 else ''}, "
            f"{self.busy_cpus:.1f} busy with other work"
        )


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs the cgroup quota allows (quota / period), or None when there is no quota."""
    try:
        text = (root / "cpu.max").read_text().split()
        if len(text) == 2 and text[0] != "max":
            return int(text[0]) / int(text[1])
        if text:
            return None
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may run on: affinity mask, capped by the cgroup quota (at least 1)."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        allowed = os.cpu_count() or 1
    limit = cgroup_cpu_limit(cgroup_root)
    if limit is not None:
        allowed = min(allowed, max(1, math.floor(limit)))
    return max(1, allowed)


def _busy_cpus(usable: int) -> float:
    """CPUs of ``usable`` other processes keep busy: the 1-minute load average, scaled."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0
    total = os.cpu_count() or usable
    return max(0.0, load * usable / max(total, usable))


def choose_threads(requested: int | None, *, busy_cpus: float | None = None) -> ThreadChoice:
    """The intra-op threads for a CPU engine: ``requested`` if given, else the idle usable CPUs.

    ``busy_cpus`` overrides the load-average estimate (tests pass it to pin the rule).
    """
    usable = usable_cpus()
    wait = os.environ.get("OMP_WAIT_POLICY")
    if requested is not None:
        return ThreadChoice(requested, usable, 0.0, "--threads", wait)
    busy = _busy_cpus(usable) if busy_cpus is None else max(0.0, busy_cpus)
    threads = max(1, min(usable, math.floor(usable - busy + 0.5)))
    return ThreadChoice(threads, usable, busy, "auto", wait)


def prefer_passive_wait() -> None:
    """Make OpenMP threads sleep rather than spin while waiting (unless the user chose).

    Takes effect only when called before torch (and so libgomp) is loaded: the command line
    calls it first thing.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
