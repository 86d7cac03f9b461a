"""A paged KV cache for the reference engine: fixed-size blocks, a block table, a budget.

The contiguous :class:`~perfscope.profiler.engines.reference.model.KVCache` reserves
``max_seq_len`` positions for every slot up front, so a memory budget of ``M`` bytes holds
``M / (max_seq_len x bytes per token)`` sequences whatever their real length. The paged
cache (PagedAttention's layout, as in vLLM) holds one pool per layer of ``n_blocks`` blocks of
``block_tokens`` positions, ``[n_blocks, n_kv_heads, block_tokens, head_dim]``, and a block
table ``[slots, max_blocks]`` mapping each slot's logical block ``j`` to a physical block.
A request is admitted when the free blocks cover its prompt plus its maximum output
(reserved at admission, never preempted: vLLM allocates block by block and preempts
instead), and its blocks return to the free list when it finishes; only the last block of a
sequence is partly empty, so the waste is under one block per sequence.

Reads gather a sequence's blocks into a contiguous ``[B, n_kv_heads, span, head_dim]`` copy
before attention (the eager reference has no paged attention kernel): that gather is the
price paid here per layer and step, and the study measures it. Writes scatter into the pool.
Each layer's store is indexed like the dense tensor it replaces (``c[rows, :, positions] = x``
and ``c[:b, :, :span]``), so the model's blocks run unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from perfscope.profiler.engines.reference.model import KVCache, ReferenceConfig, torch_dtype

__all__ = ["DEFAULT_BLOCK_TOKENS", "PagedKVCache", "PagedLayer", "PagedPlan", "plan_paged"]

#: Positions per block (vLLM's default block size).
DEFAULT_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class PagedPlan:
    """How a KV budget is spent, paged or contiguous.

    Attributes:
        budget_bytes: the KV-cache budget.
        bytes_per_token: K and V of one position over every layer.
        block_tokens: positions per block (paged).
        n_blocks: blocks the budget holds (paged).
        contiguous_slots: sequences of ``max_seq_len`` the budget holds contiguously.
    """

    budget_bytes: int
    bytes_per_token: int
    block_tokens: int
    n_blocks: int
    contiguous_slots: int

    @property
    def block_bytes(self) -> int:
        return self.bytes_per_token * self.block_tokens

    def blocks_for(self, tokens: int) -> int:
        """Blocks a sequence of ``tokens`` positions occupies."""
        return math.ceil(tokens / self.block_tokens)


def plan_paged(
    cfg: ReferenceConfig, budget_bytes: int, max_seq_len: int, block_tokens: int
) -> PagedPlan:
    """The blocks (and contiguous slots) ``budget_bytes`` of KV cache hold for ``cfg``."""
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * torch_dtype(cfg.dtype).itemsize
    return PagedPlan(
        budget_bytes,
        per_token,
        block_tokens,
        budget_bytes // (per_token * block_tokens),
        budget_bytes // (per_token * max_seq_len),
    )


class PagedLayer:
    """One layer's K (or V) pool ``[n_blocks, n_kv_heads, block_tokens, head_dim]``, read
    and written through a block table ``[slots, max_blocks]`` (row offset ``start``)."""

    def __init__(self, pool: torch.Tensor, table: torch.Tensor, block_tokens: int) -> None:
        self.pool = pool
        self.table = table
        self.block_tokens = block_tokens

    @property
    def nbytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()

    def __setitem__(self, idx: tuple[torch.Tensor, slice, torch.Tensor], x: torch.Tensor) -> None:
        """``c[rows, :, positions] = x``: rows, positions ``[B, T]``; x ``[B, T, kvH, hd]``."""
        rows, _, positions = idx
        blocks = self.table[rows, positions // self.block_tokens]
        self.pool[blocks, :, positions % self.block_tokens] = x.to(self.pool.dtype)

    def __getitem__(self, idx: tuple[slice, slice, slice]) -> torch.Tensor:
        """``c[:b, :, :span]``: the first ``b`` rows' first ``span`` positions, gathered
        into ``[b, kvH, span, hd]``."""
        rows, _, span_sl = idx
        b = rows.stop if rows.stop is not None else self.table.shape[0]
        span = span_sl.stop
        nb = math.ceil(span / self.block_tokens)
        blocks = self.table[:b, :nb]  # [b, nb]
        g = self.pool[blocks]  # [b, nb, kvH, bt, hd]
        bsz, _, kvh, bt, hd = g.shape
        out = g.permute(0, 2, 1, 3, 4).reshape(bsz, kvh, nb * bt, hd)
        return out[:, :, :span]


class PagedKVCache(KVCache):
    """A :class:`KVCache` whose layers are :class:`PagedLayer` pools sharing one block table.

    Slots follow the engine's contiguous-slot discipline (decoding sequences in ``0..n-1``);
    :meth:`move` moves a block-table row instead of copying K/V, :meth:`allocate` and
    :meth:`release` take and return blocks. Block 0 is never handed out: unused table entries
    point at it, so reads of padding positions (masked out) stay in bounds.
    """

    def __init__(
        self,
        cfg: ReferenceConfig,
        slots: int,
        max_len: int,
        n_blocks: int,
        block_tokens: int,
        device: torch.device,
    ) -> None:
        dt = torch_dtype(cfg.dtype)
        shape = (n_blocks + 1, cfg.n_kv_heads, block_tokens, cfg.head_dim)
        self.max_blocks = math.ceil(max_len / block_tokens)
        self.table = torch.zeros(slots, self.max_blocks, dtype=torch.long, device=device)
        self.pages_k = [
            PagedLayer(torch.zeros(shape, dtype=dt, device=device), self.table, block_tokens)
            for _ in range(cfg.n_layers)
        ]
        self.pages_v = [
            PagedLayer(torch.zeros(shape, dtype=dt, device=device), self.table, block_tokens)
            for _ in range(cfg.n_layers)
        ]
        # The model's blocks index these like dense tensors (module doc).
        self.k = list[Any](self.pages_k)
        self.v = list[Any](self.pages_v)
        self.kv_dtype = "auto"
        self.slots = slots
        self.max_len = max_len
        self.block_tokens = block_tokens
        self.n_blocks = n_blocks
        self.free: list[int] = list(range(n_blocks, 0, -1))
        self.owned: list[list[int]] = [[] for _ in range(slots)]
        #: Most blocks in use at once over the cache's life.
        self.peak_blocks = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the pools (the block table is not counted)."""
        return sum(t.nbytes for t in (*self.pages_k, *self.pages_v))

    @property
    def used_blocks(self) -> int:
        return self.n_blocks - len(self.free)

    def can_allocate(self, tokens: int) -> bool:
        return math.ceil(tokens / self.block_tokens) <= len(self.free)

    def allocate(self, slot: int, tokens: int) -> None:
        """Give ``slot`` (emptied first) the blocks for ``tokens`` positions; ValueError
        when too few are free."""
        self.release(slot)
        need = math.ceil(tokens / self.block_tokens)
        if need > len(self.free):
            raise ValueError(f"{need} KV blocks needed, {len(self.free)} free")
        if need > self.max_blocks:
            raise ValueError(f"{tokens} tokens exceed the cache's {self.max_len} per sequence")
        got = [self.free.pop() for _ in range(need)]
        self.owned[slot] = got
        self.table[slot].zero_()
        self.table[slot, :need] = torch.tensor(got, dtype=torch.long)
        self.peak_blocks = max(self.peak_blocks, self.used_blocks)

    def release(self, slot: int) -> None:
        """Return ``slot``'s blocks to the free list."""
        self.free.extend(reversed(self.owned[slot]))
        self.owned[slot] = []
        self.table[slot].zero_()

    def view(self, start: int, n: int) -> KVCache:
        """Slots ``start..start+n-1`` (for prefill), sharing pools and block table rows."""
        out = object.__new__(KVCache)
        rows = self.table[start : start + n]
        out.k = list[Any](PagedLayer(t.pool, rows, self.block_tokens) for t in self.pages_k)
        out.v = list[Any](PagedLayer(t.pool, rows, self.block_tokens) for t in self.pages_v)
        out.kv_dtype = "auto"
        out.slots, out.max_len = n, self.max_len
        return out

    def move(self, src: int, dst: int, length: int) -> None:
        """Slot ``src``'s sequence becomes slot ``dst``'s (``dst``'s blocks are released):
        a block-table row moves, no K/V is copied."""
        if src == dst:
            return
        self.release(dst)
        self.owned[dst], self.owned[src] = self.owned[src], []
        self.table[dst] = self.table[src]
        self.table[src].zero_()
