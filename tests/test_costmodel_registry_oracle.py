"""The registry oracle: every causal-LM family the installed transformers lists is either
counted exactly by perfscope or refused with a reason.

For each ``model_type`` of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a tiny random instance is
built from the family's own config class (eager attention and experts, float32, tiny
widths, two or three layers), a prefill of ``B x S`` tokens and one cached decode step run
under ``FlopCounterMode``, and the cache tensors the prefill left are read. perfscope's
spec, read from that config's ``to_dict()`` the way a saved ``config.json`` is, must then
match on

- parameters: ``sum(p.numel() for p in model.parameters())``;
- weight bytes: every parameter tensor's bytes (fp32);
- FLOPs: prefill (logits for the last position only, ``logits_to_keep=1``) and decode,
  exactly as FlopCounterMode counts them (norms, softmax, activations count 0);
- KV bytes: the key/value tensors of the cache after the prefill (and the conv and SSM
  state tensors of state-space layers), against the decode step's KV read;

or raise :class:`UsageError` naming why it cannot count the family. A family whose tiny
instance cannot be built here (an optional dependency, a config that needs real weights,
a non-text input) is skipped with the reason. Families added to transformers later are
checked automatically. Conventions, the only ones allowed: FLOPs as executed (the full
masked square in prefill), the embedding lookup is free, fp32 throughout.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import ModelSpec
from perfscope.errors import UsageError

transformers = pytest.importorskip("transformers")
from transformers.models.auto.modeling_auto import (  # noqa: E402
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
)

pytestmark = pytest.mark.slow

B, S = 2, 9

#: Tiny widths, by canonical config name (translated through each class's attribute_map).
TINY: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 211,
    "max_position_embeddings": 128,
    "head_dim": 16,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
    "num_local_experts": 4,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "n_group": 1,
    "topk_group": 1,
    "ffn_dim": 96,
    "n_inner": 96,
    "d_ff": 96,
    "decoder_ffn_dim": 96,
    "encoder_ffn_dim": 96,
    "decoder_layers": 2,
    "encoder_layers": 2,
    "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "d_model": 64,
    "word_embed_proj_dim": 64,
    "rotary_dim": 8,
    "sliding_window": 4,
    "attention_chunk_size": 4,
    "first_k_dense_replace": 1,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

#: A gated-DeltaNet hybrid's tiny mix: DeltaNet, attention, DeltaNet (two key heads, each
#: serving two value heads).
_DELTANET: dict[str, Any] = {
    "num_hidden_layers": 3,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 16,
}

#: Nested sub-configs some families need for a tiny instance that builds and runs.
#: DBRX: transformers 5.24's attention reads ``attn_config.rope_theta``, which its config
#: class does not define, and ``clip_qkv=None`` makes ``clamp`` fail; the release uses 8.
NESTED: dict[str, dict[str, Any]] = {
    # Mamba2 validates hidden_size · expand == num_heads · head_dim (64 · 2 = 8 · 16).
    # Llama-4: three chunked layers and a full one; MoE in every other block, dense between.
    "llama4_text": {
        "num_hidden_layers": 4,
        "interleave_moe_layer_step": 2,
        "intermediate_size_mlp": 128,
        "moe_layers": None,
        "layer_types": [
            "chunked_attention",
            "chunked_attention",
            "chunked_attention",
            "full_attention",
        ],
    },
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 1, "state_size": 16},
    # Hybrids: enough layers for every kind of block, and a mix the defaults would not give
    # at two layers (attention every 8th block, or no attention at all).
    "jamba": {
        "num_hidden_layers": 4,
        "attn_layer_period": 4,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 0,
        "mamba_d_state": 8,
    },
    "bamba": {
        "num_hidden_layers": 3,
        "attn_layer_indices": [1],
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_chunk_size": 8,
    },
    # Zamba2: two hybrid layers sharing one block (two uses of its weights), Mamba2 between.
    "zamba2": {
        "num_hidden_layers": 4,
        "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
        "head_dim": 32,  # its q/k/v are 2d wide: H · h_d = 2 · 64, and so are the adapters
        "num_key_value_heads": 4,
        "n_mamba_heads": 8,
        "mamba_d_state": 16,
        "chunk_size": 8,
        "use_shared_attention_adapter": True,
        "adapter_rank": 8,
    },
    "falcon_h1": {
        "num_hidden_layers": 2,
        "mamba_d_ssm": 128,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_chunk_size": 8,
    },
    "granitemoehybrid": {
        "num_hidden_layers": 3,
        "layer_types": ["mamba", "attention", "mamba"],
        "shared_intermediate_size": 48,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_chunk_size": 8,
    },
    "nemotron_h": {
        "num_hidden_layers": 4,
        "layer_types": ["mamba", "attention", "mlp", "moe"],
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "ssm_state_size": 16,
        "chunk_size": 8,
        "n_routed_experts": 4,
        "moe_shared_expert_intermediate_size": 48,
    },
    "qwen3_next": {
        **_DELTANET,
        "mlp_only_layers": [2],
    },
    "qwen3_5_moe_text": {
        **_DELTANET,
    },
    "olmo_hybrid": {
        **_DELTANET,
    },
    "qwen3_5_text": {
        **_DELTANET,
    },
    "minimax": {"num_hidden_layers": 3, "block_size": 4},
    "bailing_hybrid": {
        "num_hidden_layers": 3,
        "layer_types": ["linear_attention", "full_attention", "linear_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse"],
        "linear_num_heads": 4,
        "linear_head_dim": 16,
    },
    "kimi_linear": {
        "num_hidden_layers": 3,
        "layer_types": ["linear_attention", "full_attention", "linear_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse"],
        "linear_num_heads": 4,
        "linear_head_dim": 16,
    },
    "lfm3": {
        "num_hidden_layers": 3,
        "layer_types": ["conv", "sliding_attention", "full_attention"],
    },
    "lfm2": {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"]},
    "lfm2_moe": {
        "num_hidden_layers": 4,
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
        "num_dense_layers": 1,
    },
    "dbrx": {
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
    },
}

#: Families exact only under a named convention: what transformers' eager path runs that a
#: serving engine (and perfscope's default) does not, and perfscope's spec told to run it
#: the same way. The verdict says which convention it needed.
CONVENTIONS: dict[str, tuple[str, Callable[[ModelSpec], ModelSpec]]] = {
    "llama4_text": (
        "transformers runs every routed expert on every token (perfscope counts the top-k) "
        "and caches a chunked layer as a chunk-1 token window (perfscope reads the current "
        "chunk's tokens)",
        lambda s: replace(
            s, n_active_experts=s.n_experts, layer_windows=tuple(abs(w) for w in s.layer_windows)
        ),
    ),
}

_CORE = {"hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "vocab_size"}

FAMILIES = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
#: Above this the "tiny" instance is not tiny (nested configs the widths do not reach).
MAX_PARAMS = 3_000_000


@dataclass(frozen=True)
class Truth:
    """What the tiny model really did."""

    params: int
    weight_bytes: int
    prefill_flops: int
    decode_flops: int
    kv_bytes: int
    logits_all: bool


def tiny_config(model_type: str) -> Any:
    """The family's config class with :data:`TINY` widths, or raise why not."""
    cls = transformers.CONFIG_MAPPING[model_type]
    default = cls()
    amap = getattr(default, "attribute_map", {}) or {}
    kw: dict[str, Any] = {}
    for key, value in TINY.items():
        real = amap.get(key, key)
        if real in kw or isinstance(getattr(cls, real, None), property):
            continue
        if key == "head_dim" and hasattr(default, "qk_rope_head_dim"):
            continue  # MLA: head_dim is derived from the rope/nope split
        try:
            present = hasattr(default, real)
            current = getattr(default, real) if present else None
        except Exception:  # per-layer attributes that refuse a global read
            continue
        if present and not isinstance(current, (dict, list)):
            kw[real] = value
    if "kv_lora_rank" in kw and "num_key_value_heads" in kw:
        kw["num_key_value_heads"] = kw.get("num_attention_heads", 4)  # MLA: one KV per head
    for key in ("layer_types", "mlp_only_layers"):
        # a read-only property (Mamba's layer_types, Bamba's layers_block_type behind its
        # layer_types alias) is derived, not set
        real = amap.get(key, key)
        if hasattr(default, key) and not isinstance(getattr(cls, real, None), property):
            kw[key] = None if key == "layer_types" else []
    nested = NESTED.get(model_type, {})
    kw.update(nested)
    for alias, real in amap.items():  # a nested real name wins over the alias set above
        if real in nested and alias in kw and alias not in nested:
            del kw[alias]
    error: Exception | None = None
    # the full tiny set, then only the core widths (some classes validate combinations)
    for attempt in (kw, {k: v for k, v in kw.items() if k in _CORE}):
        try:
            conf = cls(**attempt)
            conf._attn_implementation = "eager"
            return conf
        except Exception as exc:
            error = exc
    assert error is not None
    raise error


def _tensor_bytes(value: Any) -> int:
    """Bytes of a tensor, or of the tensors in a dict/list/tuple of them (None: 0)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


#: Cache attributes that hold per-layer state: attention keys/values, and the recurrent
#: state of linear-attention/SSM layers (transformers 5.24 ``LinearAttentionLayer``
#: ``conv_states``/``recurrent_states``; older ``MambaCache`` ``conv_states``/``ssm_states``).
_STATE_NAMES = ("keys", "values", "conv_states", "recurrent_states", "ssm_states")


def _kv_bytes(cache: Any) -> int:
    """Bytes the cache holds after the prefill: KV tensors plus any recurrent state (MiniMax
    keeps its lightning-attention states beside the layers, in ``linear_cache``)."""
    layers = getattr(cache, "layers", None)
    holders = list(layers) if layers else [cache]
    held = sum(_tensor_bytes(getattr(h, name, None)) for h in holders for name in _STATE_NAMES)
    return held + _tensor_bytes(getattr(cache, "linear_cache", None))


def run_truth(conf: Any) -> tuple[Any, Truth]:
    """Build the tiny model and measure it; raises when it cannot be built or run."""
    kwargs: dict[str, Any] = {"attn_implementation": "eager"}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            size = sum(
                p.numel() for p in transformers.AutoModelForCausalLM.from_config(conf).parameters()
            )
        if size > MAX_PARAMS:
            raise RuntimeError(
                f"{size:,} parameters: its sub-configs (text/vision) keep full-size defaults"
            )
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                conf, experts_implementation="eager", **kwargs
            )
        except (TypeError, ValueError):
            model = transformers.AutoModelForCausalLM.from_config(conf, **kwargs)
    model = model.float().eval().requires_grad_(False)  # DBRX's expert views under no_grad
    vocab = int(model.get_output_embeddings().weight.shape[0])
    ids = torch.randint(3, min(vocab, 200), (B, S))
    nxt = torch.randint(3, min(vocab, 200), (B, 1))
    logits_all = False
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FlopCounterMode(display=False) as fc:
            try:
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            except TypeError:
                logits_all = True
                out = model(input_ids=ids, use_cache=True)
        prefill = int(fc.get_total_flops())
        cache = out.past_key_values
        kv = _kv_bytes(cache)
        with FlopCounterMode(display=False) as fc:
            # Mamba2's forward names it ``cache`` and ignores ``past_key_values`` silently
            # (a cache-less one-token pass, its chunked scan padded to 256 positions).
            name = "cache" if "cache" in inspect.signature(model.forward).parameters else None
            model(input_ids=nxt, use_cache=True, **{name or "past_key_values": cache})
        decode = int(fc.get_total_flops())
    params = sum(p.numel() for p in model.parameters())
    wbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return model, Truth(params, wbytes, prefill, decode, kv, logits_all)


def perfscope_spec(conf: Any) -> ModelSpec:
    """perfscope's reading of the config as a saved ``config.json`` gives it (fp32)."""
    spec = ModelSpec.from_hf_config(conf.to_dict(), name=conf.model_type)
    spec = replace(
        spec,
        weight_bytes_per_param=4.0,
        unquantized_bytes_per_param=0.0,
        act_bytes_per_element=4.0,
        kv_bytes_per_element=4.0,
    )
    if spec.is_mla:
        spec = replace(spec, mla_absorbed=False)  # transformers expands the latent
    return spec


def mismatches(spec: ModelSpec, truth: Truth) -> list[str]:
    """The quantities where perfscope and the model disagree, in words."""
    logits = B * S if truth.logits_all else None
    got = {
        "params": cm.param_count(spec),
        "weight_bytes": cm.weight_bytes(spec),
        "prefill_flops": cm.step_cost(spec, B, B * S, 0, logits_tokens=logits).flops,
        "decode_flops": cm.step_cost(spec, B, B, B * S).flops,
        "kv_bytes": cm.step_cost(spec, B, B, B * S).bytes_kv_read,
    }
    return [
        f"{k}: perfscope {v:,.0f} vs model {getattr(truth, k):,}"
        for k, v in got.items()
        if v != getattr(truth, k)
    ]


def verdict(model_type: str) -> tuple[str, str]:
    """``(exact|refused|skipped|WRONG, detail)`` for one family."""
    try:
        conf = tiny_config(model_type)
    except Exception as exc:
        return "skipped", f"config class: {type(exc).__name__}: {str(exc)[:160]}"
    try:
        spec = perfscope_spec(conf)
    except UsageError as exc:
        return "refused", str(exc)
    try:
        _, truth = run_truth(conf)
    except Exception as exc:
        return "skipped", f"tiny model: {type(exc).__name__}: {str(exc)[:160]}"
    convention, adjust = CONVENTIONS.get(model_type, ("", lambda s: s))
    wrong = mismatches(adjust(spec), truth)
    if wrong:
        return "WRONG", "; ".join(wrong)
    return "exact", f"{spec.family}; convention: {convention}" if convention else spec.family


@pytest.mark.parametrize("model_type", FAMILIES)
def test_family_is_counted_exactly_or_refused_with_a_reason(model_type: str) -> None:
    kind, detail = verdict(model_type)
    if kind == "skipped":
        pytest.skip(detail)
    assert kind != "WRONG", f"{model_type}: perfscope counts it silently wrong: {detail}"
    assert detail, f"{model_type}: {kind} without a reason"
    if kind == "refused":
        assert model_type in detail or "not" in detail, detail
