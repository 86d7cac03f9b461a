"""One forward pass over decode rows and prompt chunks together (chunked prefill, prefix reuse).

A serving engine with a token budget per step (vLLM's ``max_num_batched_tokens``) runs the
running batch's decode tokens and chunks of pending prompts in one pass: the weight GEMMs
see every token of the step at once (one read of the weights), attention runs per
sequence. :func:`packed_forward` does that on a :class:`ReferenceModel` without changing
it: the tokens of a step are packed into one ``[N, d]`` matrix for the norms, projections
and MLP; decode rows attend as :meth:`ReferenceModel.decode` does (slots ``0..R-1``), and
each chunk attends over its own slot's cache ``[0, start + q)`` with a causal mask offset
by ``start`` (the positions before ``start`` are already in the cache: earlier chunks, or a
reused prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from perfscope.profiler.engines.reference.model import KVCache, ReferenceModel, _Block, _rope

__all__ = ["Chunk", "packed_forward"]


@dataclass(frozen=True)
class Chunk:
    """Prompt tokens ``ids`` (1-D long tensor) for cache ``slot`` at positions
    ``start .. start + len(ids) - 1``; ``logits``: return the last token's logits (the chunk
    completes its prompt)."""

    slot: int
    start: int
    ids: torch.Tensor
    logits: bool


@torch.no_grad()
def packed_forward(
    model: ReferenceModel,
    cache: KVCache,
    dec_tokens: torch.Tensor,
    dec_lengths: torch.Tensor,
    chunks: list[Chunk],
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """Run decode rows (``dec_tokens`` [R] for slots ``0..R-1`` holding ``dec_lengths`` [R]
    cached entries; R may be 0) and ``chunks`` in one pass, writing their K/V into ``cache``.

    Returns the decode rows' logits [R, V] (None when R = 0) and the last-token logits [V]
    of each chunk with ``logits`` set, in order.
    """
    dev = model.device
    r = int(dec_tokens.shape[0])
    ids = [dec_tokens.to(dev)] + [c.ids.to(dev) for c in chunks]
    tokens = torch.cat(ids)
    pos_parts = [dec_lengths.to(dev)] + [
        torch.arange(c.start, c.start + len(c.ids), device=dev) for c in chunks
    ]
    positions = torch.cat(pos_parts)
    slot_parts = [torch.arange(r, device=dev)] + [
        torch.full((len(c.ids),), c.slot, dtype=torch.long, device=dev) for c in chunks
    ]
    slots = torch.cat(slot_parts)
    n = int(tokens.shape[0])
    cos, sin = model._rope_tables(positions.view(1, n))
    x = model.embed(tokens)  # [N, d]
    cfg = model.cfg
    g = cfg.n_heads // cfg.n_kv_heads
    hd = cfg.head_dim
    # Masks are the same in every layer.
    dec_mask = None
    dec_span = 0
    if r:
        dec_span = int(dec_lengths.max().item()) + 1
        idx = torch.arange(dec_span, device=dev).view(1, dec_span)
        dec_mask = (idx > dec_lengths.to(dev).view(r, 1)).view(r, 1, 1, dec_span)
    chunk_masks = []
    for c in chunks:
        q = len(c.ids)
        span = c.start + q
        causal = torch.arange(span, device=dev).view(1, span) > (
            c.start + torch.arange(q, device=dev)
        ).view(q, 1)
        chunk_masks.append(causal.repeat(g, 1).view(1, 1, g * q, span))
    for li, block in enumerate(model.blocks):
        assert isinstance(block, _Block)
        ck, cv = cache.k[li], cache.v[li]
        h = block.attn_norm(x)
        qh = block.wq(h).view(1, n, cfg.n_heads, hd)
        kh = block.wk(h).view(1, n, cfg.n_kv_heads, hd)
        vh = block.wv(h).view(n, cfg.n_kv_heads, hd)
        qh = _rope(qh, cos, sin).view(n, cfg.n_heads, hd)
        kh = _rope(kh, cos, sin).view(n, cfg.n_kv_heads, hd)
        ck[slots, :, positions] = kh
        cv[slots, :, positions] = vh
        outs = []
        if r:
            qg = qh[:r].view(r, cfg.n_kv_heads, g, hd)
            assert dec_mask is not None
            o = block._attention(qg, ck[:r, :, :dec_span], cv[:r, :, :dec_span], dec_mask)
            outs.append(o.reshape(r, cfg.n_heads * hd))
        at = r
        for c, mask in zip(chunks, chunk_masks, strict=True):
            q = len(c.ids)
            span = c.start + q
            qc = qh[at : at + q].view(1, q, cfg.n_kv_heads, g, hd).permute(0, 2, 3, 1, 4)
            qc = qc.reshape(1, cfg.n_kv_heads, g * q, hd)
            o = block._attention(
                qc, ck[c.slot : c.slot + 1, :, :span], cv[c.slot : c.slot + 1, :, :span], mask
            )
            o = o.view(1, cfg.n_kv_heads, g, q, hd).permute(0, 3, 1, 2, 4)
            outs.append(o.reshape(q, cfg.n_heads * hd))
            at += q
        x = x + block.wo(torch.cat(outs))
        h = block.mlp_norm(x)
        x = x + block.w_down(nn.functional.silu(block.w_gate(h)) * block.w_up(h))
    rows = list(range(r))
    at = r
    for c in chunks:
        at += len(c.ids)
        if c.logits:
            rows.append(at - 1)
    if not rows:
        return None, []
    logits: torch.Tensor = model.lm_head(model.norm(x[torch.tensor(rows, device=dev)]))
    return (logits[:r] if r else None), list(logits[r:])
