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
    "PRESETS",
    "QUANT_MODES",
    "KVCache",
    "ReferenceConfig",
    "ReferenceModel",
    "quantize_weights",
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

    def __post_init__(self) -> None:
        for name in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {self.vocab_size}")
        if self.hidden_size % self.n_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by n_heads {self.n_heads}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}"
            )
        if (self.hidden_size // self.n_heads) % 2:
            raise ValueError("head_dim (hidden_size / n_heads) must be even for RoPE")
        torch_dtype(self.dtype)

    @property
    def head_dim(self) -> int:
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


class KVCache:
    """Per-layer K and V tensors ``[slots, n_kv_heads, max_len, head_dim]``.

    Active sequences occupy slots ``0..n-1`` contiguously so a decode step can read a view
    of the first ``n`` slots without gathering; :meth:`move` compacts after a sequence leaves.
    """

    def __init__(
        self, cfg: ReferenceConfig, slots: int, max_len: int, device: torch.device
    ) -> None:
        shape = (slots, cfg.n_kv_heads, max_len, cfg.head_dim)
        dt = torch_dtype(cfg.dtype)
        self.k = [torch.zeros(shape, dtype=dt, device=device) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=dt, device=device) for _ in range(cfg.n_layers)]
        self.slots = slots
        self.max_len = max_len

    @property
    def nbytes(self) -> int:
        """Memory held by the cache in bytes."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def view(self, start: int, n: int) -> KVCache:
        """Slots ``start..start+n-1`` as a cache of ``n`` slots sharing this one's storage."""
        out = object.__new__(KVCache)
        out.k = [t[start : start + n] for t in self.k]
        out.v = [t[start : start + n] for t in self.v]
        out.slots, out.max_len = n, self.max_len
        return out

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst``."""
        if src == dst or length <= 0:
            return
        for t in (*self.k, *self.v):
            t[dst, :, :length].copy_(t[src, :, :length])


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
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
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


class ReferenceModel(nn.Module):
    """The reference decoder. Build with :meth:`build` to get seeded random weights."""

    def __init__(self, cfg: ReferenceConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.norm = _RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        self._inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
        )

    @classmethod
    def build(
        cls, cfg: ReferenceConfig, *, seed: int = 0, device: str | torch.device = "cpu"
    ) -> ReferenceModel:
        """Random weights (normal, std 0.02; norms at 1) drawn from ``seed``, on ``device``."""
        gen = torch.Generator().manual_seed(seed)
        with torch.device("meta"):
            model = cls(cfg)
        model = model.to_empty(device="cpu")
        if cfg.tied_embeddings:
            model.lm_head.weight = model.embed.weight  # to_empty() does not keep the tie
        for name, p in model.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        model._inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
        )
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

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        """An empty cache for ``slots`` concurrent sequences of up to ``max_len`` tokens."""
        return KVCache(self.cfg, slots, max_len, self.device)

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
