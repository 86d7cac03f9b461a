"""The cost model of a change: what the what-if model projects from one setting to another.

:func:`project_change` gives the ratio candidate / baseline of TTFT, TPOT and throughput
(with the speed of light's beside it); :func:`memory_need` the bytes a setting needs by the
cost model (weights + KV cache). Times are in seconds, throughput in tokens/s, memory in
bytes; ratios are unitless.

The projection is made as the advisor makes it: the *baseline* run's own derating
(:func:`~perfscope.analysis.whatif.run_derating`: its per-phase efficiency, or its per-step
overhead when a phase is overhead-bound) applied to the candidate's model shape, dtypes and
batch on the same device, or the fitted cost model of the baseline's steps when there is one.
A knob the cost model does not see (threads, the attention kernel, ``torch.compile``, the
scheduler) projects no change, and the record says so; the scheduling knobs are projected
apart (:mod:`.scheduling`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache, partial
from typing import Any

from perfscope.analysis.costmodel import kv_bytes_per_token, step_costs, weight_bytes
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.overhead import (
    OverheadFit,
    PassCosts,
    fitted_times,
    quantisation_bytes,
    roof_times,
)
from perfscope.analysis.queueing import Load, simulate
from perfscope.analysis.study.speculative import SpeculativeProjection, speculative_projection
from perfscope.analysis.summary import Projection, Roofline
from perfscope.analysis.whatif import Derating, predict, predict_derated, run_derating
from perfscope.jsontypes import JsonArray, JsonObject, ReadOnlyJson, json_at, json_object

__all__ = ["memory_need", "project_change"]


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
    summary: ReadOnlyJson,
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

    spec = json_object(json_at(summary, "hardware").get("spec"))
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
    derate = (
        run_derating(Roofline.from_dict(json_object(summary.get("roofline"))))
        if derated
        else Derating()
    )
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
    shape: dict[str, int] = {
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
    baseline: ReadOnlyJson,
    candidate: ReadOnlyJson,
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

    device = json_object(json_at(baseline, "hardware").get("spec"))
    roof = json_at(baseline, "roofline")
    base_dict = json_object(baseline.get("model"))
    if not device or not roof.get("available") or not base_dict:
        return None
    dev = DeviceSpec.from_dict(device)
    derate = run_derating(Roofline.from_dict(roof))
    base_model = ModelSpec.from_dict(dict(base_dict))
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
        model = ModelSpec.from_dict(dict(json_object(summary.get("model")) or base_dict))

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
                    # A step without a cache reads the same weights and does at least the
                    # cached step's work: recompute timed at the prefill's derating must not
                    # come out faster just because prefill runs at a better efficiency here.
                    tpot = max(tpot, p.tpot_s or 0.0)
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
