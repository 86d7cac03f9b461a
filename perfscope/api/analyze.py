"""Analyse a stored run and store its summary.json (the front door's half of ``analyze``).

The analysis itself is :func:`perfscope.analysis.analyze`; this adds the file write.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from perfscope.analysis import Summary, analyze
from perfscope.hwdb import HardwareDatabase
from perfscope.profiler.store import StoredRun, write_json_atomic

__all__ = ["analyze_stored", "projection_path", "write_analysis"]


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
        run, slos=slos, device=hw, database=database, server_metrics=run.server_metrics
    )
    data = summary.to_dict()
    if write:
        write_json_atomic(run.path / "summary.json", data)
    run.summary = data
    return summary


def projection_path(run: StoredRun, hw: str) -> Path:
    """Where ``analyze --hw X`` writes the run analysed against another device: beside the
    stored ``summary.json``, as ``summary.hw-<X>.json`` (``X`` made file-name safe)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", hw).strip("-") or "device"
    return run.path / f"summary.hw-{safe}.json"


def write_analysis(run: StoredRun, summary: Summary, *, hw: str | None, save: bool) -> Path:
    """Store a re-analysis without losing the run's own summary.

    Without ``hw`` (or with ``save``) it is the run's summary: ``summary.json`` is replaced.
    With ``hw`` and no ``save`` it is a projection onto that device: written beside the
    stored summary (:func:`projection_path`), which keeps its analysis and advice.
    Returns the path written.
    """
    path = run.path / "summary.json" if hw is None or save else projection_path(run, hw)
    write_json_atomic(path, summary.to_dict())
    return path
