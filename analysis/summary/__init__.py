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

The records live by section: :mod:`.measured` (counts, latency, throughput, goodput, errors,
steps, engine, hardware), :mod:`.roofline`, :mod:`.energy`, :mod:`.advice` (advice,
projections, speculative decoding), :mod:`.context` (contention, run set, prompt cache,
client, server metrics) and :mod:`.core` (:class:`Summary` itself); :mod:`.build` holds what
:func:`~perfscope.analysis.analyze` builds it with (step statistics, the engine, the
contention record, the run's warnings). Every name is importable from here.
"""

from __future__ import annotations

from perfscope.analysis._record import Record
from perfscope.analysis.summary._common import SUMMARY_SCHEMA, SUMMARY_SCHEMAS
from perfscope.analysis.summary.advice import (
    Advice,
    AdviceCalibration,
    Gain,
    Projection,
    ProjectionCeilings,
    ProjectionDevice,
    ProjectionMemory,
    ProjectionPhase,
    ProjectionWorkload,
    Speculative,
)
from perfscope.analysis.summary.build import (
    CACHE_WARN_SHARE,
    CACHING_WORKLOADS,
    CONTENTION_WARN_SHARE,
    contention_record,
    engine_info,
    run_warnings,
    server_share,
    step_breakdown,
)
from perfscope.analysis.summary.context import (
    Client,
    Contention,
    CostModelWork,
    LlamacppCounters,
    PromptCache,
    RunSet,
    ServerLatency,
    ServerMetrics,
    ServerWork,
    TtftSplit,
)
from perfscope.analysis.summary.core import Summary
from perfscope.analysis.summary.energy import (
    ClusterEnergy,
    Energy,
    EnergyCpu,
    EnergyPhase,
    EnergyPower,
    EnergyRequests,
    EnergyStats,
    HardwareCounters,
    MemoryUse,
    NodeEnergy,
    Throttle,
    ThrottleShare,
)
from perfscope.analysis.summary.measured import (
    Counts,
    Distribution,
    EngineInfo,
    ErrorCount,
    Goodput,
    Hardware,
    Latency,
    StepStats,
    Throughput,
)
from perfscope.analysis.summary.roofline import (
    OperatorClassRoofline,
    PhaseRoofline,
    Roofline,
    RooflineCeilings,
    RooflineDevice,
    RooflineLatency,
    RooflineWhatIf,
)

__all__ = [
    "CACHE_WARN_SHARE",
    "CACHING_WORKLOADS",
    "CONTENTION_WARN_SHARE",
    "SUMMARY_SCHEMA",
    "SUMMARY_SCHEMAS",
    "Advice",
    "AdviceCalibration",
    "Client",
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
    "ProjectionCeilings",
    "ProjectionDevice",
    "ProjectionMemory",
    "ProjectionPhase",
    "ProjectionWorkload",
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
    "contention_record",
    "engine_info",
    "run_warnings",
    "server_share",
    "step_breakdown",
]
