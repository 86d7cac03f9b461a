"""Hybrid decoders: a per-block mix of attention, Mamba/Mamba2 and short-conv mixers, each
block with a dense MLP, a MoE, or none (:attr:`ModelSpec.layer_mixers`).

Each family names its mix its own way; the reader turns it into one mixer and one MLP kind
per block:

- Jamba: attention where ``i % attn_layer_period == attn_layer_offset``, else a Mamba (v1)
  mixer with RMS norms on dt, B and C; a MoE where ``i % expert_layer_period ==
  expert_layer_offset``, else a dense gated MLP.
- Bamba: attention at ``attn_layer_indices``, Mamba2 elsewhere; a dense gated MLP in every
  block.
- GraniteMoeHybrid: ``layer_types`` (``mamba``/``attention``, or ``linear_attention``/
  ``full_attention``); every block a MoE plus a gated shared MLP (a dense MLP without
  experts).
- NemotronH: ``layers_block_type`` (or the ``hybrid_override_pattern`` ``M*-E``): each block
  is one of a Mamba2 mixer, an attention, a plain MLP or a MoE of plain experts with a
  shared expert, each behind one norm.
- Kimi-Linear and Bailing-hybrid: Kimi Delta Attention blocks (a decay per channel; Kimi's
  forget and output gates low-rank, Bailing's full rank) beside MLA attention (Bailing's
  with a ``d → H`` gate per head), DeepSeek's MoE layout by ``mlp_layer_types``.
- OLMo-Hybrid: the same gated DeltaNet (its q, k, v, a, b and gate as separate projections)
  beside OLMo-2 attention (q/k norms over all heads), a dense MLP everywhere.
- Qwen3-Next and Qwen3.5: ``layer_types`` ``linear_attention`` (a gated DeltaNet) or
  ``full_attention`` (gated attention); Qwen's MLP layout (dense, or MoE with a gated shared
  expert and ``mlp_only_layers``).
- Zamba2: ``layers_block_type`` ``mamba``/``hybrid``; a hybrid layer runs one of
  ``num_mem_blocks`` shared attention+MLP blocks (counted per use in FLOPs and weight
  reads, once per block in parameters) with per-use adapters and a linear, then Mamba2.
- Falcon-H1: attention and a Mamba2 mixer side by side on the same input in every block
  (``attention+ssm``), then a gated MLP; its µP multipliers are elementwise.
- MiniMax: ``layer_types`` ``linear_attention`` (lightning attention: a per-head
  ``h_d × h_d`` state, blocks of ``block_size`` in prefill) or ``full_attention``; a MoE in
  every block; its residual α/β factors are elementwise.
- LFM3: LFM2's blocks with full or sliding attention by ``layer_types``, a gate per
  attention head (``use_attention_gate``), sandwich norms (``use_sandwich_norm``) and an
  MLP ``intermediate_size`` wide.
- LFM2: ``layer_types`` ``conv``/``full_attention``: short-conv or attention blocks, every
  one with a gated MLP whose width LFM2 derives from ``intermediate_size``; LFM2-MoE: the
  first ``num_dense_layers`` blocks a dense MLP ``intermediate_size`` wide (not derived),
  the rest a MoE (its router's ``expert_bias`` is a buffer, not a parameter).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from perfscope.analysis.modelspec.families import Family, _flag, _mla_fields, _moe_fields
from perfscope.analysis.modelspec.hf_config import (
    _as_float,
    _as_int,
    _first_of,
    _float_of,
    _int_of,
    _ints,
    _require,
)
from perfscope.analysis.modelspec.spec import ModelSpec
from perfscope.errors import UsageError

#: Block names of ``layer_types``/``layers_block_type`` (every spelling transformers has
#: written) and of NemotronH's pattern, as ``(mixer, mlp)``; ``mlp`` is ``family``
#: (the family's usual MLP), ``dense``, ``moe`` or ``none``.
_BLOCKS: dict[str, tuple[str, str]] = {
    "mamba": ("ssm", "family"),
    "linear_attention": ("ssm", "family"),
    "attention": ("attention", "family"),
    "full_attention": ("attention", "family"),
    "sliding_attention": ("attention", "family"),
    "conv": ("conv", "family"),
    "mlp": ("none", "dense"),
    "moe": ("none", "moe"),
    "M": ("ssm", "family"),
    "*": ("attention", "family"),
    "-": ("none", "dense"),
    "E": ("none", "moe"),
    "hybrid": ("attention+ssm", "family"),
}


#: Families whose ``linear_attention`` blocks are gated DeltaNets (Qwen3-Next, Qwen3.5).
_DELTANET = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "kimi_linear", "bailing_hybrid")
#: Families whose linear blocks are Kimi Delta Attention.
_KDA = ("kimi_linear", "bailing_hybrid")


def _listed_blocks(cfg: Mapping[str, object], n_layers: int, *keys: str) -> list[str] | None:
    """The per-block names under the first of ``keys`` the config sets (a list, or a
    pattern string such as NemotronH's ``M*M-E``), or ``None``."""
    value = _first_of(cfg, *keys)
    if value is None:
        return None
    names = list(value) if isinstance(value, (str, list, tuple)) else None
    if names is None or len(names) != n_layers:
        raise UsageError(
            f"config {' / '.join(keys)} must list one block type for each of the "
            f"{n_layers} layers, got {value!r}"
        )
    unknown = sorted({str(n) for n in names} - set(_BLOCKS))
    if unknown:
        raise UsageError(
            f"config {' / '.join(keys)} has {', '.join(unknown)}: perfscope counts "
            f"{', '.join(sorted(_BLOCKS))}"
        )
    return [str(n) for n in names]


def _blocks(cfg: Mapping[str, object], fam: Family, n_layers: int) -> list[tuple[str, str]]:
    """``(mixer, mlp)`` of every block."""
    if fam.key == "jamba":
        period = _int_of(cfg, "attn_layer_period", default=8)
        offset = _int_of(cfg, "attn_layer_offset", default=4)
        experts = _int_of(cfg, "num_experts", default=16)
        e_period = _int_of(cfg, "expert_layer_period", default=2)
        e_offset = _int_of(cfg, "expert_layer_offset", default=1)
        return [
            (
                "attention" if i % period == offset else "ssm",
                "moe" if experts > 1 and i % e_period == e_offset else "dense",
            )
            for i in range(n_layers)
        ]
    if fam.key == "zamba2":  # a hybrid layer: a shared attention block, then Mamba2
        names = _listed_blocks(cfg, n_layers, "layers_block_type", "layer_types")
        if names is None:
            raise UsageError("Zamba2 config lists no layers_block_type")
        return [("attention+ssm", "dense") if n == "hybrid" else ("ssm", "none") for n in names]
    if fam.key == "falcon_h1":  # attention and Mamba2 side by side in every block
        return [("attention+ssm", "dense")] * n_layers
    if fam.key == "bamba":
        attn = set(_ints(cfg.get("attn_layer_indices"), "attn_layer_indices"))
        return [("attention" if i in attn else "ssm", "dense") for i in range(n_layers)]
    if fam.key == "nemotron_h":
        names = _listed_blocks(
            cfg, n_layers, "layers_block_type", "layer_types", "hybrid_override_pattern"
        )
        if names is None:
            raise UsageError("NemotronH config lists no layers_block_type or pattern")
        return [(_BLOCKS[n][0], _BLOCKS[n][1].replace("family", "none")) for n in names]
    names = _listed_blocks(cfg, n_layers, "layer_types", "layers_block_type")
    if fam.key == "minimax":  # linear_attention is lightning attention; MoE everywhere
        names = names or [
            "full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n_layers)
        ]
        return [("lightning" if n == "linear_attention" else _BLOCKS[n][0], "moe") for n in names]
    if fam.key in _KDA:
        names = names or _kimi_layer_types(cfg, n_layers)
        kinds = cfg.get("mlp_layer_types")
        if not isinstance(kinds, list):
            first = _int_of(cfg, "first_k_dense_replace", default=1)
            kinds = ["dense" if i < first else "sparse" for i in range(n_layers)]
        return [
            (
                "linear" if n == "linear_attention" else _BLOCKS[n][0],
                "moe" if k == "sparse" else "dense",
            )
            for n, k in zip(names, kinds, strict=True)
        ]
    if fam.key in _DELTANET:  # linear_attention is a gated DeltaNet here, not Mamba
        interval = _int_of(cfg, "full_attention_interval", default=4)
        names = names or [
            "linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)
        ]
        return [("linear" if n == "linear_attention" else _BLOCKS[n][0], "dense") for n in names]
    if fam.key in ("lfm2", "lfm2_moe", "lfm3") and names is None:
        full = cfg.get("full_attn_idxs")
        attn = set(range(n_layers)) if full is None else set(_ints(full, "full_attn_idxs"))
        names = ["full_attention" if i in attn else "conv" for i in range(n_layers)]
    if names is None:  # GraniteMoeHybrid's default: every block a Mamba2 mixer
        names = ["mamba"] * n_layers
    experts = _int_of(cfg, "num_local_experts", "num_experts", default=0) or 0
    usual = "moe" if fam.key == "granitemoehybrid" and experts > 0 else "dense"
    if fam.key == "lfm2_moe":  # the first num_dense_layers blocks dense, then MoE
        first = _int_of(cfg, "num_dense_layers", default=2)
        return [(_BLOCKS[n][0], "dense" if i < first else "moe") for i, n in enumerate(names)]
    return [(_BLOCKS[n][0], _BLOCKS[n][1].replace("family", usual)) for n in names]


def _kimi_layer_types(cfg: Mapping[str, object], n_layers: int) -> list[str]:
    """Kimi-Linear's blocks from a checkpoint's ``linear_attn_config`` (1-indexed
    ``full_attn_layers`` / ``kda_layers``), else the config class's default."""
    lin = cfg.get("linear_attn_config") or {}
    if isinstance(lin, dict) and "full_attn_layers" in lin:
        full = {int(i) - 1 for i in lin["full_attn_layers"]}
        return ["full_attention" if i in full else "linear_attention" for i in range(n_layers)]
    return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n_layers)]


def _mamba2_fields(cfg: Mapping[str, object], d: int, nemotron: bool) -> dict[str, object]:
    """The ``ssm_*`` fields of a hybrid's Mamba2 mixer (NemotronH spells them its own way
    and sizes the inner width from heads × head width)."""
    if nemotron:
        heads = _int_of(cfg, "mamba_num_heads", default=128)
        head_dim = _int_of(cfg, "mamba_head_dim", default=64)
        inner = heads * head_dim
        keys = {
            "groups": ("n_groups", "mamba_n_groups"),
            "state": ("ssm_state_size", "mamba_d_state"),
            "conv": ("conv_kernel", "mamba_d_conv"),
            "chunk": ("chunk_size", "mamba_chunk_size"),
            "conv_bias": ("use_conv_bias", "mamba_conv_bias"),
            "proj_bias": ("use_bias",),
        }
    else:
        inner = int(_float_of(cfg, "mamba_expand", default=2) * d)
        inner = _int_of(cfg, "mamba_d_ssm", default=inner) or inner  # Falcon-H1
        heads = _int_of(cfg, "mamba_n_heads", "n_mamba_heads", default=128)
        raw = _first_of(cfg, "mamba_d_head", "mamba_headdim", default="auto")
        head_dim = (
            inner // heads if raw == "auto" else _as_int(raw, "mamba_d_head", "mamba_headdim")
        )
        keys = {  # Zamba2's spellings second
            "groups": ("mamba_n_groups", "mamba_ngroups"),
            "state": ("mamba_d_state",),
            "conv": ("mamba_d_conv",),
            "chunk": ("mamba_chunk_size", "chunk_size"),
            "conv_bias": ("mamba_conv_bias", "use_conv_bias"),
            "proj_bias": ("mamba_proj_bias", "add_bias_linear"),
        }
    if heads * head_dim != inner:
        raise UsageError(
            f"Mamba2 mixer: heads · head width ({heads} · {head_dim}) must equal its inner "
            f"width ({inner})"
        )
    return {
        "ssm_inner_size": inner,
        "ssm_n_heads": heads,
        "ssm_head_dim": head_dim,
        "ssm_n_groups": _int_of(cfg, *keys["groups"], default=8 if nemotron else 1),
        "ssm_state_size": _int_of(cfg, *keys["state"], default=128 if nemotron else 256),
        "ssm_conv_kernel": _int_of(cfg, *keys["conv"], default=4),
        "ssm_chunk_size": _int_of(cfg, *keys["chunk"], default=128 if nemotron else 256),
        "ssm_conv_bias": bool(_first_of(cfg, *keys["conv_bias"], default=True)),
        "ssm_proj_bias": bool(_first_of(cfg, *keys["proj_bias"], default=False)),
    }


def _zamba2_sharing(
    cfg: Mapping[str, object], d: int, h: int, kv: int, blocks: list[tuple[str, str]]
) -> dict[str, object]:
    """Zamba2's shared transformer blocks as per-layer fields.

    Every hybrid layer runs one of ``num_mem_blocks`` shared blocks (attention over the
    ``2d``-wide concatenation of its input and the embeddings, ``h_d = 2d/H``, then a gated
    MLP), that use's LoRA adapters (rank ``r``: on q, k and v when
    ``use_shared_attention_adapter``, on the MLP's gate_up always) and its own ``d × d``
    linear. Per use the FLOPs and weight reads are all of it; stored, a block's attention,
    MLP, MLP biases and two norms (``2d + d``) exist once per block: ``extra_params``
    takes the repeats back out of the parameter count.
    """
    uses = sum(m == "attention+ssm" for m, _ in blocks)
    shared = min(uses, _int_of(cfg, "num_mem_blocks", default=1))
    f_mlp = _int_of(cfg, "intermediate_size", default=0) or 4 * d
    hd = _int_of(cfg, "attention_head_dim", "head_dim", default=2 * d // h) or 2 * d // h
    r = _int_of(cfg, "adapter_rank", default=128)
    adapters = d * r + r * 2 * f_mlp
    if _first_of(cfg, "use_shared_attention_adapter", default=False):
        adapters += 3 * (2 * d * r + r * 2 * d)
    bias = bool(_first_of(cfg, "add_bias_linear", default=False))
    attn = 2 * d * (h + 2 * kv) * hd + h * hd * d
    per_block = attn + 3 * d * f_mlp + (2 * f_mlp + d if bias else 0)
    return {
        "head_dim": hd,
        "intermediate_size": f_mlp,
        "mlp_bias": bias,
        "attention_input_width": 2 * d,
        "attention_extra_params": adapters + d * d,
        "extra_params": shared * 3 * d - (uses - shared) * per_block,
        "ssm_conv_bias": True,  # Zamba2's conv always has one
    }


def _lfm2_mlp_width(cfg: Mapping[str, object]) -> int:
    """LFM2's MLP width as ``Lfm2MLP`` derives it: ``2/3`` of ``intermediate_size``, times
    ``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``."""
    f = _require(cfg, "intermediate_size")
    if not _first_of(cfg, "block_auto_adjust_ff_dim", default=True):
        return f
    f = int(2 * f / 3)
    mult = _first_of(cfg, "block_ffn_dim_multiplier", default=1.0)
    if mult is not None:
        f = int(_as_float(mult, "block_ffn_dim_multiplier") * f)
        step = _int_of(cfg, "block_multiple_of", default=256)
        f = step * ((f + step - 1) // step)
    return f


def _hybrid(cfg: Mapping[str, object], fam: Family, f: dict[str, object]) -> ModelSpec:
    """A hybrid decoder (the module docstring lists the families and their layouts)."""
    d = _require(cfg, "hidden_size")
    h = _require(cfg, "num_attention_heads")
    listed = _first_of(cfg, "layers_block_type", "hybrid_override_pattern")
    if fam.key == "nemotron_h" and isinstance(listed, (list, str)):
        n_layers = len(listed)  # NemotronH derives num_hidden_layers from its block list
    else:
        n_layers = _require(cfg, "num_hidden_layers")
    kv = _int_of(cfg, "num_key_value_heads", default=h) or h
    blocks = _blocks(cfg, fam, n_layers)
    mixers = tuple(m for m, _ in blocks)
    nemotron = fam.key == "nemotron_h"
    bias = bool(_first_of(cfg, "attention_bias", default=False)) and not nemotron
    f.update(
        n_layers=n_layers,
        hidden_size=d,
        n_heads=h,
        n_kv_heads=kv,
        head_dim=(_int_of(cfg, "head_dim", "attention_head_dim", default=d // h) or d // h),
        # Qwen3.5-MoE has no dense MLP width: its experts' is the one there is
        intermediate_size=_require(cfg, "intermediate_size", "moe_intermediate_size"),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=not nemotron,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=fam.tied_default)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bool(_first_of(cfg, "mlp_bias", default=False)),
        norms_per_layer=fam.norms_per_layer + (2 if _flag(cfg, fam.post_norm_flag or False) else 0),
        qk_norm=fam.qk_norm is True,
        max_position_embeddings=(
            _int_of(cfg, "max_position_embeddings", "model_max_length", default=0) or 0
        ),
        layer_mixers=mixers,
        mlp_free_layers=tuple(i for i, (_, mlp) in enumerate(blocks) if mlp == "none"),
    )
    if any("ssm" in m for m in mixers):
        if fam.key == "jamba":
            rank = _first_of(cfg, "mamba_dt_rank", default="auto")
            f.update(
                ssm_inner_size=_int_of(cfg, "mamba_expand", default=2) * d,
                ssm_state_size=_int_of(cfg, "mamba_d_state", default=16),
                ssm_conv_kernel=_int_of(cfg, "mamba_d_conv", default=4),
                ssm_time_step_rank=math.ceil(d / 16)
                if rank == "auto"
                else _as_int(rank, "mamba_dt_rank"),
                ssm_proj_bias=bool(_first_of(cfg, "mamba_proj_bias", default=False)),
                ssm_conv_bias=bool(_first_of(cfg, "mamba_conv_bias", default=True)),
                ssm_bcdt_norms=True,
            )
        else:
            f.update(_mamba2_fields(cfg, d, nemotron))
    if "conv" in mixers:
        f.update(
            short_conv_kernel=_int_of(cfg, "conv_L_cache", default=3),
            short_conv_bias=bool(_first_of(cfg, "conv_bias", default=False)),
        )
    if fam.key == "lfm2":
        f.update(intermediate_size=_lfm2_mlp_width(cfg))
    if fam.key == "lfm3":  # sliding layers by layer_types; a d → H gate per attention head
        listed = _listed_blocks(cfg, n_layers, "layer_types") or []
        window = _int_of(cfg, "sliding_window", default=0) or 0
        spans = tuple(window if n == "sliding_attention" else 0 for n in listed)
        if any(spans):
            f.update(layer_windows=spans)
        if _first_of(cfg, "use_attention_gate", default=False):
            f.update(attention_extra_params=d * h)
    if fam.key == "zamba2":
        f.update(_zamba2_sharing(cfg, d, h, kv, blocks))
    if fam.key == "falcon_h1":
        in_bias = bool(_first_of(cfg, "mamba_proj_bias", default=False))
        if in_bias != bool(_first_of(cfg, "projectors_bias", default=False)):
            raise UsageError(
                "Falcon-H1 config: mamba_proj_bias (in_proj) and projectors_bias (out_proj) "
                "differ; perfscope counts the two Mamba projections' biases together"
            )
        # the µP multipliers scale activations (elementwise, no parameters, no FLOPs)
        f.update(ssm_gated_norm=bool(_first_of(cfg, "mamba_rms_norm", default=False)))
    if "linear" in mixers and fam.key in _KDA:
        lin = cfg.get("linear_attn_config") or {}
        lin = lin if isinstance(lin, dict) else {}
        heads = _int_of(cfg, "linear_num_heads", default=lin.get("num_heads", 32))
        width = _int_of(cfg, "linear_head_dim", default=lin.get("head_dim", 128))
        kernel = lin.get("short_conv_kernel_size", 4)
        f.update(
            linear_key_heads=heads,
            linear_value_heads=heads,
            linear_key_head_dim=width,
            linear_value_head_dim=width,
            linear_conv_kernel=_int_of(cfg, "linear_conv_kernel_dim", default=kernel),
            linear_kda=True,
            # Kimi's gates are low-rank through d_k, Bailing's full rank
            linear_gate_rank=width if fam.key == "kimi_linear" else 0,
        )
    elif "linear" in mixers:
        f.update(
            linear_key_heads=_int_of(cfg, "linear_num_key_heads", default=16),
            linear_value_heads=_int_of(cfg, "linear_num_value_heads", default=32),
            linear_key_head_dim=_int_of(cfg, "linear_key_head_dim", default=128),
            linear_value_head_dim=_int_of(cfg, "linear_value_head_dim", default=128),
            linear_conv_kernel=_int_of(cfg, "linear_conv_kernel_dim", default=4),
        )
    if fam.mla:
        f.update(_mla_fields(cfg, h))
    if fam.key == "bailing_hybrid":  # a d → H gate on each attention head's output
        f.update(attention_extra_params=d * h)
    if fam.key in _DELTANET and fam.key not in ("olmo_hybrid", *_KDA):
        # gated attention, and Qwen's MoE layout (experts, a gated shared expert, dense
        # blocks at mlp_only_layers / off decoder_sparse_step)
        f.update(attn_output_gate=True, **_moe_fields(cfg, fam, n_layers))
    if fam.key == "olmo_hybrid":  # OLMo-2's q/k norms over all heads
        f.update(qk_norm_full=True)
    if "lightning" in mixers:
        f.update(lightning_block_size=_int_of(cfg, "block_size", default=256))
    moe = [i for i, (_, mlp) in enumerate(blocks) if mlp == "moe"]
    dense = tuple(i for i, (_, mlp) in enumerate(blocks) if mlp == "dense")
    if moe and fam.key == "jamba":
        f.update(
            n_experts=_int_of(cfg, "num_experts", default=16),
            n_active_experts=_int_of(cfg, "num_experts_per_tok", default=2),
            dense_layers=dense,
            dense_intermediate_size=f["intermediate_size"],
        )
    elif moe and fam.key in _KDA:  # DeepSeek's layout, spelled its own way
        moe_f = _require(cfg, "moe_intermediate_size")
        f.update(
            # the saved config.json spells them num_experts, num_experts_per_token, ...
            n_experts=_require(cfg, "num_local_experts", "n_routed_experts", "num_experts"),
            n_active_experts=_int_of(
                cfg, "num_experts_per_tok", "num_experts_per_token", default=8
            ),
            intermediate_size=moe_f,
            shared_expert_intermediate_size=moe_f
            * _int_of(cfg, "n_shared_experts", "num_shared_experts", default=1),
            dense_layers=dense,
            dense_intermediate_size=f["intermediate_size"],
        )
    elif moe and fam.key == "minimax":
        f.update(
            n_experts=_require(cfg, "num_local_experts"),
            n_active_experts=_int_of(cfg, "num_experts_per_tok", default=2),
        )
    elif moe and fam.key == "lfm2_moe":
        f.update(
            n_experts=_require(cfg, "num_experts"),
            n_active_experts=_int_of(cfg, "num_experts_per_tok", default=4),
            intermediate_size=_require(cfg, "moe_intermediate_size"),
            dense_layers=dense,
            dense_intermediate_size=f["intermediate_size"],
        )
    elif moe and fam.key == "granitemoehybrid":
        f.update(
            n_experts=_int_of(cfg, "num_local_experts", "num_experts", default=0),
            n_active_experts=_int_of(cfg, "num_experts_per_tok", default=2),
            shared_expert_intermediate_size=_require(cfg, "shared_intermediate_size"),
        )
    elif fam.key == "granitemoehybrid":  # no experts: the shared MLP is the block's MLP
        f.update(intermediate_size=_require(cfg, "shared_intermediate_size"))
    elif moe and nemotron:
        if _first_of(cfg, "moe_latent_size") is not None:
            raise UsageError(
                "NemotronH with moe_latent_size: its experts run in a projected latent "
                "space perfscope does not count yet"
            )
        f.update(
            n_experts=_require(cfg, "n_routed_experts", "num_local_experts"),
            n_active_experts=_int_of(cfg, "num_experts_per_tok", default=2),
            intermediate_size=_require(cfg, "moe_intermediate_size"),
            shared_expert_intermediate_size=(
                _int_of(cfg, "moe_shared_expert_intermediate_size", default=0) or 0
            ),
            dense_layers=dense,
            dense_intermediate_size=f["intermediate_size"],
            expert_bias=False,  # NemotronHExperts: bare weight tensors
        )
    return ModelSpec.from_dict(f)
