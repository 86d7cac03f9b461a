"""Block-granular prefix cache of the reference engine (``--engine-opt prefix_cache=on``).

As in vLLM's automatic prefix caching, a prompt is cut into blocks of :data:`BLOCK_TOKENS`
tokens; a full block is identified by a digest of its tokens chained with the digest of the
block before it, so equal digests mean equal prefixes. After a prompt's prefill its full
blocks' K/V are copied into the store; a later prompt that starts with the same blocks gets
their K/V copied into its cache slot and prefills only the rest. At least one prompt token is
always computed (its logits give the first output token), so a prompt that is entirely
cached reuses all but its last block. The store holds at most ``capacity_tokens`` tokens and
evicts the least recently used block first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import torch

from perfscope.profiler.engines.reference.model import KVCache

__all__ = ["BLOCK_TOKENS", "DEFAULT_CAPACITY_TOKENS", "PrefixCache"]

#: Tokens per cached block (vLLM's default block size).
BLOCK_TOKENS = 16
#: Default bound of the store, in tokens.
DEFAULT_CAPACITY_TOKENS = 16384


def block_keys(ids: Sequence[int], block: int = BLOCK_TOKENS) -> list[bytes]:
    """Chained digests of the full blocks of ``ids`` (a partial last block has none)."""
    keys: list[bytes] = []
    parent = b""
    for i in range(len(ids) // block):
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(b",".join(str(t).encode() for t in ids[i * block : (i + 1) * block]))
        parent = h.digest()
        keys.append(parent)
    return keys


class PrefixCache:
    """K/V of prompt blocks seen before, LRU-bounded in tokens.

    Each entry is one tensor ``[n_layers, 2, n_kv_heads, BLOCK_TOKENS, head_dim]`` (K then
    V) in the model dtype, a copy, so cache slots can be reused freely (with a quantised KV
    cache the entries are the dequantised values; writing them back re-quantises exactly).
    """

    def __init__(self, capacity_tokens: int = DEFAULT_CAPACITY_TOKENS) -> None:
        self.capacity_tokens = capacity_tokens
        self.block = BLOCK_TOKENS
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        #: Blocks dropped to stay within the bound, over the cache's life.
        self.evicted_blocks = 0

    @property
    def tokens(self) -> int:
        """Tokens held now."""
        return len(self._blocks) * self.block

    def match(self, ids: Sequence[int]) -> list[bytes]:
        """Keys of the longest cached run of leading blocks of ``ids`` that leaves at least one
        token to compute; marks them recently used."""
        usable = (len(ids) - 1) // self.block
        out: list[bytes] = []
        for key in block_keys(ids[: usable * self.block], self.block):
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            out.append(key)
        return out

    def load(self, keys: Sequence[bytes], cache: KVCache, slot: int) -> int:
        """Copy the blocks ``keys`` into positions ``0 ..`` of ``slot``; returns tokens."""
        if not keys:
            return 0
        kv = torch.cat([self._blocks[k] for k in keys], dim=3)  # [L, 2, kvH, T, hd]
        t = kv.shape[3]
        for layer in range(len(cache.k)):
            # Assignment, not copy_: a quantised KV store (kv_dtype int8/fp8) quantises on write.
            cache.k[layer][slot, :, :t] = kv[layer, 0]
            cache.v[layer][slot, :, :t] = kv[layer, 1]
        return int(t)

    def store(self, ids: Sequence[int], cache: KVCache, slot: int) -> None:
        """Keep the full blocks of prompt ``ids`` whose K/V are now in ``slot``."""
        for i, key in enumerate(block_keys(ids, self.block)):
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            a, b = i * self.block, (i + 1) * self.block
            entry = torch.stack(
                [
                    torch.stack((cache.k[layer][slot, :, a:b], cache.v[layer][slot, :, a:b]))
                    for layer in range(len(cache.k))
                ]
            ).clone()
            self._blocks[key] = entry
        while self.tokens > self.capacity_tokens and self._blocks:
            self._blocks.popitem(last=False)
            self.evicted_blocks += 1
