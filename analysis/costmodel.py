"""FLOPs and bytes of one forward pass of a decoder-only transformer (docs/architecture.md).

Counting conventions (hardware.md §8, §9 lists where other tools differ):

- A matmul of ``m x k`` by ``k x n`` is ``2·m·n·k`` FLOP, as ``FlopCounterMode`` counts it.
  Norms, softmax, activations functions, RoPE and residual adds are not counted (they are
  ≪1 % and FlopCounterMode counts them as 0 too).
- Linear layers: ``2 · tokens · params`` for the attention projections, the MLP (gated:
  gate, up, down; plain: up, down), the MoE router and the active experts.
- lm_head: ``2 · d · V`` per position that produces logits: the last position of each row
  in prefill (serving engines), or every prompt position when
  :attr:`ModelSpec.lm_head_all_positions` is set (HF ``forward``, llm-analysis).
- Attention, "as executed": ``4 · L · H · h_d · q · kv`` per row, where a row brings ``q``
  new tokens and attends over ``kv = cached + q`` keys: the full masked square in prefill,
  the whole cache in decode. That is what eager attention (and FlopCounterMode) does.
  "Causal-useful": only the unmasked half, ``4 · L · H · h_d · (q·cached + q(q+1)/2)``.
  GQA shares K/V between heads but does not reduce attention FLOPs.
- Per-layer attention (:meth:`ModelSpec.layer_attention`): full layers attend over every
  cached key; sliding-window layers over the last ``w − 1`` cached keys plus the new ones
  (HF's sliding cache; the first, cache-less pass still computes the masked square);
  chunked layers over their own chunk (causal-useful count exact, as executed bounded like
  a window of the chunk size).
- MLA (DeepSeek-V2/V3): the cache holds the latent ``r`` and the rotary key ``h_rope`` per
  token and layer. Naive (HF transformers, vLLM prefill): the latent of every attended key
  is expanded by ``kv_b`` (``2·r·H·(h_nope + h_v)`` per key), scores over ``h_nope + h_rope``
  and values over ``h_v``. Absorbed (vLLM/SGLang decode): ``kv_b`` is folded into the
  query and output (``2·r·H·(h_nope + h_v)`` per new token), scores over ``r + h_rope`` and
  values over ``r``. By default decode steps (one new token per row) are absorbed and
  prefill steps expanded, as vLLM and SGLang run them (:func:`mla_mode`).
- State-space (Mamba) blocks, as transformers' torch path runs them under FlopCounterMode:
  the matmuls ``2·(d·2I + I·(R + 2N) + R·I + I·d)`` per token (``in_proj``, ``x_proj``,
  ``dt_proj``, ``out_proj``; Mamba2: ``in_proj``, ``out_proj``), the scan (Mamba: its
  output product ``2·I·N`` per token, the discretisation and state update being
  elementwise; Mamba2: the chunked SSD scan, padded to whole chunks, in every step but a
  cached one-token one) and the depthwise causal conv over the positions transformers
  pads it to (:func:`_ssm_mixing_flops`). These count as
  ``flops_attention``, the sequence mixing. The recurrent state (:attr:`ModelSpec.
  state_bytes_per_seq`, constant in context) is read by every step that has one and
  written by every step: it is the ``bytes_kv_*`` of such a model.
- MoE: router, shared experts and dense blocks always run; a token runs
  ``n_active_experts`` routed experts.
- Sparse weights (:attr:`ModelSpec.weight_density` < 1): block-matrix FLOPs and bytes
  scale with the density, and each stored weight adds its index bytes.
- Bytes: weights are read once per step for the whole batch (MoE: only experts that some
  token in the step routes to, in expectation under uniform routing,
  :func:`expected_active_experts`); quantised checkpoints add zero points and ``g_idx`` and
  keep embedding, lm_head and router 16-bit; KV read = the cached entries each layer type
  reads × its KV bytes per token; KV written = new tokens × KV bytes per token;
  activations = the inputs and outputs of each layer's matmuls plus norms and residuals;
  the attention score matrix is assumed to stay on chip (fused/flash attention) unless
  ``materialized_scores`` is set.

Steps carry sums over rows (``new_tokens``, ``context_tokens``); the per-row split assumes
equal rows, which is exact for prefill of equal-length prompts and for decode.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from perfscope.analysis.modelspec import ModelSpec

__all__ = [
    "GenerationCost",
    "KvCacheGroup",
    "StepCost",
    "allreduces_per_pass",
    "attention_params_per_layer",
    "conv_params_per_layer",
    "decode_cost",
    "embedding_table_bytes",
    "expected_active_experts",
    "generation_cost",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_cache_bytes_per_sequence",
    "kv_cache_layout",
    "kv_share_per_device",
    "linear_params_per_layer",
    "lm_head_bytes",
    "matmul_params",
    "medusa_head_cost",
    "mla_mode",
    "mlp_params_per_expert",
    "model_assumptions",
    "operator_class_costs",
    "param_count",
    "prefill_cost",
    "ssm_params_per_layer",
    "step_cost",
    "step_costs",
    "weight_bytes",
]

FloatArray = npt.NDArray[np.float64]
ArrayLike = float | int | npt.ArrayLike


# ---------------------------------------------------------------------- parameters


def attention_params_per_layer(spec: ModelSpec) -> int:
    """Matmul weights of the attention in one block.

    Ordinary attention: Q, K, V and O, ``d·H·h_d + 2·d·K·h_d + H·h_d·d`` (Q, K and V from
    :attr:`~ModelSpec.attention_input_width` when set; a Qwen3-Next output gate adds
    ``d·H·h_d``; :attr:`~ModelSpec.attention_extra_params` are added). MLA: the query
    path (``d·q_r + q_r·H·h_qk`` with query compression, else ``d·H·h_qk``), the KV
    down-projection ``d·(r + h_rope)``, the KV up-projection ``r·H·(h_nope + h_v)`` and the
    output ``H·h_v·d``.
    """
    d, h = spec.hidden_size, spec.n_heads
    if spec.is_mla:
        qr, r = spec.q_lora_rank, spec.kv_lora_rank
        q = d * qr + qr * h * spec.head_dim if qr else d * h * spec.head_dim
        kv_a = d * (r + spec.qk_rope_head_dim)
        kv_b = r * h * (spec.qk_nope_head_dim + spec.v_head_dim)
        return q + kv_a + kv_b + h * spec.v_head_dim * d + spec.attention_extra_params
    hd = spec.head_dim
    din = spec.attention_input_width or d
    gate = din * h * hd if spec.attn_output_gate else 0
    qkv = din * (h + 2 * spec.n_kv_heads) * hd
    return qkv + h * hd * d + gate + spec.attention_extra_params


def ssm_params_per_layer(spec: ModelSpec) -> int:
    """Matmul weights of one Mamba mixer: ``d·2I + I·(R + 2N) + R·I + I·d`` (0 without SSM).

    ``in_proj`` (x and gate), ``x_proj`` (dt, B, C), ``dt_proj`` and ``out_proj``; the conv,
    ``A_log`` and ``D`` are vectors per channel, counted with the small parameters.
    """
    if not spec.is_ssm:
        return 0
    d, i = spec.hidden_size, spec.ssm_inner_size
    r, n = spec.ssm_time_step_rank, spec.ssm_state_size
    if spec.ssm_n_heads:  # Mamba2: in_proj to gate, x, B, C and dt; out_proj
        return d * (i + spec.ssm_conv_dim + spec.ssm_n_heads) + i * d
    return d * 2 * i + i * (r + 2 * n) + r * i + i * d


def _ssm_small_params(spec: ModelSpec) -> int:
    """One Mamba mixer's non-matmul parameters: ``A_log`` ``I·N``, ``D`` ``I``, the conv
    ``I·K`` (and bias ``I``), the ``dt_proj`` bias ``I``, the in/out biases ``2I + d``."""
    if not spec.is_ssm:
        return 0
    i, cd = spec.ssm_inner_size, spec.ssm_conv_dim
    if spec.ssm_n_heads:  # Mamba2: A_log, D, dt_bias per head; the gated norm; the conv
        n = 3 * spec.ssm_n_heads + (i if spec.ssm_gated_norm else 0) + cd * spec.ssm_conv_kernel
    else:
        n = i * spec.ssm_state_size + i + i * spec.ssm_conv_kernel + i
        if spec.ssm_bcdt_norms:  # Jamba: weighted RMS norms on dt, B and C
            n += spec.ssm_time_step_rank + 2 * spec.ssm_state_size
    if spec.ssm_conv_bias:
        n += cd
    if spec.ssm_proj_bias:  # in_proj's outputs (Mamba2: gate, conv channels, dt) and d
        n += (i + cd + spec.ssm_n_heads if spec.ssm_n_heads else 2 * i) + spec.hidden_size
    return n


def conv_params_per_layer(spec: ModelSpec) -> int:
    """Matmul weights of one LFM2 short-conv mixer: ``in_proj`` ``d → 3d`` and ``out_proj``
    ``d → d`` (0 without such blocks); the depthwise conv is a vector per channel."""
    return 4 * spec.hidden_size * spec.hidden_size if spec.short_conv_kernel else 0


def _conv_small_params(spec: ModelSpec) -> int:
    """One short-conv mixer's conv weights ``d·L`` and, with ``conv_bias``, the biases of
    ``in_proj`` (3d), the conv (d) and ``out_proj`` (d)."""
    d = spec.hidden_size
    return d * spec.short_conv_kernel + (5 * d if spec.short_conv_bias else 0)


def linear_params_per_layer(spec: ModelSpec) -> int:
    """Matmul weights of one gated DeltaNet mixer: ``in_proj_qkvz`` ``d → 2·h_k·d_k +
    2·h_v·d_v`` (q, k, v and the output gate z), ``in_proj_ba`` ``d → 2·h_v`` (β and the
    decay) and ``out_proj`` ``h_v·d_v → d`` (0 without such blocks)."""
    if not spec.linear_key_heads:
        return 0
    d, kd = spec.hidden_size, spec.linear_key_heads * spec.linear_key_head_dim
    vd = spec.linear_value_heads * spec.linear_value_head_dim
    if spec.linear_kda:  # q, k, v, o; forget and output gates (low-rank or full); beta
        r = spec.linear_gate_rank
        gates = 2 * (d * r + r * vd) if r else 2 * d * vd
        return d * (2 * kd + vd) + vd * d + gates + d * spec.linear_value_heads
    return d * (2 * kd + 2 * vd) + d * 2 * spec.linear_value_heads + vd * d


def _linear_small_params(spec: ModelSpec) -> int:
    """One gated DeltaNet mixer's conv weights (no bias), ``dt_bias`` and ``A_log`` per value
    head, and its gated norm over ``d_v``."""
    if spec.linear_kda:  # dt_bias per channel, A_log per head
        vd = spec.linear_value_heads * spec.linear_value_head_dim
        heads = vd + spec.linear_value_heads
    else:  # dt_bias and A_log per value head
        heads = 2 * spec.linear_value_heads
    return spec.linear_conv_dim * spec.linear_conv_kernel + heads + spec.linear_value_head_dim


def _linear_mixing_flops(spec: ModelSpec, q: FloatArray, c: FloatArray) -> tuple[Any, Any]:
    """Sequence-mixing FLOPs of one gated DeltaNet block per row with ``q`` new tokens, as
    transformers' torch path runs them under FlopCounterMode, and the useful part.

    The conv over :attr:`ModelSpec.linear_conv_dim` channels (:func:`_causal_conv_flops`).
    A cached one-token step runs the recurrent rule, all elementwise: 0 more. Any other step
    runs the chunked rule padded to ``k = ceil(q/C)`` chunks of ``C`` tokens, per value
    head: ``4·C²·d_k`` (the UT system and the intra-chunk scores), ``2·C²·d_v`` (the
    intra-chunk values) and ``6·C·d_k·d_v`` (reading the state twice, writing it once) per
    chunk; the two triangular solves of the UT transform count 0, as FlopCounterMode
    counts them. Useful: ``2·C_conv·K`` conv and ``4·h_v·d_k·d_v`` (read and update the
    state) per token.
    """
    cd, k = float(spec.linear_conv_dim), float(spec.linear_conv_kernel)
    hv = float(spec.linear_value_heads)
    dk, dv = float(spec.linear_key_head_dim), float(spec.linear_value_head_dim)
    cs = float(spec.linear_chunk_size)
    conv = _causal_conv_flops(cd, k, q, c)
    step = (q <= 1.0) & (c > 0)
    chunks = np.ceil(q / cs)
    # Kimi Delta Attention's torch rule swaps the roles: 2·C²·d_k + 4·C²·d_v
    wide, narrow = (dv, dk) if spec.linear_kda else (dk, dv)
    chunked = chunks * hv * (4.0 * cs * cs * wide + 2.0 * cs * cs * narrow + 6.0 * cs * dk * dv)
    useful = q * (2.0 * cd * k + 4.0 * hv * dk * dv)
    return conv + np.where(step, 0.0, chunked), useful


def _lightning_params(spec: ModelSpec) -> int:
    """Matmul weights of one MiniMax lightning-attention mixer: ``qkv_proj`` ``d → 3·H·h_d``,
    ``output_gate`` ``d → H·h_d`` and ``out_proj`` ``H·h_d → d``."""
    return 5 * spec.hidden_size * spec.n_heads * spec.head_dim


def _lightning_mixing_flops(spec: ModelSpec, q: FloatArray, c: FloatArray) -> tuple[Any, Any]:
    """Sequence-mixing FLOPs of one lightning-attention block per row with ``q`` new tokens,
    as transformers runs them. Without a state: blocks of ``b`` tokens (the last one
    shorter, not padded), each head ``4·n²·h_d`` within a block of ``n`` (scores and values)
    and ``4·n·h_d²`` across blocks (reading and updating the ``h_d × h_d`` state). With a
    state, token by token: ``4·h_d²`` per token and head. Useful: ``4·H·h_d²`` per token."""
    h, hd, bs = float(spec.n_heads), float(spec.head_dim), float(spec.lightning_block_size)
    full = np.floor(q / bs)
    rest = q - full * bs
    blocks = 4.0 * hd * (full * bs * bs + rest * rest)
    recurrent = 4.0 * q * hd * hd
    return h * (np.where(c > 0, 0.0, blocks) + recurrent), h * recurrent


def _mixer_params(spec: ModelSpec, mixer: str) -> int:
    """Matmul weights of one block's sequence mixer (:meth:`ModelSpec.mixers`)."""
    n = 0
    parts = mixer.split("+")
    if "attention" in parts:
        n += attention_params_per_layer(spec)
    if "ssm" in parts:
        n += ssm_params_per_layer(spec)
    if mixer == "conv":
        n += conv_params_per_layer(spec)
    if mixer == "linear":
        n += linear_params_per_layer(spec)
    if mixer == "lightning":
        n += _lightning_params(spec)
    return n


def _layer_kinds(spec: ModelSpec) -> tuple[tuple[str, bool, bool], ...]:
    """``(mixer, moe, has_mlp)`` of every block, in order."""
    return tuple(zip(spec.mixers(), spec.moe_layer_mask(), spec.mlp_layer_mask(), strict=True))


def _causal_conv_flops(channels: float, k: float, q: FloatArray, c: FloatArray) -> Any:
    """FLOPs of transformers' depthwise causal conv of width ``k`` over ``channels`` per row
    with ``q`` new tokens (``c`` cached tokens summed over rows): ``2·channels·k`` per
    output position, over ``max(q, k) + k − 1`` positions without a state, 2 in a cached
    one-token step and ``q + 2k − 1`` in a cached multi-token step."""
    step = (q <= 1.0) & (c > 0)
    conv_len = np.where(c > 0, np.where(step, 2.0, q + 2.0 * k - 1.0), np.maximum(q, k) + k - 1.0)
    return 2.0 * channels * k * conv_len


def _conv_mixing_flops(spec: ModelSpec, q: FloatArray, c: FloatArray) -> tuple[Any, Any]:
    """Sequence-mixing FLOPs of one LFM2 short-conv block per row (the conv over ``d``
    channels, :func:`_causal_conv_flops`) and their useful part, ``2·d·L`` per token."""
    d, k = float(spec.hidden_size), float(spec.short_conv_kernel)
    return _causal_conv_flops(d, k, q, c), q * 2.0 * d * k


def _ssm_mixing_flops(spec: ModelSpec, q: FloatArray, c: FloatArray) -> tuple[Any, Any]:
    """Sequence-mixing FLOPs of one SSM block per row with ``q`` new tokens (``c`` cached
    tokens summed over rows), as transformers 5.24's torch path runs them under
    FlopCounterMode, and their useful part (``2·C·K`` conv + ``2·I·N`` scan per token).

    The depthwise conv (``2·C·K`` per output position, ``C`` = :attr:`ModelSpec.
    ssm_conv_dim`) runs over ``max(q, K) + K − 1`` positions without a state (the input
    padded to ``K``, then padded ``K − 1`` both sides), over 2 in a cached one-token step
    (the ``K`` cached inputs and the new one, unpadded) and over ``q + 2K − 1`` in a cached
    multi-token step (cached inputs prepended, then padded).
    Mamba: the scan's output product, ``2·I·N`` per token.
    Mamba2: a cached one-token step updates the state (``2·I·N``); any other step runs the
    chunked SSD scan padded to ``k = ceil(q/Q)`` chunks: ``2·k·H·Q²·(N + P)`` (intra-chunk
    scores and values), ``4·k·H·Q·P·N`` (chunk states and their output) and
    ``2·H·(k+1)²·P·N`` (the inter-chunk recurrence).
    """
    i, n, k = float(spec.ssm_inner_size), float(spec.ssm_state_size), float(spec.ssm_conv_kernel)
    cd = float(spec.ssm_conv_dim)
    useful = q * (2.0 * cd * k + 2.0 * i * n)
    step = (q <= 1.0) & (c > 0)
    conv = _causal_conv_flops(cd, k, q, c)
    if not spec.ssm_n_heads:
        return conv + 2.0 * i * n * q, useful
    h, p = float(spec.ssm_n_heads), float(spec.ssm_head_dim)
    qc = float(spec.ssm_chunk_size)
    chunks = np.ceil(q / qc)
    ssd = (
        2.0 * chunks * h * qc * qc * (n + p)
        + 4.0 * chunks * h * qc * p * n
        + 2.0 * h * (chunks + 1.0) ** 2 * p * n
    )
    return conv + np.where(step, 2.0 * i * n, ssd), useful


def _mla_kv_b_params(spec: ModelSpec) -> int:
    return spec.kv_lora_rank * spec.n_heads * (spec.qk_nope_head_dim + spec.v_head_dim)


def mlp_params_per_expert(spec: ModelSpec) -> int:
    """Matmul weights of one MLP (one routed expert for MoE): ``3·d·F`` gated, ``2·d·F`` plain."""
    return (3 if spec.mlp_gated else 2) * spec.hidden_size * spec.intermediate_size


def _dense_mlp_params(spec: ModelSpec) -> int:
    """The MLP of a dense block (a MoE model's dense blocks use ``dense_intermediate_size``)."""
    f = spec.dense_intermediate_size if spec.is_moe else spec.intermediate_size
    return (3 if spec.mlp_gated else 2) * spec.hidden_size * f


def _shared_params(spec: ModelSpec) -> int:
    fs = spec.shared_expert_intermediate_size
    gate = spec.hidden_size if spec.shared_expert_gate else 0
    return (3 if spec.mlp_gated else 2) * spec.hidden_size * fs + gate


def _router_params(spec: ModelSpec) -> int:
    return spec.hidden_size * spec.n_experts if spec.is_moe else 0


def _mlp_params(spec: ModelSpec, moe_layer: bool, experts: float) -> float:
    if not moe_layer:
        return float(_dense_mlp_params(spec))
    return _router_params(spec) + _shared_params(spec) + experts * mlp_params_per_expert(spec)


def _proj_params(spec: ModelSpec) -> int:
    """OPT-350m's project_in and project_out (``e → d`` and ``d → e``), 0 otherwise."""
    e, d = spec.embedding_width, spec.hidden_size
    return 2 * d * e if e != d else 0


def _lm_head_bytes(spec: ModelSpec) -> float:
    """Bytes of the lm_head matrix: 16-bit, or quantised as the blocks (GPTQ ``lm_head``)."""
    e = spec.embedding_width
    params = float(e * spec.vocab_size)
    if spec.quant_lm_head:
        per = spec.weight_bytes_per_param + spec.quant_zero_bytes_per_param
        return params * per + e * spec.quant_index_bytes_per_input
    return params * spec.embedding_bytes_per_param


def lm_head_bytes(spec: ModelSpec) -> float:
    """Bytes the untied lm_head occupies (0 when tied to the embedding)."""
    return 0.0 if spec.tied_embeddings else _lm_head_bytes(spec)


def embedding_table_bytes(spec: ModelSpec) -> float:
    """Bytes of the token and position tables and OPT-350m's in/out projections."""
    d = spec.hidden_size
    n = spec.vocab_size * spec.embedding_width + spec.pos_embeddings * d + _proj_params(spec)
    return n * spec.embedding_bytes_per_param


def matmul_params(spec: ModelSpec, *, active: bool = False, lm_head: bool = True) -> int:
    """Parameters that take part in matmuls (``N_mat``; the embedding lookup is not one).

    Args:
        active: count only the routed experts a token goes to (MoE), i.e. the parameters
            whose FLOPs one token pays (shared experts and dense blocks always count);
            otherwise every expert.
        lm_head: include the ``e·V`` output projection (counted even when tied).
    """
    experts = spec.n_active_experts if active else spec.n_experts
    total = float(_proj_params(spec))
    for mixer, moe_layer, has_mlp in _layer_kinds(spec):
        total += _mixer_params(spec, mixer)
        total += _mlp_params(spec, moe_layer, experts) if has_mlp else 0.0
    if lm_head:
        total += spec.embedding_width * spec.vocab_size
    return int(total)


def _layer_small_params(spec: ModelSpec, mixer: str, moe_layer: bool, has_mlp: bool) -> int:
    norm = spec.hidden_size * (2 if spec.norm_bias else 1)
    n = spec.norms_per_layer * norm
    parts = mixer.split("+")
    if "ssm" in parts:
        n += _ssm_small_params(spec)
    if mixer == "conv":
        n += _conv_small_params(spec)
    if mixer == "linear":
        n += _linear_small_params(spec)
    if mixer == "lightning":  # the norm over H·h_d
        n += spec.n_heads * spec.head_dim
    if "attention" in parts:
        n += _attention_small_params(spec)
    if has_mlp:
        n += _mlp_small_params(spec, moe_layer)
    return n


def _attention_small_params(spec: ModelSpec) -> int:
    """One attention's biases, q/k norms, MLA norms and sink logits."""
    d, hd = spec.hidden_size, spec.head_dim
    n = 0
    if spec.is_mla:
        qr, r = spec.q_lora_rank, spec.kv_lora_rank
        n += qr + r  # q_a_layernorm, kv_a_layernorm
        if spec.qkv_bias:
            n += qr + r + spec.qk_rope_head_dim
    elif spec.qkv_bias:
        gate = spec.n_heads if spec.attn_output_gate and spec.attn_gate_bias else 0
        n += (spec.n_heads + 2 * spec.n_kv_heads + gate) * hd
    if spec.o_bias:
        n += d
    if spec.attention_sinks:
        n += spec.n_heads
    if spec.qk_norm:
        width = (spec.n_heads + spec.n_kv_heads) * hd if spec.qk_norm_full else 2 * hd
        n += width * (2 if spec.norm_bias else 1)
    return n


def _mlp_small_params(spec: ModelSpec, moe_layer: bool) -> int:
    """One MLP's (every expert's) biases and the router's bias."""
    d = spec.hidden_size
    n = 0
    if spec.mlp_bias:
        if moe_layer:
            f, fs = spec.intermediate_size, spec.shared_expert_intermediate_size
            if spec.expert_bias:
                n += spec.n_experts * ((2 * f if spec.mlp_gated else f) + d)
            if fs:  # the shared expert is an MLP built with the same biases
                n += (2 * fs if spec.mlp_gated else fs) + d
        else:
            f = spec.dense_intermediate_size if spec.is_moe else spec.intermediate_size
            n += (2 * f if spec.mlp_gated else f) + d
    if moe_layer and spec.router_bias:
        n += spec.n_experts
    return n


@functools.lru_cache(maxsize=256)
def _small_params(spec: ModelSpec) -> int:
    """Norm weights/biases and linear biases: vectors, not matrices."""
    norm = spec.hidden_size * (2 if spec.norm_bias else 1)
    total = sum(_layer_small_params(spec, *kind) for kind in _layer_kinds(spec))
    head_bias = spec.vocab_size if spec.lm_head_bias else 0
    return total + (norm if spec.final_norm else 0) + head_bias


def param_count(spec: ModelSpec) -> int:
    """Stored parameters, exactly as ``sum(p.numel() for p in model.parameters())``.

    Embedding table, learned position table, every block's matrices, biases and norms, the
    final norm, and the lm_head unless tied to the embedding.
    """
    d, v, e = spec.hidden_size, spec.vocab_size, spec.embedding_width
    total = matmul_params(spec, lm_head=False) + _small_params(spec)
    total += v * e  # embedding
    total += spec.pos_embeddings * d
    if not spec.tied_embeddings:
        total += v * e
    return total + spec.extra_params


def _linear_inputs(
    spec: ModelSpec, moe_layer: bool, experts: Any, mixer: str = "attention", has_mlp: bool = True
) -> Any:
    """Sum of the input widths of one block's quantised linears (for GPTQ ``g_idx``)."""
    d = spec.hidden_size
    parts = mixer.split("+")
    attn: Any = 0
    if "ssm" in parts:  # in_proj, x_proj, dt_proj, out_proj (Mamba2: in_proj, out_proj)
        if spec.ssm_n_heads:
            attn += d + spec.ssm_inner_size
        else:
            attn += d + 2 * spec.ssm_inner_size + spec.ssm_time_step_rank
    if mixer == "conv":  # in_proj, out_proj
        attn += 2 * d
    if mixer == "linear":  # in_proj_qkvz, in_proj_ba, out_proj (KDA: q,k,v,f,b,g, o)
        vd = spec.linear_value_heads * spec.linear_value_head_dim
        attn += (6 * d + 2 * spec.linear_gate_rank + vd) if spec.linear_kda else 2 * d + vd
    if mixer == "lightning":  # qkv_proj, output_gate, out_proj
        attn += 2 * d + spec.n_heads * spec.head_dim
    if "attention" in parts:
        if spec.is_mla:
            attn += (2 * d + spec.q_lora_rank if spec.q_lora_rank else 2 * d) + spec.kv_lora_rank
            attn += spec.n_heads * spec.v_head_dim
        else:
            attn += 3 * d + spec.n_heads * spec.head_dim
    if not has_mlp:
        return attn
    per_mlp = 2 * d if spec.mlp_gated else d
    if not moe_layer:
        f = spec.dense_intermediate_size if spec.is_moe else spec.intermediate_size
        return attn + per_mlp + f
    shared = (
        per_mlp + spec.shared_expert_intermediate_size
        if spec.shared_expert_intermediate_size
        else 0
    )
    return attn + shared + experts * (per_mlp + spec.intermediate_size)


def _quantised_bytes(spec: ModelSpec, params: Any, inputs: Any) -> Any:
    """Bytes of quantised block matrices: weights and scales, zero points, ``g_idx``; of a
    sparse model only the stored weights (:attr:`ModelSpec.weight_density`) and their
    indices."""
    per = spec.weight_bytes_per_param + spec.quant_zero_bytes_per_param
    if spec.weight_density < 1.0:
        per = spec.weight_density * (per + spec.weight_index_bytes_per_nonzero)
    return params * per + inputs * spec.quant_index_bytes_per_input


def weight_bytes(spec: ModelSpec) -> float:
    """Bytes the weights occupy in device memory.

    Block matrices at :attr:`ModelSpec.weight_bytes_per_param` (plus zero points and
    ``g_idx`` of a quantised checkpoint); embedding tables, lm_head and router at
    :attr:`ModelSpec.embedding_bytes_per_param` (16-bit in quantised checkpoints); norm and
    bias vectors at the activation width.
    """
    d, v, e = spec.hidden_size, spec.vocab_size, spec.embedding_width
    blocks = 0.0
    for mixer, moe_layer, has_mlp in _layer_kinds(spec):
        params = float(_mixer_params(spec, mixer))
        params += _mlp_params(spec, moe_layer, spec.n_experts) if has_mlp else 0.0
        params -= _router_params(spec) if moe_layer else 0
        inputs = _linear_inputs(spec, moe_layer, spec.n_experts, mixer, has_mlp)
        blocks += _quantised_bytes(spec, params, inputs)
    n_moe = sum(spec.moe_layer_mask())
    tables = v * e + spec.pos_embeddings * d + _proj_params(spec)
    tables += n_moe * _router_params(spec) + spec.extra_params
    head = 0.0 if spec.tied_embeddings else _lm_head_bytes(spec)
    return (
        blocks
        + head
        + tables * spec.embedding_bytes_per_param
        + _small_params(spec) * spec.act_bytes_per_element
    )


def _kv_layer_bytes_per_token(spec: ModelSpec) -> float:
    """KV-cache bytes one token occupies in one block."""
    if spec.is_mla:
        # The latent and the shared rotary key (vLLM/SGLang and HF all cache these).
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * spec.kv_bytes_per_element
    return 2.0 * spec.n_kv_heads * spec.head_dim * spec.kv_bytes_per_element


def kv_bytes_per_token(spec: ModelSpec, context_len: float | None = None) -> float:
    """KV-cache bytes per cached token across all layers.

    Without ``context_len``: every layer keeps every token (``2·L·K·h_d·b_kv``; MLA:
    ``L·(r + h_rope)·b_kv``). With it: the mean per token of a sequence of that length,
    sliding-window layers holding at most their window and chunked layers their chunk
    (:func:`kv_cache_bytes_per_sequence` ÷ ``context_len``).
    """
    if context_len is None or context_len <= 0:
        return spec.n_attention_layers * _kv_layer_bytes_per_token(spec)
    return kv_cache_bytes_per_sequence(spec, context_len) / context_len


def kv_cache_bytes_per_sequence(spec: ModelSpec, context_len: float) -> float:
    """KV-cache bytes of one sequence holding ``context_len`` tokens, per layer type.

    Full-attention layers keep every token, sliding-window layers ``min(T, window)``,
    chunked layers ``min(T, chunk)`` (the current chunk, at most); a state-space model's
    recurrent state (:attr:`ModelSpec.state_bytes_per_seq`) whatever ``T > 0`` is.
    """
    total = 0.0
    for la, attends in zip(spec.layer_attention(), spec.attention_layer_mask(), strict=True):
        if attends:
            total += min(context_len, la.span) if la.kind != "full" else context_len
    state = spec.state_bytes_per_seq if context_len > 0 else 0.0
    return total * _kv_layer_bytes_per_token(spec) + state


def kv_cache_bytes(spec: ModelSpec, tokens: float, *, batch: int | None = None) -> float:
    """KV-cache bytes of ``tokens`` cached tokens summed over sequences.

    With ``batch``, the tokens are split over that many equal sequences and sliding/chunked
    layers are capped per sequence; without it every layer keeps every token.
    """
    if batch:
        return batch * kv_cache_bytes_per_sequence(spec, tokens / batch)
    return tokens * kv_bytes_per_token(spec)


def kv_share_per_device(spec: ModelSpec, tp: int, context_len: float | None = None) -> float:
    """Fraction of the KV cache one of ``tp`` tensor-parallel devices holds.

    Ordinary attention splits the KV heads, ``max(K/tp, 1)/K`` (heads are replicated once
    ``tp > K``). An MLA latent has no heads to split: every rank keeps all of it (1.0). A
    Mamba state (and a short-conv state) splits over its channels: ``1/tp``. A hybrid holds
    both; where the two shares differ (``tp > K``) the fraction is the byte-weighted mean
    of a sequence of ``context_len`` tokens, and without ``context_len`` the attention
    share (the larger, so memory is never understated).
    """
    tp = max(int(tp), 1)
    if spec.n_attention_layers == 0:
        return 1.0 / tp
    attn = 1.0 if spec.is_mla else max(spec.n_kv_heads / tp, 1.0) / spec.n_kv_heads
    state = spec.state_bytes_per_seq
    if state == 0.0 or attn == 1.0 / tp or context_len is None or context_len <= 0:
        return attn
    kv = kv_cache_bytes_per_sequence(spec, context_len) - state
    return (kv * attn + state / tp) / (kv + state)


@dataclass(frozen=True)
class KvCacheGroup:
    """The KV cache of one sequence held by one kind of layer (:func:`kv_cache_layout`).

    Attributes:
        kind: ``full``, ``sliding`` or ``chunked`` attention; ``state`` for a state-space
            model's recurrent state.
        span: the window (tokens), 0 for full attention and the state.
        layers: how many layers hold it.
        bytes_per_token_layer: bytes per cached token and layer (0 for the state).
        bytes: the group's bytes at the context length asked for.
    """

    kind: str
    span: int
    layers: int
    bytes_per_token_layer: float
    bytes: float


def kv_cache_layout(spec: ModelSpec, context_len: float) -> list[KvCacheGroup]:
    """KV-cache bytes of one sequence by layer type, for display: a state-space model's
    recurrent state (one group) first, then one group per attention kind and span, at
    ``context_len``."""
    groups: dict[tuple[str, int], int] = {}
    for la, attends in zip(spec.layer_attention(), spec.attention_layer_mask(), strict=True):
        if attends:
            groups[(la.kind, la.span)] = groups.get((la.kind, la.span), 0) + 1
    per = _kv_layer_bytes_per_token(spec)
    out = []
    if spec.state_bytes_per_seq:
        out.append(
            KvCacheGroup(
                kind="state",
                span=0,
                layers=sum(m in ("ssm", "conv", "attention+ssm") for m in spec.mixers()),
                bytes_per_token_layer=0.0,
                bytes=spec.state_bytes_per_seq if context_len > 0 else 0.0,
            )
        )
    for (kind, span), n in groups.items():
        held = context_len if kind == "full" else min(context_len, span)
        out.append(
            KvCacheGroup(
                kind=kind, span=span, layers=n, bytes_per_token_layer=per, bytes=n * held * per
            )
        )
    return out


def allreduces_per_pass(spec: ModelSpec) -> int:
    """Tensor-parallel all-reduces of one forward pass: one after each block's sequence mixer
    (attention, Mamba or conv; Falcon-H1's side-by-side pair sums into one) and one after its
    MLP, plus the embedding's (``2L + 1`` for a plain decoder, ``L + 1`` for Mamba)."""
    return 1 + sum((mixer != "none") + has_mlp for mixer, _, has_mlp in _layer_kinds(spec))


def model_assumptions(spec: ModelSpec) -> list[str]:
    """The family and every counting assumption that applies to ``spec``, in words
    (``perfscope roofline`` prints them; a JSON run stores them with the model)."""
    out = [f"family: {spec.family or 'custom (shape given by hand)'}"]
    mixers = spec.mixers()
    if spec.is_hybrid or spec.mlp_free_layers:
        names = {
            "ssm": "Mamba2" if spec.ssm_n_heads else "Mamba",
            "conv": "short-conv",
            "linear": "gated-DeltaNet",
            "lightning": "lightning-attention",
        }
        mix = ", ".join(f"{mixers.count(m)} {names.get(m, m)}" for m in dict.fromkeys(mixers))
        mlp = len(spec.mlp_free_layers)
        out.append(
            f"layer mix: {mix} of {spec.n_layers} blocks"
            + (f" ({mlp} without an MLP)" if mlp else "")
            + f"; KV cache in the {spec.n_attention_layers} attention block(s) only"
        )
    if spec.state_bytes_per_seq:
        parts = []
        n_ssm = sum(spec.ssm_layer_mask()) if spec.is_ssm else 0
        if n_ssm:
            parts.append(
                f"{n_ssm} layers × (conv {spec.ssm_conv_dim}×{spec.ssm_conv_kernel} + SSM "
                f"{spec.ssm_inner_size}×{spec.ssm_state_size})"
            )
        n_conv = mixers.count("conv")
        if n_conv:
            parts.append(f"{n_conv} layers × conv {spec.hidden_size}×{spec.short_conv_kernel}")
        n_light = mixers.count("lightning")
        if n_light:
            parts.append(f"{n_light} layers × state {spec.n_heads}×{spec.head_dim}×{spec.head_dim}")
        n_lin = mixers.count("linear")
        if n_lin:
            parts.append(
                f"{n_lin} layers × (conv {spec.linear_conv_dim}×{spec.linear_conv_kernel} + "
                f"state {spec.linear_value_heads}×{spec.linear_key_head_dim}×"
                f"{spec.linear_value_head_dim})"
            )
        tail = "; no KV cache" if not spec.n_attention_layers else ""
        out.append(
            f"recurrent state, constant in context: {spec.state_bytes_per_seq:,.0f} bytes per "
            f"sequence ({' + '.join(parts)} at {spec.kv_dtype}), read and rewritten every "
            f"step{tail}"
        )
    if spec.is_ssm:
        out.append(
            "SSM FLOPs as transformers' torch path counts them: "
            + (
                f"chunked SSD scan padded to {spec.ssm_chunk_size}-token chunks in "
                "multi-token steps, a 2·I·N state update in decode"
                if spec.ssm_n_heads
                else "scan output 2·I·N per token"
            )
            + "; causal conv over its padded positions"
        )
    if "linear" in mixers:
        out.append(
            "gated-DeltaNet FLOPs as transformers' torch path counts them: the chunked rule "
            f"padded to {spec.linear_chunk_size}-token chunks in multi-token steps (its "
            "triangular solves count 0), the one-token recurrence elementwise (0)"
        )
    if "lightning" in mixers:
        out.append(
            "lightning-attention FLOPs as transformers runs them: "
            f"{spec.lightning_block_size}-token blocks in a step without a state, token by "
            "token (4·H·h_d² each) with one"
        )
    if spec.attn_output_gate:
        out.append("attention output gated per head (q_proj twice as wide)")
    if spec.is_mla:
        pre = "absorbed" if spec.mla_prefill_absorbed else "expanded"
        dec = "absorbed" if spec.mla_absorbed else "expanded"
        out.append(
            f"MLA: prefill {pre}, decode {dec} (vLLM/SGLang: prefill expanded, decode "
            "absorbed; transformers: both expanded); the latent KV is replicated on every "
            "tensor-parallel rank"
        )
    if spec.is_moe:
        shared = (
            f", shared expert {spec.shared_expert_intermediate_size} wide"
            if spec.shared_expert_intermediate_size
            else ""
        )
        dense = f", {len(spec.dense_layers)} dense block(s)" if spec.dense_layers else ""
        out.append(
            f"MoE: {spec.n_experts} experts, top-{spec.n_active_experts}{shared}{dense}; "
            "weights read per step assume uniform, independent routing"
        )
    groups: dict[tuple[str, int], int] = {}
    for la, attends in zip(spec.layer_attention(), spec.attention_layer_mask(), strict=True):
        if attends:
            groups[(la.kind, la.span)] = groups.get((la.kind, la.span), 0) + 1
    if any(kind != "full" for kind, _ in groups):
        parts = [
            f"{n} {kind}" + (f" ({span} tokens)" if span else "")
            for (kind, span), n in groups.items()
        ]
        out.append("attention per layer: " + ", ".join(parts))
    if spec.quant_method:
        group = f" group {spec.quant_group_size}" if spec.quant_group_size else ""
        head = "quantised" if spec.quant_lm_head else "16-bit"
        out.append(
            f"weights: {spec.quant_method} {spec.weight_dtype}{group} "
            f"({spec.weight_bytes_per_param:.4g} B/param with scales); embedding 16-bit, "
            f"lm_head {head}"
        )
    if spec.embed_dim:
        out.append(
            f"embedding {spec.embed_dim} wide, projected in and out of the {spec.hidden_size}"
            "-wide blocks"
        )
    if spec.weight_density < 1.0:
        out.append(f"sparse weights: density {spec.weight_density:g}")
    out.extend(spec.notes)
    return out


# ---------------------------------------------------------------------- per step


@dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes of one forward pass (or a sum of them).

    Attributes:
        flops: FLOP as executed (what the kernels do; matches FlopCounterMode).
        flops_useful: FLOP with attention counted causal-useful (masked half left out).
        flops_linear: projections, MLP/experts and router.
        flops_attention: attention score and value matmuls, as executed.
        flops_attention_useful: the same, causal-useful.
        flops_lm_head: output projection.
        bytes_weights: weight bytes read.
        bytes_kv_read: KV-cache bytes read.
        bytes_kv_write: KV-cache bytes written.
        bytes_activations: activation bytes read and written between kernels.
    """

    flops: float
    flops_useful: float
    flops_linear: float
    flops_attention: float
    flops_attention_useful: float
    flops_lm_head: float
    bytes_weights: float
    bytes_kv_read: float
    bytes_kv_write: float
    bytes_activations: float

    @property
    def bytes(self) -> float:
        """All bytes moved to and from device memory."""
        return (
            self.bytes_weights + self.bytes_kv_read + self.bytes_kv_write + self.bytes_activations
        )

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP (as executed) per byte."""
        return self.flops / self.bytes if self.bytes > 0 else float("inf")

    def __add__(self, other: StepCost) -> StepCost:
        a, b = asdict(self), asdict(other)
        return StepCost(**{k: a[k] + b[k] for k in a})

    def scaled(self, factor: float) -> StepCost:
        """Every quantity times ``factor`` (e.g. a number of identical steps)."""
        return StepCost(**{k: v * factor for k, v in asdict(self).items()})

    def to_dict(self) -> dict[str, float]:
        """JSON-ready dict including ``bytes`` and ``intensity``."""
        d = asdict(self)
        d["bytes"] = self.bytes
        d["intensity"] = self.intensity
        return d


_COST_KEYS = tuple(f for f in StepCost.__dataclass_fields__)


def _chunk_prefix(x: FloatArray, c: float) -> FloatArray:
    """Σ over positions t < x of ``(t mod c) + 1``: keys attended under chunked attention."""
    full = np.floor(x / c)
    r = x - full * c
    return full * c * (c + 1.0) / 2.0 + r * (r + 1.0) / 2.0


def _attention_widths(spec: ModelSpec, absorbed: bool) -> tuple[float, float]:
    """Per-head widths of the score (q·k) and value (p·v) matmuls."""
    if not spec.is_mla:
        return float(spec.head_dim), float(spec.head_dim)
    if absorbed:
        r = float(spec.kv_lora_rank)
        return r + spec.qk_rope_head_dim, r
    return float(spec.head_dim), float(spec.v_head_dim)


def mla_mode(spec: ModelSpec, new_tokens_per_row: float) -> str:
    """``absorbed`` or ``expanded``: how an MLA step with that many new tokens per row runs
    (decode: :attr:`ModelSpec.mla_absorbed`; prefill: :attr:`ModelSpec.mla_prefill_absorbed`).
    Empty for a model without MLA."""
    if not spec.is_mla:
        return ""
    absorbed = spec.mla_prefill_absorbed if new_tokens_per_row > 1 else spec.mla_absorbed
    return "absorbed" if absorbed else "expanded"


@functools.lru_cache(maxsize=256)
def _layer_groups(spec: ModelSpec) -> tuple[tuple[int, str, str, int, bool, bool], ...]:
    """``(count, mixer, kind, span, moe, has_mlp)`` for each distinct kind of block."""
    groups: dict[tuple[str, str, int, bool, bool], int] = {}
    for la, (mixer, moe, mlp) in zip(spec.layer_attention(), _layer_kinds(spec), strict=True):
        key = (mixer, la.kind, la.span, moe, mlp)
        groups[key] = groups.get(key, 0) + 1
    return tuple((n, *key) for key, n in groups.items())


def expected_active_experts(spec: ModelSpec, tokens: ArrayLike) -> FloatArray:
    """Distinct routed experts of one MoE layer that ``tokens`` tokens activate, in expectation.

    Assumes uniform, independent routing: each token picks ``k`` of ``E`` experts, so an
    expert stays idle with probability ``(1 - k/E)^tokens`` and the expected number of
    experts whose weights the step must read is ``E·(1 - (1 - k/E)^tokens)``. Real routers
    are skewed, which makes the true count lower (the bytes an overestimate).
    """
    n = np.maximum(np.asarray(tokens, dtype=np.float64), 0.0)
    if not spec.is_moe:
        return np.zeros_like(n)
    e, k = float(spec.n_experts), float(spec.n_active_experts)
    return e * (1.0 - np.power(1.0 - k / e, n))


def step_costs(
    spec: ModelSpec,
    batch_size: ArrayLike,
    new_tokens: ArrayLike,
    context_tokens: ArrayLike,
    *,
    logits_tokens: ArrayLike | None = None,
    materialized_scores: bool = False,
) -> dict[str, FloatArray]:
    """Vectorised :func:`step_cost`: each argument a scalar or an array of steps.

    Returns a dict of float64 arrays with the :class:`StepCost` field names plus ``bytes``.
    """
    b = np.maximum(np.asarray(batch_size, dtype=np.float64), 1.0)
    n = np.asarray(new_tokens, dtype=np.float64)
    c = np.asarray(context_tokens, dtype=np.float64)
    if logits_tokens is None:
        lt = n if spec.lm_head_all_positions else np.minimum(b, n)
    else:
        lt = np.asarray(logits_tokens, dtype=np.float64)

    d, v = float(spec.hidden_size), float(spec.vocab_size)
    h = float(spec.n_heads)
    attn_params = float(attention_params_per_layer(spec))
    kv_b = float(_mla_kv_b_params(spec)) if spec.is_mla else 0.0
    # Per row: q = n/b new tokens over kv = (c + n)/b keys; times b rows.
    q = n / b
    p = c / b
    # MLA: decode rows (one new token) and prefill rows may run absorbed or expanded.
    multi = q > 1.0
    absorbed = np.where(multi, spec.mla_prefill_absorbed, spec.mla_absorbed)
    naive = np.where(absorbed, 0.0, 1.0) if spec.is_mla else np.zeros_like(q)
    wa, wn = _attention_widths(spec, True), _attention_widths(spec, False)
    w_qk = naive * wn[0] + (1.0 - naive) * wa[0]
    w_pv = naive * wn[1] + (1.0 - naive) * wa[1]

    zero = np.zeros(np.broadcast_shapes(b.shape, n.shape, c.shape))
    flops_linear = zero.copy()
    attn_exec = zero.copy()
    attn_useful = zero.copy()
    w_params = zero.copy()  # quantised block matrices read
    w_inputs = zero.copy()
    w_tables = zero.copy()  # 16-bit matrices read (router)
    kv_read_tokens = zero.copy()  # Σ layers of cached entries read, per row
    kv_exec_total = zero.copy()
    act_elems = zero.copy()
    scores = zero.copy()
    touched = expected_active_experts(spec, n)
    k_act = float(spec.n_active_experts)
    kvh = float(
        spec.kv_lora_rank + spec.qk_rope_head_dim
        if spec.is_mla
        else spec.n_kv_heads * spec.head_dim
    )
    hq = h * float(spec.head_dim)
    h_out = h * float(spec.v_head_dim if spec.is_mla else spec.head_dim)
    ssm_params = float(ssm_params_per_layer(spec))
    si, sn = float(spec.ssm_inner_size), float(spec.ssm_state_size)
    scd, sr = float(spec.ssm_conv_dim), float(spec.ssm_time_step_rank)

    conv_params = float(conv_params_per_layer(spec))
    lin_params = float(linear_params_per_layer(spec))

    for count, mixer, kind, span, moe, has_mlp in _layer_groups(spec):
        lc = float(count)
        w = float(span)
        parts = mixer.split("+")
        attends, scans = "attention" in parts, "ssm" in parts
        mixer_params: Any = 0.0
        act = 5.0 * d if mixer != "none" else 0.0  # the mixer's norm and residual add
        if attends:
            # Attention span as executed and causal-useful, per row.
            if kind == "full":
                kv_exec = p + q
                useful = q * p + q * (q + 1.0) / 2.0
                read = p
            elif kind == "sliding":
                # A sliding-window cache keeps w - 1 past entries; the first pass (no cache)
                # still computes the full masked square.
                kv_exec = np.where(c > 0, np.minimum(p, w - 1.0), p) + q
                m = np.clip(w - p, 0.0, q)  # new tokens whose window still reaches position 0
                useful = m * p + m * (m + 1.0) / 2.0 + (q - m) * w
                read = np.minimum(p, w - 1.0)
            else:  # chunked: a token sees its own chunk only
                kv_exec = np.where(c > 0, np.minimum(p, w - 1.0), p) + q
                useful = _chunk_prefix(p + q, w) - _chunk_prefix(p, w)
                read = p - np.floor(p / w) * w
            attn_exec = attn_exec + lc * 2.0 * h * (w_qk + w_pv) * b * q * kv_exec
            attn_useful = attn_useful + lc * 2.0 * h * (w_qk + w_pv) * b * useful
            kv_read_tokens = kv_read_tokens + lc * read
            kv_exec_total = kv_exec_total + lc * b * kv_exec
            if materialized_scores:
                scores = scores + lc * 4.0 * h * b * q * kv_exec
            # Expanded MLA (prefill; HF decode) expands the latent of every attended key.
            flops_linear = flops_linear + naive * lc * 2.0 * kv_b * b * kv_exec
            mixer_params = mixer_params + attn_params - kv_b * naive
            act = act + (
                (d + hq + 2.0 * kvh)  # qkv projection in/out
                + (hq + h_out)  # attention reads q, writes its output
                + (h_out + d)  # output projection in/out
            )
        if scans:
            mix, mix_useful = _ssm_mixing_flops(spec, q, c)
            attn_exec = attn_exec + lc * b * mix
            attn_useful = attn_useful + lc * b * mix_useful
            mixer_params = mixer_params + ssm_params
            # in_proj, conv, x_proj and dt_proj (Mamba only), scan (x, dt, B, C, gate in;
            # y out), out_proj: an estimate, not checked against a profile
            v2 = bool(spec.ssm_n_heads)
            proj_out = si + scd + float(spec.ssm_n_heads) if v2 else 2.0 * si
            act = act + (
                (d + proj_out)
                + 2.0 * scd
                + (0.0 if v2 else (si + sr + 2.0 * sn) + (sr + si))
                + (3.0 * si + 2.0 * sn + si)
                + (si + d)
            )
        if mixer == "conv":
            mix, mix_useful = _conv_mixing_flops(spec, q, c)
            attn_exec = attn_exec + lc * b * mix
            attn_useful = attn_useful + lc * b * mix_useful
            mixer_params = mixer_params + conv_params
            # in_proj in/out, B·x, the conv, C·h, out_proj in/out: an estimate
            act = act + (d + 3.0 * d) + 3.0 * d + 2.0 * d + 3.0 * d + (d + d)
        if mixer == "lightning":
            mix, mix_useful = _lightning_mixing_flops(spec, q, c)
            attn_exec = attn_exec + lc * b * mix
            attn_useful = attn_useful + lc * b * mix_useful
            mixer_params = mixer_params + float(_lightning_params(spec))
            # qkv, gate and out projections in/out, the rule (q, k, v in; out), the norm and
            # the gate: an estimate
            act = act + (d + 3.0 * hq) + (d + hq) + 4.0 * hq + 3.0 * hq + (hq + d)
        if mixer == "linear":
            mix, mix_useful = _linear_mixing_flops(spec, q, c)
            attn_exec = attn_exec + lc * b * mix
            attn_useful = attn_useful + lc * b * mix_useful
            mixer_params = mixer_params + lin_params
            # projections in/out, the conv in/out, the rule (q, k, v in; out), the gated
            # norm (out, z in; out), out_proj in/out: an estimate
            lcd = float(spec.linear_conv_dim)
            lvd = float(spec.linear_value_heads * spec.linear_value_head_dim)
            act = act + (d + lcd + lvd) + 2.0 * lcd + (lcd + lvd) + 3.0 * lvd + (lvd + d)

        read_params: Any = mixer_params + kv_b * naive  # every weight is read, used or not
        mlp_active = 0.0
        if has_mlp:
            mlp_active = _mlp_params(spec, moe, k_act)
            act = act + 5.0 * d  # the MLP's norm and residual add
        if has_mlp and moe:
            read_params = read_params + _shared_params(spec) + touched * mlp_params_per_expert(spec)
            w_tables = w_tables + lc * _router_params(spec)
            mlp_out = (2.0 if spec.mlp_gated else 1.0) * spec.intermediate_size
            f = float(spec.intermediate_size)
            fs = float(spec.shared_expert_intermediate_size)
            act = act + k_act * (d + mlp_out + mlp_out + f + f + d)
            if fs:
                act = act + d + (2.0 if spec.mlp_gated else 1.0) * fs * 2.0 + 2.0 * fs + d
        elif has_mlp:
            read_params = read_params + _dense_mlp_params(spec)
            f = float(spec.dense_intermediate_size if spec.is_moe else spec.intermediate_size)
            mlp_out = (2.0 if spec.mlp_gated else 1.0) * f
            act = act + (d + mlp_out) + (mlp_out + f) + (f + d)

        per_token = mixer_params + mlp_active
        # A sparse run multiplies only the stored weights (the router of a MoE too: small).
        per_token = per_token * spec.weight_density
        flops_linear = flops_linear + lc * 2.0 * n * per_token

        w_params = w_params + lc * read_params
        w_inputs = w_inputs + lc * _linear_inputs(
            spec, moe, touched if moe else 0.0, mixer, has_mlp
        )
        act_elems = act_elems + lc * act

    # Bytes.
    eb = spec.embedding_bytes_per_param
    e = float(spec.embedding_width)
    proj = float(_proj_params(spec))
    flops_linear = flops_linear + 2.0 * n * proj  # OPT-350m project_in/out, every token
    head = v * e * eb if spec.tied_embeddings else _lm_head_bytes(spec)
    small = float(_small_params(spec))
    bytes_weights = (
        _quantised_bytes(spec, w_params, w_inputs)
        + eb * (w_tables + proj)
        + head
        + eb * n * (e + (d if spec.pos_embeddings else 0.0))  # embedding (and position) rows
        + small * spec.act_bytes_per_element
    )
    kv_layer = _kv_layer_bytes_per_token(spec)
    bytes_kv_read = b * kv_read_tokens * kv_layer
    bytes_kv_write = n * spec.n_attention_layers * kv_layer
    state = spec.state_bytes_per_seq
    if state:
        # The recurrent state: read when a cached step has one, rewritten by every step.
        bytes_kv_read = bytes_kv_read + np.where(c > 0, b * state, 0.0)
        bytes_kv_write = bytes_kv_write + np.where(n > 0, b * state, 0.0)
    bytes_act = spec.act_bytes_per_element * (n * act_elems + lt * v + lt * e)
    if materialized_scores:
        # scores written, read by softmax, probabilities written, read by P·V
        bytes_act = bytes_act + spec.act_bytes_per_element * scores

    flops_lm = 2.0 * lt * e * v
    out: dict[str, FloatArray] = {
        "flops": flops_linear + flops_lm + attn_exec,
        "flops_useful": flops_linear + flops_lm + attn_useful,
        "flops_linear": flops_linear,
        "flops_attention": attn_exec,
        "flops_attention_useful": attn_useful,
        "flops_lm_head": flops_lm,
        "bytes_weights": np.asarray(bytes_weights, dtype=np.float64),
        "bytes_kv_read": bytes_kv_read,
        "bytes_kv_write": bytes_kv_write,
        "bytes_activations": np.asarray(bytes_act, dtype=np.float64),
    }
    shape = np.broadcast_shapes(b.shape, n.shape, c.shape)
    out = {key: np.broadcast_to(val, shape).astype(np.float64) for key, val in out.items()}
    out["bytes"] = (
        out["bytes_weights"]
        + out["bytes_kv_read"]
        + out["bytes_kv_write"]
        + out["bytes_activations"]
    )
    return out


def step_cost(
    spec: ModelSpec,
    batch_size: int,
    new_tokens: int,
    context_tokens: int,
    *,
    logits_tokens: int | None = None,
    materialized_scores: bool = False,
) -> StepCost:
    """FLOPs and bytes of one forward pass.

    Args:
        spec: the model.
        batch_size: sequences (rows) in the pass.
        new_tokens: tokens processed, summed over rows.
        context_tokens: KV entries already cached and read by attention, summed over rows
            (not counting the new tokens).
        logits_tokens: positions that go through the lm_head; default one per row (or
            every new token with :attr:`ModelSpec.lm_head_all_positions`).
        materialized_scores: the attention score matrix goes through device memory
            (unfused eager attention).
    """
    arrays = step_costs(
        spec,
        batch_size,
        new_tokens,
        context_tokens,
        logits_tokens=logits_tokens,
        materialized_scores=materialized_scores,
    )
    return StepCost(**{k: float(arrays[k]) for k in _COST_KEYS})


def prefill_cost(
    spec: ModelSpec, batch_size: int, prompt_len: int, *, cached_len: int = 0
) -> StepCost:
    """One prefill pass of ``batch_size`` prompts of ``prompt_len`` new tokens each,
    on top of ``cached_len`` tokens per row already in the cache (prefix caching, chunks)."""
    return step_cost(spec, batch_size, batch_size * prompt_len, batch_size * cached_len)


def decode_cost(spec: ModelSpec, batch_size: int, context_len: int) -> StepCost:
    """One decode step: one new token per row, each row with ``context_len`` cached tokens."""
    return step_cost(spec, batch_size, batch_size, batch_size * context_len)


@dataclass(frozen=True)
class GenerationCost:
    """A static batch's cost (:func:`generation_cost`).

    Attributes:
        prefill: the prefill of the prompts (it produces the first token).
        decode: the decode steps, summed.
        decode_steps: how many decode steps (``output_len - 1``).
        decode_per_step: :func:`step_costs` of each decode step (arrays, one entry a step).
    """

    prefill: StepCost
    decode: StepCost
    decode_steps: int
    decode_per_step: dict[str, FloatArray]


def generation_cost(
    spec: ModelSpec, batch_size: int, prompt_len: int, output_len: int
) -> GenerationCost:
    """A static batch: prefill of the prompts, then ``output_len - 1`` decode steps.

    The prefill produces the first token; decode step ``i`` (0-based) sees
    ``prompt_len + i`` cached tokens per row.
    """
    prefill = prefill_cost(spec, batch_size, prompt_len)
    steps = max(output_len - 1, 0)
    ctx = prompt_len + np.arange(steps, dtype=np.float64)
    arrays = step_costs(spec, batch_size, batch_size, batch_size * ctx)
    total = StepCost(**{k: float(arrays[k].sum()) for k in _COST_KEYS})
    return GenerationCost(prefill=prefill, decode=total, decode_steps=steps, decode_per_step=arrays)


#: Operator classes of :func:`operator_class_costs`, in display order.
OPERATOR_CLASSES = ("weight_gemms", "attention_kv", "other")


def operator_class_costs(costs: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """Split summed :func:`step_costs` quantities into operator classes.

    - ``weight_gemms``: the projections, MLP and LM head: ``flops_linear + flops_lm_head``
      FLOPs over the weight bytes;
    - ``attention_kv``: score and value products over the KV cache: ``flops_attention`` over
      the KV bytes read and written;
    - ``other``: norms, activations, residuals and embeddings: no counted FLOPs, the
      activation bytes.

    Returns ``{class: {"flops", "bytes"}}`` (FLOP, bytes).
    """
    return {
        "weight_gemms": {
            "flops": float(costs.get("flops_linear", 0.0)) + float(costs.get("flops_lm_head", 0.0)),
            "bytes": float(costs.get("bytes_weights", 0.0)),
        },
        "attention_kv": {
            "flops": float(costs.get("flops_attention", 0.0)),
            "bytes": float(costs.get("bytes_kv_read", 0.0))
            + float(costs.get("bytes_kv_write", 0.0)),
        },
        "other": {"flops": 0.0, "bytes": float(costs.get("bytes_activations", 0.0))},
    }


def medusa_head_cost(spec: ModelSpec, heads: int, rows: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """FLOPs and bytes of ``heads`` Medusa-style heads, ``lm_head(h + SiLU(W_k h))`` with
    a ``d x d`` ``W_k`` each and the base model's lm_head, on the last hidden state of each
    of ``rows`` sequences (one step): ``rows * heads * (2 d^2 + 2 d V)`` FLOPs (the SiLU
    and the add are elementwise, not counted), and each head's ``W_k`` and one read of the
    lm_head per head, as separate matmuls do (the step's own lm_head read is in
    :func:`step_costs`). The heads' weights are stored at the activation width
    (:attr:`~perfscope.analysis.modelspec.ModelSpec.embedding_bytes_per_param`, 16-bit or
    fp32 as the model runs). Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration
    Framework with Multiple Decoding Heads", section 2.1.1.

    Returns:
        ``(flops, bytes)`` as float64 arrays shaped like ``rows``.
    """
    r = np.asarray(rows, dtype=np.float64)
    d, v, k = float(spec.hidden_size), float(spec.vocab_size), float(max(heads, 0))
    flops = r * k * (2.0 * d * d + 2.0 * d * v)
    weights = k * (d * d * spec.embedding_bytes_per_param + _lm_head_bytes(spec))
    return flops, np.where(r > 0, weights, 0.0)
