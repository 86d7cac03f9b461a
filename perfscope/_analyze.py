"""Turn a stored run into summary.json: metrics, hardware, roofline, energy, advice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfscope.analysis.summary import build_summary
from perfscope.profiler.store import StoredRun, read_run, write_json_atomic

__all__ = ["analyze_path", "analyze_stored"]


def analyze_stored(
    run: StoredRun,
    *,
    slos: dict[str, float] | None = None,
    hw: str | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """Compute (and by default write) the summary of ``run``.

    Args:
        slos: SLO limits in seconds; ``None`` keeps the ones recorded in the manifest.
        hw: device to analyse against (anything the hardware lookup accepts); ``None`` keeps
            the manifest's device.
    """
    extra: dict[str, Any] = {}
    summary = build_summary(
        run.manifest,
        run.requests,
        run.chunks,
        run.steps,
        run.telemetry,
        slos=slos,
        extra_sections=extra,
    )
    if write:
        write_json_atomic(run.path / "summary.json", summary)
    run.summary = summary
    return summary


def analyze_path(
    path: Path | str, *, slos: dict[str, float] | None = None, hw: str | None = None
) -> dict[str, Any]:
    """Read the run at ``path``, recompute and write its summary."""
    return analyze_stored(read_run(path), slos=slos, hw=hw)
