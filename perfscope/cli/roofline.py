"""``perfscope roofline``: predicted latency, throughput, memory and bounds of a workload on
one or more devices, from the cost model and the hardware database alone (no engine)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from perfscope.errors import UsageError
from perfscope.jsontypes import JsonObject

if TYPE_CHECKING:
    from rich.console import Console

    from perfscope.analysis.modelspec import ModelSpec
    from perfscope.hwdb.spec import DeviceSpec

__all__ = ["register"]

#: The :class:`ModelSpec` fields a shape flag sets (whole numbers).
_ShapeField = Literal[
    "n_layers",
    "hidden_size",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "n_experts",
    "n_active_experts",
]

_SHAPE_OPTIONS: tuple[tuple[str, _ShapeField, str], ...] = (
    ("--layers", "n_layers", "transformer blocks"),
    ("--hidden-size", "hidden_size", "model width"),
    ("--heads", "n_heads", "query heads"),
    ("--kv-heads", "n_kv_heads", "key/value heads (GQA/MQA)"),
    ("--head-dim", "head_dim", "width of one head (default hidden/heads)"),
    ("--intermediate-size", "intermediate_size", "MLP width (per expert)"),
    ("--vocab-size", "vocab_size", "vocabulary"),
    ("--experts", "n_experts", "MoE experts per layer"),
    ("--active-experts", "n_active_experts", "experts per token"),
)

#: The flag of each shape field (error messages name the flag).
_FLAG_OF: dict[str, str] = {field: flag for flag, field, _ in _SHAPE_OPTIONS}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``roofline`` command."""
    p = subparsers.add_parser(
        "roofline",
        help="predict TTFT, TPOT, throughput and memory of a workload on devices (no engine)",
        description=(
            "Predict a static batch's TTFT, TPOT, throughput, KV-cache memory, largest batch "
            "that fits and the bound of each phase on each device, from the cost model and the "
            "hardware database. Predictions are at speed of light (100% of the roofline) "
            "unless --efficiency derates them."
        ),
    )
    p.add_argument(
        "--model",
        help="a preset (llama-2-7b, llama-3-8b, mixtral-8x7b, gpt2, ...) or a config.json path; "
        "the shape options below override its fields or, with all of them, replace it",
    )
    p.add_argument(
        "--hw",
        help="device key(s) or names, comma-separated (e.g. a100-sxm4-80gb,h100-sxm5-80gb); "
        "default: this machine",
    )
    p.add_argument("--batch", type=int, default=1, help="sequences per batch (default 1)")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("--output-len", type=int, default=128, help="output tokens (default 128)")
    p.add_argument(
        "--weight-dtype",
        "--dtype",
        dest="dtype",
        help="weight dtype: fp32, bf16, fp16, fp8, int8, int4; float32, bfloat16, float16 "
        "also accepted (int8/int4 are weight-only, compute in bf16; embedding and lm_head "
        "stay 16-bit as in real checkpoints); "
        "default: the model's",
    )
    p.add_argument(
        "--kv-dtype", help="KV-cache dtype (bf16, fp16, fp8, int8); default: compute dtype"
    )
    p.add_argument(
        "--efficiency",
        type=float,
        help="fraction of speed of light reached (0-1], e.g. 0.6; default 1 (speed of light)",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (default 1)")
    p.add_argument("--replicas", type=int, default=1, help="independent model copies (default 1)")
    p.add_argument(
        "--microbatches", type=int, help="prefill micro-batches through the pipeline (default --pp)"
    )
    p.add_argument(
        "--in-flight", type=int, help="decode batches kept in the pipeline (default --pp)"
    )
    p.add_argument(
        "--link", help="interconnect for TP/PP collectives (nvlink, pcie, ...); default fastest"
    )
    p.add_argument(
        "--link-bw", type=float, help="per-direction link bandwidth in GB/s (overrides the device)"
    )
    p.add_argument(
        "--collective-latency-us",
        type=float,
        help="latency of one all-reduce in microseconds (default: device file, else 8)",
    )
    p.add_argument(
        "--mem-fraction",
        type=float,
        default=0.9,
        help="usable share of device memory for weights + KV cache (default 0.9)",
    )
    aliases = {"--hidden-size": ("--hidden",), "--vocab-size": ("--vocab",)}
    for flag, _field, text in _SHAPE_OPTIONS:
        p.add_argument(
            flag, *aliases.get(flag, ()), type=int, help=f"{text} (default: the model's)"
        )
    p.add_argument(
        "--mlp",
        choices=("gated", "plain"),
        help="gated (SwiGLU: gate, up, down) or plain (up, down) MLP (default: the model's)",
    )
    p.add_argument("--json", action="store_true", help="print JSON to stdout")
    p.set_defaults(handler=_handle)


class _Shape(TypedDict, total=False):
    """The :class:`ModelSpec` fields the flags set, and those a new depth carries over (a
    model's local/global, dense and mixer patterns), passed on as its keywords."""

    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    n_experts: int
    n_active_experts: int
    mlp_gated: bool
    layer_windows: tuple[int, ...]
    dense_layers: tuple[int, ...]
    layer_mixers: tuple[str, ...]
    mlp_free_layers: tuple[int, ...]


def _model_from_args(args: argparse.Namespace) -> ModelSpec:
    from dataclasses import replace

    from perfscope.analysis.modelspec import ModelSpec

    overrides = _Shape()
    for flag, field, _ in _SHAPE_OPTIONS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:  # argparse read it as an int
            overrides[field] = int(value)
    if args.mlp is not None:
        overrides["mlp_gated"] = args.mlp == "gated"
    if args.model:
        spec = ModelSpec.resolve(args.model)
        fixed = sorted(set(overrides) - {"n_layers", "vocab_size"})
        if (spec.is_ssm or spec.layer_mixers) and fixed:
            what, why = (
                ("hybrid", "its blocks mix attention with other mixers")
                if spec.n_attention_layers
                else ("state-space", "no attention, no MLP")
            )
            raise UsageError(
                f"{spec.name} is a {what} ({spec.family}) model: "
                f"{', '.join(_FLAG_OF.get(f, '--mlp') for f in fixed)} do not apply ({why}; its "
                "widths come from config.json); only --layers and --vocab-size do"
            )
        if overrides:
            if "hidden_size" in overrides or "n_heads" in overrides:
                overrides.setdefault(
                    "head_dim",
                    overrides.get("hidden_size", spec.hidden_size)
                    // overrides.get("n_heads", spec.n_heads),
                )
            n = overrides.get("n_layers")
            if n is not None and n > 0 and spec.layer_windows:
                # keep the model's local/global pattern over the new depth
                w = spec.layer_windows
                overrides["layer_windows"] = tuple(w[i % len(w)] for i in range(n))
            if n is not None and spec.dense_layers:
                overrides["dense_layers"] = tuple(i for i in spec.dense_layers if i < n)
            if n is not None and n > 0 and spec.layer_mixers:
                # a hybrid keeps its block pattern over the new depth
                period = spec.n_layers
                mixers, free = spec.layer_mixers, set(spec.mlp_free_layers)
                dense = set(spec.dense_layers)
                overrides["layer_mixers"] = tuple(mixers[i % period] for i in range(n))
                overrides["mlp_free_layers"] = tuple(i for i in range(n) if i % period in free)
                overrides["dense_layers"] = tuple(i for i in range(n) if i % period in dense)
            spec = replace(spec, **overrides)
    else:
        needed = ("n_layers", "hidden_size", "n_heads", "intermediate_size", "vocab_size")
        missing = [f for f in needed if f not in overrides]
        if missing:
            raise UsageError(
                "give --model PRESET|config.json, or the model's shape with "
                + ", ".join(_FLAG_OF[f] for f in missing)
            )
        overrides.setdefault("n_kv_heads", overrides["n_heads"])
        overrides.setdefault("head_dim", overrides["hidden_size"] // overrides["n_heads"])
        spec = ModelSpec(name="custom", **overrides)
    if spec.n_experts and not spec.n_active_experts:
        spec = replace(spec, n_active_experts=min(2, spec.n_experts))
    shape = ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "vocab_size")
    for name in shape[:2] + shape[-1:] if spec.is_ssm else shape:
        if getattr(spec, name) <= 0:
            raise UsageError(f"model {name} must be positive, got {getattr(spec, name)}")
    if not spec.is_ssm and spec.n_heads % spec.n_kv_heads:
        raise UsageError(
            f"--heads {spec.n_heads} is not a multiple of --kv-heads {spec.n_kv_heads}"
        )
    from perfscope.analysis.modelspec import apply_dtype_overrides

    return apply_dtype_overrides(spec, weight_dtype=args.dtype, kv_dtype=args.kv_dtype)


def _devices(hw: str | None) -> list[DeviceSpec]:
    from perfscope.hwdb import resolve_device

    if not hw:
        return [resolve_device(None)]
    names = [h.strip() for h in hw.split(",") if h.strip()]
    if not names:
        raise UsageError("--hw is empty: give one or more device keys, comma-separated")
    return [resolve_device(n) for n in names]


def _handle(args: argparse.Namespace, console: Console) -> int:
    from dataclasses import replace

    from perfscope.analysis.whatif import predict
    from perfscope.dashboard.terminal import predictions_table

    for name in ("batch", "prompt_len", "output_len", "tp", "pp", "replicas"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.efficiency is not None and not 0 < args.efficiency <= 1:
        raise UsageError("--efficiency must be in (0, 1], e.g. 0.6 for 60% of speed of light")
    if not 0 < args.mem_fraction <= 1:
        raise UsageError("--mem-fraction must be in (0, 1]")
    spec = _model_from_args(args)
    devices = _devices(args.hw)
    preds = [
        predict(
            spec,
            dev,
            batch=args.batch,
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            efficiency=args.efficiency,
            tp=args.tp,
            mem_fraction=args.mem_fraction,
        )
        for dev in devices
    ]
    from perfscope.analysis.calibration import machine_of_device, projection_check

    preds = [
        replace(pred, checked=projection_check(machine_of_device(dev)))
        for pred, dev in zip(preds, devices, strict=True)
    ]
    parallel = _parallel(args, spec, devices)
    from perfscope.analysis.costmodel import model_assumptions

    assumptions = model_assumptions(spec)
    if args.json:
        out: JsonObject = {
            "model": spec.to_dict(),
            "assumptions": list(assumptions),
            "predictions": [p.to_dict() for p in preds],
        }
        if parallel:
            out["parallel"] = [p.to_dict() for p in parallel]
        print(json.dumps(out, indent=2))
        return 0
    console.print(f"model {spec.name}:", markup=False, highlight=False)
    for line in assumptions:
        console.print(f"  - {line}", markup=False, highlight=False)
    console.print(predictions_table(preds))
    for line in provisional_lines(devices):
        console.print(f"⚠ {line}", style="bold yellow", markup=False, highlight=False)
    if parallel:
        console.print(_parallel_table(parallel))
    return 0


def provisional_lines(devices: list[DeviceSpec]) -> list[str]:
    """One line per device whose ceilings were calibrated under contention (this machine's
    CPU on a busy host): the predictions above rest on them, so the terminal says so."""
    from perfscope.hwdb.calibrate import provisional_note

    out = []
    for dev in devices:
        note = provisional_note(dev.extra) if dev.source == "calibrated" else None
        if note is not None:
            out.append(f"{dev.key}: {note}")
    return out


def _parallel(args: argparse.Namespace, spec: ModelSpec, devices: list[DeviceSpec]) -> list[Any]:
    """Parallelism what-ifs when any degree is above 1 (communication included)."""
    from perfscope.analysis.parallel import ParallelPlan, predict_parallel

    plan = ParallelPlan(
        tp=args.tp,
        pp=args.pp,
        replicas=args.replicas,
        microbatches=args.microbatches,
        in_flight=args.in_flight,
    )
    if plan.devices == 1:
        return []
    return [
        predict_parallel(
            spec,
            dev,
            plan,
            batch=args.batch,
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            efficiency=args.efficiency,
            link=args.link,
            link_bw_bytes_s=args.link_bw * 1e9 if args.link_bw else None,
            collective_latency_s=(
                args.collective_latency_us * 1e-6
                if args.collective_latency_us is not None
                else None
            ),
            mem_fraction=args.mem_fraction,
        )
        for dev in devices
    ]


def _parallel_table(preds: list[Any]) -> Any:
    from rich.console import Group
    from rich.text import Text

    from perfscope.analysis.catalogue import (
        format_bytes,
        format_ratio,
        format_seconds,
        format_value,
    )
    from perfscope.dashboard.terminal import FitTable

    plan = preds[0].plan
    cols = ("device", "TTFT", "TPOT", "tok/s", "TP comm/step", "bubble", "mem/device", "fits")
    table = FitTable(
        cols,
        title=f"parallel what-if: TP {plan.tp} x PP {plan.pp} x {plan.replicas} replica(s) "
        f"= {plan.devices} devices, communication included",
        right=frozenset(cols[1:]),
        caption="tok/s counts output tokens over the whole request (prefill included)",
    )
    for p in preds:
        table.add_row(
            p.device,
            format_seconds(p.ttft_s, 4),
            format_seconds(p.tpot_s, 4),
            format_value(p.throughput_tok_s, "rate", unit="tok/s"),
            format_seconds(p.tp_comm_decode_s),
            format_ratio(p.bubble_decode),
            format_bytes(max(p.stage_memory_bytes)),
            "n/a" if p.fits is None else ("yes" if p.fits else "NO"),
        )
    notes = dict.fromkeys(a for p in preds for a in p.assumptions)
    return Group(table, *[Text(f"assumes: {a}", style="dim") for a in notes])
