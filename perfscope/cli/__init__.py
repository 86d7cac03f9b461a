"""The ``perfscope`` command line: a thin layer over the library.

A command whose optional extra is missing says which one to install, in one line
(:data:`EXTRA_OF_MODULE`).

Exit codes: 0 success (a run where some requests failed is reported, still 0), 1 the run
failed or was interrupted, or a file could not be written (what was captured is kept),
2 bad usage (one-line message, no traceback), 3 no measured request succeeded.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from rich.console import Console

from perfscope import __version__
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
from perfscope.cli.safe import SafeConsole, configure_streams, safe_markup, safe_text
from perfscope.errors import PerfscopeError, StorageError, UsageError
from perfscope.profiler.redact import redact_text

__all__ = ["add_run_options", "build_parser", "main"]


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No prefix matching: another tool's --data must not silently become --dataset.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        from perfscope.cli.dialect import pointer_for, suggest

        target: argparse.ArgumentParser = self
        hint = ""
        if message.startswith("unrecognized arguments:"):
            target = self._selected()
            known = [o for o in target._option_string_actions if o.startswith("--")]
            tokens = message.split(":", 1)[1].split()
            for token in tokens:
                flag, _, inline = token.partition("=")
                if not flag.startswith("-"):
                    continue
                value = inline or _value_after(flag)
                pointer = pointer_for(flag, value)
                if pointer is not None:
                    sys.stderr.write(f"error: {flag} is not a perfscope flag: {pointer}\n")
                    sys.exit(2)
                close = suggest(flag, known)
                if close:
                    hint = f"; did you mean {close}?"
                    break
        elif "invalid choice:" in message:
            bad = message.split("invalid choice:", 1)[1].split("(", 1)[0].strip().strip("'")
            choices: list[str] = [
                c
                for a in self._actions
                if isinstance(a, argparse._SubParsersAction)
                for c in a.choices
            ]
            for a in self._actions:
                named = f"argument {'/'.join(a.option_strings)}:" in message
                if a.choices and a.option_strings and named:
                    choices = [str(c) for c in a.choices]
            from perfscope.cli.dialect import SUGGEST_CUTOFF

            matches = difflib.get_close_matches(bad, choices, n=1, cutoff=SUGGEST_CUTOFF)
            if matches:
                hint = f"; did you mean {matches[0]!r}?"
        sys.stderr.write(f"error: {message}{hint} (see '{target.prog} --help')\n")
        sys.exit(2)


def _value_after(flag: str) -> str | None:
    """The token after ``flag`` on the command line (argparse may have taken it as a
    positional), or None."""
    argv = _Parser.argv
    if flag in argv and argv.index(flag) + 1 < len(argv):
        return argv[argv.index(flag) + 1]
    return None


def _threads_opt(text: str) -> tuple[str, str]:
    """``--threads N`` → the engine option ``("threads", "N")``."""
    return ("threads", str(positive_int(text)))


def _add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="profile an engine on a workload",
        description="Run a workload on an engine, store the run and print its summary.",
    )
    add_run_options(p, experiments=True)
    p.set_defaults(handler=_cmd_run)


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
    if not any(t.split("=", 1)[0] == "--request-rate" for t in _Parser.argv):
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


def _cmd_ls(args: argparse.Namespace, console: Console) -> int:
    if args.where:
        from perfscope.cli.index import runs_root

        return _ls_where(runs_root(args), args, console)
    from perfscope.cli.index import newest_runs
    from perfscope.cli.runs_list import runs_table

    root, entries = newest_runs(args)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "path": str(e.path),
                        "run_id": e.run_id,
                        "state": e.state,
                        "status": (e.manifest or {}).get("status", e.state),
                        "reason": e.reason,
                        "summary": e.summary,
                    }
                    for e in entries
                ],
                indent=2,
            )
        )
        return 0
    if not entries:
        console.print(f"no runs in {root} (run 'perfscope run' to make one)")
        return 0
    rows = [(e.path, e.manifest or {"status": e.state}, e.summary) for e in entries]
    console.print(runs_table(rows, states=[(e.state, e.reason) for e in entries]))
    return 0


def _ls_where(root: Path, args: argparse.Namespace, console: Console) -> int:
    """``ls --where``: the listing answered by the run index (fast over thousands of runs)."""
    from perfscope.api.index import open_index
    from perfscope.cli.index import print_rows

    cols = (
        "run_id, state, name, engine_kind, requests, failed, ttft_p50_s, tpot_p50_s, "
        "output_tok_s, attainment, problem"
    )
    with open_index(root, allow_files=args.allow_files) as index:
        names, rows = index.query(
            f"SELECT {cols} FROM runs WHERE ({args.where}) "
            f"ORDER BY started_at DESC NULLS LAST, run_id DESC LIMIT {int(args.limit)}"
        )
    if args.json:
        print_rows(names, rows, console, as_json=True)
    elif not rows:
        console.print(f"no runs in {root} match {args.where!r}")
    else:
        print_rows(names, rows, console, as_json=False, root=root, listing=True)
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
    add_runs_dir(p)
    p.add_argument("--json", action="store_true", help="print summary.json instead of tables")
    p.set_defaults(handler=_cmd_show)

    _add_ls_parser(sub)

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

    for module in _command_modules():
        module.register(sub)
    return parser


def _add_ls_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from perfscope.cli.index import add_allow_files

    p = sub.add_parser("ls", help="list stored runs, newest first")
    add_runs_dir(p)
    p.add_argument("--limit", type=positive_int, default=50, help="newest N runs (default 50)")
    p.add_argument("--json", action="store_true", help="print JSON to stdout instead of a table")
    p.add_argument(
        "--where",
        default=None,
        metavar="SQL",
        help="only runs matching this SQL condition over the index's columns, e.g. "
        "\"ttft_p99_s < 0.2 AND engine_kind = 'openai'\" ('perfscope query --columns' lists them)",
    )
    add_allow_files(p)
    p.set_defaults(handler=_cmd_ls, reads_only=True)


#: Subcommands that only read the runs folder's index: answered by a parser that knows just
#: them (:func:`_reads_only_parser`), so their start-up imports none of the other commands'
#: modules (hwdb, dashboard, studies, ...). ``perfscope ls --limit 5`` over 10,000 runs is
#: timed in benchmarks/index_scale.py.
READS_ONLY_COMMANDS = ("ls", "query", "index")


def _reads_only_parser(argv: list[str]) -> argparse.ArgumentParser | None:
    """The parser of ``ls``, ``query`` and ``index`` when ``argv`` names one of them first
    (else ``None``: the full parser). Their options, help and errors are the full parser's,
    built by the same functions."""
    if not argv or argv[0] not in READS_ONLY_COMMANDS:
        return None
    from perfscope.cli import index

    parser = _Parser(
        prog="perfscope", description="Inference performance profiler and roofline analyzer."
    )
    parser.add_argument("--version", action="version", version=f"perfscope {__version__}")
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser
    )
    _add_ls_parser(sub)
    index.register(sub)
    return parser


def _command_modules() -> list[Any]:
    """Command groups that live in their own modules (``perfscope/cli/*.py``)."""
    from perfscope.cli import (
        advisor,
        dashboard,
        hw,
        index,
        noise,
        report,
        roofline,
        study,
        sweep,
    )

    return [hw, roofline, report, sweep, dashboard, index, study, advisor, noise]


def _spoken_as_perfscope(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with vLLM-bench/guidellm/AIPerf flags of the same meaning renamed to
    perfscope's (docs/flags.md); the subcommand is the first token naming one."""
    from perfscope.cli.dialect import rewrite_aliases

    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for i, token in enumerate(argv):
        if subs and token in subs[0].choices:
            known = set(subs[0].choices[token]._option_string_actions)
            return argv[: i + 1] + rewrite_aliases(argv[i + 1 :], token, known)
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``perfscope`` script; returns the exit code."""
    from perfscope.profiler.engines.threads import prefer_passive_wait

    prefer_passive_wait()  # before anything loads torch: waiting threads sleep, not spin
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _reads_only_parser(argv) or build_parser()
    argv = _spoken_as_perfscope(parser, argv)
    _Parser.argv = argv
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    configure_streams()  # LC_ALL=C / PYTHONIOENCODING=ascii: ASCII stand-ins, no traceback
    console = SafeConsole()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = SafeConsole(width=120)  # pipes and CI logs: do not squeeze tables to 80
    if getattr(args, "reads_only", False):  # ls/query/index: no runner import (start-up)
        stop: Any = contextlib.nullcontext()
    else:
        from perfscope.api.runner import stop_signals_as_interrupt

        stop = stop_signals_as_interrupt()
    try:
        # SIGTERM/SIGHUP unwind like Ctrl-C: temp files are removed, captured data kept.
        with stop:
            return int(args.handler(args, console))
    except UsageError as exc:
        sys.stderr.write(f"error: {safe_text(redact_text(str(exc)))}\n")
        return 2
    except PerfscopeError as exc:
        sys.stderr.write(f"error: {safe_text(redact_text(str(exc)))}\n")
        return 1
    except KeyboardInterrupt as exc:
        sig = f" by {exc}" if str(exc) else ""
        sys.stderr.write(f"interrupted{sig}\n")
        return 1
    except ModuleNotFoundError as exc:
        line = missing_extra_line(exc, getattr(args, "command", None))
        if line is None:
            raise
        sys.stderr.write(line + "\n")
        return 1
    except OSError as exc:  # a write outside the run store (an export, a report file)
        sys.stderr.write(f"error: {safe_text(redact_text(str(_storage_error(exc))))}\n")
        return 1


#: Top-level module → the optional extra that installs it (pyproject.toml's
#: ``[project.optional-dependencies]``). Core dependencies are not listed.
EXTRA_OF_MODULE: dict[str, str] = {
    "dash": "dashboard",
    "flask": "dashboard",
    "waitress": "dashboard",
    "duckdb": "index",
    "ray": "ray",
    "transformers": "hf",
    "tokenizers": "hf",
    "aiohttp": "openai",
    "h11": "openai",
}


def missing_extra_line(exc: ImportError, command: str | None) -> str | None:
    """One line naming the extra to install for a missing optional module, or None when the
    module is not one an extra provides (a real bug: let it surface)."""
    root = (exc.name or "").split(".", 1)[0]
    extra = EXTRA_OF_MODULE.get(root)
    if extra is None:
        return None
    what = f"perfscope {command}" if command else "perfscope"
    return f"error: {what} needs {root}, from the '{extra}' extra: pip install 'perfscope[{extra}]'"


def _storage_error(exc: OSError) -> StorageError:
    from perfscope.profiler.segments import storage_error

    return storage_error(exc.filename or "a file", exc)


if __name__ == "__main__":
    sys.exit(main())
