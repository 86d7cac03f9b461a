"""``perfscope report``, ``perfscope compare`` and ``perfscope export``.

- ``report [RUN] [-o FILE]``: the self-contained HTML report (default ``RUN/report.html``).
- ``compare SET_A SET_B [...]``: key metrics side by side with ratios to SET_A; each SET is
  one run, a comma-separated list of runs or a glob of run ids (``'*-base-*'``). A change is
  called better/worse only beyond the run-to-run noise measured from repeats; single runs get
  ratios only. ``--report`` also writes a comparison page.
- ``export [RUN] --format perfetto|csv|json [-o PATH]``: a Perfetto/Chrome trace, CSV tables
  or one JSON file.

``write_run_report`` is what ``perfscope run`` calls after a run (``--report``, on by default).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.cli._argtypes import add_runs_dir, positive_int
from perfscope.errors import UsageError
from perfscope.jsontypes import JsonArray

if TYPE_CHECKING:
    from rich.console import Console

    from perfscope.analysis import Summary
    from perfscope.dashboard.compare import ConfigDiff
    from perfscope.profiler.store import StoredRun

__all__ = ["register", "write_run_report"]


def _load(ref: str, runs_dir: Path | None) -> StoredRun:
    """A stored run with its summary (computed in memory, never saved, when summary.json
    is missing: reading never writes). Crashed runs and ignored files are noted on stderr."""
    from perfscope.api.analyze import analyze_stored
    from perfscope.profiler.store import read_run, resolve_run_path

    run = read_run(resolve_run_path(ref, runs_dir))
    if run.state.state in ("running", "crashed"):
        sys.stderr.write(
            f"note: run {run.path.name} is {run.state.state} ({run.state.reason}): "
            "showing what was flushed (partial)\n"
        )
    for note in run.notes:
        sys.stderr.write(f"note: {note}\n")
    if run.summary is None:
        analyze_stored(run, write=False)
    return run


def _size(path: Path) -> str:
    from perfscope.profiler.output import output_kind

    if output_kind(path) != "regular":
        return "streamed"
    n = path.stat().st_size
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def write_run_report(
    run_dir: Path | StoredRun, console: Console, *, summary: Summary | None = None
) -> Path | None:
    """Write ``run_dir/report.html`` after ``perfscope run`` and say where it is.

    ``run_dir`` may be the run as capture already read it (``RunOutcome.stored``): then the
    directory is not read again; ``summary`` the summary record the analysis returned
    (``RunOutcome.summary``): then it is not converted again from its JSON form.

    A report that cannot be written never fails the run (its data is already stored): the
    reason is printed and ``None`` returned.
    """
    from perfscope.dashboard.report import write_report
    from perfscope.errors import StorageError
    from perfscope.profiler.store import StoredRun

    try:
        stored = run_dir if isinstance(run_dir, StoredRun) else _load(str(run_dir), None)
        path: Path = write_report(stored, summary=summary)
    except StorageError:
        raise  # disk full or read-only: one line and exit 1 from the CLI
    except Exception as exc:  # the run is stored; a report failure must not lose it
        console.print(f"[yellow]report not written[/yellow]: {type(exc).__name__}: {exc}")
        return None
    console.print(f"report: {path} ({_size(path)})")
    return path


def _confidence(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if v >= 1.0 and v < 100.0:
        v /= 100.0  # "95" means 95%
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (or a percentage), got {text}")
    return v


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``report``, ``compare`` and ``export`` commands."""
    p = subparsers.add_parser(
        "report",
        help="write a run's self-contained HTML report",
        description="Write one offline HTML file with the run's numbers, verdicts, figures, "
        "advice and requests (default: report.html in the run directory).",
    )
    p.add_argument("run", nargs="?", default="latest", help="run directory, run id or 'latest'")
    p.add_argument(
        "-o", "--output", type=Path, default=None, help="HTML file to write ('-' for stdout)"
    )
    p.add_argument(
        "--max-requests",
        type=positive_int,
        default=100,
        help="rows of the per-request table (default 100)",
    )
    add_runs_dir(p)
    p.add_argument("--json", action="store_true", help="print {path, bytes} as JSON")
    p.set_defaults(handler=_cmd_report)

    p = subparsers.add_parser(
        "compare",
        help="compare run sets: ratios, and better/worse only beyond run-to-run noise",
        description="Compare run sets with the first (the baseline). Each SET is a run, a "
        "comma-separated list of runs (A1,A2,A3) or a glob of run ids ('*-base-*'), e.g. the "
        "runs of 'perfscope run --repeat N'. Each metric is one number per run; runs made in "
        "the same blocks (run --repeat N --vs) are paired by block. One metric is primary; "
        "a change is better or worse only when its corrected test rejects no change; every "
        "comparison states the smallest change it could detect (docs/experiments.md).",
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="SET",
        help="two or more run sets (the first is the baseline): RUN, RUN1,RUN2,... or a glob",
    )
    p.add_argument(
        "--primary",
        metavar="METRIC",
        default=None,
        help="the metric whose verdict leads (default tpot.p50, else e2e.p50); the others "
        "are corrected for multiplicity",
    )
    p.add_argument(
        "--exclude-contended",
        action="store_true",
        help="leave out runs measured while other processes took the CPU (their blocks)",
    )
    from perfscope.cli.repeat import precision

    p.add_argument(
        "--detect",
        type=precision,
        default=None,
        metavar="PCT",
        help="a change of interest, e.g. 10%%: where the primary shows no detectable change, "
        "say how many blocks (runs a side) would detect one that large",
    )
    p.add_argument(
        "--confidence",
        type=_confidence,
        default=0.95,
        help="confidence of the intervals, 0-1 or a percentage (default 0.95)",
    )
    p.add_argument("--report", action="store_true", help="also write a comparison HTML page")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="comparison HTML file (with --report; default ./perfscope-compare.html)",
    )
    add_runs_dir(p)
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(handler=_cmd_compare)

    p = subparsers.add_parser(
        "export",
        help="export a run as a Perfetto trace, CSV or JSON",
        description="perfetto: Chrome/Perfetto trace JSON (open in ui.perfetto.dev; .gz "
        "compresses); csv: requests.csv and summary.csv; json: manifest, summary and requests.",
    )
    p.add_argument("run", nargs="?", default="latest", help="run directory, run id or 'latest'")
    p.add_argument(
        "--format",
        choices=("perfetto", "csv", "json"),
        required=True,
        help="output format: perfetto, csv or json (required; see above)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="file (perfetto, json; '-' for stdout) or folder (csv); default: in the run directory",
    )
    add_runs_dir(p)
    p.set_defaults(handler=_cmd_export)


def _cmd_report(args: argparse.Namespace, console: Console) -> int:
    from perfscope.dashboard.report import write_report

    run = _load(args.run, args.runs_dir)
    out = args.output
    if out is not None and out.is_dir():
        out = out / "report.html"
    path = write_report(run, out, max_requests=args.max_requests)
    if str(path) == "-":
        return 0  # the page went to stdout: nothing else may be printed there
    if args.json:
        print(json.dumps({"path": str(path), "bytes": path.stat().st_size}, indent=2))
    else:
        console.print(f"report: {path} ({_size(path)})")
    return 0


def expand_run_set(text: str, runs_dir: Path | None) -> list[Path]:
    """The runs one SET argument names: comma-separated refs, each a run directory, run id,
    ``latest``, a glob of run ids under the runs folder (newest first order kept), or the
    id of a run set that ``perfscope run --repeat`` printed (its runs, warm-ups left out)."""
    import fnmatch
    import re

    from perfscope.analysis.manifest import manifest_view
    from perfscope.profiler.store import (
        default_runs_root,
        list_runs,
        read_manifest,
        resolve_run_path,
    )

    out: list[Path] = []
    for ref in (r.strip() for r in text.split(",")):
        if not ref:
            continue
        if re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}-[A-Z]", ref):
            root = runs_dir or default_runs_root()
            members = []
            for p in list_runs(root):
                try:
                    rs = manifest_view(read_manifest(p)).run_set or {}
                except Exception:  # an unreadable run is not a member
                    continue
                if rs.get("id") == ref:
                    members.append((rs.get("block", rs.get("index", 0)), p))
            if not members:
                raise UsageError(f"no runs of run set {ref!r} in {root}; 'perfscope ls' lists runs")
            out += [p for _, p in sorted(members, key=lambda m: (m[0], str(m[1])))]
            continue
        if any(ch in ref for ch in "*?["):
            root = runs_dir or default_runs_root()
            pattern = Path(ref)
            if len(pattern.parts) > 1:
                root, ref = pattern.parent, pattern.name
            hits = sorted(p for p in list_runs(root) if fnmatch.fnmatchcase(p.name, ref))
            if not hits:
                raise UsageError(f"no runs match {ref!r} in {root}; 'perfscope ls' lists runs")
            out += hits
        else:
            out.append(resolve_run_path(ref, runs_dir))
    if not out:
        raise UsageError(f"empty run set {text!r}: give run ids, comma-separated, or a glob")
    return out


def _cmd_compare(args: argparse.Namespace, console: Console) -> int:
    from perfscope.dashboard.compare import (
        compare_sets,
        comparison_html,
        comparison_table,
        config_diff,
    )

    if len(args.runs) < 2:
        raise UsageError(
            "compare needs two or more run sets, e.g. 'perfscope compare RUN_A RUN_B' or "
            "'perfscope compare A1,A2,A3 B1,B2,B3'"
        )
    paths = [expand_run_set(text, args.runs_dir) for text in args.runs]
    flat = [p.resolve() for g in paths for p in g]
    if len(set(flat)) < len(flat):
        names = ", ".join(p.name for p in flat)
        raise UsageError(f"the same run is given twice ({names}); give different runs")
    sets = [[_load(str(p), args.runs_dir) for p in g] for g in paths]
    try:
        result = compare_sets(
            [[_tables(r) for r in g] for g in sets],
            run_ids=[[r.run_id for r in g] for g in sets],
            confidence=args.confidence,
            primary=args.primary,
            exclude_contended=args.exclude_contended,
            detect=args.detect,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    diff = config_diff([g[0].manifest or {} for g in sets])
    runs = [r for g in sets for r in g]
    out_path: Path | None = None
    if args.report:
        out_path = args.output or Path("perfscope-compare.html")
        html = comparison_html([_tables(r) for r in runs], result)
        from perfscope.profiler.output import write_output_text

        write_output_text(out_path, html)
    if args.json:
        payload = {**result.to_dict(), "config_diff": config_diff_json(diff)}
        payload["paths"] = [[str(r.path) for r in g] for g in sets]
        if out_path is not None:
            payload["report"] = str(out_path)
        print(json.dumps(payload, indent=2))
        return 0
    console.print(comparison_table(result))
    print_config_diff(result.labels, diff, console)
    if out_path is not None:
        console.print(f"comparison report: {out_path} ({_size(out_path)})")
    return 0


def config_diff_json(diff: Sequence[ConfigDiff]) -> JsonArray:
    """The configuration differences as ``--json`` prints them."""
    return [{"group": d.group, "field": d.field, "values": list(d.values)} for d in diff]


def print_config_diff(labels: Sequence[str], diff: Sequence[ConfigDiff], console: Console) -> None:
    """Name each side and print what differs between their configurations (first run of
    each set), or that nothing does."""
    from perfscope.dashboard.compare import side_name

    sides = " vs ".join(f"{side_name(i, len(labels))} = {lab}" for i, lab in enumerate(labels))
    if not diff:
        console.print(f"{sides}: identical configurations")
        return
    console.print(f"{sides}: configurations differ in")
    for d in diff[:20]:
        console.print(f"  {d.field}: " + " | ".join(str(v) for v in d.values))
    if len(diff) > 20:
        console.print(f"  ... and {len(diff) - 20} more fields (--json lists all)")


def _tables(run: StoredRun) -> Any:
    from perfscope.dashboard.figures import RunTables

    return RunTables(run.summary or {}, run.requests, run.chunks, run.steps, run.telemetry)


def _cmd_export(args: argparse.Namespace, console: Console) -> int:
    from perfscope.dashboard.exporters import (
        export_json,
        stream_perfetto,
        write_csv,
        write_json,
        write_perfetto,
    )

    run = _load(args.run, args.runs_dir)
    out: Path | None = args.output
    if args.format == "csv":
        if out is not None and str(out) == "-":
            raise UsageError("csv writes two files: give a folder with -o, not '-'")
        paths = write_csv(run, out or run.path)
        for p in paths:
            console.print(f"wrote {p} ({_size(p)})")
        return 0
    if out is not None and str(out) == "-":
        from perfscope.profiler.output import write_output, write_output_text

        if args.format == "perfetto":
            write_output("-", lambda f: (stream_perfetto(run, f), f.write(b"\n")))
        else:
            write_output_text("-", json.dumps(export_json(run), default=str) + "\n")
        return 0
    if args.format == "perfetto":
        path = write_perfetto(run, out or run.path / "trace.json")
        console.print(
            f"wrote {path} ({_size(path)}); open it at https://ui.perfetto.dev (offline: "
            "chrome://tracing)"
        )
    else:
        path = write_json(run, out or run.path / "export.json")
        console.print(f"wrote {path} ({_size(path)})")
    return 0
