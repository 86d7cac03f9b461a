"""Speculative decoding for the reference engine: a small draft proposes, the target verifies.

Engine options: ``draft=PRESET_OR_PATH`` (a reference preset, or a weights file written by
:mod:`perfscope.profiler.engines.reference.train`, whose ``.json`` beside it names its
shape), ``draft_layers=N`` (the preset with ``N`` blocks: a pruned or smaller student) and
``num_speculative_tokens=K`` (vLLM's name; default 4). The draft must share the target's
vocabulary. With ``weights=trained`` (or a trained target file) a preset draft is trained on
the same corpus too, so that acceptance means something; otherwise it has random weights from
the run's seed (the same shape and seed as the target gives the target itself, a draft that
is always accepted).

One decode step of the running batch (rows of lengths ``L``, next input token ``x``):

1. ``K`` draft forward passes propose ``d1..dK`` greedily. The first pass feeds two tokens
   per row, the one at ``L-1`` and ``x``: after a round where every draft token was accepted
   the draft's cache lacks position ``L-1`` (the target's bonus token came after it), and
   recomputing an entry the cache already holds writes the same values, so every row can take
   the same pass.
2. One target pass over the ``K + 1`` positions ``x, d1..dK`` gives the target's greedy choice
   ``t0..tK`` after each.
3. Greedy acceptance: the longest prefix with ``d_i == t_{i-1}``, say ``n`` tokens, is kept,
   and the target's own ``t_n`` follows it; ``n + 1`` tokens are emitted (cut at the request's
   ``max_output_tokens`` and at EOS when asked).
4. Rollback: both caches are indexed by position and every pass masks keys beyond each row's
   own length, so rolling back is setting the row's length to ``L + n + 1``; the rejected
   entries are overwritten by the next round before any query can see them.

The emitted tokens are exactly the target's greedy output without speculation (up to
floating-point differences between a one-token and a ``K + 1``-token pass, which could only
matter at an exact tie of the top two logits).

Records: every draft pass is a step with ``role="draft"`` (its FLOPs and bytes are the
draft's), the verify pass a ``decode`` step whose ``new_tokens`` are the ``K + 1`` positions
per row with ``proposed_tokens`` and ``accepted_tokens``; the draft's prefill of each prompt
group is a ``prefill`` step with ``role="draft"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from perfscope.errors import UsageError
from perfscope.profiler import nvtx_ranges
from perfscope.profiler.engines.reference.model import (
    PRESETS,
    KVCache,
    ReferenceConfig,
    ReferenceModel,
)
from perfscope.profiler.recorder import Recorder

__all__ = [
    "DEFAULT_SPECULATIVE_TOKENS",
    "DraftSpec",
    "Speculator",
    "Verified",
    "accept_greedy",
    "build_draft",
    "forward_positions",
    "parse_draft",
    "verify_proposals",
]

#: ``num_speculative_tokens`` when a draft is given without it.
DEFAULT_SPECULATIVE_TOKENS = 4


@dataclass(frozen=True)
class DraftSpec:
    """The draft model an engine was asked for.

    Attributes:
        source: what ``draft=`` said (a preset name or a path).
        config: its shape (dtype still to be set to the target's).
        weights: a state-dict file to load, ``"trained"`` (train the preset, cached), or
            ``None`` (random weights from the run's seed).
        k: draft tokens proposed per sequence and step (``num_speculative_tokens``).
        train_overrides: shape overrides to train the preset with (``weights == "trained"``).
    """

    source: str
    config: ReferenceConfig
    weights: str | None
    k: int
    train_overrides: tuple[tuple[str, int], ...] = ()


def parse_draft(extra: dict[str, str], target_trained: bool) -> DraftSpec | None:
    """The draft options of ``--engine-opt`` (``None`` without ``draft=``); UsageError on
    bad values. ``target_trained``: the target has trained weights, so a preset draft is
    trained too."""
    k_text = extra.get("num_speculative_tokens")
    source = extra.get("draft")
    k = DEFAULT_SPECULATIVE_TOKENS
    if k_text is not None:
        try:
            k = int(k_text)
        except ValueError:
            k = -1
        if k < 0:
            raise UsageError(
                f"--engine-opt num_speculative_tokens= must be a whole number >= 0, got {k_text!r}"
            )
        if k == 0:
            return None  # 0 = speculation off, as in the study knob
    if source is None or not source.strip():
        if k_text is not None:
            raise UsageError(
                "--engine-opt num_speculative_tokens needs a draft model: add "
                f"--engine-opt draft=PRESET_OR_PATH (a preset: {', '.join(PRESETS)})"
            )
        return None
    source = source.strip()
    layers_text = extra.get("draft_layers")
    overrides: dict[str, int] = {}
    if layers_text is not None:
        try:
            overrides["n_layers"] = int(layers_text)
        except ValueError:
            overrides["n_layers"] = 0
        if overrides["n_layers"] < 1:
            raise UsageError(
                f"--engine-opt draft_layers= must be a whole number >= 1, got {layers_text!r}"
            )
    if source.lower() in PRESETS:
        cfg = PRESETS[source.lower()].with_overrides(**overrides)
        weights = "trained" if target_trained else None
        return DraftSpec(source.lower(), cfg, weights, k, tuple(sorted(overrides.items())))
    path = Path(source).expanduser()
    if not path.is_file():
        raise UsageError(
            f"--engine-opt draft={source!r} is neither a preset ({', '.join(PRESETS)}) nor a "
            "weights file"
        )
    meta = path.with_suffix(".json")
    try:
        info = json.loads(meta.read_text())
        tc = info["config"]
        cfg = PRESETS[tc["preset"]].with_overrides(**dict(tc.get("overrides") or ()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"--engine-opt draft={source!r}: cannot read its shape from {meta.name} ({exc}); "
            "give a file written by perfscope's trainer, or a preset"
        ) from None
    return DraftSpec(str(path), cfg.with_overrides(**overrides), str(path), k)


@torch.no_grad()
def forward_positions(
    model: ReferenceModel, tokens: torch.Tensor, cache: KVCache, starts: torch.Tensor
) -> torch.Tensor:
    """Feed ``tokens`` [B, T] at positions ``starts[b] .. starts[b] + T - 1`` of cache slots
    ``0..B-1`` (writing their K/V there); every query sees the keys up to its own position.
    Returns logits at every position, [B, T, V]."""
    b, t = tokens.shape
    dev = tokens.device
    offs = torch.arange(t, device=dev)
    positions = starts.view(b, 1) + offs.view(1, t)
    span = int(starts.max().item()) + t
    keys = torch.arange(span, device=dev).view(1, 1, span)
    g = model.cfg.n_heads // model.cfg.n_kv_heads
    # [B, T, span] -> [B, 1, G*T, span], query heads grouped (g outer, t inner) as the block does.
    mask = (keys > positions.unsqueeze(-1)).unsqueeze(1).repeat(1, 1, g, 1)
    x = model.embed(tokens)
    cos, sin = model._rope_tables(positions)
    for i, block in enumerate(model.blocks):
        x = block(x, cos, sin, cache.k[i], cache.v[i], positions, span, mask)
    logits: torch.Tensor = model.lm_head(model.norm(x))
    return logits


def accept_greedy(draft: Sequence[int], target: Sequence[int]) -> int:
    """Draft tokens accepted: the longest prefix with ``draft[i] == target[i]`` (``target``
    holds the target's greedy choice after each of its ``len(draft) + 1`` inputs)."""
    n = 0
    while n < len(draft) and draft[n] == target[n]:
        n += 1
    return n


@dataclass(frozen=True)
class Verified:
    """One row's outcome of a speculative step: ``accepted`` draft tokens and the tokens to
    emit (the accepted ones, then the target's own)."""

    accepted: int
    tokens: list[int]


class Speculator:
    """The draft model, its KV cache and the per-sequence state speculation needs.

    Rows are the engine's cache slots ``0..B-1`` in its running order; :meth:`move` follows
    the engine's compaction.
    """

    def __init__(
        self,
        draft: ReferenceModel,
        k: int,
        slots: int,
        max_len: int,
        sync: Callable[[], None],
    ) -> None:
        self.model = draft
        self.k = k
        self.cache = draft.new_cache(slots, max_len)
        self._sync = sync
        #: Token at position ``length - 1`` of each sequence, by request id.
        self._prev: dict[int, int] = {}

    def prefill(
        self,
        tokens: torch.Tensor,
        start: int,
        request_ids: Sequence[int],
        recorder: Recorder,
    ) -> None:
        """The draft's prefill of one prompt group (slots ``start..``), recorded as a
        ``prefill`` step with ``role="draft"``."""
        n, length = tokens.shape
        pushed = nvtx_ranges.push_step("prefill", recorder.n_steps)
        t0 = recorder.clock.now_ns()
        self.model.prefill(tokens, self.cache.view(start, n))
        self._sync()
        t1 = recorder.clock.now_ns()
        if pushed:
            nvtx_ranges.pop_range()
        recorder.step("prefill", t0, t1, n, length * n, 0, list(request_ids), role="draft")
        for rid, last in zip(request_ids, tokens[:, -1].tolist(), strict=True):
            self._prev[rid] = int(last)

    def move(self, src: int, dst: int, length: int) -> None:
        """A sequence moved from slot ``src`` to ``dst`` in the engine's cache."""
        self.cache.move(src, dst, length)

    def forget(self, request_id: int) -> None:
        self._prev.pop(request_id, None)

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
        """One speculative step of the running rows; returns each row's outcome and the
        verify pass's end time (ns, when its tokens are known).

        ``live[i]`` false: the row has finished but still occupies its slot (static
        batching); it runs through the passes, and is not counted as proposed.
        """
        b, k = len(request_ids), self.k
        rids = list(request_ids)
        lens = torch.tensor(list(lengths), device=device)
        # A finished row still in a static batch has been forgotten: any token will do.
        prev = [self._prev.get(r, x) for r, x in zip(rids, next_tokens, strict=True)]
        cur = torch.tensor([[p, x] for p, x in zip(prev, next_tokens, strict=True)], device=device)
        starts = lens - 1
        proposals: list[torch.Tensor] = []
        for _ in range(k):
            pushed = nvtx_ranges.push_step("decode", recorder.n_steps)
            t0 = recorder.clock.now_ns()
            logits = forward_positions(self.model, cur, self.cache, starts)
            tok = logits[:, -1].argmax(-1)
            self._sync()
            t1 = recorder.clock.now_ns()
            if pushed:
                nvtx_ranges.pop_range()
            ctx = int(starts.sum().item())
            recorder.step("decode", t0, t1, b, b * cur.shape[1], ctx, rids, role="draft")
            proposals.append(tok)
            starts = starts + cur.shape[1]
            cur = tok.view(b, 1)
        drafted = torch.stack(proposals, dim=1) if proposals else lens.new_zeros((b, 0))
        out, _, t1 = verify_proposals(
            target, target_cache, rids, lengths, next_tokens, drafted, live, recorder, self._sync
        )
        for rid, x, v, alive in zip(rids, next_tokens, out, live, strict=True):
            if alive:
                self._prev[rid] = v.tokens[-2] if v.accepted else int(x)
        return out, t1


def verify_proposals(
    target: ReferenceModel,
    target_cache: KVCache,
    request_ids: Sequence[int],
    lengths: Sequence[int],
    next_tokens: Sequence[int],
    proposals: torch.Tensor,
    live: Sequence[bool],
    recorder: Recorder,
    sync: Callable[[], None],
    after: Callable[[list[Verified]], None] | None = None,
) -> tuple[list[Verified], list[list[int]], int]:
    """Verify ``proposals`` [B, K] (any proposer's: a draft model, a guess window, Medusa
    heads) with one target pass over ``x, p1..pK`` per row and accept greedily.

    Returns each row's outcome, the target's greedy choice after each of the ``K + 1``
    inputs (row by row; a Jacobi proposer reuses the ones past the accepted prefix) and the
    pass's end time (ns). Records the pass as a ``decode`` step of ``K + 1`` tokens per row
    with ``proposed_tokens`` (``K`` per live row) and ``accepted_tokens``; a row with
    ``live[i]`` false (finished, still in a static batch) is not counted. ``after`` runs
    on the outcomes inside the step's time (Medusa's heads for the next step).
    """
    b, k = proposals.shape
    device = proposals.device
    lens = torch.tensor(list(lengths), device=device)
    inputs = torch.cat([torch.tensor(list(next_tokens), device=device).view(b, 1), proposals], 1)
    pushed = nvtx_ranges.push_step("decode", recorder.n_steps)
    t0 = recorder.clock.now_ns()
    choice = forward_positions(target, inputs, target_cache, lens).argmax(-1).tolist()
    out: list[Verified] = []
    for d, t in zip(proposals.tolist(), choice, strict=True):
        n = accept_greedy(d, t)
        out.append(Verified(n, [*d[:n], int(t[n])]))
    if after is not None:
        after(out)
    sync()
    t1 = recorder.clock.now_ns()
    if pushed:
        nvtx_ranges.pop_range()
    n_live = sum(1 for a in live if a)
    recorder.step(
        "decode",
        t0,
        t1,
        b,
        b * (k + 1),
        int(sum(lengths)),
        list(request_ids),
        proposed_tokens=n_live * k,
        accepted_tokens=sum(v.accepted for v, a in zip(out, live, strict=True) if a),
    )
    return out, choice, t1


def build_draft(
    spec: DraftSpec,
    target: ReferenceConfig,
    *,
    seed: int,
    device: torch.device,
    load: Callable[[ReferenceModel, str], None],
) -> ReferenceModel:
    """The draft model of ``spec`` in the target's dtype on ``device``; UsageError when its
    vocabulary differs from the target's."""
    cfg = spec.config.with_overrides(dtype=target.dtype)
    if cfg.vocab_size != target.vocab_size:
        raise UsageError(
            f"draft {spec.source!r} has a vocabulary of {cfg.vocab_size} tokens, the target "
            f"{target.vocab_size}: a draft must share the target's vocabulary (use a preset "
            "of the same vocab or --vocab)"
        )
    model = ReferenceModel.build(cfg, seed=seed, device=device)
    weights = spec.weights
    if weights == "trained":
        from perfscope.profiler.engines.reference.train import TrainConfig, train

        weights = str(train(TrainConfig(preset=spec.source, overrides=spec.train_overrides)).path)
    if weights:
        load(model, weights)
    return model
