"""The advice, projection and speculative-decoding sections' records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from perfscope.analysis._record import Record
from perfscope.jsontypes import JsonObject, json_float, json_object

__all__ = [
    "Advice",
    "AdviceCalibration",
    "Gain",
    "Projection",
    "ProjectionCeilings",
    "ProjectionDevice",
    "ProjectionMemory",
    "ProjectionPhase",
    "ProjectionWorkload",
    "Speculative",
]


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
    """One ranked suggestion (:func:`perfscope.analysis.advisor.advise`): the technique, why
    it applies, its projected gain, the assumptions that number rests on and its calibration
    against measured studies."""

    technique: str = ""
    why: str = ""
    projected_gain: Gain = field(default_factory=Gain)
    assumptions: str | None = None
    rank: int = 0
    calibration: AdviceCalibration | None = None
    #: The stored study entry (:meth:`perfscope.analysis.calibration.CalibrationEntry.
    #: to_dict`) that measured this technique to make things worse on this machine class;
    #: left out of the JSON when none did.
    contradicted_by: Mapping[str, Any] | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ("contradicted_by",)


@dataclass(frozen=True, kw_only=True)
class ProjectionDevice(Record):
    """Target device of a projection: key, display name, ceiling source."""

    key: str = ""
    name: str | None = None
    source: str | None = None


@dataclass(frozen=True, kw_only=True)
class ProjectionWorkload(Record):
    """The static batch a projection prices: ``batch`` sequences of ``prompt_len`` prompt
    tokens (``cached_prefix_len`` of them already cached) generating ``output_len`` tokens
    each, split over ``tp`` devices (tensor parallelism)."""

    batch: int = 1
    prompt_len: int = 1
    output_len: int = 1
    cached_prefix_len: int = 0
    tp: int = 1


@dataclass(frozen=True, kw_only=True)
class ProjectionCeilings(Record):
    """The target device's ceilings a projection used: ``peak_flops`` (FLOP/s) at its compute
    dtype, ``mem_bw_bytes_s`` (bytes/s) of the ``memory_level`` the working set lives in
    (``dram`` or ``cache``), their ``ridge_point`` (FLOP/byte) and the ceilings' ``source``."""

    peak_flops: float | None = None
    mem_bw_bytes_s: float = 0.0
    memory_level: str = ""
    ridge_point: float | None = None
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
    workload: ProjectionWorkload = field(default_factory=ProjectionWorkload)
    speed_of_light: bool = False
    efficiency: dict[str, float | None] = field(default_factory=dict)
    overhead_s: dict[str, float] = field(default_factory=dict)
    ceilings: ProjectionCeilings = field(default_factory=ProjectionCeilings)
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
    range: JsonObject | None = None
    assumption: str | None = None
    #: How far projections like it were checked against measurement (stored studies on the
    #: target's machine class), or ``unchecked: ...``
    #: (:func:`perfscope.analysis.calibration.projection_check`).
    checked: str | None = None
    #: The per-step overhead fit the derated projection used (its JSON form,
    #: :mod:`perfscope.analysis.overhead`), ``None`` when none applied.
    overhead_fit: Mapping[str, Any] | None = None

    _NEWER: ClassVar[tuple[str, ...]] = ("overhead_fit",)

    def range_value(self, end: str, key: str) -> float | None:
        """One end of a ranged projection: ``end`` ``"compiled"`` (the low end),
        ``"eager"`` (the high end) or ``"speed_of_light"``, ``key`` a field such as
        ``ttft_s``; ``None`` when the projection has no range or that value is not a number."""
        return json_float((json_object((self.range or {}).get(end)) or {}).get(key))


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
    draft_model: JsonObject | None = None
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
