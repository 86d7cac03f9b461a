"""The knob catalogue of ``perfscope study``: what each knob changes and how a value is read.

:data:`KNOBS` names every knob by its ``perfscope run`` flag (``batch-size``, ``kv-heads``,
``dtype``, ...) and :data:`APPLIES` the engine families each one applies to; a value its
``parse`` reads is applied to the :class:`perfscope.api.run.RunArgs` of a setting (a field, a
model-shape override or a reference-engine option). Here too: the batch the projection
assumes for a setting (capped by :func:`kv_capacity`, what a reference engine's KV budget
holds) and the build-time checks of a setting's reference engine, made before any run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from perfscope.errors import UsageError

if TYPE_CHECKING:
    from perfscope.api.run import RunArgs


#: A knob's value as its ``parse`` reads it: a count, a rate, a name or ``None`` (the
#: option's default, e.g. ``max-batched-tokens=unlimited``).
KnobValue = int | float | str | None


@dataclass(frozen=True)
class Knob:
    """One knob: what it changes and how a value is read.

    Attributes:
        name: the run flag name (``batch-size``).
        kind: ``field`` (a :class:`RunArgs` field), ``shape`` (a ``model_overrides`` key)
            or ``option`` (a reference-engine ``--engine-opt`` key).
        target: the field, shape key or option key.
        parse: text → value; raises ValueError with the reason.
        help: one line for ``--help`` and error messages.
    """

    name: str
    kind: str
    target: str
    parse: Callable[[str], KnobValue]
    help: str


def _int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise ValueError("must be a whole number >= 1")
    return v


def _count(text: str) -> int:
    v = int(text)
    if v < 0:
        raise ValueError("must be a whole number >= 0")
    return v


def _float(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise ValueError("must be a positive number")
    return v


def _one_of(*choices: str, aliases: Mapping[str, str] | None = None) -> Callable[[str], str]:
    def parse(text: str) -> str:
        t = text.strip().lower()
        t = (aliases or {}).get(t, t)
        if t not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return t

    return parse


def _budget(text: str) -> int | None:
    t = text.strip().lower()
    if t in ("unlimited", "none", "off", "inf"):
        return None
    v = int(t)
    if v < 1:
        raise ValueError("must be a whole number >= 1 or 'unlimited'")
    return v


_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_KV_DTYPE_ALIASES = {"fp8_e4m3": "fp8", "float8_e4m3fn": "fp8", "float8": "fp8"}
#: Other spellings of a knob (vLLM's ``kv_cache_dtype``).
_KNOB_ALIASES = {"kv-cache-dtype": "kv-dtype"}


def _sparsity(text: str) -> str:
    """A ``sparsity`` value in its canonical spelling (``unstructured:0.5``)."""
    from perfscope.profiler.engines.reference.model import parse_sparsity

    try:
        return parse_sparsity(text).label
    except ValueError:
        raise ValueError("must be none, unstructured:F (F between 0 and 1) or 2:4") from None


_ON_OFF = {"true": "on", "false": "off", "1": "on", "0": "off", "yes": "on", "no": "off"}

#: Every knob a study can vary, by run flag name.
KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("batch-size", "field", "batch_size", _int, "most sequences decoded together"),
        Knob(
            "scheduler",
            "field",
            "scheduler",
            _one_of("continuous", "static"),
            "continuous or static batching",
        ),
        Knob(
            "dtype",
            "field",
            "dtype",
            _one_of("float32", "bfloat16", "float16", aliases=_DTYPE_ALIASES),
            "weights, activations and KV cache dtype",
        ),
        Knob("concurrency", "field", "concurrency", _int, "closed-loop users"),
        Knob("rate", "field", "rate", _float, "offered requests per second"),
        Knob(
            "model-preset",
            "field",
            "model_preset",
            _one_of("tiny", "small", "medium", "1b", "7b"),
            "reference model shape (distillation: a smaller student)",
        ),
        Knob("kv-heads", "shape", "n_kv_heads", _int, "KV heads: MHA = heads, GQA, MQA = 1"),
        Knob("heads", "shape", "n_heads", _int, "query heads (pruning heads)"),
        Knob("layers", "shape", "n_layers", _int, "transformer blocks (pruning layers)"),
        Knob("hidden-size", "shape", "hidden_size", _int, "model width"),
        Knob("intermediate-size", "shape", "intermediate_size", _int, "MLP width"),
        Knob("threads", "option", "threads", _int, "torch.set_num_threads on CPU"),
        Knob("kv-cache", "option", "kv_cache", _one_of("on", "off", aliases=_ON_OFF), "KV cache"),
        Knob(
            "quant",
            "option",
            "quant",
            _one_of("none", "int8", "int8-wo"),
            "int8 weights: dynamic int8 matmuls or weight-only",
        ),
        Knob(
            "attention",
            "option",
            "attention",
            _one_of("explicit", "sdpa", aliases={"eager": "explicit"}),
            "explicit matmuls (hf: eager) or torch SDPA",
        ),
        Knob(
            "kv-dtype",
            "option",
            "kv_dtype",
            _one_of("auto", "int8", "fp8", aliases=_KV_DTYPE_ALIASES),
            "KV-cache storage dtype (vLLM kv_cache_dtype): auto = the model dtype",
        ),
        Knob(
            "sparsity",
            "option",
            "sparsity",
            _sparsity,
            "magnitude pruning of the block linears: none, unstructured:F (CSR), 2:4 (CUDA)",
        ),
        Knob(
            "prefix-cache",
            "option",
            "prefix_cache",
            _one_of("off", "on", aliases=_ON_OFF),
            "reuse the KV of prompt prefixes computed before (16-token blocks, LRU)",
        ),
        Knob(
            "max-batched-tokens",
            "option",
            "max_batched_tokens",
            _budget,
            "tokens per step, decode first, then prompt chunks (chunked prefill); 'unlimited'",
        ),
        Knob(
            "compile",
            "option",
            "compile",
            _one_of("off", "on", aliases=_ON_OFF),
            "torch.compile of each block (kernel fusion)",
        ),
        Knob(
            "kv-paged",
            "option",
            "kv_paged",
            _one_of("off", "on", aliases=_ON_OFF),
            "paged KV cache (16-token blocks, a block table) instead of max_seq_len per slot",
        ),
        Knob(
            "prune-heads",
            "option",
            "prune_heads",
            _count,
            "query heads removed per layer, least important first (mean |head output|)",
        ),
        Knob(
            "num-speculative-tokens",
            "option",
            "num_speculative_tokens",
            _count,
            "draft tokens per speculative step (0 = off; needs --engine-opt draft=...)",
        ),
        Knob(
            "decoding",
            "option",
            "decoding",
            _one_of("plain", "draft", "lookahead", "medusa"),
            "parallel decoding: plain, draft (needs draft=...), lookahead (Jacobi) or medusa",
        ),
        Knob(
            "disaggregate",
            "option",
            "disaggregate",
            _one_of("off", "on", aliases=_ON_OFF),
            "prefill and decode in two processes, the KV cache handed over (shared memory)",
        ),
        Knob(
            "replicas",
            "option",
            "replicas",
            _int,
            "copies of the engine, one process each, requests dispatched least-loaded",
        ),
        Knob("max-tokens", "option", "max_tokens", _int, "max_tokens sent with every request"),
        Knob(
            "connection",
            "option",
            "connection",
            _one_of("reuse", "new"),
            "keep-alive connections or a new one per request",
        ),
    )
}

_ALL = ("reference", "hf", "openai", "python")
_MODEL_SHAPE = ("reference",)

#: The one table of which knob applies to which engine family (``reference``, ``hf:``,
#: ``openai:``, ``python`` callables). The load knobs (concurrency, rate) apply to every
#: engine; model and kernel knobs only where the engine builds the model itself; the
#: ``openai:`` knobs are what the client sends per request or how it connects.
APPLIES: dict[str, tuple[str, ...]] = {
    "batch-size": ("reference", "hf"),
    "scheduler": ("reference",),
    "dtype": ("reference", "hf"),
    "concurrency": _ALL,
    "rate": _ALL,
    "model-preset": _MODEL_SHAPE,
    "kv-heads": _MODEL_SHAPE,
    "heads": _MODEL_SHAPE,
    "layers": _MODEL_SHAPE,
    "hidden-size": _MODEL_SHAPE,
    "intermediate-size": _MODEL_SHAPE,
    "threads": ("reference",),
    "kv-cache": ("reference",),
    "quant": ("reference",),
    "attention": ("reference", "hf"),
    "compile": ("reference",),
    "prune-heads": ("reference",),
    "kv-paged": ("reference",),
    "kv-dtype": ("reference",),
    "sparsity": ("reference",),
    "prefix-cache": ("reference",),
    "max-batched-tokens": ("reference",),
    "num-speculative-tokens": ("reference",),
    "decoding": ("reference",),
    "disaggregate": ("reference",),
    "replicas": ("reference",),
    "max-tokens": ("openai",),
    "connection": ("openai",),
}


def engine_family(engine: Any) -> str:
    """``reference``, ``hf``, ``openai`` or ``python`` (a callable or ``python:`` URI);
    any other URI scheme is returned as written (no knob table row names it)."""
    if not isinstance(engine, str):
        return "python"
    scheme = engine.split(":", 1)[0].strip().lower()
    return scheme or "reference"


def knobs_for(engine: Any) -> list[str]:
    """The knobs that apply to ``engine``, in :data:`KNOBS` order."""
    fam = engine_family(engine)
    return [k for k in KNOBS if fam in APPLIES[k]]


def _check_applies(knob: Knob, engine: Any) -> None:
    fam = engine_family(engine)
    if fam not in APPLIES[knob.name]:
        shown = f"{fam}:" if fam in ("hf", "openai") else fam
        usable = knobs_for(engine)
        raise UsageError(
            f"knob {knob.name!r} does not apply to the {shown} engine: use one of "
            + (", ".join(usable) if usable else "none (an engine perfscope has no knobs for)")
        )


def _knob(name: str) -> Knob:
    key = name.strip().lower().removeprefix("--").replace("_", "-")
    key = _KNOB_ALIASES.get(key, key)
    if key not in KNOBS:
        raise UsageError(f"unknown knob {name!r}: use one of {', '.join(KNOBS)}")
    return KNOBS[key]


def _values(knob: Knob, values: Sequence[object] | str) -> list[tuple[str, KnobValue]]:
    if isinstance(values, str):
        values = [v for v in values.split(",") if v.strip()]
    if len(values) < 2:
        raise UsageError(f"a study of {knob.name} needs at least two values, e.g. --values A,B")
    out: list[tuple[str, KnobValue]] = []
    for v in values:
        text = str(v).strip()
        try:
            out.append((text, knob.parse(text)))
        except ValueError as exc:
            why = str(exc) if "must" in str(exc) else "is not valid"
            raise UsageError(f"{knob.name} value {text!r} {why} ({knob.help})") from None
    labels = [t for t, _ in out]
    if len(set(labels)) != len(labels):
        raise UsageError(f"{knob.name} values repeat: {', '.join(labels)}")
    return out


def _apply(base: RunArgs, knob: Knob, value: KnobValue) -> RunArgs:
    if knob.kind == "field":
        return _set_field(base, knob, value)
    if knob.kind == "shape":
        if not isinstance(value, int):
            raise TypeError(f"knob {knob.name}: a model shape is a whole number, got {value!r}")
        shape = dict(base.model_overrides or {})
        shape[knob.target] = value
        return replace(base, model_overrides=shape)
    opts = dict(base.engine_options)
    if value is None:  # the option's default (e.g. max-batched-tokens=unlimited)
        opts.pop(knob.target, None)
    else:
        opts[knob.target] = str(value)
    return replace(base, engine_options=opts)


def _set_field(base: RunArgs, knob: Knob, value: KnobValue) -> RunArgs:
    """``base`` with the :class:`RunArgs` field of a ``field`` knob set to ``value`` (as the
    knob's ``parse`` read it); a rate or a concurrency makes the load online."""
    match knob.target, value:
        case "batch_size", int(n):
            return replace(base, batch_size=n)
        case "concurrency", int(n):
            return replace(base, concurrency=n, mode="online")
        case "rate", float(r):
            return replace(base, rate=r, mode="online")
        case "scheduler", str(name):
            return replace(base, scheduler=name)
        case "dtype", str(name):
            return replace(base, dtype=name)
        case "model_preset", str(name):
            return replace(base, model_preset=name)
    raise TypeError(f"knob {knob.name}: no field {knob.target!r} takes {value!r}")


def _length(value: int | str) -> int:
    """A fixed token count of a length spec (the mean of ``uniform:A:B``/``normal:M:S``)."""
    if isinstance(value, int):
        return value
    parts = str(value).split(":")
    try:
        if len(parts) == 1:
            return int(parts[0])
        if parts[0] == "uniform":
            return round((float(parts[1]) + float(parts[2])) / 2)
        return round(float(parts[1]))
    except (ValueError, IndexError):
        raise UsageError(f"cannot read a token count from {value!r}") from None


def _batch(a: RunArgs, requests: int, seq_tokens: int | None = None) -> int:
    """Sequences decoded together as the projection assumes (before the run): the batch,
    capped by the load's users and by what a reference engine's KV budget holds
    (:func:`kv_capacity`, for sequences of ``seq_tokens``)."""
    b = min(a.batch_size, requests)
    if a.concurrency is not None:
        b = min(b, a.concurrency)
    if seq_tokens is not None and (cap := kv_capacity(a, seq_tokens)) is not None:
        b = min(b, cap)
    return max(b, 1)


def kv_capacity(a: RunArgs, seq_tokens: int) -> int | None:
    """Sequences of ``seq_tokens`` (prompt + output) a reference engine's KV budget
    (``kv_budget_mb``) holds, by the engine's own plan
    (:func:`~perfscope.profiler.engines.reference.paged.plan_paged`): contiguous slots of
    ``max_seq_len`` each, or with ``kv_paged=on`` its blocks over the blocks one sequence
    fills; ``None`` without a budget (the batch is the cap)."""
    opts = dict(a.engine_options or {})
    if a.engine != "reference" or "kv_budget_mb" not in opts:
        return None
    from perfscope.profiler.engines.reference.model import PRESETS
    from perfscope.profiler.engines.reference.paged import DEFAULT_BLOCK_TOKENS, plan_paged

    preset = PRESETS.get(a.model_preset or "small")
    if preset is None:
        return None
    cfg = preset.with_overrides(**dict(a.model_overrides or {}))
    block = int(opts.get("kv_block_tokens") or DEFAULT_BLOCK_TOKENS)
    plan = plan_paged(
        cfg, int(float(opts["kv_budget_mb"]) * 1e6), int(opts.get("max_seq_len") or 2048), block
    )
    if str(opts.get("kv_paged", "off")) == "on":
        return int(plan.n_blocks // max(-(-seq_tokens // block), 1))
    return int(plan.contiguous_slots)


def _check_engine(a: RunArgs) -> None:
    """Build-time checks of the reference engine (shape, options) without building it."""
    if a.engine != "reference":
        return
    from perfscope.profiler.engines.reference.model import PRESETS

    preset = PRESETS.get(a.model_preset or "small")
    if preset is None:
        return  # the run's own check names it
    try:
        preset.with_overrides(**dict(a.model_overrides or {}))
    except (ValueError, TypeError) as exc:
        raise UsageError(f"reference model: {exc}") from exc
    if a.engine_options.get("quant") == "int8" and a.dtype not in (None, "float32"):
        raise UsageError("quant=int8 (dynamic int8 matmuls) runs in float32 only")
    sparsity = str(a.engine_options.get("sparsity", "none"))
    if sparsity != "none":
        import torch

        on_cuda = (a.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
        if sparsity == "2:4" and not on_cuda:
            raise UsageError(
                "sparsity=2:4 runs only on CUDA (torch.sparse.to_sparse_semi_structured needs an "
                "NVIDIA GPU): use sparsity=unstructured:0.5 (CSR) or none"
            )
        if not on_cuda and a.dtype not in (None, "float32"):
            raise UsageError("sparsity=unstructured on cpu runs in float32 only (torch CSR matmul)")
        if str(a.engine_options.get("quant", "none")) != "none":
            raise UsageError("sparsity and quant cannot be combined: pick one")
    from perfscope.profiler.engines.reference.speculative import parse_draft

    opts = {k: str(v) for k, v in a.engine_options.items()}
    parse_draft(opts, target_trained=bool(opts.get("weights")))
