"""The load actor (one load generator: its own engine, recorder and clock) and the
mailbox on the driver's node that actors can push finished requests to."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.distributed.clock import boot_id
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import REQUEST_TABLE_SCHEMA, RequestSpec

#: Columns of a request row, in the order the recorder's rows hold them.
_REQUEST_FIELDS: tuple[str, ...] = tuple(REQUEST_TABLE_SCHEMA.names)
#: How long an actor waits for the sink to acknowledge one push (s).
PUSH_TIMEOUT_S = 30.0


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
        self._recorder.add_finish_listener(self._on_finish)
        # What was handed on already (positions in the recorder's append-only lists) and
        # the chunks of requests not finished yet; one caller at a time.
        self._rows_lock = threading.Lock()
        self._chunks_sent = 0
        self._registered_pos = 0
        self._finished_pos = 0
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
        self._wake.set()

    def _on_sent(self, request_id: int) -> None:
        with self._lock:
            self._sent.append(request_id)
        self._wake.set()

    def _push(self) -> None:
        """Push finished requests and sent ids to the sink as they happen (woken by each
        finish and send; batched when several arrive together) until the plan is served.

        Each push waits for the sink's acknowledgement, so a request is either in the
        sink (it outlives this actor) or still here: a SIGKILL loses only the requests that
        finished in the last moment before it (the push under way), never a poll interval
        of them. A push that fails is sent again with the next batch."""
        import ray

        sink = self._sink
        rows: list[dict[str, Any]] = []
        sent: list[int] = []
        failures = 0
        while True:
            self._wake.wait(0.2)
            self._wake.clear()
            done = self._done
            rows += self._finished_rows()
            with self._lock:
                sent, self._sent = sent + self._sent, []
            if rows or sent:
                try:
                    ray.get(sink.put.remote(self._index, rows, sent), timeout=PUSH_TIMEOUT_S)
                    rows, sent, failures = [], [], 0
                except Exception:  # the sink busy or gone: retried with the next batch
                    failures += 1
            if done and ((not rows and not sent) or failures >= 3):
                self._pushed_all = True
                return

    def _finished_rows(self) -> list[dict[str, Any]]:
        """Requests finished since the last call, each with its chunks (actor clock).

        Reads only what the recorder appended since the last call (a run of 10,000
        requests costs the same per call at its end as at its start)."""
        rec = self._recorder
        with self._rows_lock:
            # Finished first, chunks after: every chunk of a finished request is in.
            _, finished, self._registered_pos, self._finished_pos = rec.request_rows(
                self._registered_pos, self._finished_pos
            )
            chunks = rec.chunk_rows(self._chunks_sent)
            self._chunks_sent += len(chunks)
            for rid, t, n, idx in chunks:
                self._chunk_rows.setdefault(rid, []).append((t, n, idx))
            out = []
            for values in finished:
                row = dict(zip(_REQUEST_FIELDS, values, strict=True))
                row["chunks"] = self._chunk_rows.pop(row["request_id"], [])
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


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def _ns_to_s(ns: float | None) -> float | None:
    return None if ns is None else ns * 1e-9
