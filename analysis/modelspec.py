"""Shape and storage facts of a transformer decoder, enough to count FLOPs and bytes.

A run's manifest carries the engine's model as a plain dict (``manifest["model"]``) with
exactly the field names of :class:`ModelSpec`; :meth:`ModelSpec.from_dict` reads it back.

Constructors: :meth:`ModelSpec.from_hf_config` (a Hugging Face ``config.json`` or its dict),
:meth:`ModelSpec.from_preset` (named public models, see :data:`PRESETS`),
:meth:`ModelSpec.from_dict` (the reference engine's ``ReferenceConfig.model_spec()`` or a
manifest) and :meth:`ModelSpec.resolve` (whatever a user typed: preset name or path).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from perfscope.errors import UsageError
from perfscope.hwdb.spec import normalize_dtype

__all__ = [
    "DTYPE_BYTES",
    "PRESETS",
    "ModelSpec",
    "compute_dtype_for",
    "dtype_bytes",
    "normalize_dtype",
    "preset_names",
    "weight_bytes_per_param",
]

#: Bytes per element of each storage dtype (``int4`` packs two values per byte).
DTYPE_BYTES: dict[str, float] = {
    "fp64": 8.0,
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (``bf16`` → 2, ``int4`` → 0.5).

    Raises:
        UsageError: unknown dtype.
    """
    key = normalize_dtype(dtype)
    try:
        return DTYPE_BYTES[key]
    except KeyError:
        raise UsageError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}") from None


def weight_bytes_per_param(
    dtype: str, *, group_size: int | None = None, scale_bytes: float = 2.0
) -> float:
    """Stored bytes per weight, quantisation scales included.

    ``int4`` defaults to group-wise scales over 128 weights (GPTQ/AWQ style): one fp16
    scale per group adds ``2/128`` bytes, so 0.515625 B/param. ``int8`` defaults to
    per-channel scales, which are negligible (1.0 B/param). Pass ``group_size`` to
    override either; float dtypes ignore it.
    """
    key = normalize_dtype(dtype)
    base = dtype_bytes(key)
    if key == "int4" and group_size is None:
        group_size = 128
    if key in ("int4", "int8") and group_size:
        return base + scale_bytes / group_size
    return base


def compute_dtype_for(weight_dtype: str) -> str:
    """The matmul dtype an engine uses with weights stored as ``weight_dtype``.

    Float weights compute in their own dtype; ``fp8`` weights use fp8 matmuls (W8A8);
    int8/int4 weights are weight-only quantisation and dequantise into bf16 (W8A16, W4A16).
    """
    key = normalize_dtype(weight_dtype)
    if key in ("int8", "int4"):
        return "bf16"
    return key


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer as the cost model sees it.

    Attributes:
        name: display name (preset key, HF ``model_type``/path, or ``reference``).
        n_layers: transformer blocks.
        hidden_size: model width ``d``.
        n_heads: query heads.
        n_kv_heads: key/value heads (``n_heads`` for MHA, 1 for MQA, in between for GQA).
        head_dim: width of one head (usually ``hidden_size // n_heads``).
        intermediate_size: MLP inner width (per expert for MoE).
        mlp_gated: SwiGLU/GeGLU-style MLP with three matrices (gate, up, down) instead of two.
        vocab_size: embedding rows and lm_head outputs.
        tied_embeddings: lm_head shares the embedding matrix (counted once in parameters,
            read once per step).
        n_experts: MoE experts per layer (0 = dense MLP).
        n_active_experts: experts each token is routed to.
        weight_dtype: storage dtype of the weights (``fp32``, ``bf16``, ``fp16``, ``fp8``,
            ``int8``, ``int4``).
        weight_bytes_per_param: bytes per weight including quantisation scales
            (int4 with group-128 fp16 scales is 0.5 + 2/128).
        kv_dtype: storage dtype of the KV cache.
        kv_bytes_per_element: bytes per cached K or V element.
        act_dtype: dtype of activations and of the matmuls (``fp32``, ``bf16``, ...);
            selects the compute ceiling.
        act_bytes_per_element: bytes per activation element.
        lm_head_all_positions: the engine computes logits for every prompt position in
            prefill (HF ``forward``) rather than only the last one.
        qkv_bias: the Q, K and V projections have biases (GPT-2, Qwen2, OPT, GPT-NeoX).
        o_bias: the attention output projection has a bias.
        mlp_bias: the MLP matrices have biases.
        norm_bias: the norms are LayerNorms with a bias (RMSNorm has a weight only).
        norms_per_layer: norm modules per block (2 for most, 4 for Gemma-2).
        final_norm: a norm after the last block.
        qk_norm: per-head RMSNorm on queries and keys (Qwen3, Gemma-3).
        pos_embeddings: rows of a learned absolute position table (GPT-2, OPT), 0 for RoPE.
        max_position_embeddings: longest context the model was built for (0 = unknown).
        extra_params: parameters the fields above do not describe (counted, never read
            per step).
        sliding_window: each token attends to at most this many positions (Mistral v0.1,
            Phi-3); 0 = full attention. Eager HF attention keeps only the window in its
            cache, so it also bounds attention "as executed" once a cache exists.
    """

    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    mlp_gated: bool = True
    tied_embeddings: bool = False
    n_experts: int = 0
    n_active_experts: int = 0
    weight_dtype: str = "bf16"
    weight_bytes_per_param: float = 2.0
    kv_dtype: str = "bf16"
    kv_bytes_per_element: float = 2.0
    act_dtype: str = "bf16"
    act_bytes_per_element: float = 2.0
    lm_head_all_positions: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False
    norms_per_layer: int = 2
    final_norm: bool = True
    qk_norm: bool = False
    pos_embeddings: int = 0
    max_position_embeddings: int = 0
    extra_params: int = 0
    sliding_window: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict with exactly the field names."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        """Build from :meth:`to_dict` output; unknown keys are ignored (newer writers)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    # ------------------------------------------------------------------ derived views

    @property
    def is_moe(self) -> bool:
        """Mixture-of-experts MLP."""
        return self.n_experts > 0

    def with_dtypes(
        self,
        *,
        weight_dtype: str | None = None,
        kv_dtype: str | None = None,
        act_dtype: str | None = None,
        group_size: int | None = None,
    ) -> ModelSpec:
        """A copy stored/computed in other dtypes.

        Changing ``weight_dtype`` alone also moves the compute dtype to
        :func:`compute_dtype_for` it and activations to that dtype's width.
        """
        changes: dict[str, Any] = {}
        if weight_dtype is not None:
            w = normalize_dtype(weight_dtype)
            changes["weight_dtype"] = w
            changes["weight_bytes_per_param"] = weight_bytes_per_param(w, group_size=group_size)
            if act_dtype is None:
                act_dtype = compute_dtype_for(w)
        if act_dtype is not None:
            a = normalize_dtype(act_dtype)
            changes["act_dtype"] = a
            # fp8/int8 matmuls still keep activations between kernels in 16 bits.
            changes["act_bytes_per_element"] = max(dtype_bytes(a), 2.0)
            if a == "fp32":
                changes["act_bytes_per_element"] = 4.0
        if kv_dtype is not None:
            k = normalize_dtype(kv_dtype)
            changes["kv_dtype"] = k
            changes["kv_bytes_per_element"] = dtype_bytes(k)
        return replace(self, **changes)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_hf_config(
        cls, config: dict[str, Any] | str | Path, *, name: str | None = None
    ) -> ModelSpec:
        """Build from a Hugging Face ``config.json`` (a path, a folder holding one, or the dict).

        Understood ``model_type``: llama (Llama-2/3), mistral, mixtral, qwen2, qwen3, gemma,
        gemma2, phi3, gpt2, gpt_neox (Pythia), opt; any other type with Llama-style keys
        (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
        ``intermediate_size``) is read as a Llama-like model. Weight dtype comes from
        ``torch_dtype``/``dtype`` and ``quantization_config``; the KV cache follows the
        compute dtype.

        Raises:
            UsageError: the file is missing or unreadable, or the config lacks the shape keys.
        """
        cfg, default_name = _load_config(config)
        return _spec_from_config(cfg, name or default_name)

    @classmethod
    def from_preset(cls, name: str) -> ModelSpec:
        """A named public model (``llama-2-7b``, ``mixtral-8x7b``, ``gpt2``, ...) in bf16.

        Raises:
            UsageError: unknown preset name (the message lists the known ones).
        """
        key = _preset_key(name)
        if key is None:
            raise UsageError(
                f"unknown model preset {name!r}: use one of {', '.join(preset_names())} "
                "or a path to a Hugging Face config.json"
            )
        spec = _spec_from_config(PRESETS[key], key)
        return spec

    @classmethod
    def resolve(cls, model: str) -> ModelSpec:
        """A preset name, a ``config.json`` path or a folder holding one.

        Raises:
            UsageError: neither a preset nor a readable config.
        """
        if _preset_key(model) is not None:
            return cls.from_preset(model)
        path = Path(model).expanduser()
        if path.exists():
            return cls.from_hf_config(path)
        raise UsageError(
            f"--model {model!r} is neither a preset ({', '.join(preset_names())}) "
            "nor an existing config.json path"
        )


# ---------------------------------------------------------------------- HF configs


def _load_config(config: dict[str, Any] | str | Path) -> tuple[dict[str, Any], str]:
    if isinstance(config, dict):
        return config, str(config.get("_name_or_path") or config.get("model_type") or "hf")
    path = Path(config).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"model config {str(path)!r} does not exist") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read model config {str(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"model config {str(path)!r} is not a JSON object")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return data, name


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return default


def _require(cfg: dict[str, Any], *keys: str) -> int:
    v = _get(cfg, *keys)
    if v is None:
        raise UsageError(
            f"model config has no {' / '.join(keys)}: not a decoder config perfscope can read "
            f"(model_type {cfg.get('model_type')!r})"
        )
    return int(v)


def _dtypes_from_config(cfg: dict[str, Any]) -> dict[str, Any]:
    raw = _get(cfg, "torch_dtype", "dtype", default="bfloat16")
    w = normalize_dtype(str(raw))
    if w not in DTYPE_BYTES:
        w = "bf16"
    group: int | None = None
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        method = str(q.get("quant_method", "")).lower()
        bits = q.get("bits") or q.get("w_bit") or q.get("weight_bits")
        if q.get("load_in_4bit") or bits == 4:
            w = "int4"
            default_group = 64 if method == "bitsandbytes" else 128
            group = int(q.get("group_size") or q.get("q_group_size") or default_group)
        elif q.get("load_in_8bit") or bits == 8:
            w = "fp8" if "fp8" in method else "int8"
        elif "fp8" in method:
            w = "fp8"
    act = compute_dtype_for(w)
    act_bytes = max(DTYPE_BYTES[act], 2.0) if act != "fp32" else 4.0
    return {
        "weight_dtype": w,
        "weight_bytes_per_param": weight_bytes_per_param(w, group_size=group),
        "act_dtype": act,
        "act_bytes_per_element": act_bytes,
        "kv_dtype": act if act != "fp8" else "bf16",
        "kv_bytes_per_element": max(DTYPE_BYTES[act], 2.0) if act != "fp32" else 4.0,
    }


def _spec_from_config(cfg: dict[str, Any], name: str) -> ModelSpec:
    mt = str(cfg.get("model_type", "")).lower()
    # Multimodal wrappers (Gemma-3, Mistral-3) nest the decoder under text_config.
    text = cfg.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in cfg:
        merged = {**text}
        for k in ("torch_dtype", "dtype", "quantization_config"):
            if k in cfg and k not in merged:
                merged[k] = cfg[k]
        return _spec_from_config(merged, name)

    f: dict[str, Any] = {"name": name, **_dtypes_from_config(cfg)}

    if mt == "gpt2":
        d = _require(cfg, "n_embd", "hidden_size")
        h = _require(cfg, "n_head", "num_attention_heads")
        f.update(
            n_layers=_require(cfg, "n_layer", "num_hidden_layers"),
            hidden_size=d,
            n_heads=h,
            n_kv_heads=h,
            head_dim=d // h,
            intermediate_size=int(_get(cfg, "n_inner", default=4 * d)),
            vocab_size=int(_get(cfg, "vocab_size", default=50257)),
            mlp_gated=False,
            tied_embeddings=bool(_get(cfg, "tie_word_embeddings", default=True)),
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            norm_bias=True,
            pos_embeddings=int(_get(cfg, "n_positions", "max_position_embeddings", default=1024)),
            max_position_embeddings=int(
                _get(cfg, "n_positions", "max_position_embeddings", default=1024)
            ),
        )
        return ModelSpec(**f)

    if mt == "gpt_neox":
        d = _require(cfg, "hidden_size")
        h = _require(cfg, "num_attention_heads")
        bias = bool(_get(cfg, "attention_bias", default=True))
        f.update(
            n_layers=_require(cfg, "num_hidden_layers"),
            hidden_size=d,
            n_heads=h,
            n_kv_heads=h,
            head_dim=d // h,
            intermediate_size=int(_get(cfg, "intermediate_size", default=4 * d)),
            vocab_size=_require(cfg, "vocab_size"),
            mlp_gated=False,
            tied_embeddings=bool(_get(cfg, "tie_word_embeddings", default=False)),
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=True,
            norm_bias=True,
            max_position_embeddings=int(_get(cfg, "max_position_embeddings", default=2048)),
        )
        return ModelSpec(**f)

    if mt == "opt":
        d = _require(cfg, "hidden_size")
        h = _require(cfg, "num_attention_heads")
        bias = bool(_get(cfg, "enable_bias", default=True))
        affine = bool(_get(cfg, "layer_norm_elementwise_affine", default=True))
        proj = int(_get(cfg, "word_embed_proj_dim", default=d))
        v = _require(cfg, "vocab_size")
        final = bool(_get(cfg, "do_layer_norm_before", default=True)) and not bool(
            cfg.get("_remove_final_layer_norm", False)
        )
        max_pos = int(_get(cfg, "max_position_embeddings", default=2048))
        # OPT-350m projects a narrower embedding in and out; those two matrices and the
        # narrower table are counted here but not modelled as per-step work.
        extra = 0 if proj == d else (2 * d * proj + v * (proj - d))
        if not affine:
            extra -= 2 * (2 * d) * _require(cfg, "num_hidden_layers") + (2 * d if final else 0)
        f.update(
            n_layers=_require(cfg, "num_hidden_layers"),
            hidden_size=d,
            n_heads=h,
            n_kv_heads=h,
            head_dim=d // h,
            intermediate_size=int(_get(cfg, "ffn_dim", default=4 * d)),
            vocab_size=v,
            mlp_gated=False,
            tied_embeddings=bool(_get(cfg, "tie_word_embeddings", default=True)),
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            norm_bias=True,
            final_norm=final,
            pos_embeddings=max_pos + 2,  # OPT's learned table has a fixed offset of 2
            max_position_embeddings=max_pos,
            extra_params=extra,
        )
        return ModelSpec(**f)

    # Llama family and everything with the same keys.
    d = _require(cfg, "hidden_size", "n_embd", "d_model")
    h = _require(cfg, "num_attention_heads", "n_head")
    kv_default = 8 if mt in ("mistral", "mixtral") else h
    kv = int(_get(cfg, "num_key_value_heads", default=kv_default))
    head_dim = int(_get(cfg, "head_dim", default=d // h))
    n_experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0))
    active = int(_get(cfg, "num_experts_per_tok", "moe_topk", default=2 if n_experts else 0))
    inter = _get(cfg, "moe_intermediate_size") if n_experts and mt != "mixtral" else None
    if inter is None:
        inter = _require(cfg, "intermediate_size", "n_inner", "ffn_dim")
    tie_default = mt in ("gemma", "gemma2", "gemma3_text")
    attn_bias = bool(_get(cfg, "attention_bias", default=False))
    qkv_bias = attn_bias
    o_bias = attn_bias
    if mt == "qwen2":
        qkv_bias, o_bias = True, False
    f.update(
        n_layers=_require(cfg, "num_hidden_layers", "n_layer", "num_layers"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=int(inter),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=True,
        tied_embeddings=bool(_get(cfg, "tie_word_embeddings", default=tie_default)),
        n_experts=n_experts,
        n_active_experts=active if n_experts else 0,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=bool(_get(cfg, "mlp_bias", default=False)),
        norms_per_layer=4 if mt in ("gemma2", "gemma3_text") else 2,
        qk_norm=mt in ("qwen3", "qwen3_moe", "gemma3_text"),
        max_position_embeddings=int(_get(cfg, "max_position_embeddings", default=0)),
        sliding_window=_sliding_window(cfg, mt),
    )
    return ModelSpec(**f)


def _sliding_window(cfg: dict[str, Any], mt: str) -> int:
    window = cfg.get("sliding_window")
    if not window:
        return 0
    if mt in ("mistral", "mixtral", "phi3"):
        return int(window)
    if mt in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        # Qwen2 applies the window only from layer max_window_layers on; modelled as all.
        return int(window)
    return 0


# ---------------------------------------------------------------------- presets

#: Named public models as the HF ``config.json`` fields that matter (bf16). Values from the
#: models' published configs.
PRESETS: dict[str, dict[str, Any]] = {
    "llama-2-7b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
    },
    "llama-2-13b": {
        "model_type": "llama",
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 40,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
    },
    "llama-2-70b": {
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
    },
    "llama-3-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    },
    "llama-3-70b": {
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    },
    "mistral-7b": {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    },
    "mixtral-8x7b": {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    },
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "vocab_size": 50257,
        "n_positions": 1024,
        "torch_dtype": "float32",
    },
}

_PRESET_ALIASES = {
    "gpt-2": "gpt2",
    "gpt2-small": "gpt2",
    "gpt-2-small": "gpt2",
    "llama2-7b": "llama-2-7b",
    "llama2-13b": "llama-2-13b",
    "llama2-70b": "llama-2-70b",
    "llama3-8b": "llama-3-8b",
    "llama3-70b": "llama-3-70b",
    "llama-3.1-8b": "llama-3-8b",
    "llama-3.1-70b": "llama-3-70b",
    "mistral-7b-v0.1": "mistral-7b",
    "qwen2.5-7b-instruct": "qwen2.5-7b",
}


def _preset_key(name: str) -> str | None:
    key = name.strip().lower().replace("_", "-")
    key = key.split("/")[-1] if "/" in key and not Path(name).exists() else key
    key = key.removeprefix("meta-").removesuffix("-hf").removesuffix("-instruct")
    if key in PRESETS:
        return key
    return _PRESET_ALIASES.get(key)


def preset_names() -> list[str]:
    """Known preset keys, in table order."""
    return list(PRESETS)
