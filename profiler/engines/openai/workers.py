"""Streams sharded over worker processes (``--engine-opt workers=N``): one asyncio loop each.

One event loop on one core stamps a chunk late by the work queued before it; with hundreds
of streams whose chunks arrive together, that work is milliseconds. Worker processes split
the streams, so each loop has fewer chunks ahead of any one. Every stamp stays on the run's
clock: ``time.perf_counter_ns`` is CLOCK_MONOTONIC, shared by all processes on Linux, and
each worker subtracts the run's origin that the parent sends it.

The parent keeps the driver, the recorder and the accounting: it sends each request's body
to the worker with the fewest requests in flight and records the :class:`StreamResult` that
comes back. A worker retries a request the same way the single-loop engine does.

A worker that dies (killed, out of memory) does not end the run: each request it had in
flight fails with an error naming the worker, its pid and exit code, and later requests go
to the workers still alive (when none is left, each fails the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import aiohttp

from perfscope.profiler.engines.openai import client as _client
from perfscope.profiler.engines.openai.client import (
    ReadLimits,
    StreamResult,
    stream_request,
    trace_config,
)
from perfscope.profiler.engines.openai.cost import peak_rss_bytes
from perfscope.profiler.engines.openai.kstamp import KernelTransport, TransportStats

__all__ = ["WorkerJobResult", "WorkerPool", "WorkerSettings"]


@dataclass(frozen=True)
class WorkerSettings:
    """What a worker needs to stream: the endpoint URL, headers, per-request timeout (s),
    the connection policy (``reuse`` or ``new``) and the read limits."""

    url: str
    headers: dict[str, str]
    timeout_s: float | None
    connection: str
    kernel_stamps: bool = False
    limits: ReadLimits = field(default_factory=ReadLimits)


@dataclass
class WorkerJobResult:
    """A finished request from a worker: the result of its last attempt, the attempts made
    and, when it was retried, the first attempt's error."""

    job_id: int
    result: StreamResult
    attempts: int
    first_error: str | None = None


@dataclass
class WorkerStats:
    """A worker's own measurements over one ``serve`` (ns lists, CPU seconds)."""

    lag_ns: list[int] = field(default_factory=list)
    stamp_delays_ns: list[int] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    peak_rss_bytes: int = 0
    transport: TransportStats | None = None


def _session(force_close: bool) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=force_close),
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=("User-Agent",),
        trace_configs=[trace_config()],
    )


async def _worker(conn: Connection, st: WorkerSettings) -> None:
    loop = asyncio.get_running_loop()
    _client.install_select_stamps(loop)
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    origin = [time.perf_counter_ns()]

    def now_ns() -> int:
        return time.perf_counter_ns() - origin[0]

    def readable() -> None:
        while conn.poll():
            try:
                inbox.put_nowait(conn.recv())
            except EOFError:
                inbox.put_nowait(("quit",))
                loop.remove_reader(conn.fileno())
                return

    loop.add_reader(conn.fileno(), readable)
    session = _session(st.connection == "new")
    fresh = _session(True)
    tasks: set[asyncio.Task[None]] = set()
    stats = WorkerStats()
    cpu0, wall0 = time.thread_time(), time.perf_counter()

    async def lag_probe(step_s: float = 0.002) -> None:
        step = int(step_s * 1e9)
        while True:
            t0 = time.perf_counter_ns()
            await asyncio.sleep(step_s)
            stats.lag_ns.append(max(0, time.perf_counter_ns() - t0 - step))

    kernel = (
        (
            KernelTransport(now_ns, reuse=st.connection == "reuse"),
            KernelTransport(now_ns, reuse=False),
        )
        if st.kernel_stamps
        else None
    )

    async def one(job_id: int, body: bytes) -> None:
        lim = st.limits
        if kernel is not None:
            res = await kernel[0].stream_request(st.url, body, st.headers, st.timeout_s, lim)
        else:
            res = await stream_request(session, st.url, body, st.headers, now_ns, st.timeout_s, lim)
        attempts, first = 1, None
        if res.retryable:
            first = res.error
            if kernel is not None:
                res = await kernel[1].stream_request(st.url, body, st.headers, st.timeout_s, lim)
            else:
                res = await stream_request(
                    fresh, st.url, body, st.headers, now_ns, st.timeout_s, lim
                )
            attempts = 2
        res.candidates = []  # settled: the arrivals are what the parent needs
        conn.send(WorkerJobResult(job_id, res, attempts, first))

    probe = loop.create_task(lag_probe())
    try:
        while True:
            msg = await inbox.get()
            if msg[0] == "origin":
                origin[0] = int(msg[1])
                stats = WorkerStats()
                _client.STAMP_DELAYS_NS.clear()
                for k in kernel or ():
                    k.stats.clear()
                cpu0, wall0 = time.thread_time(), time.perf_counter()
            elif msg[0] == "job":
                task = loop.create_task(one(int(msg[1]), bytes(msg[2])))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            elif msg[0] == "end":
                while tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
                stats.stamp_delays_ns = list(_client.STAMP_DELAYS_NS)
                stats.cpu_s = time.thread_time() - cpu0
                stats.wall_s = time.perf_counter() - wall0
                stats.peak_rss_bytes = peak_rss_bytes()
                if kernel is not None:
                    stats.transport = kernel[0].stats
                    stats.transport.merge(kernel[1].stats)
                conn.send(stats)
            elif msg[0] == "quit":
                break
    finally:
        probe.cancel()
        await session.close()
        await fresh.close()
        for k in kernel or ():
            k.close()


def _worker_main(conn: Connection, settings: WorkerSettings) -> None:
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError, EOFError):
        asyncio.run(_worker(conn, settings))


class WorkerPool:
    """``n`` worker processes streaming requests for the parent (see the module docstring)."""

    def __init__(self, n: int, settings: WorkerSettings) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for k in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker_main,
                args=(child, settings),
                name=f"perfscope-openai-worker-{k}",
                daemon=True,
            )
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        self.in_flight = [0] * n
        #: Per worker, the job ids it has in flight (to fail them if it dies).
        self.jobs: list[set[int]] = [set() for _ in range(n)]
        self.dead: dict[int, str] = {}  # worker index -> why it is gone
        self._orphans: list[WorkerJobResult] = []  # failed in submit: no worker alive
        self._lock = threading.Lock()  # the feeder thread submits, the collector collects

    def _name(self, k: int) -> str:
        proc = self.procs[k]
        return f"{proc.name} (pid {proc.pid})"

    def _lost(self, k: int, job_id: int) -> WorkerJobResult:
        res = StreamResult(error=f"lost: {self.dead[k]} with this request in flight")
        return WorkerJobResult(job_id, res, 1)

    def _mark_dead(self, k: int) -> list[WorkerJobResult]:
        """Worker ``k``'s pipe closed: record why, and fail its requests in flight."""
        proc = self.procs[k]
        proc.join(1.0)
        code = proc.exitcode
        how = f"exit code {code}" if code is not None and code >= 0 else f"signal {-(code or 0)}"
        with self._lock:
            if k in self.dead:
                return []
            self.dead[k] = f"worker {self._name(k)} died ({how})"
            lost = sorted(self.jobs[k])
            self.jobs[k].clear()
            self.in_flight[k] = 0
        return [self._lost(k, j) for j in lost]

    def start_run(self, origin_perf_counter_ns: int) -> None:
        """Start measuring a run whose clock starts at ``origin_perf_counter_ns``."""
        for k, c in enumerate(self.conns):
            if k not in self.dead:
                with contextlib.suppress(OSError):
                    c.send(("origin", origin_perf_counter_ns))
        self.in_flight = [0] * len(self.conns)

    def submit(self, job_id: int, body: bytes) -> None:
        """Send a request to the live worker with the fewest in flight (driver thread
        only); with no worker alive, the request fails naming the dead ones."""
        while True:
            with self._lock:
                alive = [k for k in range(len(self.conns)) if k not in self.dead]
                if not alive:
                    res = StreamResult(
                        error="lost: no worker alive (" + "; ".join(self.dead.values()) + ")"
                    )
                    self._orphans.append(WorkerJobResult(job_id, res, 1))
                    return
                k = min(alive, key=self.in_flight.__getitem__)
                self.in_flight[k] += 1
                self.jobs[k].add(job_id)
            try:
                self.conns[k].send(("job", job_id, body))
                return
            except OSError:  # its pipe is gone: it died; try another
                with self._lock:
                    self.in_flight[k] -= 1
                    self.jobs[k].discard(job_id)
                self._orphans.extend(self._mark_dead(k))

    def collect(
        self, on_result: Callable[[WorkerJobResult], None], submitted_all: Callable[[], bool]
    ) -> list[WorkerStats]:
        """Hand every result to ``on_result`` until all submitted requests are done and
        ``submitted_all()``; then end the run on each worker and return their stats. A
        dead worker's requests in flight are handed over failed (see the module doc)."""
        from multiprocessing.connection import wait

        index = {id(c): k for k, c in enumerate(self.conns)}
        while True:
            with self._lock:
                orphans, self._orphans = self._orphans, []
            for r in orphans:
                on_result(r)
            done = submitted_all()  # read before the count: a last submit is not missed
            with self._lock:
                if done and sum(self.in_flight) == 0 and not self._orphans:
                    break
            live = [c for k, c in enumerate(self.conns) if k not in self.dead]
            for ready in wait(live, timeout=0.1) if live else ():
                k = index[id(ready)]
                try:
                    msg = self.conns[k].recv()
                except (EOFError, OSError):
                    for r in self._mark_dead(k):
                        on_result(r)
                    continue
                if isinstance(msg, WorkerJobResult):
                    with self._lock:
                        self.in_flight[k] -= 1
                        self.jobs[k].discard(msg.job_id)
                    on_result(msg)
            if not live:
                time.sleep(0.05)
        stats: list[WorkerStats] = []
        for k, c in enumerate(self.conns):
            if k in self.dead:
                continue
            try:
                c.send(("end",))
            except OSError:
                self._mark_dead(k)
        for k, c in enumerate(self.conns):
            while k not in self.dead:
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    for r in self._mark_dead(k):  # nothing in flight by now
                        on_result(r)
                    break
                if isinstance(msg, WorkerStats):
                    stats.append(msg)
                    break
                if isinstance(msg, WorkerJobResult):  # cannot happen: all were collected
                    on_result(msg)
        return stats

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        for c in self.conns:
            with contextlib.suppress(OSError, ValueError):
                c.send(("quit",))
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
        for c in self.conns:
            c.close()
        self.conns, self.procs = [], []
