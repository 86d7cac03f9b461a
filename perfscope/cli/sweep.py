"""``perfscope sweep``: one run per offered rate (or concurrency), then the sweep summary
(throughput-latency curve, knee, ``max_goodput_rate``), through :func:`perfscope.sweep`;
and what ``perfscope run`` shares with it: the ``openai:`` flags and :func:`run_args`, which
turns either command's flags into the :class:`perfscope.api.run.RunArgs` of a run."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.cli._argtypes import add_runs_dir, nonneg_int, positive_int, request_count
from perfscope.cli.safe import SafeConsole as Console
from perfscope.errors import UsageError

if TYPE_CHECKING:
    from perfscope.analysis.sweep import SweepSummary
    from perfscope.api.run import RunArgs

__all__ = [
    "add_openai_options",
    "openai_extra",
    "redact_argv",
    "register",
    "run_args",
]


def _pos_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return v


def add_length_options(group: Any) -> None:
    """``--prompt-len``/``--output-len`` (vLLM bench's ``--random-input-len``/``-output-len``)
    and ``--prompts``: the workload's lengths, shared by ``run`` and ``sweep``."""
    group.add_argument(
        "--prompt-len",
        "--random-input-len",
        default="128",
        help="prompt tokens: N, uniform:LOW:HIGH or normal:MEAN:STD (default 128)",
    )
    group.add_argument(
        "--output-len",
        "--random-output-len",
        default=None,
        help="output tokens: N, uniform:LOW:HIGH or normal:MEAN:STD (default 128; when given, "
        "it wins over the dataset's reply lengths)",
    )
    group.add_argument(
        "--prompts", type=Path, default=None, help="JSONL prompts file (default: none)"
    )


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
        "--timeout",
        type=_pos_float,
        default=None,
        metavar="SECONDS",
        help="per-request limit, any engine: past it the request fails and the run goes on "
        "(default: 600 for openai:, none otherwise)",
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
        "--connection",
        choices=("reuse", "new"),
        default=None,
        help="openai: reuse pooled keep-alive connections (default) or open a new one per "
        "request; a request that fails before reaching the server is retried once either way",
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
        "--turns", type=int, default=3, help="multi-turn: user turns per conversation (3)"
    )
    g.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="replay a production trace (JSONL: timestamp ms or arrival_s, input_length, "
        "output_length, optional hash_ids as in the Mooncake traces): its arrivals and lengths",
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
        ("connection", "connection"),
    ):
        v = getattr(args, flag, None)
        if v is not None:
            out[key] = str(v)
    out["ignore_eos"] = "true" if getattr(args, "ignore_eos", True) else "false"
    if getattr(args, "no_preflight", False):
        out["preflight"] = "false"
    return out


def run_args(args: argparse.Namespace) -> RunArgs:
    """The :class:`perfscope.api.run.RunArgs` of ``perfscope run``'s flags (shared with the
    sweep, which has a subset of them)."""
    from perfscope.analysis.slo import parse_slos
    from perfscope.api.run import RunArgs

    shape = {
        k.removeprefix("shape_"): v
        for k, v in vars(args).items()
        if k.startswith("shape_") and v is not None
    }
    engine_opts: dict[str, str | float] = dict(_kv_pairs(getattr(args, "engine_opt", [])))
    if args.engine.startswith("openai"):
        engine_opts.update(openai_extra(args))
    if getattr(args, "timeout", None) is not None:  # --timeout: every engine kind
        engine_opts["request_timeout_s"] = float(args.timeout)
    # Flags only `perfscope run` has; the sweep keeps RunArgs' defaults for them.
    only_run = (
        "batch_size",
        "scheduler",
        "batch_timeout",
        "device",
        "dtype",
        "model_preset",
        "stop_on_eos",
        "hw",
        "telemetry_interval",
        "gpus",
        "nvtx",
        "mode",
        "rate",
        "concurrency",
        "name",
    )
    given = {key: getattr(args, key) for key in only_run if hasattr(args, key)}
    if hasattr(args, "no_telemetry"):
        given["telemetry"] = not args.no_telemetry
    return RunArgs(
        engine=args.engine,
        requests=args.requests,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        prompts=args.prompts,
        dataset=args.dataset,
        prefix_len=args.prefix_len,
        prefix_groups=args.prefix_groups,
        tokenizer=args.tokenizer,
        warmup=args.warmup,
        seed=args.seed,
        trace=getattr(args, "trace", None),
        turns=getattr(args, "turns", 3),
        arrival=args.arrival,
        burstiness=args.burstiness,
        duration=args.duration,
        warmup_duration=args.warmup_duration,
        model_overrides=shape,
        slos=parse_slos(args.slo),
        runs_dir=args.runs_dir,
        command=redact_argv(["perfscope", *sys.argv[1:]]),
        ray=getattr(args, "ray", None),
        ray_autoscale=getattr(args, "ray_autoscale", None),
        ray_resources=getattr(args, "ray_resources", None),
        model_spec=getattr(args, "model_spec", None),
        server_metrics=getattr(args, "server_metrics", "auto"),
        server_metrics_interval=getattr(args, "server_metrics_interval", 1.0),
        engine_options=engine_opts,
        cli=True,
        **given,
    )


def _kv_pairs(items: Sequence[Any]) -> list[tuple[str, str]]:
    """``--engine-opt`` values: ``(KEY, VALUE)`` pairs or ``KEY=VALUE`` strings."""
    out = []
    for item in items:
        if isinstance(item, tuple):
            out.append(item)
            continue
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise UsageError(f"--engine-opt expects KEY=VALUE, got {item!r}")
        out.append((key.strip(), value.strip()))
    return out


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line with secrets replaced by ``***`` (see
    :func:`perfscope.profiler.redact.redact_argv`)."""
    from perfscope.profiler.redact import redact_argv as _redact

    return _redact(argv)


def _float_list(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got {text!r}") from None
    if not vals or any(not (v > 0 and math.isfinite(v)) for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive numbers like 1,2,4, got {text!r}")
    return vals


def _rates_arg(text: str) -> list[float] | str:
    if text.strip().lower() == "auto":
        return "auto"
    from perfscope.profiler.driver import MIN_RATE

    vals = _float_list(text)
    if min(vals) < MIN_RATE:
        raise argparse.ArgumentTypeError(
            f"the lowest rate is {MIN_RATE:.3g} requests/s (one a day), got {min(vals):g}"
        )
    return vals


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``perfscope sweep``."""
    p = subparsers.add_parser(
        "sweep",
        help="one run per offered rate or concurrency; curve, knee, max goodput rate",
        description=(
            "Run the workload at a series of request rates (open loop) or concurrencies "
            "(closed loop), one stored run per point, and summarise the throughput-latency "
            "curve: its knee and max_goodput_rate, the highest rate whose SLO attainment is "
            ">= 90%. --rates auto probes the server's saturation throughput first."
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
    p.add_argument("--points", type=int, default=6, help="points of an automatic sweep (default 6)")
    p.add_argument(
        "--probe-requests",
        type=int,
        default=None,
        help="requests of the saturation probe (default: --requests, at least 16)",
    )
    w = p.add_argument_group("workload (per point)")
    w.add_argument(
        "--requests",
        "--num-prompts",
        type=request_count,
        default=None,
        help="measured requests per point (default 32)",
    )
    add_length_options(w)
    w.add_argument(
        "--warmup", type=nonneg_int, default=0, help="warmup requests per point (default 0)"
    )
    w.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seeds lengths and arrivals (default 0); given, prompts repeat exactly (a server "
        "may then answer from its prefix cache); without it, each run's prompts are new",
    )
    w.add_argument(
        "--arrival",
        choices=("poisson", "constant", "gamma"),
        default="poisson",
        help="gaps between arrivals at each rate (default poisson)",
    )
    w.add_argument(
        "--burstiness",
        type=_pos_float,
        default=1.0,
        help="gamma shape for --arrival gamma: <1 burstier, >1 smoother (default 1)",
    )
    o = p.add_argument_group("openai engine")
    add_openai_options(o)
    o.add_argument(
        "--engine-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine-specific option (repeatable; default: none)",
    )
    r = p.add_argument_group("reference engine (as perfscope run)")
    r.add_argument(
        "--model-preset",
        default=None,
        help="reference model shape: tiny, small (default), medium, 1b, 7b",
    )
    r.add_argument(
        "--batch-size",
        type=positive_int,
        default=8,
        help="most sequences decoded together (default 8)",
    )
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
        help="latency the knee is found on (default e2e_p50)",
    )
    add_runs_dir(a)
    a.add_argument("--name", default="sweep", help="name prefix of the point runs")
    a.add_argument("--json", action="store_true", help="print the sweep summary as JSON")
    p.set_defaults(handler=_cmd_sweep)


#: Requests per point below which the sweep warns that its tail percentiles are thin.
SMALL_SAMPLE = 100


def _cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    from perfscope.api.run import sweep_with

    err = Console(stderr=True)
    per_point = args.requests or 32
    if args.duration is None and per_point < SMALL_SAMPLE:
        err.print(
            f"[yellow]warning:[/] {per_point} requests per point: each point's p90 and p99 "
            f"rest on a handful of requests (a p99 needs about 100); use --requests "
            f"{SMALL_SAMPLE} or more for tail latencies",
            highlight=False,
        )
    result = sweep_with(
        run_args(args),
        rates=args.rates,
        concurrencies=(
            [int(c) for c in args.concurrencies] if args.concurrencies is not None else None
        ),
        points=args.points,
        probe_requests=args.probe_requests,
        knee_metric=args.knee_metric,
        name=args.name,
        log=err.print,
    )
    if args.json:
        print(json.dumps(result.summary.to_dict(), indent=2))
    else:
        console.print(sweep_table(result.summary))
    return 1 if result.failed else 0


#: Sweep table columns: (sweep point column, header); cells are formatted by the catalogue
#: metric the column reads (:data:`perfscope.analysis.sweep.POINT_METRICS`).
_SWEEP_COLUMNS = (
    ("req_s", "done req/s"),
    ("output_tok_s", "out tok/s"),
    ("ttft_p50", "TTFT p50"),
    ("ttft_p99", "TTFT p99"),
    ("tpot_p50", "TPOT p50"),
    ("e2e_p99", "E2E p99"),
    ("attainment", "SLO met"),
    ("failed", "failed"),
)


def sweep_table(summary: SweepSummary) -> Any:
    """The sweep as a terminal table (stacked per point when narrow), with the knee and max
    goodput rate in the caption; every number through the metric catalogue's formats."""
    from perfscope.analysis.catalogue import format_number, metric
    from perfscope.analysis.sweep import POINT_METRICS
    from perfscope.dashboard.terminal import FitTable

    kind = summary.kind
    knee = summary.knee
    cols = ("offered req/s" if kind == "rate" else "concurrency", *(h for _, h in _SWEEP_COLUMNS))
    t = FitTable(cols, title=f"sweep ({kind})", right=frozenset(cols))
    for p in summary.points:
        mark = " ◀ knee" if knee and p.offered == knee.point.offered else ""
        cells = [
            "no SLOs"
            if col == "attainment" and not summary.slos
            else ("n/a" if (v := p.column(col)) is None else metric(POINT_METRICS[col]).format(v))
            for col, _ in _SWEEP_COLUMNS
        ]
        t.add_row(f"{format_number(p.offered)}{mark}", *cells)
    key = "max_goodput_rate" if kind == "rate" else "max_goodput_concurrency"
    knee_txt = (
        f"knee at {format_number(knee.point.offered)} ({knee.metric})"
        if knee
        else "no knee in the range tested (latency did not climb)"
    )
    if summary.slos:
        good = summary.max_goodput
        good_txt = (
            f"{key} = {format_number(good)}"
            if good is not None
            else f"{key}: no point reached 90% attainment"
        )
    else:
        good_txt = f"{key}: give --slo to compute it"
    t.caption = f"{knee_txt}; {good_txt}; saved to {summary.path}"
    return t
