"""The :class:`ModelSpec` record: shape and storage facts of a decoder, and its derived views."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from perfscope.analysis.modelspec.dtypes import (
    compute_dtype_for,
    dtype_bytes,
    weight_bytes_per_param,
)
from perfscope.errors import UsageError
from perfscope.hwdb.spec import normalize_dtype
from perfscope.jsontypes import JsonObject

#: Attention kinds a layer can have (see :meth:`ModelSpec.layer_attention`).
ATTENTION_KINDS = ("full", "sliding", "chunked")

#: Sequence mixers a block can have (see :meth:`ModelSpec.mixers`).
MIXERS = ("attention", "ssm", "conv", "linear", "lightning", "attention+ssm", "none")


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


_FieldValue = bool | int | float | str | tuple[int, ...] | tuple[str, ...]


def _field_value(name: str, kind: str, value: object) -> _FieldValue:
    """``value`` (JSON) as a :class:`ModelSpec` field of type ``kind`` (its annotation)."""
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and isinstance(value, int):
        return value
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "tuple[int, ...]" and isinstance(value, list | tuple):
        ints = [_field_value(name, "int", v) for v in value]
        return tuple(v for v in ints if isinstance(v, int))
    if kind == "tuple[str, ...]" and isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    raise UsageError(f"model field {name} is {value!r}, expected {kind}")


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
        mlp_bias: the MLP matrices (every expert's too, and the shared expert's) have
            biases.
        expert_bias: with :attr:`mlp_bias`, the routed experts have biases too (False:
            NemotronH, whose experts are bias-free beside a biased shared expert).
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
        ssm_bcdt_norms: the Mamba (v1) mixer normalises dt, B and C with weighted RMS norms
            (Jamba: ``R + 2·N`` weights per mixer, no FLOPs counted).
        ssm_gated_norm: a Mamba2 mixer ends in a gated RMS norm of ``I`` weights (True for
            every Mamba2 in transformers; a spec written before this field reads it as set).
        short_conv_kernel: LFM2 short-convolution blocks (``conv`` mixers): the depthwise
            conv width ``L`` (``conv_L_cache``); their ``in_proj`` is ``d → 3d`` (B, C, x),
            ``out_proj`` ``d → d``, and they cache ``d·L`` inputs per sequence.
        short_conv_bias: those projections and the conv have biases (``conv_bias``).
        attn_output_gate: the attention's query projection also produces a per-head output
            gate (Qwen3-Next: ``q_proj`` is ``d → 2·H·h_d``; the gate is elementwise).
        attn_gate_bias: with :attr:`qkv_bias`, that gate has a bias too (a fused q/gate
            projection; AFMoE's separate ``gate_proj`` has none).
        linear_key_heads: gated DeltaNet blocks (``linear`` mixers, Qwen3-Next): key/query
            heads ``h_k`` (``linear_num_key_heads``); 0 = none.
        linear_value_heads: their value heads ``h_v`` (each key head serves ``h_v/h_k``).
        linear_key_head_dim: key/query head width ``d_k``.
        linear_value_head_dim: value head width ``d_v``.
        linear_conv_kernel: the depthwise conv width over q, k and v (``linear_conv_kernel_dim``).
        linear_kda: those blocks are Kimi Delta Attention (Kimi-Linear): a decay per channel
            from a low-rank forget gate (``d → d_k → h·d_k``), a low-rank output gate, q, k,
            v and o projections and no fused z; ``h_k = h_v``, ``d_k = d_v``.
        linear_gate_rank: the rank of a KDA block's forget and output gates (Kimi-Linear:
            ``d_k``, ``d → r → h·d_k``); 0 = full rank ``d → h·d_k`` (Bailing-hybrid).
        linear_chunk_size: chunk length of the chunked delta rule transformers' torch path
            runs multi-token steps in (64), padding each step to whole chunks.
        attention_input_width: width of the attention's input when it is not ``d`` (Zamba2's
            shared blocks attend over the block input concatenated with the embeddings,
            ``2d``); 0 = :attr:`hidden_size`.
        attention_extra_params: matmul weights each attention block adds beyond q, k, v, o
            and its MLP, run per token (Zamba2: that use's LoRA adapters on q, k, v and the
            MLP's gate_up, and the hybrid layer's ``d × d`` linear); stored per block.
        lightning_block_size: MiniMax lightning-attention blocks (``lightning`` mixers): the
            block length of their prefill (``block_size``); their ``H`` heads of width
            ``h_d`` (the attention's) keep an ``h_d × h_d`` state each; 0 = none.
        layer_mixers: the sequence mixer of every block (:data:`MIXERS`): ``attention``,
            ``ssm`` (a Mamba/Mamba2 mixer from the ``ssm_*`` fields), ``conv`` (LFM2 short
            conv), ``linear`` (gated DeltaNet from the ``linear_*`` fields), ``lightning``
            (MiniMax's linear attention),
            ``attention+ssm`` (both side by side on the same input, Falcon-H1) or ``none``
            (an MLP-only block). Empty: every block attends (every block is an SSM
            mixer for a pure state-space model) — a hybrid lists its mix here.
        mlp_free_layers: indices of blocks that have no MLP (NemotronH's mixer-only blocks);
            a pure state-space model has none in any block.
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
    expert_bias: bool = True
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
    ssm_bcdt_norms: bool = False
    ssm_gated_norm: bool = True
    short_conv_kernel: int = 0
    short_conv_bias: bool = False
    attn_output_gate: bool = False
    attn_gate_bias: bool = True
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    linear_chunk_size: int = 64
    linear_kda: bool = False
    linear_gate_rank: int = 0
    lightning_block_size: int = 0
    attention_input_width: int = 0
    attention_extra_params: int = 0
    layer_mixers: tuple[str, ...] = ()
    mlp_free_layers: tuple[int, ...] = ()
    family: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 < self.weight_density <= 1.0:
            raise UsageError(f"weight_density must be in (0, 1], got {self.weight_density}")
        # JSON round trips turn tuples into lists; keep the record hashable and comparable.
        for name in ("layer_windows", "dense_layers", "mlp_free_layers"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(int(v) for v in value))
        if not isinstance(self.notes, tuple):
            object.__setattr__(self, "notes", tuple(str(v) for v in self.notes))
        if not isinstance(self.layer_mixers, tuple):
            object.__setattr__(self, "layer_mixers", tuple(str(v) for v in self.layer_mixers))
        if self.layer_mixers and len(self.layer_mixers) != self.n_layers:
            raise UsageError(
                f"layer_mixers has {len(self.layer_mixers)} entries for {self.n_layers} layers"
            )
        unknown = sorted(set(self.layer_mixers) - set(MIXERS))
        if unknown:
            raise UsageError(f"layer_mixers has {', '.join(unknown)}: use {', '.join(MIXERS)}")
        if self.layer_windows and len(self.layer_windows) != self.n_layers:
            raise UsageError(
                f"layer_windows has {len(self.layer_windows)} entries for {self.n_layers} layers"
            )

    def to_dict(self) -> JsonObject:
        """Plain JSON-ready dict with exactly the field names."""
        d = asdict(self)
        d["layer_windows"] = list(self.layer_windows)
        d["dense_layers"] = list(self.dense_layers)
        d["layer_mixers"] = list(self.layer_mixers)
        d["mlp_free_layers"] = list(self.mlp_free_layers)
        d["notes"] = list(self.notes)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ModelSpec:
        """Build from :meth:`to_dict` output; unknown keys are ignored (newer writers).

        Each known key's value is narrowed to its field's type (an integral float to an
        ``int``, an ``int`` to a ``float``, a JSON array to a tuple).

        Raises:
            UsageError: a known key holds a value of another JSON type (named in the message).
        """
        kinds = {f.name: str(f.type) for f in fields(cls)}
        values = {k: _field_value(k, kinds[k], v) for k, v in data.items() if k in kinds}
        # every value now has its field's type (checked above, per field, at run time)
        build: Callable[..., ModelSpec] = cls
        return build(**values)

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
        step reads and rewrites all of it. A hybrid counts its SSM blocks only, each
        LFM2 short-conv block its ``d·L`` cached conv inputs, and each gated DeltaNet block
        its conv state (:attr:`linear_conv_dim` × ``K``) and its ``h_v·d_k·d_v`` state. 0
        for a model without recurrent blocks.
        """
        ssm_layers = sum(self.ssm_layer_mask()) if self.is_ssm else 0
        per_layer = (
            self.ssm_conv_dim * self.ssm_conv_kernel + self.ssm_inner_size * self.ssm_state_size
        )
        mixers = self.mixers()
        conv = mixers.count("conv") * self.hidden_size * self.short_conv_kernel
        linear = mixers.count("linear") * (
            self.linear_conv_dim * self.linear_conv_kernel
            + self.linear_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        )
        lightning = mixers.count("lightning") * self.n_heads * self.head_dim * self.head_dim
        return float(ssm_layers * per_layer + conv + linear + lightning) * (
            self.kv_bytes_per_element
        )

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a gated DeltaNet block's conv: q, k and v, ``2·h_k·d_k + h_v·d_v``."""
        return (
            2 * self.linear_key_heads * self.linear_key_head_dim
            + self.linear_value_heads * self.linear_value_head_dim
        )

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
        mlp = self.mlp_layer_mask()
        return tuple(self.is_moe and i not in dense and mlp[i] for i in range(self.n_layers))

    def mixers(self) -> tuple[str, ...]:
        """The sequence mixer of every block, in order (:attr:`layer_mixers`, or the
        model's one kind: ``ssm`` for a pure state-space model, else ``attention``)."""
        if self.layer_mixers:
            return self.layer_mixers
        return ("ssm" if self.is_ssm else "attention",) * self.n_layers

    def attention_layer_mask(self) -> tuple[bool, ...]:
        """For every block, whether it attends (and so holds a KV cache)."""
        return tuple("attention" in m.split("+") for m in self.mixers())

    def ssm_layer_mask(self) -> tuple[bool, ...]:
        """For every block, whether it has a Mamba/Mamba2 mixer (and so a recurrent state)."""
        return tuple("ssm" in m.split("+") for m in self.mixers())

    def mlp_layer_mask(self) -> tuple[bool, ...]:
        """For every block, whether it has an MLP (dense or MoE). A pure state-space model
        has none; a hybrid's MLP-free blocks are :attr:`mlp_free_layers`."""
        if not self.layer_mixers and self.is_ssm:
            return (False,) * self.n_layers
        free = set(self.mlp_free_layers)
        return tuple(i not in free for i in range(self.n_layers))

    @property
    def n_attention_layers(self) -> int:
        """Blocks that attend (all of them but a hybrid's other mixers)."""
        return sum(self.attention_layer_mask())

    @property
    def is_hybrid(self) -> bool:
        """Blocks mix sequences in more than one way (attention beside Mamba or conv)."""
        return len(set(self.mixers())) > 1

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
        out = self
        if weight_dtype is not None:
            w = normalize_dtype(weight_dtype)
            quantised = w in ("fp8", "int8", "int4")
            out = replace(
                out,
                weight_dtype=w,
                weight_bytes_per_param=weight_bytes_per_param(w, group_size=group_size),
                unquantized_bytes_per_param=2.0 if quantised and keep_embeddings_16bit else 0.0,
                quant_method="override" if quantised else "",
                quant_group_size=(group_size or 128) if w == "int4" else 0,
                quant_zero_bytes_per_param=0.0,
                quant_index_bytes_per_input=0.0,
            )
            if act_dtype is None:
                act_dtype = compute_dtype_for(w)
        if act_dtype is not None:
            a = normalize_dtype(act_dtype)
            # fp8/int8 matmuls still keep activations between kernels in 16 bits.
            width = 4.0 if a == "fp32" else max(dtype_bytes(a), 2.0)
            out = replace(out, act_dtype=a, act_bytes_per_element=width)
        if kv_dtype is not None:
            k = normalize_dtype(kv_dtype)
            out = replace(out, kv_dtype=k, kv_bytes_per_element=dtype_bytes(k))
        return out

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_hf_config(
        cls,
        config: JsonObject | str | Path,
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
        # The readers build ModelSpec records, so they are imported when first used.
        from perfscope.analysis.modelspec.hf_config import _load_config, normalised_config
        from perfscope.analysis.modelspec.readers import _spec_from_config

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
        from perfscope.analysis.modelspec.presets import PRESETS, _preset_key, preset_names
        from perfscope.analysis.modelspec.readers import _spec_from_config

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
        from perfscope.analysis.modelspec.presets import _preset_key, preset_names

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
