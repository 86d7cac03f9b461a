"""How much of the machine other processes used while a run was being measured.

On a shared host, CPU time taken by other processes slows the engine and inflates every
latency perfscope reports (on a busy 2-core VM, a torch decode pass was seen to take 100x
longer). The measurement is cheap: system-wide busy CPU time and this process's CPU time
(children included) at the start and end of the run; the difference is what others used.

A server under test on this machine (an ``openai:`` engine at a loopback address) is not
competition: the processes listening on the port the run targets are found with psutil's
connection table and their CPU time is reported apart (``server_cpu_s``), not as
"other processes".

A ``--ray`` run's own helpers (load actors, the request mailbox, the Ray daemons of its
private cluster) are perfscope's, not competition: :meth:`ContentionMeter.add_own` counts
them apart (``helper_cpu_s``), and :meth:`ContentionMeter.restart` begins the window once
the actors serve, so cluster start-up is left out (``excluded_s``).

A window shorter than :data:`MIN_WINDOW_S` is too short for CPU
accounting (the kernel counts in ticks): it gets no share figure (``others_share`` None,
``too_short`` True).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import psutil

__all__ = ["MIN_WINDOW_S", "ContentionMeter", "listening_pids", "local_server_ports"]

#: Shortest window whose CPU shares are reported (CPU time is counted in 10 ms ticks and
#: sampled at the ends; below a second the share swings by tens of percent).
MIN_WINDOW_S = 1.0

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "[::1]"}


def local_server_ports(engine_uri: str) -> tuple[int, ...]:
    """The port an HTTP engine URI (``openai:http://127.0.0.1:8000/v1``) targets when the
    server is on this machine; ``()`` for other engines and remote hosts."""
    if not engine_uri.startswith("openai:"):
        return ()
    url = engine_uri.split(":", 1)[1]
    if "://" not in url:
        url = "http://" + url
    try:
        u = urlparse(url)
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return ()
    host = (u.hostname or "").lower()
    if host in _LOCAL_HOSTS or host.startswith("127."):
        return (port,)
    return ()


def listening_pids(ports: tuple[int, ...]) -> set[int]:
    """Processes listening on any of ``ports`` (TCP), other than this one. Where the
    system-wide table is refused (macOS without root), each process is asked in turn."""
    if not ports:
        return set()
    me = os.getpid()
    wanted = set(ports)
    found: set[int] = set()
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in wanted and c.pid:
                found.add(c.pid)
    except (psutil.AccessDenied, PermissionError):
        for proc in psutil.process_iter():
            try:
                conns = proc.net_connections(kind="tcp")
            except (psutil.Error, OSError):
                continue
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port in wanted for c in conns):
                found.add(proc.pid)
    found.discard(me)
    return found


def _tree_cpu_s(pids: set[int]) -> dict[int, float]:
    """CPU seconds of each process in ``pids`` and its live children (a server's workers)."""
    out: dict[int, float] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            try:
                c = p.cpu_times()
            except psutil.Error:
                continue
            out[p.pid] = float(c.user + c.system)
    return out


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
    """Start at the run's start, :meth:`stop` at its end.

    Attributes:
        exclude_ports: TCP ports of a server under test on this machine; the processes
            listening there (and their children) count as the server, not as others.
    """

    exclude_ports: tuple[int, ...] = ()
    _t0: float = 0.0
    _busy0: float = 0.0
    _own0: float = 0.0
    _steal0: float = 0.0
    _server0: dict[int, float] = field(default_factory=dict)
    _server_pids: set[int] = field(default_factory=set)
    _helper_pids: set[int] = field(default_factory=set)
    _helper0: dict[int, float] = field(default_factory=dict)
    _t_first: float | None = None

    def start(self) -> ContentionMeter:
        """Start (or restart: :meth:`restart`) the window."""
        self._server_pids = listening_pids(tuple(self.exclude_ports))
        self._server0 = _tree_cpu_s(self._server_pids)
        self._helper0 = _tree_cpu_s(self._helper_pids)
        t = psutil.cpu_times()
        self._t0 = time.monotonic()
        self._busy0 = _busy_s(t)
        self._steal0 = float(getattr(t, "steal", 0.0))
        self._own0 = _own_s(psutil.Process())
        if self._t_first is None:
            self._t_first = self._t0
        return self

    def restart(self) -> None:
        """Begin the window again now: what happened before (a ``--ray`` run's cluster and
        actor start-up) is left out; the time left out is reported as ``excluded_s``."""
        t_first = self._t_first
        self.start()
        self._t_first = t_first

    def add_own(self, pids: Iterable[int]) -> None:
        """Count these processes (and their children) as perfscope's own from now on, not
        as other processes: a ``--ray`` run's load actors, its request mailbox and the Ray
        daemons of its private cluster."""
        new = set(pids) - self._helper_pids - {os.getpid()}
        self._helper_pids |= new
        for pid, v in _tree_cpu_s(new).items():
            self._helper0.setdefault(pid, v)

    def stop(self) -> dict[str, Any]:
        """JSON-ready: window, this process's, the local server's and other processes' CPU
        seconds, their share of the machine's capacity (``None`` for a window shorter than
        :data:`MIN_WINDOW_S`), hypervisor steal, and the 1-minute load average."""
        t = psutil.cpu_times()
        window = max(time.monotonic() - self._t0, 1e-9)
        cores = psutil.cpu_count() or os.cpu_count() or 1
        busy = max(_busy_s(t) - self._busy0, 0.0)
        own = max(_own_s(psutil.Process()) - self._own0, 0.0)
        server_now = _tree_cpu_s(self._server_pids)
        # processes that appeared during the run (new workers) count from zero
        server = sum(max(v - self._server0.get(pid, 0.0), 0.0) for pid, v in server_now.items())
        helpers_now = _tree_cpu_s(self._helper_pids)
        helpers = sum(max(v - self._helper0.get(p, 0.0), 0.0) for p, v in helpers_now.items())
        others = max(busy - own - server - helpers, 0.0)
        steal = max(float(getattr(t, "steal", 0.0)) - self._steal0, 0.0)
        short = window < MIN_WINDOW_S
        capacity = window * cores
        try:
            load1 = os.getloadavg()[0]
        except OSError:  # not on every platform
            load1 = None
        return {
            "window_s": window,
            "cpu_count": cores,
            "own_cpu_s": own,
            "others_cpu_s": others,
            "others_share": None if short else min(others / capacity, 1.0),
            "steal_s": steal,
            "steal_share": None if short else min(steal / capacity, 1.0),
            "server_ports": list(self.exclude_ports),
            "server_pids": sorted(self._server_pids),
            "server_cpu_s": server if self._server_pids else None,
            "helper_pids": sorted(self._helper_pids),
            "helper_cpu_s": helpers if self._helper_pids else None,
            "excluded_s": self._t0 - (self._t_first if self._t_first is not None else self._t0),
            "too_short": short,
            "min_window_s": MIN_WINDOW_S,
            "loadavg_1m": load1,
        }
