"""The study record: assembled from a study's runs (the baseline runs' fitted cost model,
then :func:`~perfscope.analysis.study.build_study`), the options each setting stores, read
back, stored for others with its runs named by run id, and re-projected from its stored
runs with the current projection model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.api.study.knobs import Knob, KnobValue, _apply, _batch, _knob, _length, _values
from perfscope.errors import UsageError
from perfscope.jsontypes import JsonObject, ReadOnlyJson, json_object

if TYPE_CHECKING:
    from perfscope.analysis.overhead import OverheadFit, PassCosts
    from perfscope.analysis.study import Study
    from perfscope.api.run import RunArgs


def _args_record(a: RunArgs) -> JsonObject:
    """The options of a setting as its study stores them (``args``) and its ``quality`` hook
    is given: JSON, a value JSON cannot hold as its text, no API key."""
    out: dict[str, object] = {}
    for key in (
        "engine",
        "requests",
        "prompt_len",
        "output_len",
        "warmup",
        "seed",
        "mode",
        "rate",
        "concurrency",
        "batch_size",
        "scheduler",
        "dtype",
        "model_preset",
        "model_overrides",
        "slos",
    ):
        v = getattr(a, key)
        out[key] = dict(v) if isinstance(v, Mapping) else v if not callable(v) else repr(v)
    out["engine_options"] = {
        k: str(v) for k, v in a.engine_options.items() if k not in ("api_key",)
    }
    # The built-in dataset shapes the workload as much as its lengths do (a prefix cache
    # finds a shared system prompt, or a conversation's history): named when one was used.
    if a.dataset:
        out["dataset"] = a.dataset
        if a.dataset == "shared-prefix":
            out["prefix_len"] = a.prefix_len
        if a.dataset == "multi-turn":
            out["turns"] = a.turns
    record = json_object(json.loads(json.dumps(out, default=str)))
    assert record is not None  # a dict dumped is an object read back
    return record


def baseline_fit(run_paths: Sequence[str | Path]) -> tuple[OverheadFit | None, str]:
    """The fitted cost model (:func:`perfscope.analysis.overhead.fit_baseline`) of the steps
    of ``run_paths`` (a study's baseline runs, one device), and a note saying what it rests
    on; ``(None, why)`` when the runs cannot be read or have no engine steps, model or device
    to fit."""
    from perfscope.analysis.overhead import fit_baseline
    from perfscope.errors import PerfscopeError
    from perfscope.profiler.store import read_run

    runs = []
    for ref in run_paths:
        try:
            run = read_run(ref)
        except (OSError, PerfscopeError) as exc:
            return None, f"no fitted cost model: cannot read the baseline run {ref} ({exc})"
        summary = run.summary or {}
        runs.append((run.steps, summary.get("model"), (summary.get("hardware") or {}).get("spec")))
    return fit_baseline(runs)


def _assemble(
    base: RunArgs,
    k: Knob,
    parsed: Sequence[tuple[str, KnobValue]],
    repeat: int,
    runs: Sequence[tuple[int, int, str, Mapping[str, Any]]],
    *,
    created_at: str,
    quality: Sequence[ReadOnlyJson | None] | None = None,
    fitted: bool = True,
    queueing: bool = True,
    passes: Sequence[PassCosts | None] | None = None,
) -> Study:
    """The study record of runs made for ``parsed`` settings of ``k`` over ``base``: the
    baseline runs' fitted cost model, then :func:`~perfscope.analysis.study.build_study`
    (``passes``: per setting, its kernel calls measured against the baseline's)."""
    from perfscope.analysis.study import build_study
    from perfscope.api.run import plan

    settings = [_apply(base, k, v) for _, v in parsed]
    requests = plan(settings[0]).options.workload.requests or base.default_requests
    prompt_len, output_len = _length(base.prompt_len), _length(base.output_len or 128)
    # max_tokens replaces each request's output length (the openai engine sends it).
    output_lens = [
        int(s.engine_options["max_tokens"]) if s.engine_options.get("max_tokens") else output_len
        for s in settings
    ]
    fit, fit_note = (
        baseline_fit([path for _, i, path, _ in runs if i == 0])
        if fitted
        else (None, "projections from the baseline's derating (no fitted cost model)")
    )
    result = build_study(
        k.name,
        [t for t, _ in parsed],
        repeat,
        runs,
        batches=[_batch(s, requests, prompt_len + output_len) for s in settings],
        prompt_len=prompt_len,
        output_len=output_len,
        output_lens=output_lens,
        kv_cache=[s.engine_options.get("kv_cache", "on") != "off" for s in settings],
        args=_args_record(base),
        created_at=created_at,
        quality=None if quality is None else [None if q is None else dict(q) for q in quality],
        fit=fit,
        queueing=queueing,
        passes=passes,
    )
    return replace(result, notes=[*result.notes, fit_note])


def portable_study(study: Study, path: str | Path) -> Study:
    """``study`` as it is stored for others (``perfscope study --save``): each run named by
    its run id instead of its folder on this machine, and ``path`` (as given, relative to
    where it is read from) as the study's own path, so the record names no temporary
    folder. :func:`reproject_study` finds the runs by id in a runs folder."""
    settings = [
        replace(st, runs=[replace(r, run=Path(r.run).name) for r in st.runs])
        for st in study.settings
    ]
    return replace(study, settings=settings, path=str(path))


def reproject_study(
    study: Study | str | Path,
    runs_dir: str | Path | None = None,
    *,
    fitted: bool = True,
    queueing: bool = True,
) -> Study:
    """The study rebuilt from its stored runs with the current projection model: the same
    measured runs (read back from ``runs_dir``, default the runs root, by run id), the
    effects judged again and the projections made again (to compare projection models on
    one set of measurements). ``fitted=False``: the baseline's derating instead of its
    fitted cost model; ``queueing=False``: no wait for a slot in the projected TTFT (the
    model before either). Kernel calls the study measured (its settings' ``passes``) are
    used as stored. The record is returned, not written.

    Raises:
        perfscope.errors.UsageError: the study cannot be read, or a run of it is missing.
    """
    from perfscope.api.run import RunArgs
    from perfscope.errors import PerfscopeError
    from perfscope.profiler.store import default_runs_root, read_run, resolve_run_path

    s = study if not isinstance(study, str | Path) else load_study(study)
    k = _knob(s.knob)
    fields = {
        key: v
        for key, v in s.args.items()
        if key not in ("engine_options", "model_overrides", "slos") and v is not None
    }
    base = RunArgs(
        **fields,
        model_overrides=s.args.get("model_overrides") or None,
        slos=s.args.get("slos") or None,
        engine_options=dict(s.args.get("engine_options") or {}),
    )
    parsed = _values(k, s.values)
    root = Path(runs_dir) if runs_dir is not None else default_runs_root()
    order = sorted((p for st in s.settings for p in st.runs), key=lambda p: p.order)
    runs: list[tuple[int, int, str, Mapping[str, Any]]] = []
    for p in order:
        ref = Path(p.run)
        try:
            path = resolve_run_path(ref.name, root)
            summary = read_run(path, tables=False).summary or {}
        except (OSError, PerfscopeError) as exc:
            raise UsageError(
                f"cannot re-project {s.knob}: run {ref.name} is not in {root} ({exc}); "
                "pass the runs folder the study ran in"
            ) from None
        runs.append((p.round, p.setting, str(path), summary))
    result = _assemble(
        base,
        k,
        parsed,
        s.repeat,
        runs,
        created_at=s.created_at,
        quality=[st.quality for st in s.settings] if any(st.quality for st in s.settings) else None,
        fitted=fitted,
        queueing=queueing,
        passes=[_stored_passes(st.projection) for st in s.settings],
    )
    # what the runs were, not what they project: how the rounds stopped stays
    kept = [
        n
        for n in s.notes
        if n.startswith(("adaptive rounds", "1-minute load average", "OpenMP wait policy"))
    ]
    return replace(result, notes=[*result.notes, *kept])


def _stored_passes(projection: Mapping[str, Any] | None) -> PassCosts | None:
    """The measured kernel calls a stored setting's projection used, if any."""
    from perfscope.analysis.overhead import PassCosts

    raw = (projection or {}).get("passes")
    return PassCosts.from_dict(raw) if isinstance(raw, Mapping) else None


def load_study(path: str | Path) -> Study:
    """Read a stored study JSON back into a :class:`~perfscope.analysis.study.Study`."""
    from perfscope.analysis.study import read_study

    try:
        return read_study(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read study {path}: {exc}") from exc


def save_study(study: Study, folder: str | Path) -> Path:
    """Store a copy of ``study`` in ``folder`` (where ``perfscope advisor calibrate`` reads
    stored studies), its runs named by run id (:func:`portable_study`); returns its path.

    Raises:
        UsageError: the folder cannot be written (the study stays in ``study.path``).
    """
    from perfscope.errors import StorageError
    from perfscope.profiler.store import write_json_atomic

    where = Path(folder)
    name = Path(study.path).name if study.path else f"{study.created_at}-{study.knob}.json"
    target = where / name
    try:
        where.mkdir(parents=True, exist_ok=True)
        # run ids, not this machine's run folders; the copy's own path as given
        write_json_atomic(target, portable_study(study, target).to_dict())
    except (OSError, StorageError) as exc:
        raise UsageError(
            f"cannot store the study in {where} ({exc}); it is in {study.path}"
        ) from None
    return target
