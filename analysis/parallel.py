"""Parallelism what-ifs: tensor, pipeline and data (replica) parallelism on top of
:func:`perfscope.analysis.whatif.predict`.

Each projection states its assumptions in :attr:`ParallelPrediction.assumptions`:

- **Tensor parallelism** (``tp``): FLOPs, weights and activations split ``tp`` ways, the KV
  cache by ``min(tp, n_kv_heads)`` (heads replicate beyond that; an MLA latent is replicated
  on every rank), as :func:`~perfscope.analysis.whatif.predict` does. Added here: every block
  ends its attention and its MLP with an all-reduce of the step's hidden states
  (``tokens · d · b_act`` bytes), the vocab-parallel embedding adds one more, and the
  vocab-parallel lm_head gathers the logits. A ring all-reduce over ``n`` devices moves
  ``2(n−1)/n`` of the message over each device's link, so it takes
  ``latency + 2(n−1)/n · bytes / bw`` with ``bw`` the per-direction bandwidth of the
  device's scale-up link (:meth:`~perfscope.hwdb.spec.DeviceSpec.scale_up_link`) and
  ``latency`` the link's per-collective latency (device file, else the range
  :data:`OPTIMISTIC_COLLECTIVE_LATENCY_S` .. :data:`DEFAULT_COLLECTIVE_LATENCY_S`, the
  typical end used). Each synchronising collective also waits for the slowest rank:
  ``<link>_wait`` from the device file when measured (calibrated for
  ``cpu-loopback-gloo`` in ``samples/studies/parallel.md``), else 0 and the projection says
  "no wait term: a lower bound". Communication does not overlap compute.
- **Pipeline parallelism** (``pp``): the blocks split into ``pp`` equal stages, the first
  also holding the embedding and the last the lm_head; a stage's step time is the
  single-device time ÷ ``pp``. Prefill runs ``microbatches`` micro-batches through the
  stages (GPipe schedule): ``(m + pp − 1)`` stage times, bubble ``(pp − 1)/(m + pp − 1)``.
  Decode keeps ``in_flight`` independent batches in the pipeline (vLLM's virtual engines):
  each batch's step still passes all stages (TPOT ≈ single device), and the pipeline is
  busy ``min(in_flight, pp)/pp`` of the time. Stage-to-stage sends of the hidden states
  cost ``latency + bytes/bw`` each: ``pp − 1`` per pass, and each decode step adds one
  return hop of the sampled tokens (``batch`` int64 ids) from the last stage to the first,
  which the next step waits for (with several batches in flight each batch's step has its
  own ``pp − 1`` forward hops and its own return hop). Each hop is a blocking receive, a
  synchronisation like a collective, so it also adds the link's measured ``<link>_wait``
  (the same per-synchronisation wait as TP's; 0 when the device file has none). That wait
  was measured at one load (``cpu-loopback-gloo``: load 12.7-14.7 on 2 cores) and is not
  scaled by the load of the run projected: the stored runs give no second load level to
  fit a load-dependent term from.
- **Replicas** (data/request parallelism): ``replicas`` independent copies; requests divide
  evenly, latency is unchanged and throughput multiplies (no shared host or network limit).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from perfscope.analysis.catalogue import format_seconds, format_si
from perfscope.analysis.costmodel import (
    allreduces_per_pass,
    embedding_table_bytes,
    kv_cache_bytes_per_sequence,
    kv_share_per_device,
    lm_head_bytes,
    weight_bytes,
)
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.whatif import DEFAULT_MEM_FRACTION, predict
from perfscope.errors import UsageError
from perfscope.jsontypes import JsonObject

if TYPE_CHECKING:
    from perfscope.hwdb.spec import DeviceSpec

__all__ = [
    "DEFAULT_COLLECTIVE_LATENCY_S",
    "OPTIMISTIC_COLLECTIVE_LATENCY_S",
    "Link",
    "ParallelPlan",
    "ParallelPrediction",
    "predict_parallel",
    "ring_allreduce_time",
]

#: Typical per-collective latency when the device file gives none (the end the projection
#: uses): small all-reduces on 8 NVLink GPUs take 12-17 µs in nccl-tests'
#: ``all_reduce_perf`` (docs/projections.md, "Collective latency").
DEFAULT_COLLECTIVE_LATENCY_S = 15e-6
#: Optimistic end of that range: llm-analysis' ``intra_node_min_message_latency`` (8 µs).
OPTIMISTIC_COLLECTIVE_LATENCY_S = 8e-6
#: Bytes of one sampled token id sent back to the first pipeline stage (int64).
TOKEN_ID_BYTES = 8


@dataclass(frozen=True)
class Link:
    """The link collectives run over.

    Attributes:
        name: ``nvlink``, ``infinity_fabric``, ``ici``, ``pcie``, ... (``none`` if unknown).
        bw_bytes_s: bandwidth per direction per device, bytes/s.
        latency_s: latency of one small collective, s (the end used).
        source: where the figures come from.
        latency_optimistic_s: the optimistic end of the latency range, s (equal to
            ``latency_s`` when the device file or the caller gives one figure).
        wait_s: wait for the slowest rank at each synchronising collective, s (0: not
            measured for this link, the comm term is a lower bound).
    """

    name: str
    bw_bytes_s: float
    latency_s: float
    source: str
    latency_optimistic_s: float | None = None
    wait_s: float = 0.0

    @property
    def latency_low_s(self) -> float:
        """The optimistic end of the latency range, s."""
        return self.latency_s if self.latency_optimistic_s is None else self.latency_optimistic_s


@dataclass(frozen=True)
class ParallelPlan:
    """How the model is spread over devices.

    Attributes:
        tp: tensor-parallel degree.
        pp: pipeline stages.
        replicas: independent copies (data/request parallelism).
        microbatches: prefill micro-batches through the pipeline (default ``pp``).
        in_flight: decode batches kept in the pipeline at once (default ``pp``).
    """

    tp: int = 1
    pp: int = 1
    replicas: int = 1
    microbatches: int | None = None
    in_flight: int | None = None

    @property
    def devices(self) -> int:
        """Devices the plan uses."""
        return self.tp * self.pp * self.replicas


@dataclass(frozen=True)
class ParallelPrediction:
    """A static batch under a :class:`ParallelPlan` (per replica unless stated).

    Attributes:
        device: device key.
        plan: the plan.
        link: the link collectives use (``None`` when nothing is communicated).
        ttft_s: time to first token, communication included.
        tpot_s: time per output token of one sequence.
        e2e_s: ``ttft + (output_len − 1)·tpot``.
        throughput_tok_s: output tokens/s of all replicas together.
        compute_ttft_s: the prefill without communication (per-device roofline).
        compute_tpot_s: one decode step without communication.
        tp_comm_prefill_s: TP all-reduces and logits gather of the prefill.
        tp_comm_decode_s: the same for one decode step (typical latency, wait included).
        tp_comm_decode_optimistic_s: the decode-step TP term at the optimistic latency end.
        tp_wait_decode_s: the wait-for-the-slowest-rank part of ``tp_comm_decode_s``.
        allreduce_bytes_decode: bytes of one decode-step all-reduce message.
        collectives_per_step: all-reduces per forward pass.
        pp_comm_prefill_s: stage-to-stage sends of the prefill.
        pp_comm_decode_s: the same per decode step: ``pp − 1`` forward hops plus the return
            hop of the sampled tokens.
        pp_wait_prefill_s: waiting at the prefill's stage-to-stage hops on its critical path
            (``pp − 1`` of them, the link's measured per-synchronisation wait each; 0 when
            the device file has none); in ``ttft_s``, not in ``pp_comm_prefill_s``.
        pp_wait_decode_s: the same per decode step (``pp − 1`` forward hops and the return
            hop); in ``tpot_s``, not in ``pp_comm_decode_s``.
        bubble_prefill: idle share of the pipeline during prefill.
        bubble_decode: idle share of the pipeline during decode.
        stage_memory_bytes: per-device bytes (weights + KV) of each stage.
        device_memory_bytes: usable capacity counted against (``mem_usable_bytes`` when
            known, else the datasheet figure) times ``mem_fraction``.
        fits: every stage fits (``None`` when the capacity is unknown).
        assumptions: what the projection assumes, in words.
    """

    device: str
    plan: ParallelPlan
    link: Link | None
    ttft_s: float
    tpot_s: float
    e2e_s: float
    throughput_tok_s: float
    compute_ttft_s: float
    compute_tpot_s: float
    tp_comm_prefill_s: float
    tp_comm_decode_s: float
    tp_comm_decode_optimistic_s: float
    tp_wait_decode_s: float
    allreduce_bytes_decode: float
    collectives_per_step: int
    pp_comm_prefill_s: float
    pp_comm_decode_s: float
    bubble_prefill: float
    bubble_decode: float
    stage_memory_bytes: tuple[float, ...]
    device_memory_bytes: float | None
    fits: bool | None
    assumptions: tuple[str, ...] = field(default_factory=tuple)
    pp_wait_prefill_s: float = 0.0
    pp_wait_decode_s: float = 0.0

    def to_dict(self) -> JsonObject:
        """JSON-ready dict (SI units)."""
        d = asdict(self)
        d["devices"] = self.plan.devices
        d["stage_memory_bytes"] = list(self.stage_memory_bytes)
        d["assumptions"] = list(self.assumptions)
        return d


def ring_allreduce_time(nbytes: float, n: int, bw_bytes_s: float, latency_s: float) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` over ``n`` devices.

    Each device sends and receives ``2(n−1)/n · nbytes`` (reduce-scatter then all-gather)
    at ``bw_bytes_s`` per direction, after a fixed ``latency_s``. 0 for ``n <= 1``.
    """
    if n <= 1:
        return 0.0
    return latency_s + 2.0 * (n - 1) / n * nbytes / bw_bytes_s


def _gather_time(nbytes: float, n: int, bw_bytes_s: float, latency_s: float) -> float:
    if n <= 1:
        return 0.0
    return latency_s + (n - 1) / n * nbytes / bw_bytes_s


def _link_for(
    device: DeviceSpec, name: str | None, latency_s: float | None, bw_bytes_s: float | None
) -> Link:
    if bw_bytes_s is not None:
        bw, src = bw_bytes_s, "given"
        link_name = name or "given"
    else:
        picked = device.scale_up_link(name)
        if picked is None:
            wanted = f"no {name!r} link" if name else "no interconnect bandwidth"
            raise UsageError(
                f"device {device.key} lists {wanted}: give --link-bw GB/s (per direction) "
                "for the tensor/pipeline-parallel what-if"
            )
        link_name, bw = picked
        src = f"{device.key} [interconnect].{link_name} (bidirectional total ÷ 2)"
    low: float | None = None
    if latency_s is None:
        known = device.collective_latency_s.get(link_name)
        if known is not None:
            latency_s, lat_src = known, f"{device.key} [interconnect].{link_name}_latency"
        else:
            latency_s, low = DEFAULT_COLLECTIVE_LATENCY_S, OPTIMISTIC_COLLECTIVE_LATENCY_S
            lat_src = (
                f"default range {format_seconds(low)} (llm-analysis, optimistic) .. "
                f"{format_seconds(latency_s)} (nccl-tests small all-reduce on NVLink, "
                "typical); the typical end is used"
            )
    else:
        lat_src = "given"
    wait = device.collective_wait_s.get(link_name)
    if wait is not None:
        wait_src = (
            f"wait for the slowest rank {format_seconds(wait)} per collective "
            f"({device.key} [interconnect].{link_name}_wait, measured)"
        )
    else:
        wait, wait_src = 0.0, "no wait term: a lower bound"
    return Link(
        link_name,
        bw,
        latency_s,
        f"bandwidth: {src}; latency: {lat_src}; {wait_src}",
        latency_optimistic_s=low,
        wait_s=wait,
    )


def _kv_share(model: ModelSpec, tp: int, context_len: float) -> float:
    return kv_share_per_device(model, tp, context_len)


def predict_parallel(
    model: ModelSpec,
    device: DeviceSpec,
    plan: ParallelPlan,
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
    efficiency: float | None = None,
    link: str | None = None,
    link_bw_bytes_s: float | None = None,
    collective_latency_s: float | None = None,
    mem_fraction: float = DEFAULT_MEM_FRACTION,
) -> ParallelPrediction:
    """Project a static batch (per replica) under ``plan`` on identical ``device``\\ s.

    Args:
        batch: sequences per replica.
        prompt_len: prompt tokens per sequence.
        output_len: generated tokens per sequence.
        efficiency: fraction of speed of light the compute reaches (communication is
            modelled at its own rates).
        link: interconnect to use (``nvlink``, ``pcie``, ...); default the fastest.
        link_bw_bytes_s: per-direction bandwidth to use instead of the device file's.
        collective_latency_s: per-collective latency to use instead of the file's/default.
        mem_fraction: usable share of device memory for weights + KV cache.

    Raises:
        UsageError: a degree below 1, more stages than blocks, or no link bandwidth when one
            is needed.
    """
    for name in ("tp", "pp", "replicas"):
        if getattr(plan, name) < 1:
            raise UsageError(f"--{name} must be at least 1")
    tp, pp = plan.tp, plan.pp
    if pp > model.n_layers:
        raise UsageError(f"--pp {pp} exceeds the model's {model.n_layers} blocks")
    m = max(plan.microbatches or pp, 1)
    in_flight = max(plan.in_flight or pp, 1)
    batch = max(int(batch), 1)
    needs_link = tp > 1 or pp > 1
    lk = _link_for(device, link, collective_latency_s, link_bw_bytes_s) if needs_link else None

    base = predict(
        model,
        device,
        batch=batch,
        prompt_len=prompt_len,
        output_len=output_len,
        efficiency=efficiency,
        tp=tp,
        mem_fraction=mem_fraction,
    )
    steps = max(output_len - 1, 0)
    act = model.act_bytes_per_element
    d, v = model.hidden_size, model.vocab_size
    # one per mixer and one per MLP (a Mamba block: one) + the embedding
    collectives = allreduces_per_pass(model)
    per_layer = (collectives - 1) / model.n_layers
    per_block = f"{per_layer:g} per block" if per_layer.is_integer() else "1 per mixer and MLP"

    # Tensor parallel communication.
    tp_pre = tp_dec = tp_dec_low = tp_wait = 0.0
    msg_dec = batch * d * act
    if tp > 1 and lk is not None:
        msg_pre = batch * prompt_len * d * act
        synced = collectives + 1  # the all-reduces and the logits gather
        tp_wait = synced * lk.wait_s
        tp_pre = collectives * ring_allreduce_time(msg_pre, tp, lk.bw_bytes_s, lk.latency_s)
        tp_pre += _gather_time(batch * v * act, tp, lk.bw_bytes_s, lk.latency_s) + tp_wait
        tp_dec = collectives * ring_allreduce_time(msg_dec, tp, lk.bw_bytes_s, lk.latency_s)
        tp_dec += _gather_time(batch * v * act, tp, lk.bw_bytes_s, lk.latency_s) + tp_wait
        low = lk.latency_low_s
        tp_dec_low = collectives * ring_allreduce_time(msg_dec, tp, lk.bw_bytes_s, low)
        tp_dec_low += _gather_time(batch * v * act, tp, lk.bw_bytes_s, low) + tp_wait

    # Pipeline: stage times from the single-pipeline (TP-split) roofline.
    compute_ttft = float(base["ttft_s"])
    compute_tpot = float(base["tpot_s"])
    pp_pre = pp_dec = pp_wait_pre = pp_wait_dec = 0.0
    bubble_pre = bubble_dec = 0.0
    ttft = compute_ttft + tp_pre
    tpot = compute_tpot + tp_dec
    throughput_factor = 1.0
    if pp > 1 and lk is not None:
        micro = max(math.ceil(batch / m), 1)
        micro_pred = predict(
            model,
            device,
            batch=micro,
            prompt_len=prompt_len,
            output_len=1,
            efficiency=efficiency,
            tp=tp,
            mem_fraction=mem_fraction,
        )
        stage_pre = float(micro_pred["ttft_s"]) / pp
        hop_pre = lk.latency_s + micro * prompt_len * d * act / lk.bw_bytes_s
        hops = pp - 1
        pp_pre = hops * hop_pre  # sends on the critical path
        # A blocking receive is a synchronisation like a collective: on a loaded host the
        # receiving stage waits to be scheduled, the link's measured per-collective wait.
        pp_wait_pre = hops * lk.wait_s
        tp_pre_micro = tp_pre * micro / batch if tp > 1 else 0.0
        ttft = (m + pp - 1) * (stage_pre + tp_pre_micro / pp) + pp_pre + pp_wait_pre
        bubble_pre = (pp - 1) / (m + pp - 1)
        hop_dec = lk.latency_s + batch * d * act / lk.bw_bytes_s
        hop_back = lk.latency_s + batch * TOKEN_ID_BYTES / lk.bw_bytes_s
        pp_dec = hops * hop_dec + hop_back
        pp_wait_dec = (hops + 1) * lk.wait_s
        # more batches than stages queue at each stage
        tpot = (compute_tpot + tp_dec) * max(in_flight, pp) / pp + pp_dec + pp_wait_dec
        busy = min(in_flight, pp) / pp
        bubble_dec = 1.0 - busy
        throughput_factor = min(in_flight, pp)

    e2e = ttft + steps * tpot
    # Throughput of a replica: with k batches in flight their prefills share the pipeline
    # ((k·m + pp − 1) stage times), then they decode together.
    cycle = e2e
    if pp > 1:
        k = throughput_factor
        sends = pp_pre + pp_wait_pre
        cycle = (k * m + pp - 1) * (ttft - sends) / (m + pp - 1) + sends + steps * tpot
    per_replica = throughput_factor * batch * output_len / cycle if cycle > 0 else 0.0
    throughput = per_replica * plan.replicas

    # Memory per device of each stage.
    share = _kv_share(model, tp, prompt_len + output_len)
    emb = embedding_table_bytes(model)
    head = lm_head_bytes(model)
    blocks = weight_bytes(model) - emb - head
    kv_seq = kv_cache_bytes_per_sequence(model, prompt_len + output_len)
    batches_held = min(in_flight, pp) if pp > 1 else 1
    kv = batches_held * batch * kv_seq * share
    stages = []
    for s in range(pp):
        layers = model.n_layers // pp + (1 if s < model.n_layers % pp else 0)
        frac = layers / model.n_layers
        w = blocks * frac / tp
        if s == 0:
            w += emb / tp
        if s == pp - 1:
            w += head / tp
        if model.tied_embeddings and pp > 1 and s == pp - 1:
            w += emb / tp  # the last stage needs its own copy of a tied table
        stages.append(w + kv * frac)
    cap_raw = device.mem_usable_bytes or device.mem_bytes
    cap = cap_raw * mem_fraction if cap_raw else None
    fits = None if cap is None else max(stages) <= cap

    assumptions = [
        "compute at the roofline of each device's share"
        + (f", derated to {efficiency:.0%}" if efficiency is not None else " (speed of light)"),
    ]
    if tp > 1 and lk is not None:
        assumptions.append(
            f"TP {tp}: {collectives} ring all-reduces per forward pass ({per_block} + "
            f"embedding) of tokens x d x {act:g} B, plus a logits gather, at "
            f"{format_si(lk.bw_bytes_s, 'B/s', 4)} per direction over {lk.name} and "
            f"{format_seconds(lk.latency_s)} each; no overlap with compute; decode TP "
            f"comm {format_seconds(tp_dec)} (at {format_seconds(lk.latency_low_s)} latency: "
            f"{format_seconds(tp_dec_low)}), of which waiting for the slowest rank "
            f"{format_seconds(tp_wait)}"
        )
        if model.is_mla:
            assumptions.append("MLA latent cache replicated on every TP rank")
        elif model.n_attention_layers and tp > model.n_kv_heads:
            assumptions.append(f"KV heads ({model.n_kv_heads}) replicated across TP {tp}")
    if pp > 1:
        assumptions.append(
            f"PP {pp}: equal stages (embedding on the first, lm_head on the last); prefill "
            f"in {m} micro-batches (GPipe bubble {bubble_pre:.0%}); decode with {in_flight} "
            f"batch(es) in flight (pipeline busy {1 - bubble_dec:.0%}); "
            f"{pp - 1} stage-to-stage sends per pass, plus per decode step the return hop "
            "of the sampled tokens to the first stage"
            + (" (one per batch in flight)" if in_flight > 1 else "")
            + (
                f"; each hop waits {format_seconds(lk.wait_s)} for the receiving stage (the "
                f"link's measured per-collective wait): {format_seconds(pp_wait_dec)} a "
                "decode step"
                if lk is not None and lk.wait_s > 0
                else ""
            )
        )
    if plan.replicas > 1:
        assumptions.append(
            f"{plan.replicas} replicas: requests split evenly, throughput x{plan.replicas}, "
            "latency unchanged, no shared bottleneck"
        )
    if lk is not None:
        assumptions.append(lk.source)
    if device.mem_usable_bytes:
        assumptions.append("memory: the device's usable capacity, not the datasheet figure")

    return ParallelPrediction(
        device=device.key,
        plan=plan,
        link=lk,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        throughput_tok_s=throughput,
        compute_ttft_s=compute_ttft,
        compute_tpot_s=compute_tpot,
        tp_comm_prefill_s=tp_pre,
        tp_comm_decode_s=tp_dec,
        tp_comm_decode_optimistic_s=tp_dec_low,
        tp_wait_decode_s=tp_wait,
        allreduce_bytes_decode=msg_dec if tp > 1 else 0.0,
        collectives_per_step=collectives if tp > 1 else 0,
        pp_comm_prefill_s=pp_pre,
        pp_comm_decode_s=pp_dec,
        pp_wait_prefill_s=pp_wait_pre,
        pp_wait_decode_s=pp_wait_dec,
        bubble_prefill=bubble_pre,
        bubble_decode=bubble_dec,
        stage_memory_bytes=tuple(stages),
        device_memory_bytes=cap,
        fits=fits,
        assumptions=tuple(assumptions),
    )
