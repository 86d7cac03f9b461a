"""The checks of an OpenAI-compatible server before a run: :class:`Preflight`.

Before the first measured request the engine asks the server what it serves and sends it
one tiny streamed request (2 tokens, prompt ``Hello``), so that a wrong URL, model, key or
endpoint is a ``UsageError`` saying what to fix rather than a run of failed requests. On the
way it learns:

- the model name (``GET /models``) when none was given, and each model's context length
  (``max_model_len``, or llama.cpp's ``meta.n_ctx``; tokens), against which the workload's
  longest request (prompt + output tokens) is checked;
- the server's version (``GET /version``, else its ``Server`` header) and which
  ``/tokenize`` it has;
- which optional body fields it accepts (``ignore_eos``, ``stream_options``,
  ``continuous_usage_stats``): one named in a 400/422 answer is dropped and the request
  sent again;
- whether it sends usage (and per chunk), the ``[DONE]`` marker, and the model it answers as.

What it learns becomes ``engine.config.server`` in the manifest; a warning it raises goes
first in ``engine.config.client.warnings``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import aiohttp

from perfscope.errors import UsageError
from perfscope.profiler.engines.openai.client import (
    StreamResult,
    classify_exception,
    stream_request,
    trace_config,
)
from perfscope.profiler.engines.openai.config import (
    API_KEY_ENV,
    OpenAIConfig,
    redact_url,
    request_body,
)

__all__ = ["Preflight"]

log = logging.getLogger("perfscope.openai")

#: Body fields beyond the OpenAI API that the engine sends while the server accepts them.
_OPTIONAL_FIELDS = ("ignore_eos", "continuous_usage_stats", "stream_options")


class Preflight:
    """One server's checks before a run (see the module docstring).

    Attributes:
        cfg: the engine's options; ``cfg.model`` is filled in from ``GET /models`` when None.
        headers: the request headers (content type, bearer token).
        supported: optional field name → still sent; fields the server rejects are set False
            (the engine's own mapping, changed in place).
        warnings: where a warning is appended (the engine's preflight warnings).
        server_info: what the server said (``engine.config.server``); None until the test
            request succeeded.
    """

    def __init__(
        self,
        cfg: OpenAIConfig,
        headers: dict[str, str],
        supported: dict[str, bool],
        warnings: list[str],
    ) -> None:
        self.cfg = cfg
        self.headers = headers
        self.supported = supported
        self.warnings = warnings
        self.server_info: dict[str, Any] | None = None

    async def run(self) -> None:
        """Check the server; raise UsageError with what to fix."""
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
                body = request_body(cfg, self.supported, "Hello", 2)
                res = await stream_request(
                    session,
                    cfg.url,
                    json.dumps(body).encode(),
                    self.headers,
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
            async with session.get(self.cfg.base_url + "/models", headers=self.headers) as r:
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
            async with session.get(self.cfg.root_url + "/version", headers=self.headers) as r:
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
                    self.cfg.root_url + "/tokenize", json=body, headers=self.headers
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
        self.warnings.append(msg)
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
