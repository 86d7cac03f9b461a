"""Records that flow from capture to analysis (docs/architecture.md, "Stages").

Times are integer nanoseconds since the run's start (one monotonic clock, see
:mod:`perfscope.profiler.clock`). Quantities are SI base units. The Arrow schemas
below define the columns of the chunk, step and telemetry tables (the recorder and the
samplers store them column-wise); a table on disk has exactly these columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

__all__ = [
    "ACTORS_SCHEMA",
    "CHUNK_SCHEMA",
    "MANIFEST_SCHEMA",
    "REQUEST_OPTIONAL_SCHEMA",
    "REQUEST_SCHEMA",
    "REQUEST_TABLE_SCHEMA",
    "STEP_OPTIONAL_SCHEMA",
    "STEP_SCHEMA",
    "STEP_TABLE_SCHEMA",
    "TELEMETRY_SCHEMA",
    "Manifest",
    "RequestRecord",
    "RequestSpec",
    "StepKind",
]

StepKind = Literal["prefill", "decode", "mixed"]


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload, before it runs.

    Attributes:
        request_id: unique within the run, in submission order.
        prompt_tokens: prompt length in tokens.
        max_output_tokens: number of tokens to generate (engines stop early only on EOS
            when asked to).
        prompt: prompt text, when the workload has one (JSONL prompts); ``None`` for
            synthetic token-length workloads.
        prompt_token_ids: explicit token ids, when the workload fixes them.
        is_warmup: excluded from every statistic.
        arrival_s: when it arrives, seconds from the start of its phase (a replayed trace);
            None: the load's arrival pattern decides.
        after: a request that must finish before this one is sent (the previous turn of a
            conversation); None: none.
    """

    request_id: int
    prompt_tokens: int
    max_output_tokens: int
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    is_warmup: bool = False
    arrival_s: float | None = None
    after: int | None = None


@dataclass
class RequestRecord:
    """What happened to one request. ``t_*`` are run-relative ns; ``None`` = never happened.

    The fields after ``is_warmup`` are optional; engines that cannot know them leave None.
    For HTTP engines, ``t_sent`` is when the request's last byte was written to the socket.

    Attributes:
        t_dispatched: when the engine took the request up (before it got a connection);
            ``t_dispatched - t_scheduled`` is client-side queueing.
        connect_ns: time spent opening a new connection for it (TCP handshake, ns); None
            when a pooled connection was reused.
        t_response_headers: when the response headers were read.
        attempts: times it was sent (2: retried once because the first attempt failed
            before any of it reached the server).
        finish_reason: the server's ``finish_reason`` (``stop``, ``length``, ...).
        cached_tokens: prompt tokens the server served from its prefix cache.
        truncated: the server stopped it (``finish_reason`` ``length``) before the output
            tokens it was asked for.
        actor, host: the ``--ray`` load actor it was assigned to (0-based index) and the
            host name of that actor's node; None on a single-process run (like the
            telemetry ``node`` column: every request there is the run's own host, named
            once in the manifest).
    """

    request_id: int
    prompt_tokens: int
    max_output_tokens: int
    t_scheduled: int
    t_sent: int | None = None
    t_first_token: int | None = None
    t_last_token: int | None = None
    output_tokens: int = 0
    error: str | None = None
    is_warmup: bool = False
    t_dispatched: int | None = None
    connect_ns: int | None = None
    t_response_headers: int | None = None
    attempts: int | None = None
    finish_reason: str | None = None
    cached_tokens: int | None = None
    truncated: bool | None = None
    actor: int | None = None
    host: str | None = None


REQUEST_SCHEMA = pa.schema(
    [
        ("request_id", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("max_output_tokens", pa.int64()),
        ("t_scheduled", pa.int64()),
        ("t_sent", pa.int64()),
        ("t_first_token", pa.int64()),
        ("t_last_token", pa.int64()),
        ("output_tokens", pa.int64()),
        ("error", pa.string()),
        ("is_warmup", pa.bool_()),
    ]
)

#: Optional request columns (see :class:`RequestRecord`): issues 16/20, HTTP engines fill
#: them; ``actor`` and ``host`` (issue 29), ``--ray`` runs fill them; null elsewhere, and for
#: runs written before a column. Kept apart from ``REQUEST_SCHEMA`` so that tables built with
#: the core columns stay valid; the recorder writes ``REQUEST_TABLE_SCHEMA`` (both).
REQUEST_OPTIONAL_SCHEMA = pa.schema(
    [
        ("t_dispatched", pa.int64()),
        ("connect_ns", pa.int64()),
        ("t_response_headers", pa.int64()),
        ("attempts", pa.int64()),
        ("finish_reason", pa.string()),
        ("cached_tokens", pa.int64()),
        ("truncated", pa.bool_()),
        ("actor", pa.int64()),
        ("host", pa.string()),
    ]
)

REQUEST_TABLE_SCHEMA = pa.schema([*REQUEST_SCHEMA, *REQUEST_OPTIONAL_SCHEMA])

CHUNK_SCHEMA = pa.schema(
    [
        ("request_id", pa.int64()),
        ("t", pa.int64()),
        ("n_tokens", pa.int64()),
        ("index", pa.int64()),
    ]
)

STEP_SCHEMA = pa.schema(
    [
        ("step_id", pa.int64()),
        ("kind", pa.string()),
        ("t_start", pa.int64()),
        ("t_end", pa.int64()),
        ("batch_size", pa.int64()),
        ("new_tokens", pa.int64()),
        ("context_tokens", pa.int64()),
        ("request_ids", pa.list_(pa.int64())),
    ]
)

#: Optional step columns (speculative decoding, issue 17; null where they do not apply, and
#: for runs written before them): ``role`` is ``draft`` for a forward pass of the draft
#: model (its FLOPs and bytes are the draft's, not the target's) and null for the target;
#: ``proposed_tokens`` / ``accepted_tokens`` are set on a target *verify* step: draft tokens
#: it checked, summed over its rows, and how many of them matched the target's greedy choice
#: (the target's own token that follows is not counted). A verify step's ``new_tokens`` is
#: every position it processed (``K + 1`` per row), not the tokens it emitted.
STEP_OPTIONAL_SCHEMA = pa.schema(
    [
        ("role", pa.string()),
        ("proposed_tokens", pa.int64()),
        ("accepted_tokens", pa.int64()),
    ]
)

#: What the recorder and the run directory hold: the core step columns, then the optional ones.
STEP_TABLE_SCHEMA = pa.schema([*STEP_SCHEMA, *STEP_OPTIONAL_SCHEMA])

TELEMETRY_SCHEMA = pa.schema(
    [
        ("t", pa.int64()),
        ("device", pa.string()),
        ("power_w", pa.float64()),
        ("energy_j", pa.float64()),
        ("mem_used_bytes", pa.float64()),
        ("util_pct", pa.float64()),
        ("mem_util_pct", pa.float64()),
        ("sm_clock_mhz", pa.float64()),
        ("mem_clock_mhz", pa.float64()),
        ("temp_c", pa.float64()),
        ("throttle", pa.int64()),
        # Added by the telemetry samplers (issue 6); null where a row's device has no such value.
        # cpu rows: this process's resident set and its peak (bytes), this process's CPU use
        # (% of one core, may exceed 100), RAPL DRAM energy since sampler start (J).
        ("rss_bytes", pa.float64()),
        ("peak_rss_bytes", pa.float64()),
        ("proc_cpu_pct", pa.float64()),
        ("dram_energy_j", pa.float64()),
        # gpu rows, NVML GPM (Hopper and newer), each over the window since the previous
        # sample: SMs busy, warp occupancy, tensor-pipe activity, DRAM bandwidth used (0-100).
        ("sm_util_pct", pa.float64()),
        ("sm_occupancy_pct", pa.float64()),
        ("tensor_util_pct", pa.float64()),
        ("dram_bw_util_pct", pa.float64()),
        # gpu rows, PyTorch caching allocator of this process (bytes; local CUDA engines only).
        ("torch_allocated_bytes", pa.float64()),
        ("torch_reserved_bytes", pa.float64()),
        ("torch_peak_allocated_bytes", pa.float64()),
        # The cluster node that took the sample (``--ray`` runs: one telemetry agent per
        # node); null on a single-host run, where every sample is the run's own host.
        ("node", pa.string()),
    ]
)


#: Schema of manifest.json (the run's identity, configuration and outcome).
MANIFEST_SCHEMA = "perfscope.manifest/1"

#: ``actors.parquet`` of a ``--ray`` run: which load actor (and host) served each request.
ACTORS_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.int64(), nullable=False),
        pa.field("actor", pa.int32()),
        pa.field("host", pa.string()),
    ]
)

#: Manifest keys with a field in :class:`Manifest`, in the order manifest.json has them.
_MANIFEST_KEYS = (
    "schema",
    "run_id",
    "name",
    "perfscope_version",
    "command",
    "started_at",
    "clock_origin_perf_counter_ns",
    "ended_at",
    "status",
    "engine",
    "workload",
    "load",
    "slos",
    "hw",
    "hardware",
    "telemetry",
    "nvtx",
    "host",
    "process",
    "request_timeout_s",
    "errors",
    "warnings",
    "run_set",
    "model_spec",
    "server_metrics",
    "distributed",
)
#: Keys written only when set (older runs and most runs do not have them).
_MANIFEST_OPTIONAL = frozenset(
    {"request_timeout_s", "nvtx", "run_set", "model_spec", "server_metrics", "distributed"}
)


@dataclass(kw_only=True)
class Manifest:
    """manifest.json as a typed record: what was run, on what, and how it ended.

    Mutable on purpose: capture fills it in as the run goes (``status`` from ``running`` to
    ``complete``/``interrupted``/``failed``, ``ended_at``, ``errors``, ``warnings``, the host's
    contention, the server-metrics and distributed records). :meth:`from_dict` reads any
    manifest perfscope ever wrote (missing keys default; keys this type has no field for are
    kept in ``extra`` and written back), :meth:`to_dict` gives the JSON object.

    Attributes:
        run_id: the run directory's name; ``name``: its short name.
        started_at, ended_at: ISO 8601 (UTC); ``ended_at`` None while running.
        clock_origin_perf_counter_ns: raw ``perf_counter_ns`` at run time 0.
        engine: the engine's info (uri, kind, model, device, dtype, config), JSON form.
        workload, load: the configured workload and load (JSON form).
        slos: per-request limits (s); ``hw``: the device asked for; ``hardware``: the
            device resolved (``{"spec": ..., "resolved_from": ...}``).
        telemetry: the telemetry session's info (``{"enabled": False}`` without).
        host: host facts plus ``contention`` at the end; ``process``: the liveness record.
        request_timeout_s: the per-request timeout (s).
        errors, warnings: sentences, in the order they happened.
        run_set, model_spec, server_metrics, distributed: present for runs that have them.
    """

    schema: str = MANIFEST_SCHEMA
    run_id: str = ""
    name: str = ""
    perfscope_version: str | None = None
    command: list[str] = field(default_factory=list)
    started_at: str = ""
    clock_origin_perf_counter_ns: int | None = None
    ended_at: str | None = None
    status: str = "running"
    engine: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    slos: dict[str, float] = field(default_factory=dict)
    hw: str | None = None
    hardware: dict[str, Any] | None = None
    telemetry: dict[str, Any] = field(default_factory=lambda: {"enabled": False})
    nvtx: bool | None = None
    host: dict[str, Any] = field(default_factory=dict)
    process: dict[str, Any] = field(default_factory=dict)
    request_timeout_s: float | None = None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    run_set: dict[str, Any] | None = None
    model_spec: dict[str, Any] | None = None
    server_metrics: dict[str, Any] | None = None
    distributed: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        """A manifest.json object (any version) as a record; unknown keys go to ``extra``."""
        known = {k: data[k] for k in _MANIFEST_KEYS if k in data and data[k] is not None}
        for key in ("command", "errors", "warnings"):
            if key in known:
                known[key] = list(known[key])
        extra = {k: v for k, v in data.items() if k not in _MANIFEST_KEYS}
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The manifest.json object (keys in the usual order; unset optional keys left out)."""
        out: dict[str, Any] = {}
        for key in _MANIFEST_KEYS:
            value = getattr(self, key)
            if key in _MANIFEST_OPTIONAL and value is None:
                continue
            out[key] = value
        for k, v in self.extra.items():
            out.setdefault(k, v)
        return out
