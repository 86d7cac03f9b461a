"""Analyse a stored run and store its summary.json (the front door's half of ``analyze``).

The analysis itself is :func:`perfscope.analysis.analyze`; this adds the file write.
"""

from __future__ import annotations

from collections.abc import Mapping

from perfscope.analysis import Summary, analyze
from perfscope.hwdb import HardwareDatabase
from perfscope.profiler.server_metrics import read_server_metrics
from perfscope.profiler.store import StoredRun, write_json_atomic

__all__ = ["analyze_stored"]


def analyze_stored(
    run: StoredRun,
    *,
    slos: Mapping[str, float] | None = None,
    hw: str | None = None,
    write: bool = True,
    database: HardwareDatabase | None = None,
) -> Summary:
    """Compute (and by default write to ``run.path/summary.json``) the summary of ``run``.

    Args:
        slos: SLO limits in seconds; ``None`` keeps the ones recorded in the manifest.
        hw: device to analyse against (anything the hardware lookup accepts); ``None`` keeps
            the device recorded in the manifest.
        database: an already loaded hardware database.
    """
    summary = analyze(
        run, slos=slos, device=hw, database=database, server_metrics=read_server_metrics(run.path)
    )
    data = summary.to_dict()
    if write:
        write_json_atomic(run.path / "summary.json", data)
    run.summary = data
    return summary
