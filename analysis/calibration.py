"""How far the advisor's projections were off, as measured by ``perfscope study``.

``calibration.json`` (schema ``perfscope.calibration/1``, next to this module) holds one
:class:`CalibrationEntry` per technique, hardware class (``cpu`` / ``gpu``) and metric: the
change a study made, the what-if's projected ratio, the measured ratio with its between-run
interval, the error ``projected / measured - 1`` and where it comes from (study, script,
date, machine, runs per setting). :func:`calibration_for` turns an advisor suggestion into
a :class:`Calibration` note that goes *beside* its projected gain; the projection itself is
never changed.

A measured interval that includes 1 means the study could not tell the setting from the
baseline on that metric: the calibration is then reported as not significant. A hardware
class without measurements says so ("not calibrated on GPU").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "CALIBRATION_FILE",
    "SCHEMA",
    "TECHNIQUES",
    "Calibration",
    "CalibrationEntry",
    "calibration_for",
    "hardware_class",
    "load_calibration",
    "technique_key",
]

SCHEMA = "perfscope.calibration/1"
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")

#: Calibration technique key → (display name, advisor technique prefixes it covers).
TECHNIQUES: dict[str, tuple[str, tuple[str, ...]]] = {
    "batching": ("batching", ("larger batches",)),
    "int8-weights": ("int8 weights", ("int8 weights",)),
    "int4-weights": ("int4 weights", ("int4 weights",)),
    "kv-heads": ("GQA/MQA", ("GQA/MQA",)),
    "fp8-kv": ("fp8 KV cache", ("fp8 KV cache",)),
    "prefix-caching": ("prompt caching", ("prompt (prefix) caching",)),
    "speculative": ("speculative decoding", ("speculative decoding",)),
    "disaggregation": ("prefill/decode disaggregation", ("prefill/decode disaggregation",)),
    "tensor-parallel": ("tensor parallelism", ("tensor parallelism",)),
    "overhead": ("cutting per-step overhead", ("cut decode", "cut prefill")),
}

#: Advisor gain metric → the study metric that measures it.
_METRIC = {
    "decode_tok_s": "output_tok_s",
    "tpot_s": "tpot_p50_s",
    "ttft_s": "ttft_p50_s",
}

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "technique": str,
    "hardware_class": str,
    "metric": str,
    "change": str,
    "projected_ratio": (int, float),
    "measured_ratio": (int, float),
    "interval": list,
    "confidence": (int, float),
    "error": (int, float),
    "study": str,
    "script": str,
    "write_up": str,
    "study_file": str,
    "date": str,
    "machine": str,
    "runs_per_setting": int,
    "cause": str,
}


@dataclass(frozen=True)
class CalibrationEntry:
    """One measured error of a projection.

    Attributes:
        technique: key of :data:`TECHNIQUES` (``batching``).
        hardware_class: ``cpu`` or ``gpu``.
        metric: the study metric (``output_tok_s``, ``tpot_p50_s``, ``ttft_p50_s``).
        change: the change the study made, in words (``batch-size 1 -> 8``).
        projected_ratio: the what-if's candidate / baseline ratio.
        measured_ratio: the measured candidate / baseline ratio (geometric means).
        interval: its between-run interval (low, high) at ``confidence``.
        confidence: e.g. 0.95.
        error: ``projected_ratio / measured_ratio - 1`` (+0.82: 82% more than measured).
        study, script, write_up, study_file: where the numbers come from.
        date: when the study ran (ISO date).
        machine: what it ran on, in words.
        runs_per_setting: repeats per setting.
        cause: why the projection was off, in words.
    """

    technique: str
    hardware_class: str
    metric: str
    change: str
    projected_ratio: float
    measured_ratio: float
    interval: tuple[float, float]
    confidence: float
    error: float
    study: str
    script: str
    write_up: str
    study_file: str
    date: str
    machine: str
    runs_per_setting: int
    cause: str

    @property
    def significant(self) -> bool:
        """Whether the measured interval excludes 1 (the study saw an effect at all)."""
        lo, hi = self.interval
        return not lo <= 1.0 <= hi

    @property
    def projection_inside(self) -> bool:
        """Whether the projected ratio lies inside the measured interval."""
        lo, hi = self.interval
        return lo <= self.projected_ratio <= hi

    @property
    def error_interval(self) -> tuple[float, float]:
        """The error at the ends of the measured interval (low, high)."""
        lo, hi = self.interval
        return (self.projected_ratio / hi - 1.0, self.projected_ratio / lo - 1.0)


@dataclass(frozen=True)
class Calibration:
    """The calibration note of one suggestion (JSON: the advice's ``calibration``).

    Attributes:
        hardware_class: ``cpu`` or ``gpu``.
        technique: the calibration technique key, ``None`` when the suggestion maps to none.
        calibrated: whether a study measured this technique on this hardware class.
        significant: whether that study's measured interval excludes 1 (``None`` when
            not calibrated).
        error: ``projected / measured - 1`` of the study (``None`` when not calibrated).
        text: one sentence for people.
        source: the entry's provenance (study, script, date, machine, runs), or ``None``.
    """

    hardware_class: str
    technique: str | None
    calibrated: bool
    significant: bool | None
    error: float | None
    text: str
    source: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "hardware_class": self.hardware_class,
            "technique": self.technique,
            "calibrated": self.calibrated,
            "significant": self.significant,
            "error": self.error,
            "text": self.text,
            "source": self.source,
        }


def _entry(raw: Any, i: int) -> CalibrationEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"calibration entry {i} is not an object")
    for key, tp in _REQUIRED.items():
        if key not in raw:
            raise ValueError(f"calibration entry {i} lacks {key!r}")
        if not isinstance(raw[key], tp) or isinstance(raw[key], bool):
            raise ValueError(f"calibration entry {i}: {key!r} has the wrong type")
    if extra := set(raw) - set(_REQUIRED):
        raise ValueError(f"calibration entry {i}: unknown keys {sorted(extra)}")
    iv = raw["interval"]
    if len(iv) != 2 or not all(isinstance(v, int | float) and v > 0 for v in iv):
        raise ValueError(f"calibration entry {i}: interval must be two positive ratios")
    if raw["technique"] not in TECHNIQUES:
        raise ValueError(f"calibration entry {i}: unknown technique {raw['technique']!r}")
    if raw["hardware_class"] not in ("cpu", "gpu"):
        raise ValueError(f"calibration entry {i}: hardware_class must be cpu or gpu")
    if raw["metric"] not in _METRIC.values():
        raise ValueError(f"calibration entry {i}: unknown metric {raw['metric']!r}")
    e = CalibrationEntry(
        **{k: raw[k] for k in _REQUIRED if k != "interval"},
        interval=(float(iv[0]), float(iv[1])),
    )
    if not math.isclose(e.error, e.projected_ratio / e.measured_ratio - 1.0, abs_tol=5e-3):
        raise ValueError(f"calibration entry {i}: error is not projected / measured - 1")
    return e


def load_calibration(path: str | Path | None = None) -> tuple[CalibrationEntry, ...]:
    """The calibration entries of ``path`` (default: the packaged :data:`CALIBRATION_FILE`).

    Raises:
        OSError: unreadable file.
        ValueError: not a valid ``perfscope.calibration/1`` document (the message names
            the entry and field), or two entries for one technique, class and metric.
    """
    if path is None:
        return _packaged()
    return _parse(Path(path).read_text(encoding="utf-8"))


@cache
def _packaged() -> tuple[CalibrationEntry, ...]:
    return _parse(CALIBRATION_FILE.read_text(encoding="utf-8"))


def _parse(text: str) -> tuple[CalibrationEntry, ...]:
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document")
    raw = data.get("entries")
    if not isinstance(raw, list):
        raise ValueError("calibration: 'entries' must be a list")
    entries = tuple(_entry(r, i) for i, r in enumerate(raw))
    seen: set[tuple[str, str, str]] = set()
    for e in entries:
        key = (e.technique, e.hardware_class, e.metric)
        if key in seen:
            raise ValueError(f"calibration: two entries for {' / '.join(key)}")
        seen.add(key)
    return entries


def technique_key(advisor_technique: str) -> str | None:
    """The calibration technique an advisor suggestion is (``None``: none of ours)."""
    for key, (_, prefixes) in TECHNIQUES.items():
        if any(advisor_technique.startswith(p) for p in prefixes):
            return key
    return None


def hardware_class(device_kind: str | None) -> str:
    """``gpu`` for accelerators (GPU, TPU, NPU), ``cpu`` otherwise."""
    return "gpu" if (device_kind or "").lower() in ("gpu", "tpu", "npu") else "cpu"


def _pct(x: float) -> str:
    return f"{100 * x:+.0f}%"


def calibration_for(
    advisor_technique: str,
    hw_class: str,
    metric: str,
    entries: tuple[CalibrationEntry, ...] | None = None,
) -> Calibration:
    """The calibration note of one suggestion.

    Args:
        advisor_technique: the suggestion's ``technique``.
        hw_class: ``cpu`` or ``gpu`` (:func:`hardware_class`).
        metric: the suggestion's gain metric (``decode_tok_s``, ``tpot_s``, ``ttft_s``).
        entries: default :func:`load_calibration`.
    """
    key = technique_key(advisor_technique)
    table = load_calibration() if entries is None else entries
    upper = hw_class.upper()
    name = TECHNIQUES[key][0] if key is not None else advisor_technique
    study_metric = _METRIC.get(metric)
    found = next(
        (
            e
            for e in table
            if e.technique == key and e.hardware_class == hw_class and e.metric == study_metric
        ),
        None,
    )
    if found is None:
        has_class = any(e.hardware_class == hw_class for e in table)
        text = (
            f"not calibrated on {upper}"
            if not has_class
            else f"not calibrated on {upper} for {name} (no study measured it)"
        )
        return Calibration(hw_class, key, False, None, None, text)
    e = found
    lo, hi = e.interval
    text = (
        f"on {upper} our projections for {name} were off by {_pct(e.error)} "
        f"({e.study}, {e.change}, {e.metric}, {e.runs_per_setting} runs per setting, "
        f"{e.date}: measured {e.measured_ratio:.3g}x [{lo:.3g}, {hi:.3g}] vs projected "
        f"{e.projected_ratio:.3g}x)"
    )
    if not e.significant:
        text += "; not significant: the measured interval includes 1"
    elif e.projection_inside:
        text += "; the projection lies inside the measured interval"
    source = {
        "study": e.study,
        "change": e.change,
        "metric": e.metric,
        "script": e.script,
        "write_up": e.write_up,
        "study_file": e.study_file,
        "date": e.date,
        "machine": e.machine,
        "runs_per_setting": e.runs_per_setting,
        "measured_ratio": e.measured_ratio,
        "interval": [lo, hi],
        "confidence": e.confidence,
        "projected_ratio": e.projected_ratio,
        "cause": e.cause,
    }
    return Calibration(hw_class, key, True, e.significant, e.error, text, source)
