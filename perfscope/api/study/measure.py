"""Measuring a study's settings (:func:`study_with`): the runs in balanced rounds, adaptive
to a precision target, and what is measured beside them: each candidate's kernel calls
timed against the baseline's before any run (:func:`measure_setting_passes`), the widest
primary-metric interval so far (:func:`primary_half_width`), the OpenMP wait policy of the
runs and the machine's load average.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.api.study.knobs import (
    _DTYPE_ALIASES,
    _KV_DTYPE_ALIASES,
    _apply,
    _batch,
    _check_applies,
    _check_engine,
    _knob,
    _length,
    _values,
)
from perfscope.api.study.record import _args_record, _assemble
from perfscope.errors import UsageError
from perfscope.jsontypes import JsonObject, ReadOnlyJson

if TYPE_CHECKING:
    from perfscope.analysis.overhead import PassCosts
    from perfscope.analysis.study import Study
    from perfscope.api.run import RunArgs


def _pass_setting(a: RunArgs) -> Any:
    """The options of a reference-engine setting that change a timed kernel pass."""
    from perfscope.profiler.engines.reference.model import parse_sparsity
    from perfscope.profiler.engines.reference.passes import PassSetting

    opts = {k: str(v) for k, v in (a.engine_options or {}).items()}
    kv = opts.get("kv_dtype") or opts.get("kv_cache_dtype") or "auto"
    kv = _KV_DTYPE_ALIASES.get(kv.strip().lower(), kv.strip().lower())
    block = opts.get("kv_block_tokens", "16").strip()
    return PassSetting(
        dtype=_DTYPE_ALIASES.get(a.dtype or "float32", a.dtype or "float32"),
        quant=opts.get("quant", "none").strip().lower(),
        sparsity=parse_sparsity(opts.get("sparsity", "none")).label,
        kv_dtype=kv,
        kv_paged=opts.get("kv_paged", "off").strip().lower() == "on",
        kv_block_tokens=int(block) if block.isdigit() and int(block) > 0 else 16,
    )


def measure_setting_passes(
    settings: Sequence[RunArgs], requests: int, prompt_len: int, output_len: int
) -> list[PassCosts | None]:
    """Per setting, its kernel calls timed against the first setting's on this machine
    (:func:`perfscope.profiler.engines.reference.passes.measure_passes`) as
    :class:`~perfscope.analysis.overhead.PassCosts`: only for reference-engine settings on
    the CPU whose dtype, weight quantisation, sparsity, KV dtype or KV layout differs from the
    baseline's, or whose batch does (the baseline model's decode step is then timed alone
    at both batches: the cost of a row); ``None`` otherwise. Timed at the study's threads,
    at the rows of one decode step and of one prefill, and at a short and the longest
    cache span of a decode step."""
    from perfscope.analysis.overhead import PassCosts

    out: list[PassCosts | None] = [None] * len(settings)
    base = settings[0]
    if base.engine != "reference" or (base.device or "cpu") != "cpu":
        return out
    import torch

    from perfscope.profiler.engines.reference.model import PRESETS
    from perfscope.profiler.engines.reference.passes import measure_passes

    preset = PRESETS.get(base.model_preset or "small")
    if preset is None:
        return out
    ref = _pass_setting(base)
    before = torch.get_num_threads()
    try:
        threads = base.engine_options.get("threads")
        if threads is not None and str(threads).isdigit():
            torch.set_num_threads(int(threads))
        b0 = _batch(base, requests, prompt_len + output_len)
        for i, s in enumerate(settings[1:], start=1):
            cand = _pass_setting(s)
            b = _batch(s, requests, prompt_len + output_len)
            if cand == ref and b == b0:
                continue
            cfg = preset.with_overrides(**dict(s.model_overrides or {}))
            rows = sorted({1, b, b * prompt_len})
            spans = sorted({(b, max(prompt_len // 4, 1)), (b, prompt_len + output_len)})
            writes = sorted({(b, 1), (b, prompt_len)})
            span = prompt_len + max(output_len // 2, 1)
            t = measure_passes(
                cfg,
                ref,
                cand,
                rows=rows,
                spans=spans,
                writes=writes,
                decode=(b0, span),
                prefill=(b0, prompt_len),
                more_rows=b if b != b0 else 0,
            )
            out[i] = PassCosts.from_points(
                rows=t.rows,
                linears_s=t.linears_s,
                head_s=t.head_s,
                kv_elements=t.kv_elements,
                kv_read_s=t.kv_read_s,
                write_rows=t.write_rows,
                kv_write_s=t.kv_write_s,
                decode=(float(t.decode[0]), float(t.decode[1])),
                isolated_decode_s=t.decode_s,
                prefill=(float(t.prefill[0]), float(t.prefill[1])),
                isolated_prefill_s=t.prefill_s,
                more_rows=(float(t.more_rows), t.more_rows_s),
                source=(
                    f"{t.rounds} interleaved rounds at {', '.join(map(str, t.rows))} rows, "
                    f"cache spans {', '.join(str(sp) for _, sp in spans)} and writes of "
                    f"{', '.join(map(str, t.write_rows))} tokens, load {t.load:.1f}, "
                    f"{t.threads} thread(s); the baseline's decode step alone "
                    f"{t.decode_s * 1e3:.3g} ms at {b0} rows"
                    + (f", {t.more_rows_s * 1e3:.3g} ms at {t.more_rows}" if t.more_rows else "")
                    + f", its prefill {t.prefill_s * 1e3:.3g} ms"
                ),
            )
    finally:
        torch.set_num_threads(before)
    return out


def study_with(
    base: RunArgs,
    knob: str,
    values: Sequence[object] | str,
    *,
    repeat: int = 3,
    name: str | None = None,
    log: Callable[[str], None] | None = None,
    quality: Callable[[JsonObject], ReadOnlyJson | None] | None = None,
    precision: float | None = None,
    max_repeats: int = 20,
    budget_s: float | None = None,
) -> Study:
    """:func:`study` from a :class:`RunArgs` record of the fixed options.

    With ``precision`` (0.1: ±10%) the rounds are adaptive, as ``run --repeat --precision``
    is: at least ``repeat`` (and :data:`~perfscope.analysis.experiment.MIN_BLOCKS` before
    the target can stop them), then one more round until every candidate's primary-metric
    interval (paired by round) is within ``±precision``, ``max_repeats`` rounds are run, or
    a round past ``repeat`` would end beyond ``budget_s`` wall seconds after the first
    round (which trains or compiles what the others reuse; judged from the rounds so far);
    a note says which.
    """
    from perfscope.api.run import _whole, execute, plan
    from perfscope.profiler.store import default_runs_root, write_json_atomic

    say = log or (lambda line: None)
    k = _knob(knob)
    _check_applies(k, base.engine)
    parsed = _values(k, values)
    repeat = _whole(repeat, "repeat", 1)
    label = name or f"study-{k.name}"
    settings = [_apply(base, k, v) for _, v in parsed]
    plans = [
        plan(replace(s, name=f"{label}-{t}")) for s, (t, _) in zip(settings, parsed, strict=True)
    ]
    for s in settings:  # reference-engine options and shapes are checked here, not mid-study
        _check_engine(s)
    # The candidates' kernel calls are timed before any run: the projection's inputs
    # precede the measurement it is checked against.
    passes = measure_setting_passes(
        settings,
        plan(settings[0]).options.workload.requests or base.default_requests,
        _length(base.prompt_len),
        _length(base.output_len or 128),
    )
    from perfscope.analysis.experiment import MIN_BLOCKS, block_order

    runs: list[tuple[int, int, str, Mapping[str, Any]]] = []
    waits: set[str | None] = set()  # OMP_WAIT_POLICY of runs with several torch threads
    if precision is not None and not precision > 0:
        raise UsageError(f"precision must be positive (0.1 = ±10%), got {precision}")
    if budget_s is not None and not budget_s > 0:
        raise UsageError(f"budget must be positive seconds, got {budget_s}")
    most = max(repeat, _whole(max_repeats, "max_repeats", 1)) if precision else repeat
    # Balanced order: each round is a block (ABBA for two settings, a seeded random
    # permutation per round for more), so position effects cancel in the paired effects.
    order = block_order(len(plans), most, sum(map(ord, label)))
    started = first_done = time.monotonic()
    load_before = _load_average()
    stop = ""
    rounds = 0
    for rnd in range(most):
        if rnd == 1:
            first_done = time.monotonic()
        if precision is not None and budget_s is not None and rnd >= repeat:
            # The first round (training, compiling what later rounds reuse) is not counted.
            now = time.monotonic()
            elapsed = now - first_done
            per_round = elapsed / (rnd - 1) if rnd > 1 else first_done - started
            if elapsed + per_round > budget_s:
                stop = f"stopped by the budget of {budget_s:g} s after {rnd} rounds"
                break
        rounds = rnd + 1
        for i in order[rnd]:
            p = plans[i]
            say(f"study: round {rnd + 1}/{most}, {k.name}={parsed[i][0]} ...")
            out = execute(p)
            if out.status != "complete":
                raise UsageError(
                    f"the run for {k.name}={parsed[i][0]} {out.status}: {out.error} "
                    f"(captured data is in {out.path})"
                )
            runs.append((rnd, i, str(out.path), out.summary.to_dict()))
            if out.stored is not None:
                waits |= _spinning_policy(out.stored.manifest)
        if precision is None:
            continue
        half = primary_half_width(runs, len(plans))
        say(
            f"study: after {rounds} rounds the widest primary interval is "
            + ("unknown" if half is None else f"±{100 * half:.1f}%")
            + f" (target ±{100 * precision:g}%)"
        )
        # Stop only after whole AB/BA pairs, so a position effect stays cancelled.
        enough = rounds >= max(repeat, MIN_BLOCKS) and (len(plans) != 2 or rounds % 2 == 0)
        if enough and half is not None and half <= precision:
            stop = (
                f"reached ±{100 * half:.1f}% (target ±{100 * precision:g}%) after {rounds} rounds"
            )
            break
    else:
        if precision is not None:
            stop = f"stopped at {most} rounds (max_repeats) before reaching ±{100 * precision:g}%"
    if precision is not None:
        half = primary_half_width(runs, len(plans))
        reached = "unknown" if half is None else f"±{100 * half:.1f}%"
        stop = (
            f"adaptive rounds: {stop}; widest primary-metric interval {reached} "
            f"(target ±{100 * precision:g}%)"
        )
    stamp = datetime.now(UTC)
    quality_rows = [quality(_args_record(s)) for s in settings] if quality is not None else None
    result = _assemble(
        base,
        k,
        parsed,
        rounds,
        runs,
        created_at=stamp.isoformat(timespec="seconds"),
        quality=quality_rows,
        passes=passes,
    )
    if stop:
        result = replace(result, notes=[*result.notes, stop])
    if waits:
        result = replace(result, notes=[*result.notes, _wait_note(waits)])
    load_after = _load_average()
    if load_before is not None and load_after is not None:
        result = replace(
            result,
            notes=[
                *result.notes,
                f"1-minute load average {load_before:.1f} at the first round, "
                f"{load_after:.1f} after the last ({os.cpu_count()} CPUs)",
            ],
        )
    root = Path(base.runs_dir) if base.runs_dir is not None else default_runs_root()
    path = root / "studies" / f"{stamp.strftime('%Y%m%d-%H%M%S')}-{label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    result = replace(result, path=str(path))
    write_json_atomic(path, result.to_dict())
    return result


def _spinning_policy(manifest: Mapping[str, Any]) -> set[str | None]:
    """``{OMP_WAIT_POLICY}`` of a run whose torch engine ran several threads (``{None}``:
    unset, the threads spin); empty for one thread or an engine without torch threads."""
    from perfscope.analysis.manifest import manifest_view

    cfg = manifest_view(manifest).engine.config
    return {cfg.omp_wait_policy} if cfg.several_torch_threads else set()


def _wait_note(waits: set[str | None]) -> str:
    """The study's note on how its multi-threaded runs' OpenMP threads waited."""
    said = ", ".join(sorted("unset (spinning)" if w is None else w for w in waits))
    note = f"OpenMP wait policy of the runs with several torch threads: {said}"
    if None in waits:
        note += (
            "; spinning threads measure the machine's other load more than the engine on a "
            "busy machine (docs/performance.md)"
        )
    return note


def _load_average() -> float | None:
    """The 1-minute load average (``None`` where the system has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def primary_half_width(
    runs: Sequence[tuple[int, int, str, Mapping[str, Any]]], settings: int
) -> float | None:
    """The widest half-width (fraction: 0.1 = ±10%) of the primary metric's interval of any
    candidate against the first setting, paired by round, from ``(round, setting index, run
    path, summary)`` rows; ``None`` while some candidate has no interval yet."""
    from perfscope.analysis.experiment import judge_metric
    from perfscope.analysis.study import DEFAULT_PRIMARY, METRICS, run_metrics

    better = METRICS[DEFAULT_PRIMARY][0]
    values: list[dict[int, float | None]] = [{} for _ in range(settings)]
    for rnd, i, _, summary in runs:
        values[i][rnd] = run_metrics(summary).get(DEFAULT_PRIMARY)
    widest: float | None = None
    for i in range(1, settings):
        common = sorted(set(values[0]) & set(values[i]))
        if len(common) < 2:
            return None
        ch = judge_metric(
            [values[0][r] for r in common], [values[i][r] for r in common], better, paired=True
        )
        if ch.noise is None:
            return None
        widest = ch.noise if widest is None else max(widest, ch.noise)
    return widest
