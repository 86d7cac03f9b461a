"""A stored, analysed run with typed attribute access to its summary.

``run.ttft.p99`` (seconds), ``run.throughput.output_tok_s``, ``run.goodput.attainment``,
``run.roofline.decode.mbu``, ``run.energy.j_per_output_token`` ... — attribute access over the
typed :class:`~perfscope.analysis.Summary`, so tests and scripts read naturally. A name that
is not there raises an ``AttributeError`` (a record's own fields say why a section is not
available: ``energy.j_per_token`` when energy is unavailable, ``roofline.decode`` without a
decode phase).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from perfscope.analysis import Summary
from perfscope.jsontypes import JsonObject
from perfscope.profiler.store import StoredRun, read_run, resolve_run_path

__all__ = ["Run", "load_run", "summary_attribute"]


def summary_attribute(summary: Summary, name: str, owner: str) -> Any:
    """``run.<name>`` of a :class:`Run` or :class:`~perfscope.api.runset.RunSet`: a latency
    metric (``ttft``, ...) is ``summary.latency.<name>``, anything else a field of the
    :class:`~perfscope.analysis.Summary` type (never its ``extra``); lists of records (errors,
    warnings, advice, projections) come back as lists. AttributeError otherwise."""
    latency = summary.latency.metrics()
    if name in latency:
        return latency[name]
    if name in Summary.field_names():
        value = getattr(summary, name)
        return list(value) if isinstance(value, tuple) else value
    raise AttributeError(f"{owner} has no attribute {name!r}")


class Run:
    """A run directory and its typed summary.

    Attributes:
        path: the run directory.
        manifest: manifest.json as a dict (a JSON object as read; kept a dict for
            compatibility: the stages after capture read it typed, through
            :class:`~perfscope.analysis.manifest.RunManifest`, which
            ``perfscope.analysis.manifest.manifest_view(run.manifest)`` builds).
        summary: the typed :class:`~perfscope.analysis.Summary` (its summary.json form is
            ``run.summary.to_dict()``).

    ``run.ttft`` (and the other latency metrics) is ``run.summary.latency.ttft``; every other
    section is ``run.summary.<section>`` (``run.roofline.decode.mbu``,
    ``run.energy.j_per_token``, ``run.throughput.output_tok_s``).
    """

    def __init__(self, stored: StoredRun, summary: Summary | None = None) -> None:
        """``summary``: the run's summary as just computed (capture's caller has it typed:
        it is not read back from ``stored.summary`` again)."""
        if summary is None:
            if stored.summary is None:
                from perfscope.api.analyze import analyze_stored

                summary = analyze_stored(stored, write=False)  # reading never writes
            else:
                summary = Summary.from_dict(stored.summary)
        self._stored = stored
        self.path: Path = stored.path
        self.manifest: JsonObject = stored.manifest
        self.summary: Summary = summary

    @property
    def run_id(self) -> str:
        return self._stored.run_id

    @property
    def status(self) -> str:
        return self._stored.status

    # Tables (DataFrames with the record columns).
    @property
    def requests(self) -> pd.DataFrame:
        return self._stored.requests

    @property
    def chunks(self) -> pd.DataFrame:
        return self._stored.chunks

    @property
    def steps(self) -> pd.DataFrame:
        return self._stored.steps

    @property
    def telemetry(self) -> pd.DataFrame:
        return self._stored.telemetry

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return summary_attribute(self.__dict__["summary"], name, "Run")

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status!r})"


def load_run(path: str | Path, runs_dir: str | Path | None = None) -> Run:
    """Load a stored run: a directory, a run id under ``runs_dir``, or ``"latest"``."""
    root = Path(runs_dir) if runs_dir is not None else None
    return Run(read_run(resolve_run_path(path, root)))
