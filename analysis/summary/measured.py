"""The measured metrics of a run (counts, latency, throughput, goodput, errors, steps), the
engine it measured and the device it is analysed against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from perfscope.analysis._record import Record
from perfscope.jsontypes import JsonObject

if TYPE_CHECKING:
    from perfscope.hwdb.spec import DeviceSpec

__all__ = [
    "Counts",
    "Distribution",
    "EngineInfo",
    "ErrorCount",
    "Goodput",
    "Hardware",
    "Latency",
    "StepStats",
    "Throughput",
]


@dataclass(frozen=True, kw_only=True)
class EngineInfo(Record):
    """The engine a run measured: ``uri`` as given, ``kind`` (reference, hf, openai, ...),
    ``device`` (``cpu``, ``cuda:0``, ...) and weight ``dtype``."""

    uri: str | None = None
    kind: str | None = None
    device: str | None = None
    dtype: str | None = None


@dataclass(frozen=True, kw_only=True)
class Counts(Record):
    """Measured requests (warmup excluded): all, completed, failed; warmup requests; tokens
    of the completed requests."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    warmup: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    #: Completed requests the server cut short (finish "length" before the tokens asked for).
    truncated: int = 0


@dataclass(frozen=True, kw_only=True)
class Distribution(Record):
    """Statistics of one per-request (or per-gap) quantity, in its unit (seconds for
    latencies). All but ``count`` are ``None`` when there were no values."""

    count: int = 0
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


@dataclass(frozen=True, kw_only=True)
class Latency(Record):
    """Latency distributions of the completed measured requests, seconds.

    ``ttft``: send → first token; ``tpot``: (last − first token) / (tokens − 1); ``itl``:
    gaps between chunks; ``itl_per_token``: each gap over its chunk's tokens; ``e2e``: send →
    last token; ``ntpot``: e2e / output tokens.
    """

    ttft: Distribution = field(default_factory=Distribution)
    tpot: Distribution = field(default_factory=Distribution)
    itl: Distribution = field(default_factory=Distribution)
    itl_per_token: Distribution = field(default_factory=Distribution)
    e2e: Distribution = field(default_factory=Distribution)
    ntpot: Distribution = field(default_factory=Distribution)

    def metrics(self) -> dict[str, Distribution]:
        """Metric name → distribution, in display order."""
        return {
            "ttft": self.ttft,
            "tpot": self.tpot,
            "itl": self.itl,
            "itl_per_token": self.itl_per_token,
            "e2e": self.e2e,
            "ntpot": self.ntpot,
        }


@dataclass(frozen=True, kw_only=True)
class Throughput(Record):
    """Rates over the measured window (tokens/s, requests/s) and over the busy time.

    ``busy_s`` is the time the engine was working (union of step or request intervals, named
    by ``busy_source``); ``busy_tok_s`` output tokens per busy second.
    """

    output_tok_s: float | None = None
    total_tok_s: float | None = None
    req_s: float | None = None
    busy_s: float | None = None
    busy_tok_s: float | None = None
    busy_source: str | None = None


@dataclass(frozen=True, kw_only=True)
class Goodput(Record):
    """Requests that met every SLO: ``slos`` (metric → limit, seconds), their count,
    ``attainment`` (share of measured requests, 0..1), ``goodput_req_s`` and the share meeting
    each SLO alone (``per_slo``)."""

    slos: dict[str, float] = field(default_factory=dict)
    good_requests: int = 0
    attainment: float | None = None
    goodput_req_s: float | None = None
    per_slo: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ErrorCount(Record):
    """One error message and how many measured requests failed with it."""

    error: str = ""
    count: int = 0


@dataclass(frozen=True, kw_only=True)
class StepStats(Record):
    """One step kind (prefill, decode, mixed): passes, time (s), tokens, batch, time share."""

    count: int = 0
    time_s: float = 0.0
    time_share: float = 0.0
    new_tokens: int = 0
    context_tokens: int = 0
    mean_batch_size: float | None = None
    mean_step_s: float | None = None


# ---------------------------------------------------------------------- hardware


@dataclass(frozen=True, kw_only=True)
class Hardware(Record):
    """The device the run is analysed against: its spec (DeviceSpec JSON form, SI units), how
    it was chosen (``resolved_from``), or ``spec`` ``None`` and the ``reason``."""

    spec: JsonObject | None = None
    resolved_from: str | None = None
    reason: str | None = None
    #: A what-if (``analyze --hw X`` on a run measured elsewhere): the device key the run was
    #: measured on; left out of the JSON otherwise.
    measured_on: str | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ("measured_on",)

    @property
    def device(self) -> DeviceSpec | None:
        """The spec as a :class:`DeviceSpec`, or ``None`` when unknown."""
        from perfscope.hwdb.spec import DeviceSpec  # hwdb loads only when asked for

        return DeviceSpec.from_dict(self.spec) if self.spec else None
