"""Options of the ``openai:`` engine: :class:`OpenAIConfig`, read from the engine URI and
``EngineOptions.extra`` (the CLI's ``--engine-opt``/flags), and the request body they ask for.

Everything here is checked before any request is sent: a bad value is a ``UsageError`` naming
the option and what to give instead. Times are seconds (``timeout_s``), lengths tokens
(``max_tokens``, ``longest_request_tokens``). The API key is read from the options or the
environment (:data:`API_KEY_ENV`) and never stored in the run; :func:`redact_url` takes a
``user:password@`` part out of any URL that is shown or recorded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from perfscope.errors import UsageError
from perfscope.profiler.engines.base import EngineOptions
from perfscope.profiler.engines.openai.client import ReadLimits, build_body, read_limits
from perfscope.profiler.engines.openai.kstamp import kernel_stamps_available

__all__ = [
    "API_KEY_ENV",
    "CONNECTION_POLICIES",
    "TRANSPORTS",
    "OpenAIConfig",
    "redact_url",
    "request_body",
]

#: Environment variables read for the API key, in order.
API_KEY_ENV = ("PERFSCOPE_API_KEY", "OPENAI_API_KEY")

#: ``--connection``: ``reuse`` (a keep-alive pool) or ``new`` (a new connection per request,
#: closed after it).
CONNECTION_POLICIES = ("reuse", "new")
#: ``--engine-opt transport=``: ``auto`` (kernel stamps for plain http:// on Linux, else
#: aiohttp), ``kernel`` (insist; an error where unavailable), ``aiohttp`` (user-space stamps).
TRANSPORTS = ("auto", "kernel", "aiohttp")


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


def request_body(
    cfg: OpenAIConfig, supported: Mapping[str, bool], prompt: str | list[int], max_tokens: int
) -> dict[str, Any]:
    """The JSON body of one request for ``prompt``: ``cfg.max_tokens`` (else ``max_tokens``)
    tokens asked for, with the optional fields ``supported`` still marks as accepted
    (``ignore_eos``, ``stream_options``, ``continuous_usage_stats``)."""
    return build_body(
        cfg.endpoint,
        cfg.model or "",
        prompt,
        cfg.max_tokens or max_tokens,
        ignore_eos=supported["ignore_eos"],
        include_usage=supported["stream_options"],
        continuous_usage=supported["continuous_usage_stats"],
        extra=cfg.extra_body,
    )
