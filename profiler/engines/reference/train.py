"""Fit a small reference model to a synthetic structured corpus, so quality is measurable.

Random weights make quantisation error, pruning and distillation quality meaningless. This
module trains a :class:`ReferenceModel` on a corpus with structure a small transformer
learns within a minute on two CPU cores, and caches the weights per configuration:

- *strides*: ``start, start+s, start+2s, ...`` modulo an alphabet of ``alphabet`` tokens
  (the stride ``s`` is drawn per sequence from a few values, so the model must read it
  from the context);
- *motifs*: a random motif of 3 to 8 tokens repeated to the end (copying, as induction
  heads do).

Token ids start at 1 (0 is the end-of-sequence token). :func:`quality` compares a
candidate model to a reference on held-out sequences: top-1 agreement of the next-token
predictions and both perplexities (so quantisation, pruning or a smaller student can be
judged against the fp32 teacher).

The cached file is ``$PERFSCOPE_CACHE_DIR/models/reference-<hash>.pt`` (default
``~/.cache/perfscope``); pass it to the engine as ``--engine-opt weights=PATH``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from perfscope.profiler.engines.reference.model import (
    PRESETS,
    KVCache,
    ReferenceConfig,
    ReferenceModel,
)
from perfscope.profiler.store import write_stream_atomic

__all__ = [
    "EVAL_ALPHABET",
    "EVAL_SEED",
    "EVAL_SEQUENCES",
    "EVAL_SEQ_LEN",
    "TrainConfig",
    "TrainResult",
    "corpus",
    "forward_all",
    "quality",
    "train",
    "trained_weights",
]

_FORMAT = "perfscope.trained/1"

#: The held-out set :func:`quality` evaluates on: sequences, tokens per sequence (each gives
#: ``EVAL_SEQ_LEN - 1`` next-token predictions), its alphabet and the corpus seed (training uses
#: :attr:`TrainConfig.seed`, 0 by default).
EVAL_SEQUENCES = 64
EVAL_ALPHABET = 48
EVAL_SEQ_LEN = 32
EVAL_SEED = 12345


@dataclass(frozen=True)
class TrainConfig:
    """What to train: a preset (plus overrides), the corpus and the optimiser budget.

    Attributes:
        preset: reference model preset (``tiny`` by default).
        overrides: shape fields replaced in the preset (``(("n_layers", 4),)``).
        alphabet: distinct tokens the corpus uses (ids ``1..alphabet``).
        seq_len: tokens per training sequence.
        batch: sequences per optimiser step.
        steps: optimiser steps (AdamW).
        lr: peak learning rate (cosine decay after a short warmup).
        seed: corpus and initialisation seed.
        threads: torch threads while training (1: on a shared 2-core machine more threads
            spin against each other and run several times slower).
    """

    preset: str = "tiny"
    overrides: tuple[tuple[str, int], ...] = ()
    alphabet: int = 48
    seq_len: int = 32
    batch: int = 16
    steps: int = 600
    lr: float = 3e-3
    seed: int = 0
    threads: int = 1

    def model_config(self) -> ReferenceConfig:
        return PRESETS[self.preset].with_overrides(dtype="float32", **dict(self.overrides))

    def key(self) -> str:
        """A short hash of everything that determines the trained weights."""
        text = json.dumps({**asdict(self), "torch": torch.__version__}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TrainResult:
    """A trained model's file and how training went (loss in nats per token, seconds)."""

    path: Path
    config: TrainConfig
    final_loss: float
    seconds: float
    from_cache: bool


def corpus(n: int, seq_len: int, alphabet: int, seed: int) -> torch.Tensor:
    """``n`` sequences ``[n, seq_len]`` of token ids in ``1..alphabet`` (see module doc)."""
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(n, seq_len, dtype=torch.long)
    strides = torch.tensor([1, 2, 3, 5])
    t = torch.arange(seq_len)
    for i in range(n):
        if i % 2 == 0:
            s = strides[torch.randint(len(strides), (1,), generator=g)]
            start = torch.randint(alphabet, (1,), generator=g)
            out[i] = (start + s * t) % alphabet + 1
        else:
            m = int(torch.randint(3, 9, (1,), generator=g))
            motif = torch.randint(alphabet, (m,), generator=g) + 1
            out[i] = motif.repeat(seq_len // m + 1)[:seq_len]
    return out


def forward_all(model: ReferenceModel, tokens: torch.Tensor) -> torch.Tensor:
    """Logits at every position ``[B, T, V]`` (the engine's prefill returns the last only)."""
    b, t = tokens.shape
    cfg = model.cfg
    cache = KVCache(cfg, b, t, tokens.device, getattr(model, "kv_dtype", "auto"))
    positions = torch.arange(t, device=tokens.device).unsqueeze(0).expand(b, t)
    g = cfg.n_heads // cfg.n_kv_heads
    causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).triu(1)
    mask = causal.repeat(g, 1).view(1, 1, g * t, t)
    x = model.embed(tokens)
    cos, sin = model._rope_tables(positions)
    for i, block in enumerate(model.blocks):
        x = block(x, cos, sin, cache.k[i], cache.v[i], positions, t, mask)
    logits: torch.Tensor = model.lm_head(model.norm(x))
    return logits


def cache_dir() -> Path:
    """``$PERFSCOPE_CACHE_DIR/models`` (default ``~/.cache/perfscope/models``)."""
    env = os.environ.get("PERFSCOPE_CACHE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "perfscope"
    return root / "models"


def train(cfg: TrainConfig, *, cache: bool = True) -> TrainResult:
    """Train (or load from the cache) a model for ``cfg``; returns where its weights are."""
    path = cache_dir() / f"reference-{cfg.key()}.pt"
    meta = path.with_suffix(".json")
    if cache and path.exists() and meta.exists():
        info = json.loads(meta.read_text())
        return TrainResult(path, cfg, float(info["final_loss"]), float(info["seconds"]), True)
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, path, meta)
    finally:
        torch.set_num_threads(before)


def _train(cfg: TrainConfig, path: Path, meta: Path) -> TrainResult:
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    mcfg = cfg.model_config()
    model = ReferenceModel.build(mcfg, seed=cfg.seed)
    model.train()
    data = corpus(cfg.batch * 64, cfg.seq_len, cfg.alphabet, cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    warm = max(cfg.steps // 20, 1)
    loss_f = nn.CrossEntropyLoss()
    loss = torch.tensor(math.nan)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    for step in range(cfg.steps):
        lr = cfg.lr * min(1.0, (step + 1) / warm)
        lr *= 0.5 * (1 + math.cos(math.pi * min(step / cfg.steps, 1.0))) if step >= warm else 1.0
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(len(data), (cfg.batch,), generator=g)
        batch = data[idx]
        logits = forward_all(model, batch[:, :-1])
        loss = loss_f(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    write_stream_atomic(path, lambda f: torch.save(state, f))
    meta.write_text(
        json.dumps(
            {
                "format": _FORMAT,
                "config": asdict(cfg),
                "final_loss": float(loss.item()),
                "seconds": seconds,
            }
        )
    )
    return TrainResult(path, cfg, float(loss.item()), seconds, False)


def trained_weights(cfg: TrainConfig | None = None) -> Path:
    """The cached trained weights file for ``cfg`` (default: the tiny preset), training
    them first if needed."""
    return train(cfg or TrainConfig()).path


@torch.no_grad()
def quality(
    reference: ReferenceModel,
    candidate: ReferenceModel,
    *,
    alphabet: int = EVAL_ALPHABET,
    seq_len: int = EVAL_SEQ_LEN,
    n: int = EVAL_SEQUENCES,
    seed: int = EVAL_SEED,
) -> dict[str, float]:
    """Candidate against reference on ``n`` held-out corpus sequences.

    Returns ``top1_agreement`` (fraction of positions where both predict the same next
    token), ``top1_accuracy`` of each against the true next token, and perplexities
    (``exp`` of the mean next-token cross-entropy, nats)."""
    data = corpus(n, seq_len, alphabet, seed)
    x, y = data[:, :-1], data[:, 1:]
    out: dict[str, float] = {}
    preds = []
    for name, m in (("reference", reference), ("candidate", candidate)):
        logits = forward_all(m, x.to(m.device)).float().cpu()
        ce = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        out[f"{name}_perplexity"] = math.exp(float(ce))
        p = logits.argmax(-1)
        out[f"{name}_top1_accuracy"] = float((p == y).float().mean())
        preds.append(p)
    out["top1_agreement"] = float((preds[0] == preds[1]).float().mean())
    return out
