"""The run manifest as the later stages read it: a typed, frozen view of manifest.json.

Capture writes the manifest through its own mutable record (``perfscope.profiler.records.
Manifest``, filled in as the run goes); the store reads it back as the JSON object
(``StoredRun.manifest``, ``Run.manifest`` on the public API: a dict, for compatibility).
The analysis and the dashboard read it through :class:`RunManifest` instead, so a field they
read has a name and a type (``m.engine.config.batch_size``, ``m.telemetry.mem_total_bytes``,
``m.distributed.actors``), and a misspelt one is a mypy error rather than a silent ``None``.

Why here and not beside the writer: the layer rule (docs/architecture.md,
tests/test_architecture.py) lets the analysis import only itself, the hardware database and
the ground floor, and the store lives under ``profiler/`` (capture); the dashboard may import
the analysis. So the read model sits at the first stage that reads it, where both readers may
import it, and it depends on nothing but the JSON layout the store documents.

Every field defaults (older manifests lack most sections); keys the view has no field for
stay in ``extra`` (see :class:`~perfscope.analysis._record.Record`). Units: seconds, bytes,
watts, as the manifest records them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import UnionType
from typing import Any, Self, Union, get_args, get_origin

from perfscope.analysis._record import Record
from perfscope.jsontypes import JsonObject, json_float

__all__ = [
    "CONTENTION_WARN_SHARE",
    "AutoscaleDecision",
    "Distributed",
    "EngineConfig",
    "EngineManifest",
    "HostManifest",
    "LoadActor",
    "RunManifest",
    "TelemetryManifest",
    "is_contended",
    "manifest_view",
    "server_share",
]


def _json_types(tp: Any) -> tuple[type, ...] | None:
    """The JSON types a field of type hint ``tp`` takes (``None``: any)."""
    arms = get_args(tp) if get_origin(tp) in (Union, UnionType) else (tp,)
    out: list[type] = []
    for arm in arms:
        if arm is type(None):
            continue
        origin = get_origin(arm) or arm
        if isinstance(origin, type) and (issubclass(origin, Mapping | Record)):
            out.append(Mapping)
        elif origin is tuple:
            out += [list, tuple]
        elif arm in (str, bool):
            out.append(arm)
        elif arm in (int, float):
            out += [int, float]
        else:
            return None
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class _View(Record):
    """A record of the manifest whose fields read a value of the wrong JSON type as absent
    (the field's default): an engine's ``config.client`` that is text is no client record."""

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> Self:
        """Build from a manifest object; values of the wrong JSON type read as absent."""
        kept: dict[str, object] = {}
        hints = cls._field_types()
        for key, value in (data or {}).items():
            types = _json_types(hints[key]) if key in hints else None
            if value is None or types is None or isinstance(value, types):
                kept[key] = value
        return super().from_dict(kept)


@dataclass(frozen=True, kw_only=True)
class EngineConfig(_View):
    """``engine.config``: the engine's own settings. The fields the analysis and the report
    read are named (``batch_size`` and ``scheduler``, the model ``preset`` and ``n_params``,
    the HTTP ``client``'s account of the run, the ``speculative`` decoding setup); the rest
    stays in ``extra``."""

    batch_size: int | None = None
    scheduler: str | None = None
    preset: str | None = None
    #: parameter count of the model (a count)
    n_params: float | None = None
    #: the torch version the engine ran with
    torch: str | None = None
    #: ``openai:`` runs: the client's CPU, memory, stamping clock, stalls and warnings.
    client: Mapping[str, object] | None = None
    #: speculative-decoding runs: ``draft_model`` (ModelSpec JSON), ``k`` and the method.
    speculative: Mapping[str, object] | None = None
    #: torch engines: intra-op threads the engine ran with (a count)
    torch_threads: int | None = None
    #: torch engines: why that many (``auto: 2 usable CPUs, ...`` or ``--threads N``)
    threads_rule: str | None = None
    #: torch engines: ``OMP_WAIT_POLICY`` as the process had it; ``None`` with a
    #: ``threads_rule``: unset, so OpenMP's waiting threads spin
    omp_wait_policy: str | None = None

    @property
    def several_torch_threads(self) -> bool:
        """A torch engine that ran two or more intra-op threads: how its OpenMP threads
        wait for each other (``omp_wait_policy``) shapes what it measured."""
        return self.threads_rule is not None and (self.torch_threads or 0) >= 2


@dataclass(frozen=True, kw_only=True)
class EngineManifest(_View):
    """``engine``: what was measured: ``uri`` as given, ``kind`` (reference, hf, openai,
    ...), the ``model`` shape (ModelSpec JSON; ``None`` when the engine reports none), the
    ``device`` and weight ``dtype``, and its :class:`EngineConfig`."""

    uri: str | None = None
    kind: str | None = None
    model: JsonObject | None = None
    device: str | None = None
    dtype: str | None = None
    config: EngineConfig = field(default_factory=EngineConfig)


@dataclass(frozen=True, kw_only=True)
class TelemetryManifest(_View):
    """``telemetry``: the telemetry session's account (``TelemetrySession.manifest_info()``).

    Attributes:
        enabled: telemetry was sampled; ``status``: how the session ended; ``devices``: the
            devices sampled; ``backend``: ``ray`` on a cluster run.
        nodes: a cluster run's nodes, each with its telemetry ``agent`` record.
        mem_total_bytes: memory capacity per device key (``gpu0``, ``cpu``, ``node/cpu``).
        driver_node: a cluster run's driver node (whose CPU the ``cpu`` section shows).
        gpu_unavailable, cpu_energy_unavailable: why no GPU samples / no RAPL energy.
        power_limits_w, idle_baseline_w: per device key, W.
    """

    enabled: bool = False
    status: str | None = None
    devices: Any = None
    backend: str | None = None
    nodes: Mapping[str, object] = field(default_factory=dict)
    mem_total_bytes: Mapping[str, float | None] = field(default_factory=dict)
    driver_node: str | None = None
    gpu_unavailable: str | None = None
    cpu_energy_unavailable: str | None = None
    power_limits_w: Mapping[str, float | None] = field(default_factory=dict)
    idle_baseline_w: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def lost_agents(self) -> tuple[str, ...]:
        """Why each lost telemetry agent of a ``--ray`` run was lost (empty elsewhere)."""
        if self.backend != "ray":
            return ()
        out: list[str] = []
        for node in self.nodes.values():
            agent = node.get("agent") if isinstance(node, Mapping) else None
            if isinstance(agent, Mapping) and agent.get("lost"):
                out.append(str(agent["lost"]))
        return tuple(out)

    @classmethod
    def of(cls, value: Mapping[str, object] | TelemetryManifest | None) -> TelemetryManifest:
        """``value`` as the record (a manifest's ``telemetry`` object, or the record)."""
        return value if isinstance(value, TelemetryManifest) else cls.from_dict(value or {})


@dataclass(frozen=True, kw_only=True)
class HostManifest(_View):
    """``host``: the machine's facts (``hostname``, ``machine``, ``cpu_count``, ``platform``,
    the ``python`` and ``torch`` versions; any others in ``extra``) and the CPU
    ``contention`` measured over the run (raw shares; ``contention_record`` judges them)."""

    hostname: str | None = None
    machine: str | None = None
    cpu_count: int | None = None
    platform: str | None = None
    python: str | None = None
    torch: str | None = None
    contention: Mapping[str, object] | None = None


@dataclass(frozen=True, kw_only=True)
class LoadActor(_View):
    """One load actor of a ``--ray`` run: why it was ``lost`` (``None`` when it was not) and
    its send lag p99 (s)."""

    lost: str | None = None
    send_lag_p99_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class AutoscaleDecision(_View):
    """One ``--ray-autoscale`` decision: ``action`` (``added``, ...), the lagging ``actor``,
    its event-loop lag p99 and the threshold (s), the time into the run (s), the
    ``new_actor``, how many requests moved to it and how long it took to start (s)."""

    action: str | None = None
    actor: int | str | None = None
    lag_p99_s: float | None = None
    threshold_s: float | None = None
    t_s: float | None = None
    new_actor: int | str | None = None
    moved_requests: int | None = None
    start_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Distributed(_View):
    """``distributed``: a ``--ray`` run's load actors, the clock alignment of their records
    to the driver's (ns), and the autoscaler's decisions."""

    actors: tuple[LoadActor, ...] = ()
    clock_uncertainty_ns: float | None = None
    autoscale: Mapping[str, object] | None = None

    @property
    def autoscale_decisions(self) -> tuple[AutoscaleDecision, ...]:
        """The autoscaler's decisions, in order (empty without ``--ray-autoscale``)."""
        decisions = (self.autoscale or {}).get("decisions")
        if not isinstance(decisions, list | tuple):
            return ()
        return tuple(AutoscaleDecision.from_dict(d) for d in decisions if isinstance(d, Mapping))


@dataclass(frozen=True, kw_only=True)
class RunManifest(_View):
    """manifest.json as the analysis and the dashboard read it (see the module docstring).

    Attributes:
        run_id, name: the run directory's name and its short name.
        status: ``complete``, ``interrupted``, ``failed``, ``running`` or (read back)
            ``crashed``; ``status_reason`` and ``partial`` say why a crashed run is partial.
        started_at, ended_at: ISO 8601 (UTC).
        perfscope_version, command: who wrote it, and the command line.
        engine: what was measured (:class:`EngineManifest`).
        workload, load: the configured workload and load (JSON form, ``None`` when absent).
        slos: per-request limits (s) recorded at capture.
        hardware: the device resolved at capture (``{"spec": ..., "resolved_from": ...}``).
        telemetry, host, distributed: the sections of those names.
        errors, warnings: sentences, in the order they happened.
        run_set, model_spec, server_metrics: present for runs that have them.
        sweep: the sweep this run belongs to (an object with ``id``, or the id).
    """

    run_id: str | None = None
    name: str | None = None
    status: str | None = None
    status_reason: str | None = None
    partial: bool = False
    started_at: str | None = None
    ended_at: str | None = None
    perfscope_version: str | None = None
    command: tuple[str, ...] = ()
    engine: EngineManifest = field(default_factory=EngineManifest)
    workload: JsonObject | None = None
    load: JsonObject | None = None
    slos: Mapping[str, float] = field(default_factory=dict)
    hardware: Mapping[str, object] | None = None
    telemetry: TelemetryManifest | None = None
    host: HostManifest = field(default_factory=HostManifest)
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    run_set: Mapping[str, object] | None = None
    model_spec: JsonObject | None = None
    server_metrics: Mapping[str, object] | None = None
    distributed: Distributed | None = None
    sweep: Mapping[str, object] | str | None = None
    #: The manifest.json object this view was read from, as read: for readers that walk
    #: it by path (the configuration diff, the JSON export). Not a key of the JSON form.
    source: Mapping[str, object] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def _field_types(cls) -> dict[str, object]:
        return {k: v for k, v in super()._field_types().items() if k != "source"}

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> Self:
        """A manifest.json object (any version) as the view. Values of the wrong JSON type
        read as absent (the store reports such a run as broken before a reader gets here);
        a warning that is not text is no sentence."""
        source = data or {}
        data = dict(source)
        warnings = data.get("warnings")
        if isinstance(warnings, list | tuple):
            data["warnings"] = [w for w in warnings if isinstance(w, str)]
        for key in ("errors", "command"):
            values = data.get(key)
            if isinstance(values, list | tuple):
                data[key] = [str(v) for v in values]
        return dataclasses.replace(super().from_dict(data), source=source)

    @property
    def device_key(self) -> str | None:
        """The hardware database key of the device resolved at capture (``None``: none)."""
        spec = (self.hardware or {}).get("spec")
        key = spec.get("key") if isinstance(spec, Mapping) else None
        return str(key) if key else None

    @property
    def device_name(self) -> str | None:
        """The resolved device's name (else its key), for listings."""
        spec = (self.hardware or {}).get("spec")
        if not isinstance(spec, Mapping):
            return None
        return str(spec.get("name") or spec.get("key") or "") or None

    @property
    def sweep_id(self) -> str | None:
        """The id of the sweep this run belongs to, if any."""
        sweep = self.sweep.get("id") if isinstance(self.sweep, Mapping) else self.sweep
        return str(sweep) if sweep else None


def manifest_view(manifest: Mapping[str, object] | RunManifest | None) -> RunManifest:
    """``manifest`` as a :class:`RunManifest` (a manifest.json object, or the view already)."""
    return manifest if isinstance(manifest, RunManifest) else RunManifest.from_dict(manifest)


#: Share of the machine's CPU capacity that other processes (or the hypervisor) may take
#: before the run's timings are flagged as inflated.
CONTENTION_WARN_SHARE = 0.15


def is_contended(contention: Mapping[str, object] | None) -> bool | None:
    """Whether a run's CPU contention measurement (the manifest's ``host.contention``: raw
    shares of the machine's CPU) flags its timings: other processes or the hypervisor above
    :data:`CONTENTION_WARN_SHARE`, or other processes and the server under test on this
    machine together above it (a server that takes the cores the client needs delays the
    client's stamps as any other process would). ``None`` when the run has no measurement."""
    if contention is None:
        return None
    others = json_float(contention.get("others_share"))
    steal = json_float(contention.get("steal_share"))
    server = server_share(contention)
    return bool(
        (others is not None and others > CONTENTION_WARN_SHARE)
        or (steal is not None and steal > CONTENTION_WARN_SHARE)
        or (others is not None and server is not None and others + server > CONTENTION_WARN_SHARE)
    )


def server_share(contention: Mapping[str, object]) -> float | None:
    """Share of the machine's CPU capacity (0..1) the server under test on this machine
    used during the run (``None``: no local server, or a window too short to measure)."""
    cpu = json_float(contention.get("server_cpu_s"))
    window = json_float(contention.get("window_s"))
    cores = json_float(contention.get("cpu_count"))
    if cpu is None or not window or not cores or contention.get("too_short"):
        return None
    return min(cpu / (window * int(cores)), 1.0)
