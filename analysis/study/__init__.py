"""A study: one knob varied with everything else fixed, measured next to its projection.

The record (:class:`Study`, JSON schema ``perfscope.study/1``) holds, per setting of the knob,
the measured effect against the first setting with its between-run interval next to the
what-if projection of the same change and that projection's error (:mod:`.record` says what
else it keeps).

The package holds one concern a module, imports running one way (each module imports only
those above it in this list); every name importers use is re-exported here:

- :mod:`.stats`: between runs, the change of one metric and what the rounds could detect;
- :mod:`.points`: per run, its compared metrics and roofline phases;
- :mod:`.speculative`: the speculative-decoding projection of a setting;
- :mod:`.projection`: the cost model of a change (what the what-if model projects from the
  baseline's setting to a candidate's) and the memory a setting needs;
- :mod:`.scheduling`: the projections of the scheduling knobs, and when a ``threads`` change
  is not projected;
- :mod:`.record`: the record, assembled from its runs, read back and re-projected.
"""

from __future__ import annotations

from perfscope.analysis.study.points import PhasePoint, RunPoint, phase_points, run_metrics
from perfscope.analysis.study.projection import memory_need, project_change
from perfscope.analysis.study.record import (
    METRICS,
    SCHEMA,
    Effect,
    SettingResult,
    Study,
    build_study,
    projection_inputs,
    read_study,
    rederive_study,
)
from perfscope.analysis.study.scheduling import _scheduling_projection as _scheduling_projection
from perfscope.analysis.study.scheduling import (
    free_cores,
    oversubscribed_threads,
    simulate_budget,
)
from perfscope.analysis.study.speculative import (
    SpeculativeAfter,
    SpeculativeBefore,
    SpeculativeProjection,
    speculative_projection,
)
from perfscope.analysis.study.speculative import _verify_roof_ratio as _verify_roof_ratio
from perfscope.analysis.study.stats import DEFAULT_PRIMARY, between, detectable_cell

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
