"""The perfscope section at the end of pytest's output: one block per measured run, one
row per metric (measured, limit, baseline, change, verdict), then the regressions."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from perfscope.analysis.catalogue import format_change, format_metric
from perfscope.pytest_plugin._state import SessionState

if TYPE_CHECKING:
    from perfscope.pytest_plugin._baseline import MetricComparison

__all__ = ["table_text", "write_terminal_summary"]


#: Most "could not see its tolerance" notices written (the rest are counted).
_BLIND_LINES = 12


def _short(nodeid: str) -> str:
    """``tests/test_x.py::test_y#label`` → ``test_y#label`` (the file is in pytest's output)."""
    return nodeid.split("::", 1)[-1]


def table_text(state: SessionState, width: int) -> str:
    """The summary table: one block per measured run, one row per metric."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    compare = state.baseline is not None
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("perf test / metric", overflow="fold")
    table.add_column("measured", justify="right", no_wrap=True)
    table.add_column("limit", justify="right", no_wrap=True)
    if compare:
        table.add_column("baseline", justify="right", no_wrap=True)
        table.add_column("change", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    blank = [""] * (len(table.columns) - 1)
    for rec in state.perf_records():
        for m in rec.measurements:
            mine = [o for mm, o, _ in rec.outcomes if mm is m]
            names = list(m.metrics)
            names += [o.metric for o in mine if o.metric not in names]
            table.add_row(_short(m.key), *blank[:-1], rec.outcome if rec.outcome else "")
            for name in names:
                entry = m.metrics.get(name)
                path = (entry.path if entry else None) or name
                outs = [o for o in mine if o.metric == name]
                failed = [o for o in outs if not o.passed]
                shown = failed[0] if failed else (outs[-1] if outs else None)
                limit = ""
                if shown is not None:
                    limit = f"{shown.assertion.op} {format_metric(shown.assertion.threshold, path)}"
                value = entry.value if entry else (shown.measured if shown else None)
                verdicts = ["FAIL" if failed else "pass"] if outs else []
                cells = [f"  {name}", format_metric(value, path), limit]
                if compare:
                    comp = next(
                        (c for c in rec.comparisons if c.key == m.key and c.metric == name), None
                    )
                    base = comp.baseline if comp else None
                    change = comp.change if comp else None
                    cells += [
                        format_metric(base, path) if base is not None else "-",
                        format_change(change) if change is not None else "-",
                    ]
                    if comp is not None:
                        verdicts.append(comp.verdict.upper() if comp.regressed else comp.verdict)
                cells.append(", ".join(verdicts))
                table.add_row(*cells)
    # A wide console: the table takes its natural width instead of folding metric names.
    console = Console(
        file=io.StringIO(), width=max(width, 200), color_system=None, force_terminal=False
    )
    console.print(table)
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def write_terminal_summary(tr: Any, state: SessionState, width: int) -> None:
    """Write the perf tests' table, the regressions and the notes to pytest's terminal."""
    records = state.perf_records()
    if not records and not state.notes:
        return
    if records:
        n_runs = sum(len(m.run_dirs) for r in records for m in r.measurements)
        title = f"perfscope: {len(records)} perf test(s), {n_runs} run(s)"
        if state.baseline is not None:
            machine = state.baseline.hardware_key
            commit = state.baseline.commit.id if state.baseline.commit else None
            title += f" vs baseline {state.compare!r} ({machine}"
            title += f", commit {str(commit)[:10]})" if commit else ")"
        tr.section(title, sep="-")
        if state.mismatch:
            tr.write_line(f"warning (forced): {state.mismatch}", yellow=True)
        tr.write(table_text(state, width))
    blind = [c for r in records for c in r.comparisons if c.blind]
    for c in blind[:_BLIND_LINES]:
        tr.write_line(f"perfscope: {_short(c.key)}: {c.blind_text()}", yellow=True)
    if len(blind) > _BLIND_LINES:
        tr.write_line(
            f"perfscope: ... and {len(blind) - _BLIND_LINES} more metrics whose repeats could "
            "not see their tolerance (--perfscope-json lists them: 'needs')",
            yellow=True,
        )
    regressions = state.regressions()
    if regressions:
        by_key: dict[str, list[MetricComparison]] = {}
        for c in regressions:
            by_key.setdefault(c.key, []).append(c)
        tr.section(
            f"perfscope: {len(regressions)} metric(s) of {len(by_key)} run(s) regressed "
            f"against baseline {state.compare!r}",
            sep="-",
            red=True,
        )
        for key, comps in by_key.items():
            changes = ", ".join(
                f"{c.metric} {format_change(c.change)}" if c.change is not None else c.metric
                for c in comps
            )
            tr.write_line(f"{_short(key)}: {changes}", red=True)
    for note in state.notes:
        tr.write_line(f"perfscope: {note}")
