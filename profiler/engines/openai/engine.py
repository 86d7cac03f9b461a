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
stamps may be late by a noticeable share of the inter-token gap.
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
from perfscope.profiler.engines.openai import client as _client
from perfscope.profiler.engines.openai.client import (
    ReadLimits,
    StreamResult,
    build_body,
    classify_exception,
    read_limits,
    stream_request,
    trace_config,
)
from perfscope.profiler.engines.openai.cost import ClientCost
from perfscope.profiler.engines.openai.kstamp import (
    KernelTransport,
    TransportStats,
    kernel_stamps_available,
)
from perfscope.profiler.engines.openai.stall import RequestSpan, judge_kernel, judge_user
from perfscope.profiler.engines.openai.tokens import TokenCounter, count_tokens, load_tokenizer
from perfscope.profiler.engines.openai.workers import WorkerJobResult, WorkerPool, WorkerSettings
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec

__all__ = ["API_KEY_ENV", "OpenAIConfig", "OpenAIEngine", "is_saturated", "redact_url"]

log = logging.getLogger("perfscope.openai")

#: Environment variables read for the API key, in order.
API_KEY_ENV = ("PERFSCOPE_API_KEY", "OPENAI_API_KEY")

#: The client is called saturated when its stamps may be late (loop-lag p99) by more than
#: this many seconds *and* by more than ``SATURATION_GAP_SHARE`` of the median gap between a
#: request's chunks: lateness matters relative to what is being measured.
SATURATION_LAG_S = 1e-3
SATURATION_GAP_SHARE = 0.1

#: Prompt lengths differ from the server's count beyond this share (and 2 tokens) on the
#: median request: they are not exact.
PROMPT_LEN_TOLERANCE = 0.05

CONNECTION_POLICIES = ("reuse", "new")
#: Prompt tokens every prompt shares (llama.cpp counts the BOS as served from its cache):
#: a request is a prefix-cache hit only with more cached tokens than this.
SHARED_BOS_TOKENS = 1
#: ``--engine-opt transport=``: ``auto`` (kernel stamps for plain http:// on Linux, else
#: aiohttp), ``kernel`` (insist; an error where unavailable), ``aiohttp`` (user-space stamps).
TRANSPORTS = ("auto", "kernel", "aiohttp")

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
        connection: ``reuse`` (keep-alive pool, default) or ``new`` (a new connection per
            request, closed after it).
        workers: event loops in worker processes that share the streams (1: one loop in
            this process); see :mod:`.workers`.
        prompt_salt: varies the text the engine makes up for token-length-only requests;
            None repeats it exactly (the server may serve it from its prompt cache).
        longest_request_tokens: the workload's longest prompt + output, checked against the
            server's ``max_model_len`` at preflight.
        transport: ``kernel`` (chunks stamped with the kernel's receive time, see
            :mod:`.kstamp`) or ``aiohttp`` (stamped in user space); ``auto`` picks ``kernel``
            for plain ``http://`` on Linux where the kernel accepts the socket options.
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
    connection: str = "reuse"
    workers: int = 1
    prompt_salt: int | None = None
    longest_request_tokens: int | None = None
    transport: str = "auto"

    @property
    def kernel_stamps(self) -> bool:
        """Whether streams go through the kernel-stamped transport."""
        if self.transport == "aiohttp" or not self.base_url.startswith("http://"):
            return False
        if self.limits.follow_redirects:  # only the aiohttp client follows redirects
            return False
        return kernel_stamps_available()

    #: SSE line cap, body cap, redirects (``sse_line_cap``, ``body_cap``, ``follow_redirects``).
    limits: ReadLimits = field(default_factory=ReadLimits)

    @classmethod
    def from_engine_options(cls, uri: str, options: EngineOptions) -> OpenAIConfig:
        """Read the URI and ``options.extra`` (``model``, ``api_key``, ``endpoint``,
        ``extra_body`` (JSON object), ``timeout`` (s), ``max_tokens``, ``ignore_eos``,
        ``tokenizer``, ``preflight``, ``continuous_usage``, ``connection`` (reuse|new),
        ``prompt_salt`` (int or ``none``))."""
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
            n_choices = extra_body.get("n", 1)
            if n_choices != 1 or isinstance(n_choices, bool):
                # Each request's token times are one choice's; a server honouring n streams
                # several, which per-request records cannot hold: refuse before any request.
                raise UsageError(
                    f"--extra-body n={json.dumps(n_choices)}: only one choice per request is "
                    "measured; remove n (or set it to 1) and raise --requests instead"
                )
        try:
            timeout = float(x["timeout"]) if x.get("timeout") else 600.0
            max_tokens = int(x["max_tokens"]) if x.get("max_tokens") else None
        except ValueError as exc:
            raise UsageError(f"openai engine: bad --timeout/--max-tokens ({exc})") from None
        if timeout <= 0:
            raise UsageError("--timeout must be a positive number of seconds")
        if max_tokens is not None and max_tokens < 1:
            raise UsageError("--max-tokens must be at least 1")
        connection = x.get("connection", "reuse").strip().lower()
        if connection not in CONNECTION_POLICIES:
            raise UsageError(
                f"--connection {connection!r}: use 'reuse' (keep-alive pool) or 'new' "
                "(a new connection per request)"
            )
        try:
            workers = int(x.get("workers") or 1)
        except ValueError:
            raise UsageError(f"workers {x.get('workers')!r}: give a whole number") from None
        if not 1 <= workers <= 64:
            raise UsageError(f"workers must be 1-64, got {workers}")
        transport = (x.get("transport") or "auto").strip().lower()
        if transport not in TRANSPORTS:
            raise UsageError(
                f"transport {transport!r}: use 'auto', 'kernel' (kernel receive stamps, plain "
                "http:// on Linux) or 'aiohttp' (user-space stamps)"
            )
        if transport == "kernel" and not (url.startswith("http://") and kernel_stamps_available()):
            raise UsageError(
                "transport=kernel needs a plain http:// URL on Linux with SO_TIMESTAMPING; "
                "use transport=auto to fall back to user-space stamps"
            )
        salt_text = (x.get("prompt_salt") or "none").strip().lower()
        try:
            salt = None if salt_text in ("", "none") else int(salt_text)
        except ValueError:
            raise UsageError(f"prompt_salt {salt_text!r}: give an integer or 'none'") from None
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
            connection=connection,
            workers=workers,
            prompt_salt=salt,
            longest_request_tokens=options.longest_request_tokens,
            transport=transport,
            limits=read_limits(x),
        )

    @property
    def url(self) -> str:
        """The full endpoint URL."""
        return self.base_url + ("/chat/completions" if self.endpoint == "chat" else "/completions")

    @property
    def root_url(self) -> str:
        """The server root (the API base without its trailing ``/v1``)."""
        return self.base_url.removesuffix("/v1")


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
        self.retried = 0
        self.retry_reasons: Counter[str] = Counter()
        self.retry_failed = 0
        self.new_connections = 0
        self.connect_ns: list[int] = []
        self.queue_ns: list[int] = []
        self.send_path_ns: list[int] = []
        self.gap_ns: list[float] = []
        self.served_models: Counter[str] = Counter()
        self.finish_reasons: Counter[str] = Counter()
        self.truncated = 0
        self.truncated_examples: list[tuple[int, int, int]] = []
        self.cache_reported = 0
        self.cache_hits = 0
        self.cached_tokens = 0
        self.cache_prompt_tokens = 0
        self.prompt_asked: list[int] = []
        self.prompt_server: list[int] = []
        self.reconciled = 0
        self.unexplained = 0
        self.spans: list[RequestSpan] = []
        self.lag_events: list[tuple[int, int]] = []
        self.kernel_stamped = 0


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
        self.stats = _Stats()
        self._preflight_warnings: list[str] = []
        self._pool: WorkerPool | None = None
        self._cost = ClientCost()
        self._transport_stats: list[TransportStats] = []
        self._kernel: tuple[KernelTransport, KernelTransport] | None = None

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
        async with aiohttp.ClientSession(
            timeout=timeout, trace_configs=[trace_config()]
        ) as session:
            models = await self._list_models(session, shown)
            asked = cfg.model
            if cfg.model is None:
                if not models:
                    raise UsageError(
                        f"{shown}/models lists no model; give the model name with --model NAME"
                    )
                cfg.model = next(iter(models))
            version = await self._server_version(session)
            tokenize = await self._probe_tokenize(session)
            for _ in range(len(_OPTIONAL_FIELDS) + 1):
                body = self._body("Hello", 2)
                res = await stream_request(
                    session,
                    cfg.url,
                    json.dumps(body).encode(),
                    self._headers,
                    time.perf_counter_ns,
                    cfg.timeout_s,
                    cfg.limits,
                )
                if res.status in (400, 422) and res.error and self._drop_rejected(res.error):
                    continue
                break
        self._check_preflight(res, shown, models)
        max_len = models.get(cfg.model) if cfg.model else None
        self.server_info = {
            "usage": res.completion_tokens is not None,
            "usage_per_chunk": res.usage_per_chunk,
            "done_marker": res.done,
            "models": sorted(models),
            "max_model_len": max_len,
            "version": version,
            "tokenize": tokenize,
            "served_model": res.model,
        }
        self._check_served_model(asked, res.model, models, shown)
        longest = cfg.longest_request_tokens
        if max_len is not None and longest is not None and longest > max_len:
            raise UsageError(
                f"the longest request needs {longest} tokens (prompt + output) but "
                f"{cfg.model!r} on {shown} holds {max_len} (max_model_len in /v1/models); "
                "lower --prompt-len / --output-len (or --max-tokens)"
            )

    async def _list_models(
        self, session: aiohttp.ClientSession, shown: str
    ) -> dict[str, int | None]:
        """Served model names → their context length (``max_model_len``) when listed."""
        try:
            async with session.get(self.cfg.base_url + "/models", headers=self._headers) as r:
                data = await r.json(content_type=None) if r.status == 200 else None
        except aiohttp.ClientConnectorError as exc:
            raise UsageError(
                f"cannot reach {shown}: {classify_exception(exc, None)}; is the server running "
                "and is the URL its API base (e.g. openai:http://127.0.0.1:8000/v1)?"
            ) from None
        except Exception:
            data = None
        out: dict[str, int | None] = {}
        rows = data.get("data") if isinstance(data, dict) else None
        for m in rows if isinstance(rows, list) else ():
            if isinstance(m, dict) and isinstance(m.get("id"), str):
                n = m.get("max_model_len")
                meta = m.get("meta")
                if not isinstance(n, int) and isinstance(meta, dict):
                    n = meta.get("n_ctx") if isinstance(meta.get("n_ctx"), int) else None
                out[m["id"]] = n if isinstance(n, int) and n > 0 else None
        return out

    async def _server_version(self, session: aiohttp.ClientSession) -> str | None:
        """The server's version where it says it (``GET /version``: vLLM, SGLang), else the
        ``Server`` header of its answer (llama.cpp says ``llama.cpp``)."""
        server_header = None
        try:
            async with session.get(self.cfg.root_url + "/version", headers=self._headers) as r:
                server_header = r.headers.get("Server")
                if r.status == 200:
                    data = await r.json(content_type=None)
                    if isinstance(data, dict) and data.get("version"):
                        return str(data["version"])[:80]
        except Exception:
            return None
        return server_header[:80] if server_header else None

    async def _probe_tokenize(self, session: aiohttp.ClientSession) -> str | None:
        """Which ``/tokenize`` the server has: ``prompt`` (vLLM, SGLang), ``content``
        (llama.cpp) or None."""
        for key in ("prompt", "content"):
            body = {"model": self.cfg.model, key: "Hello world"}
            try:
                async with session.post(
                    self.cfg.root_url + "/tokenize", json=body, headers=self._headers
                ) as r:
                    if r.status != 200:
                        continue
                    data = await r.json(content_type=None)
            except Exception:
                return None
            if isinstance(data, dict) and isinstance(data.get("tokens"), list):
                return key
        return None

    def _check_served_model(
        self, asked: str | None, served: str | None, models: dict[str, int | None], shown: str
    ) -> None:
        """Refuse a model the server neither lists nor answers as; warn when it answers as
        another model (llama.cpp ignores ``model`` and echoes its own alias)."""
        if asked is None or served is None or served == asked:
            return
        if models and asked not in models:
            raise UsageError(
                f"--model {asked!r} is not served by {shown}: it lists "
                f"{', '.join(sorted(models))} and answered as {served!r}; give --model {served}"
            )
        msg = (
            f"the server answered as model {served!r} although {asked!r} was requested; the "
            "run measures whatever it serves"
        )
        self._preflight_warnings.append(msg)
        log.warning(msg)

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

    def _check_preflight(
        self, res: StreamResult, shown: str, models: dict[str, int | None] | None = None
    ) -> None:
        url = redact_url(self.cfg.url)
        if res.error is None:
            return
        err = res.error
        if res.status == 0 and err.startswith("cannot connect"):
            raise UsageError(
                f"cannot reach {shown} ({err}); is the server running and the URL right "
                "(e.g. openai:http://127.0.0.1:8000/v1)?"
            )
        said = err.partition(": ")[2]
        low = said.lower()
        if (
            res.status in (400, 404)
            and "model" in low
            and ("not exist" in low or "not found" in low or "unknown" in low)
        ):
            listed = f" (it lists {', '.join(sorted(models))})" if models else ""
            raise UsageError(
                f"{shown} does not serve model {self.cfg.model!r}{listed}: the server said "
                f"{said!r}; give --model NAME"
            )
        if res.status == 404:
            raise UsageError(
                f"{url} answered HTTP 404: no such endpoint; the engine URL must be the API "
                "base that ends in /v1 (e.g. openai:http://127.0.0.1:8000/v1), or the server "
                f"has no --endpoint {self.cfg.endpoint}"
                + (f" (server said: {said})" if said else "")
            )
        if res.status in (401, 403):
            raise UsageError(
                f"{url} refused the request (HTTP {res.status}): give --api-key or set "
                f"{API_KEY_ENV[1]}" + (f" (server said: {said})" if said else "")
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
        st = self.stats
        warnings: list[str] = list(self._preflight_warnings)
        lag = np.asarray(st.lag_ns, dtype=float) * 1e-9
        cpu_share = cpu_s / wall_s if wall_s > 0 else 0.0
        lag_p50 = float(np.percentile(lag, 50)) if lag.size else None
        lag_p99 = float(np.percentile(lag, 99)) if lag.size else None
        gap = float(np.median(st.gap_ns)) * 1e-9 if st.gap_ns else None
        delays = np.asarray(_client.STAMP_DELAYS_NS, dtype=float) * 1e-9
        delay_p50 = float(np.percentile(delays, 50)) if delays.size else None
        delay_p99 = float(np.percentile(delays, 99)) if delays.size else None
        # The client's own lateness: its loop's work between a chunk's arrival and its stamp.
        # (The lag probe also counts waits for a CPU, which fewer streams would not cure.)
        late = delay_p99 if delay_p99 is not None else (lag_p99 or 0.0)
        kernel_clock = st.kernel_stamped > 0
        # Kernel stamps do not wait for the loop: its lateness is not in them.
        saturated = is_saturated(late, gap) and not kernel_clock
        if kernel_clock:
            ts = TransportStats()
            for t in self._transport_stats:
                ts.merge(t)
            stall = judge_kernel(
                st.spans, ts.loop_delay_ns, ts.reader_delay_ns, ts.merged_reads, ts.reads
            )
            stall.evidence["kernel_send_stamps"] = ts.kernel_send_stamps
            stall.evidence["user_send_stamps"] = ts.user_send_stamps
            stall.evidence["per_segment_reads"] = ts.per_segment_reads
            stall.evidence["tap_gaps"] = ts.tap_gaps
        else:
            stall = judge_user(st.spans, st.lag_events)
            if lag.size:  # the probe's own distribution, not just the events over 1 ms
                stall.p50_s, stall.p99_s = lag_p50 or 0.0, lag_p99 or 0.0
        n_spans = len(st.spans)
        stamp_clock = (
            "kernel"
            if kernel_clock and st.kernel_stamped == n_spans
            else "mixed"
            if kernel_clock
            else "user"
        )
        client: dict[str, Any] = {
            "loop_lag_s": {
                "samples": int(lag.size),
                "p50": lag_p50,
                "p99": lag_p99,
                "max": float(lag.max()) if lag.size else None,
            },
            "stamp_delay_s": {
                "samples": int(delays.size),
                "p50": delay_p50,
                "p99": delay_p99,
                "max": float(delays.max()) if delays.size else None,
            },
            "chunk_gap_s": gap,
            "stamp_lateness_share_of_gap": late / gap if gap else None,
            "loop_cpu_share": cpu_share,
            "stamp_clock": stamp_clock,
            "stall": stall.to_dict(),
            "cpu_s": self._cost.cpu_s,
            "peak_rss_bytes": self._cost.peak_rss_bytes,
            "workers": self.cfg.workers if self._pool is not None else 1,
            "saturated": saturated,
            "client_queue_s": _pcts(st.queue_ns),
            "send_path_s": _pcts(st.send_path_ns),
            "connect_s": _pcts(st.connect_ns),
            "new_connections": st.new_connections,
            "connection": self.cfg.connection,
            "retried": st.retried,
            "retry_reasons": dict(st.retry_reasons),
            "retry_failed": st.retry_failed,
            "chunks": st.chunks,
            "multi_token_chunks": st.multi_token_chunks,
            "token_count_source": dict(st.token_source),
            "token_count_mismatch": {
                "compared": st.compared,
                "mismatched": st.mismatched,
                "beyond_round_trip": st.unexplained,
                "reconciled_to_server": st.reconciled,
                "client_tokens": st.client_tokens,
                "server_tokens": st.server_tokens,
                "max_abs": st.max_abs_mismatch,
            },
            "served_models": dict(st.served_models),
            "finish_reasons": dict(st.finish_reasons),
            "truncated": st.truncated,
            "prompt_cache": {
                "requests_reporting": st.cache_reported,
                "requests_hit": st.cache_hits,
                "cached_tokens": st.cached_tokens,
                "prompt_tokens": st.cache_prompt_tokens,
                "share": st.cached_tokens / st.cache_prompt_tokens
                if st.cache_prompt_tokens
                else None,
            },
            "sse_comments": st.comments,
            "sse_ignored_lines": st.ignored_lines,
            "errors": dict(st.errors),
        }
        if saturated:
            warnings.append(
                f"perfscope's HTTP client may stamp chunks late by up to {1e3 * late:.2f} ms "
                f"(its own work before a stamp, p99; p50 {1e3 * (delay_p50 or 0.0):.2f} ms), "
                + (f"{late / gap:.0%} of the {1e3 * gap:.2f} ms gap between chunks" if gap else "")
                + f"; loop thread at {100 * cpu_share:.0f}% of a core: use fewer concurrent "
                "streams per client"
            )
        stall_warning = stall.warning()
        if stall_warning is not None:
            warnings.append(stall_warning)
        if st.retried:
            warnings.append(
                f"{st.retried} requests failed before reaching the server (pooled connection "
                f"closed by the server, or the write failed) and were retried once on a new "
                f"connection ({st.retry_failed} failed again); --connection new avoids reuse"
            )
        asked = self.cfg.model
        other = {m: n for m, n in st.served_models.items() if m != asked}
        if asked and other:
            warnings.append(
                f"{sum(other.values())} responses named model {', '.join(sorted(other))} "
                f"although {asked!r} was requested"
            )
        if st.truncated:
            ex = ", ".join(f"#{r}: {got} of {want}" for r, got, want in st.truncated_examples)
            warnings.append(
                f"{st.truncated} requests were cut short by the server (finish_reason "
                f"'length' before the tokens asked for; {ex}): they count as completed, and "
                "their TPOT and SLO checks use the tokens they delivered"
            )
        # The right tokenizer's round trip differs on a few requests (random-weight output
        # decodes and re-encodes differently); another tokenizer differs on most.
        if st.unexplained and st.unexplained * 2 > st.compared:
            warnings.append(
                f"client and server token counts differ beyond the tokenizer round trip on "
                f"{st.unexplained} of {st.compared} requests (client {st.client_tokens}, "
                f"server {st.server_tokens} tokens): is --tokenizer the server's tokenizer? "
                "The server's counts are used"
            )
        if st.prompt_asked:
            asked_a = np.asarray(st.prompt_asked, dtype=float)
            got = np.asarray(st.prompt_server, dtype=float)
            off = float(np.median(np.abs(got - asked_a)))
            # Judged with the workload in the summary (only generated prompts have a target).
            client["prompt_lengths"] = {
                "asked_min": int(asked_a.min()),
                "asked_max": int(asked_a.max()),
                "server_min": int(got.min()),
                "server_max": int(got.max()),
                "median_abs_diff": off,
                "inexact": off > max(2.0, PROMPT_LEN_TOLERANCE * float(np.median(asked_a))),
            }
        client["warnings"] = warnings
        # The runner writes the manifest again after serve(); the config dict it holds is this
        # one, so the client's own measurements land in manifest.engine.config.client.
        self.info().config["client"] = client
        for w in warnings[len(self._preflight_warnings) :]:
            log.warning("%s", w)


def is_saturated(late_s: float, gap_s: float | None) -> bool:
    """Whether stamps late by ``late_s`` (event-loop lag p99) distort chunks ``gap_s`` apart
    (median gap between a request's chunks; None: unknown): late by more than
    ``SATURATION_LAG_S`` and by more than ``SATURATION_GAP_SHARE`` of the gap. A 1 ms lag is
    noise against 50 ms gaps and a third of a 3 ms gap; stream counts say nothing."""
    return late_s > SATURATION_LAG_S and (gap_s is None or late_s > SATURATION_GAP_SHARE * gap_s)


def _pcts(values_ns: list[int]) -> dict[str, float | None]:
    """p50 / p99 / max in seconds of a list of ns durations."""
    if not values_ns:
        return {"p50": None, "p99": None, "max": None}
    a = np.asarray(values_ns, dtype=float) * 1e-9
    return {
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


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
