"""A stored, analysed run with typed attribute access to its summary.

``run.ttft.p99`` (seconds), ``run.throughput.output_tok_s``, ``run.goodput.attainment``,
``run.roofline.decode.mbu``, ``run.energy.j_per_output_token`` ... — attribute access over the
typed :class:`~perfscope.analysis.Summary`, so tests and scripts read naturally. A name that
is not there raises an ``AttributeError`` that lists what is (and why a section is not
available). :class:`Section` is the same attribute view over a plain summary dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from perfscope.analysis import Summary
from perfscope.profiler.store import StoredRun, read_run, resolve_run_path

__all__ = ["Run", "Section", "load_run"]


#: Short names users reach for → where the summary keeps them, per section.
_ALIASES: dict[str, dict[str, str]] = {
    "energy": {"j_per_token": "j_per_output_token"},
}
#: Sections whose sub-objects may be addressed without their container
#: (``run.roofline.decode`` for ``run.roofline.phases.decode``).
_FLATTEN: dict[str, str] = {"roofline": "phases", "energy": "phases"}


class Section:
    """Read-only attribute view of one summary section (a JSON object)."""

    __slots__ = ("_data", "_path")

    def __init__(self, data: dict[str, Any], path: str) -> None:
        self._data = data
        self._path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        data = self._data
        key = _ALIASES.get(self._path, {}).get(name, name)
        if key in data:
            value = data[key]
        elif (
            isinstance(data.get(_FLATTEN.get(self._path, "")), dict)
            and key in data[_FLATTEN[self._path]]
        ):
            value = data[_FLATTEN[self._path]][key]
        else:
            why = (
                f" ({self._path} is not available: {data.get('reason')})"
                if data.get("available") is False
                else ""
            )
            raise AttributeError(
                f"{self._path} has no {name!r}{why}; it has: {', '.join(sorted(data))}"
            )
        return Section(value, f"{self._path}.{name}") if isinstance(value, dict) else value

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__(name)

    def __contains__(self, name: str) -> bool:
        return name in self._data

    def to_dict(self) -> dict[str, Any]:
        return self._data

    def __repr__(self) -> str:
        return f"Section({self._path}: {self._data!r})"


class Run:
    """A run directory and its typed summary.

    Attributes:
        path: the run directory.
        manifest: manifest.json as a dict (as read; kept a dict for compatibility: the stages
            after capture read it typed, through
            :class:`~perfscope.analysis.manifest.RunManifest`).
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
        self.manifest: dict[str, Any] = stored.manifest
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
        summary: Summary = self.__dict__["summary"]
        latency = summary.latency.metrics()
        if name in latency:
            return latency[name]
        if name in summary:  # a field of the Summary type, never its ``extra``
            value = getattr(summary, name)
            # Lists (errors, warnings, advice, projections) are lists of their records.
            return list(value) if isinstance(value, tuple) else value
        raise AttributeError(f"Run has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status!r})"


def load_run(path: str | Path, runs_dir: str | Path | None = None) -> Run:
    """Load a stored run: a directory, a run id under ``runs_dir``, or ``"latest"``."""
    root = Path(runs_dir) if runs_dir is not None else None
    return Run(read_run(resolve_run_path(path, root)))
