"""Load generation spread over Ray actors, merged into one run on one clock.

When one client host cannot offer a server enough load accurately (its own event loop
becomes the bottleneck and its stamps drift late), ``perfscope run openai:URL --ray local:4``
runs the same workload from several load-generator processes. The design keeps the offered
process identical to a single host's and every stamp honest:

1. **One schedule.** The driver draws the arrival schedule once (the same seeded offsets a
   single-host run uses) and splits the requests round-robin over the actors; a closed loop
   splits its users. Each actor receives its share of the plan ahead of time, with absolute
   send times on its own clock, and sleeps until each one: nothing is forwarded at send time.
2. **Own clocks, measured offsets.** Each actor stamps on its own ``perf_counter_ns``. Before
   and after the run the driver measures every actor's clock offset with NTP-style exchanges
   (the sample with the smallest round trip wins) and stores the offset, the round-trip bound
   and the drift between the two measurements. Records are shifted onto the driver's run
   clock; the residual uncertainty (half the smallest round trip plus the drift) is reported
   and the summary must not draw conclusions finer than it.
3. **Records are pushed as they finish.** Each actor keeps its own recorder and pushes
   every request it finishes (with all its chunks, and the id of every request it sends)
   to a mailbox actor on the driver's node (:class:`RequestSink`), waiting for each push
   to be acknowledged; the driver drains the mailbox five times a second and feeds the
   requests into the run's recorder through the ordinary handle API, so the stored run
   reads like any other. It also polls every actor for its lag, CPU and state.
4. **Faults.** An actor (or its node) lost mid-run is reported with its host; what it had
   pushed is kept, so only the requests it had sent and not finished (and one that finished
   while its push was under way) are lost (``in_flight``), apart from those it never sent
   (``never_sent``); both are recorded as failed with the reason, counted under ``loss`` in
   the manifest, and the run's status is ``partial``.

Ray is an optional dependency (``pip install 'perfscope[ray]'``).

The package's modules: :mod:`.target` (``--ray``/``--ray-resources`` parsing, placement),
:mod:`.cluster` (joining or starting the cluster), :mod:`.clock` (offsets, boot id),
:mod:`.actor` (the load actor and the mailbox), :mod:`.result` (what the manifest stores)
and :mod:`.fleet` (the driver). Everything is importable from this package as before.
"""

from __future__ import annotations

from perfscope.profiler.distributed.actor import LoadActor, RequestSink
from perfscope.profiler.distributed.clock import (
    OFFSET_SAMPLES,
    ClockOffset,
    actor_offset,
    boot_id,
    measure_offset,
)
from perfscope.profiler.distributed.cluster import (
    PRIVATE_DIR_PREFIX,
    connect,
    disconnect,
    private_cluster_pids,
)
from perfscope.profiler.distributed.cluster import (
    _connect_error as _connect_error,
)
from perfscope.profiler.distributed.fleet import (
    AUTOSCALE_STREAK,
    DONE_GRACE_S,
    GAP_WINDOW,
    PLAN_LEAD_S,
    POLL_INTERVAL_S,
    lag_threshold_s,
    plan_for,
    run_distributed,
)
from perfscope.profiler.distributed.result import (
    ActorReport,
    AutoscaleDecision,
    DistributedResult,
    LossCount,
)
from perfscope.profiler.distributed.target import (
    NOT_SERVER,
    RayTarget,
    off_server_nodes,
    parse_ray_resources,
    parse_ray_target,
)

__all__ = [
    "AUTOSCALE_STREAK",
    "DONE_GRACE_S",
    "GAP_WINDOW",
    "NOT_SERVER",
    "OFFSET_SAMPLES",
    "PLAN_LEAD_S",
    "POLL_INTERVAL_S",
    "PRIVATE_DIR_PREFIX",
    "ActorReport",
    "AutoscaleDecision",
    "ClockOffset",
    "DistributedResult",
    "LoadActor",
    "LossCount",
    "RayTarget",
    "RequestSink",
    "actor_offset",
    "boot_id",
    "connect",
    "disconnect",
    "lag_threshold_s",
    "measure_offset",
    "off_server_nodes",
    "parse_ray_resources",
    "parse_ray_target",
    "plan_for",
    "private_cluster_pids",
    "run_distributed",
]
