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
3. **Records stream back.** Each actor keeps its own recorder; the driver polls every actor
   about twice a second and receives every request finished since the last poll with all its
   chunks, and feeds them into the run's recorder through the ordinary handle API, so the
   stored run reads like any other.
4. **Faults.** An actor (or its node) lost mid-run is reported with its host; the requests it
   had finished are kept, the ones it still held are recorded as failed with the reason, and
   the run carries the loss in its errors.

Ray is an optional dependency (``pip install 'perfscope[ray]'``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from perfscope.errors import UsageError
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec

__all__ = [
    "ActorReport",
    "ClockOffset",
    "DistributedResult",
    "RayTarget",
    "measure_offset",
    "parse_ray_target",
    "plan_for",
    "run_distributed",
]

#: How often the driver collects finished requests from the actors (s).
POLL_INTERVAL_S = 0.5
#: Head start between handing out the plan and its first send (s): every actor must hold
#: its share before the first arrival is due.
PLAN_LEAD_S = 1.0
#: Clock exchanges per offset measurement.
OFFSET_SAMPLES = 9


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
    """``--ray`` as given: ``local:N`` (a local cluster with N actors), an address, or empty
    (``auto``: an existing cluster if one is reachable, else a local one).

    An address may carry the actor count as ``ADDRESS#N``.
    """
    text = (value or "").strip()
    if not text or text == "auto":
        return RayTarget(address="auto" if text else None, actors=default_actors)
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
        cpu_s: CPU seconds the actor process used during the run.
        lost: why the actor was lost, or None.
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
    lost: str | None = None


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
    """

    address: str | None
    origin_perf_counter_ns: int = 0
    actors: list[ActorReport] = field(default_factory=list)
    request_actor: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

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

    def __init__(self, engine_uri: str, options: dict[str, Any]) -> None:
        from perfscope.profiler.engines.base import EngineOptions, create_engine

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

    def _on_finish(self, request_id: int) -> None:
        with self._lock:
            self._finished.append(request_id)

    def now_ns(self) -> int:
        """This process's ``perf_counter_ns``."""
        return time.perf_counter_ns()

    def where(self) -> tuple[str, int, str | None]:
        """Host name, pid and the kernel's boot id (same boot id = same monotonic clock)."""
        return socket.gethostname(), os.getpid(), boot_id()

    def start(self, plan: list[tuple[RequestSpec, int]], concurrency: int | None) -> None:
        """Serve ``plan`` (spec, absolute send time on this clock) in the background.

        ``concurrency``: a closed loop of that many users over the plan's specs (send times
        then only order the specs; the first sends start at the first planned time).
        """
        self._thread = threading.Thread(
            target=self._serve, args=(plan, concurrency), name="perfscope-load", daemon=True
        )
        self._thread.start()

    def _serve(self, plan: list[tuple[RequestSpec, int]], concurrency: int | None) -> None:
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
                for spec, t_plan in plan:
                    if concurrency is not None:
                        with done:
                            while len(open_ids) >= concurrency:
                                done.wait(0.5)
                        t_plan = max(t_plan, clock.now_ns())
                    clock.sleep_until_ns(t_plan)
                    handle = rec.add_request(spec, t_plan)
                    with done:
                        open_ids.add(spec.request_id)
                    handle.sent()
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
            self._done = True

    def poll(self) -> dict[str, Any]:
        """Requests finished since the last poll, with their chunks; ``done`` once served."""
        with self._lock:
            ids, self._finished = self._finished, []
        done = self._done
        chunks = self._recorder.chunks_table()
        new = chunks.slice(self._chunks_sent).to_pydict()
        self._chunks_sent = chunks.num_rows
        for rid, t, n, idx in zip(
            new["request_id"], new["t"], new["n_tokens"], new["index"], strict=True
        ):
            self._chunk_rows.setdefault(rid, []).append((t, n, idx))
        reqs = self._recorder.requests_table().to_pylist()
        by_id = {r["request_id"]: r for r in reqs}
        out = []
        for rid in ids:
            row = dict(by_id[rid])
            row["chunks"] = self._chunk_rows.pop(rid, [])
            out.append(row)
        return {
            "requests": out,
            "done": done and not ids,
            "error": self._error,
            "cpu_s": time.process_time() - self._cpu0,
        }

    def close(self) -> None:
        self._engine.close()


# --- the driver ----------------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--ray needs Ray: pip install 'perfscope[ray]' (or pip install ray)"
        ) from None
    return ray


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
    """
    ray = _import_ray()
    result = DistributedResult(
        address=target.address, origin_perf_counter_ns=origin_perf_counter_ns
    )
    started_here = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "configure_logging": False,
        }
        if target.address is None:
            kwargs["num_cpus"] = max(target.actors, os.cpu_count() or 1)
        else:
            kwargs["address"] = target.address
        try:
            ray.init(**kwargs)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"--ray: cannot start or reach a Ray cluster: {first}") from None
        started_here = True
    remote_cls = ray.remote(num_cpus=0, max_concurrency=4)(LoadActor)
    n = target.actors if concurrency is None else max(1, min(target.actors, concurrency))
    actors = [remote_cls.remote(engine_uri, options) for _ in range(n)]
    try:
        return _drive(
            ray,
            actors,
            plan_offsets_ns,
            recorder,
            origin_perf_counter_ns,
            concurrency,
            stop,
            on_poll,
            result,
        )
    finally:
        for a in actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a)
        if started_here:
            ray.shutdown()


def _drive(
    ray: Any,
    actors: list[Any],
    plan_offsets_ns: Sequence[tuple[RequestSpec, int]],
    recorder: Recorder,
    origin: int,
    concurrency: int | None,
    stop: threading.Event | None,
    on_poll: Callable[[], None] | None,
    result: DistributedResult,
) -> DistributedResult:
    n = len(actors)
    reports = [ActorReport(index=i) for i in range(n)]
    result.actors = reports
    # Actors are ready once they answer; creating the engines (preflight) happens here.
    mine = boot_id()
    for i, a in enumerate(actors):
        try:
            reports[i].host, reports[i].pid, theirs = ray.get(a.where.remote(), timeout=120)
        except Exception as exc:
            raise UsageError(f"--ray: load actor {i} did not start: {_first_line(exc)}") from None
        reports[i].same_clock = mine is not None and theirs == mine
        reports[i].offset_start = _offset(ray, a, reports[i])

    shares: list[list[tuple[RequestSpec, int]]] = [[] for _ in range(n)]
    for k, item in enumerate(plan_offsets_ns):
        shares[k % n].append(item)
        result.request_actor[item[0].request_id] = k % n
    users = (
        [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]
        if concurrency is not None
        else [None] * n
    )
    t_start_driver = time.perf_counter_ns() + int(PLAN_LEAD_S * 1e9)
    for i, a in enumerate(actors):
        off = reports[i].offset_start
        assert off is not None
        plan = [(spec, t_start_driver + int(t) + off.offset_ns) for spec, t in shares[i]]
        reports[i].requests = len(plan)
        if users[i] == 0:
            plan, reports[i].requests = [], 0
        ray.get(a.start.remote(plan, users[i]))

    pending = {i: {s.request_id: s for s, _ in shares[i]} for i in range(n)}
    live = set(range(n))
    lags: list[list[float]] = [[] for _ in range(n)]
    interrupted = False
    try:
        while live:
            if stop is not None and stop.is_set():
                break
            time.sleep(POLL_INTERVAL_S)
            for i in sorted(live):
                _collect(
                    ray, actors[i], reports[i], pending[i], lags[i], recorder, origin, result, live
                )
            if on_poll is not None:
                on_poll()
    except KeyboardInterrupt:
        # Keep what the actors finished: one last collection, then record the rest as failed.
        interrupted = True
        for i in sorted(live):
            _collect(
                ray, actors[i], reports[i], pending[i], lags[i], recorder, origin, result, live
            )

    for i, a in enumerate(actors):
        rep = reports[i]
        if rep.lost is None:
            try:
                rep.offset_end = _offset(ray, a, rep)
            except Exception as exc:
                rep.lost = f"load actor {i} lost at the end: {_first_line(exc)}"
        if rep.offset_start and rep.offset_end:
            rep.drift_ns = rep.offset_end.offset_ns - rep.offset_start.offset_ns
            rep.uncertainty_ns = max(
                rep.offset_start.uncertainty_ns, rep.offset_end.uncertainty_ns
            ) + abs(rep.drift_ns)
        elif rep.offset_start:
            rep.uncertainty_ns = rep.offset_start.uncertainty_ns
        rep.send_lag_p50_s = _percentile(lags[i], 0.5)
        rep.send_lag_p99_s = _percentile(lags[i], 0.99)
        # Whatever the actor still held never came back: record it, never drop it silently.
        why = rep.lost or (
            "interrupted before the request finished"
            if interrupted
            else "stopped before the request finished"
        )
        for spec in pending[i].values():
            h = recorder.add_request(spec)
            h.finish(error=f"distributed: {why}")
        pending[i].clear()
        with contextlib.suppress(Exception):  # a lost actor cannot close
            ray.get(a.close.remote(), timeout=10)
    if interrupted:
        raise KeyboardInterrupt
    return result


def _offset(ray: Any, actor: Any, report: ActorReport) -> ClockOffset:
    """The offset to apply to an actor's stamps: 0 on a shared clock, else measured."""
    measured = measure_offset(lambda: int(ray.get(actor.now_ns.remote())))
    if report.same_clock:
        report.exchange_check_ns = measured.offset_ns
        return ClockOffset(
            offset_ns=0,
            rtt_ns=measured.rtt_ns,
            uncertainty_ns=0,
            method="shared CLOCK_MONOTONIC (same kernel boot id)",
        )
    return measured


def _collect(
    ray: Any,
    actor: Any,
    report: ActorReport,
    pending: dict[int, RequestSpec],
    lags: list[float],
    recorder: Recorder,
    origin: int,
    result: DistributedResult,
    live: set[int],
) -> None:
    """One poll of one actor: its finished requests into the recorder; a lost actor noted."""
    i = report.index
    try:
        got = ray.get(actor.poll.remote(), timeout=30)
    except Exception as exc:
        why = f"load actor {i} on {report.host or '?'} lost: {_first_line(exc)}"
        report.lost = why
        result.errors.append(why)
        live.discard(i)
        return
    off = report.offset_start
    assert off is not None
    for row in got["requests"]:
        _feed(recorder, pending, row, off.offset_ns + origin, lags)
        report.completed += 1
    report.cpu_s = got["cpu_s"]
    if got["error"] and f"load actor {i}: {got['error']}" not in result.errors:
        result.errors.append(f"load actor {i}: {got['error']}")
    if got["done"]:
        live.discard(i)


def _feed(
    recorder: Recorder,
    pending: dict[int, RequestSpec],
    row: dict[str, Any],
    shift_ns: int,
    lags: list[float],
) -> None:
    """One finished request from an actor into the run's recorder, shifted onto run time."""
    spec = pending.pop(row["request_id"])
    h = recorder.add_request(spec, row["t_scheduled"] - shift_ns)
    if row["t_sent"] is not None:
        h.sent(row["t_sent"] - shift_ns)
        lags.append((row["t_sent"] - row["t_scheduled"]) * 1e-9)
    for t, n_tokens, _ in row["chunks"]:
        h.tokens(n_tokens, t_ns=t - shift_ns)
    if row["prompt_tokens"] != spec.prompt_tokens:
        h.set_prompt_tokens(row["prompt_tokens"])
    if row["output_tokens"] != h.record.output_tokens:
        h.set_output_tokens(row["output_tokens"])
    h.finish(error=row["error"])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
