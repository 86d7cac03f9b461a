"""``perfscope sweep``: one run per offered rate (or concurrency), then the sweep summary
(throughput-latency curve, knee, ``max_goodput_rate``); and the ``openai:`` run options
shared with ``perfscope run``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from perfscope.errors import UsageError

__all__ = [
    "add_openai_options",
    "apply_duration",
    "dataset_fields",
    "openai_extra",
    "redact_argv",
    "register",
]

_SECRET_FLAGS = ("--api-key",)


def _pos_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return v


def add_openai_options(group: Any) -> None:
    """Add the ``openai:`` engine, dataset and duration flags to an argparse group."""
    g = group
    g.add_argument("--model", default=None, help="openai: model name (default: ask GET /models)")
    g.add_argument(
        "--model-spec",
        default=None,
        metavar="PRESET|config.json|FOLDER",
        help="the model an HTTP or python engine serves (a preset such as llama-3-8b, a "
        "Hugging Face config.json or its folder): gives the run an estimated roofline",
    )
    g.add_argument(
        "--api-key",
        default=None,
        help="openai: bearer key (default: $PERFSCOPE_API_KEY or $OPENAI_API_KEY; never stored)",
    )
    g.add_argument(
        "--endpoint",
        choices=("completions", "chat"),
        default="completions",
        help="openai: /v1/completions (default) or /v1/chat/completions",
    )
    g.add_argument(
        "--extra-body",
        default=None,
        metavar="JSON",
        help="openai: JSON object merged into every request, e.g. '{\"temperature\": 0}'",
    )
    g.add_argument(
        "--timeout", type=_pos_float, default=600.0, help="openai: seconds per request (600)"
    )
    g.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="openai: max_tokens for every request (default: each request's --output-len)",
    )
    g.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="openai: ask for exactly max_tokens (dropped if the server rejects it)",
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="tokenizer.json (or its folder): exact prompt lengths and client token counts",
    )
    g.add_argument(
        "--no-preflight",
        action="store_true",
        help="openai: skip the test request that checks URL, model and streaming",
    )
    g.add_argument(
        "--dataset",
        default=None,
        metavar="KIND[:PATH]",
        help="prompt text: synthetic (default for openai:), sharegpt:FILE, shared-prefix",
    )
    g.add_argument(
        "--prefix-len", type=int, default=0, help="shared-prefix: tokens every prompt shares"
    )
    g.add_argument(
        "--prefix-groups", type=int, default=1, help="shared-prefix: distinct prefixes (1)"
    )
    g.add_argument(
        "--duration",
        type=_pos_float,
        default=None,
        help="seconds of measured load (with --requests: whichever ends first)",
    )
    g.add_argument(
        "--warmup-duration",
        type=_pos_float,
        default=None,
        help="seconds of warmup load before measuring (steady state; overrides --warmup)",
    )


def openai_extra(args: argparse.Namespace) -> dict[str, str]:
    """``EngineOptions.extra`` entries for the openai engine from parsed flags."""
    out: dict[str, str] = {}
    for key, flag in (
        ("model", "model"),
        ("api_key", "api_key"),
        ("endpoint", "endpoint"),
        ("extra_body", "extra_body"),
        ("timeout", "timeout"),
        ("max_tokens", "max_tokens"),
        ("tokenizer", "tokenizer"),
    ):
        v = getattr(args, flag, None)
        if v is not None:
            out[key] = str(v)
    out["ignore_eos"] = "true" if getattr(args, "ignore_eos", True) else "false"
    if getattr(args, "no_preflight", False):
        out["preflight"] = "false"
    return out


def dataset_fields(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """``WorkloadConfig`` fields for ``--dataset`` (synthetic text by default for openai:)."""
    spec = getattr(args, "dataset", None)
    if spec is None and engine.startswith("openai") and getattr(args, "prompts", None) is None:
        spec = "synthetic"
    if spec is None:
        return {"tokenizer": getattr(args, "tokenizer", None)}
    kind, _, path = str(spec).partition(":")
    kind = kind.strip().lower()
    return {
        "dataset": kind,
        "dataset_path": Path(path) if path else None,
        "prefix_len": int(getattr(args, "prefix_len", 0) or 0),
        "prefix_groups": int(getattr(args, "prefix_groups", 1) or 1),
        "tokenizer": getattr(args, "tokenizer", None),
        # ShareGPT reply lengths are the output lengths unless --output-len moved off its
        # default (128).
        "output_len_given": str(getattr(args, "output_len", "128")) != "128",
    }


def apply_duration(
    requests: int | None,
    warmup: int,
    args: argparse.Namespace,
    rate: float | None,
    concurrency: int | None,
) -> tuple[int | None, int]:
    """Request and warmup counts large enough for ``--duration`` / ``--warmup-duration``.

    With a duration and no ``--requests``, the pool holds the requests the rate can send in
    that time plus five standard deviations of a Poisson count (or 200 per closed-loop user).
    """

    def pool(seconds: float) -> int:
        if rate is not None:
            mean = rate * seconds
            return math.ceil(mean + 5 * math.sqrt(mean) + 10)
        return 200 * (concurrency or 1)

    duration = getattr(args, "duration", None)
    if duration is not None and getattr(args, "requests", None) is None:
        requests = pool(duration)
    wdur = getattr(args, "warmup_duration", None)
    if wdur is not None:
        warmup = pool(wdur)
    return requests, warmup


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line with secret values (``--api-key``) replaced by ``***``."""
    out: list[str] = []
    hide = False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
            continue
        flag, eq, _ = a.partition("=")
        if flag in _SECRET_FLAGS:
            if eq:
                out.append(f"{flag}=***")
            else:
                out.append(a)
                hide = True
            continue
        out.append(a)
    return out


def _float_list(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got {text!r}") from None
    if not vals or any(not (v > 0 and math.isfinite(v)) for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive numbers like 1,2,4, got {text!r}")
    return vals


def _rates_arg(text: str) -> list[float] | str:
    return "auto" if text.strip().lower() == "auto" else _float_list(text)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``perfscope sweep``."""
    p = subparsers.add_parser(
        "sweep",
        help="one run per offered rate or concurrency; curve, knee, max goodput rate",
        description=(
            "Run the workload at a series of request rates (open loop) or concurrencies "
            "(closed loop), one stored run per point, and summarise the throughput-latency "
            "curve: its knee and max_goodput_rate, the highest rate whose SLO attainment is "
            ">= 90%%. --rates auto probes the server's saturation throughput first."
        ),
    )
    p.add_argument("engine", help="engine URI, e.g. openai:http://127.0.0.1:8000/v1")
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--rates",
        type=_rates_arg,
        default=None,
        metavar="R1,R2,..|auto",
        help="requests/s per point, or 'auto' (default): probe, then --points rates up to "
        "the saturation throughput",
    )
    load.add_argument(
        "--concurrencies",
        type=_float_list,
        default=None,
        metavar="C1,C2,..",
        help="closed-loop users per point",
    )
    p.add_argument("--points", type=int, default=6, help="points of an automatic sweep (6)")
    p.add_argument(
        "--probe-requests", type=int, default=None, help="requests of the saturation probe"
    )
    w = p.add_argument_group("workload (per point)")
    w.add_argument("--requests", type=int, default=None, help="measured requests per point (32)")
    w.add_argument("--prompt-len", default="128", help="prompt tokens (N, uniform:A:B, ...)")
    w.add_argument("--output-len", default="128", help="output tokens (N, uniform:A:B, ...)")
    w.add_argument("--prompts", type=Path, default=None, help="JSONL prompts file")
    w.add_argument("--warmup", type=int, default=0, help="warmup requests per point")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--arrival", choices=("poisson", "constant", "gamma"), default="poisson")
    w.add_argument("--burstiness", type=_pos_float, default=1.0)
    o = p.add_argument_group("openai engine")
    add_openai_options(o)
    o.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE")
    a = p.add_argument_group("analysis and output")
    a.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC=DURATION",
        help="SLOs for attainment and max_goodput_rate, e.g. --slo ttft=200ms --slo tpot=50ms",
    )
    a.add_argument(
        "--knee-metric",
        default="e2e_p50",
        choices=("e2e_p50", "e2e_p99", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99"),
        help="latency the knee is found on (e2e_p50)",
    )
    a.add_argument("--runs-dir", type=Path, default=None)
    a.add_argument("--name", default="sweep", help="name prefix of the point runs")
    a.add_argument("--json", action="store_true", help="print the sweep summary as JSON")
    p.set_defaults(handler=_cmd_sweep)


def _point_options(
    args: argparse.Namespace,
    *,
    mode: str,
    rate: float | None,
    concurrency: int | None,
    requests: int | None,
    name: str,
) -> Any:
    from perfscope._runner import RunOptions
    from perfscope.analysis.slo import parse_slos
    from perfscope.profiler.driver import LoadConfig
    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.workload import WorkloadConfig, parse_length

    extra = {**dict(_kv(x) for x in args.engine_opt), **openai_extra(args)}
    n = requests if requests is not None else (args.requests or (None if args.prompts else 32))
    n, warmup = apply_duration(n, args.warmup, args, rate, concurrency)
    workload = WorkloadConfig(
        requests=n,
        prompt_len=parse_length(args.prompt_len, "--prompt-len"),
        output_len=parse_length(args.output_len, "--output-len"),
        prompts_file=args.prompts,
        warmup=warmup,
        seed=args.seed,
        **dataset_fields(args, args.engine),
    )
    load = LoadConfig(
        mode=mode,
        rate=rate,
        concurrency=concurrency,
        arrival=args.arrival,
        burstiness=args.burstiness,
        seed=args.seed,
        duration_s=args.duration,
        warmup_s=args.warmup_duration,
    )
    return RunOptions(
        engine=args.engine,
        workload=workload,
        load=load,
        engine_options=EngineOptions(seed=args.seed, extra=extra),
        slos=parse_slos(args.slo),
        runs_dir=args.runs_dir,
        name=name,
        command=redact_argv(["perfscope", *sys.argv[1:]]),
        model_spec=model_spec_option(getattr(args, "model_spec", None)),
    )


def model_spec_option(text: str | None) -> dict[str, Any] | None:
    """``--model-spec``: the resolved :class:`ModelSpec` as a dict marked as given by the
    user (``estimated``, ``method``, ``source``); ``None`` without the flag. UsageError
    for a preset or config that cannot be read."""
    if not text:
        return None
    from perfscope.analysis.modelspec import ModelSpec

    spec = ModelSpec.resolve(text)
    out: dict[str, Any] = dict(spec.to_dict())
    out["source"] = f"--model-spec {text}"
    out["estimated"] = True
    out["method"] = (
        "model shape from --model-spec; FLOPs and bytes from perfscope's analytic cost model; "
        "for engines without steps, phase times estimated from the request timeline"
    )
    return out


def _kv(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--engine-opt expects KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def auto_rates(saturation_req_s: float, points: int) -> list[float]:
    """``points`` rates spread evenly from 1/points of the saturation throughput to 1.2x it
    (the last points push past saturation so the curve shows the knee)."""
    if points < 2:
        raise UsageError("--points must be at least 2")
    top = 1.2 * saturation_req_s
    return [round(top * (i + 1) / points, 3) for i in range(points)]


def _cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    from perfscope._runner import ProgressHook, execute_run
    from perfscope.analysis.slo import parse_slos
    from perfscope.analysis.sweep import summarize_sweep, sweep_point
    from perfscope.profiler.store import default_runs_root, write_json_atomic

    slos = parse_slos(args.slo)
    err = Console(stderr=True)
    quiet = ProgressHook()
    probe: dict[str, Any] | None = None
    if args.concurrencies is not None:
        kind = "concurrency"
        loads: list[float] = [float(int(c)) for c in args.concurrencies]
    else:
        kind = "rate"
        rates = args.rates if args.rates is not None else "auto"
        if rates == "auto":
            n_probe = args.probe_requests or max(16, args.requests or 32)
            opts = _point_options(
                args,
                mode="batch",
                rate=None,
                concurrency=None,
                requests=n_probe,
                name=f"{args.name}-probe",
            )
            err.print(f"sweep: probing saturation throughput with {n_probe} requests at once")
            out = execute_run(opts, quiet)
            sat = (out.summary.get("throughput") or {}).get("req_s")
            if out.status != "complete" or not sat:
                raise UsageError(
                    f"the saturation probe failed ({out.error or 'no completed requests'}); "
                    f"see {out.path}, or give --rates explicitly"
                )
            probe = {"run": str(out.path), "req_s": sat}
            loads = auto_rates(float(sat), args.points)
        else:
            loads = [float(r) for r in rates]
    points = []
    failed = 0
    for x in loads:
        label = f"c{int(x)}" if kind == "concurrency" else f"r{x:g}"
        opts = _point_options(
            args,
            mode="online",
            rate=x if kind == "rate" else None,
            concurrency=int(x) if kind == "concurrency" else None,
            requests=None,
            name=f"{args.name}-{label}",
        )
        err.print(f"sweep: {kind} {x:g} ...")
        out = execute_run(opts, quiet)
        if out.status != "complete":
            failed += 1
        points.append(sweep_point(x, out.summary, str(out.path)))
    summary = summarize_sweep(kind, points, slos, args.knee_metric)
    summary["probe"] = probe
    summary["engine"] = (points and _engine_of(points)) or args.engine
    root = args.runs_dir or default_runs_root()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = root / "sweeps" / f"{stamp}-{args.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    summary["path"] = str(path)
    write_json_atomic(path, summary)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        console.print(sweep_table(summary))
    return 1 if failed else 0


def _engine_of(points: list[dict[str, Any]]) -> str | None:
    run = points[0].get("run")
    if not run:
        return None
    try:
        manifest = json.loads((Path(run) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    uri = (manifest.get("engine") or {}).get("uri")
    return str(uri) if uri else None


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _num(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def sweep_table(summary: dict[str, Any]) -> Table:
    """The sweep as a rich table, with the knee and max goodput rate in the caption."""
    kind = summary["kind"]
    knee = summary.get("knee")
    t = Table(title=f"sweep ({kind})", title_justify="left")
    for col in (
        "rate req/s" if kind == "rate" else "concurrency",
        "done req/s",
        "out tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TPOT p50 ms",
        "E2E p99 ms",
        "attain",
        "failed",
    ):
        t.add_column(col, justify="right")
    for p in summary["points"]:
        mark = " ◀ knee" if knee and p["offered"] == knee["offered"] else ""
        t.add_row(
            f"{p['offered']:g}{mark}",
            _num(p["req_s"]),
            _num(p["output_tok_s"], "{:.0f}"),
            _ms(p["ttft_p50"]),
            _ms(p["ttft_p99"]),
            _ms(p["tpot_p50"]),
            _ms(p["e2e_p99"]),
            _num(p["attainment"], "{:.0%}"),
            str(p["failed"] if p["failed"] is not None else "-"),
        )
    key = "max_goodput_rate" if kind == "rate" else "max_goodput_concurrency"
    knee_txt = (
        f"knee at {knee['offered']:g} ({knee['metric']})"
        if knee
        else "no knee in the range tested (latency did not climb)"
    )
    if summary.get("slos"):
        good = summary.get(key)
        good_txt = (
            f"{key} = {good:g}" if good is not None else f"{key}: no point reached 90% attainment"
        )
    else:
        good_txt = f"{key}: give --slo to compute it"
    t.caption = f"{knee_txt}; {good_txt}; saved to {summary.get('path')}"
    return t
