"""The ``perfscope`` command line: a thin layer over the library.

Exit codes: 0 success, 1 the run failed or was interrupted (its data is kept), 2 bad usage
(one-line message, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from perfscope import __version__
from perfscope._argtypes import key_value, nonneg_int, number, positive_int
from perfscope.errors import PerfscopeError, UsageError

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of usage + error."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {message} (see '{self.prog} --help')\n")
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
        type=positive_int,
        default=None,
        help="measured requests (default 48, or one per line of --prompts)",
    )
    w.add_argument(
        "--prompt-len",
        default="128",
        help="prompt tokens: N, uniform:LOW:HIGH or normal:MEAN:STD (default 128)",
    )
    w.add_argument(
        "--output-len",
        default=None,
        help="output tokens: N, uniform:LOW:HIGH or normal:MEAN:STD (default 128; when "
        "given, it wins over the dataset's reply lengths)",
    )
    w.add_argument("--prompts", type=Path, default=None, help="JSONL prompts file")
    w.add_argument(
        "--warmup",
        type=nonneg_int,
        default=0,
        help="requests run first and excluded from statistics",
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
        help="batch: all requests at once; online: by --rate or --concurrency",
    )
    d.add_argument("--rate", type=number, default=None, help="requests per second (online)")
    d.add_argument(
        "--concurrency", type=positive_int, default=None, help="closed loop of N users (online)"
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
        help="gamma shape for --arrival gamma: <1 burstier, >1 smoother",
    )
    d.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS|local:N",
        help="generate the load from Ray actors: 'local:N' starts a local cluster with N "
        "actors, an address (ADDRESS#N for N actors) joins a cluster, bare --ray joins a "
        "running cluster or starts a local one (openai: and python: engines; "
        "pip install 'perfscope[ray]')",
    )
    e = p.add_argument_group("engine")
    e.add_argument(
        "--batch-size",
        type=positive_int,
        default=8,
        help="most sequences decoded together (default 8)",
    )
    e.add_argument("--scheduler", choices=("continuous", "static"), default="continuous")
    e.add_argument(
        "--batch-timeout",
        default="0s",
        metavar="DURATION",
        help="static scheduler: longest a request waits for its batch to fill (default 0s)",
    )
    e.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if present)")
    e.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="default: float32 on CPU, bfloat16 on CUDA",
    )
    e.add_argument(
        "--model-preset",
        default=None,
        help="reference model shape: tiny, small (default), medium, 1b, 7b",
    )
    for flag, field, helptext in (
        ("--layers", "n_layers", "transformer blocks"),
        ("--hidden", "hidden_size", "model width"),
        ("--heads", "n_heads", "query heads"),
        ("--kv-heads", "n_kv_heads", "key/value heads (GQA)"),
        ("--mlp", "intermediate_size", "MLP inner width"),
        ("--vocab", "vocab_size", "vocabulary size"),
    ):
        e.add_argument(
            flag,
            dest=f"shape_{field}",
            type=positive_int,
            default=None,
            help=f"reference model: {helptext}",
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
    a.add_argument("--name", default=None, help="short name in the run id")
    a.add_argument("--json", action="store_true", help="print summary.json instead of tables")
    a.add_argument("--no-progress", action="store_true", help="no progress bar")
    a.add_argument(
        "--report",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write report.html next to the run (default: on)",
    )
    p.set_defaults(handler=_cmd_run)


class _RichProgress:
    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]requests"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task: Any = None

    def on_start(self, total_requests: int) -> None:
        self.progress.start()
        self.task = self.progress.add_task("run", total=total_requests)

    def on_request_done(self, request_id: int) -> None:
        self.progress.advance(self.task)

    def on_end(self) -> None:
        self.progress.stop()


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    from perfscope._api import execute, plan
    from perfscope._cli_sweep import run_args
    from perfscope._render import summary_view
    from perfscope._runner import ProgressHook

    if args.seed is not None and args.engine.startswith("openai"):
        Console(stderr=True).print(
            f"note: --seed {args.seed} repeats these prompts exactly; the server may serve "
            "them from its prefix cache",
            style="dim",
        )
    run_plan = plan(run_args(args))
    err = Console(stderr=True)
    hook: Any = ProgressHook() if args.no_progress else _RichProgress(err)
    outcome = execute(run_plan, hook)
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
    if args.where:
        from perfscope._cli_index import runs_root

        return _ls_where(runs_root(args), args, console)
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


def _ls_where(root: Path, args: argparse.Namespace, console: Console) -> int:
    """``ls --where``: the listing answered by the run index (fast over thousands of runs)."""
    from perfscope._cli_index import print_rows
    from perfscope.profiler.index import open_index

    cols = (
        "run_id, state, name, engine_kind, requests, failed, ttft_p50_s, tpot_p50_s, "
        "output_tok_s, attainment, problem"
    )
    with open_index(root) as index:
        names, rows = index.query(
            f"SELECT {cols} FROM runs WHERE ({args.where}) "
            f"ORDER BY started_at DESC NULLS LAST, run_id DESC LIMIT {int(args.limit)}"
        )
    if args.json:
        print_rows(names, rows, console, as_json=True)
    elif not rows:
        console.print(f"no runs in {root} match {args.where!r}")
    else:
        print_rows(names, rows, console, as_json=False)
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
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_show)

    p = sub.add_parser("ls", help="list stored runs, newest first")
    _add_runs_dir(p)
    p.add_argument("--limit", type=positive_int, default=50)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--where",
        default=None,
        metavar="SQL",
        help="only runs matching this SQL condition over the index's columns, e.g. "
        "\"ttft_p99_s < 0.2 AND engine_kind = 'openai'\" ('perfscope query --columns' lists them)",
    )
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
    p.add_argument("--hw", default=None, help="device to analyse against")
    p.add_argument("--json", action="store_true")
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
        "_cli_index",
        "_cli_study",
    )
    for name in names:
        mods.append(importlib.import_module(f"perfscope.{name}"))
    return mods


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``perfscope`` script; returns the exit code."""
    parser = build_parser()
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
