"""How far the advisor's projections were off, rebuilt from stored ``perfscope study`` records.

``calibration.json`` (schema ``perfscope.calibration/2``, next to this module) is *generated*,
never typed: ``perfscope advisor calibrate [STUDIES...]`` reads stored study records
(``perfscope.study/1`` JSON, e.g. ``samples/studies/results/*.json``) and writes one
:class:`CalibrationEntry` per technique, machine class, metric, change and operating point
(:data:`OPERATING_POINT`, e.g. a paged KV cache's budget): the projected
ratio, the speed-of-light (roofline alone) ratio, the measured ratio with its between-run
interval as the study computed it, whether that interval excludes 1 (``significant``), the
error ``projected / measured - 1`` and the study file it came from.

Entries are keyed by a :class:`MachineClass` (CPU model and cores, GPU model, engine): the
advice on a run quotes the entry measured on *that* machine class, names its source, and
says "uncalibrated here" otherwise (:func:`calibration_for`). A significant measured effect
that goes against a suggestion is evidence against it (:func:`contradicting_entry`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.jsontypes import JsonObject, json_object

if TYPE_CHECKING:
    from perfscope.analysis.study import Study
    from perfscope.hwdb.spec import DeviceSpec

__all__ = [
    "CALIBRATION_FILE",
    "METRIC_FOR_GAIN",
    "OPERATING_POINT",
    "SCHEMA",
    "TECHNIQUES",
    "UNCHECKED_HOW",
    "UNCHECKED_PREFIX",
    "Calibration",
    "CalibrationEntry",
    "MachineClass",
    "build_calibration",
    "calibration_document",
    "calibration_for",
    "contradicting_entry",
    "hardware_class",
    "load_calibration",
    "machine_of_device",
    "machine_of_summary",
    "operating_point",
    "projection_check",
    "technique_key",
    "technique_of_change",
    "threads_evidence",
    "write_calibration",
]

SCHEMA = "perfscope.calibration/2"
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")

#: Calibration technique key → (display name, advisor technique prefixes it covers).
TECHNIQUES: dict[str, tuple[str, tuple[str, ...]]] = {
    "batching": ("batching", ("larger batches",)),
    "int8-weights": ("int8 weights", ("int8 weights",)),
    "int4-weights": ("int4 weights", ("int4 weights",)),
    "kv-heads": ("GQA/MQA", ("GQA/MQA",)),
    "fp8-kv": ("fp8 KV cache", ("fp8 KV cache",)),
    "int8-kv": ("int8 KV cache", ("int8 KV cache",)),
    "prefix-caching": ("prompt caching", ("prompt (prefix) caching",)),
    "speculative": ("speculative decoding", ("speculative decoding",)),
    "parallel-decoding": ("lookahead / Medusa decoding", ()),
    "chunked-prefill": ("chunked prefill", ("prefill/decode disaggregation",)),
    "tensor-parallel": ("tensor parallelism", ("tensor parallelism",)),
    "pipeline-parallel": ("pipeline parallelism", ("pipeline parallelism",)),
    "compile": ("torch.compile", ("cut decode", "cut prefill")),
    "threads": ("more threads", ()),
    "dtype": ("a narrower dtype", ()),
    "sparsity": ("weight sparsity", ()),
    "layers": ("layer pruning", ()),
    "model-preset": ("a smaller (distilled) model", ()),
    "attention": ("the attention kernel", ()),
    "scheduler": ("the scheduler", ()),
    "concurrency": ("more concurrent users", ()),
    "rate": ("a higher request rate", ()),
    "kv-cache": ("the KV cache", ()),
    "kv-paged": ("a paged KV cache", ()),
    "prune-heads": ("attention-head pruning", ()),
    "distillation": ("a distilled (smaller, trained) model", ()),
    "disaggregation": ("prefill/decode disaggregation", ()),
    "replicas": ("request parallelism (replicas)", ()),
}

#: Technique key → the study's fixed settings (engine options, else workload arguments) that
#: set its operating point: entries of one change measured at different values of these are
#: kept apart (a paged KV cache that wins under a 1 MB budget and loses under 4 MB is two
#: findings, not one to overwrite; so is a prefix cache on shared prefixes and on multi-turn
#: conversations).
OPERATING_POINT: dict[str, tuple[str, ...]] = {
    "kv-paged": ("kv_budget_mb", "kv_block_tokens"),
    "prefix-caching": ("dataset",),
}

#: Advisor gain metric → the study metric that measures it.
METRIC_FOR_GAIN = {
    "decode_tok_s": "output_tok_s",
    "tpot_s": "tpot_p50_s",
    "ttft_s": "ttft_p50_s",
    "decode_step_s": "tpot_p50_s",
    "prefill_step_s": "ttft_p50_s",
}

#: Study metrics calibrated and whether higher is better.
_CALIBRATED = {"ttft_p50_s": False, "tpot_p50_s": False, "output_tok_s": True}


def technique_of_change(
    knob: str, value: str, engine_options: Mapping[str, Any] | None = None
) -> str:
    """The calibration technique a study's change is (``quant`` to ``int8-wo``: int8 weights).

    ``engine_options``: the study's fixed engine options (its ``args``); ``layers`` with
    ``weights=trained`` trains each depth on the corpus (a distilled student, ``distill.py``)
    instead of cutting a trained model's layers (pruning)."""
    v = value.lower()
    if knob == "layers" and str((engine_options or {}).get("weights", "")) == "trained":
        return "distillation"
    if knob == "batch-size":
        return "batching"
    if knob == "quant":
        return "int4-weights" if "int4" in v else "int8-weights"
    if knob == "kv-dtype":
        return "fp8-kv" if "fp8" in v else "int8-kv"
    if knob == "prefix-cache":
        return "prefix-caching"
    if knob == "num-speculative-tokens" or (knob == "decoding" and v == "draft"):
        return "speculative"
    if knob == "decoding":
        return "parallel-decoding"
    if knob == "max-batched-tokens":
        return "chunked-prefill"
    if knob in ("heads", "hidden-size", "intermediate-size"):
        return "model-preset"  # a smaller model by one of its shape's numbers
    if knob == "disaggregate":
        return "disaggregation"
    if knob == "parallel":  # samples/studies/parallel.py: single, tp=2, pp=2
        return "pipeline-parallel" if v.startswith("pp") else "tensor-parallel"
    return knob


@dataclass(frozen=True)
class MachineClass:
    """The machine class a measurement holds for: what calibration entries are keyed by.

    Attributes:
        cpu_model: the host CPU model name (``""`` unknown).
        cores: logical CPU cores (``None`` unknown).
        gpu_model: the GPU the run used, ``None`` for a CPU run.
        engine: the engine kind (``reference``, ``hf``, ``openai``); ``None`` matches any.
    """

    cpu_model: str
    cores: int | None
    gpu_model: str | None
    engine: str | None = None

    @property
    def hardware_class(self) -> str:
        """``gpu`` when a GPU ran the model, else ``cpu``."""
        return "gpu" if self.gpu_model else "cpu"

    def matches(self, other: MachineClass) -> bool:
        """Same hardware (GPU model, or CPU model and cores) and, when both name one, the
        same engine."""
        if self.hardware_class != other.hardware_class:
            return False
        if self.gpu_model:
            same_hw = self.gpu_model == other.gpu_model
        else:
            same_hw = self.cpu_model == other.cpu_model and self.cores == other.cores
        engines = self.engine is None or other.engine is None or self.engine == other.engine
        return same_hw and engines

    def describe(self) -> str:
        """In words: ``AMD EPYC 7B13, 2 cores, reference engine``; a GPU class names its GPU
        only (:meth:`matches` does not look at the host CPU of a GPU run)."""
        if self.gpu_model:
            parts = [self.gpu_model]
        else:
            parts = [self.cpu_model or "unknown CPU"]
            if self.cores:
                parts.append(f"{self.cores} cores")
        if self.engine:
            parts.append(f"{self.engine} engine")
        return ", ".join(parts)

    def to_dict(self) -> JsonObject:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MachineClass:
        """Inverse of :meth:`to_dict`."""
        cores = data.get("cores")
        return cls(
            cpu_model=str(data.get("cpu_model") or ""),
            cores=int(cores) if isinstance(cores, int | float) else None,
            gpu_model=str(data["gpu_model"]) if data.get("gpu_model") else None,
            engine=str(data["engine"]) if data.get("engine") else None,
        )


def _strip_calibrated(name: str) -> str:
    return name.removesuffix(" (calibrated)").strip()


def _machine_from_spec_dict(spec: Mapping[str, object], engine: str | None) -> MachineClass:
    extra = json_object(spec.get("extra")) or {}
    fp = json_object((json_object(extra.get("calibration")) or {}).get("fingerprint")) or {}
    kind = str(spec.get("kind") or "cpu")
    name = _strip_calibrated(str(spec.get("name") or ""))
    gpu = fp.get("gpu_name") or (name if kind in ("gpu", "tpu", "npu") else None)
    cpu = fp.get("cpu_model") or ("" if gpu else name)
    cores = fp.get("cores")
    return MachineClass(
        cpu_model=str(cpu),
        cores=int(cores) if isinstance(cores, int) else None,
        gpu_model=str(gpu) if gpu else None,
        engine=engine,
    )


def machine_of_device(device: DeviceSpec, engine: str | None = None) -> MachineClass:
    """The machine class of a run analysed against ``device`` (a calibrated device names its
    CPU model and cores in its calibration fingerprint)."""
    return _machine_from_spec_dict(
        {"kind": device.kind, "name": device.name, "extra": device.extra}, engine
    )


def machine_of_summary(summary: Mapping[str, object]) -> dict[str, object]:
    """The machine class of a run summary, as JSON (``{}`` without a hardware section)."""
    spec = json_object((json_object(summary.get("hardware")) or {}).get("spec"))
    if spec is None:
        return {}
    engine = (json_object(summary.get("engine")) or {}).get("kind")
    return dict(_machine_from_spec_dict(spec, str(engine) if engine else None).to_dict())


@dataclass(frozen=True)
class CalibrationEntry:
    """One measured effect of a study next to its projection.

    Attributes:
        technique: key of :data:`TECHNIQUES`.
        machine: where it was measured.
        metric: the study metric (``output_tok_s``, ``tpot_p50_s``, ``ttft_p50_s``).
        knob, baseline, value: the study's knob and the change (``batch-size``, ``1``, ``8``).
        projected_ratio: the what-if's (derated) candidate / baseline ratio, ``None`` when
            the projection did not cover it.
        sol_ratio: the bare roofline's (speed of light) ratio, ``None`` when not covered.
        measured_ratio: the measured candidate / baseline ratio.
        interval: its between-run interval at ``confidence`` (``None``: one run a setting,
            or too few runs for an interval at that level).
        confidence: e.g. 0.95.
        significant: the interval excludes 1.
        error: ``projected_ratio / measured_ratio - 1`` (``None`` without a projection).
        runs_per_setting: the study's repeats.
        method: the study's interval method.
        study_file: the stored study it came from.
        created_at: when the study ran (ISO-8601).
        conditions: the operating point (``kv_budget_mb=1.0, kv_block_tokens=16``) for a
            technique whose effect depends on one (:data:`OPERATING_POINT`); ``""`` otherwise.
    """

    technique: str
    machine: MachineClass
    metric: str
    knob: str
    baseline: str
    value: str
    projected_ratio: float | None
    sol_ratio: float | None
    measured_ratio: float
    interval: tuple[float, float] | None
    confidence: float
    significant: bool
    error: float | None
    runs_per_setting: int
    method: str
    study_file: str
    created_at: str
    conditions: str = ""

    @property
    def change(self) -> str:
        """``batch-size 1 -> 8``; with its operating point, ``kv-paged off -> on
        (kv_budget_mb=1.0, kv_block_tokens=16)``."""
        at = f" ({self.conditions})" if self.conditions else ""
        return f"{self.knob} {self.baseline} -> {self.value}{at}"

    @property
    def measured_gain(self) -> float:
        """The measured ratio turned into a gain (> 1: better), whatever the metric's sense."""
        return self.measured_ratio if _CALIBRATED[self.metric] else 1.0 / self.measured_ratio

    @property
    def projection_inside(self) -> bool:
        """Whether the projected ratio lies inside the measured interval."""
        if self.interval is None or self.projected_ratio is None:
            return False
        return self.interval[0] <= self.projected_ratio <= self.interval[1]

    def to_dict(self) -> JsonObject:
        """JSON-ready dict (the file's entry)."""
        d = asdict(self)
        d["machine"] = self.machine.to_dict()
        d["interval"] = None if self.interval is None else list(self.interval)
        if not self.conditions:  # a technique without an operating point: no key
            del d["conditions"]
        return d

    def measured_text(self) -> str:
        """``1.80x [0.54, 5.99], not significant``."""
        if self.interval is not None:
            iv = f"[{self.interval[0]:.3g}, {self.interval[1]:.3g}]"
        elif self.runs_per_setting <= 1:
            iv = "one run a setting"
        else:
            # paired rounds too few for an interval at this level (6 for 95%), not one run
            level = f"{self.confidence:.0%}"
            iv = f"{self.runs_per_setting} runs a setting: too few for a {level} interval"
        sig = "significant" if self.significant else "not significant"
        return f"{self.measured_ratio:.3g}x {iv}, {sig}"


_ENTRY_KEYS: dict[str, type | tuple[type, ...]] = {
    "technique": str,
    "machine": dict,
    "metric": str,
    "knob": str,
    "baseline": str,
    "value": str,
    "measured_ratio": (int, float),
    "confidence": (int, float),
    "significant": bool,
    "runs_per_setting": int,
    "method": str,
    "study_file": str,
    "created_at": str,
}
_OPTIONAL_NUM = ("projected_ratio", "sol_ratio", "error")


def _entry(raw: Any, i: int) -> CalibrationEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"calibration entry {i} is not an object")
    for key, tp in _ENTRY_KEYS.items():
        if key not in raw:
            raise ValueError(f"calibration entry {i} lacks {key!r}")
        if not isinstance(raw[key], tp) or (isinstance(raw[key], bool) and tp is not bool):
            raise ValueError(f"calibration entry {i}: {key!r} has the wrong type")
    for key in (*_OPTIONAL_NUM, "interval"):
        if key not in raw:
            raise ValueError(f"calibration entry {i} lacks {key!r}")
    if extra := set(raw) - set(_ENTRY_KEYS) - {*_OPTIONAL_NUM, "interval", "conditions"}:
        raise ValueError(f"calibration entry {i}: unknown keys {sorted(extra)}")
    if not isinstance(raw.get("conditions", ""), str):
        raise ValueError(f"calibration entry {i}: 'conditions' has the wrong type")
    if raw["technique"] not in TECHNIQUES:
        raise ValueError(f"calibration entry {i}: unknown technique {raw['technique']!r}")
    if raw["metric"] not in _CALIBRATED:
        raise ValueError(f"calibration entry {i}: unknown metric {raw['metric']!r}")
    iv = raw["interval"]
    if iv is not None and (
        not isinstance(iv, list)
        or len(iv) != 2
        or not all(isinstance(v, int | float) and v > 0 for v in iv)
    ):
        raise ValueError(f"calibration entry {i}: interval must be two positive ratios or null")
    for key in _OPTIONAL_NUM:
        if raw[key] is not None and not isinstance(raw[key], int | float):
            raise ValueError(f"calibration entry {i}: {key!r} has the wrong type")
    interval = None if iv is None else (float(iv[0]), float(iv[1]))
    e = CalibrationEntry(
        technique=raw["technique"],
        machine=MachineClass.from_dict(raw["machine"]),
        metric=raw["metric"],
        knob=raw["knob"],
        baseline=raw["baseline"],
        value=raw["value"],
        projected_ratio=raw["projected_ratio"],
        sol_ratio=raw["sol_ratio"],
        measured_ratio=float(raw["measured_ratio"]),
        interval=interval,
        confidence=float(raw["confidence"]),
        significant=raw["significant"],
        error=raw["error"],
        runs_per_setting=raw["runs_per_setting"],
        method=raw["method"],
        study_file=raw["study_file"],
        created_at=raw["created_at"],
        conditions=raw.get("conditions", ""),
    )
    if e.significant != _excludes_one(interval):
        raise ValueError(f"calibration entry {i}: significant disagrees with its interval")
    if (
        e.error is not None
        and e.projected_ratio is not None
        and not math.isclose(e.error, e.projected_ratio / e.measured_ratio - 1.0, abs_tol=5e-3)
    ):
        raise ValueError(f"calibration entry {i}: error is not projected / measured - 1")
    return e


def _excludes_one(interval: tuple[float, float] | None) -> bool:
    return interval is not None and not interval[0] <= 1.0 <= interval[1]


def load_calibration(path: str | Path | None = None) -> tuple[CalibrationEntry, ...]:
    """The calibration entries of ``path`` (default: the packaged :data:`CALIBRATION_FILE`).

    Raises:
        OSError: unreadable file.
        ValueError: not a valid ``perfscope.calibration/2`` document (the message names
            the entry and field).
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
    return tuple(_entry(r, i) for i, r in enumerate(raw))


# --------------------------------------------------------------------------- building


def _rel(path: str | Path, root: Path | None) -> str:
    p = Path(path)
    if root is not None:
        try:
            return p.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return p.name


def build_calibration(
    studies: Iterable[tuple[str | Path, Study]],
    *,
    root: Path | None = None,
    rederive: bool = True,
) -> list[CalibrationEntry]:
    """The calibration entries of stored studies, one per technique, machine class, metric,
    change and operating point (:data:`OPERATING_POINT`); a change measured by several
    studies at one operating point on one machine class keeps the newest.

    Args:
        studies: ``(path, study)`` pairs (:func:`perfscope.analysis.study.read_study`).
        root: paths under it are stored relative to it (the repository root), others by
            file name.
        rederive: make each projection again with the current projection model from what
            the record stores (:func:`perfscope.analysis.study.rederive_study`; records
            without stored inputs keep their projection); false: the stored projections.
    """
    from perfscope.analysis.study import rederive_study

    best: dict[tuple[str, str, str, str, str], CalibrationEntry] = {}
    for path, stored in studies:
        st = rederive_study(stored) if rederive else stored
        machine = MachineClass.from_dict(getattr(st, "machine", None) or {})
        for s in st.settings[1:]:
            for e in s.effects:
                if e.metric not in _CALIBRATED or e.change.ratio is None:
                    continue
                ratio = float(e.change.ratio)
                if not math.isfinite(ratio) or ratio <= 0:
                    continue
                iv = e.change.ci
                interval = None if iv is None else (float(iv[0]), float(iv[1]))
                sol = _sol_ratio(s.projection, e.metric)
                proj = None if e.projected_ratio is None else _sig(float(e.projected_ratio))
                measured = _sig(ratio)
                technique = technique_of_change(st.knob, s.value, st.args.get("engine_options"))
                entry = CalibrationEntry(
                    technique=technique,
                    machine=machine,
                    metric=e.metric,
                    knob=st.knob,
                    baseline=st.values[0],
                    value=s.value,
                    projected_ratio=proj,
                    sol_ratio=None if sol is None else _sig(sol),
                    measured_ratio=measured,
                    interval=None if interval is None else (_sig(interval[0]), _sig(interval[1])),
                    confidence=float(st.args.get("confidence", 0.95) or 0.95),
                    significant=_excludes_one(interval),
                    error=None if proj is None else _sig(proj / measured - 1.0),
                    runs_per_setting=int(st.repeat),
                    method=str(e.change.method),
                    study_file=_rel(path, root),
                    created_at=st.created_at,
                    conditions=operating_point(technique, st.args),
                )
                key = (
                    entry.technique,
                    json.dumps(machine.to_dict(), sort_keys=True),
                    entry.metric,
                    entry.change,
                    entry.knob,
                )
                old = best.get(key)
                if old is None or entry.created_at >= old.created_at:
                    best[key] = entry

    # A record from before its technique's operating point was stored (no conditions) is
    # superseded by a newer record of the same change that names one.
    def same(c: CalibrationEntry) -> tuple[Any, ...]:
        return (c.technique, c.machine, c.metric, c.knob, c.baseline, c.value)

    named: dict[tuple[Any, ...], str] = {}
    for c in best.values():
        if c.conditions:
            named[same(c)] = max(named.get(same(c), ""), c.created_at)
    kept = [c for c in best.values() if c.conditions or c.created_at >= named.get(same(c), "")]
    return sorted(
        kept,
        key=lambda x: (x.technique, x.machine.describe(), x.knob, x.value, x.metric),
    )


def operating_point(technique: str, args: Mapping[str, Any] | None) -> str:
    """The operating point of a ``technique``'s study from its fixed settings (a study's
    ``args``: :data:`OPERATING_POINT` names engine options, else workload arguments):
    ``kv_budget_mb=1.0, kv_block_tokens=16``; ``""`` for a technique without one."""
    args = args or {}
    engine = args.get("engine_options") or {}
    got = {k: engine.get(k, args.get(k)) for k in OPERATING_POINT.get(technique, ())}
    return ", ".join(f"{k}={v}" for k, v in got.items() if v is not None)


def _sig(x: float) -> float:
    """``x`` to 6 significant digits (a stable, diff-friendly file)."""
    return float(f"{x:.6g}")


_PROJ_KEY = {"ttft_p50_s": "ttft_s", "tpot_p50_s": "tpot_s", "output_tok_s": "throughput_tok_s"}


def _sol_ratio(projection: Mapping[str, Any] | None, metric: str) -> float | None:
    v = ((projection or {}).get("sol_ratios") or {}).get(_PROJ_KEY[metric])
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def calibration_document(entries: Sequence[CalibrationEntry]) -> JsonObject:
    """The ``perfscope.calibration/2`` document of ``entries`` (what the file holds)."""
    return {
        "schema": SCHEMA,
        "about": (
            "Generated by `perfscope advisor calibrate` from stored perfscope studies; do "
            "not edit. ratios are candidate / baseline; interval: the study's between-run "
            "interval of the measured ratio; error = projected / measured - 1."
        ),
        "sources": [*sorted({e.study_file for e in entries})],
        "entries": [e.to_dict() for e in entries],
    }


def write_calibration(path: str | Path, entries: Sequence[CalibrationEntry]) -> None:
    """Write ``entries`` as a calibration file (stable order, so a rebuild diffs clean)."""
    text = json.dumps(calibration_document(entries), indent=2, sort_keys=False) + "\n"
    Path(path).write_text(text, encoding="utf-8")
    _packaged.cache_clear()


# --------------------------------------------------------------------------- lookup


@dataclass(frozen=True)
class Calibration:
    """The calibration note of one suggestion (JSON: the advice's ``calibration``).

    Attributes:
        hardware_class: ``cpu`` or ``gpu``.
        machine: the machine class the advice is for, in words.
        technique: the calibration technique key, ``None`` when the suggestion maps to none.
        calibrated: whether a stored study measured this technique on this machine class.
        significant: whether that study's measured interval excludes 1 (``None`` when
            not calibrated).
        error: ``projected / measured - 1`` of the study (``None`` when not calibrated).
        text: one sentence for people.
        source: the entry (:meth:`CalibrationEntry.to_dict`), or ``None``.
    """

    hardware_class: str
    machine: str
    technique: str | None
    calibrated: bool
    significant: bool | None
    error: float | None
    text: str
    source: JsonObject | None = None

    def to_dict(self) -> JsonObject:
        """JSON-ready dict."""
        return asdict(self)


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


def _for_machine(
    table: Sequence[CalibrationEntry], key: str | None, machine: MachineClass, metric: str | None
) -> list[CalibrationEntry]:
    return [
        e
        for e in table
        if e.technique == key
        and e.machine.matches(machine)
        and (metric is None or e.metric == metric)
    ]


def calibration_for(
    advisor_technique: str,
    machine: MachineClass,
    metric: str,
    entries: Sequence[CalibrationEntry] | None = None,
) -> Calibration:
    """The calibration note of one suggestion on ``machine``.

    Prefers a significant entry, then the one with the most runs, then the newest.

    Args:
        advisor_technique: the suggestion's ``technique``.
        machine: the machine class of the run (:func:`machine_of_device`).
        metric: the suggestion's gain metric (``decode_tok_s``, ``tpot_s``, ``ttft_s``).
        entries: default :func:`load_calibration`.
    """
    key = technique_key(advisor_technique)
    table = load_calibration() if entries is None else entries
    name = TECHNIQUES[key][0] if key is not None else advisor_technique
    where = machine.describe()
    hw = machine.hardware_class
    found = _for_machine(table, key, machine, METRIC_FOR_GAIN.get(metric))
    if not found:
        return Calibration(
            hw,
            where,
            key,
            False,
            None,
            None,
            f"uncalibrated here: no stored study of {name} on {where}",
        )
    e = max(found, key=lambda x: (x.significant, x.runs_per_setting, x.created_at))
    proj = "not projected" if e.projected_ratio is None else f"projected {e.projected_ratio:.3g}x"
    err = "" if e.error is None else f": off by {_pct(e.error)}"
    text = (
        f"on this machine class ({where}) the {e.knob} study measured {e.change} "
        f"{e.metric} {e.measured_text()} vs {proj}{err} ({e.runs_per_setting} runs per "
        f"setting, {e.created_at[:10]}, {e.study_file})"
    )
    if e.projection_inside:
        text += "; the projection lies inside the measured interval"
    return Calibration(hw, where, key, True, e.significant, e.error, text, e.to_dict())


#: How :func:`projection_check` begins and ends a note for a machine class no stored study
#: checked (presentation merges several devices' notes into one by these).
UNCHECKED_PREFIX = "unchecked: no stored study measured a significant effect on "
UNCHECKED_HOW = "(perfscope study ... --save, then perfscope advisor calibrate)"


def projection_check(
    machine: MachineClass, entries: Sequence[CalibrationEntry] | None = None
) -> str:
    """How far projections on ``machine`` were checked, for any projection shown: the median
    absolute error of the stored studies' significant effects on that machine class (with
    their count and the share of every effect within 25%), or ``unchecked`` when no stored
    study ran there (projections onto another device are never checked by this machine's
    studies)."""
    table = load_calibration() if entries is None else entries
    here = [e for e in table if e.machine.matches(machine) and e.error is not None]
    sig = [abs(float(e.error)) for e in here if e.significant and e.error is not None]
    where = machine.describe()
    if not sig:
        return f"{UNCHECKED_PREFIX}{where} {UNCHECKED_HOW}"
    ordered = sorted(sig)
    mid = len(ordered) // 2
    med = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    within = sum(1 for x in sig if x <= 0.25)
    return (
        f"checked on {where}: median |error| {100 * med:.0f}% over {len(sig)} significant "
        f"effects of stored studies ({within} within 25%)"
    )


def contradicting_entry(
    advisor_technique: str,
    machine: MachineClass,
    metric: str,
    entries: Sequence[CalibrationEntry] | None = None,
) -> CalibrationEntry | None:
    """A stored study on ``machine`` that measured the technique significantly *worse* than
    its baseline on the suggestion's metric (the advice promises a gain), or ``None``."""
    table = load_calibration() if entries is None else entries
    key = technique_key(advisor_technique)
    found = _for_machine(table, key, machine, METRIC_FOR_GAIN.get(metric))
    bad = [e for e in found if e.significant and e.measured_gain < 1.0]
    return min(bad, key=lambda e: e.measured_gain) if bad else None


def threads_evidence(
    machine: MachineClass, entries: Sequence[CalibrationEntry] | None = None
) -> CalibrationEntry | None:
    """A stored threads study on ``machine`` where more threads were significantly slower
    (output tokens/s), or ``None``."""
    table = load_calibration() if entries is None else entries
    bad = []
    for e in _for_machine(table, "threads", machine, "output_tok_s"):
        try:
            more = int(e.value) > int(e.baseline)
        except ValueError:
            continue
        if more and e.significant and e.measured_gain < 1.0:
            bad.append(e)
    return min(bad, key=lambda e: e.measured_gain) if bad else None
