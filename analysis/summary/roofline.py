"""The roofline section's records: per phase against the device's ceilings, by operator
class, with what-if marks."""

from __future__ import annotations

from dataclasses import dataclass, field

from perfscope.analysis._record import Record
from perfscope.analysis.summary._common import ABSENT

__all__ = [
    "OperatorClassRoofline",
    "PhaseRoofline",
    "Roofline",
    "RooflineCeilings",
    "RooflineDevice",
    "RooflineLatency",
    "RooflineWhatIf",
]


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
    reason: str | None = ABSENT
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
