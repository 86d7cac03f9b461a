"""``perfscope run``, ``show`` and ``analyze``, and the one set of run options.

:func:`add_run_options` defines the engine, workload, arrival, telemetry and output flags
once; ``run``, ``noise``, ``sweep`` and ``study`` take them from here, and
``perfscope.cli.sweep.run_args`` turns them into the library's ``RunArgs``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rich.console import Console

from perfscope.cli._argtypes import (
    add_runs_dir,
    device,
    key_value,
    nonneg_int,
    number,
    positive_int,
    request_count,
    torch_dtype,
)
from perfscope.cli.parser import Parser
from perfscope.cli.safe import SafeConsole, safe_markup
from perfscope.errors import StorageError
from perfscope.profiler.redact import redact_text

__all__ = ["add_run_options", "infinite_rate_as_mode", "register_analyze", "register_run"]


def _threads_opt(text: str) -> tuple[str, str]:
    """``--threads N`` → the engine option ``("threads", "N")``."""
    return ("threads", str(positive_int(text)))


def register_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``run`` and ``show`` commands."""
    p = sub.add_parser(
        "run",
        help="profile an engine on a workload",
        description="Run a workload on an engine, store the run and print its summary.",
    )
    add_run_options(p, experiments=True)
    p.set_defaults(handler=_cmd_run)

    p = sub.add_parser("show", help="print the summary of a stored run")
    p.add_argument("run", nargs="?", default="latest", help="run directory, run id or 'latest'")
    add_runs_dir(p)
    p.add_argument("--json", action="store_true", help="print summary.json instead of tables")
    p.set_defaults(handler=_cmd_show)


def register_analyze(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``analyze`` command."""
    p = sub.add_parser("analyze", help="recompute a run's summary from its raw records")
    p.add_argument("run", nargs="?", default="latest", help="run directory, run id or 'latest'")
    add_runs_dir(p)
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC=DURATION",
        help="replace the run's SLOs (repeatable)",
    )
    p.add_argument(
        "--hw",
        default=None,
        help="device to analyse against (default: the run's); written beside summary.json",
    )
    p.add_argument("--save", action="store_true", help="with --hw: replace summary.json instead")
    p.add_argument("--json", action="store_true", help="print summary.json instead of tables")
    p.set_defaults(handler=_cmd_analyze)


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
    from perfscope.cli.sweep import add_length_options, add_openai_options

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


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    from perfscope.api.run import execute, plan
    from perfscope.cli.progress import progress_hook
    from perfscope.cli.render import summary_view
    from perfscope.cli.sweep import run_args

    if args.seed is not None and args.engine.startswith("openai"):
        SafeConsole(stderr=True).print(
            f"note: --seed {args.seed} repeats these prompts exactly; the server may serve "
            "them from its prefix cache",
            style="dim",
        )
    note = infinite_rate_as_mode(args)
    if note is not None:
        Console(stderr=True).print(f"note: {note}", style="dim")
    given = run_args(args)
    err = SafeConsole(stderr=True)
    hook = progress_hook(err, args.no_progress)
    from perfscope.cli.repeat import repeat_options, wants_repeats

    if wants_repeats(args):
        from perfscope.api.repeat import run_repeated

        return run_repeated(
            given, repeat_options(args), hook, console, err, as_json=args.json, report=args.report
        )
    outcome = execute(plan(given), hook)
    if args.json:
        print(json.dumps(outcome.summary.to_dict(), indent=2))
    else:
        console.print(summary_view(outcome.summary, outcome.stored or outcome.path))
    if args.report:
        from perfscope.cli.report import write_run_report

        write_run_report(outcome.stored or outcome.path, err, summary=outcome.summary)
    if outcome.status != "complete":
        err.print(
            f"[red]run {outcome.status}[/red]: {safe_markup(redact_text(outcome.error or ''))}; "
            f"what was captured is in {outcome.path}",
            markup=True,
            highlight=False,
        )
    return outcome.exit_code


def _say_state(run: Any) -> None:
    """One stderr line per thing a reader of this run should know (crashed, notes)."""
    if run.state.state not in ("complete", "partial", "interrupted", "failed"):
        sys.stderr.write(
            f"note: run {run.path.name} is {run.state.state}"
            + (f" ({run.state.reason})" if run.state.reason else "")
            + ": showing what was flushed (partial)\n"
        )
    for note in run.notes:
        sys.stderr.write(f"note: {note}\n")


def _cmd_show(args: argparse.Namespace, console: Console) -> int:
    from perfscope.analysis import Summary
    from perfscope.api.analyze import analyze_stored
    from perfscope.cli.render import summary_view
    from perfscope.profiler.store import read_run, resolve_run_path

    run = read_run(resolve_run_path(args.run, args.runs_dir))
    _say_state(run)
    # Reading never writes: a missing summary is computed in memory and not saved.
    summary = (
        Summary.from_dict(run.summary)
        if run.summary is not None
        else analyze_stored(run, write=False)
    )
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        console.print(summary_view(summary, run.path))
    return 0


def _cmd_analyze(args: argparse.Namespace, console: Console) -> int:
    from perfscope.analysis.slo import parse_slos
    from perfscope.api.analyze import analyze_stored, write_analysis
    from perfscope.cli.render import summary_view
    from perfscope.profiler.store import read_run, resolve_run_path

    run = read_run(resolve_run_path(args.run, args.runs_dir))
    _say_state(run)
    slos = parse_slos(args.slo) if args.slo else None
    summary = analyze_stored(run, slos=slos, hw=args.hw, write=False)
    if run.state.state in ("running", "crashed"):
        sys.stderr.write("note: summary.json not saved (the run is not finished)\n")
    else:
        try:
            written = write_analysis(run, summary, hw=args.hw, save=args.save)
            if written.name != "summary.json":
                sys.stderr.write(
                    f"note: analysed against {args.hw}: written to {written.name}; the run's "
                    "summary.json is kept (--save replaces it)\n"
                )
        except StorageError as exc:
            sys.stderr.write(f"note: summary computed but not saved ({exc})\n")
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        console.print(summary_view(summary, run.path))
    return 0
