"""Lookahead (Jacobi) decoding: guess the next ``N`` tokens, verify them in one target pass.

Each step proposes a window ``g1..gN`` per sequence, the target runs once over
``x, g1..gN`` (``x`` the next input token) and the longest prefix with ``g_i == t_{i-1}``
(``t`` the target's greedy choices) is accepted, then the target's own ``t_n``
(:func:`~perfscope.profiler.engines.reference.speculative.verify_proposals`). The guesses:

1. *n-gram pool*: the most recent earlier occurrence of the sequence's last ``G`` tokens
   (prompt and output so far, ending in ``x``) proposes the tokens that followed it
   (prompt-lookup / the n-gram cache of Fu et al. 2024, "Break the Sequential Dependency of
   LLM Inference Using Lookahead Decoding");
2. *Jacobi iterates*: otherwise (and to fill the window) the previous step's target outputs
   past its accepted prefix, ``t_{n+1}..t_N``: the fixed-point iteration of Jacobi decoding
   (Santilli et al. 2023), whose guesses become right once their own prefix is;
3. the last token repeated, when neither has a guess.

One guess window per sequence (no 2-D lookahead branch): the target pass is ``N + 1``
positions, as a draft-model verify pass is, and nothing else runs on the device; proposing
is host work, the time between passes. Outputs equal plain greedy decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from perfscope.profiler.engines.reference.model import KVCache, ReferenceModel
from perfscope.profiler.engines.reference.speculative import Verified, verify_proposals
from perfscope.profiler.recorder import Recorder

__all__ = ["Lookahead", "ngram_guess"]


def ngram_guess(history: Sequence[int], n: int, window: int) -> list[int]:
    """Up to ``window`` tokens that followed the most recent earlier occurrence of the last
    ``n`` tokens of ``history`` (``[]`` when ``n`` is 0 or there is none)."""
    if n < 1 or len(history) <= n:
        return []
    key = list(history[-n:])
    for start in range(len(history) - n - 1, -1, -1):
        if list(history[start : start + n]) == key:
            return list(history[start + n : start + n + window])
    return []


class Lookahead:
    """Per-sequence history and Jacobi iterates; proposes and verifies one window a step.

    Attributes:
        k: guesses per sequence and step (the window ``N``).
        ngram: n-gram match length ``G`` (0: Jacobi iterates only).
    """

    def __init__(self, window: int, ngram: int, sync: Callable[[], None]) -> None:
        self.k = window
        self.ngram = ngram
        self._sync = sync
        self._history: dict[int, list[int]] = {}
        self._iterates: dict[int, list[int]] = {}

    def prefill(
        self, tokens: torch.Tensor, start: int, request_ids: Sequence[int], recorder: Recorder
    ) -> None:
        """Remember each prompt (its token ids) for the n-gram pool; no pass runs."""
        for rid, row in zip(request_ids, tokens.tolist(), strict=True):
            self._history[rid] = [int(t) for t in row]
            self._iterates[rid] = []

    def move(self, src: int, dst: int, length: int) -> None:
        """Nothing per slot: state is kept by request id."""

    def forget(self, request_id: int) -> None:
        self._history.pop(request_id, None)
        self._iterates.pop(request_id, None)

    def propose(self, request_id: int, x: int) -> list[int]:
        """The window for the sequence ``request_id`` whose next input token is ``x``."""
        hist = [*self._history.get(request_id, []), x]
        guess = ngram_guess(hist, self.ngram, self.k)
        if len(guess) < self.k:
            guess += self._iterates.get(request_id, [])[len(guess) : self.k]
        last = guess[-1] if guess else x
        return guess + [last] * (self.k - len(guess))

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
        """Propose a window per row, verify it in one target pass; each row's outcome and
        the pass's end time (ns)."""
        rids = list(request_ids)
        windows = [self.propose(r, int(x)) for r, x in zip(rids, next_tokens, strict=True)]
        proposals = torch.tensor(windows, dtype=torch.long, device=device)
        out, choice, t1 = verify_proposals(
            target, target_cache, rids, lengths, next_tokens, proposals, live, recorder, self._sync
        )
        for rid, x, v, t, alive in zip(rids, next_tokens, out, choice, live, strict=True):
            if alive and rid in self._history:
                self._history[rid] += [int(x), *v.tokens[:-1]]
                self._iterates[rid] = [int(c) for c in t[v.accepted + 1 :]]
        return out, t1
