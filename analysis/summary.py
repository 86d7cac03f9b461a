"""The summary of a run as typed, frozen records, and how it is built.

:class:`Summary` is what the analysis stage (:func:`perfscope.analysis.analyze`) returns and
what every consumer reads: the CLI tables, the HTML report, the dashboard, comparisons,
baselines. Its JSON form, ``summary.json``, has schema ``perfscope.summary/2``; it keeps the
key layout of ``perfscope.summary/1`` (perfscope 0.1.0), so :meth:`Summary.from_dict` reads
both, and unknown keys survive a load/save round trip (``Record.extra``).

Sections that may be missing say so explicitly: :class:`Roofline` and :class:`Energy` carry
``available`` and ``reason``; :class:`Hardware` has ``spec`` ``None`` with a ``reason``;
``advice`` and ``projections`` are empty tuples when there is nothing to say. All values are in
SI units (seconds, bytes, FLOP, J, W, per-second rates, fractions 0..1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from perfscope.analysis._record import Record
from perfscope.analysis.catalogue import format_seconds
from perfscope.analysis.manifest import RunManifest, manifest_view

if TYPE_CHECKING:  # the typed record loads without pandas or hwdb (`perfscope ls` reads it)
    import pandas as pd

    from perfscope.hwdb.spec import DeviceSpec

__all__ = [
    "SUMMARY_SCHEMA",
    "SUMMARY_SCHEMAS",
    "Advice",
    "AdviceCalibration",
    "ClusterEnergy",
    "Contention",
    "CostModelWork",
    "Counts",
    "Distribution",
    "Energy",
    "EnergyCpu",
    "EnergyPhase",
    "EnergyPower",
    "EnergyRequests",
    "EnergyStats",
    "EngineInfo",
    "ErrorCount",
    "Gain",
    "Goodput",
    "Hardware",
    "HardwareCounters",
    "Latency",
    "LlamacppCounters",
    "MemoryUse",
    "NodeEnergy",
    "OperatorClassRoofline",
    "PhaseRoofline",
    "Projection",
    "PromptCache",
    "Record",
    "Roofline",
    "RooflineCeilings",
    "RooflineDevice",
    "RooflineLatency",
    "RooflineWhatIf",
    "RunSet",
    "ServerLatency",
    "ServerMetrics",
    "ServerWork",
    "Speculative",
    "StepStats",
    "Summary",
    "Throttle",
    "ThrottleShare",
    "Throughput",
    "TtftSplit",
    "build_summary",
    "contention_record",
    "run_warnings",
    "step_breakdown",
]

SUMMARY_SCHEMA = "perfscope.summary/2"
#: Schemas :meth:`Summary.from_dict` reads (``/1``: perfscope 0.1.0, same key layout).
SUMMARY_SCHEMAS = ("perfscope.summary/1", SUMMARY_SCHEMA)

_ABSENT = "not in this summary (written by an older perfscope, or the analysis did not run)"


# ---------------------------------------------------------------------- run and workload


@dataclass(frozen=True, kw_only=True)
class EngineInfo(Record):
    """The engine a run measured: ``uri`` as given, ``kind`` (reference, hf, openai, ...),
    ``device`` (``cpu``, ``cuda:0``, ...) and weight ``dtype``."""

    uri: str | None = None
    kind: str | None = None
    device: str | None = None
    dtype: str | None = None


@dataclass(frozen=True, kw_only=True)
class Counts(Record):
    """Measured requests (warmup excluded): all, completed, failed; warmup requests; tokens
    of the completed requests."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    warmup: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    #: Completed requests the server cut short (finish "length" before the tokens asked for).
    truncated: int = 0


@dataclass(frozen=True, kw_only=True)
class Distribution(Record):
    """Statistics of one per-request (or per-gap) quantity, in its unit (seconds for
    latencies). All but ``count`` are ``None`` when there were no values."""

    count: int = 0
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


@dataclass(frozen=True, kw_only=True)
class Latency(Record):
    """Latency distributions of the completed measured requests, seconds.

    ``ttft``: send → first token; ``tpot``: (last − first token) / (tokens − 1); ``itl``:
    gaps between chunks; ``itl_per_token``: each gap over its chunk's tokens; ``e2e``: send →
    last token; ``ntpot``: e2e / output tokens.
    """

    ttft: Distribution = field(default_factory=Distribution)
    tpot: Distribution = field(default_factory=Distribution)
    itl: Distribution = field(default_factory=Distribution)
    itl_per_token: Distribution = field(default_factory=Distribution)
    e2e: Distribution = field(default_factory=Distribution)
    ntpot: Distribution = field(default_factory=Distribution)

    def metrics(self) -> dict[str, Distribution]:
        """Metric name → distribution, in display order."""
        return {
            "ttft": self.ttft,
            "tpot": self.tpot,
            "itl": self.itl,
            "itl_per_token": self.itl_per_token,
            "e2e": self.e2e,
            "ntpot": self.ntpot,
        }


@dataclass(frozen=True, kw_only=True)
class Throughput(Record):
    """Rates over the measured window (tokens/s, requests/s) and over the busy time.

    ``busy_s`` is the time the engine was working (union of step or request intervals, named
    by ``busy_source``); ``busy_tok_s`` output tokens per busy second.
    """

    output_tok_s: float | None = None
    total_tok_s: float | None = None
    req_s: float | None = None
    busy_s: float | None = None
    busy_tok_s: float | None = None
    busy_source: str | None = None


@dataclass(frozen=True, kw_only=True)
class Goodput(Record):
    """Requests that met every SLO: ``slos`` (metric → limit, seconds), their count,
    ``attainment`` (share of measured requests, 0..1), ``goodput_req_s`` and the share meeting
    each SLO alone (``per_slo``)."""

    slos: dict[str, float] = field(default_factory=dict)
    good_requests: int = 0
    attainment: float | None = None
    goodput_req_s: float | None = None
    per_slo: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ErrorCount(Record):
    """One error message and how many measured requests failed with it."""

    error: str = ""
    count: int = 0


@dataclass(frozen=True, kw_only=True)
class StepStats(Record):
    """One step kind (prefill, decode, mixed): passes, time (s), tokens, batch, time share."""

    count: int = 0
    time_s: float = 0.0
    time_share: float = 0.0
    new_tokens: int = 0
    context_tokens: int = 0
    mean_batch_size: float | None = None
    mean_step_s: float | None = None


# ---------------------------------------------------------------------- hardware


@dataclass(frozen=True, kw_only=True)
class Hardware(Record):
    """The device the run is analysed against: its spec (DeviceSpec JSON form, SI units), how
    it was chosen (``resolved_from``), or ``spec`` ``None`` and the ``reason``."""

    spec: dict[str, Any] | None = None
    resolved_from: str | None = None
    reason: str | None = None
    #: A what-if (``analyze --hw X`` on a run measured elsewhere): the device key the run was
    #: measured on; left out of the JSON otherwise.
    measured_on: str | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ("measured_on",)

    @property
    def device(self) -> DeviceSpec | None:
        """The spec as a :class:`DeviceSpec`, or ``None`` when unknown."""
        from perfscope.hwdb.spec import DeviceSpec  # hwdb loads only when asked for

        return DeviceSpec.from_dict(self.spec) if self.spec else None


# ---------------------------------------------------------------------- roofline


@dataclass(frozen=True, kw_only=True)
class RooflineCeilings(Record):
    """Ceilings a roofline used: dtype, peak FLOP/s, DRAM and cache bandwidth (bytes/s),
    cache size (bytes), ridge point (FLOP/byte) and where they came from.

    A phase's ceilings also say which memory level bounded it (``memory_level``, ``dram`` or
    ``cache``), that level's bandwidth (bytes/s) and the ridge point against it (FLOP/byte);
    the section's own ceilings leave those ``None``. ``spread``: a calibrated device's
    measured spread (interquartile range / median, 0..) of its ``compute``, ``memory`` and
    ``cache`` ceilings; ``provisional``: the note that it was calibrated under contention.
    """

    dtype: str | None = None
    peak_flops: float | None = None
    mem_bw_bytes_s: float | None = None
    cache_bytes: float | None = None
    cache_bw_bytes_s: float | None = None
    ridge_point: float | None = None
    source: str | None = None
    memory_level: str | None = None
    memory_bw_used_bytes_s: float | None = None
    ridge_point_used: float | None = None
    spread: dict[str, float] | None = None
    provisional: str | None = None


@dataclass(frozen=True, kw_only=True)
class OperatorClassRoofline(Record):
    """One operator class of a phase (weight GEMMs, attention/KV, the rest) on the roofline:
    its ``flops`` (FLOP) and ``bytes``, ``intensity`` (FLOP/byte, ``None`` without bytes),
    ``sol_time_s`` (speed-of-light time, s), ``roof`` (``compute`` or ``memory``) and
    ``sol_share`` (its share of the classes' speed-of-light time, 0..1)."""

    flops: float = 0.0
    bytes: float = 0.0
    intensity: float | None = None
    sol_time_s: float = 0.0
    roof: str = ""
    sol_share: float | None = None


@dataclass(frozen=True, kw_only=True)
class RooflineWhatIf(Record):
    """A roofline against a device the run did not run on: the device it was
    ``measured_on`` and the ``target`` (hardware database keys)."""

    measured_on: str = ""
    target: str = ""


@dataclass(frozen=True, kw_only=True)
class PhaseRoofline(Record):
    """One phase (prefill or decode) on the roofline.

    Work: ``flops``, ``bytes`` (FLOP, bytes) and their parts; ``intensity`` (FLOP/byte);
    ``time_s``; achieved rates (FLOP/s, bytes/s); ``mfu``/``mbu`` (0..1 of the peaks);
    ``sol_time_s`` (speed-of-light time) and ``efficiency`` (= sol / measured); ``verdict``
    (compute-, memory- or overhead-bound) with its ``evidence`` sentence; ``energy`` the
    phase's energy join when telemetry had it, as the energy section wrote it: ``energy_j``
    (J), ``time_s`` (s), ``steps``, ``tokens``, ``j_per_token`` (J/token) and
    ``avg_power_w`` (W).

    ``classes``: the phase split by operator class, with ``class_verdict`` their common roof
    (``mixed`` when they disagree); ``gap_s``: time between consecutive steps of this phase
    (s, runs with engine steps) and ``gap_share`` its share of the phase's wall time (0..1);
    ``what_if`` true when the device is not the one the run was measured on (measured ratios
    then ``None``). Those are left out of the JSON when the phase has none.
    """

    phase: str = ""
    steps: int = 0
    tokens: float = 0.0
    batch_size_mean: float | None = None
    context_tokens_mean: float | None = None
    time_s: float | None = None
    time_per_step_s: float | None = None
    flops: float | None = None
    flops_useful: float | None = None
    flops_attention: float | None = None
    bytes: float | None = None
    bytes_weights: float | None = None
    bytes_kv_read: float | None = None
    bytes_kv_write: float | None = None
    bytes_activations: float | None = None
    intensity: float | None = None
    ridge_point: float | None = None
    ridge_point_dram: float | None = None
    achieved_flops_s: float | None = None
    achieved_bytes_s: float | None = None
    mfu: float | None = None
    mfu_useful: float | None = None
    mbu: float | None = None
    mbu_dram: float | None = None
    sol_time_s: float | None = None
    efficiency: float | None = None
    working_set_bytes: float | None = None
    fits_in_cache: bool | None = None
    memory_level: str | None = None
    estimated: bool = False
    ceilings: RooflineCeilings = field(default_factory=RooflineCeilings)
    energy: dict[str, float | int | None] | None = None
    roof: str | None = None
    verdict: str = ""
    evidence: str = ""
    classes: dict[str, OperatorClassRoofline] | None = None
    class_verdict: str | None = None
    gap_s: float | None = None
    gap_share: float | None = None
    what_if: bool | None = None

    def _omitted(self) -> frozenset[str]:
        """``class_verdict`` goes with ``classes``, ``gap_share`` with ``gap_s`` (each may be
        null when its partner is there); ``what_if`` only when true."""
        out = set()
        if self.classes is None:
            out |= {"classes", "class_verdict"}
        if self.gap_s is None:
            out |= {"gap_s", "gap_share"}
        if self.what_if is None:
            out.add("what_if")
        return frozenset(out)


@dataclass(frozen=True, kw_only=True)
class RooflineDevice(Record):
    """The device of a roofline: database ``key``, display ``name``, ``kind`` (gpu/cpu)."""

    key: str | None = None
    name: str | None = None
    kind: str | None = None


@dataclass(frozen=True, kw_only=True)
class RooflineLatency(Record):
    """Latency seen through the phases (seconds) and prefill interference with decode."""

    ttft_mean_s: float | None = None
    tpot_mean_s: float | None = None
    prefill_step_mean_s: float | None = None
    decode_step_mean_s: float | None = None
    decode_stall_share: float | None = None
    prefill_stall_max_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Roofline(Record):
    """Roofline per phase against the device's ceilings, or ``available`` false with the
    ``reason`` (no model spec, no device, no data).

    ``source``: ``steps`` (engine steps) or ``timeline`` (estimated from the requests);
    ``overhead_threshold``: both MFU and MBU below it (0..1) make a phase overhead-bound;
    ``what_if``: set when the device is not the one the run was measured on (an available
    section writes it as null otherwise; an unavailable one leaves it out).
    """

    available: bool = False
    reason: str | None = _ABSENT
    source: str | None = None
    estimated: bool = False
    flops_convention: str | None = None
    model: str | None = None
    device: RooflineDevice | None = None
    ceilings: RooflineCeilings | None = None
    overhead_threshold: float | None = None
    phases: dict[str, PhaseRoofline] = field(default_factory=dict)
    latency: RooflineLatency = field(default_factory=RooflineLatency)
    what_if: RooflineWhatIf | None = None

    def _omitted(self) -> frozenset[str]:
        return frozenset() if self.available else frozenset({"what_if"})

    @property
    def prefill(self) -> PhaseRoofline:
        """``phases["prefill"]``; AttributeError with the reason when there is none."""
        return self._phase("prefill")

    @property
    def decode(self) -> PhaseRoofline:
        """``phases["decode"]``; AttributeError with the reason when there is none."""
        return self._phase("decode")

    def _phase(self, name: str) -> PhaseRoofline:
        if name in self.phases:
            return self.phases[name]
        why = f"roofline is not available: {self.reason}" if not self.available else "no data"
        raise AttributeError(f"roofline has no {name!r} phase ({why})")


# ---------------------------------------------------------------------- energy


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
    reason: str | None = _ABSENT
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


# ---------------------------------------------------------------------- advice, projections


@dataclass(frozen=True, kw_only=True)
class Gain(Record):
    """A projected gain: ``value`` in ``unit`` (e.g. 1.8 "x decode throughput") of ``metric``;
    for ranged advice ``low``..``high`` (``value`` = ``high``) and ``bound``, the most the
    roofline allows (``None``: unbounded)."""

    value: float | None = None
    unit: str = ""
    metric: str = ""
    low: float | None = None
    high: float | None = None
    bound: float | None = None


@dataclass(frozen=True, kw_only=True)
class AdviceCalibration(Record):
    """How far the studies measured a suggestion's kind of projection to be off on this
    hardware class (:mod:`perfscope.analysis.calibration`): ``error`` = projected /
    measured - 1, ``significant`` whether the measured interval excluded 1, ``text`` one
    sentence, ``source`` the study's provenance; ``calibrated`` false when no study did."""

    hardware_class: str = ""
    technique: str | None = None
    calibrated: bool = False
    significant: bool | None = None
    error: float | None = None
    text: str = ""
    source: Mapping[str, Any] | None = None
    #: The machine class the advice is for, in words (summaries from before it was
    #: recorded lack it; left out of the JSON then).
    machine: str | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ("machine",)


@dataclass(frozen=True, kw_only=True)
class Advice(Record):
    """One ranked suggestion: the technique, why it applies, its projected gain, the
    assumptions that number rests on and its calibration against measured studies."""

    technique: str = ""
    why: str = ""
    projected_gain: Gain = field(default_factory=Gain)
    assumptions: str | None = None
    rank: int = 0
    calibration: AdviceCalibration | None = None


@dataclass(frozen=True, kw_only=True)
class ProjectionDevice(Record):
    """Target device of a projection: key, display name, ceiling source."""

    key: str = ""
    name: str | None = None
    source: str | None = None


@dataclass(frozen=True, kw_only=True)
class ProjectionPhase(Record):
    """One phase of a projection: work (FLOP, bytes), intensity, bound, times (s)."""

    steps: int | None = None
    flops: float | None = None
    bytes: float | None = None
    intensity: float | None = None
    bound: str | None = None
    sol_time_s: float | None = None
    time_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class ProjectionMemory(Record):
    """Memory a projected workload needs (bytes) and whether it fits the device.

    ``kv_cache_bytes`` holds each sequence's KV cache at ``kv_tokens_per_sequence`` tokens
    (capped at the model's context; sliding-window layers at their window);
    ``kv_bytes_per_token`` is its mean per token. ``capacity_bytes`` is
    ``mem_fraction`` of ``usable_bytes`` (what the driver exposes) when known, else of
    ``device_bytes`` (the datasheet figure).
    """

    weights_bytes: float | None = None
    kv_cache_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    kv_tokens_per_sequence: float | None = None
    total_bytes: float | None = None
    capacity_bytes: float | None = None
    device_bytes: float | None = None
    usable_bytes: float | None = None
    mem_fraction: float | None = None
    fits: bool | None = None
    #: What the per-sequence cache is: ``KV cache``, or ``recurrent state`` (state-space
    #: models); left out of the JSON when not given.
    cache_kind: str | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ("cache_kind",)


@dataclass(frozen=True, kw_only=True)
class Projection(Record):
    """This run's workload predicted on another device (derated by the run's efficiency
    unless ``speed_of_light``): latencies (s), throughput (tokens/s), memory, max batch."""

    device: ProjectionDevice = field(default_factory=ProjectionDevice)
    model: str | None = None
    dtypes: dict[str, str] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    speed_of_light: bool = False
    efficiency: dict[str, float | None] = field(default_factory=dict)
    overhead_s: dict[str, float] = field(default_factory=dict)
    ceilings: dict[str, Any] = field(default_factory=dict)
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    throughput_tok_s: float | None = None
    decode_tok_s: float | None = None
    prefill: ProjectionPhase = field(default_factory=ProjectionPhase)
    decode: ProjectionPhase = field(default_factory=ProjectionPhase)
    memory: ProjectionMemory = field(default_factory=ProjectionMemory)
    max_batch: int | None = None
    notes: tuple[str, ...] = ()
    basis: str | None = None
    range: dict[str, Any] | None = None
    assumption: str | None = None
    #: How far projections like it were checked against measurement (stored studies on the
    #: target's machine class), or ``unchecked: ...``
    #: (:func:`perfscope.analysis.calibration.projection_check`).
    checked: str | None = None
    #: The per-step overhead fit the derated projection used (its JSON form,
    #: :mod:`perfscope.analysis.overhead`), ``None`` when none applied.
    overhead_fit: Mapping[str, Any] | None = None

    _NEWER: ClassVar[tuple[str, ...]] = ("overhead_fit",)


@dataclass(frozen=True, kw_only=True)
class Speculative(Record):
    """Speculative decoding: the draft, ``num_speculative_tokens`` (K), draft tokens
    ``proposed_tokens`` / ``accepted_tokens`` and their ratio ``acceptance_rate``, accepted
    and emitted tokens per sequence and verify step, the per-token acceptance probability
    ``alpha``, seconds in draft and verify passes, the draft/verify pass cost ratio ``c``
    (measured and at speed of light) and the speedup over plain decoding they project
    (see :mod:`perfscope.analysis.speculative`)."""

    method: str | None = None
    draft: str | None = None
    num_speculative_tokens: int = 0
    draft_model: dict[str, Any] | None = None
    draft_n_params: int | None = None
    target_n_params: int | None = None
    verify_steps: int = 0
    draft_steps: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    acceptance_rate: float | None = None
    mean_accepted_per_step: float | None = None
    mean_tokens_per_step: float | None = None
    alpha: float | None = None
    expected_tokens_per_step: float | None = None
    draft_time_s: float = 0.0
    draft_prefill_time_s: float = 0.0
    verify_time_s: float = 0.0
    draft_time_share: float | None = None
    cost_ratio: float | None = None
    cost_ratio_sol: float | None = None
    projected_speedup: float | None = None
    projected_speedup_sol: float | None = None
    basis: str | None = None


# ---------------------------------------------------------------------- run context


@dataclass(frozen=True, kw_only=True)
class Contention(Record):
    """CPU time other processes and the hypervisor took during the run
    (:mod:`perfscope.profiler.contention`): the window (s), the machine's cores, CPU seconds
    of this process, of the others and stolen, their shares of the capacity (0..1; ``None``
    when the window was ``too_short``), the server under test (ports, pids, CPU-s, not counted
    as others) and ``contended``: others or steal above :data:`CONTENTION_WARN_SHARE`.

    ``helper_pids``/``helper_cpu_s``: a ``--ray`` run's own helpers (load actors, the request
    mailbox, the Ray daemons) and their CPU seconds, not counted as others; ``excluded_s``:
    the start-up time left out of the window (s); ``loadavg_1m``: the 1-minute load average
    at the end. Runs recorded before perfscope measured them lack them (and their summaries
    keep them out).
    """

    window_s: float | None = None
    cpu_count: int | None = None
    own_cpu_s: float | None = None
    others_cpu_s: float | None = None
    others_share: float | None = None
    steal_s: float | None = None
    steal_share: float | None = None
    server_ports: tuple[int, ...] = ()
    server_pids: tuple[int, ...] = ()
    server_cpu_s: float | None = None
    too_short: bool = False
    min_window_s: float | None = None
    contended: bool = False
    helper_pids: tuple[int, ...] = ()
    helper_cpu_s: float | None = None
    excluded_s: float | None = None
    loadavg_1m: float | None = None

    _NEWER: ClassVar[tuple[str, ...]] = ("helper_pids", "helper_cpu_s", "excluded_s", "loadavg_1m")


@dataclass(frozen=True, kw_only=True)
class RunSet(Record):
    """The repeated set a run belongs to (``--repeat``): the set ``id``, its ``label``, this
    run's ``index`` (0-based) of ``repeat`` runs, and whether it was ``interleaved`` with a
    ``--vs`` set."""

    id: str = ""
    label: str | None = None
    index: int = 0
    repeat: int = 1
    interleaved: bool = False


@dataclass(frozen=True, kw_only=True)
class PromptCache(Record):
    """Prefix-cache statistics over the measured, successful requests that report
    ``cached_tokens``: how many report and hit, the hit rate (0..1), cached and prompt token
    sums, ``share`` (cached / prompt tokens) and per-request means (tokens)."""

    requests_reporting: int = 0
    requests_hit: int = 0
    hit_rate: float | None = None
    cached_tokens: int = 0
    prompt_tokens: int = 0
    share: float | None = None
    cached_tokens_mean: float | None = None
    prompt_tokens_mean: float | None = None


@dataclass(frozen=True, kw_only=True)
class Client(Record):
    """The HTTP client's own account of a run (:mod:`perfscope.analysis.client`):
    ``cpu_s`` its CPU seconds over the serve loop, ``peak_rss_bytes`` its peak resident set
    (bytes), ``stamp_clock`` which clock stamped the chunks (``kernel``, ``user``, ``mixed``)
    and ``stall`` the stall record (threshold, worst and p99 read delay in seconds, requests
    affected) when the client measured one."""

    cpu_s: float | None = None
    peak_rss_bytes: int | None = None
    stamp_clock: str | None = None
    stall: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class ServerLatency(Record):
    """One latency the server measured over the run: the mean (s) of its histogram's
    ``_sum``/``_count`` deltas, the count, and the ``metric`` it came from."""

    mean_s: float | None = None
    count: int = 0
    metric: str = ""


@dataclass(frozen=True, kw_only=True)
class TtftSplit(Record):
    """The client's mean TTFT split (s): the server's TTFT (its queue, prefill and the rest
    of it) and the remainder, the client/network/front-end share (``client_network_s``).

    ``stamp_clock``: which clock stamped the client's chunks (with a stall record). When the
    client's user-space stamps stalled, the remainder is ``client_network_or_stall_s`` and
    ``client_network_s`` is ``None`` (a stall is never booked as network time), with the
    worst stall ``client_stall_max_s`` (s). Those three are left out of the JSON when unset.
    """

    client_ttft_mean_s: float | None = None
    server_ttft_mean_s: float | None = None
    client_network_s: float | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    server_other_s: float | None = None
    stamp_clock: str | None = None
    client_network_or_stall_s: float | None = None
    client_stall_max_s: float | None = None

    def _omitted(self) -> frozenset[str]:
        out = {"stamp_clock"} if self.stamp_clock is None else set()
        if self.client_stall_max_s is None:
            out |= {"client_network_or_stall_s", "client_stall_max_s"}
        return frozenset(out)


@dataclass(frozen=True, kw_only=True)
class LlamacppCounters(Record):
    """llama.cpp's counters over the run: prompt-processing busy time (s, batched prefills
    counted once), prompt tokens and their rate per busy second, generation time (s) and
    tokens, the mean time per output token (s), decode calls and tokens per call."""

    prompt_busy_s: float | None = None
    prompt_tokens: float | None = None
    prompt_tokens_per_busy_s: float | None = None
    generation_s: float | None = None
    generation_tokens: float | None = None
    tpot_mean_s: float | None = None
    decode_calls: float | None = None
    tokens_per_decode_call: float | None = None


@dataclass(frozen=True, kw_only=True)
class CostModelWork(Record):
    """perfscope's cost model for the run's completed, measured requests: ``flops`` (FLOP,
    batch-invariant) and, when the server's step count is known (``engine_steps``, left out
    of the JSON otherwise), ``bytes`` (weights read once per step plus KV and activations)."""

    flops: float = 0.0
    bytes: float | None = None
    requests: int = 0
    engine_steps: float | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ("engine_steps",)


@dataclass(frozen=True, kw_only=True)
class ServerWork(Record):
    """vLLM's estimated work counters over the run (FLOP, bytes read and written, engine
    steps) beside the cost model's, and their ratios server / model (left out of the JSON
    when there is no model figure to divide by)."""

    server_flops: float | None = None
    server_read_bytes: float | None = None
    server_write_bytes: float | None = None
    engine_steps: float | None = None
    cost_model: CostModelWork | None = None
    flops_ratio_server_to_model: float | None = None
    bytes_ratio_server_to_model: float | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = (
        "flops_ratio_server_to_model",
        "bytes_ratio_server_to_model",
    )


@dataclass(frozen=True, kw_only=True)
class ServerMetrics(Record):
    """The server's own Prometheus metrics over the run
    (:mod:`perfscope.analysis.server_metrics`), or ``available`` false with the ``reason``.

    ``latency``: per phase (ttft, queue, prefill, decode, tpot, e2e) the server's mean (s),
    count and metric name; ``tokens``: prompt, generation and cached token deltas;
    ``ttft_split``: the client's TTFT split into network, queue and prefill (s); ``work``:
    the server's FLOP/byte counters against the cost model; ``series``: ``[t_s, value]``
    points of running/waiting requests, KV-cache usage (0..1) and preemptions.
    """

    available: bool = False
    reason: str | None = None
    server: str | None = None
    url: str | None = None
    window_s: float | None = None
    scrapes: int | None = None
    interval_s: float | None = None
    latency: dict[str, ServerLatency] = field(default_factory=dict)
    tokens: dict[str, float | None] = field(default_factory=dict)
    requests: int | None = None
    preemptions: float | None = None
    prefix_cache_hit_rate: float | None = None
    spec_decode_acceptance: float | None = None
    running_max: float | None = None
    waiting_max: float | None = None
    kv_cache_usage_max: float | None = None
    llamacpp: LlamacppCounters | None = None
    ttft_split: TtftSplit | None = None
    client_tpot_mean_s: float | None = None
    work: ServerWork | None = None
    series: dict[str, list[list[float]]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


# ---------------------------------------------------------------------- the summary


@dataclass(frozen=True, kw_only=True)
class Summary(Record):
    """Everything derived from one stored run (see the module docstring).

    Identity: ``run_id``, ``name``, ``status`` (complete, interrupted, failed),
    ``started_at`` (ISO 8601), ``perfscope_version``, ``engine``; the configured ``workload``
    and ``load`` as recorded in the manifest; ``window_s`` the measured window (s).

    It is typed all the way down: read ``summary.latency.ttft.p99``; code that wants the
    summary.json object (the pytest grammar, baselines, user scripts) calls :meth:`to_dict`.
    ``contention``, ``run_set`` and ``model_spec`` come from the manifest; ``prompt_cache`` and
    ``server_metrics`` are ``None`` when the run has no such data (and ``model_spec`` and
    ``server_metrics`` are then left out of the JSON, as before).
    """

    schema: str = SUMMARY_SCHEMA
    run_id: str | None = None
    name: str | None = None
    status: str | None = None
    started_at: str | None = None
    perfscope_version: str | None = None
    engine: EngineInfo = field(default_factory=EngineInfo)
    workload: dict[str, Any] | None = None
    load: dict[str, Any] | None = None
    counts: Counts = field(default_factory=Counts)
    window_s: float = 0.0
    latency: Latency = field(default_factory=Latency)
    throughput: Throughput = field(default_factory=Throughput)
    goodput: Goodput = field(default_factory=Goodput)
    driver_lag: Distribution = field(default_factory=Distribution)
    errors: tuple[ErrorCount, ...] = ()
    steps: dict[str, StepStats] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    warnings: tuple[str, ...] = ()
    hardware: Hardware = field(default_factory=lambda: Hardware(reason=_ABSENT))
    roofline: Roofline = field(default_factory=Roofline)
    energy: Energy = field(default_factory=Energy)
    advice: tuple[Advice, ...] = ()
    projections: tuple[Projection, ...] = ()
    #: Present for speculative-decoding runs only.
    speculative: Speculative | None = None
    prompt_cache: PromptCache | None = None
    contention: Contention | None = None
    run_set: RunSet | None = None
    #: The model shape the user gave (``model_spec=``), ModelSpec JSON plus its ``source``.
    model_spec: dict[str, Any] | None = None
    server_metrics: ServerMetrics | None = None
    #: ``openai:`` runs only: the client's CPU, memory, stamping clock and stalls.
    client: Client | None = None

    #: Sections written only when the run has them (summary.json has never carried a null
    #: there).
    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ("model_spec", "server_metrics", "client")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Summary:
        """Read a summary.json object of schema ``/1`` or ``/2`` (unknown keys are kept).

        A ``/1`` summary is read into the ``/2`` types (same layout) and is written back as
        ``/2``. Sections it lacks are unavailable with the reason.
        """
        data = dict(data or {})
        data["schema"] = SUMMARY_SCHEMA
        return super().from_dict(data)


def step_breakdown(steps: pd.DataFrame) -> dict[str, dict[str, float | int]]:
    """Per step kind: passes, time (s), tokens processed, mean batch size, share of busy time.

    A draft model's passes (speculative decoding) are kinds of their own: ``draft_prefill``,
    ``draft_decode``."""
    if steps.empty:
        return {}
    dur = (steps["t_end"] - steps["t_start"]) * 1e-9
    total = float(dur.sum())
    out: dict[str, dict[str, float | int]] = {}
    key = steps["kind"].astype(str)
    if "role" in steps:
        key = key.where((steps["role"] != "draft").to_numpy(), "draft_" + key)
    for kind, g in steps.assign(dur=dur, _key=key).groupby("_key", sort=True):
        t = float(g["dur"].sum())
        out[str(kind)] = {
            "count": len(g),
            "time_s": t,
            "time_share": t / total if total > 0 else 0.0,
            "new_tokens": int(g["new_tokens"].sum()),
            "context_tokens": int(g["context_tokens"].sum()),
            "mean_batch_size": float(g["batch_size"].mean()),
            "mean_step_s": t / len(g),
        }
    return out


def build_summary(
    manifest: Mapping[str, Any] | RunManifest,
    requests: pd.DataFrame,
    chunks: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    slos: Mapping[str, float] | None = None,
    hardware: Hardware | None = None,
    roofline: Roofline | None = None,
    energy: Energy | None = None,
    advice: tuple[Advice, ...] = (),
    projections: tuple[Projection, ...] = (),
    prompt_cache: PromptCache | None = None,
    speculative: Speculative | None = None,
    server_metrics: ServerMetrics | None = None,
    client: Client | None = None,
    per_request_rows: pd.DataFrame | None = None,
) -> Summary:
    """The summary of one run: metrics from the tables plus the analysis sections.

    Args:
        manifest: the run's manifest (engine, workload, status, ...): the view, or the
            manifest.json object.
        requests, chunks, steps: the run's tables.
        slos: per-request limits in seconds (``{"ttft": 0.2}``); default: the manifest's.
        hardware, roofline, energy, advice, projections, prompt_cache, speculative,
            server_metrics, client: the sections the analysis computed (records); a section not
            given is unavailable with the reason (:data:`_ABSENT`).
        per_request_rows: :func:`~perfscope.analysis.metrics.per_request` of ``requests``
            when the caller already has it.
    """
    from perfscope.analysis.metrics import compute_metrics

    man = manifest_view(manifest)
    slos = dict(man.slos) if slos is None else dict(slos)
    m = compute_metrics(requests, chunks, steps, slos, per_request_rows=per_request_rows)
    engine = man.engine
    return Summary(
        run_id=man.run_id,
        name=man.name,
        status=man.status,
        started_at=man.started_at,
        perfscope_version=man.perfscope_version,
        engine=EngineInfo(
            uri=engine.uri,
            kind=engine.kind,
            device=engine.device,
            dtype=engine.dtype,
        ),
        workload=dict(man.workload) if man.workload is not None else None,
        load=dict(man.load) if man.load is not None else None,
        counts=Counts.from_dict(m["counts"]),
        window_s=float(m["window_s"]),
        latency=Latency.from_dict(m["latency"]),
        throughput=Throughput.from_dict(m["throughput"]),
        goodput=Goodput.from_dict(m["goodput"]),
        driver_lag=Distribution.from_dict(m["driver_lag"]),
        errors=tuple(ErrorCount.from_dict(e) for e in m["errors"]),
        steps={k: StepStats.from_dict(v) for k, v in step_breakdown(steps).items()},
        model=dict(engine.model) if engine.model is not None else None,
        warnings=tuple(run_warnings(man)),
        hardware=hardware if hardware is not None else Hardware(reason=_ABSENT),
        roofline=roofline if roofline is not None else Roofline(),
        energy=energy if energy is not None else Energy(),
        advice=advice,
        projections=projections,
        speculative=speculative,
        prompt_cache=prompt_cache,
        client=client,
        contention=contention_record(man),
        run_set=RunSet.from_dict(man.run_set) if man.run_set is not None else None,
        model_spec=dict(man.model_spec) if man.model_spec is not None else None,
        server_metrics=server_metrics,
    )


#: Share of the machine's CPU capacity that other processes (or the hypervisor) may take
#: before the run's timings are flagged as inflated.
CONTENTION_WARN_SHARE = 0.15


def contention_record(manifest: Mapping[str, Any] | RunManifest) -> Contention | None:
    """The run's CPU contention measurement with ``contended`` (others or steal above
    :data:`CONTENTION_WARN_SHARE`); ``None`` when the run has none. A window too short to
    measure has no shares and is never called contended."""
    c = manifest_view(manifest).host.contention
    if c is None:
        return None
    others, steal = c.get("others_share"), c.get("steal_share")
    contended = bool(
        (others is not None and others > CONTENTION_WARN_SHARE)
        or (steal is not None and steal > CONTENTION_WARN_SHARE)
    )
    return Contention.from_dict({**c, "contended": contended})


def run_warnings(manifest: Mapping[str, Any] | RunManifest) -> list[str]:
    """Conditions that make this run's numbers less trustworthy, as sentences."""
    man = manifest_view(manifest)
    # Recorded at capture (counts beyond max_tokens, a crashed run read back, ...).
    out: list[str] = list(man.warnings)
    c = contention_record(man) or Contention()
    if c.others_share is not None and c.others_share > CONTENTION_WARN_SHARE:
        out.append(
            f"other processes used {c.others_share:.0%} of this machine's CPU capacity during "
            f"the run ({c.others_cpu_s or 0:.1f} CPU-s over {c.window_s or 0:.1f} s on "
            f"{c.cpu_count} cores"
            + (
                f"; the server under test on port {', '.join(map(str, c.server_ports))} "
                f"used {c.server_cpu_s:.1f} CPU-s and is not counted"
                if c.server_cpu_s is not None and c.server_ports
                else ""
            )
            + "): latencies and throughput are likely inflated; measure on a quiet machine"
        )
    if c.steal_share is not None and c.steal_share > CONTENTION_WARN_SHARE:
        out.append(
            f"the hypervisor took {c.steal_share:.0%} of the CPU capacity (steal time) during "
            "the run"
        )
    out.extend(_client_warnings(man))
    out.extend(_distributed_warnings(man))
    out.extend(_telemetry_warnings(man))
    return out


def _distributed_warnings(manifest: RunManifest) -> list[str]:
    """A ``--ray`` run: lost load actors (the run is partial), actors that were saturated, and
    the clock alignment below which no latency difference can be claimed."""
    dist = manifest.distributed
    if dist is None:
        return []
    out: list[str] = []
    actors = dist.actors
    lost = [a for a in actors if a.lost]
    if lost:
        out.append(
            f"partial run: {len(lost)} of {len(actors)} load actors were lost "
            f"({'; '.join(str(a.lost) for a in lost)}); their unfinished requests are "
            "recorded as failed"
        )
    unc = dist.clock_uncertainty_ns
    if isinstance(unc, int | float) and unc > 0:
        out.append(
            f"records of {len(actors)} load actors were aligned to the driver's clock within "
            f"±{format_seconds(unc / 1e9)}: latency differences smaller than that are not "
            "resolvable in this run"
        )
    lagging = [
        a.send_lag_p99_s
        for a in actors
        if isinstance(a.send_lag_p99_s, int | float) and a.send_lag_p99_s > 0.005
    ]
    if lagging:
        out.append(
            f"{len(lagging)} load actor(s) sent late (send lag p99 up to "
            f"{format_seconds(float(max(lagging)))}): they were saturated; use more actors or "
            "fewer streams"
        )
    for d in dist.autoscale_decisions:
        if d.action == "added":
            out.append(
                f"load actor {d.actor}'s event-loop lag p99 reached "
                f"{format_seconds(d.lag_p99_s)} at {d.t_s or 0:.1f} s (threshold "
                f"{format_seconds(d.threshold_s)}): --ray-autoscale added actor "
                f"{d.new_actor} and moved {d.moved_requests} of its requests to "
                "it; its stamps before that may be late"
            )
    return out


def _telemetry_warnings(manifest: RunManifest) -> list[str]:
    """A ``--ray`` run's telemetry agents that were lost: their nodes' samples stop there."""
    tele = manifest.telemetry
    lost = tele.lost_agents if tele is not None else ()
    if tele is None or not lost:
        return []
    return [
        f"{len(lost)} of {len(tele.nodes)} telemetry agents were lost "
        f"({'; '.join(lost)}): their nodes' power and memory stop at the last samples received"
    ]


#: Share of prompt tokens served from the server's prefix cache above which a run that was
#: not meant to test caching is flagged.
CACHE_WARN_SHARE = 0.1
#: Workloads that are about prefix caching: they report the hit rate instead of a warning.
CACHING_WORKLOADS = ("shared-prefix", "multi-turn")


def _client_warnings(manifest: RunManifest) -> list[str]:
    """The HTTP client's own warnings (``engine.config.client``), plus the prompt-cache and
    prompt-length checks that need the workload to judge."""
    client = manifest.engine.config.client
    if client is None:
        return []
    out = [str(w) for w in client.get("warnings") or ()]
    workload = manifest.workload or {}
    cache = client.get("prompt_cache") or {}
    share = cache.get("share")
    if share is not None:
        hits, n = cache.get("requests_hit", 0), cache.get("requests_reporting", 0)
        if workload.get("dataset") in CACHING_WORKLOADS or workload.get("trace"):
            out.append(
                f"prefix-cache hit rate {share:.0%} of prompt tokens ({hits} of {n} requests "
                "hit the cache)"
            )
        elif share > CACHE_WARN_SHARE:
            repeat = (
                " (the prompts repeat an earlier run: --seed asks for the same prompts)"
                if workload.get("prompt_salt") is None
                else ""
            )
            out.append(
                f"the server served {share:.0%} of prompt tokens from its prefix cache "
                f"({hits} of {n} requests){repeat}: TTFT and prefill are lower than for new "
                "prompts"
            )
    lens = client.get("prompt_lengths") or {}
    targeted = workload.get("dataset") in ("synthetic", "shared-prefix", "multi-turn", "trace")
    if targeted and not workload.get("tokenizer") and lens.get("inexact"):
        out.append(
            f"prompt lengths are not exact: asked {lens['asked_min']}-{lens['asked_max']} "
            f"tokens, the server counted {lens['server_min']}-{lens['server_max']}; give "
            "--tokenizer PATH (the server's tokenizer) for exact lengths; the recorded prompt "
            "lengths are the server's"
        )
    return out
