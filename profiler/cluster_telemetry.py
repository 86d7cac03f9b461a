"""Telemetry agents as Ray actors: one per cluster node, merged into the run with a ``node``.

With ``--ray``, the hardware the run measures may span nodes (an engine with tensor or
pipeline parallelism over Ray, or load actors on other hosts). The driver then starts one
:class:`TelemetryAgent` on every alive node, pinned there with Ray's
``NodeAffinitySchedulingStrategy``. Each agent runs the ordinary
:class:`~perfscope.profiler.telemetry.TelemetrySession` of its node (NVML when the node has
NVIDIA GPUs, the CPU sampler always; its own idle baseline first) on its own monotonic clock,
labelling its rows with the node's name.

:class:`ClusterTelemetry` (the driver side) measures each agent's clock offset the way the
load actors' are measured (0 exactly on a shared kernel boot id, else NTP-style exchanges
before and after, with the round trip as the bound), polls every agent about twice a second,
shifts the rows onto the run clock and hands them to the run's segment flusher in batches, so
a killed run keeps the samples up to the last poll. An agent (or node) lost mid-run is
reported; the samples it had sent are kept.

Ray is an optional dependency (``pip install 'perfscope[ray]'``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from perfscope.errors import UsageError
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.distributed import ClockOffset, actor_offset, boot_id
from perfscope.profiler.records import TELEMETRY_SCHEMA
from perfscope.profiler.telemetry import TelemetryConfig, start_telemetry

__all__ = [
    "POLL_INTERVAL_S",
    "AgentReport",
    "ClusterTelemetry",
    "NodeTarget",
    "TelemetryAgent",
    "alive_nodes",
    "driver_node_id",
]

#: How often the driver collects new samples from the agents (s).
POLL_INTERVAL_S = 0.5
#: How long an agent may take to start (open NVML, take its idle baseline) (s).
START_TIMEOUT_S = 120.0

# Manifest keys of a TelemetrySession that map a device name to a value: merged over the
# nodes with ``node/device`` keys (the keys analysis/energy.py uses for a cluster's devices).
_PER_DEVICE_KEYS = (
    "power_method",
    "energy_counter",
    "power_limits_w",
    "default_power_limits_w",
    "max_clocks_mhz",
    "mem_total_bytes",
    "idle_baseline_w",
)


@dataclass(frozen=True)
class NodeTarget:
    """A node to sample.

    Attributes:
        node_id: the Ray node id the agent is pinned to.
        name: the node's name in the ``node`` column (its host name, made unique).
    """

    node_id: str
    name: str


def alive_nodes(ray: Any) -> list[NodeTarget]:
    """Every alive node of the connected cluster, named by host (``host@ip`` when two nodes
    share a host name, as containers on one machine may)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    hosts = [
        str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "node") for n in nodes
    ]
    out: list[NodeTarget] = []
    for n, host in zip(nodes, hosts, strict=True):
        name = host if hosts.count(host) == 1 else f"{host}@{n.get('NodeManagerAddress')}"
        out.append(NodeTarget(node_id=str(n["NodeID"]), name=name))
    return out


def driver_node_id(ray: Any) -> str | None:
    """The Ray node id of this (the driver's) process."""
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:
        return None


class TelemetryAgent:
    """One node's sampler (a Ray actor class body): a TelemetrySession on this process's
    raw ``perf_counter_ns`` clock, read back in increments.

    Args:
        config: ``TelemetryConfig`` fields as a dict (``node`` names the rows).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        # A node agent samples every GPU of its node. Ray sets CUDA_VISIBLE_DEVICES="" in an
        # actor that reserved no GPU, which would hide the node's GPUs from the NVML matching.
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        self._session = start_telemetry(MonotonicClock(origin_ns=0), TelemetryConfig(**config))
        self._last_t: int | None = None

    def now_ns(self) -> int:
        """This process's ``perf_counter_ns``."""
        import time

        return time.perf_counter_ns()

    def where(self) -> tuple[str, int, str | None]:
        """Host name, pid and the kernel's boot id (same boot id = same monotonic clock)."""
        return socket.gethostname(), os.getpid(), boot_id()

    def _since_last(self, table: pa.Table) -> pa.Table:
        if self._last_t is not None and table.num_rows:
            table = table.filter(pc.greater(table.column("t"), self._last_t))
        if table.num_rows:
            self._last_t = int(pc.max(table.column("t")).as_py())
        return table

    def poll(self) -> pa.Table:
        """The samples taken since the last poll (TELEMETRY_SCHEMA, agent clock)."""
        return self._since_last(self._session.snapshot(self._last_t))

    def stop(self) -> tuple[pa.Table, dict[str, Any]]:
        """Stop sampling: the samples not yet polled and the session's manifest facts."""
        rest = self._since_last(self._session.stop())
        return rest, self._session.manifest_info()


@dataclass
class AgentReport:
    """One telemetry agent, for the manifest.

    Attributes:
        node: its node's name (the ``node`` column); node_id: the Ray node id.
        host, pid: where it ran.
        same_clock, offset_start, offset_end, drift_ns, uncertainty_ns, exchange_check_ns: the
            clock alignment, as for the load actors.
        rows: samples received.
        lost: why the agent was lost, or None.
    """

    node: str
    node_id: str
    host: str = ""
    pid: int = 0
    same_clock: bool = False
    offset_start: ClockOffset | None = None
    offset_end: ClockOffset | None = None
    exchange_check_ns: int | None = None
    drift_ns: int | None = None
    uncertainty_ns: int | None = None
    rows: int = 0
    lost: str | None = None


@dataclass
class _Agent:
    report: AgentReport
    handle: Any
    info: dict[str, Any] = field(default_factory=dict)


class ClusterTelemetry:
    """The driver side: one agent per node, samples merged onto the run clock.

    Use :meth:`start`, hand :meth:`take_new` to the segment flusher, and call :meth:`stop` at
    the end (it returns every sample, TELEMETRY_SCHEMA with ``node`` set);
    :meth:`manifest_info` describes the cluster's telemetry for the manifest.

    Args:
        ray: the imported, connected ``ray`` module.
        config: what each agent samples (``node`` is set per agent).
        origin_perf_counter_ns: the driver's ``perf_counter_ns`` at run time 0.
        nodes: the nodes to sample (default: every alive node).
        poll_interval_s: seconds between collections.
    """

    def __init__(
        self,
        ray: Any,
        config: TelemetryConfig,
        origin_perf_counter_ns: int,
        *,
        nodes: Sequence[NodeTarget] | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        config.validate()
        self._ray = ray
        self._config = config
        self._origin = origin_perf_counter_ns
        self._nodes = list(nodes) if nodes is not None else alive_nodes(ray)
        self._interval = poll_interval_s
        self._agents: list[_Agent] = []
        self._lock = threading.Lock()
        self._tables: list[pa.Table] = []
        self._handed = 0
        self._stop_evt = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: pa.Table | None = None
        self._errors: list[str] = []
        self._status = "not started"
        self._driver_node = driver_node_id(ray)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ClusterTelemetry:
        """Start an agent on every node (in parallel), align clocks, start polling."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        if not self._nodes:
            raise UsageError("--ray: the cluster reports no alive node to sample")
        remote_cls = ray.remote(num_cpus=0, max_concurrency=2)(TelemetryAgent)
        base = {k: v for k, v in asdict(self._config).items()}
        for node in self._nodes:
            handle = remote_cls.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
            ).remote({**base, "node": node.name})
            self._agents.append(_Agent(AgentReport(node=node.name, node_id=node.node_id), handle))
        mine = boot_id()
        try:
            for a in self._agents:
                rep = a.report
                try:
                    rep.host, rep.pid, theirs = ray.get(
                        a.handle.where.remote(), timeout=START_TIMEOUT_S
                    )
                except Exception as exc:
                    raise UsageError(
                        f"--ray: the telemetry agent on node {rep.node} did not start: "
                        f"{_first_line(exc)}"
                    ) from None
                rep.same_clock = mine is not None and theirs == mine
                rep.offset_start, rep.exchange_check_ns = actor_offset(
                    ray, a.handle, rep.same_clock
                )
        except BaseException:
            self._kill()
            raise
        self._status = "running"
        self._thread = threading.Thread(
            target=self._loop, name="perfscope-cluster-telemetry", daemon=True
        )
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop_evt.wait(self._interval):
            self.collect()

    def collect(self) -> None:
        """One collection round (the polling thread calls this every interval)."""
        ray = self._ray
        live = [a for a in self._agents if a.report.lost is None]
        refs = [(a, a.handle.poll.remote()) for a in live]
        for a, ref in refs:
            try:
                table = ray.get(ref, timeout=30)
            except Exception as exc:
                self._lose(a, exc)
                continue
            self._add(a, table)

    def _lose(self, a: _Agent, exc: BaseException) -> None:
        why = f"telemetry agent on node {a.report.node} lost: {_first_line(exc)}"
        a.report.lost = why
        self._errors.append(why)

    def _add(self, a: _Agent, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        off = a.report.offset_start
        shift = (off.offset_ns if off is not None else 0) + self._origin
        t = pc.subtract(table.column("t"), pa.scalar(shift, pa.int64()))
        table = table.set_column(table.schema.get_field_index("t"), "t", t)
        with self._lock:
            self._tables.append(table.cast(TELEMETRY_SCHEMA))
            a.report.rows += table.num_rows

    def take_new(self) -> pa.Table:
        """Samples received since the previous call (the segment flusher's increment).

        Nodes report at their own pace, so the increment is by arrival, not by time: an
        ``after_t`` filter would drop a slower node's older samples."""
        with self._lock:
            new, self._handed = self._tables[self._handed :], len(self._tables)
        return pa.concat_tables(new) if new else TELEMETRY_SCHEMA.empty_table()

    def stop(self) -> pa.Table:
        """Stop polling and every agent; every sample, sorted by node, device and time.

        Safe to call twice (returns the same table)."""
        if self._result is not None:
            return self._result
        self._stop_evt.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        ray = self._ray
        for a in self._agents:
            if a.report.lost is not None:
                continue
            rep = a.report
            try:
                end, _ = actor_offset(ray, a.handle, rep.same_clock)
                rep.offset_end = end
                table, a.info = ray.get(a.handle.stop.remote(), timeout=60)
            except Exception as exc:
                self._lose(a, exc)
                continue
            self._add(a, table)
        for a in self._agents:
            rep = a.report
            if rep.offset_start and rep.offset_end:
                rep.drift_ns = rep.offset_end.offset_ns - rep.offset_start.offset_ns
                rep.uncertainty_ns = max(
                    rep.offset_start.uncertainty_ns, rep.offset_end.uncertainty_ns
                ) + abs(rep.drift_ns)
            elif rep.offset_start:
                rep.uncertainty_ns = rep.offset_start.uncertainty_ns
        self._kill()
        with self._lock:
            tables = list(self._tables)
        merged = pa.concat_tables(tables) if tables else TELEMETRY_SCHEMA.empty_table()
        if merged.num_rows:
            merged = merged.sort_by(
                [("node", "ascending"), ("device", "ascending"), ("t", "ascending")]
            )
        self._result = merged
        self._status = "stopped"
        return merged

    def _kill(self) -> None:
        for a in self._agents:
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(a.handle)

    # -- description -------------------------------------------------------------------------

    def manifest_info(self) -> dict[str, Any]:
        """The cluster's telemetry for the manifest: per node the agent's own session facts
        (``nodes``), and the per-device facts merged with ``node/device`` keys so the energy
        analysis reads them as it reads one host's."""
        nodes: dict[str, Any] = {}
        merged: dict[str, dict[str, Any]] = {k: {} for k in _PER_DEVICE_KEYS}
        devices: list[str] = []
        without_gpu: list[str] = []
        without_power: list[str] = []
        driver_name: str | None = None
        for a in self._agents:
            rep = a.report
            if rep.node_id == self._driver_node:
                driver_name = rep.node
            info = a.info
            nodes[rep.node] = {"agent": asdict(rep), **info}
            for d in info.get("devices") or []:
                devices.append(f"{rep.node}/{d}")
            for key in _PER_DEVICE_KEYS:
                for d, v in (info.get(key) or {}).items():
                    merged[key][f"{rep.node}/{d}"] = v
            if info and not (info.get("gpu") or {}).get("available"):
                without_gpu.append(rep.node)
            gpu_power = any((info.get("power_method") or {}).values()) or any(
                (info.get("energy_counter") or {}).values()
            )
            rapl = ((info.get("cpu") or {}).get("rapl") or {}).get("available")
            if not gpu_power and not rapl:
                without_power.append(rep.node)
        uncertainty = [a.report.uncertainty_ns for a in self._agents]
        out: dict[str, Any] = {
            "enabled": True,
            "status": self._status,
            "backend": "ray",
            "clock": "run-relative ns (each node's samples aligned to the driver's clock)",
            "interval_s": self._config.interval_s,
            "devices": devices,
            "driver_node": driver_name,
            "nodes": nodes,
            "nodes_without_gpu": without_gpu,
            "nodes_without_power": without_power,
            "clock_uncertainty_ns": max((u for u in uncertainty if u is not None), default=None),
            **merged,
        }
        if self._errors:
            out["errors"] = list(self._errors)
        if len(without_gpu) == len(self._agents):
            reasons = sorted(
                {
                    str(n.get("gpu_unavailable") or "no GPU samples")
                    for n in nodes.values()
                    if isinstance(n, dict)
                }
            )
            out["gpu_unavailable"] = "; ".join(reasons) or "gpu telemetry unavailable"
        rapl_reasons = [
            f"{name}: {n['cpu_energy_unavailable']}"
            for name, n in nodes.items()
            if n.get("cpu_energy_unavailable")
        ]
        if rapl_reasons and len(rapl_reasons) == len(self._agents):
            out["cpu_energy_unavailable"] = "; ".join(rapl_reasons)
        return out

    @property
    def errors(self) -> list[str]:
        """Lost agents, as sentences."""
        return list(self._errors)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
