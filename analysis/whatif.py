"""What-if projections: a workload's latency, throughput and memory on any device.

:func:`predict` runs the cost model for a static batch (prefill of ``batch`` prompts, then
``output_len - 1`` decode steps with a growing cache) and turns each phase into time with
the roofline: ``max(FLOPs / peak_flops, bytes / peak_bw)``. That is the speed of light;
an ``efficiency`` (fraction of speed of light actually reached, e.g. a measured run's
``sol_time / time``) derates it. :func:`project_run` projects a measured run onto other
devices: device time from the target's speed of light and a *stated* efficiency -- the
run's own only when the target is the device class the run was measured on, otherwise the
documented range :data:`ENGINE_EFFICIENCY` (compiled engines to eager PyTorch), plus the
target's kernel launches per step (:mod:`perfscope.analysis.overhead`). A run's fitted
cost model (:func:`perfscope.analysis.overhead.fit_overhead`) replaces "the whole per-step
excess is fixed overhead": its host terms scale per layer, per sequence, per token and per
step, and only the parts that move with the device move to another device.

Tensor parallelism (``tp``) divides FLOPs, weights and activations by ``tp`` and the KV
cache by ``min(tp, n_kv_heads)`` (KV heads are replicated beyond that); communication is
not modelled, so TP projections are optimistic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from perfscope.analysis.catalogue import format_seconds
from perfscope.analysis.costmodel import (
    kv_cache_bytes_per_sequence,
    kv_share_per_device,
    step_costs,
    weight_bytes,
)
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.overhead import KERNELS_PER_LAYER, OverheadFit, launch_time
from perfscope.analysis.roofline import fmt_pct, memory_ceiling
from perfscope.analysis.summary import (
    Projection,
    ProjectionCeilings,
    ProjectionDevice,
    ProjectionMemory,
    ProjectionPhase,
    ProjectionWorkload,
    Roofline,
)
from perfscope.jsontypes import JsonObject

if TYPE_CHECKING:
    from perfscope.hwdb.spec import DeviceSpec

__all__ = [
    "ASSUMED_ACCEPTANCE",
    "DEFAULT_MEM_FRACTION",
    "ENGINE_EFFICIENCY",
    "Derating",
    "alpha_from_accepted",
    "expected_tokens_per_step",
    "predict",
    "predict_derated",
    "project_run",
    "run_derating",
    "speculative_speedup",
]

#: Share of device memory an engine may use for weights + KV cache (vLLM's default
#: ``gpu_memory_utilization``); the rest is activations, workspace and fragmentation.
DEFAULT_MEM_FRACTION = 0.9

#: Fraction of speed of light an engine reaches per phase on a GPU-class device, used when a
#: run is projected onto a device it was not measured on. "compiled": CUDA graphs / fused
#: kernels (TensorRT-LLM, vLLM): prefill 0.7 is llm-analysis's inference FLOP efficiency,
#: decode 0.6 the batch-1 MBU Databricks measured with TensorRT-LLM on H100 (60%) and A100
#: (55%). "eager": plain PyTorch / HF transformers: decode 0.2 (eager HF decode of a 7B model
#: on an A100 reaches about 20% MBU), prefill 0.35 (large GEMMs run near cuBLAS speed, but
#: attention and the unfused ops between them do not). A real engine may fall outside.
ENGINE_EFFICIENCY: dict[str, dict[str, float]] = {
    "compiled": {"prefill": 0.70, "decode": 0.60},
    "eager": {"prefill": 0.35, "decode": 0.20},
}

_COMPUTE_FALLBACK = {"fp8": ("bf16", "fp16"), "int8": ("bf16", "fp16"), "int4": ("bf16", "fp16")}


def _peak(device: DeviceSpec, dtype: str) -> tuple[float | None, str]:
    peak = device.peak_flops_for(dtype)
    if peak:
        return peak, dtype
    for alt in _COMPUTE_FALLBACK.get(dtype, ()):
        peak = device.peak_flops_for(alt)
        if peak:
            return peak, alt
    return None, dtype


def _kv_share(model: ModelSpec, tp: int, context_len: float) -> float:
    """Fraction of the KV cache each of ``tp`` devices holds (an MLA latent: all of it; a
    hybrid's KV and state weighed at ``context_len`` tokens)."""
    return kv_share_per_device(model, tp, context_len)


def predict(
    model: ModelSpec,
    device: DeviceSpec,
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
    efficiency: float | None = None,
    prefill_efficiency: float | None = None,
    decode_efficiency: float | None = None,
    tp: int = 1,
    cached_prefix_len: int = 0,
    mem_fraction: float = DEFAULT_MEM_FRACTION,
    prefill_overhead_s: float = 0.0,
    decode_overhead_s: float = 0.0,
    overhead: OverheadFit | None = None,
) -> Projection:
    """Predicted TTFT, TPOT, throughput, memory and bound of a static batch on ``device``.

    Args:
        batch: sequences decoded together.
        prompt_len: prompt tokens per sequence.
        output_len: generated tokens per sequence (the first comes from the prefill).
        efficiency: fraction of speed of light reached in both phases (default 1).
        prefill_efficiency: overrides ``efficiency`` for the prefill.
        decode_efficiency: overrides ``efficiency`` for decode.
        tp: tensor-parallel degree (devices the model is split over).
        cached_prefix_len: prompt tokens per sequence already in the KV cache (prompt
            caching): the prefill computes only the rest.
        mem_fraction: usable share of device memory for weights + KV cache.
        prefill_overhead_s: fixed time added to the prefill (launches, host work), s.
        decode_overhead_s: fixed time added to every decode step, s.
        overhead: a fitted host/overhead model (:class:`~perfscope.analysis.overhead.
            OverheadFit`): each step adds its per-layer, per-sequence, per-token and
            per-step terms for the step's shape (so a larger batch pays its per-row cost),
            on top of the fixed overheads above.

    Returns:
        A :class:`~perfscope.analysis.summary.Projection` record (``to_dict()`` is its
        JSON form): ``ttft_s``, ``tpot_s``, ``e2e_s`` (s), ``throughput_tok_s`` (output
        tokens/s of the batch), ``decode_tok_s`` (tokens/s), ``prefill``/``decode``
        (:class:`~perfscope.analysis.summary.ProjectionPhase`: FLOPs, bytes, intensity in
        FLOP/B, ``bound``, times in s), ``memory``
        (:class:`~perfscope.analysis.summary.ProjectionMemory`: weights, KV cache, capacity
        in bytes, ``fits``), ``max_batch``, ``speed_of_light`` and ``efficiency`` (fraction
        of speed of light per phase).
    """
    batch = max(int(batch), 1)
    prompt_len = max(int(prompt_len), 1)
    output_len = max(int(output_len), 1)
    tp = max(int(tp), 1)
    cached = min(max(int(cached_prefix_len), 0), prompt_len - 1)
    eff_p = prefill_efficiency if prefill_efficiency is not None else efficiency
    eff_d = decode_efficiency if decode_efficiency is not None else efficiency
    sol = (
        eff_p is None
        and eff_d is None
        and not prefill_overhead_s
        and not decode_overhead_s
        and overhead is None
    )
    eff_p = min(max(eff_p if eff_p is not None else 1.0, 1e-6), 1.0)
    eff_d = min(max(eff_d if eff_d is not None else 1.0, 1e-6), 1.0)

    peak, compute_dtype = _peak(device, model.act_dtype)
    w_bytes = weight_bytes(model) / tp
    seq_tokens = prompt_len + output_len
    # A sequence never holds more than the model's context, and sliding-window/chunked
    # layers hold at most their span: the per-sequence KV cache, not tokens × per-token.
    max_pos = model.max_position_embeddings
    kv_tokens = min(seq_tokens, max_pos) if max_pos else seq_tokens
    kv_share = _kv_share(model, tp, kv_tokens)
    per_seq_kv = kv_cache_bytes_per_sequence(model, kv_tokens) * kv_share
    kv_tok = per_seq_kv / kv_tokens
    kv_total = batch * per_seq_kv
    working_set = w_bytes + kv_total
    bw, level, _fits_cache = memory_ceiling(device, working_set)

    def per_device(arrays: Mapping[str, Any]) -> tuple[Any, Any]:
        flops = arrays["flops"] / tp
        nbytes = (arrays["bytes_weights"] + arrays["bytes_activations"]) / tp + (
            arrays["bytes_kv_read"] + arrays["bytes_kv_write"]
        ) * kv_share
        return flops, nbytes

    def roof(flops: Any, nbytes: Any) -> Any:
        t_c = flops / peak if peak else 0.0
        return np.maximum(t_c, nbytes / bw)

    new_p = prompt_len - cached
    pre = step_costs(model, batch, batch * new_p, batch * cached)
    pf, pb = per_device(pre)
    t_prefill_sol = float(roof(pf, pb))
    host_p = float(overhead.host_time(model.n_layers, batch, batch * new_p)) if overhead else 0.0
    host_d = float(overhead.host_time(model.n_layers, batch, batch)) if overhead else 0.0
    ttft = t_prefill_sol / eff_p + prefill_overhead_s + host_p

    steps = output_len - 1
    ctx = prompt_len + np.arange(max(steps, 1), dtype=np.float64)
    dec = step_costs(model, batch, batch, batch * ctx)
    df, db = per_device(dec)
    t_steps = roof(df, db)
    if steps > 0:
        t_decode_sol = float(np.sum(t_steps))
        tpot = t_decode_sol / steps / eff_d + decode_overhead_s + host_d
        dec_f, dec_b = float(np.sum(df)), float(np.sum(db))
    else:
        t_decode_sol, dec_f, dec_b = 0.0, float(df[0]), float(db[0])
        tpot = float(t_steps[0]) / eff_d + decode_overhead_s + host_d
    e2e = ttft + steps * tpot
    ridge = peak / bw if peak else None

    def bound(f: float, b: float) -> str:
        if ridge is None:
            return "memory-bound"
        return "compute-bound" if f / b > ridge else "memory-bound"

    # What the driver exposes (81559 MiB on an "80 GB" H100) when known, else the datasheet.
    cap_raw = device.mem_usable_bytes or device.mem_bytes
    capacity = cap_raw * mem_fraction if cap_raw else None
    max_batch = max(int((capacity - w_bytes) // per_seq_kv), 0) if capacity is not None else None
    notes = []
    if sol:
        notes.append("at speed of light (100% of the roofline); real engines reach less")
    if compute_dtype != model.act_dtype:
        notes.append(
            f"no {model.act_dtype} peak for {device.key}: compute at {compute_dtype} "
            "(weights dequantised)"
        )
    if peak is None:
        notes.append(f"no {model.act_dtype} compute peak for {device.key}: memory time only")
    if level == "cache":
        notes.append("working set fits in the last-level cache: cache bandwidth used")
    if tp > 1:
        notes.append(f"tensor parallel over {tp} devices; all-reduce time not included")
    if model.max_position_embeddings and seq_tokens > model.max_position_embeddings:
        notes.append(
            f"prompt + output ({seq_tokens}) exceeds the model's context "
            f"({model.max_position_embeddings}): KV cache counted at the context"
        )
    if device.mem_usable_bytes and capacity is not None:
        notes.append(
            "memory: the device's usable capacity (as the driver reports), not the datasheet figure"
        )
    fits = None if capacity is None else (w_bytes + kv_total) <= capacity
    if fits is False:
        notes.append("does not fit in device memory")

    return Projection(
        device=ProjectionDevice(key=device.key, name=device.name, source=device.source),
        model=model.name,
        dtypes={
            "weights": model.weight_dtype,
            "kv_cache": model.kv_dtype,
            "compute": compute_dtype,
        },
        workload=ProjectionWorkload(
            batch=batch,
            prompt_len=prompt_len,
            output_len=output_len,
            cached_prefix_len=cached,
            tp=tp,
        ),
        speed_of_light=sol,
        efficiency={"prefill": eff_p, "decode": eff_d},
        overhead_s={
            "prefill": prefill_overhead_s + host_p,
            "decode_per_step": decode_overhead_s + host_d,
        },
        overhead_fit=overhead.to_dict() if overhead is not None else None,
        ceilings=ProjectionCeilings(
            peak_flops=peak,
            mem_bw_bytes_s=bw,
            memory_level=level,
            ridge_point=ridge,
            source=device.source,
        ),
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        throughput_tok_s=batch * output_len / e2e if e2e > 0 else None,
        decode_tok_s=batch / tpot if tpot > 0 else None,
        prefill=ProjectionPhase(
            flops=float(pf),
            bytes=float(pb),
            intensity=float(pf / pb),
            bound=bound(float(pf), float(pb)),
            sol_time_s=t_prefill_sol,
            time_s=ttft,
        ),
        decode=ProjectionPhase(
            steps=steps,
            flops=dec_f,
            bytes=dec_b,
            intensity=dec_f / dec_b if dec_b else math.inf,
            bound=bound(dec_f, dec_b),
            sol_time_s=t_decode_sol,
            time_s=steps * tpot,
        ),
        memory=ProjectionMemory(
            weights_bytes=w_bytes,
            kv_cache_bytes=kv_total,
            # a state-space model holds a recurrent state, constant in context, not a KV
            # cache: kv_cache_bytes is then that state (batch × state per sequence)
            cache_kind="recurrent state"
            if not model.n_attention_layers
            else ("KV cache and recurrent state" if model.state_bytes_per_seq else "KV cache"),
            kv_bytes_per_token=kv_tok,
            kv_tokens_per_sequence=kv_tokens,
            total_bytes=w_bytes + kv_total,
            capacity_bytes=capacity,
            device_bytes=device.mem_bytes,
            usable_bytes=device.mem_usable_bytes,
            mem_fraction=mem_fraction,
            fits=fits,
        ),
        max_batch=max_batch,
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class Derating:
    """How a measured run falls short of speed of light (:func:`run_derating`), in
    :func:`predict`'s terms; a field left ``None`` is not derated (speed of light).

    Attributes:
        prefill_efficiency: fraction of speed of light the prefill reaches, 0..1.
        prefill_overhead_s: fixed time added to the prefill, s.
        decode_efficiency: fraction of speed of light each decode step reaches, 0..1.
        decode_overhead_s: fixed time added to every decode step, s.
        overhead: the run's fitted cost model (its host terms per layer, sequence, token
            and step), when the derating is that fit.
    """

    prefill_efficiency: float | None = None
    prefill_overhead_s: float | None = None
    decode_efficiency: float | None = None
    decode_overhead_s: float | None = None
    overhead: OverheadFit | None = None

    @property
    def at_speed_of_light(self) -> bool:
        """Whether nothing is derated (the run had no phase to measure)."""
        return all(getattr(self, f.name) is None for f in fields(self))

    def terms(self) -> dict[str, float]:
        """The numeric terms that are set, by keyword name (``decode_efficiency``,
        ``decode_overhead_s`` ...), prefill's before decode's."""
        out: dict[str, float] = {}
        for name in ("prefill", "decode"):
            eff = getattr(self, f"{name}_efficiency")
            over = getattr(self, f"{name}_overhead_s")
            if eff is not None:
                out[f"{name}_efficiency"] = float(eff)
            if over is not None:
                out[f"{name}_overhead_s"] = float(over)
        return out


def run_derating(roofline: Roofline, fit: OverheadFit | None = None) -> Derating:
    """How a measured run falls short of speed of light (:class:`Derating`, the terms of
    :func:`predict`; :func:`predict_derated` applies it).

    With ``fit`` (:func:`perfscope.analysis.overhead.fit_overhead` of the run's steps) the
    run is the fitted cost model: the roofline time scaled by ``roof_scale`` plus host terms
    per layer, per sequence, per token and per step, so a change of batch or work moves the
    parts that scale with it. Without a fit (only the roofline's per-phase aggregates, which
    cannot tell the terms apart), the rule below.

    A phase near a roof (compute- or memory-bound) keeps its measured efficiency as a
    multiplier on the roofline time. An overhead-bound phase is modelled as speed of light
    plus its measured per-step excess (``time_per_step - sol_per_step``), which stays
    fixed when the work per step changes: launches and host work do not scale with bytes.
    Phases the run lacks stay at speed of light.
    """
    if fit is not None:
        fitted_eff = 1.0 / fit.roof_scale if fit.roof_scale > 1.0 else 1.0
        return Derating(prefill_efficiency=fitted_eff, decode_efficiency=fitted_eff, overhead=fit)
    terms: dict[str, float] = {}
    for name in ("prefill", "decode"):
        ph = roofline.phases.get(name)
        eff = ph.efficiency if ph is not None else None
        if ph is None or eff is None:
            continue
        if ph.verdict == "overhead-bound" and ph.steps:
            excess = ((ph.time_s or 0.0) - (ph.sol_time_s or 0.0)) / ph.steps
            terms[f"{name}_efficiency"] = 1.0
            terms[f"{name}_overhead_s"] = max(float(excess), 0.0)
        else:
            terms[f"{name}_efficiency"] = min(float(eff), 1.0)
    return Derating(
        prefill_efficiency=terms.get("prefill_efficiency"),
        prefill_overhead_s=terms.get("prefill_overhead_s"),
        decode_efficiency=terms.get("decode_efficiency"),
        decode_overhead_s=terms.get("decode_overhead_s"),
    )


def predict_derated(
    model: ModelSpec, device: DeviceSpec, derate: Derating, **shape: Any
) -> Projection:
    """:func:`predict` at a run's derating (:func:`run_derating`: efficiencies, per-phase
    overhead in s, and the fitted overhead model when there is one)."""
    return predict(
        model,
        device,
        **shape,
        prefill_efficiency=derate.prefill_efficiency,
        decode_efficiency=derate.decode_efficiency,
        prefill_overhead_s=derate.prefill_overhead_s or 0.0,
        decode_overhead_s=derate.decode_overhead_s or 0.0,
        overhead=derate.overhead,
    )


def _basis(derate: Derating) -> str:
    fit = derate.overhead
    if fit is not None:
        return "the fitted cost model: " + str(fit.describe())
    terms = derate.terms()
    parts = []
    for name in ("prefill", "decode"):
        if f"{name}_overhead_s" in terms:
            parts.append(
                f"{name} at speed of light + the run's "
                f"{format_seconds(terms[name + '_overhead_s'])} overhead per step"
            )
        elif f"{name}_efficiency" in terms:
            parts.append(
                f"{name} at the run's {fmt_pct(terms[name + '_efficiency'])} of speed of light"
            )
        else:
            parts.append(f"{name} at speed of light")
    return "; ".join(parts)


def _same_class(measured: str | None, target: DeviceSpec) -> bool:
    return measured is not None and measured == target.key


def _headline(p: Projection) -> JsonObject:
    """One end of a projection's ``range``: TTFT and TPOT (s), throughput (tokens/s) and the
    per-phase efficiency (fraction of speed of light) it assumed."""
    return {
        "ttft_s": p.ttft_s,
        "tpot_s": p.tpot_s,
        "throughput_tok_s": p.throughput_tok_s,
        "efficiency": {**p.efficiency},
    }


def project_run(
    roofline: Roofline,
    model: ModelSpec,
    workload: Mapping[str, Any],
    devices: list[DeviceSpec],
    *,
    measured_on: str | None = None,
    fit: OverheadFit | None = None,
) -> list[Projection]:
    """The measured run's workload on other devices.

    The batch is the run's mean decode batch (else the configured ``batch_size``), the
    lengths are the workload's mean prompt and output tokens. Device time is each target's
    speed of light derated by a stated efficiency:

    - a target of the device class the run was measured on (``measured_on``, its key): the
      run's own per-phase efficiency (:func:`run_derating`);
    - any other device: the range :data:`ENGINE_EFFICIENCY`, compiled engine (optimistic)
      to eager PyTorch (conservative). The headline numbers are the eager end; ``range``
      holds ``speed_of_light``, ``compiled`` and ``eager`` predictions.

    The run's measured host overhead is never carried to another device. With ``fit`` (the
    run's fitted cost model) the own-device projection is that model, and another device
    gets only the parts that move with the device (:meth:`~perfscope.analysis.overhead.
    OverheadFit.on_device`). On a GPU target the eager end also pays the device's kernel
    launches per step (:func:`~perfscope.analysis.overhead.launch_time`, from the device
    file's ``kernel_launch_s``) and the compiled end one launch per step (a CUDA graph).
    Each entry is a :func:`predict` record with ``basis`` (the assumption in words) and
    ``assumption`` (``measured`` or ``engine range``).
    """
    dec = roofline.phases.get("decode")
    batch = (dec.batch_size_mean if dec is not None else None) or workload.get("batch_size") or 1
    batch = max(round(float(batch)), 1)
    prompt_len = max(round(float(workload.get("prompt_tokens_mean") or 1)), 1)
    output_len = max(round(float(workload.get("output_tokens_mean") or 1)), 1)
    shape: Mapping[str, Any] = {"batch": batch, "prompt_len": prompt_len, "output_len": output_len}
    derate = run_derating(roofline, fit)
    out: list[Projection] = []
    for dev in devices:
        if _same_class(measured_on, dev):
            pred = predict_derated(model, dev, derate, **shape)
            out.append(
                replace(
                    pred,
                    speed_of_light=derate.at_speed_of_light,
                    assumption="measured",
                    basis="same device class as the run: " + _basis(derate),
                )
            )
            continue
        sol = predict(model, dev, **shape)
        rng: JsonObject = {"speed_of_light": _headline(sol)}
        preds: dict[str, Projection] = {}
        carried = fit.on_device(dev, model, launches=False) if fit is not None else None
        launches = {"eager": launch_time(dev, model), "compiled": dev.kernel_launch_s or 0.0}
        for kind, eff in ENGINE_EFFICIENCY.items():
            preds[kind] = predict(
                model,
                dev,
                **shape,
                prefill_efficiency=eff["prefill"],
                decode_efficiency=eff["decode"],
                prefill_overhead_s=launches[kind],
                decode_overhead_s=launches[kind],
                overhead=_host_only(carried),
            )
            rng[kind] = _headline(preds[kind])
        pred = preds["eager"]
        notes = list(pred.notes)
        if launches["eager"]:
            notes.append(
                f"kernel launches priced: {KERNELS_PER_LAYER} per layer x {model.n_layers} "
                f"layers x {format_seconds(dev.kernel_launch_s or 0.0)} = "
                f"{format_seconds(launches['eager'])} per eager step, one launch per "
                "compiled (CUDA graph) step"
            )
        elif (sol.tpot_s or 0.0) < 1e-3:
            notes.append(
                "under 1 ms per step at speed of light: host time per step can dominate on a "
                f"real engine ({dev.key} gives no kernel-launch cost to price it)"
            )
        if carried is not None:
            notes.extend(carried.notes)
        c, e = ENGINE_EFFICIENCY["compiled"], ENGINE_EFFICIENCY["eager"]
        out.append(
            replace(
                pred,
                notes=tuple(notes),
                speed_of_light=False,
                range=rng,
                assumption="engine range",
                basis=(
                    "each device's speed of light at a compiled engine's efficiency (prefill "
                    f"{fmt_pct(c['prefill'])}, decode {fmt_pct(c['decode'])}) to eager "
                    f"PyTorch's (prefill {fmt_pct(e['prefill'])}, decode "
                    f"{fmt_pct(e['decode'])}); this run's own host overhead is not carried to "
                    "another device"
                ),
            )
        )
    return out


def _host_only(fit: OverheadFit | None) -> OverheadFit | None:
    """The host terms of a carried fit without its launches (priced apart per engine end)."""
    if (
        fit is None
        or fit.platform != "gpu"
        or not any((fit.per_layer_s, fit.per_sequence_s, fit.per_token_s, fit.per_step_s))
    ):
        return None
    return fit


# ---------------------------------------------------------------------- speculative decoding

#: Per-token acceptance probability assumed before a speculative run has measured one: within
#: the range Leviathan et al. (2023) report for small drafts of the same model family on real
#: tasks (roughly 0.5 to 0.8); a draft trained on other data accepts far less. A stated
#: assumption, replaced by the measured value once a run has one.
ASSUMED_ACCEPTANCE = 0.7


def speculative_speedup(alpha: float, k: int, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """Expected speedup of speculative decoding over plain decoding of the target.

    ``(1 - alpha^(K+1)) / ((1 - alpha) (c K + 1))``: Leviathan, Kalman and Matias, "Fast
    Inference from Transformers via Speculative Decoding" (ICML 2023), Theorem 3.8. The
    numerator over ``1 - alpha`` is the expected tokens a step emits (accepted draft tokens
    plus the target's own) when each draft token is accepted independently with probability
    ``alpha``; the denominator is the step's cost in target forward passes: ``K`` draft passes
    of ``c`` each (``cost_ratio``: one draft pass's time over one target pass's) and one
    target pass, which assumes verifying ``K + 1`` positions costs what one position does
    (true while the target is memory- or overhead-bound); ``verify_cost`` replaces that 1 by
    the measured (or modelled) time of a verify pass over a plain target pass.

    Args:
        alpha: per-token acceptance probability, 0..1.
        k: draft tokens per step (``num_speculative_tokens``), >= 1.
        cost_ratio: ``c``, draft pass time / target pass time, >= 0.
        verify_cost: verify pass time / plain target decode pass time (1: the formula's).
    """
    if not 0.0 <= alpha <= 1.0 or k < 1 or cost_ratio < 0 or verify_cost <= 0:
        raise ValueError(
            f"need 0 <= alpha <= 1, k >= 1, c >= 0, verify_cost > 0; got {alpha}, {k}, "
            f"{cost_ratio}, {verify_cost}"
        )
    return expected_tokens_per_step(alpha, k) / (cost_ratio * k + verify_cost)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens one speculative step emits on average: ``(1 - alpha^(K+1)) / (1 - alpha)``
    (``K + 1`` when every draft token is accepted)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_accepted(mean_accepted: float, k: int) -> float:
    """The per-token acceptance probability ``alpha`` whose expected accepted draft tokens
    per step, ``sum_{i=1..K} alpha^i``, equals the measured ``mean_accepted`` (0..K);
    found by bisection (the sum grows with ``alpha``)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    target = min(max(mean_accepted, 0.0), float(k))
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if sum(mid**i for i in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0
