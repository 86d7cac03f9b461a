"""A study: one knob varied with everything else fixed, measured next to its projection.

The module moved whole to :mod:`.record` before it is split by concern; every name importers
use is re-exported here.
"""

from __future__ import annotations

from perfscope.analysis.study.record import (
    DEFAULT_PRIMARY,
    METRICS,
    SCHEMA,
    Effect,
    PhasePoint,
    RunPoint,
    SettingResult,
    SpeculativeAfter,
    SpeculativeBefore,
    SpeculativeProjection,
    Study,
    between,
    build_study,
    detectable_cell,
    free_cores,
    memory_need,
    oversubscribed_threads,
    phase_points,
    project_change,
    projection_inputs,
    read_study,
    rederive_study,
    run_metrics,
    simulate_budget,
    speculative_projection,
)
from perfscope.analysis.study.record import _scheduling_projection as _scheduling_projection
from perfscope.analysis.study.record import _verify_roof_ratio as _verify_roof_ratio

__all__ = [
    "DEFAULT_PRIMARY",
    "METRICS",
    "SCHEMA",
    "Effect",
    "PhasePoint",
    "RunPoint",
    "SettingResult",
    "SpeculativeAfter",
    "SpeculativeBefore",
    "SpeculativeProjection",
    "Study",
    "between",
    "build_study",
    "detectable_cell",
    "free_cores",
    "memory_need",
    "oversubscribed_threads",
    "phase_points",
    "project_change",
    "projection_inputs",
    "read_study",
    "rederive_study",
    "run_metrics",
    "simulate_budget",
    "speculative_projection",
]
