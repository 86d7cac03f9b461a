"""``perfscope ls``: the runs table, in a module of its own so that listing imports only
what the table needs (no dashboard views, no hwdb resolution beyond the summary record)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.text import Text

from perfscope.analysis.catalogue import format_count, metric, value_at
from perfscope.cli.safe import safe_markup
from perfscope.dashboard.terminal import FitTable

__all__ = ["runs_table"]


def runs_table(
    rows: list[tuple[Path, Mapping[str, Any], Mapping[str, Any] | None]],
    states: list[tuple[str, str | None]] | None = None,
) -> FitTable:
    """``perfscope ls``: one row per run, newest first (stacked per run when narrow);
    ``states`` (state, reason) per row adds why a run is not complete (crashed, broken, ...)."""
    names = ("ttft.p50", "tpot.p50", "output_tok_s", "attainment")
    labels = ("TTFT p50", "TPOT p50", "output tok/s", "SLO met")  # short: fits 120 columns
    # summary.json is read as stored (same layout as the typed Summary): listing imports no
    # analysis record types, which cost a tenth of a second of start-up.
    from perfscope.analysis.manifest import is_contended, manifest_view

    cols: tuple[str, ...] = ("run", "status", "engine", "requests", *labels)
    # A reason column only when some run has one (an empty column costs the width of its
    # header, and pushes a 120-column terminal into the stacked layout).
    reasons = states is not None and any(why for _, why in states)
    if reasons:
        cols = (*cols, "reason")
    t = FitTable(cols, right=frozenset(("requests", *labels)), wrap=frozenset({"reason"}))
    any_contended = False
    for i, (path, raw_manifest, raw) in enumerate(rows):
        s = raw or {}
        manifest = manifest_view(raw_manifest)
        status = manifest.status or "?"
        slos = bool(value_at(s, "goodput.slos")) if raw else False
        contended = is_contended(manifest.host.contention)
        reason: list[Any] = []
        if states is not None:
            status = states[i][0]
            if reasons:
                reason = [safe_markup(states[i][1] or "")]
        any_contended = any_contended or bool(contended)
        t.add_row(
            safe_markup(path.name),
            Text(
                status + (" ⚠" if contended else ""),
                style="green" if status == "complete" and not contended else "red",
            ),
            safe_markup(manifest.engine.uri or "?"),
            format_count(value_at(s, "counts.completed")) if raw else "n/a",
            *(
                "no SLOs"
                if n == "attainment" and raw and not slos
                else (metric(n).format(metric(n).value(s)) if raw else "not analysed")
                for n in names
            ),
            *reason,
        )
    if any_contended:
        t.caption = (
            "⚠ contended: other processes used the machine's CPU during the run; its "
            "latencies and throughput are likely inflated"
        )
    return t
