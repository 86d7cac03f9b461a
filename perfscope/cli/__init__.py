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
import os
import sys
from collections.abc import Sequence
from typing import Any

from perfscope import __version__
from perfscope.cli import ls
from perfscope.cli.options import add_run_options, infinite_rate_as_mode
from perfscope.cli.parser import Parser
from perfscope.cli.run import register_analyze, register_run
from perfscope.cli.safe import SafeConsole, configure_streams, safe_text
from perfscope.errors import PerfscopeError, StorageError, UsageError
from perfscope.profiler.redact import redact_text

__all__ = ["add_run_options", "build_parser", "infinite_rate_as_mode", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The whole ``perfscope`` parser: run, show, ls and analyze, then each command group's
    module (:func:`_command_modules`) in help order."""
    parser = Parser(
        prog="perfscope", description="Inference performance profiler and roofline analyzer."
    )
    parser.add_argument("--version", action="version", version=f"perfscope {__version__}")
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=Parser
    )
    register_run(sub)
    ls.register(sub)
    register_analyze(sub)

    for module in _command_modules():
        module.register(sub)
    return parser


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

    parser = Parser(
        prog="perfscope", description="Inference performance profiler and roofline analyzer."
    )
    parser.add_argument("--version", action="version", version=f"perfscope {__version__}")
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=Parser
    )
    ls.register(sub)
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
    Parser.argv = argv
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
