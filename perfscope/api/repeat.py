"""``perfscope run --repeat N [--vs ENGINE]``: run sets for comparisons that know their noise.

Each configuration runs ``N`` times; with ``--vs`` the two configurations alternate (A B A B
...) so slow drifts of the machine (thermal state, other tenants) hit both alike. Every run
records its set in the manifest (``run_set``: ``id``, ``label``, ``index``, ``repeat``), so
``perfscope compare`` and the dashboard can group the runs back into sets.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.errors import UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from perfscope.api.run import RunArgs
    from perfscope.api.runner import ProgressHook

__all__ = ["run_repeated"]


def _label(engine: str, name: str | None) -> str:
    return name or engine


def run_repeated(
    args: RunArgs,
    repeat: int,
    vs: str | None,
    hook: ProgressHook,
    console: Console,
    err: Console,
    *,
    as_json: bool = False,
    report: bool = False,
) -> int:
    """Run ``args`` ``repeat`` times (alternating with engine ``vs`` when given), then print
    the comparison (with ``vs``) or the run set; returns the exit code (1 if any run did not
    complete). Both configurations are planned (and so checked) before anything runs."""
    from perfscope.api.run import RunPlan, execute, plan
    from perfscope.cli.report import write_run_report

    first = plan(args)
    opts = first.options
    if vs is not None and vs == opts.engine:
        raise UsageError(f"--vs {vs!r} is the engine under test; give a different engine")
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    set_id = f"{stamp}-{secrets.token_hex(2)}"
    configs: list[tuple[str, RunPlan]] = [("A", first)]
    if vs is not None:
        configs.append(("B", plan(replace(args, engine=vs))))
    labels = {
        "A": _label(opts.engine, opts.name),
        "B": _label(vs or "", f"{opts.name}-vs" if opts.name and vs else None),
    }
    paths: dict[str, list[Path]] = {key: [] for key, _ in configs}
    failed = 0
    for i in range(repeat):
        for key, base in configs:
            run_set = {
                "id": f"{set_id}-{key}",
                "label": labels[key],
                "index": i,
                "repeat": repeat,
                "interleaved": vs is not None,
            }
            o = base.options
            name = o.name or o.engine.split(":", 1)[0]
            run_plan = replace(
                base,
                options=replace(o, run_set=run_set, name=f"{name}-{key.lower()}" if vs else name),
            )
            outcome = execute(run_plan, hook)
            paths[key].append(outcome.path)
            warn = [w for w in outcome.summary.warnings if "CPU" in str(w)]
            err.print(
                f"run {i + 1}/{repeat} {labels[key]}: {outcome.path.name} ({outcome.status})"
                + (" [yellow]contended[/yellow]" if warn else "")
            )
            if report:
                write_run_report(outcome.path, err)
            if outcome.status != "complete":
                failed += 1
    sets = [",".join(p.name for p in paths[key]) for key, _ in configs]
    if vs is not None:
        from perfscope.cli.report import _load, _tables
        from perfscope.dashboard.compare import compare_sets, comparison_table

        runs = [[_load(str(p), None) for p in paths[key]] for key, _ in configs]
        result = compare_sets(
            [[_tables(r) for r in g] for g in runs],
            [f"{labels[k]} ({repeat} runs)" for k, _ in configs],
            run_ids=[[r.run_id for r in g] for g in runs],
        )
        if as_json:
            print(json.dumps(result, indent=2))
        else:
            console.print(comparison_table(result))
    elif as_json:
        print(json.dumps({"run_set": f"{set_id}-A", "runs": [str(p) for p in paths["A"]]}))
    else:
        console.print(
            f"run set {set_id}-A: {repeat} runs of {labels['A']}; compare it with another "
            f"set: perfscope compare {sets[0]} OTHER1,OTHER2,..."
        )
    if failed:
        err.print(f"[red]{failed} of {repeat * len(configs)} runs did not complete[/red]")
        return 1
    return 0
