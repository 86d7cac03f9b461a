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
3. **Records come back by poll.** Each actor keeps its own recorder; the driver polls every
   actor five times a second and receives every request finished (and the id of every
   request sent) since the last poll, with all its chunks, and feeds them into the run's
   recorder through the ordinary handle API, so the stored run reads like any other. (A
   push path to a mailbox actor on the driver's node, :class:`RequestSink`, exists but is
   off: a SIGKILLed actor's pushes did not arrive in the tests.)
4. **Faults.** An actor (or its node) lost mid-run is reported with its host; what the
   driver had collected is kept, so only the requests it had sent and not finished (and
   those finished in its last poll interval) are lost (``in_flight``), apart from those
   it never sent (``never_sent``); both are recorded as failed with the reason, counted
   under ``loss`` in the manifest, and the run's status is ``partial``.

Ray is an optional dependency (``pip install 'perfscope[ray]'``).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from perfscope.errors import UsageError
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec

__all__ = [
    "ActorReport",
    "AutoscaleDecision",
    "ClockOffset",
    "DistributedResult",
    "LossCount",
    "RayTarget",
    "RequestSink",
    "actor_offset",
    "boot_id",
    "connect",
    "disconnect",
    "measure_offset",
    "parse_ray_resources",
    "parse_ray_target",
    "plan_for",
    "private_cluster_pids",
    "run_distributed",
]

#: How often the driver collects finished requests from the actors (s).
POLL_INTERVAL_S = 0.2
#: How long the driver waits, after an actor says it is done, for the requests it pushed
#: last to reach the mailbox (s).
DONE_GRACE_S = 5.0
#: Head start between handing out the plan and its first send (s): every actor must hold
#: its share before the first arrival is due.
PLAN_LEAD_S = 1.0
#: Clock exchanges per offset measurement.
OFFSET_SAMPLES = 9
#: Polls in a row an actor's event-loop lag must exceed the threshold before the driver
#: acts (warns, or adds an actor): one slow window (a GC pause) is not saturation.
AUTOSCALE_STREAK = 2
#: Inter-token gaps kept per actor to judge its lag against (the latest ones).
GAP_WINDOW = 512


@dataclass(frozen=True)
class RayTarget:
    """Where the actors run.

    Attributes:
        address: a Ray cluster address (``ray://host:10001``, ``host:6379``, ``auto``), or
            ``None`` to start a local cluster in this process.
        actors: load-generator actors to start.
    """

    address: str | None
    actors: int


def parse_ray_target(value: str | None, *, default_actors: int = 2) -> RayTarget:
    """``--ray`` as given: ``local:N`` (a private local cluster with N actors), an address
    (``auto``: the cluster ``ray start`` runs on this machine), or empty (bare ``--ray``:
    a private local cluster with ``default_actors`` actors).

    An address may carry the actor count as ``ADDRESS#N``.
    """
    text = (value or "").strip()
    if not text or text == "private":
        return RayTarget(address=None, actors=default_actors)
    if text.startswith("local"):
        _, _, n = text.partition(":")
        actors = _positive(n or str(default_actors), text)
        return RayTarget(address=None, actors=actors)
    address, _, n = text.partition("#")
    return RayTarget(address=address, actors=_positive(n, text) if n else default_actors)


def _positive(text: str, whole: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 1024:
        raise UsageError(
            f"--ray {whole!r}: the actor count must be a whole number from 1 to 1024 "
            "(e.g. --ray local:4)"
        )
    return n


_RESOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")


def parse_ray_resources(
    value: str | Mapping[str, Any] | None, what: str = "--ray-resources"
) -> dict[str, float]:
    """``--ray-resources NAME=AMOUNT[,NAME=AMOUNT...]``: what every load actor asks Ray
    for, so Ray places it only on a node that offers that much (a custom resource given
    to the load nodes with ``ray start --resources``, ``CPU``, or ``node:IP`` to pin the
    actors to one node). Empty: no requirement (zero CPUs, any node).

    Raises:
        UsageError: a malformed entry, a repeated name, or an amount that is not
            positive (or above 1 and not whole, which Ray refuses).
    """
    if value is None:
        return {}
    items: list[tuple[str, Any]]
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        items = []
        for part in (p.strip() for p in str(value).split(",")):
            if not part:
                continue
            name, eq, amount = part.partition("=")
            if not eq:
                raise UsageError(
                    f"{what} {part!r}: write NAME=AMOUNT, e.g. {what} loadgen=1 "
                    "(a resource the load nodes were started with)"
                )
            items.append((name.strip(), amount.strip()))
    out: dict[str, float] = {}
    for name, raw in items:
        if not isinstance(name, str) or not _RESOURCE_NAME.fullmatch(name):
            raise UsageError(f"{what}: {name!r} is not a Ray resource name (e.g. loadgen, CPU)")
        if name in out:
            raise UsageError(f"{what}: {name!r} is given twice")
        try:
            qty = float(raw) if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError):
            qty = math.nan
        if not (math.isfinite(qty) and qty > 0) or (qty > 1 and qty != int(qty)):
            raise UsageError(
                f"{what}: {name}={raw!r} must be a positive amount, whole above 1 "
                f"(e.g. {name}=1 or {name}=0.5)"
            )
        out[name] = qty
    return out


def _placement_nodes(ray: Any, resources: Mapping[str, float]) -> list[str]:
    """The addresses of the live nodes that offer ``resources`` to one actor.

    Raises:
        UsageError: no node does (Ray would leave the actors pending for ever).
    """
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    fits = [
        str(n.get("NodeManagerAddress") or n.get("NodeID") or "?")
        for n in nodes
        if all(float((n.get("Resources") or {}).get(k, 0.0)) >= v for k, v in resources.items())
    ]
    if fits:
        return fits
    offered = sorted({k for n in nodes for k in (n.get("Resources") or {})})
    want = ",".join(f"{k}={v:g}" for k, v in resources.items())
    first = next(iter(resources))
    shown = ", ".join(k for k in offered if not k.startswith(("object_store", "memory")))
    raise UsageError(
        f"--ray-resources {want}: no live node of the cluster offers that (its nodes offer "
        f"{shown or 'nothing'}); start the load nodes with ray start "
        f"--resources='{{\"{first}\": 8}}', or ask for what they offer"
    )


@dataclass(frozen=True)
class ClockOffset:
    """An actor's clock against the driver's, from NTP-style exchanges.

    Attributes:
        offset_ns: actor ``perf_counter_ns`` minus driver ``perf_counter_ns`` at one moment.
        rtt_ns: round trip of the sample used (the smallest seen).
        uncertainty_ns: half that round trip: the offset is exact to within it.
    """

    offset_ns: int
    rtt_ns: int
    uncertainty_ns: int
    method: str = "exchange"


def measure_offset(remote_now: Callable[[], int], samples: int = OFFSET_SAMPLES) -> ClockOffset:
    """Offset of a remote clock (``remote_now`` returns its ``perf_counter_ns``)."""
    best: tuple[int, int] | None = None
    for _ in range(max(1, samples)):
        t0 = time.perf_counter_ns()
        t_remote = remote_now()
        t1 = time.perf_counter_ns()
        rtt = t1 - t0
        offset = t_remote - (t0 + t1) // 2
        if best is None or rtt < best[1]:
            best = (offset, rtt)
    assert best is not None
    return ClockOffset(offset_ns=best[0], rtt_ns=best[1], uncertainty_ns=(best[1] + 1) // 2)


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
        t_s: run time of the decision (s).
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

    @property
    def partial(self) -> bool:
        """Whether a load actor was lost mid-run (the run's status is then ``partial``)."""
        return any(a.lost for a in self.actors)

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
                "rule": "resources" if self.resources else "anywhere (zero CPUs)",
                "eligible_nodes": list(self.eligible_nodes),
            },
            "autoscale": {
                "enabled": self.autoscale_max is not None,
                "max_actors": self.autoscale_max,
                "decisions": [asdict(d) for d in self.decisions],
            },
        }


def plan_for(
    specs: Sequence[RequestSpec],
    mode: str,
    rate: float | None,
    arrival: str,
    burstiness: float,
    seed: int,
    duration_s: float | None,
) -> list[tuple[RequestSpec, int]]:
    """Every request with its send time (ns after the plan starts), drawn once.

    The measured requests get exactly the offsets a single-host run draws
    (:func:`perfscope.profiler.driver.arrival_offsets_ns` with the same seed); warmup requests
    go first with their own draw, and the measured phase starts right after the last warmup
    send (warmup is not waited for on a cluster). ``duration_s`` cuts the measured plan.
    """
    from perfscope.profiler.driver import LoadConfig, arrival_offsets_ns

    load = LoadConfig(mode=mode, rate=rate, arrival=arrival, burstiness=burstiness, seed=seed)
    warm = [s for s in specs if s.is_warmup]
    measured = [s for s in specs if not s.is_warmup]
    w_off = arrival_offsets_ns(load, len(warm))
    m_off = arrival_offsets_ns(load, len(measured))
    start = int(w_off[-1]) if len(w_off) else 0
    plan = [(s, int(o)) for s, o in zip(warm, w_off, strict=True)]
    for s, o in zip(measured, m_off, strict=True):
        if duration_s is not None and int(o) >= duration_s * 1e9:
            break
        plan.append((s, start + int(o)))
    return plan


def boot_id() -> str | None:
    """This kernel's boot id: processes that share it read one ``CLOCK_MONOTONIC``, which is
    what ``time.perf_counter_ns`` returns on Linux, so their stamps need no alignment."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


# --- the actor ---------------------------------------------------------------------------


class LoadActor:
    """One load generator: its own engine, recorder and clock (a Ray actor class body).

    Args:
        engine_uri: the engine to drive (``openai:URL``, ``python:mod:fn``).
        options: ``EngineOptions`` fields as a dict.
    """

    def __init__(
        self, engine_uri: str, options: dict[str, Any], sink: Any = None, index: int = 0
    ) -> None:
        from perfscope.profiler.engines.base import EngineOptions, create_engine

        # Where finished and sent requests are pushed as they happen (a RequestSink actor
        # handle), and this actor's number there; None: the driver collects by poll().
        self._sink = sink
        self._index = index
        self._sent: list[int] = []
        self._wake = threading.Event()
        self._pushed_all = sink is None

        self._engine = create_engine(engine_uri, EngineOptions(**options))
        # Raw perf_counter_ns readings (origin 0): the driver shifts them onto its run clock.
        self._recorder = Recorder(MonotonicClock(origin_ns=0))
        self._lock = threading.Lock()
        self._finished: list[int] = []
        self._recorder.add_finish_listener(self._on_finish)
        self._chunks_sent = 0
        self._chunk_rows: dict[int, list[tuple[int, int, int]]] = {}
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._done = False
        self._cpu0 = time.process_time()
        self._t0: float | None = None
        self._t_done: float | None = None
        # The plan not yet started, shared by the feeder and release().
        self._plan_lock = threading.Lock()
        self._queue: list[tuple[RequestSpec, int]] = []
        self._next = 0
        self._users: int | None = None
        # Event-loop lag: the engine's own probe (openai:) where it has one, else this
        # actor's probe thread (how late a 2 ms sleep wakes: GIL and CPU waits).
        self._probe_lags: list[int] = []
        self._lag_pos = 0

    def _on_finish(self, request_id: int) -> None:
        with self._lock:
            self._finished.append(request_id)
        self._wake.set()

    def _on_sent(self, request_id: int) -> None:
        with self._lock:
            self._sent.append(request_id)
        self._wake.set()

    def _push(self) -> None:
        """Push finished requests and sent ids to the sink as they happen (woken by each
        finish and send; batched when several arrive together) until the plan is served."""
        sink = self._sink
        while True:
            self._wake.wait(0.2)
            self._wake.clear()
            done = self._done
            rows = self._finished_rows()
            with self._lock:
                sent, self._sent = self._sent, []
            if rows or sent:
                sink.put.remote(self._index, rows, sent)
            if done:
                self._pushed_all = True
                return

    def _finished_rows(self) -> list[dict[str, Any]]:
        """Requests finished since the last call, each with its chunks (actor clock)."""
        with self._lock:
            ids, self._finished = self._finished, []
        chunks = self._recorder.chunks_table()
        new = chunks.slice(self._chunks_sent).to_pydict()
        self._chunks_sent = chunks.num_rows
        for rid, t, n, idx in zip(
            new["request_id"], new["t"], new["n_tokens"], new["index"], strict=True
        ):
            self._chunk_rows.setdefault(rid, []).append((t, n, idx))
        if not ids:
            return []
        by_id = {r["request_id"]: r for r in self._recorder.requests_table().to_pylist()}
        out = []
        for rid in ids:
            row = dict(by_id[rid])
            row["chunks"] = self._chunk_rows.pop(rid, [])
            out.append(row)
        return out

    def now_ns(self) -> int:
        """This process's ``perf_counter_ns``."""
        return time.perf_counter_ns()

    def where(self) -> tuple[str, int, str | None]:
        """Host name, pid and the kernel's boot id (same boot id = same monotonic clock)."""
        return socket.gethostname(), os.getpid(), boot_id()

    def placed(self) -> tuple[str, dict[str, float]]:
        """The Ray node this actor runs on (its address) and the resources Ray gave it."""
        import ray

        ctx: Any = ray.get_runtime_context()  # Ray's runtime API is untyped
        util: Any = ray.util
        got = {str(k): float(v) for k, v in ctx.get_assigned_resources().items()}
        return str(util.get_node_ip_address()), got

    def _engine_lags(self) -> list[int] | None:
        lags = getattr(getattr(self._engine, "stats", None), "lag_ns", None)
        return lags if isinstance(lags, list) else None

    def _lags(self) -> list[int]:
        engine = self._engine_lags()
        return engine if engine is not None else self._probe_lags

    def start(self, plan: list[tuple[RequestSpec, int]], concurrency: int | None) -> None:
        """Serve ``plan`` (spec, absolute send time on this clock) in the background.

        ``concurrency``: a closed loop of that many users over the plan's specs (send times
        then only order the specs; the first sends start at the first planned time).
        """
        with self._plan_lock:
            self._queue, self._next, self._users = list(plan), 0, concurrency
        self._cpu0 = time.process_time()
        self._t0 = time.perf_counter()
        if self._engine_lags() is None:
            threading.Thread(target=self._probe, name="perfscope-lag-probe", daemon=True).start()
        self._thread = threading.Thread(target=self._serve, name="perfscope-load", daemon=True)
        self._thread.start()
        if self._sink is not None:
            threading.Thread(target=self._push, name="perfscope-push", daemon=True).start()

    def _probe(self, step_s: float = 0.002) -> None:
        step = int(step_s * 1e9)
        lags = self._probe_lags
        while not self._done:
            t0 = time.perf_counter_ns()
            time.sleep(step_s)
            lags.append(max(0, time.perf_counter_ns() - t0 - step))

    def release(self, t_from_ns: int | None, users: int = 0) -> list[int]:
        """Give up every other request not started yet, for another actor to send.

        Only requests planned at or after ``t_from_ns`` (this clock) move, so the new
        actor has time to receive them; None: any not started (a closed loop). A closed
        loop also gives up ``users`` of its users (keeping at least one).

        Returns:
            The ids of the requests this actor will no longer send.
        """
        with self._plan_lock:
            rest = self._queue[self._next :]
            keep: list[tuple[RequestSpec, int]] = []
            give: list[int] = []
            movable = 0
            for spec, t in rest:
                if t_from_ns is None or t >= t_from_ns:
                    movable += 1
                    if movable % 2 == 0:
                        give.append(spec.request_id)
                        continue
                keep.append((spec, t))
            self._queue = self._queue[: self._next] + keep
            self._next = min(self._next, len(self._queue))
            if self._users is not None and users:
                self._users = max(1, self._users - users)
        return give

    def _take(self) -> tuple[RequestSpec, int] | None:
        with self._plan_lock:
            if self._next >= len(self._queue):
                return None
            item = self._queue[self._next]
            self._next += 1
            return item

    def _serve(self) -> None:
        from perfscope.profiler.engines.base import Inbox, Submission

        inbox = Inbox()
        rec = self._recorder
        clock = rec.clock
        done = threading.Condition()
        open_ids: set[int] = set()

        def on_finish(rid: int) -> None:
            with done:
                open_ids.discard(rid)
                done.notify_all()

        rec.add_finish_listener(on_finish)

        def feed() -> None:
            try:
                while (item := self._take()) is not None:
                    spec, t_plan = item
                    if self._users is not None:
                        with done:
                            while len(open_ids) >= self._users:
                                done.wait(0.5)
                        t_plan = max(t_plan, clock.now_ns())
                    clock.sleep_until_ns(t_plan)
                    handle = rec.add_request(spec, t_plan)
                    with done:
                        open_ids.add(spec.request_id)
                    handle.sent()
                    self._on_sent(spec.request_id)
                    inbox.put(Submission(spec, handle))
            finally:
                inbox.close()

        feeder = threading.Thread(target=feed, name="perfscope-load-feed", daemon=True)
        feeder.start()
        try:
            self._engine.serve(inbox, rec)
            feeder.join()
        except BaseException as exc:
            self._error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            self._t_done = time.perf_counter()
            self._done = True
            self._wake.set()

    def poll(self) -> dict[str, Any]:
        """Requests finished since the last poll, with their chunks (none when they are
        pushed to a sink); ``done`` once served (and pushed); the event-loop lag p99 over
        the lag samples taken since the last poll (s)."""
        done = self._done and self._pushed_all
        out = [] if self._sink is not None else self._finished_rows()
        ids = out
        sent: list[int] = []
        if self._sink is None:
            with self._lock:
                sent, self._sent = self._sent, []
        lags = self._lags()
        window, self._lag_pos = lags[self._lag_pos :], len(lags)
        return {
            "requests": out,
            "done": done and not ids,
            "error": self._error,
            "cpu_s": time.process_time() - self._cpu0,
            "serve_s": (self._t_done or time.perf_counter()) - self._t0 if self._t0 else None,
            "lag_p99_s": _ns_to_s(_percentile(window, 0.99)),
            "lag_samples": len(window),
            "sent": sent,
        }

    def lag_summary(self) -> dict[str, Any]:
        """Event-loop lag over the whole run (s) and where it was measured."""
        lags = self._lags()
        src = "engine event loop" if self._engine_lags() is not None else "actor probe thread"
        return {
            "source": src,
            "samples": len(lags),
            "p50_s": _ns_to_s(_percentile(lags, 0.5)),
            "p99_s": _ns_to_s(_percentile(lags, 0.99)),
            "max_s": _ns_to_s(max(lags) if lags else None),
        }

    def close(self) -> None:
        self._engine.close()


class RequestSink:
    """The mailbox on the driver's node that load actors push to (a Ray actor class body).

    It outlives any load actor, so a request an actor finished is kept even when the actor
    dies a moment later. Calls run one at a time (Ray's default for an actor), so no lock.
    """

    def __init__(self) -> None:
        self._rows: dict[int, list[dict[str, Any]]] = {}
        self._sent: dict[int, list[int]] = {}

    def put(self, actor: int, rows: list[dict[str, Any]], sent: list[int]) -> None:
        """Actor ``actor`` finished ``rows`` (request rows with chunks) and sent ``sent``."""
        self._rows.setdefault(actor, []).extend(rows)
        self._sent.setdefault(actor, []).extend(sent)

    def pid(self) -> int:
        """Its process id (perfscope's own, for contention)."""
        return os.getpid()

    def drain(self) -> dict[int, tuple[list[dict[str, Any]], list[int]]]:
        """Everything pushed since the last drain, per actor: (finished rows, sent ids)."""
        out = {
            a: (self._rows.get(a, []), self._sent.get(a, []))
            for a in set(self._rows) | set(self._sent)
        }
        self._rows, self._sent = {}, {}
        return out


# --- the driver ----------------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def _ns_to_s(ns: float | None) -> float | None:
    return None if ns is None else ns * 1e-9


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--ray needs Ray: pip install 'perfscope[ray]' (or pip install ray)"
        ) from None
    return ray


#: Prefix of a private cluster's temp dir (``/tmp/perfscope-ray-<driver pid>-XXXX``): every
#: Ray process of that cluster names it on its command line or logs into it.
PRIVATE_DIR_PREFIX = "perfscope-ray-"

#: The private cluster's reaper (see :func:`_start_reaper`), while one runs.
_reaper: Any = None
#: The private cluster's temp dir, while one runs.
_private_dir: str | None = None


def private_cluster_pids() -> set[int]:
    """Processes of this process's private cluster (its Ray daemons and workers: named
    by its temp dir on their command line, or logging into it); empty without one."""
    tmp = _private_dir
    if tmp is None:
        return set()
    found: set[int] = set()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                hit = tmp.encode() in f.read()
            hit = hit or any(os.readlink(f"/proc/{p}/fd/{fd}").startswith(tmp) for fd in "12")
        except OSError:
            continue
        if hit:
            found.add(int(p))
    found.discard(os.getpid())
    return found


_REAPER = r"""
import os, shutil, signal, sys, time
tmp = sys.argv[1]
sys.stdin.buffer.read()  # returns when the driver closes the pipe or dies (even SIGKILL)

def ours(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if tmp.encode() in f.read():
                return True
        for fd in ("1", "2"):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(tmp):
                return True
    except OSError:
        pass
    return False

me, quiet = os.getpid(), 0
deadline = time.monotonic() + 10
while quiet < 3 and time.monotonic() < deadline:
    found = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me and ours(p)]
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    quiet = 0 if found else quiet + 1
    time.sleep(0.1)
shutil.rmtree(tmp, ignore_errors=True)
"""


def _start_reaper(tmp: str) -> Any:
    """A small process that outlives nothing: it waits on a pipe from this process and,
    once the pipe closes (:func:`disconnect`, or this process dies, SIGKILL included),
    kills every process of the private cluster in ``tmp`` (found by the directory on
    their command line or as their log file) and removes ``tmp``."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, tmp],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C in the terminal does not reach it
        close_fds=True,
    )


def connect(target: RayTarget) -> bool:
    """Connect this process to ``target``'s cluster (or start a private local one) unless
    Ray is already initialised; True when this call did it, so the caller shuts Ray down
    after.

    A private cluster (``--ray`` or ``--ray local:N``) is always new, even beside a
    ``ray start`` cluster on this machine: it listens on loopback only, keeps its files in
    its own temp dir, and dies with this process (a reaper kills it on every way out).

    Raises:
        UsageError: Ray is not installed, or the cluster cannot be started or reached
            (with what to set when the cluster wants an auth token).
    """
    global _reaper, _private_dir
    ray = _import_ray()
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
    }
    env_address = os.environ.pop("RAY_ADDRESS", None) if target.address is None else None
    try:
        if target.address is None:
            import tempfile

            tmp = tempfile.mkdtemp(prefix=f"{PRIVATE_DIR_PREFIX}{os.getpid()}-", dir="/tmp")
            _reaper = _start_reaper(tmp)
            _private_dir = tmp
            kwargs.update(
                address="local",
                num_cpus=max(target.actors, os.cpu_count() or 1),
                _temp_dir=tmp,
                _node_ip_address="127.0.0.1",
            )
            loopback: contextlib.AbstractContextManager[None] = _loopback_only(ray)
        else:
            kwargs["address"] = target.address
            loopback = contextlib.nullcontext()
        # ray.init replaces the SIGTERM handler with sys.exit(): keep the caller's, so a
        # SIGTERM stops the run as perfscope handles it (Ray section kept, signal named).
        main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if main else None
        try:
            with loopback:
                ray.init(**kwargs)
        except Exception as exc:
            _stop_reaper()
            raise UsageError(_connect_error(target, exc)) from None
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    finally:
        if env_address is not None:
            os.environ["RAY_ADDRESS"] = env_address
    return True


#: Ray's switch that, off, makes it take loopback as this node's address (it is meant for
#: laptops); read by ``ray._private.services.get_node_ip_address`` at call time.
_RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _loopback_only(ray: Any) -> Iterator[None]:
    """While a private cluster starts: keep it on loopback.

    Ray 2.60 turns ``_node_ip_address="127.0.0.1"`` into the machine's outside address
    (``resolve_ip_for_localhost``), and then its GCS, raylet and workers listened on every
    interface (``::``) and its runtime-env agent on that address. With Ray's own cluster
    switch off, the node's address stays loopback and every one of them binds
    127.0.0.1 (the daemons inherit the variable; this process's value is put back after).
    """
    import importlib

    try:
        consts: Any = importlib.import_module("ray._private.ray_constants")
    except ImportError:  # another Ray layout: nothing to switch
        yield
        return
    old_env = os.environ.get(_RAY_LOOPBACK_ENV)
    old_flag = getattr(consts, "ENABLE_RAY_CLUSTER", None)
    os.environ[_RAY_LOOPBACK_ENV] = "0"
    consts.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if old_env is None:
            os.environ.pop(_RAY_LOOPBACK_ENV, None)
        else:
            os.environ[_RAY_LOOPBACK_ENV] = old_env
        if old_flag is not None:
            consts.ENABLE_RAY_CLUSTER = old_flag


def _connect_error(target: RayTarget, exc: BaseException) -> str:
    """The one-line reason a cluster could not be started or joined, with what to do."""
    text = str(exc)
    where = "start a local Ray cluster" if target.address is None else f"reach {target.address}"
    if "auth" in text.lower() or "token" in text.lower() or "UNAUTHENTICATED" in text:
        return (
            f"--ray: cannot {where}: the cluster requires token authentication; set "
            "RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, or the token file "
            "RAY_AUTH_TOKEN_PATH) in this shell, as on the head node (docs/scale.md)"
        )
    hint = ""
    if target.address is not None and os.environ.get("RAY_AUTH_MODE") != "token":
        # Ray 2.60 heads require a token by default and the failure often does not say so.
        hint = (
            " (if the cluster uses token authentication, Ray's default since 2.60, set "
            "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN in this shell)"
        )
    return f"--ray: cannot {where}: {_first_line(exc)}{hint}"


def _stop_reaper() -> None:
    """Close the reaper's pipe (it then kills what is left of the private cluster)."""
    global _reaper, _private_dir
    reaper, _reaper, _private_dir = _reaper, None, None
    if reaper is not None and reaper.stdin is not None:
        with contextlib.suppress(OSError):
            reaper.stdin.close()
        with contextlib.suppress(Exception):
            reaper.wait(timeout=15)


def disconnect() -> None:
    """Shut this process's Ray connection down (after :func:`connect` returned True), and a
    private cluster with it."""
    ray = _import_ray()
    with contextlib.suppress(Exception):  # a cluster that is already gone
        ray.shutdown()
    _stop_reaper()


def run_distributed(
    engine_uri: str,
    options: dict[str, Any],
    plan_offsets_ns: Sequence[tuple[RequestSpec, int]],
    recorder: Recorder,
    origin_perf_counter_ns: int,
    target: RayTarget,
    *,
    concurrency: int | None = None,
    stop: threading.Event | None = None,
    on_poll: Callable[[], None] | None = None,
    autoscale_max: int | None = None,
    result_out: list[DistributedResult] | None = None,
    on_serving: Callable[[set[int]], None] | None = None,
    resources: Mapping[str, float] | None = None,
) -> DistributedResult:
    """Serve ``plan_offsets_ns`` (spec, send time in ns after the plan starts) from
    ``target.actors`` Ray actors and feed every finished request into ``recorder``.

    Args:
        engine_uri, options: what each actor drives (``EngineOptions`` fields as a dict).
        recorder: the run's recorder (its clock is the run clock).
        origin_perf_counter_ns: the driver's ``perf_counter_ns`` at run time 0.
        concurrency: closed loop with this many users in all (split over the actors).
        stop: set to stop early (Ctrl-C): actors are killed, finished requests kept.
        on_poll: called after each collection round (progress).
        autoscale_max: add actors, up to this many in all, when one's event-loop lag grows
            past the threshold (:func:`lag_threshold_s`); None: warn only.
        result_out: the result is appended here as soon as it exists, so a caller
            interrupted (Ctrl-C, SIGTERM) still has the Ray section and the actors table.
        on_serving: called once every actor serves, with the ids of perfscope's own
            processes on this machine (load actors, the mailbox, the private cluster's
            daemons), so contention can leave them and the start-up out.
        resources: what each load actor asks Ray for (:func:`parse_ray_resources`);
            ``CPU`` and ``GPU`` are Ray's ``num_cpus``/``num_gpus``; none: zero CPUs.

    Raises:
        UsageError: no live node offers ``resources`` (checked before any actor starts).
    """
    ray = _import_ray()
    want = dict(resources or {})
    result = DistributedResult(
        address=target.address,
        origin_perf_counter_ns=origin_perf_counter_ns,
        autoscale_max=autoscale_max,
        resources=want,
    )
    if result_out is not None:
        result_out.append(result)
    started_here = connect(target)
    if want:
        try:
            result.eligible_nodes = _placement_nodes(ray, want)
        except UsageError:
            if started_here:
                disconnect()
            raise
    custom = {k: v for k, v in want.items() if k not in ("CPU", "GPU")}
    remote_cls = ray.remote(
        num_cpus=want.get("CPU", 0),
        num_gpus=want.get("GPU", 0),
        resources=custom or None,
        max_concurrency=4,
    )(LoadActor)
    n = target.actors if concurrency is None else max(1, min(target.actors, concurrency))
    actors: list[Any] = []
    # The push-to-mailbox path (RequestSink) lost a dying actor's pushes in the tests on
    # this machine, so records are collected by poll (every POLL_INTERVAL_S) until that is
    # understood; a lost actor then loses at most one poll interval of finished requests.
    sink = None

    def spawn() -> Any:
        actors.append(remote_cls.remote(engine_uri, options, sink, len(actors)))
        return actors[-1]

    for _ in range(n):
        spawn()
    try:
        fleet = _Fleet(ray, actors, spawn, recorder, origin_perf_counter_ns, result, sink)
        fleet.on_serving = on_serving
        return fleet.drive(plan_offsets_ns, concurrency, stop, on_poll)
    finally:
        for a in [*actors, *([sink] if sink is not None else [])]:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a)
        if started_here:
            disconnect()


def _start_sink(ray: Any) -> Any:
    """A :class:`RequestSink` pinned to the driver's node (it must not share a load
    actor's fate)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return (
        ray.remote(num_cpus=0)(RequestSink)
        .options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False))
        .remote()
    )


def lag_threshold_s(gap_s: float) -> float:
    """The event-loop lag above which a load actor's stamps are late for chunks ``gap_s``
    apart: the rule the single-process client calls "saturated" by (more than 1 ms and
    more than a tenth of the gap)."""
    from perfscope.profiler.engines.openai.engine import SATURATION_GAP_SHARE, SATURATION_LAG_S

    return max(SATURATION_LAG_S, SATURATION_GAP_SHARE * gap_s)


class _Fleet:
    """The driver's view of its load actors during one run (they may grow: autoscale)."""

    def __init__(
        self,
        ray: Any,
        actors: list[Any],
        spawn: Callable[[], Any],
        recorder: Recorder,
        origin: int,
        result: DistributedResult,
        sink: Any = None,
    ) -> None:
        self.ray = ray
        self.sink = sink
        self.on_serving: Callable[[set[int]], None] | None = None
        self.sink_lost: str | None = None
        #: Per actor: ids of the requests it reported sent (in flight until they finish).
        self.sent: list[set[int]] = []
        #: Per actor: when it first said it was done while requests were still due (s).
        self.done_at: list[float | None] = []
        #: Per actor: the driver's perf_counter_ns when it was found lost.
        self.lost_at: dict[int, int] = {}
        self.actors = actors
        self.spawn = spawn
        self.recorder = recorder
        self.origin = origin
        self.result = result
        self.reports: list[ActorReport] = []
        self.pending: list[dict[int, RequestSpec]] = []
        self.lags: list[list[float]] = []
        self.gaps: list[deque[float]] = []
        self.streak: list[int] = []
        self.handled: list[bool] = []
        self.users: list[int | None] = []
        self.live: set[int] = set()
        self.t_driver: dict[int, int] = {}
        self.mine = boot_id()

    def _ready(self, i: int) -> None:
        """Wait for actor ``i`` to start (its engine's preflight) and align its clock."""
        a, rep = self.actors[i], self.reports[i]
        try:
            rep.host, rep.pid, theirs = self.ray.get(a.where.remote(), timeout=120)
            rep.node, rep.resources = self.ray.get(a.placed.remote(), timeout=120)
        except Exception as exc:
            raise UsageError(f"--ray: load actor {i} did not start: {_first_line(exc)}") from None
        rep.same_clock = self.mine is not None and theirs == self.mine
        rep.offset_start = _offset(self.ray, a, rep)

    def _add_slot(self) -> int:
        i = len(self.reports)
        self.reports.append(ActorReport(index=i))
        self.pending.append({})
        self.lags.append([])
        self.gaps.append(deque(maxlen=GAP_WINDOW))
        self.streak.append(0)
        self.handled.append(False)
        self.users.append(None)
        self.sent.append(set())
        self.done_at.append(None)
        return i

    def _drop_last_slot(self) -> None:
        """Forget the actor just added (it was not needed after all)."""
        for seq in (
            self.actors,
            self.reports,
            self.pending,
            self.lags,
            self.gaps,
            self.streak,
            self.handled,
            self.users,
            self.sent,
            self.done_at,
        ):
            seq.pop()

    def _start(self, i: int, items: Sequence[tuple[RequestSpec, int]], users: int | None) -> None:
        """Hand actor ``i`` its plan (driver times, shifted onto its clock) and start it."""
        off = self.reports[i].offset_start
        assert off is not None
        plan = sorted(((spec, t + off.offset_ns) for spec, t in items), key=lambda item: item[1])
        self.reports[i].requests += len(plan)
        for spec, _ in plan:
            self.pending[i][spec.request_id] = spec
            self.result.request_actor[spec.request_id] = i
        self.users[i] = users
        self.ray.get(self.actors[i].start.remote(plan, users))
        self.live.add(i)

    def drive(
        self,
        plan_offsets_ns: Sequence[tuple[RequestSpec, int]],
        concurrency: int | None,
        stop: threading.Event | None,
        on_poll: Callable[[], None] | None,
    ) -> DistributedResult:
        n = len(self.actors)
        for _ in range(n):
            self._add_slot()
        self.result.actors = self.reports
        # Actors are ready once they answer; creating the engines (preflight) happens here.
        for i in range(n):
            self._ready(i)
        shares: list[list[tuple[RequestSpec, int]]] = [[] for _ in range(n)]
        t_start = time.perf_counter_ns() + int(PLAN_LEAD_S * 1e9)
        for k, (spec, t) in enumerate(plan_offsets_ns):
            shares[k % n].append((spec, t_start + int(t)))
            self.t_driver[spec.request_id] = t_start + int(t)
        users = (
            [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]
            if concurrency is not None
            else [None] * n
        )
        for i in range(n):
            self._start(i, shares[i], users[i])
        if self.on_serving is not None:
            here = socket.gethostname()
            own = {r.pid for r in self.reports if r.host == here and r.pid}
            if self.sink is not None:
                with contextlib.suppress(Exception):
                    own.add(int(self.ray.get(self.sink.pid.remote(), timeout=30)))
            self.on_serving(own | private_cluster_pids())
        try:
            while self.live:
                if stop is not None and stop.is_set():
                    break
                time.sleep(POLL_INTERVAL_S)
                for i in sorted(self.live):
                    self._collect(i)
                self._drain()
                if on_poll is not None:
                    on_poll()
        except KeyboardInterrupt as exc:
            # Keep what the actors finished: one last collection, then record the rest.
            # The signal is kept as it came (SIGTERM is not Ctrl-C).
            for i in sorted(self.live):
                self._collect(i)
            self._finish(True)
            raise exc from None
        self._finish(False)
        return self.result

    def _drain(self) -> None:
        """Everything the actors pushed to the sink into the run's recorder."""
        if self.sink is None or self.sink_lost is not None:
            return
        try:
            got = self.ray.get(self.sink.drain.remote(), timeout=30)
        except Exception as exc:
            self.sink_lost = f"the driver's request mailbox was lost: {_first_line(exc)}"
            self.result.errors.append(self.sink_lost)
            return
        for i, (rows, sent) in sorted(got.items()):
            self.sent[i].update(sent)
            self._take_rows(i, rows)

    def _take_rows(self, i: int, rows: list[dict[str, Any]]) -> None:
        rep, off = self.reports[i], self.reports[i].offset_start
        assert off is not None
        for row in rows:
            if row["request_id"] not in self.pending[i]:
                continue  # already recorded (a request can only finish once)
            _feed(
                self.recorder,
                self.pending[i],
                row,
                off.offset_ns + self.origin,
                self.lags[i],
                self.gaps[i],
            )
            self.sent[i].discard(row["request_id"])
            rep.completed += 1

    def _finish(self, interrupted: bool) -> None:
        ray, recorder = self.ray, self.recorder
        self._drain()  # what the actors pushed last (a lost actor's final requests)
        loss = self.result.loss
        for i, a in enumerate(self.actors):
            rep = self.reports[i]
            if rep.lost is None:
                try:
                    rep.offset_end = _offset(ray, a, rep)
                    rep.loop_lag = ray.get(a.lag_summary.remote(), timeout=30)
                except Exception as exc:
                    rep.lost = f"load actor {i} lost at the end: {_first_line(exc)}"
            if rep.offset_start and rep.offset_end:
                rep.drift_ns = rep.offset_end.offset_ns - rep.offset_start.offset_ns
                rep.uncertainty_ns = max(
                    rep.offset_start.uncertainty_ns, rep.offset_end.uncertainty_ns
                ) + abs(rep.drift_ns)
            elif rep.offset_start:
                rep.uncertainty_ns = rep.offset_start.uncertainty_ns
            rep.send_lag_p50_s = _percentile(self.lags[i], 0.5)
            rep.send_lag_p99_s = _percentile(self.lags[i], 0.99)
            # Whatever the actor still held never came back: record it, never drop it.
            why = rep.lost or (
                "interrupted before the request finished"
                if interrupted
                else "stopped before the request finished"
            )
            for rid, spec in self.pending[i].items():
                if rep.lost is None:
                    loss.unfinished += 1
                    text = why
                elif rid in self.sent[i] or (
                    # Its last "sent" notes may have died with it: an open-loop request
                    # due before the loss was noticed counts as sent.
                    self.users[i] is None
                    and self.t_driver.get(rid, 1 << 62) <= self.lost_at.get(i, 0)
                ):
                    loss.in_flight += 1
                    text = f"{why} (the request was in flight)"
                else:
                    loss.never_sent += 1
                    text = f"{why} (the request was never sent)"
                h = recorder.add_request(spec)
                h.finish(error=f"distributed: {text}")
            self.pending[i].clear()
            if rep.lost is not None:
                loss.lost_actors += 1
            with contextlib.suppress(Exception):  # a lost actor cannot close
                ray.get(a.close.remote(), timeout=10)

    def _collect(self, i: int) -> None:
        """One poll of actor ``i``: its finished requests into the recorder, a lost actor
        noted, its event-loop lag checked."""
        rep = self.reports[i]
        try:
            got = self.ray.get(self.actors[i].poll.remote(), timeout=30)
        except Exception as exc:
            why = f"load actor {i} on {rep.host or '?'} lost: {_first_line(exc)}"
            rep.lost = why
            self.lost_at[i] = time.perf_counter_ns()
            self.result.errors.append(why)
            self.live.discard(i)
            return
        self.sent[i].update(got.get("sent") or ())
        self._take_rows(i, got["requests"])
        rep.cpu_s = got["cpu_s"]
        rep.serve_s = got.get("serve_s")
        if got["error"] and f"load actor {i}: {got['error']}" not in self.result.errors:
            self.result.errors.append(f"load actor {i}: {got['error']}")
        if got["done"]:
            # Its last pushes may still be on their way to the sink: wait for them (a
            # little) before calling what is missing unfinished.
            now = time.monotonic()
            first = self.done_at[i] = self.done_at[i] or now
            if not self.pending[i] or now - first > DONE_GRACE_S or self.sink_lost:
                self.live.discard(i)
            return
        self._check_lag(i, got.get("lag_p99_s"))

    def _check_lag(self, i: int, lag: float | None) -> None:
        # Its own requests' gaps; until one finished, any actor's (the same workload).
        gaps: deque[float] | None = self.gaps[i] or next((g for g in self.gaps if g), None)
        if lag is None or not gaps:
            return  # no lag samples, or no finished request yet to judge the gap by
        gap = float(median(gaps))
        threshold = lag_threshold_s(gap)
        self.streak[i] = self.streak[i] + 1 if lag > threshold else 0
        if self.streak[i] < AUTOSCALE_STREAK or self.handled[i]:
            return
        self.handled[i] = True
        before = len(self.actors)
        cap = self.result.autoscale_max
        action, new, moved = "warned", None, 0
        if cap is not None:
            if before >= cap:
                action = "at cap"
            else:
                new, moved = self._scale_out(i)
                action = "added" if new is not None else "nothing to move"
        t_s = self.recorder.clock.now_ns() / 1e9
        self.result.decisions.append(
            AutoscaleDecision(
                t_s=t_s,
                actor=i,
                lag_p99_s=lag,
                gap_s=gap,
                threshold_s=threshold,
                action=action,
                actors_before=before,
                actors_after=len(self.actors),
                new_actor=new,
                moved_requests=moved,
            )
        )
        if action != "added":
            advice = {
                "warned": "rerun with --ray-autoscale MAX or more actors",
                "at cap": f"the --ray-autoscale cap of {cap} actors was reached",
                "nothing to move": "none of its requests was left to hand to a new actor",
            }[action]
            self.result.warnings.append(
                f"load actor {i}'s event-loop lag p99 reached {lag * 1e3:.1f} ms at "
                f"{t_s:.1f} s, above {threshold * 1e3:.1f} ms (a tenth of its "
                f"{gap * 1e3:.1f} ms inter-token gap): its stamps are late; {advice}"
            )

    def _scale_out(self, i: int) -> tuple[int | None, int]:
        """Start a new actor and hand it every other request of actor ``i`` not started yet
        (and half its closed-loop users). Returns (new index, requests moved)."""
        users = self.users[i]
        give_users = users // 2 if users is not None else 0
        if users is not None and give_users == 0:
            return None, 0
        j = self._add_slot()
        self.spawn()
        self._ready(j)
        self.reports[j].added_at_s = self.recorder.clock.now_ns() / 1e9
        off = self.reports[i].offset_start
        assert off is not None
        t_from = (
            None
            if users is not None
            else time.perf_counter_ns() + int(PLAN_LEAD_S * 1e9) + off.offset_ns
        )
        moved = self.ray.get(self.actors[i].release.remote(t_from, give_users), timeout=30)
        if not moved:
            with contextlib.suppress(Exception):
                self.ray.kill(self.actors[j])
            self._drop_last_slot()
            return None, 0
        items = [(self.pending[i].pop(rid), self.t_driver[rid]) for rid in moved]
        self.reports[i].requests -= len(items)
        if users is not None:
            self.users[i] = users - give_users
        self._start(j, items, give_users if users is not None else None)
        return j, len(items)


def _offset(ray: Any, actor: Any, report: ActorReport) -> ClockOffset:
    """The offset to apply to an actor's stamps: 0 on a shared clock, else measured."""
    offset, check = actor_offset(ray, actor, report.same_clock)
    if check is not None:
        report.exchange_check_ns = check
    return offset


def actor_offset(ray: Any, actor: Any, same_clock: bool) -> tuple[ClockOffset, int | None]:
    """The clock offset to apply to the stamps of an actor with a ``now_ns`` method, and on
    a shared clock what the exchange measured as a check (None otherwise).

    On a shared clock (same kernel boot id) the offset is 0 exactly; elsewhere it is the
    NTP-style exchange's."""
    measured = measure_offset(lambda: int(ray.get(actor.now_ns.remote())))
    if same_clock:
        return (
            ClockOffset(
                offset_ns=0,
                rtt_ns=measured.rtt_ns,
                uncertainty_ns=0,
                method="shared CLOCK_MONOTONIC (same kernel boot id)",
            ),
            measured.offset_ns,
        )
    return measured, None


def _feed(
    recorder: Recorder,
    pending: dict[int, RequestSpec],
    row: dict[str, Any],
    shift_ns: int,
    lags: list[float],
    gaps: deque[float] | None = None,
) -> None:
    """One finished request from an actor into the run's recorder, shifted onto run time;
    its send lag into ``lags`` and its gaps between chunks (s) into ``gaps``."""
    spec = pending.pop(row["request_id"])
    h = recorder.add_request(spec, row["t_scheduled"] - shift_ns)
    if row["t_sent"] is not None:
        h.sent(row["t_sent"] - shift_ns)
        lags.append((row["t_sent"] - row["t_scheduled"]) * 1e-9)
    prev: int | None = None
    for t, n_tokens, _ in row["chunks"]:
        h.tokens(n_tokens, t_ns=t - shift_ns)
        if gaps is not None and prev is not None:
            gaps.append((t - prev) * 1e-9)
        prev = t
    if row["prompt_tokens"] != spec.prompt_tokens:
        h.set_prompt_tokens(row["prompt_tokens"])
    if row["output_tokens"] != h.record.output_tokens:
        h.set_output_tokens(row["output_tokens"])
    h.finish(error=row["error"])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
