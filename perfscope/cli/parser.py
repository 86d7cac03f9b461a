"""The ``perfscope`` argument parser: argparse with one-line errors and suggestions.

A mistyped flag or subcommand gets "did you mean"; another tool's flag of the same meaning
gets a pointer to perfscope's (docs/flags.md); every error is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any, ClassVar, NoReturn

__all__ = ["Parser"]


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of usage + error, and a "did you
    mean" suggestion for a mistyped flag or subcommand."""

    #: The whole command line being parsed (set by :func:`main`), to find the subcommand.
    argv: ClassVar[list[str]] = []

    def _selected(self) -> argparse.ArgumentParser:
        """The innermost subcommand parser named on the command line."""
        parser: argparse.ArgumentParser = self
        argv = Parser.argv or sys.argv[1:]
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
    argv = Parser.argv
    if flag in argv and argv.index(flag) + 1 < len(argv):
        return argv[argv.index(flag) + 1]
    return None
