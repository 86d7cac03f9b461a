"""``openai:URL`` — profile an OpenAI-compatible streaming HTTP server.

One asyncio event loop serves every open stream (hundreds at once); a feeder thread moves
submissions from the driver's inbox into the loop and encodes their JSON bodies there, off
the loop. Each request is stamped ``sent`` right before its POST and each chunk when its
bytes are read from the socket. Token counts come from the server's usage where given
(see :mod:`.tokens`).

The client measures itself: an event-loop lag probe (how late a timer fires, i.e. how long
a chunk that arrived could wait before being stamped) and the loop thread's CPU share. Both
go into the manifest (``engine.config.client``), with a warning when the client saturates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import numpy as np

from perfscope.errors import EngineError, UsageError
from perfscope.profiler.engines.base import (
    EngineInfo,
    EngineOptions,
    Inbox,
    Submission,
)
from perfscope.profiler.engines.openai.client import (
    StreamResult,
    build_body,
    classify_exception,
    stream_request,
)
from perfscope.profiler.engines.openai.tokens import TokenCounter, count_tokens, load_tokenizer
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec

__all__ = ["API_KEY_ENV", "OpenAIConfig", "OpenAIEngine", "redact_url"]

log = logging.getLogger("perfscope.openai")

#: Environment variables read for the API key, in order.
API_KEY_ENV = ("PERFSCOPE_API_KEY", "OPENAI_API_KEY")

#: Median loop lag (s) above which the client is called saturated (an idle loop shows
#: ~0.1 ms of timer and scheduler noise, with a p99 up to ~1.5 ms on a shared 2-core box).
SATURATION_LAG_S = 0.5e-3
#: Share of one core used by the loop thread above which the client is called saturated.
SATURATION_CPU = 0.85

_OPTIONAL_FIELDS = ("ignore_eos", "continuous_usage_stats", "stream_options")


def redact_url(url: str) -> str:
    """``url`` without a ``user:password@`` part."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return url


def _truthy(text: str | None, default: bool) -> bool:
    if text is None:
        return default
    return text.strip().lower() in ("1", "true", "yes", "on")


@dataclass
class OpenAIConfig:
    """Options of the ``openai:`` engine (from ``EngineOptions.extra`` / CLI flags).

    Attributes:
        base_url: API base, e.g. ``http://127.0.0.1:8000/v1``.
        model: model name sent in each request (None: ask ``GET /models``).
        endpoint: ``completions`` or ``chat``.
        api_key: bearer token (never stored in the run).
        timeout_s: per-request limit in seconds, connection to last byte (None: none).
        max_tokens: if set, sent as ``max_tokens`` in every request instead of each request's
            output length.
        ignore_eos: ask the server to generate exactly ``max_tokens`` (vLLM, SGLang, TGI
            understand it; dropped when the server rejects it).
        extra_body: extra JSON fields merged into every request body.
        tokenizer: local tokenizer path for token counts when the server gives none.
        preflight: send one tiny request first to check the URL, model, streaming and which
            optional fields the server accepts.
        include_usage / continuous_usage: ask for usage (final, and per chunk).
    """

    base_url: str
    model: str | None = None
    endpoint: str = "completions"
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float | None = 600.0
    max_tokens: int | None = None
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    preflight: bool = True
    include_usage: bool = True
    continuous_usage: bool = True

    @classmethod
    def from_engine_options(cls, uri: str, options: EngineOptions) -> OpenAIConfig:
        """Read the URI and ``options.extra`` (``model``, ``api_key``, ``endpoint``,
        ``extra_body`` (JSON object), ``timeout`` (s), ``max_tokens``, ``ignore_eos``,
        ``tokenizer``, ``preflight``, ``continuous_usage``)."""
        url = uri.split(":", 1)[1].strip() if ":" in uri else ""
        if not url:
            raise UsageError(
                "openai engine needs the server's API base: openai:http://HOST:PORT/v1"
            )
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"openai engine: {redact_url(url)!r} is not an http(s) URL")
        x = dict(options.extra)
        endpoint = x.get("endpoint", "completions").strip().lower()
        if endpoint in ("chat/completions", "chat_completions"):
            endpoint = "chat"
        if endpoint not in ("completions", "chat"):
            raise UsageError(f"--endpoint {endpoint!r}: use 'completions' or 'chat'")
        extra_body: dict[str, Any] = {}
        if x.get("extra_body"):
            try:
                extra_body = json.loads(x["extra_body"])
            except json.JSONDecodeError as exc:
                raise UsageError(
                    f"--extra-body is not valid JSON ({exc.msg} at char {exc.pos}); give an "
                    "object, e.g. '{\"temperature\": 0}'"
                ) from None
            if not isinstance(extra_body, dict):
                raise UsageError("--extra-body must be a JSON object, e.g. '{\"top_p\": 0.9}'")
        try:
            timeout = float(x["timeout"]) if x.get("timeout") else 600.0
            max_tokens = int(x["max_tokens"]) if x.get("max_tokens") else None
        except ValueError as exc:
            raise UsageError(f"openai engine: bad --timeout/--max-tokens ({exc})") from None
        if timeout <= 0:
            raise UsageError("--timeout must be a positive number of seconds")
        if max_tokens is not None and max_tokens < 1:
            raise UsageError("--max-tokens must be at least 1")
        api_key = x.get("api_key") or next(
            (os.environ[k] for k in API_KEY_ENV if os.environ.get(k)), None
        )
        return cls(
            base_url=url.rstrip("/"),
            model=x.get("model") or None,
            endpoint=endpoint,
            api_key=api_key,
            timeout_s=timeout,
            max_tokens=max_tokens,
            ignore_eos=_truthy(x.get("ignore_eos"), True),
            extra_body=extra_body,
            tokenizer=x.get("tokenizer") or None,
            preflight=_truthy(x.get("preflight"), True),
            continuous_usage=_truthy(x.get("continuous_usage"), True),
        )

    @property
    def url(self) -> str:
        """The full endpoint URL."""
        return self.base_url + ("/chat/completions" if self.endpoint == "chat" else "/completions")


class _Stats:
    """Counters of the client over a run (loop thread only)."""

    def __init__(self) -> None:
        self.token_source: Counter[str] = Counter()
        self.mismatched = 0
        self.compared = 0
        self.client_tokens = 0
        self.server_tokens = 0
        self.max_abs_mismatch = 0
        self.multi_token_chunks = 0
        self.chunks = 0
        self.comments = 0
        self.ignored_lines = 0
        self.errors: Counter[str] = Counter()
        self.lag_ns: list[int] = []


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
        self._rng = np.random.default_rng(0)
        self.stats = _Stats()

    # --- setup --------------------------------------------------------------------------

    def preflight(self) -> None:
        """Check the server with one tiny request; raise UsageError with what to fix.

        Also learns the model name (``GET /models``) when none was given, drops optional
        fields the server rejects, and notes whether it sends usage per chunk.
        """
        asyncio.run(self._preflight())

    async def _preflight(self) -> None:
        cfg = self.cfg
        shown = redact_url(cfg.base_url)
        timeout = aiohttp.ClientTimeout(total=min(cfg.timeout_s or 120.0, 120.0))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if cfg.model is None:
                cfg.model = await self._discover_model(session, shown)
            for _ in range(len(_OPTIONAL_FIELDS) + 1):
                body = self._body("Hello", 2)
                res = await stream_request(
                    session,
                    cfg.url,
                    json.dumps(body).encode(),
                    self._headers,
                    time.perf_counter_ns,
                    cfg.timeout_s,
                )
                if res.status in (400, 422) and res.error and self._drop_rejected(res.error):
                    continue
                break
        self._check_preflight(res, shown)
        self.server_info = {
            "usage": res.completion_tokens is not None,
            "usage_per_chunk": res.usage_per_chunk,
            "done_marker": res.done,
        }

    async def _discover_model(self, session: aiohttp.ClientSession, shown: str) -> str:
        try:
            async with session.get(self.cfg.base_url + "/models", headers=self._headers) as r:
                data = await r.json(content_type=None) if r.status == 200 else None
        except Exception as exc:
            raise UsageError(
                f"cannot reach {shown}: {classify_exception(exc, None)}; is the server running "
                "and is the URL its API base (e.g. openai:http://127.0.0.1:8000/v1)?"
            ) from None
        ids = [
            m.get("id")
            for m in (data or {}).get("data", [])
            if isinstance(m, dict) and isinstance(m.get("id"), str)
        ]
        if not ids:
            raise UsageError(
                f"{shown}/models lists no model; give the model name with --model NAME"
            )
        return str(ids[0])

    def _drop_rejected(self, error: str) -> bool:
        """Stop sending the optional fields named in a 400/422 error; True if any dropped."""
        dropped = False
        for name in _OPTIONAL_FIELDS:
            if self.supported.get(name) and name in error:
                self.supported[name] = False
                if name == "stream_options":
                    self.supported["continuous_usage_stats"] = False
                dropped = True
        if not dropped and (self.supported["ignore_eos"] or self.supported["stream_options"]):
            # Rejected without naming a field: retry with the bare OpenAI body.
            for name in _OPTIONAL_FIELDS:
                self.supported[name] = False
            dropped = True
        return dropped

    def _check_preflight(self, res: StreamResult, shown: str) -> None:
        url = redact_url(self.cfg.url)
        if res.error is None:
            return
        err = res.error
        if res.status == 0 and err.startswith("cannot connect"):
            raise UsageError(
                f"cannot reach {shown} ({err}); is the server running and the URL right "
                "(e.g. openai:http://127.0.0.1:8000/v1)?"
            )
        if res.status == 404:
            raise UsageError(
                f"{url} answered HTTP 404: no such endpoint; the engine URL must be the API "
                "base that ends in /v1 (e.g. openai:http://127.0.0.1:8000/v1), or the server "
                f"has no --endpoint {self.cfg.endpoint}"
            )
        if res.status in (401, 403):
            raise UsageError(
                f"{url} refused the request (HTTP {res.status}): give --api-key or set "
                f"{API_KEY_ENV[1]}"
            )
        if res.status:
            raise UsageError(f"{url} rejected a test request: {err}")
        raise UsageError(f"{url}: test request failed: {err}")

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
                    "client": "aiohttp " + aiohttp.__version__,
                },
            )
        return self._info

    def close(self) -> None:
        """Nothing held between runs."""

    def _body(self, prompt: str | list[int], max_tokens: int) -> dict[str, Any]:
        cfg, sup = self.cfg, self.supported
        return build_body(
            cfg.endpoint,
            cfg.model or "",
            prompt,
            cfg.max_tokens or max_tokens,
            ignore_eos=sup["ignore_eos"],
            include_usage=sup["stream_options"],
            continuous_usage=sup["continuous_usage_stats"],
            extra=cfg.extra_body,
        )

    def _prompt_of(self, spec: RequestSpec) -> str | list[int]:
        if spec.prompt is not None:
            return spec.prompt
        if spec.prompt_token_ids is not None:
            if self.cfg.endpoint == "completions":
                return list(spec.prompt_token_ids)
            raise UsageError("token-id prompts need --endpoint completions")
        from perfscope.profiler.datasets import synthetic_text

        rng = np.random.default_rng([spec.request_id, 7919])
        return synthetic_text(spec.prompt_tokens, rng, None)[0]

    def serve(self, inbox: Inbox, recorder: Recorder) -> None:
        """Serve every submission from ``inbox`` on one event loop until all are done."""
        asyncio.run(self._serve(inbox, recorder))

    async def _serve(self, inbox: Inbox, recorder: Recorder) -> None:
        loop = asyncio.get_running_loop()
        now_ns = recorder.clock.now_ns
        stop = threading.Event()
        all_submitted = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()
        feeder_error: list[BaseException] = []
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=("User-Agent",),
        )

        def start(sub: Submission, body: bytes) -> None:
            task = loop.create_task(self._one(session, sub, body, recorder))
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
        monitor = loop.create_task(self._lag_probe())
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        _ = now_ns  # the clock the requests are stamped with (see _one)
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
            self._report(cpu, wall)
        if feeder_error:
            exc = feeder_error[0]
            if isinstance(exc, UsageError | EngineError):
                raise exc
            raise EngineError(f"openai engine: preparing a request failed: {exc}") from exc

    async def _lag_probe(self, interval_s: float = 0.002) -> None:
        """How late the loop runs a due timer: the wait a just-arrived chunk may have had."""
        lags = self.stats.lag_ns
        step = int(interval_s * 1e9)
        while True:
            t0 = time.perf_counter_ns()
            await asyncio.sleep(interval_s)
            lags.append(max(0, time.perf_counter_ns() - t0 - step))

    async def _one(
        self, session: aiohttp.ClientSession, sub: Submission, body: bytes, recorder: Recorder
    ) -> None:
        h = sub.handle
        try:
            res = await stream_request(
                session,
                self.cfg.url,
                body,
                self._headers,
                recorder.clock.now_ns,
                self.cfg.timeout_s,
                on_sent=h.sent,
            )
            self._record(sub, res)
        except Exception as exc:  # never let one request end the run
            h.finish(error=f"{type(exc).__name__}: {exc}"[:300])

    def _record(self, sub: Submission, res: StreamResult) -> None:
        h, st = sub.handle, self.stats
        st.comments += res.comments
        st.ignored_lines += res.ignored_lines
        tc = count_tokens(res.texts, res.cumulative, res.completion_tokens, self.tokenizer)
        st.token_source[tc.source] += 1
        for t, n in zip(res.t_ns, tc.per_chunk, strict=True):
            if n > 0:
                h.tokens(n, t_ns=t)
                st.chunks += 1
                if n > 1:
                    st.multi_token_chunks += 1
        if tc.mismatch is not None:
            st.compared += 1
            st.client_tokens += tc.client_total or 0
            st.server_tokens += tc.server_total or 0
            if tc.mismatch:
                st.mismatched += 1
                st.max_abs_mismatch = max(st.max_abs_mismatch, abs(tc.mismatch))
        if res.error is None and not any(tc.per_chunk) and res.completion_tokens and res.t_usage_ns:
            # Tokens the server counted but never rendered as text (e.g. only special
            # tokens): they are known to exist by the time the usage arrived.
            h.tokens(res.completion_tokens, t_ns=res.t_usage_ns)
            tc.total = res.completion_tokens
        if res.error is None:
            h.set_output_tokens(tc.total)
            if res.prompt_tokens is not None:
                h.set_prompt_tokens(res.prompt_tokens)
        else:
            st.errors[res.error.split(":")[0]] += 1
        h.finish(error=res.error)

    def _report(self, cpu_s: float, wall_s: float) -> None:
        st = self.stats
        lag = np.asarray(st.lag_ns, dtype=float) * 1e-9
        cpu_share = cpu_s / wall_s if wall_s > 0 else 0.0
        lag_p50 = float(np.percentile(lag, 50)) if lag.size else None
        lag_p99 = float(np.percentile(lag, 99)) if lag.size else None
        saturated = cpu_share > SATURATION_CPU or (lag_p50 or 0.0) > SATURATION_LAG_S
        client = {
            "loop_lag_s": {
                "samples": int(lag.size),
                "p50": lag_p50,
                "p99": lag_p99,
                "max": float(lag.max()) if lag.size else None,
            },
            "loop_cpu_share": cpu_share,
            "saturated": saturated,
            "chunks": st.chunks,
            "multi_token_chunks": st.multi_token_chunks,
            "token_count_source": dict(st.token_source),
            "token_count_mismatch": {
                "compared": st.compared,
                "mismatched": st.mismatched,
                "client_tokens": st.client_tokens,
                "server_tokens": st.server_tokens,
                "max_abs": st.max_abs_mismatch,
            },
            "sse_comments": st.comments,
            "sse_ignored_lines": st.ignored_lines,
            "errors": dict(st.errors),
        }
        # The runner writes the manifest again after serve(); the config dict it holds is this
        # one, so the client's own measurements land in manifest.engine.config.client.
        self.info().config["client"] = client
        if saturated:
            log.warning(
                "perfscope's HTTP client was saturated (loop thread at %.0f%% of a core, loop "
                "lag p50 %.2f ms, p99 %.2f ms): timestamps may be late by about that much; "
                "use fewer concurrent streams per client",
                100 * cpu_share,
                1e3 * (lag_p50 or 0.0),
                1e3 * (lag_p99 or 0.0),
            )
        if st.mismatched:
            log.warning(
                "client and server token counts differ on %d of %d requests (client %d, "
                "server %d tokens); the server's counts are used",
                st.mismatched,
                st.compared,
                st.client_tokens,
                st.server_tokens,
            )


def create_openai_engine(uri: str, options: EngineOptions) -> OpenAIEngine:
    """Factory registered for ``openai:``; runs the preflight check unless disabled."""
    cfg = OpenAIConfig.from_engine_options(uri, options)
    tok = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
    engine = OpenAIEngine(uri, cfg, tok)
    if cfg.preflight:
        engine.preflight()
    elif cfg.model is None:
        raise UsageError("give --model NAME (the preflight that would ask the server is off)")
    return engine
