"""``perfscope advisor calibrate [STUDIES...]`` and ``perfscope advisor table [STUDIES...]``.

``calibrate`` rebuilds the advisor's calibration (``analysis/calibration.json`` by default)
from stored study records; ``table`` prints "technique | projected | speed of light |
measured [interval] | error" for the same studies, with the median absolute projection
error over the significant effects. Nothing in either is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from perfscope.errors import UsageError

if TYPE_CHECKING:
    from perfscope.analysis.calibration import CalibrationEntry
    from perfscope.analysis.overhead import OverheadFit, StepSamples
    from perfscope.analysis.study import Study

__all__ = [
    "TABLE_END",
    "TABLE_START",
    "fit_runs",
    "load_studies",
    "median_abs_error",
    "projection_table",
    "register",
    "table_text",
    "with_table",
]

#: Where ``perfscope study --save`` stores studies and ``advisor calibrate`` reads them.
STUDIES_DIR = Path("samples") / "studies" / "results"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``perfscope advisor``."""
    p = subparsers.add_parser(
        "advisor", help="the advisor's calibration: rebuild it from stored studies, show it"
    )
    sub = p.add_subparsers(dest="advisor_command", required=True, metavar="COMMAND")
    c = sub.add_parser(
        "calibrate",
        help="rebuild the calibration from stored studies (perfscope study --save)",
    )
    c.add_argument(
        "studies",
        nargs="*",
        type=Path,
        help=f"study JSON files or folders (default: {STUDIES_DIR})",
    )
    c.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="calibration file to write (default: the packaged analysis/calibration.json)",
    )
    c.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when the file differs from what the studies give",
    )
    c.set_defaults(handler=_cmd_calibrate)
    t = sub.add_parser(
        "table",
        help="technique | projected | speed of light | measured [interval] | error",
    )
    t.add_argument("studies", nargs="*", type=Path, help=f"default: {STUDIES_DIR}")
    t.add_argument("--all", action="store_true", help="also effects that are not significant")
    t.add_argument(
        "--write",
        type=Path,
        action="append",
        default=None,
        metavar="MARKDOWN",
        help=f"put the table in MARKDOWN between {TABLE_START} and {TABLE_END} (repeatable)",
    )
    t.add_argument(
        "--check",
        action="store_true",
        help="with --write: change nothing; exit 1 when a file's table is not the one the "
        "stored studies give",
    )
    t.set_defaults(handler=_cmd_table)
    f = sub.add_parser(
        "fit",
        help="fit per-step time = roofline + host terms (per layer, sequence, token, step) "
        "to runs' steps, each run and all together, with the residual",
    )
    f.add_argument("runs", nargs="+", help="run directories or ids (one device)")
    f.add_argument("--runs-dir", default=None, help="where run ids are looked up")
    f.add_argument("--json", action="store_true", help="print the fits as JSON")
    f.set_defaults(handler=_cmd_fit)


def _study_files(paths: Sequence[Path]) -> list[Path]:
    roots = list(paths) or [STUDIES_DIR]
    files: list[Path] = []
    for p in roots:
        if p.is_dir():
            files.extend(sorted(p.glob("*.json")))
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(f"no study file or folder {str(p)!r} (store studies with --save)")
    if not files:
        raise UsageError(
            f"no stored studies in {', '.join(str(p) for p in roots)}: run "
            "`perfscope study KNOB --values ... --save` first"
        )
    return files


def _machine_from_runs(study: Study) -> dict[str, object]:
    """An older record without ``machine``: the machine of its first run's summary."""
    from perfscope.analysis.calibration import machine_of_summary

    for s in study.settings:
        for r in s.runs:
            path = Path(r.run) / "summary.json"
            try:
                return machine_of_summary(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
    return {}


def load_studies(paths: Sequence[Path]) -> list[tuple[Path, Study]]:
    """The stored studies under ``paths`` (files or folders), each with its path.

    Raises:
        UsageError: a path is missing, none holds a study, or a file is not a study record.
    """
    from perfscope.analysis.study import read_study

    out = []
    for f in _study_files(paths):
        try:
            st = read_study(f)
        except (OSError, ValueError) as exc:
            raise UsageError(f"{f}: not a stored study ({exc})") from None
        if not st.machine:
            st = replace(st, machine=_machine_from_runs(st))
        out.append((f, st))
    return out


def _entries(paths: Sequence[Path]) -> list[CalibrationEntry]:
    from perfscope.analysis.calibration import build_calibration

    return build_calibration(load_studies(paths), root=Path.cwd())


def _cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    from perfscope.analysis.calibration import (
        CALIBRATION_FILE,
        calibration_document,
        write_calibration,
    )

    entries = _entries(args.studies)
    target = args.output or CALIBRATION_FILE
    if args.check:
        want = calibration_document(entries)
        try:
            have = json.loads(Path(target).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            have = None
        if have != want:
            console.print(f"{target} differs from what the stored studies give: re-run calibrate")
            return 1
        console.print(f"{target} matches {len(entries)} entries from the stored studies")
        return 0
    write_calibration(target, entries)
    sig = sum(e.significant for e in entries)
    console.print(
        f"wrote {target}: {len(entries)} entries ({sig} significant) from "
        f"{len({e.study_file for e in entries})} studies"
    )
    return 0


def _r(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}x"


def projection_table(entries: Sequence[CalibrationEntry], *, everything: bool = False) -> str:
    """Markdown: technique | change | metric | machine | projected | speed of light |
    measured [interval] | error, significant effects only unless ``everything``."""
    lines = [
        "| technique | change | metric | machine | projected | speed of light "
        "| measured [interval] | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        if not (everything or e.significant):
            continue
        err = "–" if e.error is None else f"{100 * e.error:+.0f}%"
        lines.append(
            f"| {e.technique} | {e.change} | {e.metric} | {e.machine.describe()} "
            f"| {_r(e.projected_ratio)} | {_r(e.sol_ratio)} | {e.measured_text()} | {err} |"
        )
    return "\n".join(lines)


def median_abs_error(entries: Sequence[CalibrationEntry]) -> float | None:
    """The median of ``|error|`` over the significant entries with a projection."""
    errs = [abs(e.error) for e in entries if e.significant and e.error is not None]
    return statistics.median(errs) if errs else None


#: The markers between which ``advisor table --write`` puts the table in a Markdown file.
TABLE_START = "<!-- perfscope advisor table: start -->"
TABLE_END = "<!-- perfscope advisor table: end -->"


def table_text(entries: Sequence[CalibrationEntry], *, everything: bool = False) -> str:
    """The table and the median absolute projection error line under it."""
    med = median_abs_error(entries)
    n = sum(1 for e in entries if e.significant and e.error is not None)
    return (
        projection_table(entries, everything=everything)
        + "\n\nmedian absolute projection error over significant effects: "
        + ("– (none significant)" if med is None else f"{100 * med:.0f}% ({n} effects)")
    )


def with_table(markdown: str, table: str, where: Path) -> str:
    """``markdown`` with the text between :data:`TABLE_START` and :data:`TABLE_END`
    replaced by ``table`` (and the command that made it).

    Raises:
        UsageError: the markers are missing or out of order.
    """
    a, b = markdown.find(TABLE_START), markdown.find(TABLE_END)
    if a < 0 or b < a:
        raise UsageError(
            f"{where}: no table markers; put {TABLE_START} and {TABLE_END} on lines of "
            "their own where the table goes"
        )
    body = (
        "\n<!-- generated by `perfscope advisor table --write` from "
        "samples/studies/results; do not edit -->\n\n" + table + "\n\n"
    )
    return markdown[: a + len(TABLE_START)] + body + markdown[b:]


def _cmd_table(args: argparse.Namespace, console: Console) -> int:
    entries = _entries(args.studies)
    text = table_text(entries, everything=args.all)
    if not args.write:
        if args.check:
            raise UsageError("--check compares the files of --write: name them")
        print(text)
        return 0
    stale = []
    for path in args.write:
        try:
            old = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {path} ({exc.strerror})") from None
        new = with_table(old, text, path)
        if new == old:
            console.print(f"{path}: the table is the stored studies'")
        elif args.check:
            stale.append(path)
            console.print(f"{path}: the table differs from the stored studies' (run --write)")
        else:
            path.write_text(new, encoding="utf-8")
            console.print(f"{path}: table written")
    return 1 if stale else 0


def fit_runs(runs: Sequence[str], runs_dir: str | None = None) -> list[tuple[str, OverheadFit]]:
    """The fitted cost model of each run's steps, then of all of them together (``all``)
    when there are several; runs must share one device.

    Raises:
        UsageError: a run without steps, model or device, or runs on different devices.
    """
    from perfscope.analysis.modelspec import ModelSpec
    from perfscope.analysis.overhead import fit_overhead, samples_from_steps
    from perfscope.hwdb.spec import DeviceSpec
    from perfscope.profiler.store import read_run, resolve_run_path

    samples: list[StepSamples] = []
    out: list[tuple[str, OverheadFit]] = []
    for ref in runs:
        run = read_run(resolve_run_path(ref, Path(runs_dir) if runs_dir else None))
        summary = run.summary or {}
        spec = (summary.get("hardware") or {}).get("spec")
        model = summary.get("model")
        if run.steps.empty or not spec or not model:
            raise UsageError(
                f"{run.path.name}: no engine steps, model or device to fit (a reference, hf "
                "or vLLM run records its steps; analyse it first with `perfscope analyze`)"
            )
        s = samples_from_steps(
            run.steps, ModelSpec.from_dict(dict(model)), DeviceSpec.from_dict(dict(spec))
        )
        if samples and s.device != samples[0].device:
            raise UsageError(
                f"{run.path.name} was analysed against {s.device}, the others against "
                f"{samples[0].device}: fit runs of one device (re-analyse with --hw)"
            )
        try:
            out.append((run.path.name, fit_overhead(s)))
        except ValueError as exc:
            raise UsageError(f"{run.path.name}: {exc}") from None
        samples.append(s)
    if len(samples) > 1:
        out.append(("all", fit_overhead(samples)))
    return out


def _cmd_fit(args: argparse.Namespace, console: Console) -> int:
    from perfscope.dashboard.terminal import FitTable

    fits = fit_runs(args.runs, args.runs_dir)
    if args.json:
        print(json.dumps({name: f.to_dict() for name, f in fits}, indent=2))
        return 0
    t = FitTable(
        ("runs", "x roofline", "per layer", "per sequence", "per token", "per step", "residual"),
        title="fitted per-step time = k x roofline + host terms (non-negative least squares)",
        right=frozenset(
            ("x roofline", "per layer", "per sequence", "per token", "per step", "residual")
        ),
    )
    us = 1e6
    for name, f in fits:
        t.add_row(
            name,
            f"{f.roof_scale:.3g}",
            f"{f.per_layer_s * us:.3g} us",
            f"{f.per_sequence_s * us:.3g} us",
            f"{f.per_token_s * us:.3g} us",
            f"{f.per_step_s * us:.3g} us",
            f"{f.residual_rms_s * us:.3g} us rms ({100 * f.residual_rel:.0f}%, {f.samples} steps)",
        )
    console.print(t)
    for name, f in fits:
        if f.folded:
            console.print(
                f"{name}: not separable in these steps, folded into per step: "
                + ", ".join(f.folded)
            )
    return 0
