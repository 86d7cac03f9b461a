"""The driver: the plan drawn once, the actors started, their records collected onto the
run clock, lost actors accounted for, lagging ones relieved (autoscale)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from statistics import median
from typing import Any

from perfscope.errors import UsageError
from perfscope.profiler.distributed.actor import LoadActor, RequestSink, _percentile
from perfscope.profiler.distributed.clock import ClockOffset, actor_offset, boot_id
from perfscope.profiler.distributed.cluster import (
    _first_line,
    _import_ray,
    connect,
    disconnect,
    private_cluster_pids,
)
from perfscope.profiler.distributed.result import ActorReport, AutoscaleDecision, DistributedResult
from perfscope.profiler.distributed.target import (
    NOT_SERVER,
    RayTarget,
    _placement_nodes,
    off_server_placement,
)
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec

#: How often the driver collects finished requests from the actors (s).
POLL_INTERVAL_S = 0.2
#: How long the driver waits, after an actor says it is done, for the requests it pushed
#: last to reach the mailbox (s).
DONE_GRACE_S = 5.0
#: Head start between handing out the plan and its first send (s): every actor must hold
#: its share before the first arrival is due.
PLAN_LEAD_S = 1.0
#: Polls in a row an actor's event-loop lag must exceed the threshold before the driver
#: acts (warns, or adds an actor): one slow window (a GC pause) is not saturation.
AUTOSCALE_STREAK = 2
#: Inter-token gaps kept per actor to judge its lag against (the latest ones).
GAP_WINDOW = 512


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
            ``not-server`` pins the actors in turn to nodes off the model server's machine.

    Raises:
        UsageError: no live node offers ``resources``, or none is off the server's machine
            with ``not-server`` (checked before any actor starts).
    """
    ray = _import_ray()
    want = dict(resources or {})
    off_server = want.pop(NOT_SERVER, None) is not None
    result = DistributedResult(
        address=target.address,
        origin_perf_counter_ns=origin_perf_counter_ns,
        autoscale_max=autoscale_max,
        resources=want,
    )
    if result_out is not None:
        result_out.append(result)
    started_here = connect(target)
    pinned: list[tuple[str, str]] = []
    try:
        if want:
            result.eligible_nodes = _placement_nodes(ray, want)
        if off_server:
            result.avoided_server, pinned = off_server_placement(ray, engine_uri, want)
            result.eligible_nodes = [address for _, address in pinned]
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
    # Actors push every finished request to a mailbox on this node as it finishes, and wait
    # for its acknowledgement (LoadActor._push): a lost actor loses only what it had in
    # flight. (Pushed without waiting, a SIGKILLed actor's last pushes never left it.)
    sink = _start_sink(ray)

    def spawn() -> Any:
        cls = remote_cls
        if pinned:  # not-server: each actor pinned in turn to a node off the server's machine
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            node_id = pinned[len(actors) % len(pinned)][0]
            cls = remote_cls.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            )
        actors.append(cls.remote(engine_uri, options, sink, len(actors)))
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
    from perfscope.profiler.engines.openai.report import SATURATION_GAP_SHARE, SATURATION_LAG_S

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
                placement=(i, rep.host),
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
                # The actor it was assigned to, even when that actor is lost.
                h = recorder.add_request(spec, actor=i, host=rep.host or None)
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
        action, new, moved, start_s = "warned", None, 0, None
        t_s = self.recorder.clock.now_ns() / 1e9
        if cap is not None:
            if before >= cap:
                action = "at cap"
            else:
                new, moved, start_s = self._scale_out(i)
                action = "added" if new is not None else "nothing to move"
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
                start_s=start_s,
            )
        )
        if action != "added":
            advice = {
                "warned": "rerun with --ray-autoscale MAX or more actors",
                "at cap": f"the --ray-autoscale cap of {cap} actors was reached",
                "nothing to move": (
                    f"a new actor took {start_s or 0:.1f} s to start, by when none of its "
                    "requests was left to hand over (a loaded machine starts actors slowly)"
                ),
            }[action]
            self.result.warnings.append(
                f"load actor {i}'s event-loop lag p99 reached {lag * 1e3:.1f} ms at "
                f"{t_s:.1f} s, above {threshold * 1e3:.1f} ms (a tenth of its "
                f"{gap * 1e3:.1f} ms inter-token gap): its stamps are late; {advice}"
            )

    def _scale_out(self, i: int) -> tuple[int | None, int, float | None]:
        """Start a new actor and hand it every other request of actor ``i`` not started yet
        (and half its closed-loop users). Returns (new index, requests moved, seconds the
        new actor took to start); no index when nothing was left to move."""
        users = self.users[i]
        give_users = users // 2 if users is not None else 0
        if users is not None and give_users == 0:
            return None, 0, None
        j = self._add_slot()
        t0 = time.perf_counter()
        self.spawn()
        self._ready(j)
        start_s = time.perf_counter() - t0
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
            return None, 0, start_s
        items = [(self.pending[i].pop(rid), self.t_driver[rid]) for rid in moved]
        self.reports[i].requests -= len(items)
        if users is not None:
            self.users[i] = users - give_users
        self._start(j, items, give_users if users is not None else None)
        return j, len(items), start_s


def _offset(ray: Any, actor: Any, report: ActorReport) -> ClockOffset:
    """The offset to apply to an actor's stamps: 0 on a shared clock, else measured."""
    offset, check = actor_offset(ray, actor, report.same_clock)
    if check is not None:
        report.exchange_check_ns = check
    return offset


def _feed(
    recorder: Recorder,
    pending: dict[int, RequestSpec],
    row: dict[str, Any],
    shift_ns: int,
    lags: list[float],
    gaps: deque[float] | None = None,
    placement: tuple[int, str] | None = None,
) -> None:
    """One finished request from an actor into the run's recorder, shifted onto run time;
    its send lag into ``lags``, its gaps between chunks (s) into ``gaps``, and
    ``placement`` (the actor's index and host) into its ``actor`` and ``host`` columns."""
    spec = pending.pop(row["request_id"])
    actor, host = placement if placement is not None else (None, None)
    h = recorder.add_request(spec, row["t_scheduled"] - shift_ns, actor=actor, host=host or None)
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
