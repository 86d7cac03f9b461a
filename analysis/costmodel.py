"""FLOPs and bytes of one forward pass of a decoder-only transformer (DESIGN.md §6).

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
- Bytes: weights are read once per step for the whole batch (MoE: only experts that some
  token in the step routes to, in expectation under uniform routing); KV read = cached
  entries × KV bytes per token; KV written = new tokens × KV bytes per token; activations =
  the inputs and outputs of each layer's matmuls plus norms and residuals; the attention
  score matrix is assumed to stay on chip (fused/flash attention) unless
  ``materialized_scores`` is set.

Steps carry sums over rows (``new_tokens``, ``context_tokens``); the per-row split assumes
equal rows, which is exact for prefill of equal-length prompts and for decode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from perfscope.analysis.modelspec import ModelSpec

__all__ = [
    "StepCost",
    "attention_params_per_layer",
    "decode_cost",
    "generation_cost",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "matmul_params",
    "mlp_params_per_expert",
    "operator_class_costs",
    "param_count",
    "prefill_cost",
    "step_cost",
    "step_costs",
    "weight_bytes",
]

FloatArray = npt.NDArray[np.float64]
ArrayLike = float | int | npt.ArrayLike


# ---------------------------------------------------------------------- parameters


def attention_params_per_layer(spec: ModelSpec) -> int:
    """Matmul weights of Q, K, V and O in one block: ``d·H·h_d + 2·d·K·h_d + H·h_d·d``."""
    d, hd = spec.hidden_size, spec.head_dim
    return d * spec.n_heads * hd * 2 + 2 * d * spec.n_kv_heads * hd


def mlp_params_per_expert(spec: ModelSpec) -> int:
    """Matmul weights of one MLP (one expert for MoE): ``3·d·F`` gated, ``2·d·F`` plain."""
    return (3 if spec.mlp_gated else 2) * spec.hidden_size * spec.intermediate_size


def _router_params(spec: ModelSpec) -> int:
    return spec.hidden_size * spec.n_experts if spec.is_moe else 0


def matmul_params(spec: ModelSpec, *, active: bool = False, lm_head: bool = True) -> int:
    """Parameters that take part in matmuls (``N_mat``; the embedding lookup is not one).

    Args:
        active: count only the experts a token is routed to (MoE), i.e. the parameters
            whose FLOPs one token pays; otherwise every expert.
        lm_head: include the ``d·V`` output projection (counted even when tied).
    """
    experts = 1
    if spec.is_moe:
        experts = spec.n_active_experts if active else spec.n_experts
    per_layer = (
        attention_params_per_layer(spec)
        + experts * mlp_params_per_expert(spec)
        + _router_params(spec)
    )
    total = spec.n_layers * per_layer
    if lm_head:
        total += spec.hidden_size * spec.vocab_size
    return total


def _small_params(spec: ModelSpec) -> int:
    """Norm weights/biases and linear biases: vectors, not matrices."""
    d, hd, f = spec.hidden_size, spec.head_dim, spec.intermediate_size
    norm = d * (2 if spec.norm_bias else 1)
    per_layer = spec.norms_per_layer * norm
    if spec.qkv_bias:
        per_layer += (spec.n_heads + 2 * spec.n_kv_heads) * hd
    if spec.o_bias:
        per_layer += d
    if spec.mlp_bias:
        experts = spec.n_experts if spec.is_moe else 1
        per_layer += experts * ((2 * f if spec.mlp_gated else f) + d)
    if spec.qk_norm:
        per_layer += 2 * hd
    return spec.n_layers * per_layer + (norm if spec.final_norm else 0)


def param_count(spec: ModelSpec) -> int:
    """Stored parameters, exactly as ``sum(p.numel() for p in model.parameters())``.

    Embedding table, learned position table, every block's matrices, biases and norms, the
    final norm, and the lm_head unless tied to the embedding.
    """
    d, v = spec.hidden_size, spec.vocab_size
    total = matmul_params(spec, lm_head=False) + _small_params(spec)
    total += v * d  # embedding
    total += spec.pos_embeddings * d
    if not spec.tied_embeddings:
        total += v * d
    return total + spec.extra_params


def weight_bytes(spec: ModelSpec) -> float:
    """Bytes the weights occupy in device memory.

    Matrices (including the embedding tables) at :attr:`ModelSpec.weight_bytes_per_param`,
    norm and bias vectors at the activation width.
    """
    small = _small_params(spec)
    big = param_count(spec) - small
    return big * spec.weight_bytes_per_param + small * spec.act_bytes_per_element


def kv_bytes_per_token(spec: ModelSpec) -> float:
    """KV-cache bytes one token occupies across all layers: ``2·L·K·h_d·b_kv``."""
    return 2.0 * spec.n_layers * spec.n_kv_heads * spec.head_dim * spec.kv_bytes_per_element


def kv_cache_bytes(spec: ModelSpec, tokens: float) -> float:
    """KV-cache bytes of ``tokens`` cached tokens (summed over sequences)."""
    return tokens * kv_bytes_per_token(spec)


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

    d, v, nl = float(spec.hidden_size), float(spec.vocab_size), float(spec.n_layers)
    hq = float(spec.n_heads * spec.head_dim)
    f = float(spec.intermediate_size)

    active_layer = float(matmul_params(spec, active=True, lm_head=False)) / nl
    flops_linear = 2.0 * n * nl * active_layer
    flops_lm = 2.0 * lt * d * v
    # Per row: q = n/b new tokens over kv = (c + n)/b keys; times b rows.
    q = n / b
    p = c / b
    w = float(spec.sliding_window)
    if w > 0:
        # A sliding-window cache keeps w - 1 past entries; the first pass (no cache) still
        # computes the full masked square.
        kv_exec = np.where(c > 0, np.minimum(p, w - 1.0), p) + q
        m = np.clip(w - p, 0.0, q)  # new tokens whose window still reaches position 0
        useful_per_row = m * p + m * (m + 1.0) / 2.0 + (q - m) * w
    else:
        kv_exec = p + q
        useful_per_row = q * p + q * (q + 1.0) / 2.0
    attn_exec = 4.0 * nl * hq * b * q * kv_exec
    attn_useful = 4.0 * nl * hq * b * useful_per_row

    # Bytes.
    bw = spec.weight_bytes_per_param
    dense_layer = float(attention_params_per_layer(spec) + _router_params(spec))
    mlp = float(mlp_params_per_expert(spec))
    if spec.is_moe:
        e, k = float(spec.n_experts), float(spec.n_active_experts)
        touched = e * (1.0 - np.power(1.0 - k / e, np.maximum(n, 0.0)))
    else:
        touched = np.ones_like(n)
    small = float(_small_params(spec))
    bytes_weights = (
        bw * (nl * (dense_layer + touched * mlp) + d * v)
        + bw * n * d * (2.0 if spec.pos_embeddings else 1.0)  # embedding (and position) rows
        + small * spec.act_bytes_per_element
    )
    kv_tok = kv_bytes_per_token(spec)
    bytes_kv_read = c * kv_tok
    bytes_kv_write = n * kv_tok

    kvh = float(spec.n_kv_heads * spec.head_dim)
    k_act = float(spec.n_active_experts) if spec.is_moe else 1.0
    mlp_out = (2.0 if spec.mlp_gated else 1.0) * f
    act_elems_per_token_layer = (
        (d + hq + 2.0 * kvh)  # qkv projection in/out
        + 2.0 * hq  # attention reads q, writes its output
        + (hq + d)  # output projection in/out
        + k_act * (d + mlp_out)  # up (and gate) in/out
        + k_act * (mlp_out + f)  # activation function in/out
        + k_act * (f + d)  # down projection in/out
        + 10.0 * d  # two norms and two residual adds, read and write
    )
    bytes_act = spec.act_bytes_per_element * (nl * n * act_elems_per_token_layer + lt * v + lt * d)
    if materialized_scores:
        # scores written, read by softmax, probabilities written, read by P·V
        bytes_act = (
            bytes_act + 4.0 * spec.act_bytes_per_element * nl * spec.n_heads * n * (c + n) / b
        )

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


def generation_cost(
    spec: ModelSpec, batch_size: int, prompt_len: int, output_len: int
) -> dict[str, Any]:
    """A static batch: prefill of the prompts, then ``output_len - 1`` decode steps.

    The prefill produces the first token; decode step ``i`` (0-based) sees
    ``prompt_len + i`` cached tokens per row. Returns ``{"prefill": StepCost,
    "decode": StepCost (sum over steps), "decode_steps": int, "decode_per_step":
    dict of arrays}``.
    """
    prefill = prefill_cost(spec, batch_size, prompt_len)
    steps = max(output_len - 1, 0)
    ctx = prompt_len + np.arange(steps, dtype=np.float64)
    arrays = step_costs(spec, batch_size, batch_size, batch_size * ctx)
    total = StepCost(**{k: float(arrays[k].sum()) for k in _COST_KEYS})
    return {"prefill": prefill, "decode": total, "decode_steps": steps, "decode_per_step": arrays}


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
