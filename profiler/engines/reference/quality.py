"""A study ``quality`` hook for the reference engine: each setting's model against the first's.

``perfscope study KNOB --quality`` and ``perfscope.study(..., quality=reference_quality())``
call it once per setting, in setting order, with the setting's options; it builds the model
exactly as the engine does (shape, dtype, ``weights=``, ``quant=``, ``kv_dtype=``,
``sparsity=`` ...) on the CPU and returns
:func:`~perfscope.profiler.engines.reference.train.quality` against the first setting's model:
top-1 agreement and both perplexities on held-out corpus sequences. Meaningful with trained
weights (``--engine-opt weights=trained``); with random weights agreement is only a sanity
bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["reference_quality"]


def reference_quality() -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """A fresh hook (it keeps the first setting's model as the reference)."""
    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.engines.reference.engine import ReferenceEngine
    from perfscope.profiler.engines.reference.train import quality

    ref: list[Any] = []

    def hook(args: dict[str, Any]) -> dict[str, Any] | None:
        if args.get("engine", "reference") != "reference":
            return None
        opts = EngineOptions(
            model_preset=args.get("model_preset"),
            dtype=args.get("dtype"),
            model_overrides=dict(args.get("model_overrides") or {}),
            extra={k: str(v) for k, v in (args.get("engine_options") or {}).items()},
            device="cpu",
        )
        model = ReferenceEngine("reference", opts).model
        if not ref:
            ref.append(model)
        return dict(quality(ref[0], model))

    return hook
