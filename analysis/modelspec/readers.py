"""Config readers: a normalised config dict to a :class:`ModelSpec`, one reader per family
layout (the shared Llama key set, and the families with keys of their own)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from perfscope.analysis.modelspec.families import (
    Family,
    _flag,
    _layer_windows,
    _mla_fields,
    _moe_fields,
    family_for,
)
from perfscope.analysis.modelspec.hf_config import (
    _as_int,
    _first_of,
    _float_of,
    _int_of,
    _require,
)
from perfscope.analysis.modelspec.hybrid import _hybrid
from perfscope.analysis.modelspec.quant import _dtypes_from_config
from perfscope.analysis.modelspec.spec import ModelSpec
from perfscope.errors import UsageError
from perfscope.jsontypes import JsonObject


def _spec_from_config(cfg: JsonObject, name: str) -> ModelSpec:
    # Multimodal wrappers (Gemma-3, Mistral-3) nest the decoder under text_config.
    text = cfg.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in cfg:
        merged = {**text}
        for k in ("torch_dtype", "dtype", "quantization_config"):
            if k in cfg and k not in merged:
                merged[k] = cfg[k]
        if "model_type" not in merged and cfg.get("model_type"):
            merged["model_type"] = f"{cfg['model_type']}_text"
        spec = _spec_from_config(merged, name)
        towers = sorted(
            k
            for k, v in cfg.items()
            if k.endswith("_config") and isinstance(v, dict) and k not in _NOT_TOWERS
        )
        if not towers:
            return spec
        extra, note = _tower_params(cfg, towers)
        return replace(spec, extra_params=spec.extra_params + extra, notes=(*spec.notes, note))

    fam = family_for(cfg)
    # The fields gathered for ModelSpec, each narrowed to its field's type by from_dict.
    f: dict[str, object] = {"name": name, "family": fam.key, **_dtypes_from_config(cfg)}
    if fam.reader == "gpt2":
        return _gpt2(cfg, f)
    if fam.reader == "gpt_neox":
        return _gpt_neox(cfg, f)
    if fam.reader == "opt":
        return _opt(cfg, f)
    if fam.reader == "gptj":
        return _gptj(cfg, f)
    if fam.reader == "bloom":
        return _bloom(cfg, f)
    if fam.reader == "falcon":
        return _falcon(cfg, f)
    if fam.reader == "dbrx":
        return _dbrx(cfg, f)
    if fam.reader == "mpt":
        return _mpt(cfg, f)
    if fam.reader == "mamba":
        return _mamba(cfg, fam, f)
    if fam.reader == "hybrid":
        return _hybrid(cfg, fam, f)

    d = _require(cfg, "hidden_size")
    h = _require(cfg, "num_attention_heads")
    n_layers = _require(cfg, "num_hidden_layers")
    kv = _int_of(cfg, "num_key_value_heads", default=fam.kv_default or h)
    head_dim = _int_of(cfg, "head_dim", default=d // h)
    f.update(
        n_layers=n_layers,
        hidden_size=d,
        n_heads=h,
        n_kv_heads=kv,
        head_dim=head_dim,
        # an all-MoE model (Solar-Open) may give only its experts' width
        intermediate_size=_require(cfg, "intermediate_size", "moe_intermediate_size"),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=fam.mlp_gated,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=fam.tied_default)),
        qkv_bias=_flag(cfg, fam.qkv_bias, default=fam.qkv_bias == "qkv_bias"),
        o_bias=_flag(cfg, fam.o_bias),
        mlp_bias=_flag(cfg, fam.mlp_bias),
        norm_bias=fam.norm_bias,
        norms_per_layer=fam.norms_per_layer + (2 if _flag(cfg, fam.post_norm_flag or False) else 0),
        final_norm=fam.final_norm,
        qk_norm=_flag(cfg, fam.qk_norm),
        qk_norm_full=fam.qk_norm_full,
        lm_head_bias=_flag(cfg, fam.lm_head_bias),
        attention_sinks=fam.attention_sinks,
        attn_output_gate=fam.attn_output_gate,
        attn_gate_bias=fam.attn_gate_bias,
        router_bias=fam.router_bias,
        max_position_embeddings=_int_of(cfg, "max_position_embeddings", default=0),
        layer_windows=_layer_windows(cfg, fam, n_layers),
    )
    act, per_mlp = fam.act_params
    if per_mlp and str(_first_of(cfg, "hidden_act", default="")) == act:
        f.update(extra_params=per_mlp * n_layers)
    f.update(_moe_fields(cfg, fam, n_layers))
    if fam.mla:
        f.update(_mla_fields(cfg, h))
    # A uniform window is stored the old way, so older readers see it too.
    windows = f["layer_windows"]
    if isinstance(windows, tuple) and len(set(windows)) == 1 and windows[0] > 0:
        f.update(sliding_window=windows[0], layer_windows=())
    return ModelSpec.from_dict(f)


_NOT_TOWERS = ("text_config", "quantization_config", "rope_scaling", "generation_config")


def _tower_params(cfg: JsonObject, towers: list[str]) -> tuple[int, str]:
    """Parameters of a multimodal wrapper outside its text decoder (vision tower and
    projector), counted by building the wrapper and its text model on torch's ``meta``
    device (no memory). ``(0, why)`` when that cannot be done here."""
    what = ", ".join(towers)
    try:
        import torch
        import transformers
    except ImportError:
        return 0, f"weights of {what} left out (needs torch and transformers to count)"
    try:
        # the config class judges the free-form JSON keywords itself (a rejection: below)
        model_type = str(cfg["model_type"])
        build: Callable[..., transformers.PretrainedConfig] = transformers.CONFIG_MAPPING[
            model_type
        ]
        conf = build(**{k: v for k, v in cfg.items() if k != "model_type"})
        auto: Any = transformers.AutoModel  # untyped in transformers' stubs
        with torch.device("meta"):
            full = auto.from_config(conf)
            text = auto.from_config(conf.get_text_config())
        extra = sum(p.numel() for p in full.parameters()) - sum(
            p.numel() for p in text.parameters()
        )
    except Exception as exc:  # an unknown wrapper: say what is missing, never guess
        return 0, f"weights of {what} left out ({type(exc).__name__}: {str(exc)[:100]})"
    return int(extra), (
        f"{what}: {extra:,} parameters (vision tower, projector) counted in weights, "
        "not run per decode step"
    )


def _notes(value: object) -> tuple[str, ...]:
    """The ``notes`` gathered so far for a spec (a tuple of sentences; none when absent)."""
    return tuple(n for n in value if isinstance(n, str)) if isinstance(value, tuple) else ()


def _mamba(cfg: Mapping[str, object], fam: Family, f: dict[str, object]) -> ModelSpec:
    """Mamba (v1), Falcon-Mamba and Mamba2: every block a pre-norm selective-SSM mixer, no
    attention, no MLP. The inner width is what the model code reads: Mamba and
    Falcon-Mamba the config's ``intermediate_size`` (their config classes default it to
    ``expand · hidden_size`` but keep one given), Mamba2 ``expand · hidden_size`` always;
    ``time_step_rank`` ``auto`` is ``ceil(d / 16)``."""
    d = _require(cfg, "hidden_size", "d_model")
    expand = _float_of(cfg, "expand", default=2)
    inner = int(expand * d)
    if fam.key != "mamba2":
        inner = _int_of(cfg, "intermediate_size", default=inner) or inner
    rank = _first_of(cfg, "time_step_rank", "dt_rank", default="auto")
    f.update(
        n_layers=_require(cfg, "num_hidden_layers", "n_layer"),
        hidden_size=d,
        n_heads=0,
        n_kv_heads=0,
        head_dim=0,
        intermediate_size=0,
        vocab_size=_int_of(cfg, "vocab_size", default=50280),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=fam.tied_default)),
        norms_per_layer=1,
        max_position_embeddings=0,
        ssm_inner_size=inner,
        ssm_state_size=_int_of(cfg, "state_size", "d_state", default=16),
        ssm_conv_kernel=_int_of(cfg, "conv_kernel", "d_conv", default=4),
        ssm_time_step_rank=math.ceil(d / 16)
        if rank == "auto"
        else _as_int(rank, "time_step_rank", "dt_rank"),
        ssm_proj_bias=bool(_first_of(cfg, "use_bias", default=False)),
        ssm_conv_bias=bool(_first_of(cfg, "use_conv_bias", default=True)),
    )
    if fam.key == "mamba2":
        heads = _int_of(cfg, "num_heads", default=128)
        head_dim = _int_of(cfg, "head_dim", default=64)
        if heads * head_dim != f["ssm_inner_size"]:
            raise UsageError(
                f"mamba2 config: num_heads · head_dim ({heads} · {head_dim}) must equal "
                f"expand · hidden_size ({f['ssm_inner_size']})"
            )
        f.update(
            ssm_time_step_rank=0,
            ssm_n_heads=heads,
            ssm_head_dim=head_dim,
            ssm_n_groups=_int_of(cfg, "n_groups", default=1),
            ssm_chunk_size=_int_of(cfg, "chunk_size", default=256),
        )
    return ModelSpec.from_dict(f)


def _gpt2(cfg: Mapping[str, object], f: dict[str, object]) -> ModelSpec:
    d = _require(cfg, "n_embd", "hidden_size")
    h = _require(cfg, "n_head", "num_attention_heads")
    n_pos = _int_of(cfg, "n_positions", "max_position_embeddings", default=1024)
    f.update(
        n_layers=_require(cfg, "n_layer", "num_hidden_layers"),
        hidden_size=d,
        n_heads=h,
        # GPTBigCode (StarCoder, SantaCoder): multi-query, one K/V head
        n_kv_heads=1 if _first_of(cfg, "multi_query", default=False) else h,
        head_dim=d // h,
        intermediate_size=(_int_of(cfg, "n_inner", default=4 * d) or 4 * d),
        vocab_size=_int_of(cfg, "vocab_size", default=50257),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=True)),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        norm_bias=True,
        pos_embeddings=n_pos,
        max_position_embeddings=n_pos,
    )
    return ModelSpec.from_dict(f)


def _bloom(cfg: Mapping[str, object], f: dict[str, object]) -> ModelSpec:
    # BLOOM: ALiBi (a bias added to the scores: no matmul, no parameters), fused biased
    # QKV, a plain 4d MLP with biases, LayerNorms with bias and one more LayerNorm on the
    # embeddings, tied lm_head.
    d = _require(cfg, "hidden_size", "n_embed")
    h = _require(cfg, "n_head", "num_attention_heads")
    f.update(
        n_layers=_require(cfg, "n_layer", "num_hidden_layers"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=h,
        head_dim=d // h,
        intermediate_size=4 * d,
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=True)),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        norm_bias=True,
        extra_params=2 * d,  # word_embeddings_layernorm
    )
    return ModelSpec.from_dict(f)


def _falcon(cfg: Mapping[str, object], f: dict[str, object]) -> ModelSpec:
    # Falcon: one fused query_key_value and a dense out projection, a plain MLP
    # (``ffn_hidden_size``, default 4d), LayerNorms with bias, biases on every linear when
    # ``bias``; RoPE or ALiBi (neither a matmul nor a parameter). Three attention layouts:
    # multi-query (7B: one shared K/V head), the new decoder architecture (40B/180B:
    # ``num_kv_heads`` K/V groups) and the original multi-head one. Parallel attention (MLP
    # and attention read the same input) does not change the counts; it sets the norms.
    d = _require(cfg, "hidden_size", "n_embed")
    h = _require(cfg, "num_attention_heads", "n_head")
    legacy_new = str(cfg.get("model_type", "")).lower() == "refinedweb"  # Falcon-40B's own code
    new_arch = bool(_first_of(cfg, "new_decoder_architecture", default=legacy_new))
    multi_query = bool(_first_of(cfg, "multi_query", default=True))
    parallel = bool(_first_of(cfg, "parallel_attn", default=True))
    if new_arch:
        kv = _int_of(cfg, "num_kv_heads", "n_head_kv", default=h) or h
    else:
        kv = 1 if multi_query else h
    ln = _first_of(cfg, "num_ln_in_parallel_attn", default=None)
    norms = (
        2
        if not parallel
        else _as_int(ln, "num_ln_in_parallel_attn")
        if ln is not None
        else (2 if new_arch else 1)
    )
    bias = bool(_first_of(cfg, "bias", default=False))
    notes = list(_notes(f.pop("notes", ())))
    if new_arch and kv != h:
        notes.append(
            f"Falcon new decoder architecture: {kv} K/V heads cached, as serving engines and "
            f"transformers 5.25 do (5.24 broadcast them to all {h} heads before its cache)"
        )
    f.update(
        n_layers=_require(cfg, "num_hidden_layers", "n_layer"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=kv,
        head_dim=d // h,
        intermediate_size=(_int_of(cfg, "ffn_hidden_size", default=4 * d) or 4 * d),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=True)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        norm_bias=True,
        norms_per_layer=norms,
        max_position_embeddings=_int_of(cfg, "max_position_embeddings", default=2048),
        notes=tuple(notes),
    )
    return ModelSpec.from_dict(f)


def _dbrx(cfg: Mapping[str, object], f: dict[str, object]) -> ModelSpec:
    # DBRX: a fused Wqkv (``d + 2·K·h_d`` outputs, no bias; ``clip_qkv`` is a clamp, no
    # matmul), an out projection, bias-free LayerNorms, and in every block a MoE of
    # ``moe_num_experts`` gated experts (w1, v1, w2, ``ffn_hidden_size`` wide) with a
    # bias-free router; ``attn_config``/``ffn_config`` are nested.
    attn = cfg.get("attn_config") or {}
    ffn = cfg.get("ffn_config") or {}
    if not isinstance(attn, dict) or not isinstance(ffn, dict):
        raise UsageError("DBRX config: attn_config and ffn_config must be JSON objects")
    d = _require(cfg, "d_model", "hidden_size")
    h = _require(cfg, "n_heads", "num_attention_heads")
    f.update(
        n_layers=_require(cfg, "n_layers", "num_hidden_layers"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=_int_of(attn, "kv_n_heads", default=1),
        head_dim=d // h,
        intermediate_size=_int_of(ffn, "ffn_hidden_size", default=3584),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=True,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=False)),
        n_experts=_int_of(ffn, "moe_num_experts", default=4),
        n_active_experts=_int_of(ffn, "moe_top_k", default=1),
        max_position_embeddings=_int_of(cfg, "max_seq_len", default=2048),
    )
    return ModelSpec.from_dict(f)


def _mpt(cfg: Mapping[str, object], f: dict[str, object]) -> ModelSpec:
    # MPT as transformers builds it: a fused bias-free Wqkv and out_proj, ALiBi (no matmul,
    # no parameters, no position table), a bias-free 4d GELU MLP (transformers' MptMLP is
    # 4·d wide whatever expansion_ratio says), LayerNorms with a weight only, tied lm_head.
    d = _require(cfg, "d_model", "hidden_size")
    h = _require(cfg, "n_heads", "num_attention_heads")
    f.update(
        n_layers=_require(cfg, "n_layers", "num_hidden_layers"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=h,
        head_dim=d // h,
        intermediate_size=4 * d,
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=True)),
        max_position_embeddings=_int_of(cfg, "max_seq_len", default=2048),
    )
    ratio = _first_of(cfg, "expansion_ratio", default=4)
    if ratio != 4:
        f["notes"] = (
            *_notes(f.get("notes", ())),
            f"MPT expansion_ratio {ratio} ignored: transformers builds a 4·d MLP, as counted",
        )
    return ModelSpec.from_dict(f)


def _gptj(cfg: Mapping[str, object], f: dict[str, object]) -> ModelSpec:
    # GPT-J: one LayerNorm feeding attention and MLP in parallel, unbiased q/k/v/out,
    # biased plain MLP, partial rotary (not counted: no matmul), a biased lm_head.
    d = _require(cfg, "n_embd", "hidden_size")
    h = _require(cfg, "n_head", "num_attention_heads")
    f.update(
        n_layers=_require(cfg, "n_layer", "num_hidden_layers"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=h,
        head_dim=d // h,
        intermediate_size=(_int_of(cfg, "n_inner", default=4 * d) or 4 * d),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=False)),
        mlp_bias=True,
        norm_bias=True,
        norms_per_layer=1,
        lm_head_bias=True,
        max_position_embeddings=_int_of(cfg, "n_positions", default=2048),
    )
    return ModelSpec.from_dict(f)


def _gpt_neox(cfg: Mapping[str, object], f: dict[str, object]) -> ModelSpec:
    d = _require(cfg, "hidden_size")
    h = _require(cfg, "num_attention_heads")
    bias = bool(_first_of(cfg, "attention_bias", default=True))
    f.update(
        n_layers=_require(cfg, "num_hidden_layers"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=h,
        head_dim=d // h,
        intermediate_size=_int_of(cfg, "intermediate_size", default=4 * d),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=False)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=True,
        norm_bias=True,
        max_position_embeddings=_int_of(cfg, "max_position_embeddings", default=2048),
    )
    return ModelSpec.from_dict(f)


def _opt(cfg: Mapping[str, object], f: dict[str, object]) -> ModelSpec:
    d = _require(cfg, "hidden_size")
    h = _require(cfg, "num_attention_heads")
    bias = bool(_first_of(cfg, "enable_bias", default=True))
    affine = bool(_first_of(cfg, "layer_norm_elementwise_affine", default=True))
    proj = _int_of(cfg, "word_embed_proj_dim", default=d)
    v = _require(cfg, "vocab_size")
    final = bool(_first_of(cfg, "do_layer_norm_before", default=True)) and not bool(
        cfg.get("_remove_final_layer_norm", False)
    )
    max_pos = _int_of(cfg, "max_position_embeddings", default=2048)
    extra = 0
    if not affine:
        extra -= 2 * (2 * d) * _require(cfg, "num_hidden_layers") + (2 * d if final else 0)
    f.update(
        n_layers=_require(cfg, "num_hidden_layers"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=h,
        head_dim=d // h,
        intermediate_size=_int_of(cfg, "ffn_dim", default=4 * d),
        vocab_size=v,
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=True)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        norm_bias=True,
        final_norm=final,
        pos_embeddings=max_pos + 2,  # OPT's learned table has a fixed offset of 2
        max_position_embeddings=max_pos,
        extra_params=extra,
        # OPT-350m: a narrower table, projected in and out (word_embed_proj_dim).
        embed_dim=proj if proj != d else 0,
    )
    return ModelSpec.from_dict(f)
