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
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from perfscope.errors import UsageError
from perfscope.hwdb.spec import normalize_dtype

__all__ = [
    "ATTENTION_KINDS",
    "DTYPE_BYTES",
    "FAMILIES",
    "PRESETS",
    "REFUSED",
    "Family",
    "LayerAttention",
    "ModelSpec",
    "QuantLayout",
    "apply_dtype_overrides",
    "compute_dtype_for",
    "dtype_bytes",
    "family_for",
    "normalised_config",
    "normalize_dtype",
    "preset_names",
    "quant_layout",
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
    "fp4": 0.5,
    "int3": 0.375,
    "int2": 0.25,
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
    if key in ("int4", "int8", "int3", "int2") and group_size:
        return base + scale_bytes / group_size
    return base


def compute_dtype_for(weight_dtype: str) -> str:
    """The matmul dtype an engine uses with weights stored as ``weight_dtype``.

    Float weights compute in their own dtype; ``fp8`` weights use fp8 matmuls (W8A8);
    int8/int4 weights are weight-only quantisation and dequantise into bf16 (W8A16, W4A16).
    """
    key = normalize_dtype(weight_dtype)
    if key in ("int8", "int4", "int3", "int2", "fp4"):
        return "bf16"
    return key


#: Attention kinds a layer can have (see :meth:`ModelSpec.layer_attention`).
ATTENTION_KINDS = ("full", "sliding", "chunked")


@dataclass(frozen=True)
class LayerAttention:
    """How one block attends.

    Attributes:
        kind: ``full`` (every earlier position), ``sliding`` (the last ``span`` positions,
            itself included) or ``chunked`` (positions of its own ``span``-token chunk,
            Llama-4 ``attention_chunk_size``).
        span: window or chunk length in tokens (0 for ``full``).
    """

    kind: str
    span: int = 0


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer as the cost model sees it.

    Attributes:
        name: display name (preset key, HF ``model_type``/path, or ``reference``).
        n_layers: transformer blocks.
        hidden_size: model width ``d``.
        n_heads: query heads.
        n_kv_heads: key/value heads (``n_heads`` for MHA, 1 for MQA, in between for GQA).
        head_dim: width of one query/key head (MLA: ``qk_nope_head_dim + qk_rope_head_dim``).
        intermediate_size: MLP inner width (per routed expert for MoE).
        mlp_gated: SwiGLU/GeGLU-style MLP with three matrices (gate, up, down) instead of two.
        vocab_size: embedding rows and lm_head outputs.
        tied_embeddings: lm_head shares the embedding matrix (counted once in parameters,
            read once per step).
        n_experts: routed MoE experts per MoE layer (0 = dense MLP).
        n_active_experts: routed experts each token goes to.
        weight_dtype: storage dtype of the quantised (or all) weight matrices (``fp32``,
            ``bf16``, ``fp16``, ``fp8``, ``int8``, ``int4``).
        weight_bytes_per_param: bytes per weight of those matrices including quantisation
            scales (int4 with group-128 fp16 scales is 0.5 + 2/128).
        kv_dtype: storage dtype of the KV cache.
        kv_bytes_per_element: bytes per cached K or V element.
        act_dtype: dtype of activations and of the matmuls (``fp32``, ``bf16``, ...);
            selects the compute ceiling.
        act_bytes_per_element: bytes per activation element.
        lm_head_all_positions: the engine computes logits for every prompt position in
            prefill (HF ``forward``) rather than only the last one.
        qkv_bias: the Q, K and V projections have biases (GPT-2, Qwen2, OPT, GPT-NeoX).
        o_bias: the attention output projection has a bias.
        mlp_bias: the MLP matrices (every expert's too) have biases.
        norm_bias: the norms are LayerNorms with a bias (RMSNorm has a weight only).
        norms_per_layer: norm modules per block (2 for most, 4 for Gemma-2).
        final_norm: a norm after the last block.
        qk_norm: per-head RMSNorm on queries and keys (Qwen3, Gemma-3).
        pos_embeddings: rows of a learned absolute position table (GPT-2, OPT), 0 for RoPE.
        max_position_embeddings: longest context the model was built for (0 = unknown).
        extra_params: parameters the fields above do not describe (counted, never read
            per step).
        sliding_window: window of every layer when :attr:`layer_windows` is empty (Mistral
            v0.1, Phi-3); 0 = full attention. Eager HF attention keeps only the window in its
            cache, so it also bounds attention "as executed" once a cache exists.
        layer_windows: per-layer attention span: 0 full, ``w > 0`` a sliding window of ``w``
            tokens, ``-c`` chunked attention over chunks of ``c`` tokens. Empty: every layer
            uses :attr:`sliding_window`. Gemma-2/3, Qwen2 ``max_window_layers``, HF
            ``layer_types``.
        shared_expert_intermediate_size: width of the always-active shared-expert MLP of each
            MoE layer (Qwen2-MoE ``shared_expert_intermediate_size``; DeepSeek
            ``n_shared_experts · moe_intermediate_size``), 0 = none.
        shared_expert_gate: the shared expert output is scaled by a ``d → 1`` sigmoid gate
            (Qwen2-MoE).
        router_bias: the router has a bias per expert.
        dense_layers: indices of blocks that keep a dense MLP in a MoE model (DeepSeek
            ``first_k_dense_replace``, Qwen2-MoE ``mlp_only_layers``/``decoder_sparse_step``).
        dense_intermediate_size: MLP width of those dense blocks.
        kv_lora_rank: multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): width of the
            compressed KV latent that is cached (0 = ordinary attention).
        q_lora_rank: MLA query compression width (0 = a plain ``d → H·h_qk`` projection).
        qk_rope_head_dim: MLA per-head rotary part of queries/keys (cached once, shared).
        v_head_dim: MLA value head width.
        mla_absorbed: MLA decode steps (one new token per row) run with the
            up-projections absorbed into the query and output (vLLM/SGLang decode: attend
            over the latent directly); False: the latent is expanded to per-head K/V for
            every attended token, as HF transformers does.
        mla_prefill_absorbed: MLA steps with more than one new token per row (prefill,
            chunks) run absorbed too. False (the default): expanded, as vLLM, SGLang and
            transformers all run prefill.
        quant_method: ``quantization_config.quant_method`` (``gptq``, ``awq``,
            ``bitsandbytes``, ``fp8``, ``compressed-tensors``), empty when not quantised.
        quant_group_size: weights per scale group (0 = per channel or not quantised).
        quant_zero_bytes_per_param: stored zero points per weight (GPTQ/AWQ asymmetric:
            ``bits/8 / group``), on top of :attr:`weight_bytes_per_param`.
        quant_index_bytes_per_input: bytes per input feature of each quantised linear (GPTQ
            ``g_idx``: int32 = 4).
        unquantized_bytes_per_param: bytes per weight of the matrices a quantised checkpoint
            keeps in 16 bits (embedding, lm_head, router); 0 = same as
            :attr:`weight_bytes_per_param` (not quantised, or the old "all quantised" view).
        weight_density: fraction of the block matrices' weights that are stored and
            multiplied (1 = dense; 0.5 = half pruned away and run as a sparse format). The
            embedding and lm_head stay dense.
        weight_index_bytes_per_nonzero: bytes of sparse-format indices per stored weight
            (torch CSR: an int64 column index, 8, plus row pointers; 2:4 metadata); 0 dense.
        quant_lm_head: the checkpoint quantises the lm_head like the block matrices (GPTQ
            ``"lm_head": true``); otherwise it stays at :attr:`embedding_bytes_per_param`.
        embed_dim: width of the embedding table and lm_head when it differs from
            :attr:`hidden_size` (OPT-350m ``word_embed_proj_dim``: a ``e → d`` project_in
            before the first block and a ``d → e`` project_out after the last, both
            without bias); 0 = :attr:`hidden_size`.
        qk_norm_full: the q/k norms span all heads (``H·h_d`` and ``K·h_d`` weights: OLMo-2,
            OLMoE, Cohere, StableLM's per-head LayerNorms) rather than one ``h_d`` vector each.
        lm_head_bias: the lm_head has a bias (GPT-J).
        attention_sinks: every attention layer has one learned sink logit per head (gpt-oss):
            a softmax column, no matmul, ``H`` parameters per layer.
        ssm_inner_size: state-space (Mamba) blocks: the inner width ``I`` (``expand · d``)
            their ``in_proj`` expands to twice over (x and the gate); 0 = no SSM blocks. A
            Mamba block has no attention and no MLP: ``n_heads``, ``n_kv_heads``,
            ``head_dim`` and ``intermediate_size`` are 0.
        ssm_state_size: SSM state width ``N`` per channel (``state_size``).
        ssm_conv_kernel: depthwise causal conv width ``K`` (``conv_kernel``).
        ssm_time_step_rank: rank ``R`` of the time-step projection (``time_step_rank``).
        ssm_proj_bias: ``in_proj`` and ``out_proj`` have biases (``use_bias``).
        ssm_conv_bias: the conv has a bias per channel (``use_conv_bias``).
        ssm_n_heads: Mamba2 (SSD) heads ``H`` (0 = Mamba v1); ``I = H · P``.
        ssm_head_dim: Mamba2 head width ``P``.
        ssm_n_groups: Mamba2 B/C groups ``G`` (the conv also runs over ``2·G·N`` channels).
        ssm_chunk_size: Mamba2 chunk length ``Q`` of the chunked (SSD) scan; the torch path
            pads every multi-token step up to whole chunks.
        family: the :data:`FAMILIES` row the config was read with (empty: built by hand).
        notes: the conventions and assumptions the spec carries, in words (how the config
            was read, what is left out); ``perfscope roofline`` prints them.
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
    layer_windows: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    router_bias: bool = False
    dense_layers: tuple[int, ...] = ()
    dense_intermediate_size: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mla_absorbed: bool = True
    mla_prefill_absorbed: bool = False
    quant_method: str = ""
    quant_group_size: int = 0
    quant_zero_bytes_per_param: float = 0.0
    quant_index_bytes_per_input: float = 0.0
    unquantized_bytes_per_param: float = 0.0
    weight_density: float = 1.0
    weight_index_bytes_per_nonzero: float = 0.0
    quant_lm_head: bool = False
    embed_dim: int = 0
    qk_norm_full: bool = False
    lm_head_bias: bool = False
    attention_sinks: bool = False
    ssm_inner_size: int = 0
    ssm_state_size: int = 0
    ssm_conv_kernel: int = 0
    ssm_time_step_rank: int = 0
    ssm_proj_bias: bool = False
    ssm_conv_bias: bool = False
    ssm_n_heads: int = 0
    ssm_head_dim: int = 0
    ssm_n_groups: int = 0
    ssm_chunk_size: int = 0
    family: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 < self.weight_density <= 1.0:
            raise UsageError(f"weight_density must be in (0, 1], got {self.weight_density}")
        # JSON round trips turn tuples into lists; keep the record hashable and comparable.
        for name in ("layer_windows", "dense_layers"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(int(v) for v in value))
        if not isinstance(self.notes, tuple):
            object.__setattr__(self, "notes", tuple(str(v) for v in self.notes))
        if self.layer_windows and len(self.layer_windows) != self.n_layers:
            raise UsageError(
                f"layer_windows has {len(self.layer_windows)} entries for {self.n_layers} layers"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict with exactly the field names."""
        d = asdict(self)
        d["layer_windows"] = list(self.layer_windows)
        d["dense_layers"] = list(self.dense_layers)
        d["notes"] = list(self.notes)
        return d

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

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3 style)."""
        return self.kv_lora_rank > 0

    @property
    def is_ssm(self) -> bool:
        """State-space (Mamba) blocks: a recurrent state replaces the KV cache."""
        return self.ssm_inner_size > 0

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the causal conv: ``I`` (Mamba), ``I + 2·G·N`` (Mamba2)."""
        return self.ssm_inner_size + 2 * self.ssm_n_groups * self.ssm_state_size

    @property
    def state_bytes_per_seq(self) -> float:
        """Recurrent-state bytes one sequence holds, constant in context (bytes).

        Per block the conv state ``C·K`` (:attr:`ssm_conv_dim` channels) and the SSM
        state ``I·N`` (Mamba2: ``H·P·N``, the same) (transformers keeps
        ``K`` conv inputs, ``conv_states`` ``[B, I, K]`` and ``recurrent_states``
        ``[B, I, N]``), at the cache dtype (:attr:`kv_bytes_per_element`); every decode
        step reads and rewrites all of it. 0 for a model without SSM blocks.
        """
        if not self.is_ssm:
            return 0.0
        per_layer = (
            self.ssm_conv_dim * self.ssm_conv_kernel + self.ssm_inner_size * self.ssm_state_size
        )
        return float(self.n_layers * per_layer) * self.kv_bytes_per_element

    @property
    def qk_nope_head_dim(self) -> int:
        """MLA per-head query/key part without rotary embedding."""
        return self.head_dim - self.qk_rope_head_dim

    @property
    def embedding_width(self) -> int:
        """Width of the embedding rows and of the lm_head input (:attr:`embed_dim`)."""
        return self.embed_dim or self.hidden_size

    @property
    def embedding_bytes_per_param(self) -> float:
        """Bytes per weight of embedding, lm_head and router matrices."""
        return self.unquantized_bytes_per_param or self.weight_bytes_per_param

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        """Attention kind of every block, in order."""
        spans = self.layer_windows or (self.sliding_window,) * self.n_layers
        out = []
        for s in spans:
            if s > 0:
                out.append(LayerAttention("sliding", int(s)))
            elif s < 0:
                out.append(LayerAttention("chunked", int(-s)))
            else:
                out.append(LayerAttention("full"))
        return tuple(out)

    def moe_layer_mask(self) -> tuple[bool, ...]:
        """For every block, whether its MLP is a MoE layer."""
        dense = set(self.dense_layers)
        return tuple(self.is_moe and i not in dense for i in range(self.n_layers))

    def with_dtypes(
        self,
        *,
        weight_dtype: str | None = None,
        kv_dtype: str | None = None,
        act_dtype: str | None = None,
        group_size: int | None = None,
        keep_embeddings_16bit: bool = False,
    ) -> ModelSpec:
        """A copy stored/computed in other dtypes.

        Changing ``weight_dtype`` alone also moves the compute dtype to
        :func:`compute_dtype_for` it and activations to that dtype's width. By default every
        matrix takes the new width (the simple "whole model in X" what-if). With
        ``keep_embeddings_16bit`` a quantised ``weight_dtype`` (``fp8``/``int8``/``int4``)
        quantises the block matrices only and embedding, lm_head and router stay 16-bit, as
        real GPTQ/AWQ/FP8 checkpoints keep them. A checkpoint's zero points and ``g_idx``
        are dropped either way: the new format is described by its bytes per weight alone.
        """
        changes: dict[str, Any] = {}
        if weight_dtype is not None:
            w = normalize_dtype(weight_dtype)
            changes["weight_dtype"] = w
            changes["weight_bytes_per_param"] = weight_bytes_per_param(w, group_size=group_size)
            quantised = w in ("fp8", "int8", "int4")
            changes["unquantized_bytes_per_param"] = (
                2.0 if quantised and keep_embeddings_16bit else 0.0
            )
            changes["quant_method"] = "override" if quantised else ""
            changes["quant_group_size"] = (group_size or 128) if w == "int4" else 0
            changes["quant_zero_bytes_per_param"] = 0.0
            changes["quant_index_bytes_per_input"] = 0.0
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
        cls,
        config: dict[str, Any] | str | Path,
        *,
        name: str | None = None,
        reader: str = "auto",
    ) -> ModelSpec:
        """Build from a Hugging Face ``config.json`` (a path, a folder holding one, or the dict).

        ``reader`` ``auto`` (the default) reads the config through the installed
        transformers' own config class when transformers is importable and knows the
        ``model_type`` (:func:`normalised_config`): every spelling (``num_experts`` /
        ``num_local_experts``) and every default is then the one the model code reads.
        ``json`` reads the raw JSON keys only (the fallback, also used when transformers is
        absent or rejects the config); ``transformers`` insists on the config class.

        The ``model_type`` selects a row of :data:`FAMILIES` (or, for an unknown type, the
        ``architectures`` class names do); the row says which config fields give biases,
        norms, per-layer attention, MoE and MLA. Weight and KV dtypes come from
        ``torch_dtype``/``dtype`` and ``quantization_config`` (GPTQ, AWQ, bitsandbytes, FP8,
        compressed-tensors).

        Raises:
            UsageError: the file is missing or unreadable, the family is unknown, or the
                config lacks the shape keys (the message names what is missing).
        """
        if reader not in ("auto", "json", "transformers"):
            raise UsageError(f"reader must be auto, json or transformers, got {reader!r}")
        cfg, default_name = _load_config(config)
        note = "config read from raw JSON keys"
        if reader != "json":
            normal, why = normalised_config(cfg)
            if normal is not None:
                cfg = normal
                note = f"config read through transformers {why}"
            elif reader == "transformers":
                raise UsageError(f"cannot read the config through transformers: {why}")
            else:
                note = f"config read from raw JSON keys ({why})"
        spec = _spec_from_config(cfg, name or default_name)
        return replace(spec, notes=(note, *spec.notes))

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


def apply_dtype_overrides(
    spec: ModelSpec, *, weight_dtype: str | None = None, kv_dtype: str | None = None
) -> ModelSpec:
    """``spec`` with user-chosen weight and KV dtypes (``perfscope roofline --weight-dtype
    --kv-dtype``, the dashboard explorer).

    A quantised weight dtype lays the model out as real checkpoints do: block matrices at
    the new width (int4 with group-128 fp16 scales), embedding, lm_head and router 16-bit.

    Raises:
        UsageError: unknown dtype.
    """
    if weight_dtype is None and kv_dtype is None:
        return spec
    return spec.with_dtypes(
        weight_dtype=weight_dtype, kv_dtype=kv_dtype, keep_embeddings_16bit=True
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


def normalised_config(cfg: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """``cfg`` as the installed transformers' config class reads it, or ``(None, why not)``.

    The config class (``AutoConfig.for_model(**cfg)``, what ``from_pretrained`` does with a
    local ``config.json``) applies the version's defaults and renames; its ``to_dict()`` is
    then overlaid with every ``attribute_map`` alias (``num_experts`` for Qwen3-MoE's saved
    ``num_local_experts``, ``hidden_size`` for GPT-2's ``n_embd``), so the readers below
    find a field under either spelling. Sub-configs (``text_config``, ``vision_config``) are
    normalised the same way. Returns the dict and a short description of the class used.
    """
    mt = cfg.get("model_type")
    if not mt:
        return None, "the config has no model_type"
    try:
        import transformers
    except ImportError:
        return None, "transformers is not installed"
    try:
        mapping = transformers.CONFIG_MAPPING
        if mt not in mapping:
            return None, f"transformers {transformers.__version__} does not know {mt!r}"
        obj = mapping[mt](**{k: v for k, v in cfg.items() if k != "model_type"})
    except Exception as exc:  # a config class rejecting its input: fall back to raw JSON
        return None, f"{type(exc).__name__} from the config class: {str(exc)[:120]}"
    out = _config_to_dict(obj, transformers.PretrainedConfig)
    for k, v in cfg.items():  # keys the class dropped (quantization_config of old writers)
        out.setdefault(k, v)
    return out, f"{transformers.__version__} ({type(obj).__name__})"


def _config_to_dict(obj: Any, base: type) -> dict[str, Any]:
    out: dict[str, Any] = dict(obj.to_dict())
    for alias in getattr(obj, "attribute_map", {}) or {}:
        try:
            out[alias] = getattr(obj, alias)
        except AttributeError:
            continue
    for k, v in list(vars(obj).items()):
        if isinstance(v, base):
            out[k] = _config_to_dict(v, base)
    return out


def _first_of(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    """The value of the first of ``keys`` (aliases of one config field) that ``cfg`` sets."""
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return default


def _require(cfg: Mapping[str, Any], *keys: str) -> int:
    v = _first_of(cfg, *keys)
    if v is None:
        raise UsageError(
            f"model config has no {' / '.join(keys)}: not a decoder config perfscope can read "
            f"(model_type {cfg.get('model_type')!r})"
        )
    return int(v)


# ---------------------------------------------------------------------- quantisation


@dataclass(frozen=True)
class QuantLayout:
    """How a checkpoint stores its weights, as read from ``quantization_config``.

    Attributes:
        method: ``quant_method`` (``gptq``, ``awq``, ``bitsandbytes``, ``fp8``,
            ``compressed-tensors``), empty for an unquantised checkpoint.
        weight_dtype: storage dtype of the quantised matrices.
        compute_dtype: matmul dtype (``bf16`` for weight-only W4A16/W8A16, ``fp8``/``int8``
            for W8A8).
        bits: bits per quantised weight.
        group_size: weights per scale (0 = per channel / per tensor: negligible scales).
        scale_bytes_per_param: scale bytes per weight (fp16 per group: ``2/group``).
        zero_bytes_per_param: zero-point bytes per weight (asymmetric: ``bits/8/group``).
        index_bytes_per_input: bytes per input feature of each quantised linear (GPTQ
            ``g_idx``, int32).
        unquantized_bytes_per_param: width of the matrices kept in 16 bits (embedding,
            lm_head, router), from ``torch_dtype``.
        lm_head: the lm_head is quantised too (GPTQ ``"lm_head": true``).
    """

    method: str
    weight_dtype: str
    compute_dtype: str
    bits: float
    group_size: int
    scale_bytes_per_param: float
    zero_bytes_per_param: float
    index_bytes_per_input: float
    unquantized_bytes_per_param: float
    lm_head: bool = False


def _bits_dtype(bits: float, kind: str = "int") -> str:
    if kind == "float":
        return "fp8" if bits == 8 else "fp4"
    return {8: "int8", 4: "int4", 3: "int3", 2: "int2"}.get(int(bits), "int4")


def quant_layout(cfg: dict[str, Any]) -> QuantLayout | None:
    """The storage layout of ``cfg["quantization_config"]``, or ``None`` when absent.

    Byte accounting per method (the checkpoint's tensors, as the loaders allocate them):

    - ``gptq``: packed ``bits`` per weight, fp16 ``scales`` and packed ``qzeros`` per group
      of ``group_size`` inputs (``-1`` = per channel), an int32 ``g_idx`` per input feature.
    - ``awq``: packed weights, fp16 scales and packed zeros (``zero_point``) per group.
    - ``bitsandbytes``: 4-bit NF4/FP4 in blocks of 64 with an fp32 absmax each (double
      quantisation: an 8-bit absmax plus one fp32 per 256 blocks); 8-bit LLM.int8 with an
      fp32 scale per output row (negligible, not counted).
    - ``fp8``: fp8 weights with an fp32 scale per ``weight_block_size`` block (or per tensor).
    - ``compressed-tensors``: the first config group's ``weights`` (``num_bits``, ``type``,
      ``strategy``, ``group_size``, ``symmetric``, ``actorder``); scales at the checkpoint's
      16-bit width.

    Embedding and lm_head stay 16-bit in every method (GPTQ/AWQ quantise only the blocks'
    linears, bitsandbytes skips ``lm_head``, FP8/compressed-tensors list it in ``ignore``),
    except a GPTQ config with ``"lm_head": true``, whose lm_head is quantised as the blocks.
    """
    q = cfg.get("quantization_config")
    if not isinstance(q, dict):
        return None
    raw = normalize_dtype(str(_first_of(cfg, "torch_dtype", "dtype", default="float16")))
    b16 = 4.0 if raw == "fp32" else 2.0
    method = str(q.get("quant_method", "")).lower().replace("_", "-")
    if method == "bitsandbytes" or q.get("load_in_4bit") or q.get("load_in_8bit"):
        if q.get("load_in_4bit") or q.get("_load_in_4bit"):
            double = bool(q.get("bnb_4bit_use_double_quant"))
            scale = 1.0 / 64 + 4.0 / (64 * 256) if double else 4.0 / 64
            return QuantLayout("bitsandbytes", "int4", "bf16", 4, 64, scale, 0.0, 0.0, b16)
        return QuantLayout("bitsandbytes", "int8", "int8", 8, 0, 0.0, 0.0, 0.0, b16)
    if method in ("gptq", "awq"):
        bits = float(q.get("bits") or q.get("w_bit") or 4)
        group = int(_first_of(q, "group_size", "q_group_size", default=128))
        group = max(group, 0)  # -1 = per output channel
        scale = 2.0 / group if group else 0.0
        has_zero = method == "gptq" or bool(q.get("zero_point", True))
        zero = bits / 8 / group if group and has_zero else 0.0
        index = 4.0 if method == "gptq" else 0.0
        return QuantLayout(
            method,
            _bits_dtype(bits),
            "bf16",
            bits,
            group,
            scale,
            zero,
            index,
            b16,
            lm_head=bool(q.get("lm_head", False)),
        )
    if method in ("fp8", "fbgemm-fp8", "finegrained-fp8"):
        block = q.get("weight_block_size")
        scale = 4.0 / (int(block[0]) * int(block[1])) if block else 0.0
        group = int(block[0]) * int(block[1]) if block else 0
        return QuantLayout("fp8", "fp8", "fp8", 8, group, scale, 0.0, 0.0, b16)
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        first: dict[str, Any] = next(iter(groups.values()), {}) if isinstance(groups, dict) else {}
        w = first.get("weights") or {}
        acts = first.get("input_activations")
        bits = float(w.get("num_bits", 8))
        kind = str(w.get("type", "int"))
        strategy = str(w.get("strategy", "channel"))
        group = int(w.get("group_size") or 0) if strategy == "group" else 0
        if strategy == "block" and w.get("block_structure"):
            bs = w["block_structure"]
            group = int(bs[0]) * int(bs[1])
        scale = b16 / group if group else 0.0
        zero = bits / 8 / group if group and not w.get("symmetric", True) else 0.0
        index = 4.0 if w.get("actorder") else 0.0
        wd = _bits_dtype(bits, kind)
        compute = wd if acts and int(acts.get("num_bits", 16)) <= 8 else "bf16"
        return QuantLayout("compressed-tensors", wd, compute, bits, group, scale, zero, index, b16)
    raise UsageError(
        f"quantization_config quant_method {method or '(none)'!r} is not one perfscope can "
        "count (gptq, awq, bitsandbytes, fp8, compressed-tensors): give --weight-dtype to "
        "describe the weights instead"
    )


def _dtypes_from_config(cfg: dict[str, Any]) -> dict[str, Any]:
    raw = _first_of(cfg, "torch_dtype", "dtype", default="bfloat16")
    w = normalize_dtype(str(raw))
    if w not in DTYPE_BYTES:
        w = "bf16"
    layout = quant_layout(cfg)
    act = compute_dtype_for(w) if layout is None else layout.compute_dtype
    act_bytes = max(DTYPE_BYTES[act], 2.0) if act != "fp32" else 4.0
    out: dict[str, Any] = {
        "weight_dtype": w,
        "weight_bytes_per_param": DTYPE_BYTES[w],
        "act_dtype": act,
        "act_bytes_per_element": act_bytes,
        "kv_dtype": act if act not in ("fp8", "int8") else "bf16",
        "kv_bytes_per_element": act_bytes if act not in ("fp8", "int8") else 2.0,
    }
    if layout is not None:
        out.update(
            weight_dtype=layout.weight_dtype,
            weight_bytes_per_param=layout.bits / 8 + layout.scale_bytes_per_param,
            quant_method=layout.method,
            quant_group_size=layout.group_size,
            quant_zero_bytes_per_param=layout.zero_bytes_per_param,
            quant_index_bytes_per_input=layout.index_bytes_per_input,
            unquantized_bytes_per_param=layout.unquantized_bytes_per_param,
            quant_lm_head=layout.lm_head,
        )
    return out


# ---------------------------------------------------------------------- families


@dataclass(frozen=True)
class Family:
    """How one HF decoder family's ``config.json`` maps onto :class:`ModelSpec` fields.

    Attributes:
        key: family name.
        model_types: ``model_type`` values of the family.
        architectures: HF class names that identify it when ``model_type`` is unknown.
        reader: ``llama`` (the shared HF key set) or ``gpt2``/``gpt_neox``/``opt`` (own keys).
        qkv_bias: Q/K/V biases: ``True``/``False``, or the config key that says so.
        o_bias: output-projection bias: ``True``/``False``, or the config key.
        mlp_bias: MLP biases: ``True``/``False``, or the config key.
        mlp_gated: three-matrix gated MLP.
        norm_bias: LayerNorm with bias.
        norms_per_layer: norm modules per block.
        qk_norm: q/k norms: ``True``/``False``, or the config key that says so.
        qk_norm_full: those norms span every head (:attr:`ModelSpec.qk_norm_full`).
        lm_head_bias: the lm_head has a bias: ``True``/``False`` or the config key.
        attention_sinks: learned per-head sink logits (gpt-oss).
        router_bias: the MoE router has a bias.
        tied_default: ``tie_word_embeddings`` when the config omits it.
        kv_default: ``num_key_value_heads`` when omitted (``None``: ``n_heads``).
        windows: which layers slide when the config lists no ``layer_types``: ``none``,
            ``all`` (every layer, Mistral), ``from_max`` (layers ``i >= max_window_layers``,
            Qwen2/3), ``alternate_below_max`` (odd-numbered ``i < max_window_layers``,
            Qwen2-MoE), ``pattern`` (all but every ``sliding_window_pattern``-th, Gemma-2/3).
        window_pattern: default ``sliding_window_pattern``.
        window_default: default ``sliding_window`` for ``pattern`` families.
        window_flag: config key that must be true for the window to apply (Qwen).
        moe: ``none``, ``mixtral`` (``num_local_experts``, ``intermediate_size`` per expert),
            ``llama4`` (``moe_layers``/``interleave_moe_layer_step``, a shared expert as wide
            as a routed one, dense blocks ``intermediate_size_mlp`` wide),
            ``qwen`` (``num_experts``, ``moe_intermediate_size``, optional shared expert,
            ``mlp_only_layers``/``decoder_sparse_step``) or ``deepseek`` (``n_routed_experts``,
            ``n_shared_experts``, ``first_k_dense_replace``).
        mla: multi-head latent attention keys (``kv_lora_rank``, ...).
    """

    key: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...] = ()
    reader: str = "llama"
    qkv_bias: bool | str = "attention_bias"
    o_bias: bool | str = "attention_bias"
    mlp_bias: bool | str = "mlp_bias"
    mlp_gated: bool = True
    norm_bias: bool = False
    norms_per_layer: int = 2
    qk_norm: bool | str = False
    qk_norm_full: bool = False
    lm_head_bias: bool | str = False
    attention_sinks: bool = False
    router_bias: bool = False
    tied_default: bool = False
    kv_default: int | None = None
    windows: str = "none"
    window_pattern: int = 0
    window_default: int = 0
    window_flag: str = ""
    moe: str = "none"
    mla: bool = False


#: Every family perfscope counts. A config whose ``model_type`` is none of these is read
#: only when its ``architectures`` name a family's class; otherwise it is refused.
FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",), ("LlamaForCausalLM",)),
    Family("granite", ("granite",), ("GraniteForCausalLM",)),
    Family("mistral", ("mistral",), ("MistralForCausalLM",), kv_default=8, windows="all"),
    Family(
        "mixtral",
        ("mixtral",),
        ("MixtralForCausalLM",),
        kv_default=8,
        windows="all",
        moe="mixtral",
    ),
    Family(
        "qwen2",
        ("qwen2",),
        ("Qwen2ForCausalLM",),
        qkv_bias=True,
        o_bias=False,
        windows="from_max",
        window_flag="use_sliding_window",
    ),
    Family(
        "qwen2_moe",
        ("qwen2_moe",),
        ("Qwen2MoeForCausalLM",),
        qkv_bias="qkv_bias",
        o_bias=False,
        windows="alternate_below_max",
        window_flag="use_sliding_window",
        moe="qwen",
    ),
    Family(
        "qwen3",
        ("qwen3",),
        ("Qwen3ForCausalLM",),
        qk_norm=True,
        windows="from_max",
        window_flag="use_sliding_window",
    ),
    Family(
        "qwen3_moe",
        ("qwen3_moe",),
        ("Qwen3MoeForCausalLM",),
        qk_norm=True,
        windows="from_max",
        window_flag="use_sliding_window",
        moe="qwen",
    ),
    Family("gemma", ("gemma",), ("GemmaForCausalLM",), tied_default=True),
    Family(
        "gemma2",
        ("gemma2",),
        ("Gemma2ForCausalLM",),
        tied_default=True,
        norms_per_layer=4,
        windows="pattern",
        window_pattern=2,
        window_default=4096,
    ),
    Family(
        "gemma3",
        ("gemma3_text",),
        ("Gemma3ForCausalLM",),
        tied_default=True,
        norms_per_layer=4,
        qk_norm=True,
        windows="pattern",
        window_pattern=6,
        window_default=4096,
    ),
    Family("phi3", ("phi3",), ("Phi3ForCausalLM",), windows="all"),
    Family(
        "starcoder2",
        ("starcoder2",),
        ("Starcoder2ForCausalLM",),
        qkv_bias="use_bias",
        o_bias="use_bias",
        mlp_bias="use_bias",
        mlp_gated=False,
        norm_bias=True,
        tied_default=True,
        windows="all",
    ),
    Family(
        "deepseek",
        ("deepseek_v2", "deepseek_v3", "kimi_k2"),
        ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
        moe="deepseek",
        mla=True,
    ),
    # Decoders the registry oracle proves Llama-shaped as far as FLOPs, bytes and
    # parameters go (their differences are RoPE variants, activations or scalings).
    Family("smollm3", ("smollm3",), ("SmolLM3ForCausalLM",)),
    Family("ministral", ("ministral",), ("MinistralForCausalLM",)),
    Family("helium", ("helium",), ("HeliumForCausalLM",)),
    Family(
        "seed_oss",
        ("seed_oss",),
        ("SeedOssForCausalLM",),
        o_bias="attention_out_bias",
    ),
    Family(
        "internlm3", ("internlm3",), ("InternLM3ForCausalLM",), qkv_bias="qkv_bias", o_bias="bias"
    ),
    Family(
        "ernie4_5",
        ("ernie4_5",),
        ("Ernie4_5ForCausalLM",),
        qkv_bias="use_bias",
        o_bias="use_bias",
        mlp_bias="use_bias",
    ),
    Family("glm", ("glm",), ("GlmForCausalLM",), o_bias=False),
    Family("glm4", ("glm4",), ("Glm4ForCausalLM",), o_bias=False, norms_per_layer=4),
    Family("hunyuan_v1_dense", ("hunyuan_v1_dense",), ("HunYuanDenseV1ForCausalLM",), qk_norm=True),
    Family("arcee", ("arcee",), ("ArceeForCausalLM",), mlp_gated=False),
    Family("exaone4", ("exaone4",), ("Exaone4ForCausalLM",), qk_norm=True),
    Family("olmo2", ("olmo2",), ("Olmo2ForCausalLM",), qk_norm=True, qk_norm_full=True),
    Family("olmo3", ("olmo3",), ("Olmo3ForCausalLM",), qk_norm=True, qk_norm_full=True),
    Family(
        "olmoe",
        ("olmoe",),
        ("OlmoeForCausalLM",),
        qk_norm=True,
        qk_norm_full=True,
        moe="mixtral",
    ),
    Family("granitemoe", ("granitemoe",), ("GraniteMoeForCausalLM",), moe="mixtral"),
    Family(
        "cohere",
        ("cohere",),
        ("CohereForCausalLM",),
        norms_per_layer=1,
        qk_norm="use_qk_norm",
        qk_norm_full=True,
        tied_default=True,
    ),
    Family(
        "cohere2",
        ("cohere2",),
        ("Cohere2ForCausalLM",),
        norms_per_layer=1,
        tied_default=True,
    ),
    Family(
        "stablelm",
        ("stablelm",),
        ("StableLmForCausalLM",),
        qkv_bias="use_qkv_bias",
        o_bias=False,
        mlp_bias=False,
        norm_bias=True,
        qk_norm="qk_layernorm",
        qk_norm_full=True,
    ),
    Family("iquestcoder", ("iquestcoder",), ()),
    Family("cwm", ("cwm",), ()),
    Family(
        "gpt_oss",
        ("gpt_oss",),
        ("GptOssForCausalLM",),
        mlp_bias=True,
        attention_sinks=True,
        router_bias=True,
        moe="mixtral",
    ),
    Family("gptj", ("gptj",), ("GPTJForCausalLM",), reader="gptj"),
    Family("codegen", ("codegen",), ("CodeGenForCausalLM",), reader="gptj"),
    Family("bloom", ("bloom",), ("BloomForCausalLM",), reader="bloom"),
    Family(
        "falcon",
        ("falcon", "refinedweb", "refinedwebmodel"),
        ("FalconForCausalLM", "RWForCausalLM"),
        reader="falcon",
    ),
    Family("dbrx", ("dbrx",), ("DbrxForCausalLM",), reader="dbrx", moe="mixtral"),
    Family(
        "phi",
        ("phi",),
        ("PhiForCausalLM",),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        mlp_gated=False,
        norm_bias=True,
        norms_per_layer=1,
        qk_norm="qk_layernorm",
        lm_head_bias=True,
    ),
    Family(
        "phimoe",
        ("phimoe",),
        ("PhimoeForCausalLM",),
        norm_bias=True,
        lm_head_bias="lm_head_bias",
        windows="all",
        moe="mixtral",
    ),
    Family(
        "granitemoeshared",
        ("granitemoeshared",),
        ("GraniteMoeSharedForCausalLM",),
        moe="mixtral",
    ),
    Family("nemotron", ("nemotron",), ("NemotronForCausalLM",), mlp_gated=False, norm_bias=True),
    Family(
        "flex_olmo",
        ("flex_olmo",),
        ("FlexOlmoForCausalLM",),
        qk_norm=True,
        qk_norm_full=True,
        moe="mixtral",
    ),
    Family("mamba", ("mamba",), ("MambaForCausalLM",), reader="mamba", tied_default=True),
    # Falcon-Mamba: Mamba plus weightless RMS norms on B, C and dt (no parameters, no
    # FLOPs FlopCounterMode counts).
    Family(
        "falcon_mamba",
        ("falcon_mamba",),
        ("FalconMambaForCausalLM",),
        reader="mamba",
        tied_default=True,
    ),
    Family("mamba2", ("mamba2",), ("Mamba2ForCausalLM",), reader="mamba"),
    Family("gpt2", ("gpt2",), ("GPT2LMHeadModel",), reader="gpt2"),
    Family("gpt_neox", ("gpt_neox",), ("GPTNeoXForCausalLM",), reader="gpt_neox"),
    Family("opt", ("opt",), ("OPTForCausalLM",), reader="opt"),
)

_SSM = (
    "a recurrent state replaces the KV cache: perfscope counts Mamba-style selective "
    "scans (mamba, falcon_mamba, mamba2) but not this family's recurrence and state yet"
)
_HYBRID = (
    "hybrid of attention and state-space/linear-attention layers: perfscope counts pure "
    "Mamba/Mamba2 models, not a per-layer mix of them with attention yet"
)
_ENC_DEC = (
    "encoder-decoder: a request pays an encoder pass over the source and cross-attention "
    "over it in every decoder step; perfscope models decoder-only serving"
)
_ENCODER = (
    "an encoder (bidirectional) model with an LM head, not a decoder a serving engine "
    "generates with"
)

#: Families perfscope knows about and deliberately does not count, with the reason.
REFUSED: dict[str, str] = {
    "llama4_text": (
        "Llama-4: transformers runs every routed expert on every token and caches chunked "
        "layers its own way, so the oracle cannot prove a serving count; not modelled yet"
    ),
    "llama4": "Llama-4 (multimodal wrapper): see llama4_text",
    "minimax": _HYBRID,
    "qwen3_next": _HYBRID,
    "qwen3_5": _HYBRID,
    "qwen3_5_text": _HYBRID,
    "qwen3_5_moe": _HYBRID,
    "qwen3_5_moe_text": _HYBRID,
    "kimi_linear": _HYBRID,
    "jamba": _HYBRID,
    "zamba": _HYBRID,
    "zamba2": _HYBRID,
    "bamba": _HYBRID,
    "falcon_h1": _HYBRID,
    "granitemoehybrid": _HYBRID,
    "nemotron_h": _HYBRID,
    "lfm2": _HYBRID,
    "lfm2_moe": _HYBRID,
    "olmo_hybrid": _HYBRID,
    "bailing_hybrid": _HYBRID,
    "recurrent_gemma": _HYBRID,
    "rwkv": _SSM,
    "xlstm": _SSM,
    **{
        mt: _ENC_DEC
        for mt in (
            "t5",
            "mt5",
            "umt5",
            "bart",
            "mbart",
            "marian",
            "pegasus",
            "blenderbot",
            "blenderbot-small",
            "plbart",
            "mvp",
            "bigbird_pegasus",
            "prophetnet",
            "whisper",
            "trocr",
        )
    },
    **{
        mt: _ENCODER
        for mt in (
            "bert",
            "bert-generation",
            "big_bird",
            "camembert",
            "data2vec-text",
            "electra",
            "ernie",
            "megatron-bert",
            "rembert",
            "roberta",
            "roberta-prelayernorm",
            "roc_bert",
            "roformer",
            "xlm",
            "xlm-roberta",
            "xlm-roberta-xl",
            "xmod",
            "xlnet",
            "reformer",
        )
    },
}

_BY_TYPE = {mt: f for f in FAMILIES for mt in f.model_types}
_BY_ARCH = {a: f for f in FAMILIES for a in f.architectures}
_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def family_for(cfg: dict[str, Any]) -> Family:
    """The :class:`Family` row of a config: by ``model_type``, else by ``architectures``.

    Raises:
        UsageError: neither names a known family; the message says what is missing.
    """
    mt = str(cfg.get("model_type", "")).lower()
    fam = _BY_TYPE.get(mt)
    if fam is not None:
        return fam
    archs = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
    for a in archs:
        if a in _BY_ARCH:
            return _BY_ARCH[a]
    if mt in REFUSED:
        raise UsageError(
            f"model_type {mt!r} is not counted: {REFUSED[mt]}. Describe a decoder of the "
            "same shape with --layers/--hidden-size/--heads/--intermediate-size/--vocab-size"
        )
    missing = [k for k in _SHAPE_KEYS if k not in cfg]
    known = ", ".join(sorted(_BY_TYPE))
    why = f"model_type {mt!r}" if mt else "a config without model_type"
    arch_text = (
        f"its architectures {archs} name none either" if archs else "it lists no architectures"
    )
    more = f"; the config also lacks {', '.join(missing)}" if missing else ""
    raise UsageError(
        f"{why} is not a decoder family perfscope can count (known: {known}) and {arch_text}"
        f'{more}. If it is a Llama-shaped decoder, set "model_type": "llama" in a copy '
        "of config.json, or describe it with --layers/--hidden-size/--heads/"
        "--intermediate-size/--vocab-size"
    )


def _flag(cfg: dict[str, Any], rule: bool | str, default: bool = False) -> bool:
    if isinstance(rule, bool):
        return rule
    return bool(_first_of(cfg, rule, default=default))


_LAYER_TYPE_KINDS = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
}


def _layer_windows(cfg: dict[str, Any], fam: Family, n_layers: int) -> tuple[int, ...]:
    """Per-layer span (0 full, w sliding, -c chunked) or ``()`` when every layer is full."""
    window = int(_first_of(cfg, "sliding_window", default=fam.window_default) or 0)
    if fam.window_flag and not cfg.get(fam.window_flag):
        window = 0
    chunk = int(_first_of(cfg, "attention_chunk_size", default=0) or 0)
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n_layers:
            raise UsageError(f"config layer_types has {len(types)} entries for {n_layers} layers")
        out = []
        for t in types:
            kind = _LAYER_TYPE_KINDS.get(str(t))
            if kind is None:
                raise UsageError(
                    f"config layer_types has {t!r}: perfscope counts only "
                    f"{', '.join(_LAYER_TYPE_KINDS)}"
                )
            if kind == "sliding" and window <= 0:
                window = int(_first_of(cfg, "sliding_window", default=fam.window_default) or 0)
                if window <= 0:
                    raise UsageError(
                        "config layer_types lists sliding_attention but no sliding_window"
                    )
            if kind == "chunked" and chunk <= 0:
                raise UsageError(
                    "config layer_types lists chunked_attention but no attention_chunk_size"
                )
            out.append(window if kind == "sliding" else (-chunk if kind == "chunked" else 0))
        return tuple(out) if any(out) else ()
    if window <= 0 or fam.windows == "none":
        return ()
    max_w = int(_first_of(cfg, "max_window_layers", default=28))
    if fam.windows == "all":
        slides = [True] * n_layers
    elif fam.windows == "from_max":
        slides = [i >= max_w for i in range(n_layers)]
    elif fam.windows == "alternate_below_max":
        slides = [bool((i + 1) % 2) and i < max_w for i in range(n_layers)]
    else:  # pattern
        pattern = int(
            _first_of(
                cfg, "sliding_window_pattern", "_sliding_window_pattern", default=fam.window_pattern
            )
        )
        slides = [bool((i + 1) % pattern) for i in range(n_layers)]
    spans = tuple(window if s else 0 for s in slides)
    return spans if any(spans) else ()


def _moe_fields(cfg: dict[str, Any], fam: Family, n_layers: int) -> dict[str, Any]:
    if fam.moe == "none":
        return {}
    if fam.moe == "mixtral":
        e = int(_first_of(cfg, "num_local_experts", "num_experts", default=8))
        return {
            "n_experts": e,
            "n_active_experts": int(_first_of(cfg, "num_experts_per_tok", default=2)),
            # GraniteMoeShared: an ungated shared MLP beside the experts
            "shared_expert_intermediate_size": int(
                _first_of(cfg, "shared_intermediate_size", default=0) or 0
            ),
        }
    if fam.moe == "llama4":
        e = int(_first_of(cfg, "num_local_experts", default=16))
        step = int(_first_of(cfg, "interleave_moe_layer_step", default=1))
        moe_layers = cfg.get("moe_layers")
        if moe_layers is None:
            moe_layers = list(range(step - 1, n_layers, step))
        moe_set = {int(i) for i in moe_layers}
        f = _require(cfg, "intermediate_size")
        return {
            "n_experts": e,
            "n_active_experts": int(_first_of(cfg, "num_experts_per_tok", default=1)),
            "intermediate_size": f,
            "shared_expert_intermediate_size": f,
            "dense_layers": tuple(i for i in range(n_layers) if i not in moe_set),
            "dense_intermediate_size": int(_first_of(cfg, "intermediate_size_mlp", default=0)),
        }
    if fam.moe == "qwen":
        # transformers 5 saves Qwen3-MoE's expert count as num_local_experts.
        e = int(_first_of(cfg, "num_experts", "num_local_experts", default=0))
        if not e:
            return {}
        step = int(_first_of(cfg, "decoder_sparse_step", default=1))
        only = {int(i) for i in cfg.get("mlp_only_layers") or []}
        dense = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
        shared = int(_first_of(cfg, "shared_expert_intermediate_size", default=0))
        return {
            "n_experts": e,
            "n_active_experts": int(_first_of(cfg, "num_experts_per_tok", default=2)),
            "intermediate_size": _require(cfg, "moe_intermediate_size"),
            "shared_expert_intermediate_size": shared,
            "shared_expert_gate": shared > 0,
            "dense_layers": dense,
            "dense_intermediate_size": int(_first_of(cfg, "intermediate_size", default=0)),
        }
    e = int(_first_of(cfg, "n_routed_experts", default=0))
    if not e:
        return {}
    moe_f = _require(cfg, "moe_intermediate_size")
    first = int(_first_of(cfg, "first_k_dense_replace", default=0))
    return {
        "n_experts": e,
        "n_active_experts": int(_first_of(cfg, "num_experts_per_tok", default=2)),
        "intermediate_size": moe_f,
        "shared_expert_intermediate_size": moe_f
        * int(_first_of(cfg, "n_shared_experts", default=0)),
        "dense_layers": tuple(range(min(first, n_layers))),
        "dense_intermediate_size": _require(cfg, "intermediate_size"),
    }


def _spec_from_config(cfg: dict[str, Any], name: str) -> ModelSpec:
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
    f: dict[str, Any] = {"name": name, "family": fam.key, **_dtypes_from_config(cfg)}
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
    if fam.reader == "mamba":
        return _mamba(cfg, fam, f)

    d = _require(cfg, "hidden_size")
    h = _require(cfg, "num_attention_heads")
    n_layers = _require(cfg, "num_hidden_layers")
    kv = int(_first_of(cfg, "num_key_value_heads", default=fam.kv_default or h))
    head_dim = int(_first_of(cfg, "head_dim", default=d // h))
    f.update(
        n_layers=n_layers,
        hidden_size=d,
        n_heads=h,
        n_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=_require(cfg, "intermediate_size"),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=fam.mlp_gated,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=fam.tied_default)),
        qkv_bias=_flag(cfg, fam.qkv_bias, default=fam.qkv_bias == "qkv_bias"),
        o_bias=_flag(cfg, fam.o_bias),
        mlp_bias=_flag(cfg, fam.mlp_bias),
        norm_bias=fam.norm_bias,
        norms_per_layer=fam.norms_per_layer,
        qk_norm=_flag(cfg, fam.qk_norm),
        qk_norm_full=fam.qk_norm_full,
        lm_head_bias=_flag(cfg, fam.lm_head_bias),
        attention_sinks=fam.attention_sinks,
        router_bias=fam.router_bias,
        max_position_embeddings=int(_first_of(cfg, "max_position_embeddings", default=0)),
        layer_windows=_layer_windows(cfg, fam, n_layers),
    )
    f.update(_moe_fields(cfg, fam, n_layers))
    if fam.mla:
        rope = _require(cfg, "qk_rope_head_dim")
        nope = _require(cfg, "qk_nope_head_dim")
        f.update(
            n_kv_heads=h,
            head_dim=rope + nope,
            kv_lora_rank=_require(cfg, "kv_lora_rank"),
            q_lora_rank=int(_first_of(cfg, "q_lora_rank", default=0) or 0),
            qk_rope_head_dim=rope,
            v_head_dim=_require(cfg, "v_head_dim"),
        )
    # A uniform window is stored the old way, so older readers see it too.
    windows = f["layer_windows"]
    if windows and len(set(windows)) == 1 and windows[0] > 0:
        f.update(sliding_window=windows[0], layer_windows=())
    return ModelSpec(**f)


_NOT_TOWERS = ("text_config", "quantization_config", "rope_scaling", "generation_config")


def _tower_params(cfg: dict[str, Any], towers: list[str]) -> tuple[int, str]:
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
        conf = transformers.CONFIG_MAPPING[cfg["model_type"]](
            **{k: v for k, v in cfg.items() if k != "model_type"}
        )
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


def _mamba(cfg: Mapping[str, Any], fam: Family, f: dict[str, Any]) -> ModelSpec:
    """Mamba (v1), Falcon-Mamba and Mamba2: every block a pre-norm selective-SSM mixer, no
    attention, no MLP. The inner width is what the model code reads: Mamba and
    Falcon-Mamba the config's ``intermediate_size`` (their config classes default it to
    ``expand · hidden_size`` but keep one given), Mamba2 ``expand · hidden_size`` always;
    ``time_step_rank`` ``auto`` is ``ceil(d / 16)``."""
    d = _require(cfg, "hidden_size", "d_model")
    expand = float(_first_of(cfg, "expand", default=2))
    inner = int(expand * d)
    if fam.key != "mamba2":
        inner = int(_first_of(cfg, "intermediate_size", default=inner) or inner)
    rank = _first_of(cfg, "time_step_rank", "dt_rank", default="auto")
    f.update(
        n_layers=_require(cfg, "num_hidden_layers", "n_layer"),
        hidden_size=d,
        n_heads=0,
        n_kv_heads=0,
        head_dim=0,
        intermediate_size=0,
        vocab_size=int(_first_of(cfg, "vocab_size", default=50280)),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=fam.tied_default)),
        norms_per_layer=1,
        max_position_embeddings=0,
        ssm_inner_size=inner,
        ssm_state_size=int(_first_of(cfg, "state_size", "d_state", default=16)),
        ssm_conv_kernel=int(_first_of(cfg, "conv_kernel", "d_conv", default=4)),
        ssm_time_step_rank=math.ceil(d / 16) if rank == "auto" else int(rank),
        ssm_proj_bias=bool(_first_of(cfg, "use_bias", default=False)),
        ssm_conv_bias=bool(_first_of(cfg, "use_conv_bias", default=True)),
    )
    if fam.key == "mamba2":
        heads = int(_first_of(cfg, "num_heads", default=128))
        head_dim = int(_first_of(cfg, "head_dim", default=64))
        if heads * head_dim != f["ssm_inner_size"]:
            raise UsageError(
                f"mamba2 config: num_heads · head_dim ({heads} · {head_dim}) must equal "
                f"expand · hidden_size ({f['ssm_inner_size']})"
            )
        f.update(
            ssm_time_step_rank=0,
            ssm_n_heads=heads,
            ssm_head_dim=head_dim,
            ssm_n_groups=int(_first_of(cfg, "n_groups", default=1)),
            ssm_chunk_size=int(_first_of(cfg, "chunk_size", default=256)),
        )
    return ModelSpec(**f)


def _gpt2(cfg: dict[str, Any], f: dict[str, Any]) -> ModelSpec:
    d = _require(cfg, "n_embd", "hidden_size")
    h = _require(cfg, "n_head", "num_attention_heads")
    n_pos = int(_first_of(cfg, "n_positions", "max_position_embeddings", default=1024))
    f.update(
        n_layers=_require(cfg, "n_layer", "num_hidden_layers"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=h,
        head_dim=d // h,
        intermediate_size=int(_first_of(cfg, "n_inner", default=4 * d)),
        vocab_size=int(_first_of(cfg, "vocab_size", default=50257)),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=True)),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        norm_bias=True,
        pos_embeddings=n_pos,
        max_position_embeddings=n_pos,
    )
    return ModelSpec(**f)


def _bloom(cfg: dict[str, Any], f: dict[str, Any]) -> ModelSpec:
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
    return ModelSpec(**f)


def _falcon(cfg: Mapping[str, Any], f: dict[str, Any]) -> ModelSpec:
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
        kv = int(_first_of(cfg, "num_kv_heads", "n_head_kv", default=h) or h)
    else:
        kv = 1 if multi_query else h
    ln = _first_of(cfg, "num_ln_in_parallel_attn", default=None)
    norms = 2 if not parallel else int(ln if ln is not None else (2 if new_arch else 1))
    bias = bool(_first_of(cfg, "bias", default=False))
    notes = list(f.pop("notes", ()))
    if new_arch and kv != h:
        notes.append(
            f"Falcon new decoder architecture: {kv} K/V heads cached, as serving engines do "
            f"(transformers broadcasts them to all {h} heads before its cache)"
        )
    f.update(
        n_layers=_require(cfg, "num_hidden_layers", "n_layer"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=kv,
        head_dim=d // h,
        intermediate_size=int(_first_of(cfg, "ffn_hidden_size", default=4 * d) or 4 * d),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=True)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        norm_bias=True,
        norms_per_layer=norms,
        max_position_embeddings=int(_first_of(cfg, "max_position_embeddings", default=2048)),
        notes=tuple(notes),
    )
    return ModelSpec(**f)


def _dbrx(cfg: Mapping[str, Any], f: dict[str, Any]) -> ModelSpec:
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
        n_kv_heads=int(_first_of(attn, "kv_n_heads", default=1)),
        head_dim=d // h,
        intermediate_size=int(_first_of(ffn, "ffn_hidden_size", default=3584)),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=True,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=False)),
        n_experts=int(_first_of(ffn, "moe_num_experts", default=4)),
        n_active_experts=int(_first_of(ffn, "moe_top_k", default=1)),
        max_position_embeddings=int(_first_of(cfg, "max_seq_len", default=2048)),
    )
    return ModelSpec(**f)


def _gptj(cfg: dict[str, Any], f: dict[str, Any]) -> ModelSpec:
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
        intermediate_size=int(_first_of(cfg, "n_inner", default=4 * d) or 4 * d),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=False)),
        mlp_bias=True,
        norm_bias=True,
        norms_per_layer=1,
        lm_head_bias=True,
        max_position_embeddings=int(_first_of(cfg, "n_positions", default=2048)),
    )
    return ModelSpec(**f)


def _gpt_neox(cfg: dict[str, Any], f: dict[str, Any]) -> ModelSpec:
    d = _require(cfg, "hidden_size")
    h = _require(cfg, "num_attention_heads")
    bias = bool(_first_of(cfg, "attention_bias", default=True))
    f.update(
        n_layers=_require(cfg, "num_hidden_layers"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=h,
        head_dim=d // h,
        intermediate_size=int(_first_of(cfg, "intermediate_size", default=4 * d)),
        vocab_size=_require(cfg, "vocab_size"),
        mlp_gated=False,
        tied_embeddings=bool(_first_of(cfg, "tie_word_embeddings", default=False)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=True,
        norm_bias=True,
        max_position_embeddings=int(_first_of(cfg, "max_position_embeddings", default=2048)),
    )
    return ModelSpec(**f)


def _opt(cfg: dict[str, Any], f: dict[str, Any]) -> ModelSpec:
    d = _require(cfg, "hidden_size")
    h = _require(cfg, "num_attention_heads")
    bias = bool(_first_of(cfg, "enable_bias", default=True))
    affine = bool(_first_of(cfg, "layer_norm_elementwise_affine", default=True))
    proj = int(_first_of(cfg, "word_embed_proj_dim", default=d))
    v = _require(cfg, "vocab_size")
    final = bool(_first_of(cfg, "do_layer_norm_before", default=True)) and not bool(
        cfg.get("_remove_final_layer_norm", False)
    )
    max_pos = int(_first_of(cfg, "max_position_embeddings", default=2048))
    extra = 0
    if not affine:
        extra -= 2 * (2 * d) * _require(cfg, "num_hidden_layers") + (2 * d if final else 0)
    f.update(
        n_layers=_require(cfg, "num_hidden_layers"),
        hidden_size=d,
        n_heads=h,
        n_kv_heads=h,
        head_dim=d // h,
        intermediate_size=int(_first_of(cfg, "ffn_dim", default=4 * d)),
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
    return ModelSpec(**f)


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
    "mistral-7b-v0.1": {
        # v0.1 attends over a 4096-token sliding window (v0.2/v0.3 dropped it).
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
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
    "gemma-2-9b": {
        "model_type": "gemma2",
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "vocab_size": 256000,
        "sliding_window": 4096,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    },
    "qwen1.5-moe-a2.7b": {
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "decoder_sparse_step": 1,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 151936,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "deepseek-v3": {
        # The release ships FP8 block-quantised weights; the preset is the bf16 view
        # (--weight-dtype fp8 for the release's storage).
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "n_group": 8,
        "topk_group": 4,
        "vocab_size": 129280,
        "max_position_embeddings": 163840,
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
    "mistral-7b-v0.3": "mistral-7b",
    "mistral-7b-v0.2": "mistral-7b",
    "qwen2.5-7b-instruct": "qwen2.5-7b",
    "gemma2-9b": "gemma-2-9b",
    "qwen1.5-moe": "qwen1.5-moe-a2.7b",
    "deepseek-v3-base": "deepseek-v3",
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
