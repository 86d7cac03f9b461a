"""``openai:URL`` — profile an OpenAI-compatible streaming HTTP server.

One asyncio event loop serves every open stream (hundreds at once); a feeder thread moves
submissions from the driver's inbox into the loop and encodes their JSON bodies there, off
the loop. Each request is stamped ``sent`` when its last byte is written to the socket
(aiohttp trace hooks), with its connection set-up time and response-header time kept apart,
and each chunk when its bytes arrive from the socket. Token counts come from the server's
usage where given (see :mod:`.tokens`).

A request that fails before any of it can have reached the server (the write failed, or the
pooled connection was already closed by the server, as llama-server does after every
stream) is retried once on a new connection, and the retry is recorded (``attempts``).
Nothing later is ever retried.

The client measures itself: an event-loop lag probe (how late a timer fires, i.e. how long
a chunk that arrived could wait before being stamped), the send path and the loop thread's
CPU share. They go into the manifest (``engine.config.client``), with a warning when the
stamps may be late by a noticeable share of the inter-token gap (see :mod:`.report`).

This module holds the engine and its serve loop; its options are :mod:`.config`, the checks
of the server before a run :mod:`.preflight`, and the client's end-of-run record
:mod:`.report`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from typing import Any

import aiohttp
import numpy as np

from perfscope.errors import EngineError, UsageError
from perfscope.profiler.engines.base import (
    EngineInfo,
    EngineOptions,
    Inbox,
    Submission,
)
from perfscope.profiler.engines.openai import client as _client
from perfscope.profiler.engines.openai.client import StreamResult, stream_request, trace_config
from perfscope.profiler.engines.openai.config import (
    API_KEY_ENV,
    OpenAIConfig,
    redact_url,
    request_body,
)
from perfscope.profiler.engines.openai.cost import ClientCost
from perfscope.profiler.engines.openai.kstamp import KernelTransport, TransportStats
from perfscope.profiler.engines.openai.preflight import Preflight
from perfscope.profiler.engines.openai.report import (
    SATURATION_GAP_SHARE,
    SATURATION_LAG_S,
    ClientStats,
    client_report,
    is_saturated,
)
from perfscope.profiler.engines.openai.stall import RequestSpan
from perfscope.profiler.engines.openai.tokens import TokenCounter, count_tokens, load_tokenizer
from perfscope.profiler.engines.openai.workers import WorkerJobResult, WorkerPool, WorkerSettings
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec

# API_KEY_ENV, redact_url (config), is_saturated and the SATURATION_* thresholds (report) are
# re-exported: they were defined here before the module was split by concern.
__all__ = [
    "API_KEY_ENV",
    "SATURATION_GAP_SHARE",
    "SATURATION_LAG_S",
    "OpenAIConfig",
    "OpenAIEngine",
    "is_saturated",
    "redact_url",
]

log = logging.getLogger("perfscope.openai")

#: Prompt tokens every prompt shares (llama.cpp counts the BOS as served from its cache):
#: a request is a prefix-cache hit only with more cached tokens than this.
SHARED_BOS_TOKENS = 1


class OpenAIEngine:
    """Streams every request to an OpenAI-compatible server from one asyncio loop."""

    def __init__(self, uri: str, cfg: OpenAIConfig, tokenizer: TokenCounter | None = None) -> None:
        self.uri = uri
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.supported: dict[str, bool] = {
            "ignore_eos": cfg.ignore_eos,
            "stream_options": cfg.include_usage,
            "continuous_usage_stats": cfg.include_usage and cfg.continuous_usage,
        }
        self.server_info: dict[str, Any] = {}
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if cfg.api_key:
            self._headers["Authorization"] = f"Bearer {cfg.api_key}"
        self._info: EngineInfo | None = None
        self.stats = ClientStats()
        self._preflight_warnings: list[str] = []
        self._pool: WorkerPool | None = None
        self._cost = ClientCost()
        self._transport_stats: list[TransportStats] = []
        self._kernel: tuple[KernelTransport, KernelTransport] | None = None

    # --- setup --------------------------------------------------------------------------

    def preflight(self) -> None:
        """Check the server with one tiny request; raise UsageError with what to fix.

        Also learns the model name (``GET /models``) when none was given, drops optional
        fields the server rejects, and notes whether it sends usage per chunk (see
        :mod:`.preflight`).
        """
        checks = Preflight(self.cfg, self._headers, self.supported, self._preflight_warnings)
        try:
            asyncio.run(checks.run())
        finally:
            if checks.server_info is not None:
                self.server_info = checks.server_info

    # --- Engine protocol ----------------------------------------------------------------

    def info(self) -> EngineInfo:
        if self._info is None:
            cfg = self.cfg
            self._info = EngineInfo(
                uri=redact_url(self.uri),
                kind="openai",
                model=None,
                device=redact_url(cfg.base_url),
                dtype=None,
                config={
                    "server_model": cfg.model,
                    "endpoint": cfg.endpoint,
                    "url": redact_url(cfg.url),
                    "max_tokens": cfg.max_tokens,
                    "timeout_s": cfg.timeout_s,
                    "extra_body": cfg.extra_body,
                    "sends": dict(self.supported),
                    "server": self.server_info,
                    "tokenizer": cfg.tokenizer,
                    "auth": "bearer" if cfg.api_key else None,
                    "connection": cfg.connection,
                    "workers": cfg.workers,
                    "prompt_salt": cfg.prompt_salt,
                    "client": "aiohttp " + aiohttp.__version__,
                },
            )
        return self._info

    def start_workers(self) -> None:
        """Start the worker processes (``workers`` > 1) once the preflight is done."""
        if self.cfg.workers > 1 and self._pool is None:
            self._pool = WorkerPool(
                self.cfg.workers,
                WorkerSettings(
                    self.cfg.url,
                    dict(self._headers),
                    self.cfg.timeout_s,
                    self.cfg.connection,
                    limits=self.cfg.limits,
                    kernel_stamps=self.cfg.kernel_stamps,
                ),
            )

    def close(self) -> None:
        """Stop the worker processes, if any."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _body(self, prompt: str | list[int], max_tokens: int) -> dict[str, Any]:
        return request_body(self.cfg, self.supported, prompt, max_tokens)

    def _prompt_of(self, spec: RequestSpec) -> str | list[int]:
        if spec.prompt is not None:
            return spec.prompt
        if spec.prompt_token_ids is not None:
            if self.cfg.endpoint == "completions":
                return list(spec.prompt_token_ids)
            raise UsageError("token-id prompts need --endpoint completions")
        from perfscope.profiler.datasets import synthetic_text

        seed = [spec.request_id, 7919]
        if self.cfg.prompt_salt is not None:
            seed.append(self.cfg.prompt_salt)
        rng = np.random.default_rng(seed)
        return synthetic_text(spec.prompt_tokens, rng, None)[0]

    def serve(self, inbox: Inbox, recorder: Recorder) -> None:
        """Serve every submission from ``inbox`` on one event loop (or the worker processes'
        loops) until all are done."""
        origin = getattr(recorder.clock, "origin_perf_counter_ns", None)
        if self._pool is not None and isinstance(origin, int):
            self._serve_sharded(self._pool, origin, inbox, recorder)
        else:
            asyncio.run(self._serve(inbox, recorder))

    def _serve_sharded(
        self, pool: WorkerPool, origin: int, inbox: Inbox, recorder: Recorder
    ) -> None:
        now_ns = recorder.clock.now_ns
        jobs: dict[int, Submission] = {}
        self._cost = ClientCost.start()
        submitted = threading.Event()
        feeder_error: list[BaseException] = []
        pool.start_run(origin)

        def feeder() -> None:
            try:
                while True:
                    sub = inbox.get(timeout_s=0.1)
                    if sub is None:
                        if inbox.finished:
                            break
                        continue
                    body = json.dumps(
                        self._body(self._prompt_of(sub.spec), sub.spec.max_output_tokens)
                    ).encode()
                    jobs[sub.spec.request_id] = sub
                    sub.handle.record.t_dispatched = now_ns()
                    pool.submit(sub.spec.request_id, body)
            except BaseException as exc:
                feeder_error.append(exc)
            finally:
                submitted.set()

        def on_result(r: WorkerJobResult) -> None:
            sub = jobs.pop(r.job_id)
            st = self.stats
            if r.attempts == 2:
                st.retried += 1
                st.retry_reasons[str(r.first_error).split(":")[0]] += 1
                if r.result.error is not None:
                    st.retry_failed += 1
            sub.handle.record.attempts = r.attempts
            try:
                self._record(sub, r.result)
            except Exception as exc:  # never let one request end the run
                sub.handle.finish(error=f"{type(exc).__name__}: {exc}"[:300])

        thread = threading.Thread(target=feeder, name="perfscope-openai-feeder", daemon=True)
        thread.start()
        worker_stats = pool.collect(on_result, submitted.is_set)
        thread.join()
        self.stats.lag_ns = [x for w in worker_stats for x in w.lag_ns]
        _client.STAMP_DELAYS_NS[:] = [x for w in worker_stats for x in w.stamp_delays_ns]
        busiest = max(worker_stats, key=lambda w: w.cpu_s / w.wall_s if w.wall_s else 0.0)
        self._transport_stats = [w.transport for w in worker_stats if w.transport is not None]
        self._cost.workers_cpu_s = sum(w.cpu_s for w in worker_stats)
        self._cost.workers_peak_rss_bytes = max((w.peak_rss_bytes for w in worker_stats), default=0)
        self._cost.stop()
        self._report(busiest.cpu_s, busiest.wall_s)
        if feeder_error:
            exc = feeder_error[0]
            if isinstance(exc, UsageError | EngineError):
                raise exc
            raise EngineError(f"openai engine: preparing a request failed: {exc}") from exc

    async def _serve(self, inbox: Inbox, recorder: Recorder) -> None:
        loop = asyncio.get_running_loop()
        now_ns = recorder.clock.now_ns
        stop = threading.Event()
        all_submitted = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()
        feeder_error: list[BaseException] = []
        _client.STAMP_DELAYS_NS.clear()
        _client._SELECT.returned_ns = 0
        _client.install_select_stamps(loop)
        session = self._session(force_close=self.cfg.connection == "new")
        # Retries go out on a new connection each (never on a pooled one).
        fresh = self._session(force_close=True)
        kernel: tuple[KernelTransport, KernelTransport] | None = None
        if self.cfg.kernel_stamps:
            kernel = (
                KernelTransport(now_ns, reuse=self.cfg.connection == "reuse"),
                KernelTransport(now_ns, reuse=False),
            )
        self._kernel = kernel

        def start(sub: Submission, body: bytes) -> None:
            sub.handle.record.t_dispatched = now_ns()
            task = loop.create_task(self._one(session, fresh, sub, body, recorder, kernel))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def feeder() -> None:
            try:
                while not stop.is_set():
                    sub = inbox.get(timeout_s=0.1)
                    if sub is None:
                        if inbox.finished:
                            break
                        continue
                    body = json.dumps(
                        self._body(self._prompt_of(sub.spec), sub.spec.max_output_tokens)
                    ).encode()
                    loop.call_soon_threadsafe(start, sub, body)
            except BaseException as exc:
                feeder_error.append(exc)
            finally:
                # RuntimeError: the loop is already closed (interrupted).
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(all_submitted.set)

        thread = threading.Thread(target=feeder, name="perfscope-openai-feeder", daemon=True)
        monitor = loop.create_task(self._lag_probe(now_ns))
        self._cost = ClientCost.start()
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        thread.start()
        try:
            await all_submitted.wait()
            while tasks:
                await asyncio.gather(*list(tasks))
        finally:
            stop.set()
            monitor.cancel()
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
            await session.close()
            await fresh.close()
            if kernel is not None:
                self._transport_stats = [kernel[0].stats, kernel[1].stats]
                for k in kernel:
                    k.close()
            else:
                self._transport_stats = []
            self._cost.stop()
            self._report(cpu, wall)
        if feeder_error:
            exc = feeder_error[0]
            if isinstance(exc, UsageError | EngineError):
                raise exc
            raise EngineError(f"openai engine: preparing a request failed: {exc}") from exc

    async def _lag_probe(self, now_ns: Any, interval_s: float = 0.002) -> None:
        """How late the loop runs a due timer: the wait a just-arrived chunk may have had.
        Lags over 1 ms are also kept with their end time (run clock), to find the requests
        in flight during a stall."""
        lags, events = self.stats.lag_ns, self.stats.lag_events
        step = int(interval_s * 1e9)
        while True:
            t0 = time.perf_counter_ns()
            await asyncio.sleep(interval_s)
            lag = max(0, time.perf_counter_ns() - t0 - step)
            lags.append(lag)
            if lag > 1_000_000:
                events.append((now_ns(), lag))

    @staticmethod
    def _session(force_close: bool) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=force_close)
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=("User-Agent",),
            trace_configs=[trace_config()],
        )

    async def _one(
        self,
        session: aiohttp.ClientSession,
        fresh: aiohttp.ClientSession,
        sub: Submission,
        body: bytes,
        recorder: Recorder,
        kernel: tuple[KernelTransport, KernelTransport] | None = None,
    ) -> None:
        h = sub.handle
        url, headers, timeout = self.cfg.url, self._headers, self.cfg.timeout_s
        try:
            now = recorder.clock.now_ns
            if kernel is not None:
                res = await kernel[0].stream_request(url, body, headers, timeout, self.cfg.limits)
            else:
                res = await stream_request(
                    session, url, body, headers, now, timeout, self.cfg.limits
                )
            attempts = 1
            if res.retryable:
                self.stats.retried += 1
                self.stats.retry_reasons[str(res.error).split(":")[0]] += 1
                if kernel is not None:
                    res = await kernel[1].stream_request(
                        url, body, headers, timeout, self.cfg.limits
                    )
                else:
                    res = await stream_request(
                        fresh, url, body, headers, now, timeout, self.cfg.limits
                    )
                attempts = 2
                if res.error is not None:
                    self.stats.retry_failed += 1
            h.record.attempts = attempts
            self._record(sub, res)
        except Exception as exc:  # never let one request end the run
            h.finish(error=f"{type(exc).__name__}: {exc}"[:300])

    def _record(self, sub: Submission, res: StreamResult) -> None:
        h, st = sub.handle, self.stats
        rec = h.record
        h.sent(res.t_sent_ns)
        rec.connect_ns = res.connect_ns
        rec.t_response_headers = res.t_headers_ns
        if res.connect_ns is not None:
            st.new_connections += 1
            st.connect_ns.append(res.connect_ns)
        if rec.t_dispatched is not None:
            st.queue_ns.append(rec.t_dispatched - rec.t_scheduled)
            if res.t_sent_ns is not None:
                st.send_path_ns.append(res.t_sent_ns - rec.t_dispatched - (res.connect_ns or 0))
        st.comments += res.comments
        st.ignored_lines += res.ignored_lines
        if res.t_sent_ns is not None:
            st.spans.append(
                RequestSpan(
                    sub.spec.request_id,
                    res.t_sent_ns,
                    res.t_headers_ns,
                    tuple(res.t_ns),
                    res.stall_ns,
                )
            )
        st.kernel_stamped += res.kernel_stamped
        tc = count_tokens(res.texts, res.cumulative, res.completion_tokens, self.tokenizer)
        st.token_source[tc.source] += 1
        # Every arrival is recorded, also one attributed no token (only when the server's
        # total is smaller than the arrivals): chunks are never dropped.
        for t, n in zip(res.t_ns, tc.per_chunk, strict=True):
            h.tokens(n, t_ns=t)
            st.chunks += 1
            if n > 1:
                st.multi_token_chunks += 1
        if len(res.t_ns) > 2:  # mean gap: robust to chunks that arrived in one read
            st.gap_ns.append((res.t_ns[-1] - res.t_ns[0]) / (len(res.t_ns) - 1))
        if tc.mismatch is not None:
            st.compared += 1
            st.client_tokens += tc.client_total or 0
            st.server_tokens += tc.server_total or 0
            if tc.mismatch:
                st.mismatched += 1
                st.max_abs_mismatch = max(st.max_abs_mismatch, abs(tc.mismatch))
                if not tc.mismatch_explained:
                    st.unexplained += 1
        if tc.reconciled:
            st.reconciled += 1
        if res.error is None and not res.t_ns and res.completion_tokens and res.t_usage_ns:
            # Tokens the server counted but never rendered as text (e.g. only special
            # tokens): they are known to exist by the time the usage arrived.
            h.tokens(res.completion_tokens, t_ns=res.t_usage_ns)
            tc.total = res.completion_tokens
        if res.model is not None:
            st.served_models[res.model] += 1
        if res.finish_reasons:
            rec.finish_reason = res.finish_reasons[-1]
            st.finish_reasons[rec.finish_reason] += 1
        if res.cached_tokens is not None:
            rec.cached_tokens = res.cached_tokens
            st.cache_reported += 1
            st.cached_tokens += res.cached_tokens
            st.cache_prompt_tokens += res.prompt_tokens or sub.spec.prompt_tokens
            if res.cached_tokens > SHARED_BOS_TOKENS:
                st.cache_hits += 1
        if res.error is None:
            h.set_output_tokens(tc.total)
            asked = self.cfg.max_tokens or sub.spec.max_output_tokens
            rec.truncated = rec.finish_reason == "length" and tc.total < asked
            if rec.truncated:
                st.truncated += 1
                if len(st.truncated_examples) < 3:
                    st.truncated_examples.append((sub.spec.request_id, tc.total, asked))
            if res.prompt_tokens is not None:
                if self.tokenizer is None and sub.spec.prompt is not None:
                    st.prompt_asked.append(sub.spec.prompt_tokens)
                    st.prompt_server.append(res.prompt_tokens)
                h.set_prompt_tokens(res.prompt_tokens)
        else:
            st.errors[res.error.split(":")[0]] += 1
        h.finish(error=res.error)

    def _report(self, cpu_s: float, wall_s: float) -> None:
        client = client_report(
            self.stats,
            self.cfg,
            cpu_s=cpu_s,
            wall_s=wall_s,
            cost=self._cost,
            transport_stats=self._transport_stats,
            workers=self.cfg.workers if self._pool is not None else 1,
            preflight_warnings=self._preflight_warnings,
        )
        # The runner writes the manifest again after serve(); the config dict it holds is this
        # one, so the client's own measurements land in manifest.engine.config.client.
        self.info().config["client"] = client
        for w in client["warnings"][len(self._preflight_warnings) :]:
            log.warning("%s", w)


def create_openai_engine(uri: str, options: EngineOptions) -> OpenAIEngine:
    """Factory registered for ``openai:``; runs the preflight check unless disabled."""
    cfg = OpenAIConfig.from_engine_options(uri, options)
    tok = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
    engine = OpenAIEngine(uri, cfg, tok)
    if cfg.preflight:
        engine.preflight()
    elif cfg.model is None:
        raise UsageError("give --model NAME (the preflight that would ask the server is off)")
    engine.start_workers()
    return engine
