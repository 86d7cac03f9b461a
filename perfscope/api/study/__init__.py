"""``perfscope.study()``: vary one knob, everything else fixed, runs interleaved with repeats.

The module is being split by concern; for now every name lives in :mod:`.knobs`.
"""

from perfscope.api.study.knobs import (
    APPLIES,
    KNOBS,
    Knob,
    _apply,
    _batch,
    _check_applies,
    _knob,
    _values,
    baseline_fit,
    engine_family,
    knobs_for,
    kv_capacity,
    load_study,
    measure_setting_passes,
    portable_study,
    reproject_study,
    save_study,
    study,
    study_quality,
    study_with,
)

__all__ = [
    "APPLIES",
    "KNOBS",
    "Knob",
    "_apply",
    "_batch",
    "_check_applies",
    "_knob",
    "_values",
    "baseline_fit",
    "engine_family",
    "knobs_for",
    "kv_capacity",
    "load_study",
    "measure_setting_passes",
    "portable_study",
    "reproject_study",
    "save_study",
    "study",
    "study_quality",
    "study_with",
]
