"""Attention-head pruning of the reference model by a stated importance score.

Importance of head ``h`` in layer ``l`` (:func:`head_importance`): the mean L2 norm of what
the head adds to the residual stream, ``|| W_o[:, h] @ o_h ||`` (``o_h`` the head's attention
output at one position, ``W_o[:, h]`` its slice of the output projection), averaged over every
position of :data:`SCORE_SEQUENCES` sequences of the synthetic training corpus
(:func:`~perfscope.profiler.engines.reference.train.corpus`, seed :data:`SCORE_SEED`, apart
from the training and the held-out quality seeds). It combines the activation size and the
output projection's weight, so a head that is active but projected away scores low too.

:func:`prune_heads` removes the ``remove`` lowest-scoring query heads of *every* layer (the
config is uniform across layers), without fine-tuning:

- MHA (``n_kv_heads == n_heads``): a pruned head's query, key and value rows and its output
  columns go, so the KV cache loses that head too;
- GQA/MQA: the same number of query heads is removed from every KV group (the lowest-scoring
  within each group), so the groups stay equal and the KV heads stay; ``remove`` must then be
  a multiple of ``n_kv_heads``.

Heads keep their width (``head_dim_override`` of the new config), so the matmuls really shrink:
``wq``/``wo`` by ``remove / n_heads``, attention FLOPs likewise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from perfscope.profiler.engines.reference.model import ReferenceModel

__all__ = ["SCORE_SEED", "SCORE_SEQUENCES", "HeadPruning", "head_importance", "prune_heads"]

#: Corpus sequences the importance score averages over, and their seed.
SCORE_SEQUENCES = 32
SCORE_SEED = 777


@dataclass(frozen=True)
class HeadPruning:
    """What :func:`prune_heads` did.

    Attributes:
        removed: per layer, the original indices of the query heads removed.
        scores: per layer, every head's importance (mean residual-stream norm it adds).
        heads_before: query heads per layer before pruning.
        heads_after: query heads per layer after.
        kv_heads_after: KV heads per layer after.
    """

    removed: tuple[tuple[int, ...], ...]
    scores: tuple[tuple[float, ...], ...]
    heads_before: int
    heads_after: int
    kv_heads_after: int


@torch.no_grad()
def head_importance(model: ReferenceModel, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """``[n_layers, n_heads]`` importance (module doc) of every head on ``tokens`` ``[B, T]``
    (default: the corpus sequences the module doc names)."""
    from perfscope.profiler.engines.reference.train import corpus, forward_all

    if tokens is None:
        tokens = corpus(SCORE_SEQUENCES, 32, 48, SCORE_SEED)
    cfg = model.cfg
    hd = cfg.head_dim
    scores = torch.zeros(cfg.n_layers, cfg.n_heads, dtype=torch.float64)
    hooks = []
    for i, block in enumerate(model.blocks):
        wo: nn.Linear = block.wo  # type: ignore[assignment]

        def hook(
            _mod: nn.Module, args: tuple[torch.Tensor, ...], i: int = i, wo: nn.Linear = wo
        ) -> None:
            x = args[0].float()  # [B, T, H * hd]
            w = wo.weight.float()  # [d, H * hd]
            for h in range(cfg.n_heads):
                part = x[..., h * hd : (h + 1) * hd] @ w[:, h * hd : (h + 1) * hd].T
                scores[i, h] += float(part.norm(dim=-1).mean())

        hooks.append(wo.register_forward_pre_hook(hook))
    try:
        forward_all(model, tokens.to(model.device))
    finally:
        for handle in hooks:
            handle.remove()
    return scores


def _keep(scores: torch.Tensor, remove: int, n_kv: int) -> list[list[int]]:
    """Per layer, the query heads kept (sorted), removing the lowest ``remove`` scores
    (per KV group when grouped)."""
    n_layers, n_heads = scores.shape
    g = n_heads // n_kv
    out = []
    for layer in range(n_layers):
        s = scores[layer]
        if g == 1:
            drop = set(torch.argsort(s, stable=True)[:remove].tolist())
        else:
            per = remove // n_kv
            drop = set()
            for grp in range(n_kv):
                heads = torch.arange(grp * g, (grp + 1) * g)
                drop |= set(heads[torch.argsort(s[heads], stable=True)[:per]].tolist())
        out.append([h for h in range(n_heads) if h not in drop])
    return out


def _rows(linear: nn.Linear, heads: list[int], hd: int, dim: int) -> nn.Linear:
    """A copy of ``linear`` keeping ``heads`` (slices of ``hd``) along ``dim`` of its weight
    (0: output rows, 1: input columns)."""
    idx = torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in heads]).to(linear.weight.device)
    w = linear.weight.detach().index_select(dim, idx).clone()
    out = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w)
    return out


@torch.no_grad()
def prune_heads(
    model: ReferenceModel, remove: int, scores: torch.Tensor | None = None
) -> HeadPruning:
    """Remove the ``remove`` least important query heads of every layer, in place (module
    doc); ``model.cfg`` becomes the pruned shape. ValueError (with the rule) when ``remove``
    leaves no head or does not divide evenly over the KV groups."""
    cfg = model.cfg
    n_heads, n_kv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    mha = n_kv == n_heads
    if not 0 <= remove < n_heads:
        raise ValueError(
            f"prune_heads={remove}: remove between 0 and {n_heads - 1} of the {n_heads} heads"
        )
    if not mha and remove % n_kv:
        raise ValueError(
            f"prune_heads={remove}: with {n_kv} KV groups (GQA) the same number of query heads "
            f"goes from each group, so remove a multiple of {n_kv}"
        )
    if scores is None:
        scores = head_importance(model)
    if remove == 0:
        return HeadPruning((), tuple(tuple(map(float, s)) for s in scores), n_heads, n_heads, n_kv)
    keep = _keep(scores, remove, n_kv)
    sliced = {"wq": 0, "wo": 1, **({"wk": 0, "wv": 0} if mha else {})}
    for block, heads in zip(model.blocks, keep, strict=True):
        for name, dim in sliced.items():
            linear = getattr(block, name)
            assert isinstance(linear, nn.Linear)
            setattr(block, name, _rows(linear, heads, hd, dim))
        setattr(block, "n_heads", len(heads))  # noqa: B010 (a plain int attribute of _Block)
        if mha:
            setattr(block, "n_kv_heads", len(heads))  # noqa: B010
    after = n_heads - remove
    model.cfg = cfg.with_overrides(
        n_heads=after, n_kv_heads=after if mha else n_kv, head_dim_override=hd
    )
    removed = tuple(tuple(h for h in range(n_heads) if h not in set(k)) for k in keep)
    return HeadPruning(
        removed,
        tuple(tuple(map(float, s)) for s in scores),
        n_heads,
        after,
        model.cfg.n_kv_heads,
    )
