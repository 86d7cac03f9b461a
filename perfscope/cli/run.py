"""``perfscope run``, ``show`` and ``analyze``.

``run`` takes its flags from :mod:`perfscope.cli.options` (the one set of run options) and
turns them into the library's ``RunArgs`` with :func:`perfscope.cli.options.run_args`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

from perfscope.cli._argtypes import (
    add_runs_dir,
)
from perfscope.cli.options import add_run_options, infinite_rate_as_mode, run_args
from perfscope.cli.safe import SafeConsole, safe_markup
from perfscope.errors import StorageError
from perfscope.profiler.redact import redact_text

__all__ = ["register_analyze", "register_run"]


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


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    from perfscope.api.run import execute, plan
    from perfscope.cli.progress import progress_hook
    from perfscope.cli.render import summary_view

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
