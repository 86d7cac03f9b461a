"""A study: one knob varied with everything else fixed, measured next to its projection.

The record (:class:`Study`, JSON schema ``perfscope.study/1``) holds, per setting of the knob,
the per-run metrics of its repeats (runs interleaved A B C A B C ..., the order recorded), the
memory the setting needs by the cost model (weights + KV cache), the roofline point and
verdict per phase, and, for every setting after the first, the measured effect against the
first setting with its between-run interval next to the what-if projection of the same
change (:func:`perfscope.analysis.whatif.predict`) and that projection's error.

The projection is made as the advisor makes it: the *baseline* run's own derating
(:func:`~perfscope.analysis.whatif.run_derating`: its per-phase efficiency, or its per-step
overhead when a phase is overhead-bound) applied to the candidate's model shape, dtypes and
batch on the same device. A knob the cost model does not see (threads, the attention kernel,
``torch.compile``, the scheduler) projects no change, and the record says so. Two
scheduling knobs are projected apart (:func:`_scheduling_projection`, with a study note):
``prefix-cache`` from each setting's measured cached prompt tokens (the prefill's work scales
by the uncached share), ``max-batched-tokens`` not at all (no ratio, never 1.0x) with the
disaggregation what-if of the baseline next to it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache, partial
from pathlib import Path
from typing import Any

from perfscope.analysis.calibration import machine_of_summary
from perfscope.analysis.costmodel import (
    kv_bytes_per_token,
    medusa_head_cost,
    step_costs,
    weight_bytes,
)
from perfscope.analysis.experiment import (
    MIN_BLOCKS,
    SetChange,
    fewest_for_interval,
    judge_experiment,
    judge_metric,
)
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.overhead import (
    OverheadFit,
    PassCosts,
    fitted_times,
    quantisation_bytes,
    roof_times,
)
from perfscope.analysis.queueing import Load, LoadTimes, simulate
from perfscope.analysis.summary import Projection, Roofline
from perfscope.analysis.whatif import (
    ASSUMED_ACCEPTANCE,
    Derating,
    expected_tokens_per_step,
    predict,
    predict_derated,
    run_derating,
    speculative_speedup,
)
from perfscope.jsontypes import JsonArray, JsonObject, json_float, json_object

__all__ = [
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
    "memory_need",
    "phase_points",
    "project_change",
    "projection_inputs",
    "read_study",
    "rederive_study",
    "run_metrics",
    "speculative_projection",
]

SCHEMA = "perfscope.study/1"

#: Metrics compared per setting: name → (direction that is better, projection key or None).
METRICS: dict[str, tuple[str, str | None]] = {
    "ttft_p50_s": ("lower", "ttft_s"),
    "tpot_p50_s": ("lower", "tpot_s"),
    "output_tok_s": ("higher", "throughput_tok_s"),
    "goodput_req_s": ("higher", None),
    "j_per_output_token": ("lower", None),
}


# --------------------------------------------------------------------------- between runs


#: The primary metric of a study's effects when none is named: its verdict leads, the
#: others are corrected for multiplicity (``docs/experiments.md``).
DEFAULT_PRIMARY = "tpot_p50_s"


def between(
    baseline: Sequence[float | None],
    candidate: Sequence[float | None],
    better: str | None,
    confidence: float = 0.95,
    *,
    paired: bool = False,
) -> SetChange:
    """The between-run change of one metric (per-run values, SI units), by the rule every
    comparison uses (:func:`perfscope.analysis.experiment.judge_metric`): paired by round
    when ``paired``, else unpaired."""
    if paired:
        return judge_metric(baseline, candidate, better, paired=True, confidence=confidence)
    a = [float(v) for v in baseline if v is not None and math.isfinite(float(v))]
    b = [float(v) for v in candidate if v is not None and math.isfinite(float(v))]
    return judge_metric(a, b, better, confidence=confidence)


def detectable_cell(change: SetChange, repeat: int) -> str:
    """The smallest change an effect's rounds could detect, as a table cell: ``±7%``;
    ``none (3 rounds; 6+ detect)`` when too few rounds detect any; ``noise unknown`` with
    one run per setting; ``n/a`` when a value is missing."""
    if change.ratio is None:
        return "n/a"
    if repeat < 2:
        return "noise unknown"
    if change.detectable is None:
        level = change.verdict_level
        need = (
            fewest_for_interval(level, paired=change.paired) if level is not None else None
        ) or MIN_BLOCKS
        return f"none ({min(change.n) or repeat} rounds; {need}+ detect)"
    return f"±{100 * change.detectable:.0f}%"


# --------------------------------------------------------------------------- per run


@dataclass(frozen=True)
class PhasePoint:
    """One phase of one run on the roofline: MFU and MBU (fractions), intensity
    (FLOP/byte), achieved FLOP/s, the verdict (``compute-bound`` ...)."""

    phase: str
    mfu: float | None
    mbu: float | None
    intensity: float | None
    achieved_flops_s: float | None
    verdict: str | None
    time_per_step_s: float | None


def phase_points(summary: Mapping[str, Any]) -> dict[str, PhasePoint]:
    """The roofline phases of a run summary."""
    roof = summary.get("roofline") or {}
    out: dict[str, PhasePoint] = {}
    for name, ph in (roof.get("phases") or {}).items():
        out[name] = PhasePoint(
            phase=name,
            mfu=ph.get("mfu"),
            mbu=ph.get("mbu"),
            intensity=ph.get("intensity"),
            achieved_flops_s=ph.get("achieved_flops_s"),
            verdict=ph.get("verdict"),
            time_per_step_s=ph.get("time_per_step_s"),
        )
    return out


def run_metrics(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """The compared metrics of one run summary (seconds, tokens/s, requests/s, J/token)."""
    lat = summary.get("latency") or {}
    thr = summary.get("throughput") or {}
    good = summary.get("goodput") or {}
    energy = summary.get("energy") or {}

    def p50(name: str, q: str = "p50") -> float | None:
        v = (lat.get(name) or {}).get(q)
        return None if v is None else float(v)

    cache = summary.get("prompt_cache") or {}
    roof_lat = (summary.get("roofline") or {}).get("latency") or {}
    return {
        "ttft_p50_s": p50("ttft"),
        "tpot_p50_s": p50("tpot"),
        "e2e_p50_s": p50("e2e"),
        "output_tok_s": thr.get("output_tok_s"),
        # Without SLOs every completed request counts as good: no goodput was measured.
        "goodput_req_s": good.get("goodput_req_s") if good.get("slos") else None,
        "attainment": good.get("attainment") if good.get("slos") else None,
        "j_per_output_token": energy.get("j_per_output_token"),
        "itl_p99_s": p50("itl", "p99"),
        "prompt_cache_share": cache.get("share"),
        "prompt_cache_hit_rate": cache.get("hit_rate"),
        "decode_stall_share": roof_lat.get("decode_stall_share"),
    }


@dataclass(frozen=True)
class RunPoint:
    """One run of a study: where it sits in the interleaved order and what it measured."""

    order: int
    round: int
    setting: int
    run: str
    metrics: dict[str, float | None]
    phases: dict[str, PhasePoint]


# --------------------------------------------------------------------------- cost model


def memory_need(
    model: ModelSpec, batch: int, seq_tokens: int, kv_cache: bool = True
) -> dict[str, float]:
    """Bytes a setting needs by the cost model: weights, and the KV cache of ``batch``
    sequences of ``seq_tokens`` tokens (0 when the KV cache is off); a state-space model's
    recurrent state (constant in context) per sequence instead."""
    w = float(weight_bytes(model))
    kv = float(kv_bytes_per_token(model)) * batch * seq_tokens if kv_cache else 0.0
    if kv_cache and seq_tokens > 0:
        kv += batch * model.state_bytes_per_seq
    return {"weights_bytes": w, "kv_cache_bytes": kv, "total_bytes": w + kv}


def _recompute_tpot(
    model: ModelSpec,
    summary: Mapping[str, Any],
    batch: int,
    prompt_len: int,
    output_len: int,
    derated: bool = True,
    fit: OverheadFit | None = None,
) -> float | None:
    """Projected time per output token without a KV cache: each decode step is a prefill
    of the whole sequence so far, timed as the baseline's prefill was derated (or by the
    fitted cost model ``fit``: its roofline scale and the host terms of the step's shape)."""
    import numpy as np

    from perfscope.hwdb.spec import DeviceSpec

    spec = (summary.get("hardware") or {}).get("spec")
    if not spec:
        return None
    dev = DeviceSpec.from_dict(spec)
    steps = max(output_len - 1, 1)
    if fit is not None and derated:
        ctx = prompt_len + np.arange(steps, dtype=np.float64) + 1
        b = np.full(steps, float(batch))
        roof = roof_times(model, dev, b, b * ctx, np.zeros(steps))
        base = roof_times(model, dev, b, b, b * ctx)
        t = fit.prefill_step_time(roof, float(model.n_layers), b, b * ctx, base)
        return float(np.mean(t))
    peak = dev.peak_flops_for(model.act_dtype) or 0.0
    bw = dev.mem_bw_bytes_s
    derate = run_derating(Roofline.from_dict(summary.get("roofline"))) if derated else Derating()
    eff = derate.prefill_efficiency if derate.prefill_efficiency is not None else 1.0
    over = derate.prefill_overhead_s if derate.prefill_overhead_s is not None else 0.0
    total = 0.0
    for i in range(steps):
        ctx_i = prompt_len + i + 1
        c = step_costs(model, batch, batch * ctx_i, 0)
        f = float(np.asarray(c["flops"]))
        nb = float(
            np.asarray(
                c["bytes_weights"]
                + c["bytes_activations"]
                + c["bytes_kv_read"]
                + c["bytes_kv_write"]
            )
        )
        total += max(f / peak if peak else 0.0, nb / bw) / eff + over
    return total / steps


def _times(
    model: ModelSpec,
    dev: Any,
    derate: Derating,
    fit: OverheadFit | None,
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
    cached: int,
    quant: str = "none",
    passes: PassCosts | None = None,
    baseline_model: ModelSpec | None = None,
) -> tuple[Projection, Projection]:
    """(projected, speed of light) :class:`~perfscope.analysis.summary.Projection` records of
    one setting's batch: projected by the fitted cost model when there is one (the speed of
    light's record with the fitted times in place: its phases keep the roofline's work and
    bound, ``overhead_s`` holds the fitted host time), else by the baseline's derating.

    ``quant`` (the reference engine's ``quant`` option): the fitted projection prices the
    bytes its linears move beyond the weights (:func:`~perfscope.analysis.overhead.
    quantisation_bytes`: int8's dynamic re-quantisation of every input, per token; int8-wo's
    dequantised copy of every weight, per step). ``passes``: the setting's kernel calls as
    measured against the baseline's (:class:`~perfscope.analysis.overhead.PassCosts`); they
    replace the priced bytes of ``quant``, which they include, and the fitted steps are then
    the baseline's work (``baseline_model``) plus those calls' difference: the candidate's
    narrower weights, sparse non-zeros or smaller cache are what the measured calls ran, so
    pricing them again by the roofline would count them twice. The speed of light stays the
    candidate's own roofline."""
    shape: Mapping[str, Any] = {
        "batch": batch,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "cached_prefix_len": cached,
    }
    sol = predict(
        model,
        dev,
        batch=batch,
        prompt_len=prompt_len,
        output_len=output_len,
        cached_prefix_len=cached,
    )
    if fit is None:
        return predict_derated(model, dev, derate, **shape), sol
    priced = passes is None
    per_step = quantisation_bytes(model, quant, 0.0) if priced and quant == "int8-wo" else 0.0
    per_token = quantisation_bytes(model, quant, 1.0) if priced and quant == "int8" else 0.0
    timed = passes is not None and passes.times_calls and baseline_model is not None
    ft = fitted_times(
        fit,
        baseline_model if timed and baseline_model is not None else model,
        dev,
        **shape,
        extra_bytes=per_step,
        extra_bytes_per_token=per_token,
        passes=passes,
    )
    pred = replace(
        sol,
        speed_of_light=False,
        ttft_s=ft.ttft_s,
        tpot_s=ft.tpot_s,
        e2e_s=ft.e2e_s,
        throughput_tok_s=ft.throughput_tok_s,
        decode_tok_s=batch / ft.tpot_s if ft.tpot_s > 0 else None,
        overhead_s={"prefill": ft.prefill_host_s, "decode_per_step": ft.decode_host_s},
        overhead_fit=fit.to_dict(),
        basis="the fitted cost model of the baseline's steps (overhead_fit)",
        notes=(),
    )
    return pred, sol


def _pick(at: Callable[[int], tuple[Projection, Projection]], j: int, key: str, k: int) -> float:
    """``key`` of the projected (``j`` 0) or speed-of-light (1) times at batch ``k``, s."""
    return float(at(k)[j][key])


def _token_gains(
    spec: Sequence[SpeculativeProjection | None], key: str
) -> list[tuple[float, float]]:
    """Per setting, (projected, speed of light) tokens-per-time gain of its speculative
    decoding (``before_run``; 1 for plain decoding); a table where either setting's gain
    is unknown gets 1 for both."""
    raw = [
        (None, None) if p is None else (p.before_run.speedup(key), p.before_run.sol) for p in spec
    ]
    out = [[1.0 if p is None else raw[i][j] for j in (0, 1)] for i, p in enumerate(spec)]
    for j in (0, 1):
        if any(v is None for v in (out[0][j], out[1][j])):
            out[0][j] = out[1][j] = 1.0
    return [(float(a or 1.0), float(b or 1.0)) for a, b in out]


def _per_token(p: Projection, gain: float, draft: float = 0.0) -> Projection:
    """Projected times of a static batch at ``gain`` tokens per step a row, its prefill
    ``1 + draft`` times as long (a draft model prefills each prompt too)."""
    if gain != 1.0:
        p = replace(
            p,
            tpot_s=None if p.tpot_s is None else p.tpot_s / gain,
            throughput_tok_s=None if p.throughput_tok_s is None else p.throughput_tok_s * gain,
        )
    if draft and p.ttft_s is not None:
        p = replace(p, ttft_s=p.ttft_s * (1.0 + draft))
    return p


def _pick_scaled(
    at: Callable[[int], tuple[Projection, Projection]],
    j: int,
    key: str,
    scale: float,
    k: int,
) -> float:
    """``key`` of :func:`_pick` times ``scale`` (a draft's prefill beside the target's)."""
    return _pick(at, j, key, k) * scale


def _pick_per_token(
    at: Callable[[int], tuple[Projection, Projection]], j: int, gain: float, k: int
) -> float:
    """A decode step's time per token at batch ``k`` (``gain`` tokens a row a step), s."""
    return _pick(at, j, "tpot_s", k) / gain


def project_change(
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    batch: tuple[int, int],
    prompt_len: int,
    output_len: int,
    kv_cache: tuple[bool, bool] = (True, True),
    output_lens: tuple[int, int] | None = None,
    cached_prefix_len: tuple[int, int] = (0, 0),
    fit: OverheadFit | None = None,
    loads: tuple[Load | None, Load | None] | None = None,
    quant: tuple[str, str] = ("none", "none"),
    passes: PassCosts | None = None,
) -> JsonObject | None:
    """What the what-if model projects for the change from the baseline run's setting to
    the candidate's: the ratio candidate / baseline of TTFT, TPOT and throughput.

    Both settings are projected on the baseline run's device, each with its own model shape
    and dtypes (from its run's ``model`` section) and batch. With ``fit`` (the fitted cost
    model of the baseline's steps, :func:`perfscope.analysis.overhead.fit_overhead`) each
    step is ``roof_scale x`` its roofline time plus host terms per layer, per sequence, per
    token and per step (:func:`perfscope.analysis.overhead.fitted_times`), so a change of
    batch or layers moves the host time that dominates small models; a per-layer term the
    fit could not separate is split out of per step (:meth:`OverheadFit.split_layers`).
    Without a fit, the baseline's own derating (so overheads carry over unchanged).

    ``loads`` (baseline, candidate; :class:`perfscope.analysis.queueing.Load`) adds the
    wait for a slot to TTFT and times throughput over the run's window
    (:func:`perfscope.analysis.queueing.under_load`); ``batch`` is then the slots, and an
    open-loop load decodes the requests Little's law puts in service. ``output_lens``
    (baseline, candidate) when the settings generate different numbers of tokens (default
    ``output_len`` for both); ``cached_prefix_len`` (per setting) is the prompt tokens per
    request its prefix cache serves, which the prefill does not compute; ``quant`` (per
    setting) the reference engine's weight quantisation, whose extra bytes the fitted
    projection prices (:func:`_times`); ``passes`` the candidate's kernel calls measured
    against the baseline's (:class:`~perfscope.analysis.overhead.PassCosts`), added to each
    of its steps by the fitted model. ``None`` without a roofline.
    """
    from perfscope.hwdb.spec import DeviceSpec

    spec = (baseline.get("hardware") or {}).get("spec")
    roof = baseline.get("roofline") or {}
    if not spec or not roof.get("available") or not baseline.get("model"):
        return None
    dev = DeviceSpec.from_dict(spec)
    derate = run_derating(Roofline.from_dict(roof))
    base_model = ModelSpec.from_dict(dict(baseline["model"]))
    used_fit = fit.split_layers(base_model.n_layers) if fit is not None else None
    per_row = passes.isolated_per_row_s if passes is not None else None
    if used_fit is not None and passes is not None and per_row is not None:
        k_d = passes.stretch(used_fit, base_model, dev)[0]
        used_fit = used_fit.with_rows(
            k_d * per_row,
            batch[0],
            f"the baseline model's decode step timed alone at {passes.decode_rows:.0f} and "
            f"{passes.more_rows:.0f} rows, stretched x{k_d:.3g}",
        )
    preds: list[Projection] = []
    sols: list[Projection] = []
    queue: JsonArray = []
    queue_models: list[str] = []
    spec = [
        speculative_projection(s, baseline, dev, derate, b, prompt_len, output_len, used_fit)
        for s, b in ((baseline, batch[0]), (candidate, batch[1]))
    ]
    key = "fitted" if used_fit is not None else "derated"
    gains = _token_gains(spec, key)
    # the draft prefills every prompt group too, at its cost per pass relative to the target
    drafts = [
        (0.0, 0.0)
        if p is None
        else (
            float(p.before_run.cost_ratio(key) or 0.0),
            float(p.before_run.cost_ratio_sol or 0.0),
        )
        for p in spec
    ]
    outs = output_lens or (output_len, output_len)
    load_pair = loads or (None, None)
    for side, (summary, slots, kv, output_len, cached, load, mode, extra) in enumerate(
        (
            (
                baseline,
                batch[0],
                kv_cache[0],
                outs[0],
                cached_prefix_len[0],
                load_pair[0],
                quant[0],
                None,
            ),
            (
                candidate,
                batch[1],
                kv_cache[1],
                outs[1],
                cached_prefix_len[1],
                load_pair[1],
                quant[1],
                passes,
            ),
        )
    ):
        model = ModelSpec.from_dict(dict(summary.get("model") or baseline["model"]))

        def both(
            b: int,
            model: ModelSpec = model,
            output_len: int = output_len,
            cached: int = cached,
            kv: bool = kv,
            mode: str = mode,
            extra: PassCosts | None = extra,
        ) -> tuple[Projection, Projection]:
            pred, sol = _times(
                model,
                dev,
                derate,
                used_fit,
                batch=b,
                prompt_len=prompt_len,
                output_len=output_len,
                cached=cached,
                quant=mode,
                passes=extra,
                baseline_model=base_model,
            )
            if kv:
                return pred, sol
            out = []
            for p, derated in ((pred, True), (sol, False)):
                tpot = _recompute_tpot(
                    model, baseline, b, prompt_len, output_len, derated, used_fit
                )
                if tpot is not None:
                    e2e = float(p.ttft_s or 0.0) + (output_len - 1) * tpot
                    p = replace(
                        p,
                        tpot_s=tpot,
                        e2e_s=e2e,
                        throughput_tok_s=b * output_len / e2e if e2e > 0 else None,
                    )
                out.append(p)
            return out[0], out[1]

        pred, sol = both(slots)
        if load is None:
            pred, sol = (
                _per_token(p, gain, draft)
                for p, gain, draft in zip((pred, sol), gains[side], drafts[side], strict=True)
            )
        else:
            at = cache(both)  # one projection per batch size the simulation meets
            timed = []
            for j, p in enumerate((pred, sol)):
                lt = simulate(
                    load,
                    slots=slots,
                    prefill_s=partial(_pick_scaled, at, j, "ttft_s", 1.0 + drafts[side][j]),
                    # a speculative step yields its expected tokens a row: the queue moves
                    # at the time per token, so a slower token delays the next admission
                    decode_s=partial(_pick_per_token, at, j, gains[side][j]),
                    output_len=output_len,
                )
                timed.append(
                    replace(
                        p,
                        ttft_s=lt.ttft_p50_s,
                        tpot_s=lt.tpot_p50_s,
                        throughput_tok_s=lt.throughput_tok_s,
                    )
                )
                if j == 0:  # the projected side's queue (the speed of light's is not kept)
                    queue_models.append(lt.model)
                    queue.append(
                        {
                            "queue_p50_s": lt.queue_p50_s,
                            "window_s": lt.window_s,
                            "batch_mean": lt.batch_mean,
                            "model": lt.model,
                        }
                    )
            pred, sol = timed
        sols.append(sol)
        preds.append(pred)
    ratios: JsonObject = {}
    sol_ratios: JsonObject = {}
    for key in ("ttft_s", "tpot_s", "throughput_tok_s"):
        a, c = preds[0][key], preds[1][key]
        ratios[key] = c / a if a and c is not None else None
        a, c = sols[0][key], sols[1][key]
        sol_ratios[key] = c / a if a and c is not None else None
    if used_fit is not None:
        basis = "the fitted cost model of the baseline's steps: " + used_fit.describe()
        basis += "".join(f"; {n}" for n in used_fit.notes)
    else:
        basis = (
            "the baseline run's derating ("
            + ", ".join(f"{k}={v:.3g}" for k, v in derate.terms().items())
            + ")"
        )
    if passes is not None and used_fit is not None:
        k_d, k_p = passes.stretch(used_fit, base_model, dev)
        basis += (
            "; the candidate's kernel calls measured against the baseline's ("
            + passes.source
            + f"), stretched x{k_d:.3g} per decode step and x{k_p:.3g} per prefill as the "
            "fitted steps are over the same steps timed alone"
        )
    if queue:
        basis += "; queueing: " + " → ".join(queue_models)
    return {
        "ratios": ratios,
        # The bare roofline (speed of light, no derating) for the same change: what the
        # roofline alone predicts when the hardware's ceilings are what binds (the load's
        # queueing included: it holds at any speed).
        "sol_ratios": sol_ratios,
        "baseline": {k: preds[0][k] for k in ("ttft_s", "tpot_s", "throughput_tok_s")},
        "candidate": {k: preds[1][k] for k in ("ttft_s", "tpot_s", "throughput_tok_s")},
        "bound": {"prefill": preds[1].prefill.bound, "decode": preds[1].decode.bound},
        "basis": basis,
        "overhead_fit": used_fit.to_dict() if used_fit is not None else None,
        "queue": queue or None,
        "speculative": spec[1].to_dict() if spec[1] is not None else None,
        "passes": passes.to_dict() if passes is not None else None,
    }


_NO_RATIOS: JsonObject = {"ttft_s": None, "tpot_s": None, "throughput_tok_s": None}
#: Knobs whose projection is not a plain change of model, dtype or batch.
_SCHEDULING_KNOBS = ("prefix-cache", "max-batched-tokens", "disaggregate", "replicas")


def free_cores(summaries: Sequence[Mapping[str, Any]]) -> float | None:
    """CPU cores the other processes left free during these runs: the cores less the median
    of the others' CPU seconds over each run's window (its ``contention`` section); ``None``
    when no run measured it."""
    free = []
    for summary in summaries:
        c = summary.get("contention") or {}
        cores, others, window = c.get("cpu_count"), c.get("others_cpu_s"), c.get("window_s")
        if cores and others is not None and window:
            free.append(max(float(cores) - float(others) / float(window), 0.0))
    return statistics.median(free) if free else None


def oversubscribed_threads(
    baseline_threads: str, threads: str, summaries: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why a ``threads`` change is not projected, or ``None`` when it is: more intra-op
    threads than the baseline's and than the whole cores the other load left free during the
    baseline's runs (:func:`free_cores`). Each parallel op then waits for a thread that has
    no core (a scheduler time slice, not a FLOP), which the cost model does not price; on
    this 2-core machine under a load near 10 two threads ran 15-34x slower, not 1x."""
    try:
        base, cand = int(baseline_threads), int(threads)
    except ValueError:
        return None
    free = free_cores(summaries)
    if free is None or cand <= max(base, round(free)):
        return None
    return (
        f"no projection: {cand} threads on {free:.2g} free cores (the other load's share "
        "during the baseline runs) wait for a core at every parallel op, which the cost "
        "model does not price"
    )


def _scheduling_projection(
    knob: str,
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    batch: tuple[int, int],
    prompt_len: int,
    output_len: int,
    fit: OverheadFit | None = None,
    loads: tuple[Load | None, Load | None] | None = None,
    values: tuple[str, str] = ("", ""),
    prompt_spec: str = "",
) -> JsonObject:
    """The projection of a scheduling knob, with a ``note`` saying what it rests on.

    ``disaggregate``: the disaggregation what-if below as the TPOT projection. ``replicas``
    (``values``: the two settings): the cost model for one replica decoding
    ``ceil(batch / N)`` sequences (the load split evenly), throughput times N; each replica
    on cores of its own (no contention priced) and no queueing.

    ``prefix-cache``: :func:`project_change` with each setting's measured mean cached prompt
    tokens per request (its ``prompt_cache`` section; 0 without one) at the measured mean
    prompt length, so the prefill's FLOPs and bytes scale by the uncached share.
    ``max-batched-tokens``: no projection (``ratios`` all None; the what-if prices one
    static batch with prefill and decode apart and has no per-step token budget), and next
    to it the advisor's prefill/decode disaggregation what-if for the baseline run
    (``disaggregation``): TPOT x ``1 - decode_stall_share``.
    """
    if knob == "prefix-cache":
        pcs = [s.get("prompt_cache") or {} for s in (baseline, candidate)]
        cached = tuple(round(float(pc.get("cached_tokens_mean") or 0.0)) for pc in pcs)
        means = [float(pc["prompt_tokens_mean"]) for pc in pcs if pc.get("prompt_tokens_mean")]
        plen = round(means[0]) if means else prompt_len
        proj = project_change(
            baseline,
            candidate,
            batch=batch,
            prompt_len=plen,
            output_len=output_len,
            cached_prefix_len=(int(cached[0]), int(cached[1])),
            fit=fit,
            loads=loads,
        )
        if proj is None:
            return {
                "ratios": dict(_NO_RATIOS),
                "sol_ratios": dict(_NO_RATIOS),
                "note": "no projection: the baseline run has no roofline",
            }
        shares = [pc.get("share") for pc in pcs]
        said = ", ".join(
            "no cache" if sh is None else f"{100 * sh:.0f}% of prompt tokens cached"
            for sh in shares
        )
        cached_lens: JsonArray = [*cached]
        proj["cached_prefix_len"] = cached_lens
        proj["note"] = (
            f"projected with the measured cache use ({said}; {cached[0]} → {cached[1]} cached "
            f"of {plen} prompt tokens per request): prefill FLOPs and bytes scaled by the "
            "uncached share, decode unchanged"
        )
        return proj
    if knob == "replicas":  # one replica decoding ceil(batch / N) sequences, throughput x N
        try:
            n = tuple(max(1, int(v or 1)) for v in values)
        except ValueError:
            n = (1, 1)
        per = (max(1, math.ceil(batch[0] / n[0])), max(1, math.ceil(batch[0] / n[1])))
        proj = project_change(
            baseline, candidate, batch=per, prompt_len=prompt_len, output_len=output_len, fit=fit
        )
        if proj is None:
            return {
                "ratios": dict(_NO_RATIOS),
                "sol_ratios": dict(_NO_RATIOS),
                "note": "no projection: the baseline run has no roofline",
            }
        for key in ("ratios", "sol_ratios"):
            r = json_object(proj.get(key)) or {}
            tok_s = json_float(r.get("throughput_tok_s"))
            if tok_s is not None:
                r["throughput_tok_s"] = tok_s * n[1] / n[0]
        proj["note"] = (
            f"projected with the cost model per replica: {n[1]} replicas decode {per[1]} of the "
            f"{batch[0]} sequences each (baseline {n[0]}: {per[0]}), throughput x{n[1] / n[0]:g}; "
            "assumes each replica has cores of its own (no contention) and an even split"
        )
        return proj
    lat = (baseline.get("roofline") or {}).get("latency") or {}
    share = lat.get("decode_stall_share")
    dis: JsonObject | None = None
    dis_ratios: JsonObject = dict(_NO_RATIOS)
    dis_txt = "no disaggregation what-if (the baseline has no prefill/decode steps to weigh)"
    if isinstance(share, int | float):
        dis_ratios = {"ttft_s": None, "tpot_s": 1.0 - float(share), "throughput_tok_s": None}
        dis = {
            "ratios": dis_ratios,
            "decode_stall_share": float(share),
            "basis": "the baseline's decode time spent waiting for prefill passes disappears "
            "(a second device takes the prefills; KV transfer not priced)",
        }
        dis_txt = (
            f"the disaggregation what-if next to it: TPOT x{1.0 - float(share):.3f} "
            f"({100 * float(share):.0f}% of the baseline's decode time waited for prefills)"
        )
    if knob == "disaggregate":
        return {
            "ratios": dict(dis_ratios),
            "sol_ratios": dict(_NO_RATIOS),
            "disaggregation": dis,
            "note": "projected by the disaggregation what-if alone (TTFT and throughput not "
            "projected; the hand-off is measured, not priced): " + dis_txt,
        }
    budgets = (_budget_of(values[0]), _budget_of(values[1]))
    load0, load1 = loads or (None, None)
    chunked = None
    if fit is not None and load0 is not None and load1 is not None:
        lengths = _prompt_lengths(prompt_spec, load0.requests, prompt_len)
        chunked = _chunked_projection(
            baseline, budgets, fit, (load0, load1), batch, lengths, output_len
        )
    if chunked is not None:
        chunked["disaggregation"] = dis
        chunked["note"] = (
            "projected by the baseline's fitted cost model stepping the load through the "
            "engine's scheduler: without a budget one prefill pass of the admitted prompts "
            "then one decode step; with one, each step the decode rows first and the next "
            "prompt chunks up to the budget (a prompt's first token when its last chunk "
            "ends), each step paying the fitted per-step, per-row and per-layer host time; "
            f"prompts of {min(lengths)}-{max(lengths)} tokens spread over the workload's "
            "distribution; " + dis_txt
        )
        return chunked
    return {
        "ratios": dict(_NO_RATIOS),
        "sol_ratios": dict(_NO_RATIOS),
        "disaggregation": dis,
        "note": "no projection: a per-step token budget is projected from the baseline's "
        "fitted cost model and its load, and this study has "
        + ("no load" if fit is not None else "no fitted cost model")
        + "; "
        + dis_txt,
    }


def _prompt_lengths(spec: str, n: int, mean: int) -> list[int]:
    """``n`` prompt lengths spread over a ``uniform:A:B`` workload (quantiles in a
    golden-ratio order, so neighbours differ as random draws would), else ``mean`` each."""
    parts = str(spec).split(":")
    if len(parts) == 3 and parts[0] == "uniform":
        try:
            lo, hi = float(parts[1]), float(parts[2])
        except ValueError:
            return [mean] * n
        frac = [((i + 1) * 0.6180339887498949) % 1.0 for i in range(n)]
        return [max(1, round(lo + (hi - lo) * f)) for f in frac]
    return [mean] * n


def _budget_of(value: str) -> int | None:
    """A ``max-batched-tokens`` setting as a token budget (``None``: unlimited)."""
    try:
        v = int(str(value).strip())
    except ValueError:
        return None
    return v if v > 0 else None


def _chunked_projection(
    baseline: Mapping[str, Any],
    budgets: tuple[int | None, int | None],
    fit: OverheadFit,
    loads: tuple[Load, Load],
    batch: tuple[int, int],
    prompt_lens: Sequence[int],
    output_len: int,
) -> JsonObject | None:
    """TTFT, TPOT and throughput of each budget by :func:`simulate_budget` with step times
    from ``fit`` (its per-layer term split out as for any projection), and the same at the
    speed of light (the roofline alone, no host time); ``None`` without a roofline."""
    import numpy as np

    from perfscope.hwdb.spec import DeviceSpec

    spec = (baseline.get("hardware") or {}).get("spec")
    if not spec or not baseline.get("model"):
        return None
    dev = DeviceSpec.from_dict(spec)
    model = ModelSpec.from_dict(dict(baseline["model"]))
    used = fit.split_layers(model.n_layers)
    ctx = statistics.fmean(prompt_lens) + output_len / 2.0

    def step(f: OverheadFit | None, rows: int, chunk: int, chunks: int) -> float:
        decode = (
            float(
                roof_times(model, dev, np.array([rows]), np.array([rows]), np.array([rows * ctx]))[
                    0
                ]
            )
            if rows
            else 0.0
        )
        prompt = (
            float(
                roof_times(model, dev, np.array([1.0]), np.array([chunk]), np.array([chunk / 2.0]))[
                    0
                ]
            )
            if chunk
            else 0.0
        )
        if f is None:  # speed of light
            return decode + prompt
        seqs = max(rows + chunks, 1)
        pre = f.prefill_scale if f.prefill_scale is not None else f.roof_scale
        host = float(f.host_time(float(model.n_layers), seqs, seqs))
        return host + f.roof_scale * decode + pre * prompt

    out: list[tuple[LoadTimes, LoadTimes]] = []
    for budget, load, slots in zip(budgets, loads, batch, strict=True):
        pair = tuple(
            simulate_budget(
                load,
                slots=slots,
                budget=budget,
                step_s=partial(step, f),
                prompt_len=prompt_lens,
                output_len=output_len,
            )
            for f in (used, None)
        )
        out.append((pair[0], pair[1]))
    keys = {"ttft_s": "ttft_p50_s", "tpot_s": "tpot_p50_s", "throughput_tok_s": "throughput_tok_s"}

    def ratio(j: int, key: str) -> float | None:
        a, c = getattr(out[0][j], keys[key]), getattr(out[1][j], keys[key])
        return c / a if a and c is not None else None

    return {
        "ratios": {k: ratio(0, k) for k in keys},
        "sol_ratios": {k: ratio(1, k) for k in keys},
        "baseline": {k: getattr(out[0][0], v) for k, v in keys.items()},
        "candidate": {k: getattr(out[1][0], v) for k, v in keys.items()},
        "basis": "the fitted cost model of the baseline's steps: "
        + used.describe()
        + "".join(f"; {n}" for n in used.notes)
        + "; queueing: "
        + " → ".join(x[0].model for x in out),
        "overhead_fit": used.to_dict(),
        "queue": [
            {
                "queue_p50_s": x[0].queue_p50_s,
                "window_s": x[0].window_s,
                "batch_mean": x[0].batch_mean,
                "model": x[0].model,
            }
            for x in out
        ],
    }


def simulate_budget(
    load: Load,
    *,
    slots: int,
    budget: int | None,
    step_s: Callable[[int, int, int], float],
    prompt_len: int | Sequence[int],
    output_len: int,
) -> LoadTimes:
    """The run of ``load`` on the reference engine's continuous scheduler with a per-step
    token ``budget`` (``None``: unlimited), request ``i``'s prompt ``prompt_len[i]`` tokens
    (or every prompt ``prompt_len``).

    Unlimited: each iteration one prefill pass per distinct length of the admitted prompts
    (``step_s(0, tokens, prompts)``; each prompt's first token when its pass ends), then
    one decode step of the running rows (``step_s(rows, 0, 0)``).
    With a budget: each iteration one step of the decode rows first and then the next
    prompt chunks, in admission order, up to ``budget`` tokens (``step_s(rows, chunk
    tokens, chunks)``); a prompt whose last chunk ends in a step has its first token then
    and decodes from the next step. Requests arrive as :func:`~perfscope.analysis.queueing.
    simulate` has them (a burst, an open loop at the rate, or closed-loop users)."""
    n = max(int(load.requests), 1)
    c = max(int(slots), 1)
    out = max(int(output_len), 1)
    plen = (
        [max(int(prompt_len), 1)] * n
        if isinstance(prompt_len, int)
        else [max(int(x), 1) for x in list(prompt_len)[:n]]
    )
    plen += [plen[-1]] * (n - len(plen))
    users = max(int(load.concurrency or 1), 1) if load.mode == "online" and not load.rate else 0
    arrival: list[float] = [0.0] * n
    if load.mode == "online" and load.rate:
        arrival = [i / float(load.rate) for i in range(n)]
    elif users:
        arrival = [0.0 if i < users else math.inf for i in range(n)]
    start, first, done = [0.0] * n, [0.0] * n, [0.0] * n
    left = [0] * n
    filling: list[list[int]] = []  # [request, prompt tokens still to compute]
    running: list[int] = []
    nxt, t, rows_sum, steps = 0, 0.0, 0, 0

    def finish(i: int) -> None:
        done[i] = t
        if users:  # closed loop: this user sends the next request now
            later = next((j for j in range(nxt, n) if arrival[j] == math.inf), None)
            if later is not None:
                arrival[later] = t

    def started(i: int, at: float | None = None) -> None:
        first[i] = t if at is None else at
        left[i] = out - 1
        if left[i] == 0:
            finish(i)
        else:
            running.append(i)

    while nxt < n or running or filling:
        while len(running) + len(filling) < c and nxt < n and arrival[nxt] <= t:
            start[nxt] = t
            filling.append([nxt, plen[nxt]])
            nxt += 1
        if not running and not filling:
            if nxt >= n or arrival[nxt] == math.inf:
                break
            t = max(t, arrival[nxt])
            continue
        if budget is None:
            # one prefill pass per distinct prompt length (the engine pads nothing), each
            # pass's prompts starting to decode together after the last pass
            by_len: dict[int, list[int]] = {}
            for i, tokens in filling:
                by_len.setdefault(tokens, []).append(i)
            passed = []
            for tokens, group in by_len.items():
                t += step_s(0, tokens * len(group), len(group))
                for i in group:
                    first[i] = t
                passed.extend(group)
            for i in passed:
                started(i, first[i])
            filling = []
            if not running:
                continue
            rows = len(running)
            t += step_s(rows, 0, 0)
            dec = list(running)
            completed: list[int] = []
        else:
            dec = list(running)
            room = budget - len(dec)
            completed = []  # prompts whose last chunk ends in this step
            chunk = chunks = 0
            for f in filling:
                if room <= 0:
                    break
                q = min(f[1], room)
                f[1] -= q
                room -= q
                chunk += q
                chunks += 1
                if f[1] == 0:
                    completed.append(f[0])
            t += step_s(len(dec), chunk, chunks)
            filling = [f for f in filling if f[1] > 0]
        rows_sum += len(dec)
        steps += 1 if dec else 0
        for i in dec:
            left[i] -= 1
            if left[i] == 0:
                finish(i)
        running = [i for i in running if left[i] > 0]
        for i in completed:
            started(i)
    ttft = [first[i] - arrival[i] for i in range(n)]
    tpot = [(done[i] - first[i]) / (out - 1) for i in range(n)] if out > 1 else [0.0] * n
    window = max(done) - min(arrival)
    how = (
        f"all {n} requests at t = 0"
        if load.mode == "batch"
        else f"{n} requests at rate {float(load.rate):g}/s"
        if load.rate
        else f"{n} requests from {users} closed-loop users"
    )
    rule = "no token budget" if budget is None else f"a {budget}-token budget a step"
    return LoadTimes(
        ttft_p50_s=float(statistics.median(ttft)),
        tpot_p50_s=float(statistics.median(tpot)),
        queue_p50_s=float(statistics.median(start[i] - arrival[i] for i in range(n))),
        window_s=window,
        throughput_tok_s=n * out / window if window > 0 else None,
        batch_mean=rows_sum / steps if steps else 0.0,
        model=f"the engine's scheduler with {rule}, {c} slots, stepped with projected steps, {how}",
    )


def _mean_step_s(summary: Mapping[str, Any], kind: str) -> float | None:
    st = (summary.get("steps") or {}).get(kind) or {}
    v = st.get("mean_step_s")
    return float(v) if v else None


@dataclass(frozen=True)
class SpeculativeBefore:
    """:func:`speculative_projection`'s ``before_run``: the speedup over plain decoding at
    the assumed acceptance ``alpha`` with ``k`` draft tokens, by each basis (``derated``: the
    baseline run's derating, ``sol``: speed of light, ``fitted``: the baseline's fitted cost
    model, ``None`` without one), each with the draft/target pass cost ratio it used
    (``cost_ratio_*``); ``verify_cost_roofline`` the verify pass over a plain step by the
    roofline when there is no draft pass (lookahead, Medusa), ``verify_cost_fitted`` the
    same by the fitted model. The ratios and speedups are unitless."""

    k: int
    cost_ratio_derated: float | None
    derated: float | None
    cost_ratio_sol: float | None
    sol: float | None
    alpha: float = ASSUMED_ACCEPTANCE
    verify_cost_roofline: float | None = None
    cost_ratio_fitted: float | None = None
    verify_cost_fitted: float | None = None
    fitted: float | None = None

    def speedup(self, basis: str) -> float | None:
        """The speedup by ``basis`` (``derated``, ``sol`` or ``fitted``)."""
        return {"derated": self.derated, "sol": self.sol, "fitted": self.fitted}[basis]

    def cost_ratio(self, basis: str) -> float | None:
        """The draft/target pass cost ratio by ``basis`` (as :meth:`speedup`)."""
        by = {
            "derated": self.cost_ratio_derated,
            "sol": self.cost_ratio_sol,
            "fitted": self.cost_ratio_fitted,
        }
        return by[basis]

    def to_dict(self) -> JsonObject:
        """The stored JSON form (the roofline's and the fitted keys only when known)."""
        out: JsonObject = {"alpha": self.alpha, "k": self.k}
        if self.verify_cost_roofline is not None:
            out["verify_cost_roofline"] = self.verify_cost_roofline
        out["cost_ratio_derated"] = self.cost_ratio_derated
        out["derated"] = self.derated
        out["cost_ratio_sol"] = self.cost_ratio_sol
        out["sol"] = self.sol
        if self.fitted is not None:
            out["cost_ratio_fitted"] = self.cost_ratio_fitted
            out["verify_cost_fitted"] = self.verify_cost_fitted
            out["fitted"] = self.fitted
        return out


@dataclass(frozen=True)
class SpeculativeAfter:
    """:func:`speculative_projection`'s ``after_run``: a speculative run's measured
    acceptance (``acceptance_rate``, ``mean_accepted_per_step``, per-token ``alpha``), its
    draft and verify passes over the baseline's plain decode step (``cost_ratio``,
    ``verify_cost``), the tokens a step they expect and the speedups they give (with the
    measured verify cost, the formula's, and with each pass's host time added); ``runs``
    the rounds a study's median is over (``None`` for one run's)."""

    acceptance_rate: float | None
    mean_accepted_per_step: float | None
    alpha: float | None
    cost_ratio: float | None
    verify_cost: float | None
    tokens_per_step: float | None
    speedup: float | None
    speedup_formula: float | None
    speedup_with_host: float | None
    runs: int | None = None

    def to_dict(self) -> JsonObject:
        """The stored JSON form (``runs`` only when set)."""
        out = asdict(self)
        if self.runs is None:
            del out["runs"]
        return out


@dataclass(frozen=True)
class SpeculativeProjection:
    """:func:`speculative_projection` of one setting: its ``k`` draft tokens, ``method``
    (``draft``, ``lookahead``, ``medusa``), ``draft`` model name, the projection before the
    run and what the run measured (``None`` when it measured too little)."""

    k: int
    method: str
    draft: str | None
    before_run: SpeculativeBefore
    after_run: SpeculativeAfter | None

    def to_dict(self) -> JsonObject:
        """The stored JSON form (a setting's ``projection["speculative"]``)."""
        return {
            "k": self.k,
            "method": self.method,
            "draft": self.draft,
            "before_run": self.before_run.to_dict(),
            "after_run": None if self.after_run is None else self.after_run.to_dict(),
        }


def _after_run_median(
    baselines: Sequence[Mapping[str, Any]],
    candidates: Sequence[Mapping[str, Any]],
    batch: int,
    prompt_len: int,
    output_len: int,
) -> SpeculativeAfter | None:
    """:func:`speculative_projection`'s ``after_run`` of each round (the candidate's run next
    to the baseline's run of the same round), each number the median over the rounds: one
    run's pass times on a shared machine can be far off."""
    from perfscope.hwdb.spec import DeviceSpec

    rows = []
    for base, cand in zip(baselines, candidates, strict=False):
        spec = (base.get("hardware") or {}).get("spec")
        if not spec:
            continue
        dev = DeviceSpec.from_dict(spec)
        derate = run_derating(Roofline.from_dict(base.get("roofline")))
        p = speculative_projection(cand, base, dev, derate, batch, prompt_len, output_len)
        if p is not None and p.after_run is not None:
            rows.append(p.after_run)
    if not rows:
        return None

    medians = {
        f.name: _median([getattr(r, f.name) for r in rows])
        for f in fields(SpeculativeAfter)
        if f.name != "runs"
    }
    return SpeculativeAfter(**medians, runs=len(rows))


def _gap_per_step(summary: Mapping[str, Any], phase: str) -> float | None:
    ph = ((summary.get("roofline") or {}).get("phases") or {}).get(phase) or {}
    gap, steps = ph.get("gap_s"), ph.get("steps")
    return float(gap) / float(steps) if gap is not None and steps else None


def speculative_projection(
    summary: Mapping[str, Any],
    baseline: Mapping[str, Any],
    dev: Any,
    derate: Derating,
    batch: int,
    prompt_len: int,
    output_len: int,
    fit: OverheadFit | None = None,
) -> SpeculativeProjection | None:
    """Speedup over plain decoding of one setting that decodes speculatively (None if it
    does not): :func:`~perfscope.analysis.whatif.speculative_speedup`, cited there.

    ``before_run["fitted"]`` (with ``fit``, the baseline's fitted cost model): the assumed
    acceptance, and each pass timed by the fit at the mean context: a draft pass is a
    decode step of the draft model (its layers pay the per-layer host time), the verify
    pass a step of ``K + 1`` tokens a row (:meth:`~perfscope.analysis.overhead.
    OverheadFit.prefill_step_time`), each with the baseline's measured host gap per decode
    step before it (``cost_ratio_fitted``, ``verify_cost_fitted``).

    ``before_run``: with the stated :data:`~perfscope.analysis.whatif.ASSUMED_ACCEPTANCE`
    and the draft/target pass cost ratio ``c`` from the what-if model (``derated``: the
    baseline run's derating applied to both models' decode steps; ``sol``: speed of light);
    the verify pass one target pass, as the formula assumes, after a draft; without one
    (lookahead, Medusa) the verify pass is the whole step and costs its roofline time over a
    plain step's (``verify_cost_roofline``: ``K + 1`` positions a row, and for Medusa the
    heads' FLOPs and weight reads, :func:`~perfscope.analysis.costmodel.medusa_head_cost`).
    ``after_run``: the measured
    ``alpha`` of this setting's run, ``c`` = its mean draft pass over the baseline's mean
    plain decode step, and ``verify_cost`` = its mean verify pass over that same step
    (``speedup``), and the same with the host time before each pass added to it
    (``speedup_with_host``), so the parts of the projection's error can be told apart (a
    study stores the median of each over its rounds).
    """
    sp = summary.get("speculative") or {}
    k = int(sp.get("num_speculative_tokens") or 0)
    draft_dict, model_dict = sp.get("draft_model"), summary.get("model")
    # Lookahead and Medusa propose without a pass of their own: c = 0.
    drafted = (sp.get("method") or "draft") == "draft"
    if k < 1 or not model_dict or (drafted and not draft_dict):
        return None
    target = ModelSpec.from_dict(dict(model_dict))
    draft = ModelSpec.from_dict(dict(draft_dict)) if drafted and draft_dict else None
    shape = {"batch": batch, "prompt_len": prompt_len, "output_len": output_len}
    method = sp.get("method") or "draft"
    heads = k if method == "medusa" else 0
    # Without a draft pass the verify pass is the whole step: its K + 1 positions a row (and
    # Medusa's heads) priced by the roofline against a plain step, not the formula's 1.
    v_roof = None if drafted else _verify_roof_ratio(target, dev, k, heads, **shape)
    ratio: dict[str, float | None] = {}
    speedup: dict[str, float | None] = {}
    for key, eff, over in (
        ("derated", derate.decode_efficiency, derate.decode_overhead_s or 0.0),
        ("sol", None, 0.0),
    ):

        def tpot(m: ModelSpec, eff: float | None = eff, over: float = over) -> float | None:
            return predict(
                m,
                dev,
                batch=batch,
                prompt_len=prompt_len,
                output_len=output_len,
                decode_efficiency=eff,
                decode_overhead_s=over,
            ).tpot_s

        t_target = tpot(target)
        t_draft = 0.0 if draft is None else tpot(draft)
        c = t_draft / t_target if t_target and t_draft is not None else None
        ratio[key] = c
        speedup[key] = (
            None if c is None else speculative_speedup(ASSUMED_ACCEPTANCE, k, c, v_roof or 1.0)
        )
    fitted = (
        _fitted_speculative(fit, target, draft, dev, baseline, k, heads, **shape)
        if fit is not None
        else (None, None, None)
    )
    before = SpeculativeBefore(
        k=k,
        verify_cost_roofline=v_roof,
        cost_ratio_derated=ratio["derated"],
        derated=speedup["derated"],
        cost_ratio_sol=ratio["sol"],
        sol=speedup["sol"],
        cost_ratio_fitted=fitted[0],
        verify_cost_fitted=fitted[1],
        fitted=fitted[2],
    )
    after: SpeculativeAfter | None = None
    plain = _mean_step_s(baseline, "decode") if not baseline.get("speculative") else None
    draft_s, verify_s = _mean_step_s(summary, "draft_decode"), _mean_step_s(summary, "decode")
    if not drafted:
        draft_s = 0.0
    alpha = sp.get("alpha")
    if (
        plain
        and draft_s is not None
        and verify_s
        and alpha is not None
        and (draft_s or not drafted)
    ):
        c, v = draft_s / plain, verify_s / plain
        # The same with each pass's host time before it (Python and scheduling between
        # passes, the roofline's gap_s per step): the part the formula does not see.
        g_plain = _gap_per_step(baseline, "decode")
        g_draft, g_verify = _gap_per_step(summary, "draft_decode"), _gap_per_step(summary, "decode")
        g_draft = 0.0 if not drafted else g_draft
        host = None
        if g_plain is not None and g_draft is not None and g_verify is not None:
            unit = plain + g_plain
            host = speculative_speedup(
                float(alpha), k, (draft_s + g_draft) / unit, (verify_s + g_verify) / unit
            )
        after = SpeculativeAfter(
            acceptance_rate=sp.get("acceptance_rate"),
            mean_accepted_per_step=sp.get("mean_accepted_per_step"),
            alpha=alpha,
            cost_ratio=c,
            verify_cost=v,
            tokens_per_step=expected_tokens_per_step(float(alpha), k),
            speedup=speculative_speedup(float(alpha), k, c, v),
            speedup_formula=speculative_speedup(float(alpha), k, c),
            speedup_with_host=host,
        )
    return SpeculativeProjection(
        k=k, method=method, draft=sp.get("draft"), before_run=before, after_run=after
    )


def _verify_roof_ratio(
    target: ModelSpec,
    dev: Any,
    k: int,
    heads: int,
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
) -> float | None:
    """Roofline time of a verify pass (``K + 1`` positions a row, plus ``heads`` Medusa
    heads on each row) over a plain decode step's, at the mean context."""
    import numpy as np

    b = np.array([float(max(batch, 1))])
    ctx = b * (prompt_len + output_len / 2.0)
    plain = float(roof_times(target, dev, b, b, ctx)[0])
    h_flops, h_bytes = medusa_head_cost(target, heads, b)
    wide = roof_times(target, dev, b, b * (k + 1), ctx, h_bytes, h_flops)
    return float(wide[0]) / plain if plain > 0 else None


def _fitted_speculative(
    fit: OverheadFit,
    target: ModelSpec,
    draft: ModelSpec | None,
    dev: Any,
    baseline: Mapping[str, Any],
    k: int,
    heads: int = 0,
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
) -> tuple[float, float, float]:
    """:func:`speculative_projection`'s fitted-model (draft/target cost ratio, verify cost over
    a plain step, speedup) at the assumed acceptance: a
    draft pass a decode step of the draft (none for lookahead and Medusa), the verify pass
    a step of ``K + 1`` positions a row with ``heads`` Medusa heads' work on its roofline
    time (:func:`~perfscope.analysis.costmodel.medusa_head_cost`)."""
    import numpy as np

    b = np.array([float(max(batch, 1))])
    ctx = b * (prompt_len + output_len / 2.0)
    roof_t = roof_times(target, dev, b, b, ctx)
    plain = float(fit.step_time(roof_t, float(target.n_layers), b, b)[0])
    drafted = (
        0.0
        if draft is None
        else float(fit.step_time(roof_times(draft, dev, b, b, ctx), float(draft.n_layers), b, b)[0])
    )
    wide = b * (k + 1)
    h_flops, h_bytes = medusa_head_cost(target, heads, b)
    roof_v = roof_times(target, dev, b, wide, ctx, h_bytes, h_flops)
    verify = float(fit.prefill_step_time(roof_v, float(target.n_layers), b, wide, roof_t)[0])
    gap = _gap_per_step(baseline, "decode") or 0.0
    unit = plain + gap
    # No draft pass: no host gap before one either.
    c = (drafted + gap) / unit if draft is not None else 0.0
    v = (verify + gap) / unit
    return c, v, speculative_speedup(ASSUMED_ACCEPTANCE, k, c, v)


# --------------------------------------------------------------------------- the record


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
    projection: Mapping[str, Any] | None
    quality: Mapping[str, Any] | None = None
    #: What its projection was made from (:func:`projection_inputs`), so that it can be
    #: made again from the record alone (:func:`rederive_study`); ``None`` in older records.
    inputs: dict[str, object] | None = None


@dataclass(frozen=True)
class Study:
    """A finished study (JSON schema ``perfscope.study/1``; see the module docstring)."""

    knob: str
    values: list[str]
    repeat: int
    settings: list[SettingResult]
    order: list[tuple[int, int]]
    args: Mapping[str, Any]
    created_at: str
    notes: list[str] = field(default_factory=list)
    path: str | None = None
    schema: str = SCHEMA
    #: The machine class the study ran on (:class:`perfscope.analysis.calibration.MachineClass`
    #: as JSON: CPU model and cores, GPU model, engine), ``{}`` in older records.
    machine: Mapping[str, Any] = field(default_factory=dict)

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


def _median(values: Sequence[float | None]) -> float | None:
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(xs) if xs else None


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
    summary: Mapping[str, Any],
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
    kv_cache: bool,
    queueing: bool,
    fit: OverheadFit | None = None,
) -> dict[str, object]:
    """What a setting's projection is made from, as stored with it: the sections of its
    first run's summary a projection reads, its batch and token counts, and (the
    baseline's) the fitted cost model. :func:`rederive_study` makes the projection again
    from these alone."""
    out: dict[str, object] = {k: summary[k] for k in _INPUT_SECTIONS if summary.get(k) is not None}
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
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    batch: tuple[int, int],
    prompt_len: int,
    output_lens: tuple[int, int],
    kv_cache: tuple[bool, bool],
    fit: OverheadFit | None,
    loads: tuple[Load | None, Load | None] | None,
    passes: PassCosts | None,
    prompt_spec: str,
) -> tuple[Mapping[str, Any] | None, list[str]]:
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
            batch=(int(b_set["batch"]), int(c_set["batch"])),
            prompt_len=int(b_set["prompt_len"]),
            output_lens=(int(b_set["output_len"]), int(c_set["output_len"])),
            kv_cache=(bool(b_set["kv_cache"]), bool(c_set["kv_cache"])),
            fit=fit,
            loads=loads,
            passes=PassCosts.from_dict(raw_passes) if isinstance(raw_passes, Mapping) else None,
            prompt_spec=str(study.args.get("prompt_len") or ""),
        )
        projection = None if made is None else dict(made)
        old = (s.projection or {}).get("speculative")
        if projection is not None and projection.get("speculative") and old:
            projection["speculative"]["after_run"] = old.get("after_run")
        effects = []
        for e in s.effects:
            key = METRICS.get(e.metric, (None, None))[1]
            proj = None if projection is None or key is None else projection["ratios"].get(key)
            err = proj / e.change.ratio - 1.0 if proj is not None and e.change.ratio else None
            effects.append(replace(e, projected_ratio=proj, error=err))
        out.append(replace(s, projection=projection, effects=effects))
    return replace(study, settings=out)


def build_study(
    knob: str,
    values: Sequence[str],
    repeat: int,
    runs: Sequence[tuple[int, int, str, Mapping[str, Any]]],
    *,
    batches: Sequence[int],
    prompt_len: int,
    output_len: int,
    kv_cache: Sequence[bool] | None = None,
    output_lens: Sequence[int] | None = None,
    args: Mapping[str, Any] | None = None,
    created_at: str = "",
    quality: Sequence[Mapping[str, Any] | None] | None = None,
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
    summaries: list[list[Mapping[str, Any]]] = [[] for _ in values]
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
        model = first.get("model")
        memory = (
            memory_need(ModelSpec.from_dict(dict(model)), batches[i], prompt_len + outs[i], kv[i])
            if model
            else {}
        )
        draft = (first.get("speculative") or {}).get("draft_model")
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
        projection = None
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
            if projection is not None and projection.get("speculative"):
                median_after = _after_run_median(
                    summaries[0], summaries[i], batches[i], prompt_len, output_len
                )
                projection["speculative"]["after_run"] = (
                    None if median_after is None else median_after.to_dict()
                )
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
                proj = None if projection is None or key is None else projection["ratios"].get(key)
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
