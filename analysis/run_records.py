"""The one protocol for "a run's records": what every stage after capture reads of a run.

``perfscope.profiler.store.StoredRun`` is one; the analysis (:func:`perfscope.analysis.analyze`)
reads exactly this, and the exporters read it plus the summary
(:class:`perfscope.dashboard.exporters.ExportableRun`). It lives apart from the pipeline so
that naming it imports no analysis section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RunRecords"]


class RunRecords(Protocol):
    """What the analysis reads of a stored run (``perfscope.profiler.store.StoredRun`` is
    one): the manifest and the four record tables (empty frames when absent)."""

    @property
    def manifest(self) -> Mapping[str, Any]: ...  # the JSON object; read via RunManifest
    @property
    def requests(self) -> pd.DataFrame: ...
    @property
    def chunks(self) -> pd.DataFrame: ...
    @property
    def steps(self) -> pd.DataFrame: ...
    @property
    def telemetry(self) -> pd.DataFrame: ...
