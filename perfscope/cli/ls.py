"""``perfscope ls``: the stored runs, newest first, or those an SQL condition picks.

Answered by the reads-only parser (``perfscope.cli.READS_ONLY_COMMANDS``): its start-up
imports none of the other commands' modules.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from perfscope.cli._argtypes import add_runs_dir, positive_int

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``ls`` command."""
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
