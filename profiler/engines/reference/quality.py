"""A study ``quality`` hook for the reference engine: each setting's model against the first's.

``perfscope study KNOB --quality`` and ``perfscope.study(..., quality=reference_quality())``
call it once per setting, in setting order, with the setting's options; it builds the model
exactly as the engine does (shape, dtype, ``weights=``, ``quant=``, ``kv_dtype=``,
``sparsity=`` ...) on the CPU and returns
:func:`~perfscope.profiler.engines.reference.train.quality` against the first setting's model:
top-1 agreement and both perplexities on held-out corpus sequences. Meaningful with trained
weights (``--engine-opt weights=trained``); with random weights agreement is only a sanity
bound. :func:`describe_model` says what such figures were measured on (the model, its
training, the evaluation set), for a record that keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfscope.profiler.engines.reference.engine import ReferenceEngine

__all__ = ["describe_model", "reference_quality"]


def _engine(args: Mapping[str, Any]) -> ReferenceEngine:
    """The reference engine a setting's options build, on the CPU."""
    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.engines.reference.engine import ReferenceEngine

    opts = EngineOptions(
        model_preset=args.get("model_preset"),
        dtype=args.get("dtype"),
        model_overrides=dict(args.get("model_overrides") or {}),
        extra={k: str(v) for k, v in (args.get("engine_options") or {}).items()},
        device="cpu",
    )
    return ReferenceEngine("reference", opts)


def reference_quality() -> Callable[[Mapping[str, Any]], dict[str, Any] | None]:
    """A fresh hook (it keeps the first setting's model as the reference)."""
    from perfscope.profiler.engines.reference.train import quality

    ref: list[Any] = []

    def hook(args: Mapping[str, Any]) -> dict[str, Any] | None:
        if args.get("engine", "reference") != "reference":
            return None
        model = _engine(args).model
        if not ref:
            ref.append(model)
        return dict(quality(ref[0], model))

    return hook


def describe_model(args: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`reference_quality` measures on, for the setting ``args`` (the baseline's):
    the preset and shape, its parameter count, where its weights came from (``trained``:
    the training run's settings and final loss, read from the cached file's metadata;
    ``random``: the engine's seeded initialisation) and the held-out evaluation set."""
    import torch

    from perfscope.profiler.engines.reference import train

    eng = _engine(args)
    cfg = eng.model.cfg
    weights = eng.weights
    training: dict[str, Any] | None = None
    if weights:
        meta = Path(weights).with_suffix(".json")
        if meta.exists():
            info = json.loads(meta.read_text())
            training = {**info.get("config", {}), "final_loss": info.get("final_loss")}
    return {
        "preset": args.get("model_preset") or "small",
        "shape": {
            "n_layers": cfg.n_layers,
            "hidden_size": cfg.hidden_size,
            "n_heads": cfg.n_heads,
            "n_kv_heads": cfg.n_kv_heads,
            "intermediate_size": cfg.intermediate_size,
            "vocab_size": cfg.vocab_size,
            "dtype": cfg.dtype,
        },
        "parameters": sum(p.numel() for p in eng.model.parameters()),
        "weights": "random" if not weights else "trained" if training else "file",
        "weights_file": Path(weights).name if weights else None,
        "training": training,
        "evaluation": {
            "corpus": "synthetic strides and motifs (held out: its own seed)",
            "sequences": train.EVAL_SEQUENCES,
            "tokens_per_sequence": train.EVAL_SEQ_LEN,
            "predictions": train.EVAL_SEQUENCES * (train.EVAL_SEQ_LEN - 1),
            "alphabet": train.EVAL_ALPHABET,
            "seed": train.EVAL_SEED,
        },
        "torch": torch.__version__,
    }
