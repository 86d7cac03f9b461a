"""A small Llama-style decoder in plain PyTorch, with random weights from a seed.

RMSNorm, rotary position embeddings (RoPE), grouped-query attention, a SwiGLU MLP and a
KV cache with one slot per batch row. Attention is written as explicit matmuls (no fused
SDPA kernel) so that what runs is exactly what the cost model counts, and
``torch.utils.flop_counter.FlopCounterMode`` sees all of it:

- prefill attends over the full ``T x T`` square with a causal mask ("as executed");
- decode attends over the padded cache span ``[0, max_len_in_batch)`` with a length mask;
- logits are computed for the last position only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

__all__ = [
    "ATTENTION_IMPLS",
    "KV_DTYPES",
    "PRESETS",
    "QUANT_MODES",
    "KVCache",
    "QuantizedKV",
    "ReferenceConfig",
    "ReferenceModel",
    "Sparsity",
    "SparsityStats",
    "dequantize_kv",
    "kv_bytes_per_element",
    "magnitude_mask",
    "parse_sparsity",
    "quantize_kv",
    "quantize_weights",
    "sparsify_weights",
    "torch_dtype",
]

#: ``attention`` engine option: explicit matmuls (what the cost model counts) or torch's
#: fused ``scaled_dot_product_attention``.
ATTENTION_IMPLS = ("explicit", "sdpa")
#: ``quant`` engine option: ``int8`` = torch's dynamic int8 quantisation of every linear
#: layer (int8 weights per tensor, activations quantised per step: int8 matmuls, fp32
#: only); ``int8-wo`` = weight-only int8 (per output channel scale, dequantised to the
#: activation dtype inside each matmul).
QUANT_MODES = ("none", "int8", "int8-wo")
#: ``kv_dtype`` engine option (vLLM: ``kv_cache_dtype``): ``auto`` = the model dtype;
#: ``int8`` = int8 values with one float32 scale per token and KV head (absmax / 127);
#: ``fp8`` = ``torch.float8_e4m3fn`` values, no scale (as vLLM's default ``k_scale = 1``).
#: Storage only: K/V are upcast to the model dtype before attention, because CPUs (and
#: this eager engine) have no int8/fp8 attention matmul; what shrinks is the cache's bytes.
KV_DTYPES = ("auto", "int8", "fp8")

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def torch_dtype(name: str) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` → the torch dtype; ValueError otherwise."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: use one of {', '.join(_DTYPES)}") from None


@dataclass(frozen=True)
class ReferenceConfig:
    """Shape of the reference decoder.

    Attributes:
        n_layers: transformer blocks.
        hidden_size: model width.
        n_heads: query heads; ``hidden_size`` must be divisible by it.
        n_kv_heads: key/value heads; ``n_heads`` must be divisible by it (GQA).
        intermediate_size: SwiGLU inner width.
        vocab_size: token ids are drawn from ``[0, vocab_size)``.
        dtype: parameter, activation and KV-cache dtype (``float32|bfloat16|float16``).
        tied_embeddings: share the embedding matrix with the lm_head.
        rope_theta: RoPE base.
        norm_eps: RMSNorm epsilon.
        head_dim_override: width of each attention head when it is not ``hidden_size /
            n_heads`` (a head-pruned model keeps its heads' width with fewer heads; see
            :mod:`~perfscope.profiler.engines.reference.heads`); None: ``hidden_size /
            n_heads``.
    """

    n_layers: int = 4
    hidden_size: int = 512
    n_heads: int = 8
    n_kv_heads: int = 2
    intermediate_size: int = 1408
    vocab_size: int = 8192
    dtype: str = "float32"
    tied_embeddings: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    head_dim_override: int | None = None

    def __post_init__(self) -> None:
        for name in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {self.vocab_size}")
        if self.head_dim_override is not None:
            if self.head_dim_override <= 0 or self.head_dim_override % 2:
                raise ValueError(
                    f"head_dim_override must be a positive even number, got "
                    f"{self.head_dim_override}"
                )
        elif self.hidden_size % self.n_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by n_heads {self.n_heads}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError("head_dim (hidden_size / n_heads) must be even for RoPE")
        torch_dtype(self.dtype)

    @property
    def head_dim(self) -> int:
        if self.head_dim_override is not None:
            return self.head_dim_override
        return self.hidden_size // self.n_heads

    def with_overrides(self, **overrides: object) -> ReferenceConfig:
        """A copy with the given fields replaced (``None`` values are ignored)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]

    def n_params(self) -> int:
        """Exact parameter count of :class:`ReferenceModel` built from this config."""
        d, hd = self.hidden_size, self.head_dim
        attn = d * self.n_heads * hd * 2 + d * self.n_kv_heads * hd * 2
        mlp = 3 * d * self.intermediate_size
        per_layer = attn + mlp + 2 * d
        emb = self.vocab_size * d
        head = 0 if self.tied_embeddings else self.vocab_size * d
        return self.n_layers * per_layer + emb + head + d

    def model_spec(self) -> dict[str, object]:
        """The fields of ``perfscope.analysis.modelspec.ModelSpec`` for this model."""
        short = _SHORT[self.dtype]
        nbytes = float(torch_dtype(self.dtype).itemsize)
        return {
            "name": "reference",
            "n_layers": self.n_layers,
            "hidden_size": self.hidden_size,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "mlp_gated": True,
            "tied_embeddings": self.tied_embeddings,
            "n_experts": 0,
            "n_active_experts": 0,
            "weight_dtype": short,
            "weight_bytes_per_param": nbytes,
            "kv_dtype": short,
            "kv_bytes_per_element": nbytes,
            "act_dtype": short,
            "act_bytes_per_element": nbytes,
            "lm_head_all_positions": False,
        }

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


#: Named shapes for ``--model-preset``. ``small`` is the default: about 20 M parameters,
#: sized so the default ``perfscope run`` finishes well inside a minute on 2 CPU cores.
PRESETS: dict[str, ReferenceConfig] = {
    "tiny": ReferenceConfig(
        n_layers=2,
        hidden_size=128,
        n_heads=4,
        n_kv_heads=2,
        intermediate_size=352,
        vocab_size=1024,
    ),
    "small": ReferenceConfig(),
    "medium": ReferenceConfig(
        n_layers=12,
        hidden_size=1024,
        n_heads=16,
        n_kv_heads=4,
        intermediate_size=2816,
        vocab_size=32000,
    ),
    # Llama-3.2-1B-like dimensions (GQA 32/8, SwiGLU 8192, tied embeddings): for GPUs.
    "1b": ReferenceConfig(
        n_layers=16,
        hidden_size=2048,
        n_heads=32,
        n_kv_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
        tied_embeddings=True,
        rope_theta=500000.0,
    ),
    # Llama-2-7B dimensions (MHA): for GPUs with >= 16 GB in bf16.
    "7b": ReferenceConfig(
        n_layers=32,
        hidden_size=4096,
        n_heads=32,
        n_kv_heads=32,
        intermediate_size=11008,
        vocab_size=32000,
    ),
}


def kv_bytes_per_element(cfg: ReferenceConfig, kv_dtype: str = "auto") -> float:
    """Bytes one cached K or V element occupies (scales included) for ``kv_dtype``
    (:data:`KV_DTYPES`): the model dtype's size for ``auto``, ``1 + 4 / head_dim`` for
    ``int8`` (a float32 scale per token and head), 1 for ``fp8``."""
    if kv_dtype == "auto":
        return float(torch_dtype(cfg.dtype).itemsize)
    if kv_dtype == "int8":
        return 1.0 + 4.0 / cfg.head_dim
    if kv_dtype == "fp8":
        return 1.0
    raise ValueError(f"unknown kv_dtype {kv_dtype!r}: use one of {', '.join(KV_DTYPES)}")


def quantize_kv(x: torch.Tensor, kv_dtype: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` (any float dtype, head_dim last) as stored in a ``kv_dtype`` cache: the values
    and, for ``int8``, the float32 scale per vector of the last dimension (``None`` for
    ``fp8``). Round trip (:func:`dequantize_kv`): int8 is within ``absmax / 254`` of each
    vector; fp8 within ``2**-4`` relative (``2**-10`` absolute below ``2**-6``), for
    ``|x| <= 448`` (larger values saturate)."""
    if kv_dtype == "int8":
        scale = x.detach().abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / 127.0
        q = torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8)
        return q, scale
    if kv_dtype == "fp8":
        return x.float().clamp(-448.0, 448.0).to(torch.float8_e4m3fn), None
    raise ValueError(f"kv_dtype {kv_dtype!r} is not quantised: use int8 or fp8")


_FP8_TABLES: dict[torch.device, torch.Tensor] = {}


def _fp8_table(device: torch.device) -> torch.Tensor:
    """The float32 value of each of the 256 e4m3 bit patterns."""
    if device not in _FP8_TABLES:
        bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        _FP8_TABLES[device] = bits.view(torch.float8_e4m3fn).float().to(device)
    return _FP8_TABLES[device]


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Stored cache values back in ``dtype`` (the inverse of :func:`quantize_kv`)."""
    if scale is None:
        if q.device.type == "cpu":
            # torch's CPU fp8 -> float cast is a slow scalar loop; a 256-entry table lookup
            # gives the same bits about 3x faster.
            table = _fp8_table(q.device)
            return torch.take(table, q.view(torch.uint8).long()).to(dtype)
        return q.to(dtype)
    return (q * scale).to(dtype)  # int8 * float32 promotes in one pass


class QuantizedKV:
    """One layer's K (or V) ``[slots, n_kv_heads, max_len, head_dim]`` stored in int8 or
    fp8; indexed like the float tensor it replaces. Writing (``c[idx] = x``) quantises
    ``x`` per vector of the last dimension; reading (``c[idx]``) returns a float copy in
    the model dtype. ``idx`` must not index the last dimension."""

    def __init__(
        self,
        values: torch.Tensor,
        scale: torch.Tensor | None,
        kv_dtype: str,
        dtype: torch.dtype,
    ) -> None:
        self.values = values
        self.scale = scale
        self.kv_dtype = kv_dtype
        self.dtype = dtype

    @classmethod
    def empty(
        cls,
        shape: tuple[int, int, int, int],
        kv_dtype: str,
        dtype: torch.dtype,
        device: torch.device,
    ) -> QuantizedKV:
        if kv_dtype == "int8":
            values = torch.zeros(shape, dtype=torch.int8, device=device)
            scale: torch.Tensor | None = torch.zeros(
                (*shape[:-1], 1), dtype=torch.float32, device=device
            )
        elif kv_dtype == "fp8":
            values, scale = torch.zeros(shape, dtype=torch.float8_e4m3fn, device=device), None
        else:
            raise ValueError(f"kv_dtype {kv_dtype!r} is not quantised: use int8 or fp8")
        return cls(values, scale, kv_dtype, dtype)

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def nbytes(self) -> int:
        """Bytes held: values and scales."""
        n = self.values.numel() * self.values.element_size()
        if self.scale is not None:
            n += self.scale.numel() * self.scale.element_size()
        return n

    def __getitem__(self, idx: object) -> torch.Tensor:
        scale = None if self.scale is None else self.scale[idx]  # type: ignore[index]
        return dequantize_kv(self.values[idx], scale, self.dtype)  # type: ignore[index]

    def __setitem__(self, idx: object, x: torch.Tensor) -> None:
        q, scale = quantize_kv(x, self.kv_dtype)
        self.values[idx] = q  # type: ignore[index]
        if self.scale is not None:
            assert scale is not None
            self.scale[idx] = scale  # type: ignore[index]

    def slots(self, start: int, n: int) -> QuantizedKV:
        """Slots ``start..start+n-1``, sharing this one's storage."""
        scale = None if self.scale is None else self.scale[start : start + n]
        return QuantizedKV(self.values[start : start + n], scale, self.kv_dtype, self.dtype)

    def copy_positions(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst`` (exact)."""
        self.values[dst, :, :length].copy_(self.values[src, :, :length])
        if self.scale is not None:
            self.scale[dst, :, :length].copy_(self.scale[src, :, :length])


#: One layer's K or V store: a float tensor (``kv_dtype=auto``) or a quantised one.
KVStore = torch.Tensor | QuantizedKV


class KVCache:
    """Per-layer K and V ``[slots, n_kv_heads, max_len, head_dim]``: float tensors in the
    model dtype, or :class:`QuantizedKV` stores for ``kv_dtype`` ``int8``/``fp8``.

    Active sequences occupy slots ``0..n-1`` contiguously so a decode step can read a view
    of the first ``n`` slots without gathering; :meth:`move` compacts after a sequence leaves.
    """

    def __init__(
        self,
        cfg: ReferenceConfig,
        slots: int,
        max_len: int,
        device: torch.device,
        kv_dtype: str = "auto",
    ) -> None:
        shape = (slots, cfg.n_kv_heads, max_len, cfg.head_dim)
        dt = torch_dtype(cfg.dtype)
        self.k: list[KVStore]
        self.v: list[KVStore]
        if kv_dtype == "auto":
            self.k = [torch.zeros(shape, dtype=dt, device=device) for _ in range(cfg.n_layers)]
            self.v = [torch.zeros(shape, dtype=dt, device=device) for _ in range(cfg.n_layers)]
        else:
            self.k = [QuantizedKV.empty(shape, kv_dtype, dt, device) for _ in range(cfg.n_layers)]
            self.v = [QuantizedKV.empty(shape, kv_dtype, dt, device) for _ in range(cfg.n_layers)]
        self.kv_dtype = kv_dtype
        self.slots = slots
        self.max_len = max_len

    @property
    def nbytes(self) -> int:
        """Memory held by the cache in bytes (int8 scales included)."""
        return sum(
            t.nbytes if isinstance(t, QuantizedKV) else t.numel() * t.element_size()
            for t in (*self.k, *self.v)
        )

    def view(self, start: int, n: int) -> KVCache:
        """Slots ``start..start+n-1`` as a cache of ``n`` slots sharing this one's storage."""
        out = object.__new__(KVCache)
        out.k = [_slots(t, start, n) for t in self.k]
        out.v = [_slots(t, start, n) for t in self.v]
        out.kv_dtype = self.kv_dtype
        out.slots, out.max_len = n, self.max_len
        return out

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst``."""
        if src == dst or length <= 0:
            return
        for t in (*self.k, *self.v):
            if isinstance(t, QuantizedKV):
                t.copy_positions(src, dst, length)
            else:
                t[dst, :, :length].copy_(t[src, :, :length])


def _slots(t: KVStore, start: int, n: int) -> KVStore:
    return t.slots(start, n) if isinstance(t, QuantizedKV) else t[start : start + n]


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class _Block(nn.Module):
    def __init__(self, cfg: ReferenceConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, hd
        self.attn_norm = _RMSNorm(d, cfg.norm_eps)
        self.wq = nn.Linear(d, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, d, bias=False)
        self.mlp_norm = _RMSNorm(d, cfg.norm_eps)
        self.w_gate = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.w_up = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.w_down = nn.Linear(cfg.intermediate_size, d, bias=False)
        self.sdpa = False

    def _attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        # q: [B, kvH, G*T, hd] (query heads grouped under their KV head, no K/V copies);
        # k, v: [B, kvH, L, hd]; mask: broadcastable to [B, kvH, G*T, L], True = masked out.
        if self.sdpa:
            out: torch.Tensor = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=~mask)
            return out
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, v)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache_k: KVStore,
        cache_v: KVStore,
        positions: torch.Tensor,
        span: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """One block. ``x``: [B, T, d]; ``positions``: [B, T] cache positions to write."""
        b, t, _ = x.shape
        g = self.n_heads // self.n_kv_heads
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, self.n_heads, self.head_dim)
        k = self.wk(h).view(b, t, self.n_kv_heads, self.head_dim)
        v = self.wv(h).view(b, t, self.n_kv_heads, self.head_dim)
        q = _rope(q, cos, sin)
        k = _rope(k, cos, sin)
        rows = torch.arange(b, device=x.device).unsqueeze(1).expand(b, t)
        cache_k[rows, :, positions] = k
        cache_v[rows, :, positions] = v
        # [B, T, H, hd] -> [B, kvH, G*T, hd]
        qg = q.view(b, t, self.n_kv_heads, g, self.head_dim).permute(0, 2, 3, 1, 4)
        qg = qg.reshape(b, self.n_kv_heads, g * t, self.head_dim)
        out = self._attention(qg, cache_k[:b, :, :span], cache_v[:b, :, :span], mask)
        out = out.view(b, self.n_kv_heads, g, t, self.head_dim).permute(0, 3, 1, 2, 4)
        x = x + self.wo(out.reshape(b, t, self.n_heads * self.head_dim))
        h = self.mlp_norm(x)
        out_x: torch.Tensor = x + self.w_down(nn.functional.silu(self.w_gate(h)) * self.w_up(h))
        return out_x


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, T, heads, hd]; cos/sin: [B, T, hd/2] (rotate-half convention, as Llama in HF)
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def _rope_inv_freq(cfg: ReferenceConfig) -> torch.Tensor:
    """RoPE inverse frequencies, ``[head_dim / 2]`` float32, always on the CPU (also inside
    ``build``'s meta-device context, where a meta ``arange`` would import ``torch._dynamo``)."""
    steps = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32, device="cpu")
    return 1.0 / (cfg.rope_theta ** (steps / cfg.head_dim))


def _materialise_on_cpu(module: nn.Module) -> None:
    """Replace every meta parameter and buffer of ``module`` by an uninitialised CPU tensor
    of its shape and dtype (what ``to_empty(device="cpu")`` does, without its
    ``empty_like`` of a meta tensor: that runs through torch's Python references, whose first
    use imports sympy and more, seconds of a CLI run's start). Ties are not kept."""
    for mod in module.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None and p.is_meta:
                empty = torch.empty(p.shape, dtype=p.dtype, device="cpu")
                mod._parameters[name] = nn.Parameter(empty, requires_grad=p.requires_grad)
        for name, b in list(mod._buffers.items()):
            if b is not None and b.is_meta:
                mod._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="cpu")


class _Embedding(nn.Embedding):
    """``nn.Embedding`` that draws no initial weights on the meta device.

    :meth:`ReferenceModel.build` constructs on ``meta`` and draws every weight itself; a
    ``normal_`` on a meta tensor runs through torch's Python references, whose first use
    imports ``torch._dynamo`` (3-30 s of a CLI run's start on a 2-core machine, for nothing).
    """

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class ReferenceModel(nn.Module):
    """The reference decoder. Build with :meth:`build` to get seeded random weights."""

    def __init__(self, cfg: ReferenceConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = _Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.norm = _RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        #: storage dtype of the caches :meth:`new_cache` makes (:data:`KV_DTYPES`).
        self.kv_dtype = "auto"
        self._inv_freq = _rope_inv_freq(cfg)

    @classmethod
    def build(
        cls, cfg: ReferenceConfig, *, seed: int = 0, device: str | torch.device = "cpu"
    ) -> ReferenceModel:
        """Random weights (normal, std 0.02; norms at 1) drawn from ``seed``, on ``device``."""
        gen = torch.Generator().manual_seed(seed)
        with torch.device("meta"):
            model = cls(cfg)
        _materialise_on_cpu(model)
        if cfg.tied_embeddings:
            model.lm_head.weight = model.embed.weight  # to_empty() does not keep the tie
        for name, p in model.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        model._inv_freq = _rope_inv_freq(cfg)
        model = model.to(device=torch.device(device), dtype=torch_dtype(cfg.dtype))
        model._inv_freq = model._inv_freq.to(torch.device(device))
        model.eval()
        return model

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def set_attention(self, impl: str) -> None:
        """Attention kernel of every block: ``explicit`` or ``sdpa`` (:data:`ATTENTION_IMPLS`)."""
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"unknown attention {impl!r}: use one of {', '.join(ATTENTION_IMPLS)}")
        for block in self.blocks:
            assert isinstance(block, _Block)
            block.sdpa = impl == "sdpa"

    def set_kv_dtype(self, kv_dtype: str) -> None:
        """Storage dtype of the KV caches :meth:`new_cache` makes (:data:`KV_DTYPES`)."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"unknown kv_dtype {kv_dtype!r}: use one of {', '.join(KV_DTYPES)}")
        self.kv_dtype = kv_dtype

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        """An empty cache for ``slots`` concurrent sequences of up to ``max_len`` tokens."""
        return KVCache(self.cfg, slots, max_len, self.device, self.kv_dtype)

    def _rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ang = positions.to(torch.float32).unsqueeze(-1) * self._inv_freq
        dt = torch_dtype(self.cfg.dtype)
        return ang.cos().to(dt), ang.sin().to(dt)

    def _run(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        positions: torch.Tensor,
        span: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        x = self.embed(tokens)
        cos, sin = self._rope_tables(positions)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache.k[i], cache.v[i], positions, span, mask)
        logits: torch.Tensor = self.lm_head(self.norm(x[:, -1]))
        return logits

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Process prompts ``tokens`` [B, T] into cache slots ``0..B-1``; returns logits [B, V].

        All rows have the same length ``T`` (the engine groups prompts by length, so no
        padding is computed).
        """
        b, t = tokens.shape
        positions = torch.arange(t, device=tokens.device).unsqueeze(0).expand(b, t)
        g = self.cfg.n_heads // self.cfg.n_kv_heads
        causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).triu(1)
        mask = causal.repeat(g, 1).view(1, 1, g * t, t)
        return self._run(tokens, cache, positions, t, mask)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, cache: KVCache, lengths: torch.Tensor) -> torch.Tensor:
        """One token per row: ``tokens`` [B] for slots ``0..B-1`` whose caches hold
        ``lengths`` [B] entries. Returns logits [B, V]; the caller advances the lengths.
        """
        b = tokens.shape[0]
        span = int(lengths.max().item()) + 1
        positions = lengths.view(b, 1)
        idx = torch.arange(span, device=tokens.device).view(1, span)
        mask = (idx > positions).view(b, 1, 1, span)
        return self._run(tokens.view(b, 1), cache, positions, span, mask)


class _Int8WeightLinear(nn.Module):
    """A bias-free linear layer holding int8 weights and one scale per output channel."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        self.register_buffer("qweight", torch.round(w / scale).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.qweight.to(x.dtype) * self.scale  # type: ignore[operator]
        return nn.functional.linear(x, w)


def quantize_weights(model: ReferenceModel, mode: str) -> ReferenceModel:
    """``model`` with its linear layers quantised (see :data:`QUANT_MODES`); in place for
    ``int8-wo``. ValueError for an unknown mode or ``int8`` on a non-fp32 model."""
    if mode not in QUANT_MODES:
        raise ValueError(f"unknown quant {mode!r}: use one of {', '.join(QUANT_MODES)}")
    if mode == "none":
        return model
    if mode == "int8":
        if model.cfg.dtype != "float32" or model.device.type != "cpu":
            raise ValueError("quant=int8 (dynamic int8 matmuls) runs on cpu in float32 only")
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
                model, {nn.Linear}, dtype=torch.qint8
            )
        return q  # type: ignore[no-any-return]
    for block in model.blocks:
        for name, child in list(block.named_children()):
            if isinstance(child, nn.Linear):
                setattr(block, name, _Int8WeightLinear(child))
    if not model.cfg.tied_embeddings:
        model.lm_head = _Int8WeightLinear(model.lm_head)  # type: ignore[assignment]
    return model


# --------------------------------------------------------------------------- sparsity


@dataclass(frozen=True)
class Sparsity:
    """``sparsity`` engine option: magnitude pruning of every block's linear weights.

    Attributes:
        kind: ``none``, ``unstructured`` (the smallest ``fraction`` of each matrix by
            magnitude set to zero, run as torch.sparse CSR matmuls) or ``2:4`` (in every
            group of 4 consecutive input weights the 2 smallest are zeroed, run as
            ``torch.sparse.to_sparse_semi_structured``: NVIDIA GPUs only).
        fraction: share of each matrix's weights set to zero (0.5 for ``2:4``).
    """

    kind: str = "none"
    fraction: float = 0.0

    @property
    def label(self) -> str:
        return (
            "none"
            if self.kind == "none"
            else "2:4"
            if self.kind == "2:4"
            else (f"unstructured:{self.fraction:g}")
        )


@dataclass(frozen=True)
class SparsityStats:
    """What pruning left in the block matrices (embedding and lm_head stay dense).

    Attributes:
        params: weights of the pruned matrices.
        nonzeros: weights kept.
        index_bytes: bytes of the sparse format's indices (CSR column indices and row
            pointers; 2:4 metadata).
    """

    params: int
    nonzeros: int
    index_bytes: int

    @property
    def density(self) -> float:
        return self.nonzeros / self.params if self.params else 1.0

    @property
    def index_bytes_per_nonzero(self) -> float:
        return self.index_bytes / self.nonzeros if self.nonzeros else 0.0


def parse_sparsity(text: str) -> Sparsity:
    """``none`` | ``unstructured[:F]`` (F in (0, 1), default 0.5) | ``2:4``; ValueError
    with the accepted forms otherwise."""
    t = text.strip().lower()
    if t in ("none", "off", "0"):
        return Sparsity()
    if t == "2:4":
        return Sparsity("2:4", 0.5)
    if t == "unstructured" or t.startswith("unstructured:"):
        frac_text = t.partition(":")[2] or "0.5"
        try:
            frac = float(frac_text)
        except ValueError:
            frac = -1.0
        if 0.0 < frac < 1.0:
            return Sparsity("unstructured", frac)
        raise ValueError(
            f"sparsity unstructured:{frac_text}: the fraction of zeros must be between 0 and 1"
        )
    raise ValueError(f"unknown sparsity {text!r}: use none, unstructured:0.5 or 2:4")


def magnitude_mask(weight: torch.Tensor, sparsity: Sparsity) -> torch.Tensor:
    """Boolean mask (True = keep) of ``weight`` ``[out, in]`` for ``sparsity``.

    Unstructured: exactly ``round(fraction * numel)`` weights are dropped, the smallest by
    magnitude (ties broken by position). 2:4: in each group of 4 consecutive weights along
    the input dimension the 2 largest are kept (``in`` must be divisible by 4)."""
    if sparsity.kind == "none":
        return torch.ones_like(weight, dtype=torch.bool)
    mag = weight.detach().abs().float()
    if sparsity.kind == "2:4":
        if weight.shape[-1] % 4:
            raise ValueError(
                f"2:4 sparsity needs an input width divisible by 4, got {weight.shape}"
            )
        groups = mag.reshape(-1, 4)
        keep = torch.zeros_like(groups, dtype=torch.bool)
        keep.scatter_(1, groups.topk(2, dim=1).indices, True)
        return keep.reshape(weight.shape)
    drop = round(sparsity.fraction * weight.numel())
    order = torch.argsort(mag.reshape(-1), stable=True)
    keep = torch.ones(weight.numel(), dtype=torch.bool, device=weight.device)
    keep[order[:drop]] = False
    return keep.reshape(weight.shape)


class _SparseLinear(nn.Module):
    """A bias-free linear layer whose weight is a torch sparse tensor (CSR or 2:4)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)


def _csr_index_bytes(w: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in (w.crow_indices(), w.col_indices()))


def _semi_structured_index_bytes(w: torch.Tensor) -> int:  # pragma: no cover - CUDA only
    meta = getattr(w, "meta", None)
    return 0 if meta is None else int(meta.numel() * meta.element_size())


def sparsify_weights(model: ReferenceModel, sparsity: Sparsity) -> SparsityStats:
    """Prune every block's linear weights by magnitude and swap in sparse kernels, in place.

    Never a silent dense fallback: ValueError (one line, with what to use instead) where
    torch cannot run the format here: 2:4 off CUDA; CSR matmuls off float32 on CPU.
    """
    linears = [
        (block, name, child)
        for block in model.blocks
        for name, child in block.named_children()
        if isinstance(child, nn.Linear)
    ]
    params = sum(c.weight.numel() for _, _, c in linears)
    if sparsity.kind == "none":
        return SparsityStats(params, params, 0)
    dev = model.device
    if sparsity.kind == "2:4":
        if dev.type != "cuda":
            raise ValueError(
                f"sparsity=2:4 runs only on CUDA (torch.sparse.to_sparse_semi_structured needs an "
                f"NVIDIA GPU with compute capability 8.0+), this engine is on {dev.type}: use "
                "sparsity=unstructured:0.5 (CSR) or none"
            )
        if model.cfg.dtype == "float32":
            raise ValueError(
                "sparsity=2:4 needs --dtype bfloat16 or float16 (semi-structured float32 is not "
                "supported by torch's CUTLASS/cuSPARSELt kernels)"
            )
    elif dev.type == "cpu" and model.cfg.dtype != "float32":
        raise ValueError(
            f"sparsity=unstructured on cpu runs in float32 only (torch's CSR matmul has no "
            f"{model.cfg.dtype} CPU kernel): use --dtype float32"
        )
    nonzeros = index_bytes = 0
    for block, name, child in linears:
        with torch.no_grad():
            w = child.weight.detach() * magnitude_mask(child.weight, sparsity)
        nonzeros += int(torch.count_nonzero(w))
        sw: torch.Tensor
        if sparsity.kind == "2:4":  # pragma: no cover - CUDA only
            from torch.sparse import to_sparse_semi_structured

            sw = to_sparse_semi_structured(w)
            index_bytes += _semi_structured_index_bytes(sw)
        else:
            import warnings

            with warnings.catch_warnings():  # "sparse CSR support is in beta state"
                warnings.simplefilter("ignore", UserWarning)
                sw = w.to_sparse_csr()
            index_bytes += _csr_index_bytes(sw)
        setattr(block, name, _SparseLinear(sw))
    return SparsityStats(params, nonzeros, index_bytes)
