"""Medusa-style decoding heads: ``K`` extra heads on the final hidden state propose tokens
``t+2..t+K+1``, one target pass verifies them (Cai et al. 2024, "Medusa: Simple LLM
Inference Acceleration Framework with Multiple Decoding Heads").

Head ``k`` (0-based) maps the normed final hidden state ``h`` at position ``p`` (whose
next-token logits are ``lm_head(h)``, the token at ``p + 1``) to the token at ``p + 2 + k``:
``lm_head(h + SiLU(W_k h))``, Medusa's residual block with the base model's frozen
``lm_head`` (``W_k`` starts at zero, so an untrained head repeats the next-token guess).
Training fits only the ``W_k`` (``K`` matrices of ``hidden x hidden``) on the synthetic
corpus the base model was trained on (:mod:`~perfscope.profiler.engines.reference.train`),
cached beside the trained weights as ``medusa-<hash>.pt``.

A step: the heads' proposals from the hidden state of the last accepted position, one
target pass over ``x, d1..dK``
(:func:`~perfscope.profiler.engines.reference.speculative.verify_proposals`), greedy
acceptance, then the heads on the hidden state at the accepted position for the next step
(timed inside the verify step: its FLOPs are not in the roofline's cost of that step).
The hidden states are read by a forward hook on the model's final norm, so the engine's
prefill and the verify pass need no second output.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from perfscope.profiler.engines.reference.model import KVCache, ReferenceModel
from perfscope.profiler.engines.reference.speculative import Verified, verify_proposals
from perfscope.profiler.engines.reference.train import cache_dir, corpus, forward_all
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.store import write_stream_atomic

__all__ = ["HeadsConfig", "Medusa", "MedusaHeads", "train_heads"]


class MedusaHeads(nn.Module):
    """``K`` residual heads ``h -> h + SiLU(W_k h)`` sharing the base model's lm_head."""

    def __init__(self, hidden: int, k: int) -> None:
        super().__init__()
        self.w = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(k))
        for lin in self.w:
            nn.init.zeros_(lin.weight)  # type: ignore[arg-type]

    def forward(self, h: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits ``[..., K, V]`` of the tokens at ``p + 2 .. p + K + 1`` from ``h`` [..., D]."""
        outs = [lm_head(h + nn.functional.silu(lin(h))) for lin in self.w]
        return torch.stack(outs, dim=-2)


@dataclass(frozen=True)
class HeadsConfig:
    """How the heads are trained (on the base model's corpus; seconds on a CPU core).

    Attributes:
        k: heads.
        steps: optimiser steps (AdamW), batch ``batch`` sequences of ``seq_len`` tokens,
            drawn from ``sequences`` corpus sequences.
        lr: learning rate (constant).
        alphabet: the corpus alphabet (as :class:`~perfscope.profiler.engines.reference.
            train.TrainConfig`).
        seed: corpus seed.
    """

    k: int = 4
    steps: int = 400
    batch: int = 32
    sequences: int = 256
    seq_len: int = 32
    lr: float = 1e-2
    alphabet: int = 48
    seed: int = 1


def _norm_hook(model: ReferenceModel, store: list[torch.Tensor]) -> Any:
    def hook(_m: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        store[:] = [out]

    return model.norm.register_forward_hook(hook)


def train_heads(
    model: ReferenceModel, weights: str | None, cfg: HeadsConfig, *, cache: bool = True
) -> MedusaHeads:
    """Heads for ``model`` (float32 training, then the model's dtype), trained on the corpus
    and cached by ``weights``' content and ``cfg``; zero (untrained) heads without weights."""
    d = model.cfg.hidden_size
    heads = MedusaHeads(d, cfg.k).to(model.device)
    if not weights:
        return heads.to(next(model.parameters()).dtype)
    digest = hashlib.sha256(Path(weights).read_bytes()).hexdigest()[:16]
    key = json.dumps({"base": digest, **asdict(cfg), "torch": torch.__version__}, sort_keys=True)
    path = cache_dir() / f"medusa-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    if cache and path.exists():
        heads.load_state_dict(torch.load(path, map_location=model.device, weights_only=True))
        return heads.to(next(model.parameters()).dtype)
    t0 = time.perf_counter()
    store: list[torch.Tensor] = []
    handle = _norm_hook(model, store)
    data = corpus(cfg.sequences, cfg.seq_len, cfg.alphabet, cfg.seed).to(model.device)
    try:
        with torch.no_grad():  # the base is frozen: its hidden states once, in chunks
            chunks = []
            for i in range(0, len(data), 64):
                forward_all(model, data[i : i + 64])
                chunks.append(store[0].float())
    finally:
        handle.remove()
    hidden = torch.cat(chunks)
    # Logits over the corpus's tokens only (ids 0..alphabet): the loss a full-vocabulary
    # softmax gives, at a 20th of its cost, as the base already ranks other ids low.
    vocab = model.lm_head.weight[: cfg.alphabet + 1].detach().float()
    heads.float()
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(cfg.seed)
    loss = torch.tensor(math.nan)
    for _ in range(cfg.steps):
        idx = torch.randint(len(data), (cfg.batch,), generator=g).to(model.device)
        logits = heads(hidden[idx], lambda z: nn.functional.linear(z, vocab))
        batch = data[idx]
        losses = [
            nn.functional.cross_entropy(
                logits[:, : cfg.seq_len - 2 - k, k].reshape(-1, logits.shape[-1]),
                batch[:, 2 + k :].reshape(-1),
            )
            for k in range(cfg.k)
        ]
        loss = torch.stack(losses).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    state = heads.state_dict()
    write_stream_atomic(path, lambda f: torch.save(state, f))
    path.with_suffix(".json").write_text(
        json.dumps(
            {
                "config": asdict(cfg),
                "base_weights": weights,
                "final_loss": float(loss.item()),
                "seconds": time.perf_counter() - t0,
            }
        )
    )
    return heads.to(next(model.parameters()).dtype)


class Medusa:
    """The heads, a hook on the target's final norm and each sequence's next proposals.

    Attributes:
        k: heads (tokens proposed per sequence and step).
    """

    def __init__(self, model: ReferenceModel, heads: MedusaHeads, sync: Callable[[], None]):
        self.k = len(heads.w)
        self.model = model
        self.heads = heads
        self._sync = sync
        self._hidden: list[torch.Tensor] = []
        self._hook = _norm_hook(model, self._hidden)
        self._next: dict[int, list[int]] = {}

    @torch.no_grad()
    def _propose(self, h: torch.Tensor) -> list[list[int]]:
        out: list[list[int]] = self.heads(h, self.model.lm_head).argmax(-1).tolist()
        return out

    def prefill(
        self, tokens: torch.Tensor, start: int, request_ids: Sequence[int], recorder: Recorder
    ) -> None:
        """Proposals from the prompt group's last hidden state (the engine's prefill just
        ran; no pass of its own)."""
        props = self._propose(self._hidden[0])
        for rid, p in zip(request_ids, props, strict=True):
            self._next[rid] = p

    def move(self, src: int, dst: int, length: int) -> None:
        """Nothing per slot: proposals are kept by request id."""

    def forget(self, request_id: int) -> None:
        self._next.pop(request_id, None)

    def close(self) -> None:
        self._hook.remove()

    def step(
        self,
        target: ReferenceModel,
        target_cache: KVCache,
        request_ids: Sequence[int],
        lengths: Sequence[int],
        next_tokens: Sequence[int],
        live: Sequence[bool],
        recorder: Recorder,
        device: torch.device,
    ) -> tuple[list[Verified], int]:
        """Verify the heads' proposals in one target pass; then propose the next ones from
        the hidden state at each row's accepted position."""
        rids = list(request_ids)
        rows = [
            self._next.get(r) or [int(x)] * self.k for r, x in zip(rids, next_tokens, strict=True)
        ]
        proposals = torch.tensor(rows, dtype=torch.long, device=device)

        def next_proposals(out: list[Verified]) -> None:
            hidden = self._hidden[0]  # [B, K + 1, D] of the verify pass
            at = torch.tensor([v.accepted for v in out], device=device)
            props = self._propose(hidden[torch.arange(len(rids), device=device), at])
            for rid, p in zip(rids, props, strict=True):
                self._next[rid] = p

        out, _, t1 = verify_proposals(
            target,
            target_cache,
            rids,
            lengths,
            next_tokens,
            proposals,
            live,
            recorder,
            self._sync,
            after=next_proposals,
        )
        return out, t1
