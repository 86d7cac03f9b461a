"""``python:module:attr`` — profile any Python callable or generator that yields tokens.

The callable is called once per request. It is given whichever of these keyword arguments
its signature accepts: ``request`` (the :class:`RequestSpec`), ``prompt`` (text or ``None``),
``prompt_tokens`` (int), ``prompt_token_ids`` (tuple or ``None``), ``max_tokens`` /
``max_output_tokens`` (int), ``request_id`` (int). A single positional parameter with
another name receives the :class:`RequestSpec`.

It returns (or is) an iterable — a generator, an async generator or a list — of chunks,
each stamped with the time perfscope receives it. A chunk counts as:

- an ``int``: that many tokens;
- a ``str``: one token (a detokenised piece);
- a list or tuple (token ids or strings): ``len(chunk)`` tokens;
- a ``dict`` with ``"n_tokens"`` or ``"tokens"``: that count.

A function that returns an ``int`` without streaming is one chunk of that many tokens.

Counts are checked as they arrive: a negative, non-integer (``2.5``, ``"3"`` as a count) or
implausible (more than :data:`MAX_CHUNK_TOKENS` in one chunk) count fails the request with
an error that names the value; a zero-token chunk in a stream is skipped, but a callable
that returns 0 (no stream) fails the request ("no tokens"). ``--timeout`` applies: a call
that hangs fails its request after that many seconds and the run goes on.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import numbers
import operator
import os
import sys
from collections.abc import AsyncIterable, Callable, Iterable
from typing import Any, SupportsIndex, cast

from perfscope.errors import EngineNotFoundError, UsageError
from perfscope.profiler.engines.base import (
    EngineInfo,
    EngineOptions,
    PerRequestEngine,
    register_engine,
)
from perfscope.profiler.recorder import RequestHandle
from perfscope.profiler.records import RequestSpec

__all__ = [
    "MAX_CHUNK_TOKENS",
    "BadChunkError",
    "PythonCallableEngine",
    "chunk_size",
    "load_callable",
]

#: More tokens than this in one chunk is a counting bug, not a measurement.
MAX_CHUNK_TOKENS = 10_000_000


class BadChunkError(ValueError):
    """A chunk whose token count cannot be right (fails its request, not the run)."""


_KWARGS = (
    "request",
    "prompt",
    "prompt_tokens",
    "prompt_token_ids",
    "max_tokens",
    "max_output_tokens",
    "request_id",
)


def load_callable(target: str) -> Callable[..., Any]:
    """Import ``module:attr`` (``attr`` may be dotted) and return it.

    The current directory is importable, as with ``python -m``.
    """
    if ":" not in target:
        raise EngineNotFoundError(
            f"python engine {target!r}: expected 'python:MODULE:ATTR', "
            "e.g. 'python:myengine:generate'"
        )
    module_name, _, attr = target.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise EngineNotFoundError(
            f"python engine: cannot import module {module_name!r} ({exc}); "
            "run from the folder that holds it or install it"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EngineNotFoundError(
                f"python engine: module {module_name!r} has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise EngineNotFoundError(f"python engine: {target!r} is not callable")
    return obj  # type: ignore[no-any-return]


def _count(value: object, what: str) -> int:
    """``value`` as a plausible token count, else BadChunkError naming it."""
    if isinstance(value, bool):
        raise BadChunkError(f"{what} is a bool ({value!r}), not a token count")
    try:
        n = operator.index(cast(SupportsIndex, value))  # int, numpy ints; not floats, str
    except TypeError:
        raise BadChunkError(
            f"{what} is {type(value).__name__} ({value!r:.40}), not an integer token count"
        ) from None
    if n < 0:
        raise BadChunkError(f"{what} is negative ({n} tokens)")
    if n > MAX_CHUNK_TOKENS:
        raise BadChunkError(f"{what} is implausible ({n:,} tokens > {MAX_CHUNK_TOKENS:,})")
    return n


def chunk_size(chunk: object) -> int:
    """Token count of one yielded chunk (rules in the module docstring)."""
    if type(chunk) is int and 0 <= chunk <= MAX_CHUNK_TOKENS:  # the per-chunk fast path
        return chunk
    if isinstance(chunk, bool):
        raise BadChunkError("a chunk cannot be a bool")
    if isinstance(chunk, int):
        return _count(chunk, "a chunk's token count")
    if isinstance(chunk, str | bytes):
        return 1
    if isinstance(chunk, dict):
        if "n_tokens" in chunk:
            return _count(chunk["n_tokens"], "a chunk's 'n_tokens'")
        if "tokens" in chunk:
            toks = chunk["tokens"]
            if isinstance(toks, list | tuple | str):
                return len(toks)
            return _count(toks, "a chunk's 'tokens'")
        raise BadChunkError("a dict chunk needs 'n_tokens' or 'tokens'")
    if isinstance(chunk, list | tuple):
        return len(chunk)
    if hasattr(chunk, "__index__") or isinstance(chunk, numbers.Number):
        return _count(chunk, "a chunk's token count")
    raise BadChunkError(f"cannot count tokens in a chunk of type {type(chunk).__name__}")


class PythonCallableEngine(PerRequestEngine):
    """Calls a user function per request and records each chunk it yields."""

    def __init__(self, uri: str, fn: Callable[..., Any]) -> None:
        self.uri = uri
        self.fn = fn
        self._call = _binder(fn)

    def info(self) -> EngineInfo:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return EngineInfo(
            uri=self.uri,
            kind="python",
            device=None,
            config={"callable": f"{self.fn.__module__}.{name}"},
        )

    def generate(self, spec: RequestSpec, handle: RequestHandle) -> None:
        result = self._call(spec)
        if isinstance(result, int) and not isinstance(result, bool):
            n = _count(result, "the returned token count")
            if n == 0:
                raise BadChunkError("the callable returned 0 tokens")
            handle.tokens(n)
        elif isinstance(result, AsyncIterable):
            asyncio.run(_consume_async(result, handle))
        elif isinstance(result, Iterable) and not isinstance(result, str | bytes):
            for chunk in result:
                n = chunk_size(chunk)
                if n:
                    handle.tokens(n)
        else:
            raise TypeError(
                f"the engine callable returned {type(result).__name__}; it must yield "
                "chunks (ints, strings or lists) or return a token count"
            )


async def _consume_async(agen: AsyncIterable[object], handle: RequestHandle) -> None:
    async for chunk in agen:
        n = chunk_size(chunk)
        if n:
            handle.tokens(n)


def _binder(fn: Callable[..., Any]) -> Callable[[RequestSpec], Any]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return lambda spec: fn(spec)
    names = [n for n in params if n in _KWARGS]
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if has_var_kw:
        names = list(_KWARGS)
    if not names:
        positional = [
            p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(positional) == 1:
            return lambda spec: fn(spec)
        if not positional:
            return lambda spec: fn()
        raise UsageError(
            f"python engine: cannot call {getattr(fn, '__name__', fn)!r}: name its parameters "
            f"from {', '.join(_KWARGS)}"
        )

    def call(spec: RequestSpec) -> Any:
        values = {
            "request": spec,
            "prompt": spec.prompt,
            "prompt_tokens": spec.prompt_tokens,
            "prompt_token_ids": spec.prompt_token_ids,
            "max_tokens": spec.max_output_tokens,
            "max_output_tokens": spec.max_output_tokens,
            "request_id": spec.request_id,
        }
        return fn(**{n: values[n] for n in names})

    return call


@register_engine("python")
def _create(uri: str, options: EngineOptions) -> PythonCallableEngine:
    target = uri.split(":", 1)[1] if ":" in uri else ""
    engine = PythonCallableEngine(uri, load_callable(target))
    engine.request_timeout_s = options.request_timeout_s
    return engine
