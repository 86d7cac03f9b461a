"""Ranked suggestions from the verdicts and the cost model, each with a projected gain.

Every suggestion is a standard technique with the reason it applies to this run and a gain
computed by re-running the what-if model (:func:`perfscope.analysis.whatif.predict`) on the
run's workload with the technique applied. A suggestion never comes without its number;
assumptions the number rests on (acceptance rate, cached share, target efficiency) are
stated in ``assumptions``.

Gains stay within physics:

- each gain is a range (``projected_gain.low`` .. ``high``; ``value`` is ``high``) between
  two stated assumptions: the run's per-step overhead stays fixed (low) or the run's
  fraction of speed of light carries over (high); for overhead cuts, the efficiency
  range a tuned engine of the platform reaches (:data:`TUNED_EFFICIENCY`);
- every gain is capped by the roofline: no technique makes a phase faster than its speed
  of light with the technique applied (``projected_gain.bound``, the measured time over
  that speed-of-light time);
- techniques are gated by platform: CUDA graphs only on NVIDIA GPUs; on a CPU the overhead
  levers are threads, ``torch.compile`` and batching.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from perfscope.analysis.calibration import (
    Calibration,
    CalibrationEntry,
    calibration_for,
    contradicting_entry,
    load_calibration,
    machine_of_device,
    threads_evidence,
)
from perfscope.analysis.catalogue import format_bytes, format_number, format_seconds
from perfscope.analysis.costmodel import step_cost, weight_bytes
from perfscope.analysis.modelspec import ModelSpec, weight_bytes_per_param
from perfscope.analysis.roofline import fmt_pct
from perfscope.analysis.summary import (
    Advice,
    AdviceCalibration,
    Gain,
    PhaseRoofline,
    Projection,
    Roofline,
)
from perfscope.analysis.whatif import (
    DEFAULT_MEM_FRACTION,
    predict,
    predict_derated,
    run_derating,
)

if TYPE_CHECKING:
    from perfscope.hwdb.spec import DeviceSpec

__all__ = ["advise", "batch_target"]

#: Share of the prompt assumed to be a shared, cacheable prefix for the prompt-caching gain.
PROMPT_CACHE_SHARE = 0.5
#: Speculative decoding: draft length and per-token acceptance rate assumed.
SPEC_DRAFT_TOKENS = 4
SPEC_ACCEPTANCE = 0.7
#: Draft model cost per drafted token as a fraction of one target decode step.
SPEC_DRAFT_COST = 0.05
#: Fraction of speed of light a tuned engine reaches once per-step overhead is cut, per
#: platform and phase, as (low, high). GPUs: eager PyTorch to compiled engines (the
#: documented range of :data:`perfscope.analysis.whatif.ENGINE_EFFICIENCY`). CPUs: an
#: assumption (no published ceiling study at hand): tuned CPU inference with oneDNN/compiled
#: graphs reaches about 10-40% of the roofline in prefill and 5-30% in decode.
TUNED_EFFICIENCY: dict[str, dict[str, tuple[float, float]]] = {
    "gpu": {"prefill": (0.35, 0.70), "decode": (0.20, 0.60)},
    "cpu": {"prefill": (0.10, 0.40), "decode": (0.05, 0.30)},
}


def _gain(value: float, unit: str, metric: str) -> Gain:
    """A gain of ``value`` (rounded to 3 places) in ``unit`` of ``metric``, before its range."""
    return Gain(value=round(float(value), 3), unit=unit, metric=metric)


@dataclass(kw_only=True)
class _Draft:
    """One suggestion while :func:`advise` ranges, rewords and ranks it (then an
    :class:`~perfscope.analysis.summary.Advice` record).

    Attributes:
        projected_gain: the gain as first projected (``low``/``high``/``bound`` filled in
            by :func:`_bound_gains`).
        score: what ranks it (the capped high gain; a contradicted suggestion's goes below 0).
        kw: the model and :func:`predict` keyword arguments (ints: ``batch``, ``tp``,
            ``cached_prefix_len``) the technique amounts to, to re-run it at speed of light and
            at the run's fraction of it; ``None`` when the gain is not a re-run.
        gain_range: ``(low, high, bound)`` given directly (gains not from a re-run).
        threads: a stored threads study that measured more threads slower here.
        contradicted_by: the stored study entry that measured the technique worse here.
    """

    technique: str
    why: str
    projected_gain: Gain
    assumptions: str
    score: float
    kw: tuple[ModelSpec, Mapping[str, int]] | None = None
    gain_range: tuple[float, float, float] | None = None
    threads: CalibrationEntry | None = None
    contradicted_by: CalibrationEntry | None = None


def _platform(device: DeviceSpec) -> str:
    """``cuda`` (NVIDIA GPU), ``gpu`` (other accelerators) or ``cpu`` (CPUs and SoCs run
    on their CPU cores)."""
    if device.kind == "gpu":
        return "cuda" if "nvidia" in (device.vendor or "").lower() else "gpu"
    if device.kind in ("tpu", "npu"):
        return "gpu"
    return "cpu"


def _overhead_levers(platform: str, threads_contradicted: bool = False) -> str:
    """The levers that cut per-step overhead on ``platform``; on a CPU, setting threads to
    the physical cores only where no stored study on this machine class measured more
    threads to be slower."""
    if platform == "cuda":
        return "CUDA graphs, torch.compile, fused kernels"
    if platform == "gpu":
        return "graph compilation, fused kernels"
    if threads_contradicted:
        return "torch.compile, fused CPU kernels"
    return "torch.set_num_threads to the physical cores, torch.compile, fused CPU kernels"


def batch_target(knee: int, current: int, memory_limit: int | None) -> tuple[int, str]:
    """The batch the batching suggestion projects, and the rule that chose it, in words.

    ``target = min(max(knee, 2 x current), memory_limit)``: the ridge knee (the batch at
    which decode's intensity reaches the ridge), at least twice the current batch, never
    beyond what fits in memory. The words quote the same three numbers and name the term
    that decided, so the text cannot disagree with the arithmetic.
    """
    want = max(knee, 2 * current)
    cap = want if memory_limit is None else max(memory_limit, 1)
    target = min(want, cap)
    terms = f"min(max(ridge knee {knee}, 2 x current batch {current}), " + (
        "memory limit unknown)" if memory_limit is None else f"memory limit {memory_limit})"
    )
    if memory_limit is not None and target == memory_limit and memory_limit < want:
        why = "the memory limit"
    elif knee >= 2 * current:
        why = "the ridge knee"
    else:
        why = "twice the current batch (the ridge knee is below it)"
    return target, f"batch {target} = {terms}: set by {why}"


def advise(
    roofline: Roofline,
    model: ModelSpec,
    device: DeviceSpec,
    workload: Mapping[str, Any],
    *,
    engine: str | None = None,
    calibration: Sequence[CalibrationEntry] | None = None,
) -> list[Advice]:
    """Suggestions for this run, best first.

    Args:
        roofline: the run's :func:`~perfscope.analysis.roofline.roofline_section` record.
        model: the engine's model.
        device: the device the run used.
        workload: ``prompt_tokens_mean``, ``output_tokens_mean``, ``batch_size``
            (configured maximum batch), ``requests``.
        engine: the engine kind (``reference``, ``hf``...), part of the machine class the
            calibration is looked up for (``None``: any engine on this hardware).
        calibration: entries to judge the advice by (default: the packaged file).

    Returns:
        :class:`~perfscope.analysis.summary.Advice` records (the summary's ``advice``;
        ``to_dict()`` is the JSON form): ``technique``, ``why``, ``projected_gain`` (a
        :class:`~perfscope.analysis.summary.Gain`: ``value``, ``unit``, ``metric``,
        ``low``, ``high``, ``bound``), ``assumptions``, ``rank`` and ``calibration``, ranked
        by projected gain (a "does not fit" finding first). ``calibration``
        (:class:`~perfscope.analysis.summary.AdviceCalibration`) says how far the studies
        measured such projections to be off on this class of hardware, or that they were
        not calibrated there; the projected gain is left as projected. A suggestion a stored
        study on this machine class measured to make things worse (significantly) is
        reworded with that evidence, carries the study's entry in ``contradicted_by`` and is
        ranked last.
    """
    machine = machine_of_device(device, engine)
    table = load_calibration() if calibration is None else tuple(calibration)
    phases = roofline.phases
    has_dec, has_pre = "decode" in phases, "prefill" in phases
    # A phase the run lacks reads as an empty record (no numbers, no verdict).
    dec = phases.get("decode") or PhaseRoofline()
    pre = phases.get("prefill") or PhaseRoofline()
    lat = roofline.latency
    s_len = max(round(float(workload.get("prompt_tokens_mean") or 1)), 1)
    t_len = max(round(float(workload.get("output_tokens_mean") or 1)), 1)
    b_cur = max(round(float(dec.batch_size_mean or workload.get("batch_size") or 1)), 1)
    b_cfg = int(workload.get("batch_size") or b_cur)
    derate = run_derating(roofline)
    eff_d = derate.decode_efficiency if derate.decode_efficiency is not None else 1.0

    def run(m: ModelSpec = model, **kw: int) -> Projection:
        """The technique at the run's derating (its per-step overhead stays fixed)."""
        shape = {"batch": b_cur, "prompt_len": s_len, "output_len": t_len, **kw}
        return predict_derated(m, device, derate, **shape)

    # The run's fraction of speed of light per phase (capped at 1), for ``scaled``.
    effs: dict[str, float | None] = {}
    for name in ("prefill", "decode"):
        ph = phases.get(name)
        eff = ph.efficiency if ph is not None else None
        effs[name] = min(float(eff), 1.0) if eff else None

    def at(
        m: ModelSpec, kw: Mapping[str, int], prefill: float | None, decode: float | None
    ) -> Projection:
        return predict(
            m,
            device,
            batch=kw.get("batch", b_cur),
            prompt_len=s_len,
            output_len=t_len,
            tp=kw.get("tp", 1),
            cached_prefix_len=kw.get("cached_prefix_len", 0),
            prefill_efficiency=prefill,
            decode_efficiency=decode,
        )

    def sol(m: ModelSpec = model, **kw: int) -> Projection:
        """The technique at speed of light."""
        return at(m, kw, None, None)

    def scaled(m: ModelSpec = model, **kw: int) -> Projection:
        """The run's fraction of speed of light carried over (time scales with work)."""
        return at(m, kw, effs["prefill"], effs["decode"])

    platform = _platform(device)
    base = run()
    base_scaled = scaled()
    out: list[_Draft] = []
    dec_verdict = dec.verdict
    dec_memory = dec_verdict == "memory-bound" or (
        dec_verdict == "overhead-bound" and dec.roof == "memory"
    )
    ridge = base.ceilings.ridge_point
    tpot0 = base["tpot_s"]

    # Model does not fit: tensor parallelism first.
    mem = base["memory"]
    if mem["capacity_bytes"] is not None and weight_bytes(model) > mem["capacity_bytes"]:
        tp = 2
        while tp < 64 and run(tp=tp)["memory"]["weights_bytes"] > mem["capacity_bytes"]:
            tp *= 2
        p = run(tp=tp)
        out.append(
            _Draft(
                technique="tensor parallelism",
                why=(
                    f"the weights ({format_bytes(weight_bytes(model))}) exceed "
                    f"{fmt_pct(DEFAULT_MEM_FRACTION)} of {device.name}'s memory; split over "
                    f"{tp} devices each holds {format_bytes(p['memory']['weights_bytes'])} "
                    f"and TPOT would be {format_seconds(p['tpot_s'])}"
                ),
                projected_gain=_gain(tp, "devices needed to fit", "devices"),
                assumptions="all-reduce time not included",
                score=math.inf,
            )
        )

    # Larger batches / continuous batching.
    if has_dec and dec_verdict in ("memory-bound", "overhead-bound") and ridge:
        knee = max(int(ridge * model.weight_bytes_per_param / 2), 2)
        target, rule = batch_target(knee, b_cur, base["max_batch"])
        if target >= 2 * b_cur or (target > b_cur and b_cfg > 1.3 * b_cur):
            p = run(batch=target)
            gain = p["decode_tok_s"] / base["decode_tok_s"]
            why = f"decode is {dec_verdict} at a mean batch of " + format_number(
                dec.batch_size_mean or 0
            )
            why += ": " + _intensity_reason(dec, ridge, base["memory"]["weights_bytes"], b_cur)
            why += (
                f"; at batch {target} decode throughput rises from "
                f"{format_number(base['decode_tok_s'], 4)} to "
                f"{format_number(p['decode_tok_s'], 4)} tok/s "
                f"(TPOT {format_seconds(tpot0)} → {format_seconds(p['tpot_s'])})"
            )
            if b_cfg > 1.3 * b_cur:
                why += (
                    f"; the engine was allowed {b_cfg} but averaged {b_cur}: continuous "
                    "batching keeps the slots full"
                )
            out.append(
                _Draft(
                    technique="larger batches / continuous batching",
                    why=why,
                    projected_gain=_gain(gain, "x decode throughput", "decode_tok_s"),
                    assumptions=(
                        f"{rule}; low: the run's per-step overhead stays fixed; high: its "
                        "fraction of speed of light carries over"
                    ),
                    score=gain,
                    kw=(model, {"batch": target}),
                )
            )

    # Weight quantisation.
    if has_dec and dec_memory:
        share = (dec.bytes_weights or 0.0) / dec.bytes if dec.bytes else 0.0
        best = 1.0
        for wd, label in (
            ("int8", "int8 weights (W8A16)"),
            ("int4", "int4 weights (W4A16, GPTQ/AWQ, group 128)"),
        ):
            if model.weight_bytes_per_param <= weight_bytes_per_param(wd) + 1e-9:
                continue
            q = replace(
                model,
                weight_dtype=wd,
                weight_bytes_per_param=weight_bytes_per_param(wd),
            )
            p = run(q)
            gain = tpot0 / p["tpot_s"]
            # int4 only when it beats int8 (a run that turns compute-bound gains no more)
            if gain < 1.05 * best:
                continue
            best = gain
            out.append(
                _Draft(
                    technique=label,
                    why=(
                        f"decode is memory-bound and weights are {fmt_pct(share)} of the bytes "
                        f"each step moves; at {format_number(weight_bytes_per_param(wd))} B/param "
                        f"TPOT "
                        f"drops from {format_seconds(tpot0)} to {format_seconds(p['tpot_s'])}"
                    ),
                    projected_gain=_gain(gain, "x lower TPOT", "tpot_s"),
                    assumptions=(
                        "low: the run's per-step overhead stays fixed; high: its fraction of "
                        "speed of light carries over; dequantisation cost and accuracy loss "
                        "not modelled"
                    ),
                    score=gain,
                    kw=(q, {}),
                )
            )

    # KV-dominated decode: fp8 KV cache, GQA/MQA.
    if has_dec and dec_memory and dec.bytes:
        kv_share = ((dec.bytes_kv_read or 0.0) + (dec.bytes_kv_write or 0.0)) / dec.bytes
        if kv_share >= 0.2:
            if model.kv_bytes_per_element > 1.0:
                q = model.with_dtypes(kv_dtype="fp8")
                p = run(q)
                gain = tpot0 / p["tpot_s"]
                out.append(
                    _Draft(
                        technique="fp8 KV cache",
                        why=(
                            f"the KV cache is {fmt_pct(kv_share)} of decode bytes; fp8 halves it: "
                            f"TPOT {format_seconds(tpot0)} → {format_seconds(p['tpot_s'])} and the "
                            f"largest batch that fits {base['max_batch']} → {p['max_batch']}"
                        ),
                        projected_gain=_gain(gain, "x lower TPOT", "tpot_s"),
                        assumptions=(
                            "low: the run's per-step overhead stays fixed; high: its fraction "
                            "of speed of light carries over"
                        ),
                        score=gain,
                        kw=(q, {}),
                    )
                )
            target_kv = max(model.n_heads // 8, 1)
            if model.n_kv_heads > target_kv:
                q = replace(model, n_kv_heads=target_kv)
                p = run(q)
                gain = tpot0 / p["tpot_s"]
                kind = "MQA" if target_kv == 1 else f"GQA with {target_kv} KV heads"
                out.append(
                    _Draft(
                        technique="GQA/MQA (a model with fewer KV heads)",
                        why=(
                            f"the KV cache is {fmt_pct(kv_share)} of decode bytes with "
                            f"{model.n_kv_heads} KV heads; {kind} would cut KV bytes "
                            f"{format_number(model.n_kv_heads / target_kv)}x: TPOT "
                            f"{format_seconds(tpot0)} → "
                            f"{format_seconds(p['tpot_s'])}"
                        ),
                        projected_gain=_gain(gain, "x lower TPOT", "tpot_s"),
                        assumptions="a model trained (or uptrained) with fewer KV heads",
                        score=gain,
                        kw=(q, {}),
                    )
                )

    # Prompt caching: TTFT-heavy requests.
    if has_pre and s_len >= 64:
        prefill_share = base["ttft_s"] / base["e2e_s"] if base["e2e_s"] else 0.0
        if prefill_share >= 0.2:
            cached = int(s_len * PROMPT_CACHE_SHARE)
            p = run(cached_prefix_len=cached)
            gain = base["ttft_s"] / p["ttft_s"]
            if gain >= 1.1:
                out.append(
                    _Draft(
                        technique="prompt (prefix) caching",
                        why=(
                            f"prefill is {fmt_pct(prefill_share)} of each request's latency "
                            f"({s_len}-token prompts); with {fmt_pct(PROMPT_CACHE_SHARE)} of "
                            f"the prompt shared and cached, TTFT {format_seconds(base['ttft_s'])} "
                            f"→ "
                            f"{format_seconds(p['ttft_s'])}"
                        ),
                        projected_gain=_gain(gain, "x lower TTFT", "ttft_s"),
                        assumptions=(
                            f"{fmt_pct(PROMPT_CACHE_SHARE)} of each prompt is a prefix shared "
                            "with earlier requests"
                        ),
                        score=gain,
                        kw=(model, {"cached_prefix_len": cached}),
                    )
                )

    # Speculative decoding: memory-bound decode with spare compute.
    dec_intensity = dec.intensity if dec.intensity is not None else math.inf
    if has_dec and dec_memory and ridge and dec_intensity < ridge / 4:
        k, a = SPEC_DRAFT_TOKENS, SPEC_ACCEPTANCE
        tokens_per_step = (1 - a ** (k + 1)) / (1 - a)
        ctx = s_len + t_len // 2
        verify = step_cost(model, b_cur, b_cur * (k + 1), b_cur * ctx)
        peak = base.ceilings.peak_flops or math.inf
        bw = base.ceilings.mem_bw_bytes_s
        t_verify = max(verify.flops / peak, verify.bytes / bw) / eff_d + (
            derate.decode_overhead_s or 0.0
        )
        t_step = t_verify + k * SPEC_DRAFT_COST * tpot0
        gain = tokens_per_step * tpot0 / t_step
        t_verify_sol = max(verify.flops / peak, verify.bytes / bw)
        measured_step = dec.time_per_step_s or tpot0
        spec_bound = tokens_per_step * measured_step / max(t_verify_sol, 1e-12)
        if gain >= 1.1:
            out.append(
                _Draft(
                    technique="speculative decoding",
                    why=(
                        "decode is memory-bound with spare compute "
                        f"(MFU {fmt_pct(dec.mfu)}, "
                        f"intensity {format_number(dec_intensity)} ≪ ridge "
                        f"{format_number(ridge)}); verifying "
                        f"{k + 1} tokens per step costs {format_seconds(t_verify)} vs "
                        f"{format_seconds(tpot0)} for one and yields "
                        f"{format_number(tokens_per_step)} tokens"
                    ),
                    projected_gain=_gain(gain, "x decode throughput", "decode_tok_s"),
                    assumptions=(
                        f"{k} draft tokens, acceptance {fmt_pct(a)}, draft cost "
                        f"{fmt_pct(SPEC_DRAFT_COST)} of a target step per token; the run's "
                        "per-step overhead stays"
                    ),
                    score=gain,
                    gain_range=(gain, gain, spec_bound),
                )
            )

    # Prefill/decode disaggregation: prefill passes stall requests that are decoding.
    stall_share = lat.decode_stall_share
    stall = lat.prefill_stall_max_s
    if stall_share and stall_share >= 0.1 and has_dec and has_pre and not roofline.estimated:
        gain = 1.0 / max(1.0 - stall_share, 1e-3)
        out.append(
            _Draft(
                technique="prefill/decode disaggregation (or chunked prefill)",
                why=(
                    "prefill passes stall requests that are decoding: "
                    f"{fmt_pct(stall_share)} of all decode time is spent waiting for other "
                    f"requests' prefills (up to {format_seconds(stall or 0)} at a time, an "
                    "inter-token spike); prefill on "
                    "its own instance (or split into chunks mixed with decode) removes the stall"
                ),
                projected_gain=_gain(gain, "x lower TPOT", "tpot_s"),
                assumptions=(
                    "the stall time disappears from decode; a second device (or chunking) "
                    "absorbs the prefills"
                ),
                score=gain,
                gain_range=(gain, gain, gain),
            )
        )

    # Tensor parallelism for bandwidth-bound decode of a model that fits.
    if (
        has_dec
        and dec_memory
        and mem["capacity_bytes"] is not None
        and weight_bytes(model) <= mem["capacity_bytes"]
        and weight_bytes(model) >= 0.25 * mem["capacity_bytes"]
    ):
        p = run(tp=2)
        gain = tpot0 / p["tpot_s"]
        out.append(
            _Draft(
                technique="tensor parallelism",
                why=(
                    f"decode is bandwidth-bound and the weights take "
                    f"{fmt_pct(weight_bytes(model) / mem['capacity_bytes'])} of usable memory; "
                    f"over 2 devices each reads half: TPOT {format_seconds(tpot0)} → "
                    f"{format_seconds(p['tpot_s'])}, and room for batch {p['max_batch']} "
                    f"instead of {base['max_batch']}"
                ),
                projected_gain=_gain(gain, "x lower TPOT", "tpot_s"),
                assumptions="2 devices; all-reduce time not included",
                score=gain,
                kw=(model, {"tp": 2}),
            )
        )

    # Overhead-bound: cut per-step overhead (levers depend on the platform).
    tuned = TUNED_EFFICIENCY["cpu" if platform == "cpu" else "gpu"]
    for name, ph in (("decode", dec), ("prefill", pre)):
        if ph.verdict != "overhead-bound":
            continue
        eff = ph.efficiency
        lo_eff, hi_eff = tuned[name]
        if not eff or eff >= hi_eff:
            continue
        bound = 1.0 / eff  # the phase at speed of light
        high = min(hi_eff / eff, bound)
        low = min(max(lo_eff / eff, 1.0), high)
        per_step = ph.time_per_step_s or 0.0
        threads_bad = threads_evidence(machine, table) if platform == "cpu" else None
        levers = _overhead_levers(platform, threads_bad is not None)
        out.append(
            _Draft(
                technique=f"cut {name} per-step overhead ({levers})",
                why=(
                    f"{name} is overhead-bound: {format_seconds(per_step)} per step reaches only "
                    f"{fmt_pct(eff)} of speed of light (MFU {fmt_pct(ph.mfu)}, MBU "
                    f"{fmt_pct(ph.mbu)}); the time is "
                    + (
                        "launches and host work"
                        if platform != "cpu"
                        else "Python, threading and unfused operators on the host"
                    )
                ),
                projected_gain=_gain(high, f"x faster {name} steps", f"{name}_step_s"),
                assumptions=(
                    f"a tuned {'CPU' if platform == 'cpu' else 'GPU'} engine reaches "
                    f"{fmt_pct(lo_eff)}-{fmt_pct(hi_eff)} of speed of light in {name}; never "
                    f"beyond speed of light ({format_number(bound)}x)"
                ),
                score=high,
                gain_range=(low, high, bound),
                threads=threads_bad,
            )
        )

    _bound_gains(out, dec, pre, b_cur, scaled, sol, base, base_scaled)
    for s in out:
        if s.threads is not None:
            s.why += (
                f"; not more threads: {_evidence(s.threads)} (so setting threads to the physical "
                "cores is left out)"
            )
        gain = s.projected_gain
        bad = contradicting_entry(s.technique, machine, gain.metric, table)
        if bad is not None and float(gain.value or 0.0) > 1.0:
            s.why += f"; but contradicted here: {_evidence(bad)}"
            s.contradicted_by = bad
            s.score = -1.0 / max(float(s.score), 1e-9)
    out.sort(key=lambda s: -s.score)
    return [
        Advice(
            technique=s.technique,
            why=s.why,
            projected_gain=s.projected_gain,
            assumptions=s.assumptions,
            rank=i,
            # Beside the projection, never folded into it: how far such projections were off.
            calibration=_advice_calibration(
                calibration_for(s.technique, machine, s.projected_gain.metric, table)
            ),
            contradicted_by=s.contradicted_by.to_dict() if s.contradicted_by else None,
        )
        for i, s in enumerate(out, 1)
    ]


def _advice_calibration(c: Calibration) -> AdviceCalibration:
    """The calibration note as the advice record carries it."""
    return AdviceCalibration(
        hardware_class=c.hardware_class,
        technique=c.technique,
        calibrated=c.calibrated,
        significant=c.significant,
        error=c.error,
        text=c.text,
        source=c.source,
        machine=c.machine,
    )


def _evidence(e: CalibrationEntry) -> str:
    """A stored study's measurement in words, with its source."""
    gain = e.measured_gain
    how = f"{gain:.2g}x better" if gain >= 1 else f"{1 / gain:.2g}x worse"
    return (
        f"the {e.knob} study on this machine class measured {e.change} {how} on {e.metric} "
        f"({e.measured_text()}; {e.runs_per_setting} runs per setting, {e.study_file})"
    )


def _intensity_reason(dec: PhaseRoofline, ridge: float, weights_bytes: float, batch: int) -> str:
    """Why batching helps, from decode's measured intensity against the ridge: below it,
    weights are read for few tokens; at or above it, the roofline gains nothing and the
    gain is the per-step overhead shared by more sequences."""
    intensity = float(dec.intensity or 0.0)
    times = intensity / ridge if ridge else 0.0
    if intensity < ridge:
        return (
            f"each step reads the {format_bytes(weights_bytes)} of weights for {batch} "
            f"token(s) (intensity {format_number(intensity)} FLOP/B, "
            f"{format_number(times)}x the ridge {format_number(ridge)})"
        )
    return (
        f"intensity {format_number(intensity)} FLOP/B is already {format_number(times)}x the "
        f"ridge {format_number(ridge)}, so the weights are not what limits it; a larger batch "
        "shares each step's fixed overhead among more sequences"
    )


def _bound_gains(
    out: list[_Draft],
    dec: PhaseRoofline,
    pre: PhaseRoofline,
    b_cur: int,
    scaled: Callable[..., Projection],
    sol: Callable[..., Projection],
    base: Projection,
    base_scaled: Projection,
) -> None:
    """Give every suggestion its gain range and roofline bound, and cap the gain there.

    ``low``: the run's per-step overhead stays fixed (:func:`run_derating`); ``high``: the
    run's fraction of speed of light carries over; ``bound``: the measured time over the
    speed-of-light time with the technique applied. ``value`` (the headline) is ``high``
    capped at ``bound``.
    """
    dec_step = dec.time_per_step_s
    pre_step = pre.time_per_step_s
    for s in out:
        g = s.projected_gain
        rng = s.gain_range
        if rng is None and s.kw is not None:
            m, args = s.kw
            low = float(g.value or 0.0)
            p_sc, p_sol = scaled(m, **args), sol(m, **args)
            metric = g.metric
            if metric == "tpot_s":
                high = base_scaled["tpot_s"] / p_sc["tpot_s"]
                bound = (dec_step or base["tpot_s"]) / p_sol["tpot_s"]
            elif metric == "decode_tok_s":
                high = p_sc["decode_tok_s"] / base_scaled["decode_tok_s"]
                measured = b_cur / dec_step if dec_step else base["decode_tok_s"]
                bound = p_sol["decode_tok_s"] / measured
            elif metric == "ttft_s":
                high = base_scaled["ttft_s"] / p_sc["ttft_s"]
                bound = (pre_step or base["ttft_s"]) / p_sol["ttft_s"]
            else:
                high, bound = low, math.inf
            lo, hi = sorted((low, high))
            rng = (lo, hi, bound)
        if rng is None:
            continue
        low, high, bound = rng
        high = min(high, bound)
        low = min(low, high)
        s.projected_gain = replace(
            g,
            value=round(float(high), 3),
            low=round(float(low), 3),
            high=round(float(high), 3),
            bound=round(float(bound), 3) if math.isfinite(bound) else None,
        )
        s.score = high
