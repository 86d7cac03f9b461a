"""The study record: assembling it from its runs, reading it back and re-projecting it.

The record (:class:`Study`, JSON schema ``perfscope.study/1``) holds, per setting of the knob,
the per-run metrics of its repeats (runs interleaved A B C A B C ..., the order recorded), the
memory the setting needs by the cost model (weights + KV cache), the roofline point and
verdict per phase, and, for every setting after the first, the measured effect against the
first setting with its between-run interval next to the what-if projection of the same
change (:func:`perfscope.analysis.whatif.predict`) and that projection's error.

:func:`build_study` assembles it, :func:`read_study` reads a stored one, and
:func:`rederive_study` makes its projections again from what each setting stores
(:func:`projection_inputs`). Metrics are in SI units (seconds, tokens/s, requests/s,
J/token), memory in bytes; ratios and errors are unitless.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from perfscope.analysis.calibration import machine_of_summary
from perfscope.analysis.catalogue import metric
from perfscope.analysis.experiment import SetChange, judge_experiment
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.overhead import OverheadFit, PassCosts
from perfscope.analysis.queueing import Load
from perfscope.analysis.study.points import (
    PhasePoint,
    RunPoint,
    phase_points,
    run_metrics,
)
from perfscope.analysis.study.projection import memory_need, project_change
from perfscope.analysis.study.scheduling import (
    _NO_RATIOS,
    _SCHEDULING_KNOBS,
    _scheduling_projection,
    oversubscribed_threads,
)
from perfscope.analysis.study.speculative import _after_run_median
from perfscope.analysis.study.stats import DEFAULT_PRIMARY, _median
from perfscope.jsontypes import (
    JsonObject,
    JsonValue,
    ReadOnlyJson,
    json_at,
    json_number,
    json_object,
)

__all__ = [
    "METRICS",
    "SCHEMA",
    "STUDY_COLUMNS",
    "Effect",
    "SettingResult",
    "Study",
    "build_study",
    "projection_inputs",
    "read_study",
    "rederive_study",
]


SCHEMA = "perfscope.study/1"

#: The metrics compared per setting: the study record's column name (``perfscope.study/1``) →
#: (the catalogue metric it is, the projection key it is checked against or None). What a
#: column measures and which way is better come from the catalogue, as the sweep's and the
#: run index's columns do.
STUDY_COLUMNS: dict[str, tuple[str, str | None]] = {
    "ttft_p50_s": ("ttft.p50", "ttft_s"),
    "tpot_p50_s": ("tpot.p50", "tpot_s"),
    "output_tok_s": ("output_tok_s", "throughput_tok_s"),
    "goodput_req_s": ("goodput_req_s", None),
    "j_per_output_token": ("j_per_token", None),
}


def _better(name: str) -> str:
    better = metric(name).better
    if better is None:  # a compared metric has a better direction, or it cannot be judged
        raise ValueError(f"study metric {name!r} has no better direction in the catalogue")
    return better


#: Metrics compared per setting: column → (direction that is better, projection key or None).
METRICS: dict[str, tuple[str, str | None]] = {
    column: (_better(name), key) for column, (name, key) in STUDY_COLUMNS.items()
}


@dataclass(frozen=True)
class Effect:
    """A metric's measured change from the first setting, next to its projection.

    ``projected_ratio`` is the what-if's candidate / baseline ratio (``None`` when the
    projection does not cover the metric); ``error`` is ``projected / measured - 1``
    (0.3: the projection promised 30% more than was measured)."""

    metric: str
    better: str
    change: SetChange
    projected_ratio: float | None
    error: float | None


@dataclass(frozen=True)
class SettingResult:
    """One value of the knob: its runs, the median of each metric over them, the memory it
    needs, its effects against the first setting and the projection they are judged by."""

    value: str
    runs: list[RunPoint]
    median: dict[str, float | None]
    memory: dict[str, float]
    effects: list[Effect]
    projection: JsonObject | None
    quality: ReadOnlyJson | None = None
    #: What its projection was made from (:func:`projection_inputs`), so that it can be
    #: made again from the record alone (:func:`rederive_study`); ``None`` in older records.
    inputs: JsonObject | None = None


@dataclass(frozen=True)
class Study:
    """A finished study (JSON schema ``perfscope.study/1``; see the module docstring)."""

    knob: str
    values: list[str]
    repeat: int
    settings: list[SettingResult]
    order: list[tuple[int, int]]
    #: The study's :class:`~perfscope.api.run.RunArgs` keywords, replayed into ``RunArgs``
    #: when it is projected again (``perfscope.api.study.reproject``).
    args: Mapping[str, Any]
    created_at: str
    notes: list[str] = field(default_factory=list)
    path: str | None = None
    schema: str = SCHEMA
    #: The machine class the study ran on (:class:`perfscope.analysis.calibration.MachineClass`
    #: as JSON: CPU model and cores, GPU model, engine), ``{}`` in older records.
    machine: Mapping[str, object] = field(default_factory=dict)

    @property
    def baseline(self) -> SettingResult:
        return self.settings[0]

    def effect(self, value: str, metric: str) -> Effect | None:
        """The effect of setting ``value`` on ``metric`` (``None`` for the baseline)."""
        for s in self.settings:
            if s.value == value:
                return next((e for e in s.effects if e.metric == metric), None)
        raise KeyError(f"{self.knob} has no setting {value!r}: {', '.join(self.values)}")

    def estimate(self, setting: SettingResult, metric: str) -> float | None:
        """``metric`` of ``setting`` by the one statistic the effects use (SI units).

        The baseline's value is the median of its runs; every other setting's is that
        median times the setting's effect ratio (the paired Hodges–Lehmann estimate of
        :func:`perfscope.analysis.experiment.judge_metric`), so a settings table built from
        these values moves from the baseline in the direction, and by the ratio, its
        effects table says. A setting with no ratio for ``metric`` falls back to the
        median of its own runs."""
        base = self.baseline.median.get(metric)
        if setting is self.baseline or setting.value == self.baseline.value:
            return base
        e = next((e for e in setting.effects if e.metric == metric), None)
        if e is None or e.change.ratio is None or not base:
            # A zero baseline's ratio is relative to another scale: the setting's own median.
            return setting.median.get(metric)
        return float(base) * e.change.ratio

    def to_dict(self) -> JsonObject:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Study:
        """Read back :meth:`to_dict` (lists where JSON turned tuples into lists)."""
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} record (schema {data.get('schema')!r})")

        def change(c: Mapping[str, Any]) -> SetChange:
            ci = c.get("ci")
            known = {f.name for f in fields(SetChange)}
            rest = {k: v for k, v in c.items() if k in known}
            rest["ci"] = None if ci is None else (float(ci[0]), float(ci[1]))
            rest["n"] = (int(c["n"][0]), int(c["n"][1]))
            rest["outliers"] = tuple(str(x) for x in c.get("outliers") or ())
            return SetChange(**rest)

        settings = []
        for s in data["settings"]:
            runs = [
                RunPoint(
                    order=int(r["order"]),
                    round=int(r["round"]),
                    setting=int(r["setting"]),
                    run=str(r["run"]),
                    metrics=dict(r["metrics"]),
                    phases={k: PhasePoint(**v) for k, v in r["phases"].items()},
                )
                for r in s["runs"]
            ]
            effects = [
                Effect(
                    e["metric"], e["better"], change(e["change"]), e["projected_ratio"], e["error"]
                )
                for e in s["effects"]
            ]
            settings.append(
                SettingResult(
                    value=str(s["value"]),
                    runs=runs,
                    median=dict(s["median"]),
                    memory=dict(s["memory"]),
                    effects=effects,
                    projection=s.get("projection"),
                    quality=s.get("quality"),
                    inputs=s.get("inputs"),
                )
            )
        return cls(
            knob=str(data["knob"]),
            values=[str(v) for v in data["values"]],
            repeat=int(data["repeat"]),
            settings=settings,
            order=[(int(a), int(b)) for a, b in data["order"]],
            args=dict(data["args"]),
            created_at=str(data["created_at"]),
            notes=list(data.get("notes") or []),
            path=data.get("path"),
            schema=str(data["schema"]),
            machine=dict(data.get("machine") or {}),
        )


def read_study(path: str | Path) -> Study:
    """Read a stored study JSON (``perfscope.study/1``) into a :class:`Study`.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not JSON, or not a ``perfscope.study/1`` record (also for
            missing or mistyped fields).
    """
    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text)  # JSONDecodeError is a ValueError
    if not isinstance(data, dict):
        raise ValueError(f"not a {SCHEMA} record (a JSON {type(data).__name__})")
    try:
        return Study.from_dict(data)
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(f"a malformed {SCHEMA} record ({type(exc).__name__}: {exc})") from None


#: The sections of a setting's first run summary a projection reads.
_INPUT_SECTIONS = (
    "model",
    "hardware",
    "roofline",
    "load",
    "workload",
    "speculative",
    "prompt_cache",
    "steps",
)


def projection_inputs(
    summary: Mapping[str, JsonValue],
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
    kv_cache: bool,
    queueing: bool,
    fit: OverheadFit | None = None,
) -> JsonObject:
    """What a setting's projection is made from, as stored with it: the sections of its
    first run's summary a projection reads, its batch and token counts, and (the
    baseline's) the fitted cost model. :func:`rederive_study` makes the projection again
    from these alone."""
    out: JsonObject = {k: summary[k] for k in _INPUT_SECTIONS if summary.get(k) is not None}
    out["setting"] = {
        "batch": int(batch),
        "prompt_len": int(prompt_len),
        "output_len": int(output_len),
        "kv_cache": bool(kv_cache),
        "queueing": bool(queueing),
    }
    if fit is not None:
        out["fit"] = fit.to_dict()
    return out


def _project_setting(
    knob: str,
    values: tuple[str, str],
    baseline: ReadOnlyJson,
    candidate: ReadOnlyJson,
    *,
    batch: tuple[int, int],
    prompt_len: int,
    output_lens: tuple[int, int],
    kv_cache: tuple[bool, bool],
    fit: OverheadFit | None,
    loads: tuple[Load | None, Load | None] | None,
    passes: PassCosts | None,
    prompt_spec: str,
) -> tuple[JsonObject | None, list[str]]:
    """A candidate setting's projection from the baseline's and its own first run
    summaries (or their stored :func:`projection_inputs`), and the notes it adds (the
    caller keeps a copy of its own)."""
    if knob in _SCHEDULING_KNOBS:
        projection = _scheduling_projection(
            knob,
            baseline,
            candidate,
            batch=batch,
            prompt_len=prompt_len,
            output_len=output_lens[0],
            fit=fit,
            loads=loads,
            values=values,
            prompt_spec=prompt_spec,
        )
        return projection, [f"{knob}={values[1]}: {projection['note']}"]
    changed = project_change(
        baseline,
        candidate,
        batch=batch,
        prompt_len=prompt_len,
        output_len=output_lens[0],
        kv_cache=kv_cache,
        output_lens=output_lens,
        fit=fit,
        loads=loads,
        quant=values if knob == "quant" else ("none", "none"),
        passes=passes,
    )
    return changed, []


def _as_int(value: JsonValue) -> int:
    """``int(value)`` of a stored count (a JSON number or numeral); ``TypeError`` for anything
    else, as ``int`` gives."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"int() argument must be a number or a string, not {type(value).__name__!r}")


def _ratio(projection: JsonObject | None, key: str) -> float | None:
    """The projected ratio ``key`` of ``projection`` (``None`` without one)."""
    return None if projection is None else json_number(json_at(projection, "ratios").get(key))


def rederive_study(study: Study) -> Study:
    """``study`` with every projection made again by the current projection model from
    what the record stores (:attr:`SettingResult.inputs`, the measured kernel calls in
    ``projection.passes``), and each effect's projected ratio and error with it; the
    measurements are unchanged. Records without inputs (older ones), records whose inputs
    hold no model to project (a study whose projection another model made, such as
    ``parallel.py``'s, which keeps only each setting's shape) and a ``threads`` study (its
    no-projection rule reads every baseline run's contention) are returned as they are."""
    base = study.settings[0].inputs if study.settings else None
    if not base or not base.get("model") or study.knob == "threads":
        return study
    raw_fit = base.get("fit")
    fit = OverheadFit.from_dict(raw_fit) if isinstance(raw_fit, Mapping) else None
    b_set = base.get("setting")
    if not isinstance(b_set, Mapping):
        return study
    out = [study.settings[0]]
    for s in study.settings[1:]:
        c_set = s.inputs.get("setting") if s.inputs else None
        if not s.inputs or not s.inputs.get("model") or not isinstance(c_set, Mapping):
            out.append(s)
            continue
        queued = bool(b_set.get("queueing"))
        loads = (Load.from_summary(base), Load.from_summary(s.inputs)) if queued else (None, None)
        raw_passes = (s.projection or {}).get("passes")
        made, _ = _project_setting(
            study.knob,
            (study.values[0], s.value),
            base,
            s.inputs,
            batch=(_as_int(b_set["batch"]), _as_int(c_set["batch"])),
            prompt_len=_as_int(b_set["prompt_len"]),
            output_lens=(_as_int(b_set["output_len"]), _as_int(c_set["output_len"])),
            kv_cache=(bool(b_set["kv_cache"]), bool(c_set["kv_cache"])),
            fit=fit,
            loads=loads,
            passes=PassCosts.from_dict(raw_passes) if isinstance(raw_passes, Mapping) else None,
            prompt_spec=str(study.args.get("prompt_len") or ""),
        )
        projection = None if made is None else dict(made)
        old = json_object((s.projection or {}).get("speculative"))
        new = None if projection is None else json_object(projection.get("speculative"))
        if new and old:
            new["after_run"] = old.get("after_run")
        effects = []
        for e in s.effects:
            key = METRICS.get(e.metric, (None, None))[1]
            proj = None if key is None else _ratio(projection, key)
            err = proj / e.change.ratio - 1.0 if proj is not None and e.change.ratio else None
            effects.append(replace(e, projected_ratio=proj, error=err))
        out.append(replace(s, projection=projection, effects=effects))
    return replace(study, settings=out)


def build_study(
    knob: str,
    values: Sequence[str],
    repeat: int,
    runs: Sequence[tuple[int, int, str, Mapping[str, JsonValue]]],
    *,
    batches: Sequence[int],
    prompt_len: int,
    output_len: int,
    kv_cache: Sequence[bool] | None = None,
    output_lens: Sequence[int] | None = None,
    args: Mapping[str, object] | None = None,
    created_at: str = "",
    quality: Sequence[ReadOnlyJson | None] | None = None,
    confidence: float = 0.95,
    primary: str = DEFAULT_PRIMARY,
    fit: OverheadFit | None = None,
    queueing: bool = True,
    passes: Sequence[PassCosts | None] | None = None,
) -> Study:
    """Assemble a :class:`Study` from its runs.

    Args:
        runs: ``(round, setting index, run path, summary)`` in the order they ran.
        batches: per setting, the batch the projection uses (sequences decoded together).
        prompt_len, output_len: the workload's tokens per request (projection, memory).
        kv_cache: per setting, whether it keeps a KV cache (default: all do).
        output_lens: per setting, output tokens per request when the knob changes them
            (``max-tokens``); default ``output_len`` for every setting.
        primary: the metric (a :data:`METRICS` key) whose verdict leads; the others are
            Holm-corrected. Effects are paired by round (each round is a block).
        fit: the fitted cost model of the baseline setting's steps (its runs only: the
            projection never learns from the runs it is checked against); None: the
            baseline's derating. Each setting's load (its run's ``load`` section) adds
            queueing to the projected TTFT (:func:`project_change`) unless ``queueing`` is
            false.
        passes: per setting, its kernel calls measured against the baseline's
            (:class:`~perfscope.analysis.overhead.PassCosts`; ``None``: nothing measured),
            added to its projected steps.
    """
    outs = list(output_lens) if output_lens is not None else [output_len] * len(values)
    kv = list(kv_cache) if kv_cache is not None else [True] * len(values)
    points: list[list[RunPoint]] = [[] for _ in values]
    summaries: list[list[Mapping[str, JsonValue]]] = [[] for _ in values]
    for order, (rnd, idx, path, summary) in enumerate(runs):
        points[idx].append(
            RunPoint(order, rnd, idx, str(path), run_metrics(summary), phase_points(summary))
        )
        summaries[idx].append(summary)
    notes: list[str] = []
    if repeat < 2:
        notes.append("one run per setting: run-to-run noise unknown, ratios only (use --repeat 6)")
    elif repeat < 6:
        notes.append(
            f"{repeat} rounds: too few to detect any change at 95% without assuming normal "
            "noise (6 rounds are the fewest); effects are ratios only"
        )
    notes.append(
        f"primary metric: {primary}; other metrics are corrected for multiplicity, effects "
        "are paired by round"
    )
    settings: list[SettingResult] = []
    load0 = Load.from_summary(summaries[0][0]) if queueing and summaries and summaries[0] else None
    for i, value in enumerate(values):
        first = summaries[i][0] if summaries[i] else {}
        loads = (load0, Load.from_summary(first) if queueing and first else None)
        model = json_object(first.get("model"))
        memory = (
            memory_need(ModelSpec.from_dict(dict(model)), batches[i], prompt_len + outs[i], kv[i])
            if model
            else {}
        )
        draft = json_object(json_at(first, "speculative").get("draft_model"))
        if draft and memory:
            extra = memory_need(
                ModelSpec.from_dict(dict(draft)), batches[i], prompt_len + output_len, kv[i]
            )
            memory = {name: memory[name] + extra[name] for name in memory}
            memory["draft_bytes"] = extra["total_bytes"]
        median = (
            {m: _median([p.metrics.get(m) for p in points[i]]) for m in points[i][0].metrics}
            if points[i]
            else {}
        )
        effects: list[Effect] = []
        projection: JsonObject | None = None
        if i > 0 and summaries[0] and summaries[i]:
            made, said = _project_setting(
                knob,
                (str(values[0]), str(value)),
                summaries[0][0],
                first,
                batch=(batches[0], batches[i]),
                prompt_len=prompt_len,
                output_lens=(outs[0], outs[i]),
                kv_cache=(kv[0], kv[i]),
                fit=fit,
                loads=loads,
                passes=passes[i] if passes is not None else None,
                prompt_spec=str((args or {}).get("prompt_len") or ""),
            )
            notes.extend(said)
            projection = None if made is None else dict(made)
            why = (
                oversubscribed_threads(values[0], value, summaries[0])
                if knob == "threads"
                else None
            )
            if projection is not None and why is not None:
                projection = {**projection, "ratios": dict(_NO_RATIOS), "note": why}
                notes.append(f"{knob}={value}: {why}")
            spec = None if projection is None else json_object(projection.get("speculative"))
            if spec:
                median_after = _after_run_median(
                    summaries[0], summaries[i], batches[i], prompt_len, output_len
                )
                spec["after_run"] = None if median_after is None else median_after.to_dict()
            by_round = [{p.round: p for p in points[0]}, {p.round: p for p in points[i]}]
            rounds = sorted(set(by_round[0]) & set(by_round[1]))
            fam = {
                metric: (
                    [by_round[0][r].metrics.get(metric) for r in rounds],
                    [by_round[1][r].metrics.get(metric) for r in rounds],
                    better,
                )
                for metric, (better, _) in METRICS.items()
            }
            second = [by_round[1][r].order > by_round[0][r].order for r in rounds]
            exp = judge_experiment(
                fam,
                primary if primary in fam else DEFAULT_PRIMARY,
                paired=True,
                confidence=confidence,
                ids=[f"round {r + 1}" for r in rounds],
                candidate_second=second,
            )
            judged = {c.metric: c for c in exp.changes}
            notes.extend(f"{knob}={value}: {n}" for n in exp.notes)
            for metric, (better, key) in METRICS.items():
                ch = judged[metric]
                proj = None if key is None else _ratio(projection, key)
                err = proj / ch.ratio - 1.0 if proj is not None and ch.ratio else None
                effects.append(Effect(metric, better, ch, proj, err))
        own_quality = None if quality is None else quality[i]
        settings.append(
            SettingResult(
                value=str(value),
                runs=points[i],
                median=median,
                memory=memory,
                effects=effects,
                projection=projection,
                quality=None if own_quality is None else dict(own_quality),
                inputs=projection_inputs(
                    first,
                    batch=batches[i],
                    prompt_len=prompt_len,
                    output_len=outs[i],
                    kv_cache=kv[i],
                    queueing=queueing,
                    fit=fit if i == 0 else None,
                )
                if first
                else None,
            )
        )
    return Study(
        knob=knob,
        values=[str(v) for v in values],
        repeat=repeat,
        settings=settings,
        order=[(r, i) for r, i, _, _ in runs],
        args=dict(args or {}),
        created_at=created_at,
        notes=notes,
        machine=machine_of_summary(summaries[0][0]) if summaries and summaries[0] else {},
    )
