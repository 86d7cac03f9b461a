"""The reference engine's ``decoding`` option: how each decode step proposes tokens.

``decoding=plain`` (one token per sequence and step), ``draft`` (a draft model proposes, see
:mod:`~perfscope.profiler.engines.reference.speculative`; the default when ``draft=`` is
given), ``lookahead`` (a guess window from an n-gram pool of the sequence so far and the
previous step's Jacobi iterates, :mod:`~perfscope.profiler.engines.reference.lookahead`;
``lookahead_window=N`` guesses, default 4, ``lookahead_ngram=G`` the match length, default
2, 0 = pure Jacobi) or ``medusa`` (``medusa_heads=K`` extra heads on the final hidden state,
default 4, trained for ``medusa_steps=N`` optimiser steps, default 400,
:mod:`~perfscope.profiler.engines.reference.medusa`). Every method verifies its
proposals with one target pass and accepts greedily
(:func:`~perfscope.profiler.engines.reference.speculative.verify_proposals`), so the tokens
are exactly plain greedy decoding's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from perfscope.errors import UsageError
from perfscope.profiler.engines.reference.model import KVCache, ReferenceModel
from perfscope.profiler.engines.reference.speculative import Verified
from perfscope.profiler.recorder import Recorder

__all__ = ["DECODING_METHODS", "DecodingSpec", "Proposer", "parse_decoding"]

#: ``decoding`` engine option values.
DECODING_METHODS = ("plain", "draft", "lookahead", "medusa")
#: Guess window / head count when not given.
DEFAULT_WINDOW = 4
DEFAULT_NGRAM = 2


@dataclass(frozen=True)
class DecodingSpec:
    """A parallel decoding method other than a draft model.

    Attributes:
        method: ``lookahead`` or ``medusa``.
        k: tokens proposed per sequence and step (guess window or head count).
        ngram: lookahead's n-gram match length (0: pure Jacobi iteration).
        train_steps: medusa's head training steps.
    """

    method: str
    k: int
    ngram: int = 0
    train_steps: int = 0


class Proposer(Protocol):
    """What the engine's speculative decode loop calls (a draft model, lookahead, Medusa)."""

    k: int

    def prefill(
        self, tokens: torch.Tensor, start: int, request_ids: Sequence[int], recorder: Recorder
    ) -> None: ...

    def move(self, src: int, dst: int, length: int) -> None: ...

    def forget(self, request_id: int) -> None: ...

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
    ) -> tuple[list[Verified], int]: ...


def _whole(extra: dict[str, str], key: str, default: int, least: int) -> int:
    text = extra.get(key)
    if text is None:
        return default
    v = int(text) if text.strip().isdigit() else -1
    if v < least:
        raise UsageError(f"--engine-opt {key}= must be a whole number >= {least}, got {text!r}")
    return v


def parse_decoding(extra: dict[str, str], has_draft: bool) -> tuple[str, DecodingSpec | None]:
    """The ``decoding`` method and, for lookahead or medusa, its spec; UsageError on bad
    values (``draft`` without ``draft=``). The options of a method not chosen are ignored
    (a study varies ``decoding`` over one set of options), as ``draft=`` is by ``plain``."""
    text = extra.get("decoding", "draft" if has_draft else "plain").strip().lower()
    if text not in DECODING_METHODS:
        raise UsageError(
            f"--engine-opt decoding= must be one of {', '.join(DECODING_METHODS)}, got {text!r}"
        )
    if text == "draft" and not has_draft:
        raise UsageError(
            "--engine-opt decoding=draft needs a draft model: add --engine-opt draft=PRESET"
        )
    if text == "lookahead":
        window = _whole(extra, "lookahead_window", DEFAULT_WINDOW, 1)
        return text, DecodingSpec(text, window, _whole(extra, "lookahead_ngram", DEFAULT_NGRAM, 0))
    if text == "medusa":
        heads = _whole(extra, "medusa_heads", DEFAULT_WINDOW, 1)
        return text, DecodingSpec(text, heads, train_steps=_whole(extra, "medusa_steps", 400, 1))
    return text, None
