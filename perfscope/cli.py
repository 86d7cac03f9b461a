"""The ``perfscope`` command line: a thin layer over the library.

Exit codes: 0 success, 1 the run failed or was interrupted (its data is kept), 2 bad usage
(one-line message, no traceback).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from rich.console import Console

from perfscope import __version__
from perfscope._argtypes import key_value, nonneg_int, number, positive_int, torch_dtype
from perfscope.errors import PerfscopeError, UsageError

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of usage + error, and a "did you
    mean" suggestion for a mistyped flag or subcommand."""

    #: The whole command line being parsed (set by :func:`main`), to find the subcommand.
    argv: ClassVar[list[str]] = []

    def _selected(self) -> argparse.ArgumentParser:
        """The innermost subcommand parser named on the command line."""
        parser: argparse.ArgumentParser = self
        argv = _Parser.argv or sys.argv[1:]
        for token in argv:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if subs and token in subs[0].choices:
                parser = subs[0].choices[token]
        return parser

    def error(self, message: str) -> NoReturn:
        target: argparse.ArgumentParser = self
        hint = ""
        if message.startswith("unrecognized arguments:"):
            target = self._selected()
            known = [o for o in target._option_string_actions if o.startswith("--")]
            for token in message.split(":", 1)[1].split():
                flag = token.split("=", 1)[0]
                if flag.startswith("-"):
                    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
                    if close:
                        hint = f"; did you mean {close[0]}?"
                        break
        elif "invalid choice:" in message:
            bad = message.split("invalid choice:", 1)[1].split("(", 1)[0].strip().strip("'")
            choices = [
                c
                for a in self._actions
                if isinstance(a, argparse._SubParsersAction)
                for c in a.choices
            ]
            for a in self._actions:
                named = f"argument {'/'.join(a.option_strings)}:" in message
                if a.choices and a.option_strings and named:
                    choices = [str(c) for c in a.choices]
            close = difflib.get_close_matches(bad, choices, n=1, cutoff=0.5)
            if close:
                hint = f"; did you mean {close[0]!r}?"
        sys.stderr.write(f"error: {message}{hint} (see '{target.prog} --help')\n")
        sys.exit(2)


def _add_runs_dir(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="root folder of runs (default: $PERFSCOPE_RUNS_DIR or ./perfscope-runs)",
    )


def _add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="profile an engine on a workload",
        description="Run a workload on an engine, store the run and print its summary.",
    )
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
        type=positive_int,
        default=None,
        help="measured requests (default 48, or one per line of --prompts)",
    )
    w.add_argument(
        "--prompt-len",
        "--random-input-len",
        default="128",
        help="prompt tokens: N, uniform:LOW:HIGH or normal:MEAN:STD (default 128)",
    )
    w.add_argument(
        "--output-len",
        "--random-output-len",
        default="128",
        help="output tokens: N, uniform:LOW:HIGH or normal:MEAN:STD (default 128)",
    )
    w.add_argument("--prompts", type=Path, default=None, help="JSONL prompts file (default: none)")
    w.add_argument(
        "--warmup",
        type=nonneg_int,
        default=0,
        help="requests run first and excluded from statistics (default 0)",
    )
    w.add_argument(
        "--seed", type=int, default=0, help="seeds lengths, arrivals and weights (default 0)"
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
    e.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if present)")
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
    from perfscope._cli_sweep import add_openai_options

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
        "--nvtx",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="NVTX ranges for Nsight Systems (default: on only when a tool is attached)",
    )
    _add_runs_dir(a)
    a.add_argument(
        "--name", default=None, help="short name in the run id (default: the engine kind)"
    )
    a.add_argument("--json", action="store_true", help="print summary.json instead of tables")
    a.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress view (it is drawn only when stderr is a terminal)",
    )
    a.add_argument(
        "--report",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write report.html next to the run (default: on)",
    )
    p.set_defaults(handler=_cmd_run)


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    from perfscope._cli_sweep import apply_duration, dataset_fields, openai_extra, redact_argv
    from perfscope._progress import progress_hook
    from perfscope._render import summary_view
    from perfscope._runner import RunOptions, execute_run
    from perfscope.analysis.slo import parse_duration, parse_slos
    from perfscope.profiler.driver import LoadConfig
    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.telemetry import TelemetryConfig, parse_gpus
    from perfscope.profiler.workload import WorkloadConfig, parse_length

    requests = args.requests if args.requests is not None else (None if args.prompts else 48)
    requests, warmup = apply_duration(requests, args.warmup, args, args.rate, args.concurrency)
    workload = WorkloadConfig(
        requests=requests,
        prompt_len=parse_length(args.prompt_len, "--prompt-len"),
        output_len=parse_length(args.output_len, "--output-len"),
        prompts_file=args.prompts,
        warmup=warmup,
        seed=args.seed,
        **dataset_fields(args, args.engine),
    )
    load = LoadConfig(
        # --rate / --concurrency only make sense online: they imply it.
        mode="online" if args.rate is not None or args.concurrency is not None else args.mode,
        rate=args.rate,
        concurrency=args.concurrency,
        arrival=args.arrival,
        burstiness=args.burstiness,
        seed=args.seed,
        duration_s=args.duration,
        warmup_s=args.warmup_duration,
    )
    load.validate()
    shape = {
        k.removeprefix("shape_"): v
        for k, v in vars(args).items()
        if k.startswith("shape_") and v is not None
    }
    eopts = EngineOptions(
        batch_size=args.batch_size,
        scheduler=args.scheduler,
        batch_timeout_s=parse_duration(args.batch_timeout),
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        model_preset=args.model_preset,
        model_overrides=shape,
        stop_on_eos=args.stop_on_eos,
        extra={
            **dict(args.engine_opt),
            **(openai_extra(args) if args.engine.startswith("openai") else {}),
        },
    )
    telemetry = TelemetryConfig(
        interval_s=parse_duration(args.telemetry_interval),
        gpus=parse_gpus(args.gpus) if args.gpus else None,
        enabled=not args.no_telemetry,
    )
    opts = RunOptions(
        engine=args.engine,
        workload=workload,
        load=load,
        engine_options=eopts,
        telemetry=telemetry,
        nvtx=args.nvtx,
        slos=parse_slos(args.slo),
        runs_dir=args.runs_dir,
        name=args.name,
        hw=args.hw,
        command=redact_argv(["perfscope", *sys.argv[1:]]),
    )
    err = Console(stderr=True)
    hook = progress_hook(err, args.no_progress)
    outcome = execute_run(opts, hook)
    if args.json:
        print(json.dumps(outcome.summary.to_dict(), indent=2))
    else:
        console.print(summary_view(outcome.summary, outcome.path))
    if args.report:
        from perfscope._cli_report import write_run_report

        write_run_report(outcome.path, err)
    if outcome.status != "complete":
        err.print(
            f"[red]run {outcome.status}[/red]: {outcome.error}; "
            f"what was captured is in {outcome.path}"
        )
        return 1
    return 0


def _cmd_show(args: argparse.Namespace, console: Console) -> int:
    from perfscope._analyze import analyze_stored
    from perfscope._render import summary_view
    from perfscope.analysis import Summary
    from perfscope.profiler.store import read_run, resolve_run_path

    run = read_run(resolve_run_path(args.run, args.runs_dir))
    summary = Summary.from_dict(run.summary) if run.summary is not None else analyze_stored(run)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        console.print(summary_view(summary, run.path))
    return 0


def _cmd_analyze(args: argparse.Namespace, console: Console) -> int:
    from perfscope._analyze import analyze_stored
    from perfscope._render import summary_view
    from perfscope.analysis.slo import parse_slos
    from perfscope.profiler.store import read_run, resolve_run_path

    run = read_run(resolve_run_path(args.run, args.runs_dir))
    slos = parse_slos(args.slo) if args.slo else None
    summary = analyze_stored(run, slos=slos, hw=args.hw)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        console.print(summary_view(summary, run.path))
    return 0


def _cmd_ls(args: argparse.Namespace, console: Console) -> int:
    from perfscope._render import runs_table
    from perfscope.profiler.store import default_runs_root, list_runs, read_run

    root = args.runs_dir or default_runs_root()
    rows = []
    for path in list_runs(root)[: args.limit]:
        try:
            stored = read_run(path, tables=False)
        except PerfscopeError:
            continue
        rows.append((path, stored.manifest, stored.summary))
    if args.json:
        print(
            json.dumps(
                [
                    {"path": str(p), "run_id": p.name, "status": m.get("status"), "summary": s}
                    for p, m, s in rows
                ],
                indent=2,
            )
        )
        return 0
    if not rows:
        console.print(f"no runs in {root} (run 'perfscope run' to make one)")
        return 0
    console.print(runs_table(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="perfscope", description="Inference performance profiler and roofline analyzer."
    )
    parser.add_argument("--version", action="version", version=f"perfscope {__version__}")
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser
    )
    _add_run_parser(sub)

    p = sub.add_parser("show", help="print the summary of a stored run")
    p.add_argument("run", nargs="?", default="latest", help="run directory, run id or 'latest'")
    _add_runs_dir(p)
    p.add_argument("--json", action="store_true", help="print summary.json instead of tables")
    p.set_defaults(handler=_cmd_show)

    p = sub.add_parser("ls", help="list stored runs, newest first")
    _add_runs_dir(p)
    p.add_argument("--limit", type=positive_int, default=50, help="newest N runs (default 50)")
    p.add_argument("--json", action="store_true", help="print JSON to stdout instead of a table")
    p.set_defaults(handler=_cmd_ls)

    p = sub.add_parser("analyze", help="recompute a run's summary from its raw records")
    p.add_argument("run", nargs="?", default="latest", help="run directory, run id or 'latest'")
    _add_runs_dir(p)
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC=DURATION",
        help="replace the run's SLOs (repeatable)",
    )
    p.add_argument("--hw", default=None, help="device to analyse against (default: the run's)")
    p.add_argument("--json", action="store_true", help="print summary.json instead of tables")
    p.set_defaults(handler=_cmd_analyze)

    for module in _command_modules():
        module.register(sub)
    return parser


def _command_modules() -> list[Any]:
    """Command groups that live in their own modules (``perfscope/_cli_*.py``)."""
    import importlib

    mods = []
    names: tuple[str, ...] = (
        "_cli_hw",
        "_cli_roofline",
        "_cli_report",
        "_cli_sweep",
        "_cli_dashboard",
    )
    for name in names:
        mods.append(importlib.import_module(f"perfscope.{name}"))
    return mods


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``perfscope`` script; returns the exit code."""
    parser = build_parser()
    _Parser.argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=120)  # pipes and CI logs: do not squeeze tables to 80
    try:
        return int(args.handler(args, console))
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except PerfscopeError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
