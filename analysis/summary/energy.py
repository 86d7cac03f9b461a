"""The energy section's records: power, per-phase and per-request energy, memory,
throttling, the host CPU, measured GPU counters and a cluster's nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from perfscope.analysis._record import Record
from perfscope.analysis.summary._common import ABSENT

__all__ = [
    "ClusterEnergy",
    "Energy",
    "EnergyCpu",
    "EnergyPhase",
    "EnergyPower",
    "EnergyRequests",
    "EnergyStats",
    "HardwareCounters",
    "MemoryUse",
    "NodeEnergy",
    "Throttle",
    "ThrottleShare",
]


@dataclass(frozen=True, kw_only=True)
class EnergyPower(Record):
    """Power over the measured window (W): average, peak, limit, TDP and their shares (%)."""

    avg_w: float | None = None
    peak_w: float | None = None
    peak_per_device_w: dict[str, float | None] | None = None
    limit_w: float | None = None
    tdp_w: float | None = None
    avg_pct_of_limit: float | None = None
    peak_pct_of_limit: float | None = None
    avg_pct_of_tdp: float | None = None
    peak_pct_of_tdp: float | None = None


@dataclass(frozen=True, kw_only=True)
class EnergyPhase(Record):
    """Energy of one phase or of the time between steps: J, s, W, J per token.

    ``steps`` (engine passes) is set for a phase attributed by its steps; ``dynamic_energy_j``
    (J above the idle baseline) when an idle baseline was sampled. Both are left out of the
    JSON when ``None``. A phase attributed by concurrency (HTTP engines, no steps) has only
    ``energy_j``.
    """

    energy_j: float | None = None
    time_s: float | None = None
    avg_power_w: float | None = None
    j_per_token: float | None = None
    tokens: float | None = None
    steps: int | None = None
    dynamic_energy_j: float | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ("steps", "dynamic_energy_j")

    def roofline_join(self) -> dict[str, float | int | None]:
        """This phase as the roofline keeps it beside its work (:attr:`PhaseRoofline.energy`):
        the keys this phase has (time and power with a time, step counts with steps), in the
        order that object has always been written in."""
        out: dict[str, float | int | None] = {"energy_j": self.energy_j}
        if self.time_s is not None:
            out["time_s"] = self.time_s
        if self.steps is not None:
            out |= {"steps": self.steps, "tokens": self.tokens, "j_per_token": self.j_per_token}
        if self.time_s is not None:
            out["avg_power_w"] = self.avg_power_w
        if self.dynamic_energy_j is not None:
            out["dynamic_energy_j"] = self.dynamic_energy_j
        return out


@dataclass(frozen=True, kw_only=True)
class EnergyStats(Record):
    """Mean, median, 90th percentile and maximum of a per-request energy quantity (in its
    unit: J, or J per output token); all ``None`` when no request had a value."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    max: float | None = None


@dataclass(frozen=True, kw_only=True)
class EnergyRequests(Record):
    """Energy attributed to the measured requests: how many got a share (``count``), the
    distribution of their energy (J) and of their energy per output token (J/token), and
    the share of the run's energy the requests carry (``attributed_share``, 0..1)."""

    count: int = 0
    energy_j: EnergyStats = field(default_factory=EnergyStats)
    j_per_output_token: EnergyStats = field(default_factory=EnergyStats)
    attributed_share: float | None = None


@dataclass(frozen=True, kw_only=True)
class MemoryUse(Record):
    """Peak memory of one device during the run (bytes) and its share of the capacity (%);
    on a GPU with torch's allocator sampled, its peak allocated and reserved bytes (left out
    of the JSON when not sampled)."""

    peak_used_bytes: float | None = None
    capacity_bytes: float | None = None
    peak_pct_of_capacity: float | None = None
    torch_peak_allocated_bytes: float | None = None
    torch_peak_reserved_bytes: float | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = (
        "torch_peak_allocated_bytes",
        "torch_peak_reserved_bytes",
    )


@dataclass(frozen=True, kw_only=True)
class ThrottleShare(Record):
    """Share of one GPU's samples in the measured window (0..1) with any throttle reason
    set, and with each of NVML's clock-throttle reasons
    (:data:`perfscope.analysis.energy.THROTTLE_REASONS`)."""

    any: float = 0.0
    sw_power_cap: float = 0.0
    hw_slowdown: float = 0.0
    sw_thermal_slowdown: float = 0.0
    hw_thermal_slowdown: float = 0.0
    hw_power_brake_slowdown: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Throttle(Record):
    """Clock throttling over the measured window: ``share`` the mean over the GPUs of
    :attr:`ThrottleShare.any` (``None`` without throttle samples) and the per-device shares.
    ``per_device`` ``None``: not measured (no window), written as an empty object."""

    share: float | None = None
    per_device: dict[str, ThrottleShare] | None = None

    def _omitted(self) -> frozenset[str]:
        return frozenset({"share", "per_device"}) if self.per_device is None else frozenset()


@dataclass(frozen=True, kw_only=True)
class EnergyCpu(Record):
    """The host CPU over the measured window (this host; the driver's node on a cluster):
    this process's peak RSS (bytes) and mean CPU (% of a core), the system's mean CPU (%)
    and peak memory (bytes) against its total, and the RAPL package and DRAM energy (J) or
    why there is none.

    ``sampled`` ``None``: not looked at (written as an empty object); ``False``: no CPU
    samples (only ``sampled`` is written). Package and DRAM energy are written only when
    the package energy was measured, ``energy_reason`` only when it was not.
    """

    sampled: bool | None = None
    peak_rss_bytes: float | None = None
    avg_process_cpu_pct: float | None = None
    avg_system_cpu_pct: float | None = None
    peak_system_mem_used_bytes: float | None = None
    system_mem_total_bytes: float | None = None
    package_energy_j: float | None = None
    dram_energy_j: float | None = None
    energy_available: bool | None = None
    energy_reason: str | None = None

    def _omitted(self) -> frozenset[str]:
        names = frozenset(self._field_types())
        if self.sampled is None:
            return names
        if self.sampled is False:
            return names - {"sampled"}
        out = {k for k in ("energy_available", "energy_reason") if getattr(self, k) is None}
        if self.package_energy_j is None:
            out |= {"package_energy_j", "dram_energy_j"}
        return frozenset(out)


@dataclass(frozen=True, kw_only=True)
class HardwareCounters(Record):
    """Measured GPU counters over a window (the run or one phase's steps), time-weighted
    means over the headline GPUs: utilisation, memory-controller, SM and tensor-core
    activity, SM occupancy and DRAM bandwidth utilisation (%), SM clock (MHz). ``None``
    where no GPU reported the counter."""

    util_pct: float | None = None
    mem_util_pct: float | None = None
    sm_util_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_util_pct: float | None = None
    dram_bw_util_pct: float | None = None
    sm_clock_mhz: float | None = None


@dataclass(frozen=True, kw_only=True)
class NodeEnergy(Record):
    """One cluster node's share of a ``--ray`` run (telemetry agent per node): its devices,
    the energy (J) and power (W) of its headline devices over the measured window, and its
    peak memory (bytes; GPU: the sum of each GPU's own peak). ``power_source`` is None when
    none of its devices had a power reading."""

    devices: tuple[str, ...] = ()
    gpus: int = 0
    power_source: str | None = None
    power_devices: tuple[str, ...] = ()
    energy_j: float | None = None
    avg_power_w: float | None = None
    peak_power_w: float | None = None
    gpu_mem_used_peak_bytes: float | None = None
    gpu_mem_total_bytes: float | None = None
    system_mem_used_peak_bytes: float | None = None
    system_mem_total_bytes: float | None = None


@dataclass(frozen=True, kw_only=True)
class ClusterEnergy(Record):
    """The cluster totals of a ``--ray`` run: energy (J), average power (W), peak memory
    (bytes, sums over the nodes) and which nodes had no power reading (not counted)."""

    nodes: tuple[str, ...] = ()
    nodes_with_power: tuple[str, ...] = ()
    nodes_without_power: tuple[str, ...] = ()
    energy_j: float | None = None
    avg_power_w: float | None = None
    gpu_mem_used_peak_bytes: float | None = None
    system_mem_used_peak_bytes: float | None = None


@dataclass(frozen=True, kw_only=True)
class Energy(Record):
    """Energy and power of the run from telemetry, or ``available`` false with the
    ``reason``. Energy in J, power in W, ``method`` ``counter`` or ``integrated``."""

    available: bool = False
    reason: str | None = ABSENT
    method: str | None = None
    source: str | None = None
    devices: tuple[str, ...] = ()
    window_s: float | None = None
    output_tokens: int | None = None
    total_j: float | None = None
    avg_power_w: float | None = None
    j_per_output_token: float | None = None
    tokens_per_j: float | None = None
    coverage: float | None = None
    idle_baseline_w: float | None = None
    idle_energy_j: float | None = None
    dynamic_energy_j: float | None = None
    attribution: str | None = None
    power: EnergyPower = field(default_factory=EnergyPower)
    phases: dict[str, EnergyPhase] = field(default_factory=dict)
    requests: EnergyRequests | None = None
    memory: dict[str, MemoryUse] = field(default_factory=dict)
    throttle: Throttle = field(default_factory=Throttle)
    cpu: EnergyCpu = field(default_factory=EnergyCpu)
    #: Window (``run`` or a step kind) → the GPU counters measured over it.
    hardware_counters: dict[str, HardwareCounters] = field(default_factory=dict)
    #: ``--ray`` runs: per-node energy, power and memory, and the cluster totals (the
    #: headline energy and J per token are then the cluster total).
    nodes: dict[str, NodeEnergy] = field(default_factory=dict)
    cluster: ClusterEnergy | None = None
    notes: tuple[str, ...] = ()
    #: GPU energy by counter only: the same window by integrated power (J) and how far the
    #: counter's total is from it (%), and the counter's update period seen in the data (s).
    #: Left out of the JSON when not measured.
    integrated_total_j: float | None = None
    counter_vs_integrated_pct: float | None = None
    counter_update_period_s: float | None = None

    def _omitted(self) -> frozenset[str]:
        out = {"counter_update_period_s"} if self.counter_update_period_s is None else set()
        if self.integrated_total_j is None:
            out |= {"integrated_total_j", "counter_vs_integrated_pct"}
        return frozenset(out)

    @property
    def j_per_token(self) -> float | None:
        """Short name of ``j_per_output_token`` (J per output token); AttributeError with the
        reason when energy is not available (rather than a silent ``None``)."""
        if not self.available:
            raise AttributeError(
                f"energy has no 'j_per_token' (energy is not available: {self.reason})"
            )
        return self.j_per_output_token
