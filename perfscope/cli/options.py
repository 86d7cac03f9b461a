"""The one set of run options: the flags that ``run``, ``noise``, ``sweep`` and ``study``
share, and :func:`run_args`, which turns any of those commands' flags into the library's
:class:`perfscope.api.run.RunArgs`.

:func:`add_run_options` defines ``perfscope run``'s engine, workload, arrival, telemetry and
output flags (``noise`` takes them whole); ``sweep`` and ``study`` take the workload lengths
(:func:`add_length_options`) and the ``openai:`` engine, dataset and duration flags
(:func:`add_openai_options`) and define their own load flags.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.cli._argtypes import (
    add_runs_dir,
    device,
    key_value,
    nonneg_int,
    number,
    positive_int,
    positive_number,
    request_count,
    torch_dtype,
)
from perfscope.cli.parser import Parser
from perfscope.errors import UsageError

if TYPE_CHECKING:
    from perfscope.api.run import RunArgs

__all__ = [
    "add_length_options",
    "add_openai_options",
    "add_run_options",
    "infinite_rate_as_mode",
    "openai_extra",
    "run_args",
]


def _threads_opt(text: str) -> tuple[str, str]:
    """``--threads N`` → the engine option ``("threads", "N")``."""
    return ("threads", str(positive_int(text)))


def add_run_options(p: argparse.ArgumentParser, *, experiments: bool) -> None:
    """``perfscope run``'s engine, workload, arrival, telemetry and output options (shared
    with ``perfscope noise``); ``experiments`` adds the repeat/experiment options and
    ``--report`` (``run`` only)."""
    p.add_argument(
        "engine",
        nargs="?",
        default="reference",
        help="engine URI: 'reference' (default, built-in PyTorch model), 'hf:PATH' (a local "
        "Hugging Face model folder), 'openai:URL' (an OpenAI-compatible server) or "
        "'python:MODULE:ATTR' (any generator of tokens)",
    )

    w = p.add_argument_group("workload")
    w.add_argument(
        "--requests",
        "--num-prompts",
        type=request_count,
        default=None,
        help="measured requests (default 48, or one per line of --prompts)",
    )
    add_length_options(w)
    w.add_argument(
        "--warmup",
        type=nonneg_int,
        default=0,
        help="requests run first and excluded from statistics (default 0)",
    )
    w.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seeds lengths, arrivals and weights (default 0); given, generated prompt text "
        "repeats exactly (a server may then answer from its prefix cache); without it, each "
        "run's prompts are new",
    )
    d = p.add_argument_group("arrivals")
    d.add_argument(
        "--mode",
        choices=("batch", "online"),
        default="batch",
        help="batch: all requests at once; online: by --rate or --concurrency (default batch; "
        "--rate or --concurrency imply online)",
    )
    d.add_argument(
        "--rate",
        "--request-rate",
        type=number,
        default=None,
        help="requests per second, open loop (default: none); with --concurrency at most that "
        "many in flight",
    )
    d.add_argument(
        "--concurrency",
        "--max-concurrency",
        type=positive_int,
        default=None,
        help="alone: closed loop of N users; with --rate: cap on requests in flight "
        "(default: none)",
    )
    d.add_argument(
        "--arrival",
        choices=("poisson", "constant", "gamma"),
        default="poisson",
        help="gaps between arrivals at --rate (default poisson)",
    )
    d.add_argument(
        "--burstiness",
        type=number,
        default=1.0,
        help="gamma shape for --arrival gamma: <1 burstier, >1 smoother (default 1)",
    )
    d.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS|local:N",
        help="generate the load from Ray actors: bare --ray or 'local:N' starts a private "
        "local cluster (loopback, N actors, gone when the run ends), an address (ADDRESS#N "
        "for N actors; 'auto' for this machine's 'ray start' cluster) joins a cluster "
        "(openai: and python: engines; pip install 'perfscope[ray]')",
    )
    d.add_argument(
        "--ray-autoscale",
        type=positive_int,
        default=None,
        metavar="MAX",
        help="with --ray: when a load actor's event-loop lag exceeds a tenth of the "
        "inter-token gap (and 1 ms), add an actor for the requests not yet sent, up to MAX "
        "actors in all; the decisions are recorded in the run (default: only warn)",
    )
    d.add_argument(
        "--ray-resources",
        default=None,
        metavar="NAME=AMOUNT[,...]",
        help="with --ray: what each load actor asks Ray for, so it runs only on nodes that "
        "offer it: a resource the load nodes were started with (ray start "
        "--resources='{\"loadgen\": 8}'; then loadgen=1), CPU=1, or node:IP=0.01 for one "
        "node; keeps the actors off the model's GPU node; the entry not-server places no "
        "actor on the openai: server's machine (default: zero CPUs, any node)",
    )
    e = p.add_argument_group("engine")
    e.add_argument(
        "--batch-size",
        type=positive_int,
        default=8,
        help="most sequences decoded together (default 8)",
    )
    e.add_argument(
        "--scheduler",
        choices=("continuous", "static"),
        default="continuous",
        help="continuous: join the batch at any step; static: fixed batches (default continuous)",
    )
    e.add_argument(
        "--batch-timeout",
        default="0s",
        metavar="DURATION",
        help="static scheduler: longest a request waits for its batch to fill (default 0s)",
    )
    e.add_argument(
        "--device", type=device, default=None, help="cpu, cuda, cuda:1 (default: cuda if present)"
    )
    e.add_argument(
        "--dtype",
        type=torch_dtype,
        default=None,
        metavar="{fp32,bf16,fp16}",
        help="weights and compute dtype; float32/bfloat16/float16 also accepted "
        "(default: fp32 on CPU, bf16 on CUDA)",
    )
    e.add_argument(
        "--model-preset",
        default=None,
        help="reference model shape: tiny, small (default), medium, 1b, 7b",
    )
    for flags, field, helptext in (
        (("--layers",), "n_layers", "transformer blocks"),
        (("--hidden-size", "--hidden"), "hidden_size", "model width"),
        (("--heads",), "n_heads", "query heads"),
        (("--kv-heads",), "n_kv_heads", "key/value heads (GQA)"),
        (("--intermediate-size",), "intermediate_size", "MLP inner width"),
        (("--vocab-size", "--vocab"), "vocab_size", "vocabulary size"),
    ):
        e.add_argument(
            *flags,
            dest=f"shape_{field}",
            type=positive_int,
            default=None,
            help=f"reference model: {helptext} (default: the preset's)",
        )
    # The old spelling of --intermediate-size (roofline's --mlp is the MLP kind).
    e.add_argument(
        "--mlp", dest="shape_intermediate_size", type=positive_int, help=argparse.SUPPRESS
    )
    e.add_argument(
        "--stop-on-eos",
        action="store_true",
        help="let sequences end early on the end-of-sequence token",
    )
    e.add_argument(
        "--engine-opt",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine-specific option (repeatable)",
    )
    e.add_argument(
        "--threads",
        dest="engine_opt",
        action="append",
        type=_threads_opt,
        metavar="N",
        help="intra-op CPU threads of a torch engine (default: the usable CPUs not busy with "
        "other work, at least 1; the choice is in the manifest)",
    )
    add_openai_options(p.add_argument_group("openai engine, datasets and duration"))
    a = p.add_argument_group("analysis and output")
    a.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC=DURATION",
        help="SLO for goodput, e.g. --slo ttft=200ms --slo tpot=50ms (repeatable)",
    )
    a.add_argument("--hw", default=None, help="device to analyse against (default: detect)")
    t = p.add_argument_group("telemetry")
    t.add_argument(
        "--telemetry-interval",
        default="50ms",
        metavar="DURATION",
        help="hardware sampling interval (default 50ms; at least 20ms)",
    )
    t.add_argument("--gpus", default=None, help="GPUs to sample, e.g. 0,1 (default: all visible)")
    t.add_argument("--no-telemetry", action="store_true", help="do not sample the hardware")
    t.add_argument(
        "--server-metrics",
        default="auto",
        metavar="auto|URL|off",
        help="scrape the server's Prometheus metrics (vLLM, SGLang, TGI, llama.cpp) during the "
        "run into server_metrics.parquet; auto: the openai: server's /metrics if it answers",
    )
    t.add_argument(
        "--server-metrics-interval",
        default="1s",
        metavar="DURATION",
        help="seconds between server-metrics scrapes (default 1s; snapshots at start and end)",
    )
    t.add_argument(
        "--nvtx",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="NVTX ranges for Nsight Systems (default: on only when a tool is attached)",
    )
    if experiments:
        from perfscope.cli.repeat import add_repeat_arguments

        add_repeat_arguments(p.add_argument_group("repeats and experiments (docs/experiments.md)"))
    add_runs_dir(a)
    a.add_argument(
        "--name", default=None, help="short name in the run id (default: the engine kind)"
    )
    a.add_argument("--json", action="store_true", help="print summary.json instead of tables")
    a.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress view (it is drawn only when stderr is a terminal)",
    )
    if experiments:
        a.add_argument(
            "--report",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="write report.html next to the run (default: on)",
        )


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
        type=positive_number,
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
        type=positive_number,
        default=None,
        help="seconds of measured load (with --requests: whichever ends first)",
    )
    g.add_argument(
        "--warmup-duration",
        type=positive_number,
        default=None,
        help="seconds of warmup load before measuring (steady state; overrides --warmup)",
    )


def infinite_rate_as_mode(args: argparse.Namespace) -> str | None:
    """vLLM bench's ``--request-rate inf`` (every request at once) as perfscope spells it:
    ``--mode batch``, or with ``--max-concurrency N`` a closed loop of N. Changes ``args``;
    returns the note to print (None when the rate is finite or not given, or spelled
    ``--rate``)."""
    if args.rate is None or not (math.isinf(args.rate) and args.rate > 0):
        return None
    if not any(t.split("=", 1)[0] == "--request-rate" for t in Parser.argv):
        return None  # perfscope's own --rate wants a finite rate (refused with the reason)
    args.rate = None
    if args.concurrency is None:
        args.mode = "batch"
        return "--request-rate inf is perfscope's --mode batch"
    n = args.concurrency
    return f"--request-rate inf with --max-concurrency {n} is perfscope's --concurrency {n}"


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
    from perfscope.profiler.redact import redact_argv

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
