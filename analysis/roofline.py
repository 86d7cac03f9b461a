"""Roofline per phase and verdicts with their evidence (docs/architecture.md).

For each phase (prefill, decode, and mixed when an engine runs chunked prefill) the stored
steps give FLOPs and bytes through the cost model and the time they took; against the
device's ceilings that yields MFU, MBU, achieved FLOP/s and B/s, the speed-of-light time
``max(FLOPs / peak_flops, bytes / peak_bw)`` and the efficiency ``sol_time / time``.

The verdict compares the measured phase with the ridge point. Because
``MFU / MBU = intensity / ridge`` for the same ceilings, "intensity above the ridge" and
"MFU above MBU" always agree; the verdict is ``compute-bound`` or ``memory-bound`` by that,
unless both utilisations are below ``overhead_threshold``, which makes it
``overhead-bound``: the time goes to launches, Python, the host or the network. When the
working set (weights + KV cache) fits in the last-level cache the memory ceiling is that
cache's bandwidth when known, and the section says so instead of showing a DRAM MBU above
100 %.

Runs without steps (HTTP engines) are estimated from the request timeline: prefill work per
request over the time some request was waiting for its first token, and decode work from
how many requests were decoding at each moment. Those phases carry ``estimated: true``.

FLOPs are counted "as executed" (the attention square the kernels compute); the causal-useful
count is reported next to it as ``flops_useful`` / ``mfu_useful``.

A ``mixed`` step (chunked prefill: the running batch's decode rows and prompt chunks in one
pass) is its own phase. Its weight bytes are read once, and its block GEMM FLOPs, KV reads and
writes are exact from the step's totals; its attention FLOPs treat the rows as equal (the
step table has totals, not per-row lengths), so they are approximate when a long chunk shares a
step with short decode rows (and the lm_head is counted for every row, also a chunk that does
not end its prompt). Its time beyond a plain decode step counts towards
``decode_stall_share`` (:func:`_interference`).

Each phase is also split by operator class (:func:`~perfscope.analysis.costmodel.
operator_class_costs`: weight GEMMs, attention/KV, the rest), each with its own intensity,
speed-of-light time and roof (``classes``); ``class_verdict`` is the common roof, or
``mixed`` when classes carrying at least :data:`CLASS_SHARE_MIN` of the phase's
speed-of-light time sit under different roofs. Where the run has engine steps, the time
between consecutive steps (``gap_s``, host scheduling and Python between forward passes, or
idle time) is set apart from the time inside them: a large gap share points at host
overhead, time inside steps far from the roof at slow kernels or launches inside the
forward pass (which a kernel trace would tell apart).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.analysis.catalogue import format_number, format_ratio, format_seconds, format_si
from perfscope.analysis.costmodel import (
    kv_bytes_per_token,
    kv_cache_bytes_per_sequence,
    medusa_head_cost,
    operator_class_costs,
    step_costs,
    weight_bytes,
)
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.summary import (
    EnergyPhase,
    OperatorClassRoofline,
    PhaseRoofline,
    Roofline,
    RooflineCeilings,
    RooflineDevice,
    RooflineLatency,
    RooflineWhatIf,
)
from perfscope.hwdb.calibrate import provisional_note

if TYPE_CHECKING:
    from perfscope.hwdb.spec import DeviceSpec

__all__ = [
    "CLASS_SHARE_MIN",
    "DEFAULT_OVERHEAD_THRESHOLD",
    "PHASES",
    "calibration_spread",
    "fmt_pct",
    "memory_ceiling",
    "phase_roofline",
    "roofline_section",
    "verdict_for",
]

#: Both MFU and MBU below this fraction → ``overhead-bound``: more than 80 % of the time is
#: not explained by either roof (e.g. eager HF decode of a 7B model on an A100 reaches
#: about 20 % MBU; CUDA graphs / compiled engines reach 50-80 %).
DEFAULT_OVERHEAD_THRESHOLD = 0.20

PHASES = ("prefill", "decode", "mixed")

#: An operator class counts towards ``class_verdict`` when it holds at least this share of
#: the phase's speed-of-light time.
CLASS_SHARE_MIN = 0.10

_CLASS_LABELS = {"weight_gemms": "weight GEMMs", "attention_kv": "attention/KV", "other": "rest"}


# ---------------------------------------------------------------------- ceilings


def memory_ceiling(device: DeviceSpec, working_set_bytes: float) -> tuple[float, str, bool]:
    """The memory bandwidth that bounds a working set on ``device``.

    Returns ``(bytes_per_s, level, fits_in_cache)``: ``level`` is ``"cache"`` when the
    working set fits in the last-level cache and that cache's bandwidth is known, else
    ``"dram"``.
    """
    fits = bool(device.cache_bytes and 0 < working_set_bytes <= device.cache_bytes)
    if fits and device.cache_bw_bytes_s:
        return float(device.cache_bw_bytes_s), "cache", True
    return float(device.mem_bw_bytes_s), "dram", fits


def calibration_spread(device: DeviceSpec, dtype: str) -> dict[str, float] | None:
    """The measured spread (interquartile range / median) of a calibrated device's compute
    (``dtype``), DRAM and cache ceilings; ``None`` for datasheet devices and old caches."""
    cal = (device.extra or {}).get("calibration") if device.source == "calibrated" else None
    spread = (cal or {}).get("spread") if isinstance(cal, dict) else None
    if not isinstance(spread, dict) or not spread:
        return None
    out = {
        k: float(v)
        for k, v in (
            ("compute", spread.get(dtype)),
            ("memory", spread.get("memory")),
            ("cache", spread.get("cache")),
        )
        if isinstance(v, int | float)
    }
    return out or None


def _ceilings(device: DeviceSpec, dtype: str) -> RooflineCeilings:
    return RooflineCeilings(
        dtype=dtype,
        peak_flops=device.peak_flops_for(dtype),
        mem_bw_bytes_s=device.mem_bw_bytes_s,
        cache_bytes=device.cache_bytes,
        cache_bw_bytes_s=device.cache_bw_bytes_s,
        ridge_point=device.ridge_point(dtype),
        source=device.source,
        spread=calibration_spread(device, dtype),
        # ceilings calibrated under contention say so wherever they are used
        provisional=provisional_note(device.extra) if device.source == "calibrated" else None,
    )


# ---------------------------------------------------------------------- formatting


#: Display formatters of the evidence sentences: the catalogue's (one set for perfscope).
fmt_pct = format_ratio
_fmt_time = format_seconds
_fmt_si = format_si


# ---------------------------------------------------------------------- verdicts


def verdict_for(
    *,
    mfu: float | None,
    mbu: float | None,
    intensity: float,
    ridge: float | None,
    overhead_threshold: float,
) -> str:
    """``compute-bound``, ``memory-bound``, ``overhead-bound`` or ``unknown``.

    Overhead-bound when every known utilisation is below ``overhead_threshold``; otherwise
    the side of the ridge the phase sits on (equivalently, the larger utilisation).
    """
    known = [u for u in (mfu, mbu) if u is not None]
    if not known:
        return "unknown"
    if max(known) < overhead_threshold:
        return "overhead-bound"
    if ridge is not None:
        return "compute-bound" if intensity > ridge else "memory-bound"
    if mfu is not None and mbu is not None:
        return "compute-bound" if mfu > mbu else "memory-bound"
    return "memory-bound" if mbu is not None else "compute-bound"


def _evidence(phase: str, r: PhaseRoofline, device_name: str, threshold: float) -> str:
    mfu, mbu = r.mfu, r.mbu
    ridge = r.ridge_point
    c = r.ceilings
    intensity = r.intensity if r.intensity is not None else math.inf
    sol = r.sol_time_s or 0.0
    level = "L2/LLC cache" if r.memory_level == "cache" else "DRAM"
    per_step = r.time_per_step_s
    sol_step = sol / r.steps if r.steps else sol
    rel = ">" if ridge is not None and intensity > ridge else "<"
    ridge_txt = (
        f"{format_number(intensity)} FLOP/B {rel} ridge {format_number(ridge)} FLOP/B "
        f"({c.dtype}, {level} of {device_name})"
        if ridge is not None
        else (f"{format_number(intensity)} FLOP/B (no {c.dtype} peak for {device_name})")
    )
    util = f"MFU {fmt_pct(mfu)}, MBU {fmt_pct(mbu)}"
    timing = (
        f"{_fmt_time(per_step)} per step vs {format_seconds(sol_step)} at speed of light "
        f"(efficiency {fmt_pct(r.efficiency)})"
    )
    verdict = r.verdict
    if verdict == "overhead-bound":
        head = (
            f"{phase} is overhead-bound: MFU {fmt_pct(mfu)} and MBU {fmt_pct(mbu)} are both "
            f"below {fmt_pct(threshold)}, so the time goes to kernel launches, Python, the "
            f"host or the network rather than to the hardware's ceilings; {ridge_txt}"
        )
    elif verdict == "memory-bound":
        head = f"{phase} is memory-bound: {ridge_txt}; {util}"
    elif verdict == "compute-bound":
        head = f"{phase} is compute-bound: {ridge_txt}; {util}"
    else:
        head = f"{phase}: no ceilings for this device; {ridge_txt}"
    notes = []
    if r.fits_in_cache:
        notes.append(
            f"the working set ({_fmt_si(r.working_set_bytes, 'B')}) fits in the "
            f"{_fmt_si(c.cache_bytes, 'B')} last-level cache"
            + (
                ", so MBU is against the cache ceiling "
                f"({_fmt_si(c.cache_bw_bytes_s, 'B/s')}; "
                f"DRAM MBU would be {fmt_pct(r.mbu_dram)})"
                if r.memory_level == "cache"
                else f", whose bandwidth is unknown: DRAM MBU {fmt_pct(r.mbu_dram)} "
                "overstates DRAM traffic"
            )
        )
    elif r.mbu_dram is not None and r.mbu_dram > 1.0:
        notes.append(
            f"DRAM MBU above 100% ({fmt_pct(r.mbu_dram)}) means part of the traffic is "
            "served from caches"
        )
    if c.provisional:
        notes.append(str(c.provisional))
    if mfu is not None and mfu > 1.0:
        notes.append(
            f"MFU above 100% means the {c.dtype} compute ceiling "
            f"({_fmt_si(c.peak_flops, 'FLOP/s')}, {c.source}) "
            "is below what ran: check the device's peak"
        )
    if r.estimated:
        notes.append("estimated from the request timeline (no engine steps recorded)")
    tail = "; ".join(notes)
    return f"{head}; {timing}" + (f"; {tail}." if tail else ".")


# ---------------------------------------------------------------------- per phase


def _kv_held(model: ModelSpec, tokens: float, rows: float | None) -> float:
    """KV-cache bytes of ``tokens`` cached tokens split evenly over ``rows`` sequences,
    each capped at the model's context (bytes). A state-space model's recurrent state is
    per sequence, constant in context; with ``rows`` unknown it counts one sequence."""
    if rows is None:
        state = model.state_bytes_per_seq if tokens > 0 else 0.0
        return float(tokens * kv_bytes_per_token(model)) + state
    n = max(round(rows), 1)
    per_seq = tokens / n
    if model.max_position_embeddings:
        per_seq = min(per_seq, float(model.max_position_embeddings))
    return n * kv_cache_bytes_per_sequence(model, per_seq)


def phase_roofline(
    phase: str,
    *,
    model: ModelSpec,
    device: DeviceSpec,
    costs: dict[str, float],
    time_s: float,
    steps: int,
    tokens: float,
    batch_size_mean: float,
    context_tokens_mean: float,
    max_context_tokens: float,
    max_context_rows: float | None = None,
    overhead_threshold: float = DEFAULT_OVERHEAD_THRESHOLD,
    estimated: bool = False,
    energy: EnergyPhase | None = None,
) -> PhaseRoofline:
    """Roofline numbers and the verdict of one phase from its summed costs and time.

    Args:
        costs: summed :func:`~perfscope.analysis.costmodel.step_costs` quantities
            (``flops``, ``flops_useful``, ``bytes``, ``bytes_weights``, ...).
        time_s: measured time of the phase in seconds (sum of step durations).
        steps: forward passes (or, estimated, request-steps) in the phase.
        tokens: new tokens processed.
        batch_size_mean: mean rows per step.
        context_tokens_mean: mean cached tokens per row.
        max_context_tokens: the largest KV-cache occupancy (tokens, summed over rows) seen,
            for the working set.
        max_context_rows: the sequences that occupancy was split over (each holds at most
            the model's context, its sliding-window layers at most their window); ``None``:
            unknown, every layer keeps every token.
    """
    dtype = model.act_dtype
    peak = device.peak_flops_for(dtype)
    working_set = weight_bytes(model) + _kv_held(model, max_context_tokens, max_context_rows)
    bw, level, fits = memory_ceiling(device, working_set)
    flops, nbytes = float(costs["flops"]), float(costs["bytes"])
    intensity = flops / nbytes if nbytes > 0 else math.inf
    ridge = peak / bw if peak and bw > 0 else None
    t = float(time_s)
    ok = t > 0
    achieved_f = flops / t if ok else None
    achieved_b = nbytes / t if ok else None
    mfu = flops / (t * peak) if ok and peak else None
    mfu_useful = float(costs["flops_useful"]) / (t * peak) if ok and peak else None
    mbu = nbytes / (t * bw) if ok and bw > 0 else None
    mbu_dram = nbytes / (t * device.mem_bw_bytes_s) if ok and device.mem_bw_bytes_s > 0 else None
    sol = max(flops / peak if peak else 0.0, nbytes / bw if bw > 0 else 0.0)
    efficiency = sol / t if ok and sol > 0 else None
    ceilings = dataclasses.replace(
        _ceilings(device, dtype),
        memory_level=level,
        memory_bw_used_bytes_s=bw,
        ridge_point_used=ridge,
    )
    classes, class_verdict = _class_split(costs, peak, bw)
    r = PhaseRoofline(
        phase=phase,
        steps=int(steps),
        tokens=float(tokens),
        batch_size_mean=float(batch_size_mean),
        context_tokens_mean=float(context_tokens_mean),
        time_s=t,
        time_per_step_s=t / steps if steps else None,
        flops=flops,
        flops_useful=float(costs["flops_useful"]),
        flops_attention=float(costs["flops_attention"]),
        bytes=nbytes,
        bytes_weights=float(costs["bytes_weights"]),
        bytes_kv_read=float(costs["bytes_kv_read"]),
        bytes_kv_write=float(costs["bytes_kv_write"]),
        bytes_activations=float(costs["bytes_activations"]),
        intensity=intensity,
        ridge_point=ridge,
        ridge_point_dram=device.ridge_point(dtype),
        achieved_flops_s=achieved_f,
        achieved_bytes_s=achieved_b,
        mfu=mfu,
        mfu_useful=mfu_useful,
        mbu=mbu,
        mbu_dram=mbu_dram,
        sol_time_s=sol,
        efficiency=efficiency,
        working_set_bytes=working_set,
        fits_in_cache=fits,
        memory_level=level,
        estimated=bool(estimated),
        ceilings=ceilings,
        energy=energy.roofline_join() if energy is not None else None,
        # The roof the phase sits under, whatever the verdict (overhead-bound phases too).
        roof="compute" if ridge is not None and intensity > ridge else "memory",
        verdict=verdict_for(
            mfu=mfu,
            mbu=mbu,
            intensity=intensity,
            ridge=ridge,
            overhead_threshold=overhead_threshold,
        ),
        classes=classes,
        class_verdict=class_verdict,
    )
    evidence = _evidence(phase, r, device.name, overhead_threshold)
    return dataclasses.replace(r, evidence=evidence + " " + _class_evidence(r))


def _class_split(
    costs: dict[str, float], peak: float | None, bw: float
) -> tuple[dict[str, OperatorClassRoofline], str | None]:
    """Per operator class: FLOPs, bytes, intensity, speed-of-light time, its share of the
    classes' total and its roof; and the verdict over the classes that matter."""
    split = operator_class_costs(costs)
    sol: dict[str, tuple[float, float]] = {}
    for name, c in split.items():
        t_c = c["flops"] / peak if peak else 0.0
        t_m = c["bytes"] / bw if bw > 0 else 0.0
        sol[name] = (t_c, t_m)
    total = sum(max(t) for t in sol.values())
    out = {
        name: OperatorClassRoofline(
            flops=c["flops"],
            bytes=c["bytes"],
            intensity=c["flops"] / c["bytes"] if c["bytes"] > 0 else None,
            sol_time_s=max(sol[name]),
            roof="compute" if sol[name][0] > sol[name][1] else "memory",
            sol_share=max(sol[name]) / total if total > 0 else None,
        )
        for name, c in split.items()
    }
    roofs = {
        v.roof for v in out.values() if v.sol_share is not None and v.sol_share >= CLASS_SHARE_MIN
    }
    verdict = None if not roofs else ("mixed" if len(roofs) > 1 else f"{roofs.pop()}-bound")
    return out, verdict


def _class_evidence(r: PhaseRoofline) -> str:
    classes = r.classes or {}
    parts = [
        f"{_CLASS_LABELS[k]} {v.roof}-bound ({fmt_pct(v.sol_share)} of speed-of-light time)"
        for k, v in classes.items()
        if v.sol_share
    ]
    text = "By operator class: " + ", ".join(parts)
    if r.class_verdict == "mixed":
        text += "; the classes disagree, so the phase is mixed: each class has its own lever"
    return text + "."


def _sum_costs(arrays: dict[str, np.ndarray[Any, Any]], weights: Any = None) -> dict[str, float]:
    if weights is None:
        return {k: float(np.sum(v)) for k, v in arrays.items()}
    w = np.asarray(weights, dtype=np.float64)
    return {k: float(np.sum(v * w)) for k, v in arrays.items()}


def _warmup_ids(requests: pd.DataFrame | None) -> set[int]:
    if requests is None or requests.empty or "is_warmup" not in requests:
        return set()
    warm = requests[requests["is_warmup"].fillna(False).astype(bool)]
    return {int(x) for x in warm["request_id"]}


def _phases_from_steps(
    steps: pd.DataFrame,
    requests: pd.DataFrame | None,
    model: ModelSpec,
    device: DeviceSpec,
    threshold: float,
    energy: Mapping[str, EnergyPhase] | None,
    draft_model: ModelSpec | None = None,
    medusa_heads: int = 0,
) -> dict[str, PhaseRoofline]:
    warm = _warmup_ids(requests)
    df = steps
    if warm and "request_ids" in df:
        # Drop steps that served warmup requests only.
        lists = [np.asarray(x if x is not None else [], dtype=np.int64) for x in df["request_ids"]]
        counts = np.array([len(x) for x in lists], dtype=np.int64)
        flat = np.concatenate(lists) if counts.sum() else np.empty(0, dtype=np.int64)
        cold = ~np.isin(flat, np.fromiter(warm, dtype=np.int64, count=len(warm)))
        n_cold = np.bincount(np.repeat(np.arange(len(lists)), counts), cold, len(lists))
        df = df[(counts == 0) | (n_cold > 0)]
    # Only the numeric columns travel through the per-phase filters (not the id lists).
    cols = ["kind", "batch_size", "new_tokens", "context_tokens", "t_start", "t_end"]
    df = df[cols + [c for c in ("role", "proposed_tokens") if c in df]]
    # A draft model's passes (speculative decoding) are phases of their own, costed with the
    # draft's spec: "draft_prefill", "draft_decode".
    is_draft = (df["role"] == "draft").to_numpy() if "role" in df else np.zeros(len(df), bool)
    key = df["kind"].astype(str).where(~is_draft, "draft_" + df["kind"].astype(str))
    out: dict[str, PhaseRoofline] = {}
    ordered = df.sort_values("t_start", kind="stable")
    starts = ordered["t_start"].to_numpy(dtype=np.float64)
    ends = ordered["t_end"].to_numpy(dtype=np.float64)
    gap_before = np.zeros(len(ordered))
    if len(ordered) > 1:
        gap_before[1:] = np.maximum(starts[1:] - np.maximum.accumulate(ends)[:-1], 0.0) * 1e-9
    gap_by_kind = pd.Series(gap_before, index=ordered.index).groupby(key[ordered.index]).sum()
    for phase in (*PHASES, *(f"draft_{p}" for p in PHASES)):
        phase_model = model if not phase.startswith("draft_") else draft_model
        sub = df[(key == phase).to_numpy()]
        if sub.empty or phase_model is None:
            continue
        b = sub["batch_size"].to_numpy(dtype=np.float64)
        n = sub["new_tokens"].to_numpy(dtype=np.float64)
        c = sub["context_tokens"].to_numpy(dtype=np.float64)
        dur = (
            sub["t_end"].to_numpy(dtype=np.float64) - sub["t_start"].to_numpy(dtype=np.float64)
        ) * 1e-9
        logits = None
        if "proposed_tokens" in sub and not phase_model.lm_head_all_positions:
            # A speculative verify pass computes logits at every position it feeds.
            verify = sub["proposed_tokens"].notna().to_numpy()
            logits = np.where(verify, n, np.minimum(np.maximum(b, 1.0), n))
        arrays = step_costs(phase_model, b, n, c, logits_tokens=logits)
        if medusa_heads and "proposed_tokens" in sub and not phase.startswith("draft_"):
            _add_medusa_heads(arrays, phase_model, medusa_heads, b, sub)
        r = phase_roofline(
            phase,
            model=phase_model,
            device=device,
            costs=_sum_costs(arrays),
            time_s=float(np.sum(np.maximum(dur, 0.0))),
            steps=len(sub),
            tokens=float(n.sum()),
            batch_size_mean=float(b.mean()),
            context_tokens_mean=float(c.sum() / max(b.sum(), 1.0)),
            max_context_tokens=float(np.max(c + n)),
            max_context_rows=float(b[int(np.argmax(c + n))]),
            overhead_threshold=threshold,
            energy=None if phase.startswith("draft_") else (energy or {}).get(phase),
        )
        out[phase] = _add_gap_evidence(r, float(gap_by_kind.get(phase, 0.0)))
    return out


def _add_medusa_heads(
    arrays: dict[str, np.ndarray[Any, Any]],
    model: ModelSpec,
    heads: int,
    rows: np.ndarray[Any, Any],
    sub: pd.DataFrame,
) -> None:
    """Add Medusa's heads to each verify step's work, in place: on every row of a step
    that carries ``proposed_tokens``, ``heads`` ``d x d`` matmuls (linear) and as many
    lm_head projections (lm_head), and their weight reads
    (:func:`~perfscope.analysis.costmodel.medusa_head_cost`)."""
    verify = sub["proposed_tokens"].notna().to_numpy()
    r = np.where(verify, rows, 0.0)
    flops, weight_bytes = medusa_head_cost(model, heads, r)
    d, v = float(model.hidden_size), float(model.vocab_size)
    linear = flops * d / (d + v)
    for key, extra in (
        ("flops", flops),
        ("flops_useful", flops),
        ("flops_linear", linear),
        ("flops_lm_head", flops - linear),
        ("bytes_weights", weight_bytes),
        ("bytes", weight_bytes),
    ):
        if key in arrays:
            arrays[key] = arrays[key] + extra


def _add_gap_evidence(r: PhaseRoofline, gap_s: float) -> PhaseRoofline:
    """Time between steps (host scheduling, Python, or idle) next to time inside steps."""
    inside = r.time_s or 0.0
    share = gap_s / (gap_s + inside) if gap_s + inside > 0 else None
    r = dataclasses.replace(r, gap_s=gap_s, gap_share=share)
    if r.verdict != "overhead-bound" or share is None:
        return r
    if share >= 0.3:
        where = (
            f"{fmt_pct(share)} of its wall time is spent between steps (host scheduling and "
            "Python between forward passes, or idle waiting): host overhead"
        )
    else:
        where = (
            f"only {fmt_pct(share)} of its wall time is between steps; the rest is inside the "
            f"forward passes, at {fmt_pct(r.efficiency)} of speed of light: slow kernels or "
            "launch overhead inside the forward (a kernel trace would tell them apart)"
        )
    return dataclasses.replace(r, evidence=f"{r.evidence} Host overhead vs slow kernels: {where}.")


# ---------------------------------------------------------------------- timeline estimate


def _union_length(starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]) -> float:
    """Total length covered by intervals [start, end) (any units)."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    # A block starts where an interval begins after every earlier one has ended.
    first = np.flatnonzero(np.concatenate(([True], s[1:] > run_end[:-1])))
    return float(np.sum(np.maximum.reduceat(e, first) - s[first]))


def _completed(requests: pd.DataFrame) -> pd.DataFrame:
    df = requests
    if "is_warmup" in df:
        df = df[~df["is_warmup"].fillna(False).astype(bool)]
    if "error" in df:
        df = df[df["error"].isna()]
    return df.dropna(subset=["t_sent", "t_first_token"])


def _phases_from_timeline(
    requests: pd.DataFrame,
    model: ModelSpec,
    device: DeviceSpec,
    threshold: float,
    energy: Mapping[str, EnergyPhase] | None,
) -> dict[str, PhaseRoofline]:
    df = _completed(requests)
    out: dict[str, PhaseRoofline] = {}
    if df.empty:
        return out
    prompt = df["prompt_tokens"].to_numpy(dtype=np.float64)
    sent = df["t_sent"].to_numpy(dtype=np.float64) * 1e-9
    first = df["t_first_token"].to_numpy(dtype=np.float64) * 1e-9

    # Prefill: one pass per request over its prompt; the device time is bounded by the time
    # some request was waiting for its first token (TTFT includes queueing, so MFU is a
    # lower bound).
    arrays = step_costs(model, np.ones_like(prompt), prompt, np.zeros_like(prompt))
    t_pref = _union_length(sent, first)
    ttft_sum = float(np.sum(first - sent))
    out["prefill"] = phase_roofline(
        "prefill",
        model=model,
        device=device,
        costs=_sum_costs(arrays),
        time_s=t_pref,
        steps=len(df),
        tokens=float(prompt.sum()),
        batch_size_mean=ttft_sum / t_pref if t_pref > 0 else 1.0,
        context_tokens_mean=0.0,
        max_context_tokens=float(prompt.max()),
        max_context_rows=1.0,
        overhead_threshold=threshold,
        estimated=True,
        energy=(energy or {}).get("prefill"),
    )

    # Decode: reconstruct the decode batch from how many requests were between their first
    # and last token at each moment; each request emits at its own mean rate.
    dec = df.dropna(subset=["t_last_token"])
    dec = dec[dec["output_tokens"] > 1]
    if dec.empty:
        return out
    p = dec["prompt_tokens"].to_numpy(dtype=np.float64)
    t0 = dec["t_first_token"].to_numpy(dtype=np.float64) * 1e-9
    t1 = dec["t_last_token"].to_numpy(dtype=np.float64) * 1e-9
    steps_i = dec["output_tokens"].to_numpy(dtype=np.float64) - 1.0
    valid = t1 > t0
    p, t0, t1, steps_i = p[valid], t0[valid], t1[valid], steps_i[valid]
    if len(p) == 0:
        return out
    rate = steps_i / (t1 - t0)  # decode tokens per second of each request
    # Sweep: running sums of count, rate, 1/rate and (prompt - rate·t0) so that the cached
    # context of the active set at time t is A + t·Σrate (prompt + tokens decoded so far).
    times = np.concatenate([t0, t1])
    sign = np.concatenate([np.ones_like(t0), -np.ones_like(t1)])
    order = np.argsort(times, kind="stable")
    times, sign = times[order], sign[order]
    cnt = np.cumsum(sign)
    s_rate = np.cumsum(np.concatenate([rate, rate])[order] * sign)
    s_inv = np.cumsum(np.concatenate([1.0 / rate, 1.0 / rate])[order] * sign)
    # Step i of a request reads p + i cached entries and runs over [t0 + i/rate, t0 +
    # (i+1)/rate): the mean over an interval is p + rate·(t - t0) - 1/2 at its midpoint.
    a_term = p - 0.5 - rate * t0
    s_a = np.cumsum(np.concatenate([a_term, a_term])[order] * sign)
    dt = np.diff(times)
    n_act = np.rint(cnt[:-1])
    live = (dt > 0) & (n_act > 0)
    dt, n_act = dt[live], n_act[live]
    mid = (times[:-1][live] + times[1:][live]) / 2.0
    ctx = np.maximum(s_a[:-1][live] + mid * s_rate[:-1][live], 0.0)
    tpot = s_inv[:-1][live] / n_act  # mean time per decode step of the active set
    n_steps = dt / tpot
    arrays = step_costs(model, n_act, n_act, ctx)
    t_dec = float(dt.sum())
    out["decode"] = phase_roofline(
        "decode",
        model=model,
        device=device,
        costs=_sum_costs(arrays, n_steps),
        time_s=t_dec,
        steps=round(float(n_steps.sum())),
        tokens=float(steps_i.sum()),
        batch_size_mean=float(np.sum(n_act * dt) / t_dec) if t_dec > 0 else 0.0,
        context_tokens_mean=float(np.sum(ctx * dt) / max(float(np.sum(n_act * dt)), 1e-30)),
        max_context_tokens=float(ctx.max()) if len(ctx) else 0.0,
        max_context_rows=float(n_act[int(np.argmax(ctx))]) if len(ctx) else 1.0,
        overhead_threshold=threshold,
        estimated=True,
        energy=(energy or {}).get("decode"),
    )
    return out


def _interference(steps: pd.DataFrame, requests: pd.DataFrame | None) -> dict[str, float | None]:
    """How much decode time prefill passes steal from requests already decoding.

    For every prefill step, the requests between their first and last token at its start
    wait for it; ``decode_stall_share`` is that waiting (step time x requests waiting) over
    all requests' decode time, ``prefill_stall_max_s`` the longest such step. A ``mixed``
    step (chunked prefill: decode rows and prompt chunks in one pass) stalls the requests
    decoding at its start by what its prompt chunks added: its time beyond the run's median
    plain decode step (without decode steps: its time times the chunks' share of its
    tokens, one decode row per decoding request).
    """
    out: dict[str, float | None] = {"decode_stall_share": None, "prefill_stall_max_s": None}
    if requests is None or requests.empty or steps.empty:
        return out
    df = _completed(requests).dropna(subset=["t_last_token"])
    df = df[df["output_tokens"] > 1]
    pre = steps[steps["kind"].isin(("prefill", "mixed"))]
    if df.empty or pre.empty:
        return out
    first = np.sort(df["t_first_token"].to_numpy(dtype=np.float64))
    last = np.sort(df["t_last_token"].to_numpy(dtype=np.float64))
    total = float(np.sum(last) - np.sum(first))
    if total <= 0:
        return out
    t0 = pre["t_start"].to_numpy(dtype=np.float64)
    dur = pre["t_end"].to_numpy(dtype=np.float64) - t0
    waiting = np.searchsorted(first, t0, side="left") - np.searchsorted(last, t0, side="right")
    waiting = np.maximum(waiting, 0)
    mixed = (pre["kind"] == "mixed").to_numpy()
    if mixed.any():
        dec = steps[steps["kind"] == "decode"]
        if not dec.empty:
            # What the chunks added: the step's time beyond a plain decode step's (median).
            d_dec = dec["t_end"].to_numpy(np.float64) - dec["t_start"].to_numpy(np.float64)
            ref = float(np.median(d_dec))
            extra = np.maximum(dur - ref, 0.0)
        else:  # no plain decode step to compare with: the chunks' share of the tokens
            n = pre["new_tokens"].to_numpy(dtype=np.float64)
            rows = np.minimum(waiting, np.maximum(pre["batch_size"].to_numpy() - 1, 0))
            extra = dur * np.maximum(n - rows, 0.0) / np.maximum(n, 1.0)
        dur = np.where(mixed, extra, dur)
    stalled = dur[waiting > 0]
    out["decode_stall_share"] = float(np.sum(dur * waiting) / total)
    out["prefill_stall_max_s"] = float(stalled.max() * 1e-9) if len(stalled) else 0.0
    return out


def _latency(
    requests: pd.DataFrame | None,
    phases: Mapping[str, PhaseRoofline],
    interference: Mapping[str, float | None] | None = None,
) -> RooflineLatency:
    """Mean TTFT and TPOT of the completed requests, mean step time of prefill and decode
    (s), and the prefill stalls of :func:`_interference` when given."""
    ttft_mean: float | None = None
    tpot_mean: float | None = None
    if requests is not None and not requests.empty and "t_first_token" in requests:
        df = _completed(requests)
        if not df.empty:
            ttft = (df["t_first_token"] - df["t_sent"]).to_numpy(dtype=np.float64) * 1e-9
            ttft_mean = float(ttft.mean())
            d = df.dropna(subset=["t_last_token"])
            d = d[d["output_tokens"] > 1]
            if not d.empty:
                tp = (d["t_last_token"] - d["t_first_token"]).to_numpy(dtype=np.float64) * 1e-9
                tpot_mean = float(np.mean(tp / (d["output_tokens"].to_numpy() - 1)))
    pre, dec = phases.get("prefill"), phases.get("decode")
    stalls = interference or {}
    return RooflineLatency(
        ttft_mean_s=ttft_mean,
        tpot_mean_s=tpot_mean,
        prefill_step_mean_s=pre.time_per_step_s if pre else None,
        decode_step_mean_s=dec.time_per_step_s if dec else None,
        decode_stall_share=stalls.get("decode_stall_share"),
        prefill_stall_max_s=stalls.get("prefill_stall_max_s"),
    )


# ---------------------------------------------------------------------- section


def roofline_section(
    steps: pd.DataFrame | None,
    requests: pd.DataFrame | None,
    chunks: pd.DataFrame | None,
    model: ModelSpec | None,
    device: DeviceSpec | None,
    *,
    overhead_threshold: float = DEFAULT_OVERHEAD_THRESHOLD,
    energy: Mapping[str, EnergyPhase] | None = None,
    measured_on: str | None = None,
    draft_model: ModelSpec | None = None,
    medusa_heads: int = 0,
) -> Roofline:
    """The ``roofline`` section of the summary.

    Args:
        steps: STEP_SCHEMA rows (may be empty or ``None`` for HTTP engines).
        requests: REQUEST_SCHEMA rows (warmup rows are left out).
        chunks: CHUNK_SCHEMA rows (accepted for the contract; the timeline estimate uses
            the requests' first/last token times).
        model: the engine's model; ``None`` → ``available: false``.
        device: the device's ceilings; ``None`` → ``available: false``.
        overhead_threshold: both MFU and MBU below this → ``overhead-bound``.
        energy: optional per-phase energy from the telemetry join (``Energy.phases``),
            kept in each phase as ``energy`` (:meth:`EnergyPhase.roofline_join`).
        measured_on: the device the run was measured on, when ``device`` is another one
            (``analyze --hw X`` on a run from elsewhere): the section is a what-if
            (``what_if`` true) that keeps the work and the speed-of-light times on
            ``device`` but withholds measured MFU, MBU, achieved rates and efficiency,
            which would divide one machine's time by another's ceilings.
        draft_model: the draft model of a speculative-decoding run: its passes (steps with
            ``role == "draft"``) become the phases ``draft_prefill`` and ``draft_decode``,
            costed with this spec (without it they are left out of every phase).
        medusa_heads: a Medusa run's heads (``num_speculative_tokens``): each verify step
            (a step with ``proposed_tokens``) also pays their FLOPs and weight reads on
            every row; 0 for any other run.

    Returns:
        The :class:`~perfscope.analysis.summary.Roofline` record: ``available`` false with
        the ``reason``, or the phases (:class:`~perfscope.analysis.summary.PhaseRoofline`)
        with their work, utilisations, verdicts and evidence, the ceilings and the latency.
    """
    base = Roofline(
        available=False,
        reason=None,
        flops_convention="as-executed (attention over the full masked square / cache span)",
        model=model.name if model else None,
        overhead_threshold=overhead_threshold,
    )
    if model is None:
        return dataclasses.replace(
            base,
            reason=(
                "no model spec: pass --model-spec PRESET|config.json|FOLDER to perfscope run or "
                "sweep to get an estimated roofline"
            ),
        )
    if device is None:
        return dataclasses.replace(base, reason="no device: pass --hw KEY to get a roofline")
    base = dataclasses.replace(
        base,
        device=RooflineDevice(key=device.key, name=device.name, kind=device.kind),
        ceilings=_ceilings(device, model.act_dtype),
    )
    has_steps = steps is not None and not steps.empty
    phases: dict[str, PhaseRoofline] = {}
    if has_steps:
        assert steps is not None
        phases = _phases_from_steps(
            steps, requests, model, device, overhead_threshold, energy, draft_model, medusa_heads
        )
        base = dataclasses.replace(base, source="steps")
    elif requests is not None and not requests.empty:
        phases = _phases_from_timeline(requests, model, device, overhead_threshold, energy)
        base = dataclasses.replace(base, source="timeline", estimated=True)
    if not phases:
        return dataclasses.replace(base, reason="no completed requests or steps to analyse")
    what_if = None
    if measured_on is not None and measured_on != device.key:
        what_if = RooflineWhatIf(measured_on=measured_on, target=device.key)
        phases = {k: _withhold_measured(ph, device.name, measured_on) for k, ph in phases.items()}
    interference = None
    if has_steps:
        assert steps is not None
        interference = _interference(steps, requests)
    return dataclasses.replace(
        base,
        available=True,
        phases=phases,
        latency=_latency(requests, phases, interference),
        what_if=what_if,
    )


def _withhold_measured(r: PhaseRoofline, device_name: str, measured_on: str) -> PhaseRoofline:
    """Turn a phase analysed against a device it did not run on into a what-if: measured
    ratios removed, the verdict is the roof the work would sit under at speed of light."""
    sol = r.sol_time_s or 0.0
    sol_step = sol / r.steps if r.steps else sol
    ridge = r.ridge_point
    intensity = r.intensity if r.intensity is not None else math.inf
    rel = "" if ridge is None else (" > " if intensity > ridge else " < ")
    evidence = (
        f"what-if on {device_name}: the run was measured on {measured_on}, so no measured "
        f"MFU/MBU against {device_name} is given; at speed of light this {r.phase} would "
        f"be {r.roof}-bound (intensity {format_number(intensity)} FLOP/B"
        + (f"{rel}ridge {format_number(ridge)} FLOP/B" if ridge is not None else "")
        + f"), {format_seconds(sol_step)} per step."
    )
    return dataclasses.replace(
        r,
        mfu=None,
        mfu_useful=None,
        mbu=None,
        mbu_dram=None,
        achieved_flops_s=None,
        achieved_bytes_s=None,
        efficiency=None,
        what_if=True,
        verdict=f"{r.roof}-bound",
        evidence=evidence,
    )
