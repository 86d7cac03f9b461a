"""Family rules: which config keys give each decoder family's biases, norms, windows and
MoE layout, and the families perfscope refuses with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from perfscope.analysis.modelspec.hf_config import _as_int, _first_of, _int_of, _ints, _require
from perfscope.errors import UsageError


@dataclass(frozen=True)
class Family:
    """How one HF decoder family's ``config.json`` maps onto :class:`ModelSpec` fields.

    Attributes:
        key: family name.
        model_types: ``model_type`` values of the family.
        architectures: HF class names that identify it when ``model_type`` is unknown.
        reader: ``llama`` (the shared HF key set), ``hybrid`` (a per-block mix of mixers,
            :mod:`.hybrid`) or ``gpt2``/``gpt_neox``/``opt``/... (keys of their own).
        qkv_bias: Q/K/V biases: ``True``/``False``, or the config key that says so.
        o_bias: output-projection bias: ``True``/``False``, or the config key.
        mlp_bias: MLP biases: ``True``/``False``, or the config key.
        mlp_gated: three-matrix gated MLP.
        norm_bias: LayerNorm with bias.
        norms_per_layer: norm modules per block (with weights; OLMo-1's have none: 0).
        final_norm: the final norm has weights (OLMo-1's has none).
        post_norm_flag: config key that, when true, adds a norm after each sublayer (two
            more per block: HyperCLOVA X ``use_post_norm``).
        attn_output_gate: the query projection also yields an output gate per channel
            (:attr:`ModelSpec.attn_output_gate`).
        attn_gate_bias: that gate has the query projection's bias (fused), or none.
        act_params: ``(hidden_act, n)``: an MLP with that activation holds ``n`` learned
            scalars (Apertus' xIELU: ``alpha_p``, ``alpha_n``).
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
    final_norm: bool = True
    post_norm_flag: str = ""
    act_params: tuple[str, int] = ("", 0)
    attn_output_gate: bool = False
    attn_gate_bias: bool = True
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
    # Llama-4: chunked-attention layers (attention_chunk_size, layer_types), MoE blocks at
    # moe_layers / every interleave_moe_layer_step-th with a shared expert as wide as a
    # routed one, dense blocks intermediate_size_mlp wide; its q/k L2 norms have no weights.
    Family("llama4", ("llama4_text",), ("Llama4ForCausalLM",), moe="llama4"),
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
    # GLM-4.5/4.6 MoE: DeepSeek's expert layout (shared experts, first_k_dense_replace),
    # biased q/k/v only, optional per-head q/k norms.
    Family(
        "glm4_moe",
        ("glm4_moe",),
        ("Glm4MoeForCausalLM",),
        o_bias=False,
        qk_norm="use_qk_norm",
        moe="deepseek",
    ),
    Family(
        "glm4_moe_lite",
        ("glm4_moe_lite",),
        ("Glm4MoeLiteForCausalLM",),
        moe="deepseek",
        mla=True,
    ),
    Family(
        "exaone_moe",
        ("exaone_moe",),
        ("ExaoneMoeForCausalLM",),
        qk_norm=True,
        moe="deepseek",
    ),
    # MiniMax-M2: attention only, q/k norms over all heads, a MoE in every block (its router's
    # correction bias is a buffer).
    Family(
        "minimax_m2",
        ("minimax_m2",),
        ("MiniMaxM2ForCausalLM",),
        qkv_bias=False,  # bias-free whatever attention_bias says
        o_bias=False,
        qk_norm=True,
        qk_norm_full=True,
        moe="mixtral",
    ),
    # Youtu-LLM: DeepSeek-V2's latent attention in a dense, tied decoder.
    Family("youtu", ("youtu",), ("YoutuForCausalLM",), tied_default=True, mla=True),
    # AFMoE: gated attention (a separate d → H·h_d gate), per-head q/k norms, four norms per
    # block, sliding layers by layer_types, DeepSeek's expert layout after num_dense_layers
    # dense blocks with a learned expert bias.
    Family(
        "afmoe",
        ("afmoe",),
        ("AfmoeForCausalLM",),
        norms_per_layer=4,
        qk_norm=True,
        attn_output_gate=True,
        attn_gate_bias=False,
        router_bias=True,
        moe="deepseek",
    ),
    Family("solar_open", ("solar_open",), ("SolarOpenForCausalLM",), o_bias=False, moe="deepseek"),
    Family("hy_v3", ("hy_v3",), ("HYV3ForCausalLM",), qk_norm=True, moe="deepseek"),
    Family("sarvam_mla", ("sarvam_mla",), ("SarvamMLAForCausalLM",), moe="deepseek", mla=True),
    # MiniCPM5-MoE: a fused q_gate_proj (queries and a gate per channel, as Qwen3-Next's),
    # DeepSeek's expert layout.
    Family(
        "minicpm5_moe",
        ("minicpm5_moe",),
        ("MiniCPM5MoeForCausalLM",),
        attn_output_gate=True,
        moe="deepseek",
    ),
    # MiniCPM3: DeepSeek-V2's latent attention in a dense decoder (its scalings are
    # elementwise).
    Family("minicpm3", ("minicpm3",), ("MiniCPM3ForCausalLM",), tied_default=True, mla=True),
    # Decoders the registry oracle proves Llama-shaped as far as FLOPs, bytes and
    # parameters go (their differences are RoPE variants, activations or scalings).
    Family("smollm3", ("smollm3",), ("SmolLM3ForCausalLM",)),
    # EXAONE 3: transformers 5.25 runs it as LlamaForCausalLM with its own config class.
    Family("exaone", ("exaone",), ("ExaoneForCausalLM",)),
    Family("vaultgemma", ("vaultgemma",), ("VaultGemmaForCausalLM",), tied_default=True),
    Family("ministral", ("ministral",), ("MinistralForCausalLM",)),
    # HyperCLOVA X: Granite-style multipliers (elementwise), optional Peri-LN post-norms.
    Family(
        "hyperclovax",
        ("hyperclovax",),
        ("HyperCLOVAXForCausalLM",),
        post_norm_flag="use_post_norm",
    ),
    # Apertus: a plain (up, down) MLP with the xIELU activation and its two learned scalars,
    # per-head q/k norms.
    Family(
        "apertus",
        ("apertus",),
        ("ApertusForCausalLM",),
        mlp_bias=False,  # bias-free whatever mlp_bias says
        mlp_gated=False,
        qk_norm=True,
        act_params=("xielu", 2),
    ),
    # Jais 2: biased attention and plain squared-ReLU MLP by attention_bias / mlp_bias,
    # LayerNorms with bias.
    Family("jais2", ("jais2",), ("Jais2ForCausalLM",), mlp_gated=False, norm_bias=True),
    Family("ministral3", ("ministral3",), ("Ministral3ForCausalLM",), windows="all"),
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
    Family(
        "ernie4_5_moe",
        ("ernie4_5_moe",),
        ("Ernie4_5_MoeForCausalLM",),
        qkv_bias="use_bias",
        o_bias="use_bias",
        mlp_bias="use_bias",
        lm_head_bias="use_bias",
        router_bias=True,  # e_score_correction_bias is a parameter here
        moe="ernie",
    ),
    Family(
        "hunyuan_v1_moe",
        ("hunyuan_v1_moe",),
        ("HunYuanMoEV1ForCausalLM",),
        qk_norm=True,
        moe="mixtral",
    ),
    Family("glm", ("glm",), ("GlmForCausalLM",), o_bias=False),
    Family("glm4", ("glm4",), ("Glm4ForCausalLM",), o_bias=False, norms_per_layer=4),
    Family("hunyuan_v1_dense", ("hunyuan_v1_dense",), ("HunYuanDenseV1ForCausalLM",), qk_norm=True),
    Family("arcee", ("arcee",), ("ArceeForCausalLM",), mlp_gated=False),
    Family("exaone4", ("exaone4",), ("Exaone4ForCausalLM",), qk_norm=True),
    # OLMo (1): LayerNorms without weight or bias (no parameters); clip_qkv is a clamp.
    Family("olmo", ("olmo",), ("OlmoForCausalLM",), norms_per_layer=0, final_norm=False),
    Family("olmo2", ("olmo2",), ("Olmo2ForCausalLM",), qk_norm=True, qk_norm_full=True),
    # nanochat: weightless RMS norms everywhere (q/k too), a plain squared-ReLU MLP.
    Family(
        "nanochat",
        ("nanochat",),
        ("NanoChatForCausalLM",),
        mlp_gated=False,
        norms_per_layer=0,
        final_norm=False,
    ),
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
    Family("mpt", ("mpt",), ("MptForCausalLM",), reader="mpt"),
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
    # Persimmon: fused biased QKV, per-head q/k LayerNorms with bias, a plain squared-ReLU MLP.
    Family(
        "persimmon",
        ("persimmon",),
        ("PersimmonForCausalLM",),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        mlp_gated=False,
        norm_bias=True,
        qk_norm="qk_layernorm",
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
    # Granite with sliding-window layers and a learned sink logit per head (gpt-oss style).
    Family("granite_swa", ("granite_swa",), ("GraniteSwaForCausalLM",), attention_sinks=True),
    Family(
        "granitemoe_swa",
        ("granitemoe_swa",),
        ("GraniteMoeSwaForCausalLM",),
        attention_sinks=True,
        moe="mixtral",
    ),
    Family(
        "cohere2_moe",
        ("cohere2_moe",),
        ("Cohere2MoeForCausalLM",),
        norms_per_layer=1,
        tied_default=True,
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
    # Hybrids: a per-block mix of attention, Mamba/Mamba2 and short-conv mixers
    # (analysis/modelspec/hybrid.py).
    Family("jamba", ("jamba",), ("JambaForCausalLM",), reader="hybrid"),
    Family("bamba", ("bamba",), ("BambaForCausalLM",), reader="hybrid"),
    Family("falcon_h1", ("falcon_h1",), ("FalconH1ForCausalLM",), reader="hybrid"),
    Family(
        "zamba2",
        ("zamba2",),
        ("Zamba2ForCausalLM",),
        reader="hybrid",
        norms_per_layer=1,
        tied_default=True,
    ),
    Family("minimax", ("minimax",), ("MiniMaxForCausalLM",), reader="hybrid", moe="mixtral"),
    Family("kimi_linear", ("kimi_linear",), ("KimiLinearForCausalLM",), reader="hybrid", mla=True),
    Family(
        "bailing_hybrid",
        ("bailing_hybrid",),
        ("BailingHybridForCausalLM",),
        reader="hybrid",
        mla=True,
    ),
    Family(
        "granitemoehybrid",
        ("granitemoehybrid",),
        ("GraniteMoeHybridForCausalLM",),
        reader="hybrid",
    ),
    Family(
        "nemotron_h",
        ("nemotron_h",),
        ("NemotronHForCausalLM",),
        reader="hybrid",
        mlp_gated=False,
        norms_per_layer=1,
    ),
    Family(
        "lfm2", ("lfm2",), ("Lfm2ForCausalLM",), reader="hybrid", qk_norm=True, tied_default=True
    ),
    Family(
        "qwen3_next",
        ("qwen3_next",),
        ("Qwen3NextForCausalLM",),
        reader="hybrid",
        qk_norm=True,
        moe="qwen",
    ),
    Family(
        "olmo_hybrid", ("olmo_hybrid",), ("OlmoHybridForCausalLM",), reader="hybrid", qk_norm=True
    ),
    Family("qwen3_5", ("qwen3_5_text",), ("Qwen3_5ForCausalLM",), reader="hybrid", qk_norm=True),
    Family(
        "qwen3_5_moe",
        ("qwen3_5_moe_text",),
        ("Qwen3_5MoeForCausalLM",),
        reader="hybrid",
        qk_norm=True,
        moe="qwen",
    ),
    Family(
        "lfm3",
        ("lfm3",),
        ("Lfm3ForCausalLM",),
        reader="hybrid",
        qk_norm=True,
        tied_default=True,
        post_norm_flag="use_sandwich_norm",
    ),
    Family(
        "lfm2_moe",
        ("lfm2_moe",),
        ("Lfm2MoeForCausalLM",),
        reader="hybrid",
        qk_norm=True,
        tied_default=True,
    ),
    Family("gpt2", ("gpt2",), ("GPT2LMHeadModel",), reader="gpt2"),
    Family("gpt_bigcode", ("gpt_bigcode",), ("GPTBigCodeForCausalLM",), reader="gpt2"),
    Family("gpt_neox", ("gpt_neox",), ("GPTNeoXForCausalLM",), reader="gpt_neox"),
    Family("opt", ("opt",), ("OPTForCausalLM",), reader="opt"),
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
    "zamba": (
        "Zamba (v1): its Mamba mixers split in_proj into n_mamba_heads heads, each with its "
        "own x_proj and dt_proj, a layout perfscope's Mamba count does not describe yet "
        "(Zamba2 is counted)"
    ),
    "recurrent_gemma": (
        "RecurrentGemma (Griffin): RG-LRU recurrent blocks with block-diagonal gates beside "
        "local attention; perfscope does not count the RG-LRU yet"
    ),
    "rwkv": (
        "RWKV: its WKV time-mixing recurrence and token-shift state replace the KV cache; "
        "perfscope does not count that recurrence yet"
    ),
    "xlstm": (
        "xLSTM: mLSTM/sLSTM cells with matrix memories replace the KV cache; perfscope does "
        "not count those cells yet"
    ),
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


def family_for(cfg: Mapping[str, object]) -> Family:
    """The :class:`Family` row of a config: by ``model_type``, else by ``architectures``.

    Raises:
        UsageError: neither names a known family; the message says what is missing.
    """
    mt = str(cfg.get("model_type", "")).lower()
    fam = _BY_TYPE.get(mt)
    if fam is not None:
        return fam
    listed = cfg.get("architectures")
    archs = [a for a in listed if isinstance(a, str)] if isinstance(listed, list) else []
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


def _flag(cfg: Mapping[str, object], rule: bool | str, default: bool = False) -> bool:
    if isinstance(rule, bool):
        return rule
    return bool(_first_of(cfg, rule, default=default))


_LAYER_TYPE_KINDS = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
}


def _layer_windows(cfg: Mapping[str, object], fam: Family, n_layers: int) -> tuple[int, ...]:
    """Per-layer span (0 full, w sliding, -c chunked) or ``()`` when every layer is full."""
    window = _int_of(cfg, "sliding_window", default=fam.window_default) or 0
    if fam.window_flag and not cfg.get(fam.window_flag):
        window = 0
    chunk = _int_of(cfg, "attention_chunk_size", default=0) or 0
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
                window = _int_of(cfg, "sliding_window", default=fam.window_default) or 0
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
    max_w = _int_of(cfg, "max_window_layers", default=28)
    if fam.windows == "all":
        slides = [True] * n_layers
    elif fam.windows == "from_max":
        slides = [i >= max_w for i in range(n_layers)]
    elif fam.windows == "alternate_below_max":
        slides = [bool((i + 1) % 2) and i < max_w for i in range(n_layers)]
    else:  # pattern
        pattern = _int_of(
            cfg, "sliding_window_pattern", "_sliding_window_pattern", default=fam.window_pattern
        )
        slides = [bool((i + 1) % pattern) for i in range(n_layers)]
    spans = tuple(window if s else 0 for s in slides)
    return spans if any(spans) else ()


def _mla_fields(cfg: Mapping[str, object], n_heads: int) -> dict[str, object]:
    """Multi-head latent attention's fields (DeepSeek-V2/V3, MiniCPM3, Kimi-Linear): one
    K/V head per query head, ``h_qk = h_nope + h_rope``, the latent ranks."""
    rope = _require(cfg, "qk_rope_head_dim")
    nope = _require(cfg, "qk_nope_head_dim")
    return {
        "n_kv_heads": n_heads,
        "head_dim": rope + nope,
        "kv_lora_rank": _require(cfg, "kv_lora_rank"),
        "q_lora_rank": (_int_of(cfg, "q_lora_rank", default=0) or 0),
        "qk_rope_head_dim": rope,
        "v_head_dim": _require(cfg, "v_head_dim"),
    }


def _moe_fields(cfg: Mapping[str, object], fam: Family, n_layers: int) -> dict[str, object]:
    if fam.moe == "none":
        return {}
    if fam.moe == "mixtral":
        e = _int_of(cfg, "num_local_experts", "num_experts", default=8)
        shared = _int_of(cfg, "shared_intermediate_size", default=0) or 0
        if fam.key == "cohere2_moe":  # num_shared_experts gated MLPs as wide as an expert
            per = _require(cfg, "intermediate_size")
            shared = per * (_int_of(cfg, "num_shared_experts", default=0) or 0)
        top_k = _first_of(cfg, "num_experts_per_tok", "moe_topk", default=2)
        if fam.key == "hunyuan_v1_moe":  # a shared MLP as wide as an expert, always
            shared = _require(cfg, "intermediate_size")
            if isinstance(top_k, list) or isinstance(_first_of(cfg, "num_experts"), list):
                raise UsageError(
                    "HunYuan-MoE config lists num_experts or moe_topk per layer: perfscope "
                    "counts one expert layout for every MoE block"
                )
        return {
            "n_experts": e,
            "n_active_experts": _as_int(top_k, "num_experts_per_tok", "moe_topk"),
            # GraniteMoeShared: a shared MLP beside the experts
            "shared_expert_intermediate_size": shared,
        }
    if fam.moe == "llama4":
        e = _int_of(cfg, "num_local_experts", default=16)
        step = _int_of(cfg, "interleave_moe_layer_step", default=1)
        moe_layers = cfg.get("moe_layers")
        if moe_layers is None:
            moe_layers = list(range(step - 1, n_layers, step))
        moe_set = set(_ints(moe_layers, "moe_layers"))
        f = _require(cfg, "intermediate_size")
        return {
            "n_experts": e,
            "n_active_experts": _int_of(cfg, "num_experts_per_tok", default=1),
            "intermediate_size": f,
            "shared_expert_intermediate_size": f,
            "dense_layers": tuple(i for i in range(n_layers) if i not in moe_set),
            "dense_intermediate_size": _int_of(cfg, "intermediate_size_mlp", default=0),
        }
    if fam.moe == "ernie":
        # ERNIE-4.5-MoE: MoE blocks every moe_layer_interval-th from moe_layer_start_index to
        # moe_layer_end_index, bias-free experts beside use_bias shared and dense MLPs.
        e = _int_of(cfg, "moe_num_experts", default=0) or 0
        if not e:
            return {}
        start = _int_of(cfg, "moe_layer_start_index", default=1)
        end = _int_of(cfg, "moe_layer_end_index", default=n_layers - 1)
        step = _int_of(cfg, "moe_layer_interval", default=1)
        moe_f = _require(cfg, "moe_intermediate_size")
        return {
            "n_experts": e,
            "n_active_experts": _int_of(cfg, "moe_k", default=2),
            "intermediate_size": moe_f,
            "shared_expert_intermediate_size": moe_f
            * (_int_of(cfg, "moe_num_shared_experts", default=0) or 0),
            "dense_layers": tuple(
                i for i in range(n_layers) if (i + 1) % step or not start <= i <= end
            ),
            "dense_intermediate_size": _require(cfg, "intermediate_size"),
            "expert_bias": False,
        }
    if fam.moe == "qwen":
        # transformers 5 saves Qwen3-MoE's expert count as num_local_experts.
        e = _int_of(cfg, "num_experts", "num_local_experts", default=0)
        if not e:
            return {}
        step = _int_of(cfg, "decoder_sparse_step", default=1)
        only = set(_ints(cfg.get("mlp_only_layers"), "mlp_only_layers"))
        dense = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
        shared = _int_of(cfg, "shared_expert_intermediate_size", default=0)
        return {
            "n_experts": e,
            "n_active_experts": _int_of(cfg, "num_experts_per_tok", default=2),
            "intermediate_size": _require(cfg, "moe_intermediate_size"),
            "shared_expert_intermediate_size": shared,
            "shared_expert_gate": shared > 0,
            "dense_layers": dense,
            "dense_intermediate_size": _int_of(cfg, "intermediate_size", default=0),
        }
    # DeepSeek's layout; EXAONE-MoE and GLM-4.7-Lite spell the counts num_experts /
    # num_shared_experts and list the dense blocks in mlp_layer_types.
    e = _int_of(cfg, "n_routed_experts", "num_experts", default=0) or 0
    if not e:
        return {}
    moe_f = _require(cfg, "moe_intermediate_size")
    kinds = cfg.get("mlp_layer_types")
    if isinstance(kinds, list) and len(kinds) == n_layers:
        dense = tuple(i for i, k in enumerate(kinds) if k != "sparse")
    else:
        first = _int_of(cfg, "first_k_dense_replace", "num_dense_layers", default=0)
        dense = tuple(range(min(first, n_layers)))
    return {
        "n_experts": e,
        "n_active_experts": _int_of(cfg, "num_experts_per_tok", default=2),
        "intermediate_size": moe_f,
        "shared_expert_intermediate_size": moe_f
        * (_int_of(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0),
        "dense_layers": dense,
        "dense_intermediate_size": _require(cfg, "intermediate_size") if dense else 0,
    }
