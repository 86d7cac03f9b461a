"""``perfscope.study()``: vary one knob, everything else fixed, runs interleaved with repeats.

Each knob is named as its ``perfscope run`` flag (``batch-size``, ``kv-heads``, ``dtype``,
...) and maps one value onto the :class:`perfscope.api.run.RunArgs` of a run (a field, a
model-shape override or a reference-engine option). The settings run in rounds, each
round a block in balanced order (AB BA AB ... for two, a seeded permutation per round for
more), so slow drifts and position effects of a shared machine hit every setting alike;
:func:`perfscope.analysis.study.build_study` turns the runs into the study record, which
is written to ``<runs dir>/studies/<stamp>-<name>.json`` (schema ``perfscope.study/1``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.errors import UsageError
from perfscope.jsontypes import JsonObject, ReadOnlyJson, json_object

if TYPE_CHECKING:
    from perfscope.analysis.overhead import OverheadFit, PassCosts
    from perfscope.analysis.study import Study
    from perfscope.api.run import RunArgs

__all__ = [
    "APPLIES",
    "KNOBS",
    "Knob",
    "baseline_fit",
    "engine_family",
    "knobs_for",
    "load_study",
    "measure_setting_passes",
    "portable_study",
    "reproject_study",
    "save_study",
    "study",
    "study_quality",
    "study_with",
]


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


def _pass_setting(a: RunArgs) -> Any:
    """The options of a reference-engine setting that change a timed kernel pass."""
    from perfscope.profiler.engines.reference.model import parse_sparsity
    from perfscope.profiler.engines.reference.passes import PassSetting

    opts = {k: str(v) for k, v in (a.engine_options or {}).items()}
    kv = opts.get("kv_dtype") or opts.get("kv_cache_dtype") or "auto"
    kv = _KV_DTYPE_ALIASES.get(kv.strip().lower(), kv.strip().lower())
    block = opts.get("kv_block_tokens", "16").strip()
    return PassSetting(
        dtype=_DTYPE_ALIASES.get(a.dtype or "float32", a.dtype or "float32"),
        quant=opts.get("quant", "none").strip().lower(),
        sparsity=parse_sparsity(opts.get("sparsity", "none")).label,
        kv_dtype=kv,
        kv_paged=opts.get("kv_paged", "off").strip().lower() == "on",
        kv_block_tokens=int(block) if block.isdigit() and int(block) > 0 else 16,
    )


def measure_setting_passes(
    settings: Sequence[RunArgs], requests: int, prompt_len: int, output_len: int
) -> list[PassCosts | None]:
    """Per setting, its kernel calls timed against the first setting's on this machine
    (:func:`perfscope.profiler.engines.reference.passes.measure_passes`) as
    :class:`~perfscope.analysis.overhead.PassCosts`: only for reference-engine settings on
    the CPU whose dtype, weight quantisation, sparsity, KV dtype or KV layout differs from the
    baseline's, or whose batch does (the baseline model's decode step is then timed alone
    at both batches: the cost of a row); ``None`` otherwise. Timed at the study's threads,
    at the rows of one decode step and of one prefill, and at a short and the longest
    cache span of a decode step."""
    from perfscope.analysis.overhead import PassCosts

    out: list[PassCosts | None] = [None] * len(settings)
    base = settings[0]
    if base.engine != "reference" or (base.device or "cpu") != "cpu":
        return out
    import torch

    from perfscope.profiler.engines.reference.model import PRESETS
    from perfscope.profiler.engines.reference.passes import measure_passes

    preset = PRESETS.get(base.model_preset or "small")
    if preset is None:
        return out
    ref = _pass_setting(base)
    before = torch.get_num_threads()
    try:
        threads = base.engine_options.get("threads")
        if threads is not None and str(threads).isdigit():
            torch.set_num_threads(int(threads))
        b0 = _batch(base, requests, prompt_len + output_len)
        for i, s in enumerate(settings[1:], start=1):
            cand = _pass_setting(s)
            b = _batch(s, requests, prompt_len + output_len)
            if cand == ref and b == b0:
                continue
            cfg = preset.with_overrides(**dict(s.model_overrides or {}))
            rows = sorted({1, b, b * prompt_len})
            spans = sorted({(b, max(prompt_len // 4, 1)), (b, prompt_len + output_len)})
            writes = sorted({(b, 1), (b, prompt_len)})
            span = prompt_len + max(output_len // 2, 1)
            t = measure_passes(
                cfg,
                ref,
                cand,
                rows=rows,
                spans=spans,
                writes=writes,
                decode=(b0, span),
                prefill=(b0, prompt_len),
                more_rows=b if b != b0 else 0,
            )
            out[i] = PassCosts.from_points(
                rows=t.rows,
                linears_s=t.linears_s,
                head_s=t.head_s,
                kv_elements=t.kv_elements,
                kv_read_s=t.kv_read_s,
                write_rows=t.write_rows,
                kv_write_s=t.kv_write_s,
                decode=(float(t.decode[0]), float(t.decode[1])),
                isolated_decode_s=t.decode_s,
                prefill=(float(t.prefill[0]), float(t.prefill[1])),
                isolated_prefill_s=t.prefill_s,
                more_rows=(float(t.more_rows), t.more_rows_s),
                source=(
                    f"{t.rounds} interleaved rounds at {', '.join(map(str, t.rows))} rows, "
                    f"cache spans {', '.join(str(sp) for _, sp in spans)} and writes of "
                    f"{', '.join(map(str, t.write_rows))} tokens, load {t.load:.1f}, "
                    f"{t.threads} thread(s); the baseline's decode step alone "
                    f"{t.decode_s * 1e3:.3g} ms at {b0} rows"
                    + (f", {t.more_rows_s * 1e3:.3g} ms at {t.more_rows}" if t.more_rows else "")
                    + f", its prefill {t.prefill_s * 1e3:.3g} ms"
                ),
            )
    finally:
        torch.set_num_threads(before)
    return out


def study_with(
    base: RunArgs,
    knob: str,
    values: Sequence[object] | str,
    *,
    repeat: int = 3,
    name: str | None = None,
    log: Callable[[str], None] | None = None,
    quality: Callable[[JsonObject], ReadOnlyJson | None] | None = None,
    precision: float | None = None,
    max_repeats: int = 20,
    budget_s: float | None = None,
) -> Study:
    """:func:`study` from a :class:`RunArgs` record of the fixed options.

    With ``precision`` (0.1: ±10%) the rounds are adaptive, as ``run --repeat --precision``
    is: at least ``repeat`` (and :data:`~perfscope.analysis.experiment.MIN_BLOCKS` before
    the target can stop them), then one more round until every candidate's primary-metric
    interval (paired by round) is within ``±precision``, ``max_repeats`` rounds are run, or
    a round past ``repeat`` would end beyond ``budget_s`` wall seconds after the first
    round (which trains or compiles what the others reuse; judged from the rounds so far);
    a note says which.
    """
    from perfscope.api.run import _whole, execute, plan
    from perfscope.profiler.store import default_runs_root, write_json_atomic

    say = log or (lambda line: None)
    k = _knob(knob)
    _check_applies(k, base.engine)
    parsed = _values(k, values)
    repeat = _whole(repeat, "repeat", 1)
    label = name or f"study-{k.name}"
    settings = [_apply(base, k, v) for _, v in parsed]
    plans = [
        plan(replace(s, name=f"{label}-{t}")) for s, (t, _) in zip(settings, parsed, strict=True)
    ]
    for s in settings:  # reference-engine options and shapes are checked here, not mid-study
        _check_engine(s)
    # The candidates' kernel calls are timed before any run: the projection's inputs
    # precede the measurement it is checked against.
    passes = measure_setting_passes(
        settings,
        plan(settings[0]).options.workload.requests or base.default_requests,
        _length(base.prompt_len),
        _length(base.output_len or 128),
    )
    from perfscope.analysis.experiment import MIN_BLOCKS, block_order

    runs: list[tuple[int, int, str, Mapping[str, Any]]] = []
    waits: set[str | None] = set()  # OMP_WAIT_POLICY of runs with several torch threads
    if precision is not None and not precision > 0:
        raise UsageError(f"precision must be positive (0.1 = ±10%), got {precision}")
    if budget_s is not None and not budget_s > 0:
        raise UsageError(f"budget must be positive seconds, got {budget_s}")
    most = max(repeat, _whole(max_repeats, "max_repeats", 1)) if precision else repeat
    # Balanced order: each round is a block (ABBA for two settings, a seeded random
    # permutation per round for more), so position effects cancel in the paired effects.
    order = block_order(len(plans), most, sum(map(ord, label)))
    started = first_done = time.monotonic()
    load_before = _load_average()
    stop = ""
    rounds = 0
    for rnd in range(most):
        if rnd == 1:
            first_done = time.monotonic()
        if precision is not None and budget_s is not None and rnd >= repeat:
            # The first round (training, compiling what later rounds reuse) is not counted.
            now = time.monotonic()
            elapsed = now - first_done
            per_round = elapsed / (rnd - 1) if rnd > 1 else first_done - started
            if elapsed + per_round > budget_s:
                stop = f"stopped by the budget of {budget_s:g} s after {rnd} rounds"
                break
        rounds = rnd + 1
        for i in order[rnd]:
            p = plans[i]
            say(f"study: round {rnd + 1}/{most}, {k.name}={parsed[i][0]} ...")
            out = execute(p)
            if out.status != "complete":
                raise UsageError(
                    f"the run for {k.name}={parsed[i][0]} {out.status}: {out.error} "
                    f"(captured data is in {out.path})"
                )
            runs.append((rnd, i, str(out.path), out.summary.to_dict()))
            if out.stored is not None:
                waits |= _spinning_policy(out.stored.manifest)
        if precision is None:
            continue
        half = primary_half_width(runs, len(plans))
        say(
            f"study: after {rounds} rounds the widest primary interval is "
            + ("unknown" if half is None else f"±{100 * half:.1f}%")
            + f" (target ±{100 * precision:g}%)"
        )
        # Stop only after whole AB/BA pairs, so a position effect stays cancelled.
        enough = rounds >= max(repeat, MIN_BLOCKS) and (len(plans) != 2 or rounds % 2 == 0)
        if enough and half is not None and half <= precision:
            stop = (
                f"reached ±{100 * half:.1f}% (target ±{100 * precision:g}%) after {rounds} rounds"
            )
            break
    else:
        if precision is not None:
            stop = f"stopped at {most} rounds (max_repeats) before reaching ±{100 * precision:g}%"
    if precision is not None:
        half = primary_half_width(runs, len(plans))
        reached = "unknown" if half is None else f"±{100 * half:.1f}%"
        stop = (
            f"adaptive rounds: {stop}; widest primary-metric interval {reached} "
            f"(target ±{100 * precision:g}%)"
        )
    stamp = datetime.now(UTC)
    quality_rows = [quality(_args_record(s)) for s in settings] if quality is not None else None
    result = _assemble(
        base,
        k,
        parsed,
        rounds,
        runs,
        created_at=stamp.isoformat(timespec="seconds"),
        quality=quality_rows,
        passes=passes,
    )
    if stop:
        result = replace(result, notes=[*result.notes, stop])
    if waits:
        result = replace(result, notes=[*result.notes, _wait_note(waits)])
    load_after = _load_average()
    if load_before is not None and load_after is not None:
        result = replace(
            result,
            notes=[
                *result.notes,
                f"1-minute load average {load_before:.1f} at the first round, "
                f"{load_after:.1f} after the last ({os.cpu_count()} CPUs)",
            ],
        )
    root = Path(base.runs_dir) if base.runs_dir is not None else default_runs_root()
    path = root / "studies" / f"{stamp.strftime('%Y%m%d-%H%M%S')}-{label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    result = replace(result, path=str(path))
    write_json_atomic(path, result.to_dict())
    return result


def _spinning_policy(manifest: Mapping[str, Any]) -> set[str | None]:
    """``{OMP_WAIT_POLICY}`` of a run whose torch engine ran several threads (``{None}``:
    unset, the threads spin); empty for one thread or an engine without torch threads."""
    from perfscope.analysis.manifest import manifest_view

    cfg = manifest_view(manifest).engine.config
    return {cfg.omp_wait_policy} if cfg.several_torch_threads else set()


def _wait_note(waits: set[str | None]) -> str:
    """The study's note on how its multi-threaded runs' OpenMP threads waited."""
    said = ", ".join(sorted("unset (spinning)" if w is None else w for w in waits))
    note = f"OpenMP wait policy of the runs with several torch threads: {said}"
    if None in waits:
        note += (
            "; spinning threads measure the machine's other load more than the engine on a "
            "busy machine (docs/performance.md)"
        )
    return note


def _load_average() -> float | None:
    """The 1-minute load average (``None`` where the system has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def primary_half_width(
    runs: Sequence[tuple[int, int, str, Mapping[str, Any]]], settings: int
) -> float | None:
    """The widest half-width (fraction: 0.1 = ±10%) of the primary metric's interval of any
    candidate against the first setting, paired by round, from ``(round, setting index, run
    path, summary)`` rows; ``None`` while some candidate has no interval yet."""
    from perfscope.analysis.experiment import judge_metric
    from perfscope.analysis.study import DEFAULT_PRIMARY, METRICS, run_metrics

    better = METRICS[DEFAULT_PRIMARY][0]
    values: list[dict[int, float | None]] = [{} for _ in range(settings)]
    for rnd, i, _, summary in runs:
        values[i][rnd] = run_metrics(summary).get(DEFAULT_PRIMARY)
    widest: float | None = None
    for i in range(1, settings):
        common = sorted(set(values[0]) & set(values[i]))
        if len(common) < 2:
            return None
        ch = judge_metric(
            [values[0][r] for r in common], [values[i][r] for r in common], better, paired=True
        )
        if ch.noise is None:
            return None
        widest = ch.noise if widest is None else max(widest, ch.noise)
    return widest


def baseline_fit(run_paths: Sequence[str | Path]) -> tuple[OverheadFit | None, str]:
    """The fitted cost model (:func:`perfscope.analysis.overhead.fit_baseline`) of the steps
    of ``run_paths`` (a study's baseline runs, one device), and a note saying what it rests
    on; ``(None, why)`` when the runs cannot be read or have no engine steps, model or device
    to fit."""
    from perfscope.analysis.overhead import fit_baseline
    from perfscope.errors import PerfscopeError
    from perfscope.profiler.store import read_run

    runs = []
    for ref in run_paths:
        try:
            run = read_run(ref)
        except (OSError, PerfscopeError) as exc:
            return None, f"no fitted cost model: cannot read the baseline run {ref} ({exc})"
        summary = run.summary or {}
        runs.append((run.steps, summary.get("model"), (summary.get("hardware") or {}).get("spec")))
    return fit_baseline(runs)


def _assemble(
    base: RunArgs,
    k: Knob,
    parsed: Sequence[tuple[str, KnobValue]],
    repeat: int,
    runs: Sequence[tuple[int, int, str, Mapping[str, Any]]],
    *,
    created_at: str,
    quality: Sequence[ReadOnlyJson | None] | None = None,
    fitted: bool = True,
    queueing: bool = True,
    passes: Sequence[PassCosts | None] | None = None,
) -> Study:
    """The study record of runs made for ``parsed`` settings of ``k`` over ``base``: the
    baseline runs' fitted cost model, then :func:`~perfscope.analysis.study.build_study`
    (``passes``: per setting, its kernel calls measured against the baseline's)."""
    from perfscope.analysis.study import build_study
    from perfscope.api.run import plan

    settings = [_apply(base, k, v) for _, v in parsed]
    requests = plan(settings[0]).options.workload.requests or base.default_requests
    prompt_len, output_len = _length(base.prompt_len), _length(base.output_len or 128)
    # max_tokens replaces each request's output length (the openai engine sends it).
    output_lens = [
        int(s.engine_options["max_tokens"]) if s.engine_options.get("max_tokens") else output_len
        for s in settings
    ]
    fit, fit_note = (
        baseline_fit([path for _, i, path, _ in runs if i == 0])
        if fitted
        else (None, "projections from the baseline's derating (no fitted cost model)")
    )
    result = build_study(
        k.name,
        [t for t, _ in parsed],
        repeat,
        runs,
        batches=[_batch(s, requests, prompt_len + output_len) for s in settings],
        prompt_len=prompt_len,
        output_len=output_len,
        output_lens=output_lens,
        kv_cache=[s.engine_options.get("kv_cache", "on") != "off" for s in settings],
        args=_args_record(base),
        created_at=created_at,
        quality=None if quality is None else [None if q is None else dict(q) for q in quality],
        fit=fit,
        queueing=queueing,
        passes=passes,
    )
    return replace(result, notes=[*result.notes, fit_note])


def portable_study(study: Study, path: str | Path) -> Study:
    """``study`` as it is stored for others (``perfscope study --save``): each run named by
    its run id instead of its folder on this machine, and ``path`` (as given, relative to
    where it is read from) as the study's own path, so the record names no temporary
    folder. :func:`reproject_study` finds the runs by id in a runs folder."""
    settings = [
        replace(st, runs=[replace(r, run=Path(r.run).name) for r in st.runs])
        for st in study.settings
    ]
    return replace(study, settings=settings, path=str(path))


def reproject_study(
    study: Study | str | Path,
    runs_dir: str | Path | None = None,
    *,
    fitted: bool = True,
    queueing: bool = True,
) -> Study:
    """The study rebuilt from its stored runs with the current projection model: the same
    measured runs (read back from ``runs_dir``, default the runs root, by run id), the
    effects judged again and the projections made again (to compare projection models on
    one set of measurements). ``fitted=False``: the baseline's derating instead of its
    fitted cost model; ``queueing=False``: no wait for a slot in the projected TTFT (the
    model before either). Kernel calls the study measured (its settings' ``passes``) are
    used as stored. The record is returned, not written.

    Raises:
        perfscope.errors.UsageError: the study cannot be read, or a run of it is missing.
    """
    from perfscope.api.run import RunArgs
    from perfscope.errors import PerfscopeError
    from perfscope.profiler.store import default_runs_root, read_run, resolve_run_path

    s = study if not isinstance(study, str | Path) else load_study(study)
    k = _knob(s.knob)
    fields = {
        key: v
        for key, v in s.args.items()
        if key not in ("engine_options", "model_overrides", "slos") and v is not None
    }
    base = RunArgs(
        **fields,
        model_overrides=s.args.get("model_overrides") or None,
        slos=s.args.get("slos") or None,
        engine_options=dict(s.args.get("engine_options") or {}),
    )
    parsed = _values(k, s.values)
    root = Path(runs_dir) if runs_dir is not None else default_runs_root()
    order = sorted((p for st in s.settings for p in st.runs), key=lambda p: p.order)
    runs: list[tuple[int, int, str, Mapping[str, Any]]] = []
    for p in order:
        ref = Path(p.run)
        try:
            path = resolve_run_path(ref.name, root)
            summary = read_run(path, tables=False).summary or {}
        except (OSError, PerfscopeError) as exc:
            raise UsageError(
                f"cannot re-project {s.knob}: run {ref.name} is not in {root} ({exc}); "
                "pass the runs folder the study ran in"
            ) from None
        runs.append((p.round, p.setting, str(path), summary))
    result = _assemble(
        base,
        k,
        parsed,
        s.repeat,
        runs,
        created_at=s.created_at,
        quality=[st.quality for st in s.settings] if any(st.quality for st in s.settings) else None,
        fitted=fitted,
        queueing=queueing,
        passes=[_stored_passes(st.projection) for st in s.settings],
    )
    # what the runs were, not what they project: how the rounds stopped stays
    kept = [
        n
        for n in s.notes
        if n.startswith(("adaptive rounds", "1-minute load average", "OpenMP wait policy"))
    ]
    return replace(result, notes=[*result.notes, *kept])


def _stored_passes(projection: Mapping[str, Any] | None) -> PassCosts | None:
    """The measured kernel calls a stored setting's projection used, if any."""
    from perfscope.analysis.overhead import PassCosts

    raw = (projection or {}).get("passes")
    return PassCosts.from_dict(raw) if isinstance(raw, Mapping) else None


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


def _args_record(a: RunArgs) -> JsonObject:
    """The options of a setting as its study stores them (``args``) and its ``quality`` hook
    is given: JSON, a value JSON cannot hold as its text, no API key."""
    out: dict[str, object] = {}
    for key in (
        "engine",
        "requests",
        "prompt_len",
        "output_len",
        "warmup",
        "seed",
        "mode",
        "rate",
        "concurrency",
        "batch_size",
        "scheduler",
        "dtype",
        "model_preset",
        "model_overrides",
        "slos",
    ):
        v = getattr(a, key)
        out[key] = dict(v) if isinstance(v, Mapping) else v if not callable(v) else repr(v)
    out["engine_options"] = {
        k: str(v) for k, v in a.engine_options.items() if k not in ("api_key",)
    }
    # The built-in dataset shapes the workload as much as its lengths do (a prefix cache
    # finds a shared system prompt, or a conversation's history): named when one was used.
    if a.dataset:
        out["dataset"] = a.dataset
        if a.dataset == "shared-prefix":
            out["prefix_len"] = a.prefix_len
        if a.dataset == "multi-turn":
            out["turns"] = a.turns
    record = json_object(json.loads(json.dumps(out, default=str)))
    assert record is not None  # a dict dumped is an object read back
    return record


def study(
    knob: str,
    values: Sequence[object] | str,
    *,
    engine: Any = "reference",
    repeat: int = 3,
    requests: int | None = 16,
    warmup: int = 2,
    slos: Mapping[str, float | str] | None = None,
    runs_dir: str | Path | None = None,
    name: str | None = None,
    log: Callable[[str], None] | None = None,
    quality: Callable[[JsonObject], ReadOnlyJson | None] | None = None,
    precision: float | None = None,
    max_repeats: int = 20,
    budget_s: float | None = None,
    **options: Any,
) -> Study:
    """Vary one knob with everything else fixed; measure each setting next to what the
    what-if model projected for it.

    ::

        s = perfscope.study("kv-heads", [8, 2, 1], model_preset="small", repeat=3)
        for setting in s.settings:
            print(setting.value, setting.median["tpot_p50_s"], setting.memory["total_bytes"])
        print(s.effect("1", "tpot_p50_s"))   # measured ratio, interval, projection, error

    Args:
        knob: a run flag name (see :data:`KNOBS`): ``batch-size``, ``scheduler``,
            ``dtype``, ``concurrency``, ``rate``, ``model-preset``, ``kv-heads``,
            ``heads``, ``layers``, ``threads``, ``kv-cache``, ``quant``, ``attention``,
            ``compile``, ``kv-dtype``, ``sparsity`` ...
        values: the settings, the first being the baseline (a list or ``"A,B,C"``).
        engine: as in :func:`perfscope.run`.
        repeat: runs per setting (interleaved); 1 gives ratios without intervals.
        requests: measured requests per run (16).
        warmup: warmup requests per run, excluded from the statistics (2).
        slos: per-request limits for goodput, as in :func:`perfscope.run`.
        runs_dir: root of the runs and of ``studies/``.
        name: name of the runs and of the study file (default ``study-KNOB``).
        log: receives one line per run.
        quality: called once per setting with its options (``model_preset``, ``dtype``,
            ``model_overrides``, ``engine_options`` ...); what it returns (e.g. top-1
            agreement with the baseline model) is stored as the setting's ``quality``.
        precision: adaptive rounds (0.1: until every primary-metric interval is within
            ±10%), at least ``repeat``, at most ``max_repeats`` rounds and ``budget_s`` wall
            seconds (:func:`study_with`).
        **options: any other keyword of :func:`perfscope.run` (held fixed).

    Returns:
        The :class:`perfscope.analysis.study.Study`, also stored as JSON at ``.path``.

    Raises:
        perfscope.errors.UsageError: an unknown knob or value, bad options, or a run that
            did not complete (its captured data is kept).
    """
    base = _base_args(engine, requests, warmup, slos, runs_dir, options)
    return study_with(
        base,
        knob,
        values,
        repeat=repeat,
        name=name,
        log=log,
        quality=quality,
        precision=precision,
        max_repeats=max_repeats,
        budget_s=budget_s,
    )


def _base_args(
    engine: Any,
    requests: int | None,
    warmup: int,
    slos: Mapping[str, float | str] | None,
    runs_dir: str | Path | None,
    options: Mapping[str, Any],
) -> RunArgs:
    """The fixed options of a study as :func:`study` takes them, as a :class:`RunArgs`."""
    from perfscope.api.run import _RUN_ARG_NAMES, RunArgs

    if k := {"knob", "values"} & set(options):
        raise UsageError(f"study() takes {', '.join(sorted(k))} once")
    run_fields = {k: v for k, v in options.items() if k in _RUN_ARG_NAMES}
    extra = {k: v for k, v in options.items() if k not in _RUN_ARG_NAMES}
    return RunArgs(
        engine=engine,
        requests=requests,
        warmup=warmup,
        slos=slos,
        runs_dir=runs_dir,
        engine_options=extra,
        **run_fields,
    )


def study_quality(
    knob: str,
    values: Sequence[object] | str,
    *,
    quality: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None = None,
    engine: Any = "reference",
    **options: Any,
) -> list[tuple[str, Mapping[str, Any], Mapping[str, Any] | None]]:
    """Only the ``quality`` hook of :func:`study`, with no run: each setting's label, the
    options record the hook is given (what :func:`study` would pass it) and what it
    returned, in setting order (the first is the baseline).

    Quality does not depend on how fast a setting runs, so a write-up can take it from a
    model with trained weights while its speed comes from a study with random ones::

        rows = perfscope.study_quality("quant", "none,int8", model_preset="tiny",
                                       weights="trained")
        for label, _, q in rows:
            print(label, q["top1_agreement"], q["candidate_perplexity"])

    Args:
        quality: the hook (default: the reference engine's,
            :func:`perfscope.profiler.engines.reference.quality.reference_quality`: top-1
            agreement and perplexities against the first setting's model).
        **options: as in :func:`study` (only what builds the model matters).

    Raises:
        perfscope.errors.UsageError: an unknown knob or value, or options the engine
            refuses (checked as :func:`study` checks them).
    """
    base = _base_args(engine, None, 0, None, None, options)
    k = _knob(knob)
    _check_applies(k, base.engine)
    parsed = _values(k, values)
    settings = [_apply(base, k, v) for _, v in parsed]
    for s in settings:
        _check_engine(s)
    if quality is None:
        from perfscope.profiler.engines.reference.quality import reference_quality

        quality = reference_quality()
    out: list[tuple[str, Mapping[str, Any], Mapping[str, Any] | None]] = []
    for (label, _), s in zip(parsed, settings, strict=True):
        record = _args_record(s)
        out.append((label, record, quality(record)))
    return out


def load_study(path: str | Path) -> Study:
    """Read a stored study JSON back into a :class:`~perfscope.analysis.study.Study`."""
    from perfscope.analysis.study import read_study

    try:
        return read_study(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read study {path}: {exc}") from exc


def save_study(study: Study, folder: str | Path) -> Path:
    """Store a copy of ``study`` in ``folder`` (where ``perfscope advisor calibrate`` reads
    stored studies), its runs named by run id (:func:`portable_study`); returns its path.

    Raises:
        UsageError: the folder cannot be written (the study stays in ``study.path``).
    """
    from perfscope.errors import StorageError
    from perfscope.profiler.store import write_json_atomic

    where = Path(folder)
    name = Path(study.path).name if study.path else f"{study.created_at}-{study.knob}.json"
    target = where / name
    try:
        where.mkdir(parents=True, exist_ok=True)
        # run ids, not this machine's run folders; the copy's own path as given
        write_json_atomic(target, portable_study(study, target).to_dict())
    except (OSError, StorageError) as exc:
        raise UsageError(
            f"cannot store the study in {where} ({exc}); it is in {study.path}"
        ) from None
    return target
