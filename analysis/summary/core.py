"""The :class:`Summary`: every section of one run's analysis, and its summary.json form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from perfscope.analysis._record import Record
from perfscope.analysis.summary._common import ABSENT, SUMMARY_SCHEMA
from perfscope.analysis.summary.advice import (
    Advice,
    Projection,
    Speculative,
)
from perfscope.analysis.summary.context import (
    Client,
    Contention,
    PromptCache,
    RunSet,
    ServerMetrics,
)
from perfscope.analysis.summary.energy import Energy
from perfscope.analysis.summary.measured import (
    Counts,
    Distribution,
    EngineInfo,
    ErrorCount,
    Goodput,
    Hardware,
    Latency,
    StepStats,
    Throughput,
)
from perfscope.analysis.summary.roofline import Roofline
from perfscope.jsontypes import JsonObject, json_str

__all__ = ["Summary"]


@dataclass(frozen=True, kw_only=True)
class Summary(Record):
    """Everything derived from one stored run (see the module docstring).

    Identity: ``run_id``, ``name``, ``status`` (complete, interrupted, failed),
    ``started_at`` (ISO 8601), ``perfscope_version``, ``engine``; the configured ``workload``
    and ``load`` as recorded in the manifest; ``window_s`` the measured window (s).

    It is typed all the way down: read ``summary.latency.ttft.p99``; code that wants the
    summary.json object (the pytest grammar, baselines, user scripts) calls :meth:`to_dict`.
    ``contention``, ``run_set`` and ``model_spec`` come from the manifest; ``prompt_cache`` and
    ``server_metrics`` are ``None`` when the run has no such data (and ``model_spec`` and
    ``server_metrics`` are then left out of the JSON, as before).
    """

    schema: str = SUMMARY_SCHEMA
    run_id: str | None = None
    name: str | None = None
    status: str | None = None
    started_at: str | None = None
    perfscope_version: str | None = None
    engine: EngineInfo = field(default_factory=EngineInfo)
    workload: JsonObject | None = None
    load: JsonObject | None = None
    counts: Counts = field(default_factory=Counts)
    window_s: float = 0.0
    latency: Latency = field(default_factory=Latency)
    throughput: Throughput = field(default_factory=Throughput)
    goodput: Goodput = field(default_factory=Goodput)
    driver_lag: Distribution = field(default_factory=Distribution)
    errors: tuple[ErrorCount, ...] = ()
    steps: dict[str, StepStats] = field(default_factory=dict)
    model: JsonObject | None = None
    warnings: tuple[str, ...] = ()
    hardware: Hardware = field(default_factory=lambda: Hardware(reason=ABSENT))
    roofline: Roofline = field(default_factory=Roofline)
    energy: Energy = field(default_factory=Energy)
    advice: tuple[Advice, ...] = ()
    projections: tuple[Projection, ...] = ()
    #: Present for speculative-decoding runs only.
    speculative: Speculative | None = None
    prompt_cache: PromptCache | None = None
    contention: Contention | None = None
    run_set: RunSet | None = None
    #: The model shape the user gave (``model_spec=``), ModelSpec JSON plus its ``source``.
    model_spec: JsonObject | None = None
    server_metrics: ServerMetrics | None = None
    #: ``openai:`` runs only: the client's CPU, memory, stamping clock and stalls.
    client: Client | None = None

    #: Sections written only when the run has them (summary.json has never carried a null
    #: there).
    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ("model_spec", "server_metrics", "client")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Summary:
        """Read a summary.json object of schema ``/1`` or ``/2`` (unknown keys are kept).

        A ``/1`` summary is read into the ``/2`` types (same layout) and is written back as
        ``/2``. Sections it lacks are unavailable with the reason.
        """
        data = dict(data or {})
        data["schema"] = SUMMARY_SCHEMA
        return super().from_dict(data)

    @property
    def load_mode(self) -> str | None:
        """How the load arrived: ``batch``, ``rate`` or ``concurrency`` (``None`` when the
        summary does not say, or says it in a form that is not text)."""
        return json_str((self.load or {}).get("mode"))
