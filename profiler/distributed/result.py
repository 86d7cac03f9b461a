"""The fan-out's account of a ``--ray`` run: per-actor reports, autoscale decisions, the
requests it could not measure, and the manifest section they make."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from perfscope.profiler.distributed.clock import ClockOffset


@dataclass
class ActorReport:
    """What one load actor did, for the manifest.

    Attributes:
        index: actor number (0-based).
        host: host name of its node.
        pid: its process id.
        requests: requests in its share of the plan.
        completed: requests it reported back.
        offset_start, offset_end: clock offsets used before and after the run.
        same_clock: the actor shares the driver's kernel (boot id), hence its monotonic
            clock: offsets are 0 exactly, and the exchange is kept only as a check.
        exchange_check_ns: on a shared clock, what the exchange measured (should lie within
            half its round trip of 0; a larger value says the exchange itself is skewed).
        drift_ns: ``offset_end - offset_start`` (0 on one host: one monotonic clock).
        uncertainty_ns: residual alignment uncertainty of its records.
        send_lag_p50_s, send_lag_p99_s: sent − scheduled on the actor (its own saturation).
        cpu_s: CPU seconds the actor process used while serving its share.
        serve_s: wall seconds from its start to its last request's end (``cpu_s / serve_s``
            is its load on a core).
        loop_lag: its event-loop lag over the run (``source``, ``samples``, ``p50_s``,
            ``p99_s``, ``max_s``): the engine's own loop probe (``openai:``), else a probe
            thread in the actor.
        added_at_s: run time the autoscaler added it (None: started with the run).
        lost: why the actor was lost, or None.
        node, resources: the Ray node it ran on (address) and what Ray assigned it
            (``--ray-resources``; empty when it asked for nothing).
    """

    index: int
    host: str = ""
    pid: int = 0
    requests: int = 0
    completed: int = 0
    offset_start: ClockOffset | None = None
    offset_end: ClockOffset | None = None
    same_clock: bool = False
    exchange_check_ns: int | None = None
    drift_ns: int | None = None
    uncertainty_ns: int | None = None
    send_lag_p50_s: float | None = None
    send_lag_p99_s: float | None = None
    cpu_s: float | None = None
    serve_s: float | None = None
    loop_lag: dict[str, Any] | None = None
    added_at_s: float | None = None
    lost: str | None = None
    node: str = ""
    resources: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AutoscaleDecision:
    """What the driver did when a load actor's event-loop lag crossed the threshold.

    Attributes:
        t_s: run time the lag was judged (s), before any new actor started.
        actor: the lagging actor.
        lag_p99_s: its event-loop lag p99 over the last poll window (s).
        gap_s: the median inter-token gap of the requests it finished (s).
        threshold_s: the lag above which its stamps are called late (s).
        action: ``added`` (a new actor took half its requests not yet started),
            ``warned`` (no ``--ray-autoscale``), ``at cap`` (``--ray-autoscale MAX``
            reached) or ``nothing to move`` (no request of its share was left to hand over).
        actors_before, actors_after: load actors before and after.
        new_actor: the added actor's index, or None.
        moved_requests: requests handed from ``actor`` to ``new_actor``.
        start_s: how long the new actor took to start and align its clock (s); None when
            none was started. A ``nothing to move`` decision's reason: its share was all
            sent by then.
    """

    t_s: float
    actor: int
    lag_p99_s: float
    gap_s: float
    threshold_s: float
    action: str
    actors_before: int
    actors_after: int
    new_actor: int | None = None
    moved_requests: int = 0
    start_s: float | None = None


@dataclass
class LossCount:
    """Requests a ``--ray`` run could not measure, counted apart.

    Attributes:
        lost_actors: load actors lost mid-run.
        in_flight: requests a lost actor had sent and not finished (an open-loop request
            due before the loss was noticed counts as sent: the actor's last notes may
            have died with it).
        never_sent: requests planned on a lost actor that it never sent.
        unfinished: requests of live actors still open when the run was stopped (Ctrl-C,
            SIGTERM) or that never came back.
    """

    lost_actors: int = 0
    in_flight: int = 0
    never_sent: int = 0
    unfinished: int = 0


@dataclass
class DistributedResult:
    """The fan-out's account of the run (stored under ``manifest["distributed"]``).

    Attributes:
        address: the cluster address (None: a local cluster started for the run).
        origin_perf_counter_ns: the driver's ``perf_counter_ns`` at run time 0, so stamps can
            be compared with other processes' raw monotonic readings (a server's log).
        actors: one report per load actor.
        request_actor: request id -> actor index.
        errors: lost actors and actor failures, as sentences.
        warnings: conditions that make the numbers less trustworthy (a lagging actor).
        autoscale_max: ``--ray-autoscale MAX`` (None: off, lagging actors only warn).
        decisions: every autoscale decision, in order.
        resources, eligible_nodes: placement (``--ray-resources``): what each actor asked
            for and the nodes that could hold it; every actor's own node is its ``host``.
        avoided_server: with ``--ray-resources not-server``, the model server's host whose
            machine no actor was placed on (the actors are pinned in turn to the nodes in
            ``eligible_nodes``).
    """

    address: str | None
    origin_perf_counter_ns: int = 0
    actors: list[ActorReport] = field(default_factory=list)
    request_actor: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    autoscale_max: int | None = None
    decisions: list[AutoscaleDecision] = field(default_factory=list)
    loss: LossCount = field(default_factory=lambda: LossCount())
    #: What each load actor asked Ray for (``--ray-resources``; empty: zero CPUs, any node).
    resources: dict[str, float] = field(default_factory=dict)
    #: The live nodes (addresses) that offered those resources when the run started.
    eligible_nodes: list[str] = field(default_factory=list)
    avoided_server: str | None = None

    @property
    def partial(self) -> bool:
        """Whether a load actor was lost mid-run (the run's status is then ``partial``)."""
        return any(a.lost for a in self.actors)

    @property
    def placement_rule(self) -> str:
        """How the actors were placed, in words."""
        parts = ["resources"] if self.resources else []
        if self.avoided_server is not None:
            parts.append(f"not on the server's machine ({self.avoided_server})")
        return " and ".join(parts) or "anywhere (zero CPUs)"

    @property
    def uncertainty_ns(self) -> int | None:
        """The largest residual clock uncertainty over the actors (ns)."""
        vals = [a.uncertainty_ns for a in self.actors if a.uncertainty_ns is not None]
        return max(vals) if vals else None

    def actors_table(self) -> Any:
        """``actors.parquet``: which actor (and host) served each request (``request_id``,
        ``actor``, ``host``); join it to requests or chunks by ``request_id``."""
        import pyarrow as pa

        ids = sorted(self.request_actor)
        hosts = {a.index: a.host for a in self.actors}
        return pa.table(
            {
                "request_id": pa.array(ids, pa.int64()),
                "actor": pa.array([self.request_actor[i] for i in ids], pa.int32()),
                "host": pa.array([hosts.get(self.request_actor[i], "") for i in ids], pa.string()),
            }
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": "ray",
            "address": self.address,
            "origin_perf_counter_ns": self.origin_perf_counter_ns,
            "actors": [asdict(a) for a in self.actors],
            "clock_uncertainty_ns": self.uncertainty_ns,
            "errors": list(self.errors),
            "partial": self.partial,
            "loss": asdict(self.loss),
            "placement": {
                "resources": dict(self.resources),
                "rule": self.placement_rule,
                "avoided_server": self.avoided_server,
                "eligible_nodes": list(self.eligible_nodes),
            },
            "autoscale": {
                "enabled": self.autoscale_max is not None,
                "max_actors": self.autoscale_max,
                "decisions": [asdict(d) for d in self.decisions],
            },
        }
