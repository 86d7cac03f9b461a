"""``perfscope.study()``: vary one knob, everything else fixed, runs interleaved with repeats.

Each knob is named as its ``perfscope run`` flag (``batch-size``, ``kv-heads``, ``dtype``,
...) and maps one value onto the :class:`perfscope.api.run.RunArgs` of a run (a field, a
model-shape override or a reference-engine option). The settings run in rounds, each
round a block in balanced order (AB BA AB ... for two, a seeded permutation per round for
more), so slow drifts and position effects of a shared machine hit every setting alike;
:func:`perfscope.analysis.study.build_study` turns the runs into the study record, which
is written to ``<runs dir>/studies/<stamp>-<name>.json`` (schema ``perfscope.study/1``).

The package holds one concern a module: the knob catalogue (:mod:`.knobs`), measuring the
settings (:mod:`.measure`) and the study record, stored and re-projected (:mod:`.record`);
the entry points (:func:`study`, :func:`study_quality`) are here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.api.study.knobs import APPLIES as APPLIES
from perfscope.api.study.knobs import KNOBS as KNOBS
from perfscope.api.study.knobs import Knob as Knob
from perfscope.api.study.knobs import _apply as _apply
from perfscope.api.study.knobs import _batch as _batch
from perfscope.api.study.knobs import _check_applies as _check_applies
from perfscope.api.study.knobs import _check_engine
from perfscope.api.study.knobs import _knob as _knob
from perfscope.api.study.knobs import _values as _values
from perfscope.api.study.knobs import engine_family as engine_family
from perfscope.api.study.knobs import knobs_for as knobs_for
from perfscope.api.study.knobs import kv_capacity as kv_capacity
from perfscope.api.study.measure import measure_setting_passes as measure_setting_passes
from perfscope.api.study.measure import study_with as study_with
from perfscope.api.study.record import _args_record
from perfscope.api.study.record import baseline_fit as baseline_fit
from perfscope.api.study.record import load_study as load_study
from perfscope.api.study.record import portable_study as portable_study
from perfscope.api.study.record import reproject_study as reproject_study
from perfscope.api.study.record import save_study as save_study
from perfscope.errors import UsageError
from perfscope.jsontypes import JsonObject, ReadOnlyJson

if TYPE_CHECKING:
    from perfscope.analysis.study import Study
    from perfscope.api.run import RunArgs

__all__ = [
    "APPLIES",
    "KNOBS",
    "Knob",
    "baseline_fit",
    "engine_family",
    "knobs_for",
    "load_study",
    "measure_setting_passes",
    "portable_study",
    "reproject_study",
    "save_study",
    "study",
    "study_quality",
    "study_with",
]


def study(
    knob: str,
    values: Sequence[object] | str,
    *,
    engine: Any = "reference",
    repeat: int = 3,
    requests: int | None = 16,
    warmup: int = 2,
    slos: Mapping[str, float | str] | None = None,
    runs_dir: str | Path | None = None,
    name: str | None = None,
    log: Callable[[str], None] | None = None,
    quality: Callable[[JsonObject], ReadOnlyJson | None] | None = None,
    precision: float | None = None,
    max_repeats: int = 20,
    budget_s: float | None = None,
    **options: Any,
) -> Study:
    """Vary one knob with everything else fixed; measure each setting next to what the
    what-if model projected for it.

    ::

        s = perfscope.study("kv-heads", [8, 2, 1], model_preset="small", repeat=3)
        for setting in s.settings:
            print(setting.value, setting.median["tpot_p50_s"], setting.memory["total_bytes"])
        print(s.effect("1", "tpot_p50_s"))   # measured ratio, interval, projection, error

    Args:
        knob: a run flag name (see :data:`KNOBS`): ``batch-size``, ``scheduler``,
            ``dtype``, ``concurrency``, ``rate``, ``model-preset``, ``kv-heads``,
            ``heads``, ``layers``, ``threads``, ``kv-cache``, ``quant``, ``attention``,
            ``compile``, ``kv-dtype``, ``sparsity`` ...
        values: the settings, the first being the baseline (a list or ``"A,B,C"``).
        engine: as in :func:`perfscope.run`.
        repeat: runs per setting (interleaved); 1 gives ratios without intervals.
        requests: measured requests per run (16).
        warmup: warmup requests per run, excluded from the statistics (2).
        slos: per-request limits for goodput, as in :func:`perfscope.run`.
        runs_dir: root of the runs and of ``studies/``.
        name: name of the runs and of the study file (default ``study-KNOB``).
        log: receives one line per run.
        quality: called once per setting with its options (``model_preset``, ``dtype``,
            ``model_overrides``, ``engine_options`` ...); what it returns (e.g. top-1
            agreement with the baseline model) is stored as the setting's ``quality``.
        precision: adaptive rounds (0.1: until every primary-metric interval is within
            ±10%), at least ``repeat``, at most ``max_repeats`` rounds and ``budget_s`` wall
            seconds (:func:`study_with`).
        **options: any other keyword of :func:`perfscope.run` (held fixed).

    Returns:
        The :class:`perfscope.analysis.study.Study`, also stored as JSON at ``.path``.

    Raises:
        perfscope.errors.UsageError: an unknown knob or value, bad options, or a run that
            did not complete (its captured data is kept).
    """
    base = _base_args(engine, requests, warmup, slos, runs_dir, options)
    return study_with(
        base,
        knob,
        values,
        repeat=repeat,
        name=name,
        log=log,
        quality=quality,
        precision=precision,
        max_repeats=max_repeats,
        budget_s=budget_s,
    )


def _base_args(
    engine: Any,
    requests: int | None,
    warmup: int,
    slos: Mapping[str, float | str] | None,
    runs_dir: str | Path | None,
    options: Mapping[str, Any],
) -> RunArgs:
    """The fixed options of a study as :func:`study` takes them, as a :class:`RunArgs`."""
    from perfscope.api.run import _RUN_ARG_NAMES, RunArgs

    if k := {"knob", "values"} & set(options):
        raise UsageError(f"study() takes {', '.join(sorted(k))} once")
    run_fields = {k: v for k, v in options.items() if k in _RUN_ARG_NAMES}
    extra = {k: v for k, v in options.items() if k not in _RUN_ARG_NAMES}
    return RunArgs(
        engine=engine,
        requests=requests,
        warmup=warmup,
        slos=slos,
        runs_dir=runs_dir,
        engine_options=extra,
        **run_fields,
    )


def study_quality(
    knob: str,
    values: Sequence[object] | str,
    *,
    quality: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None = None,
    engine: Any = "reference",
    **options: Any,
) -> list[tuple[str, Mapping[str, Any], Mapping[str, Any] | None]]:
    """Only the ``quality`` hook of :func:`study`, with no run: each setting's label, the
    options record the hook is given (what :func:`study` would pass it) and what it
    returned, in setting order (the first is the baseline).

    Quality does not depend on how fast a setting runs, so a write-up can take it from a
    model with trained weights while its speed comes from a study with random ones::

        rows = perfscope.study_quality("quant", "none,int8", model_preset="tiny",
                                       weights="trained")
        for label, _, q in rows:
            print(label, q["top1_agreement"], q["candidate_perplexity"])

    Args:
        quality: the hook (default: the reference engine's,
            :func:`perfscope.profiler.engines.reference.quality.reference_quality`: top-1
            agreement and perplexities against the first setting's model).
        **options: as in :func:`study` (only what builds the model matters).

    Raises:
        perfscope.errors.UsageError: an unknown knob or value, or options the engine
            refuses (checked as :func:`study` checks them).
    """
    base = _base_args(engine, None, 0, None, None, options)
    k = _knob(knob)
    _check_applies(k, base.engine)
    parsed = _values(k, values)
    settings = [_apply(base, k, v) for _, v in parsed]
    for s in settings:
        _check_engine(s)
    if quality is None:
        from perfscope.profiler.engines.reference.quality import reference_quality

        quality = reference_quality()
    out: list[tuple[str, Mapping[str, Any], Mapping[str, Any] | None]] = []
    for (label, _), s in zip(parsed, settings, strict=True):
        record = _args_record(s)
        out.append((label, record, quality(record)))
    return out
