"""Async streaming client for OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``.

Built on aiohttp: at 256 concurrent streams it costs about half the CPU per streamed chunk of
httpx's async client (``benchmarks/openai_client.py`` measures both), and the client's CPU
is what delays timestamps when many streams are open.

Bytes are stamped when they arrive, not when the reading coroutine gets round to them: a
thin wrapper on aiohttp's ``StreamReader.feed_data`` (called from the event loop's socket
callback, before any coroutine runs) records ``(bytes, run-clock ns)`` for the streams this
client reads. The reader splits what ``readany()`` returns back into those arrivals and
feeds the SSE parser piece by piece, so each event gets the time its last byte arrived.
With 128 streams writing at once, a coroutine may run milliseconds after its bytes came in;
the socket callback runs microseconds after.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.streams import StreamReader

from perfscope.profiler.engines.openai.sse import SSEParser

__all__ = ["StreamResult", "build_body", "classify_exception", "stream_request"]


@dataclass
class StreamResult:
    """What came back for one streamed request.

    Attributes:
        t_ns: arrival time (run clock, ns) of each chunk that carried output text.
        texts: per such chunk, its ``(choice index, text)`` pieces.
        cumulative: per such chunk, the running ``usage.completion_tokens`` it carried.
        prompt_tokens / completion_tokens: the server's final usage, when sent.
        usage_per_chunk: the server sent a running usage on token chunks.
        finish_reasons: ``finish_reason`` of each finished choice.
        done: ``data: [DONE]`` was received.
        status: HTTP status (0 when no response).
        error: short text when the request failed, else None.
        events: SSE events parsed; comments / ignored_lines: keep-alives and garbage skipped.
        t_headers_ns: when the response headers arrived.
        t_usage_ns: when the last event with a usage arrived.
    """

    t_ns: list[int] = field(default_factory=list)
    texts: list[list[tuple[int, str]]] = field(default_factory=list)
    cumulative: list[int | None] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_per_chunk: bool = False
    finish_reasons: list[str] = field(default_factory=list)
    done: bool = False
    status: int = 0
    error: str | None = None
    events: int = 0
    comments: int = 0
    ignored_lines: int = 0
    t_headers_ns: int | None = None
    t_usage_ns: int | None = None


def build_body(
    endpoint: str,
    model: str,
    prompt: str | list[int] | list[dict[str, str]],
    max_tokens: int | None,
    *,
    ignore_eos: bool,
    include_usage: bool,
    continuous_usage: bool,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of one streaming request.

    ``prompt`` is text or token ids (completions) or text or a message list (chat).
    ``extra`` fields are merged last and win.
    """
    body: dict[str, Any] = {"model": model, "stream": True}
    if endpoint == "chat":
        if isinstance(prompt, str):
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["messages"] = prompt
    else:
        body["prompt"] = prompt
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if ignore_eos:
        body["ignore_eos"] = True
    if include_usage:
        opts: dict[str, Any] = {"include_usage": True}
        if continuous_usage:
            opts["continuous_usage_stats"] = True
        body["stream_options"] = opts
    if extra:
        body.update(extra)
    return body


def classify_exception(exc: BaseException, timeout_s: float | None) -> str:
    """A short, stable error text for a failed request (what users see in error counts)."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return f"timeout after {timeout_s:g} s" if timeout_s else "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"[:200]
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "connection closed by the server"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "connection reset during the stream"
    if isinstance(exc, ConnectionResetError | aiohttp.ClientOSError):
        return "connection reset"
    return f"{type(exc).__name__}: {exc}"[:200]


def _apply_event(res: StreamResult, payload: str, t: int) -> None:
    """Fold one SSE payload into ``res`` (raises ValueError on a malformed payload)."""
    if payload == "[DONE]":
        res.done = True
        return
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError:
        raise ValueError(f"malformed stream: data is not JSON: {payload[:60]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"malformed stream: data is not a JSON object: {payload[:60]!r}")
    if "error" in obj and not obj.get("choices"):
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise ValueError(f"server error in stream: {str(msg)[:150]}")
    usage = obj.get("usage")
    cum: int | None = None
    if isinstance(usage, dict):
        ct = usage.get("completion_tokens")
        if isinstance(ct, int):
            cum = ct
            res.completion_tokens = ct
            res.t_usage_ns = t
        pt = usage.get("prompt_tokens")
        if isinstance(pt, int):
            res.prompt_tokens = pt
    pieces: list[tuple[int, str]] = []
    choices = obj.get("choices") or ()
    for ch in choices:
        if not isinstance(ch, dict):
            continue
        idx = ch.get("index", 0)
        delta = ch.get("delta")
        if isinstance(delta, dict):  # chat: content, reasoning, tool-call arguments
            text = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            if reasoning:
                text = reasoning + text
            for tc in delta.get("tool_calls") or ():
                fn = tc.get("function") if isinstance(tc, dict) else None
                if isinstance(fn, dict):
                    text += (fn.get("name") or "") + (fn.get("arguments") or "")
        else:
            text = ch.get("text") or ""
        if text:
            pieces.append((int(idx) if isinstance(idx, int) else 0, text))
        fr = ch.get("finish_reason")
        if fr:
            res.finish_reasons.append(str(fr))
    if pieces or (res.usage_per_chunk and cum is not None and choices and cum > _last_cum(res)):
        # A chunk that carries output: text, or (once the server is known to send a running
        # usage on token chunks) a token it counted but did not render, e.g. a special token.
        # A usage on the final chunk alone is not per-chunk usage and adds no chunk.
        res.t_ns.append(t)
        res.texts.append(pieces)
        res.cumulative.append(cum)
        if cum is not None:
            res.usage_per_chunk = True


def _last_cum(res: StreamResult) -> int:
    for c in reversed(res.cumulative):
        if c is not None:
            return c
    return 0


#: id(StreamReader) → (clock, arrivals) for the streams being read. StreamReader has
#: ``__slots__`` and no weakref slot, so the registry is keyed by id and entries are removed
#: when the request ends.
_ARRIVALS: dict[int, tuple[Callable[[], int], deque[tuple[int, int]]]] = {}
_ORIGINAL_FEED = StreamReader.feed_data


def _feed_data_stamped(self: StreamReader, data: bytes, *args: Any, **kwargs: Any) -> Any:
    entry = _ARRIVALS.get(id(self))
    if entry is not None and data:
        entry[1].append((len(data), entry[0]()))
    return _ORIGINAL_FEED(self, data, *args, **kwargs)


def _install_arrival_stamps() -> None:
    if StreamReader.feed_data is not _feed_data_stamped:
        StreamReader.feed_data = _feed_data_stamped  # type: ignore[method-assign]


def _split_by_arrival(
    data: bytes, arrivals: deque[tuple[int, int]], t_read: int
) -> Iterator[tuple[bytes, int]]:
    """``data`` (what one read returned) cut back into the pieces that arrived together,
    each with its arrival time. Bytes fed before the stream was registered come first and
    take the earliest known time."""
    known = sum(n for n, _ in arrivals)
    pos = 0
    head = len(data) - known
    if head > 0:
        yield data[:head], min(t_read, arrivals[0][1]) if arrivals else t_read
        pos = head
    while pos < len(data) and arrivals:
        n, t = arrivals.popleft()
        take = min(n, len(data) - pos)
        if take < n:  # a partial read: the rest of that arrival is still buffered
            arrivals.appendleft((n - take, t))
        yield data[pos : pos + take], t
        pos += take


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    now_ns: Callable[[], int],
    timeout_s: float | None,
    on_sent: Callable[[int], None] | None = None,
) -> StreamResult:
    """POST ``body`` to ``url`` and read the SSE stream to its end; never raises for a failed
    request (the failure is in ``error``)."""
    res = StreamResult()
    parser = SSEParser()
    try:
        async with asyncio.timeout(timeout_s):
            if on_sent is not None:
                on_sent(now_ns())
            async with session.post(url, data=body, headers=headers) as resp:
                res.t_headers_ns = now_ns()
                res.status = resp.status
                if resp.status != 200:
                    text = (await resp.text(errors="replace")).strip().replace("\n", " ")
                    res.error = f"HTTP {resp.status} {resp.reason or ''}".strip() + (
                        f": {text[:160]}" if text else ""
                    )
                    return res
                ctype = resp.headers.get("Content-Type", "")
                if "text/event-stream" not in ctype and "application/json" in ctype:
                    await resp.read()
                    res.error = (
                        f"server did not stream (Content-Type {ctype.split(';')[0]}): "
                        "it ignored stream=true"
                    )
                    return res
                content = resp.content
                arrivals: deque[tuple[int, int]] = deque()
                _install_arrival_stamps()
                _ARRIVALS[id(content)] = (now_ns, arrivals)
                try:
                    while True:
                        data = await content.readany()
                        t_read = now_ns()
                        if not data:
                            break
                        for piece, t in _split_by_arrival(data, arrivals, t_read):
                            for payload in parser.feed(piece):
                                _apply_event(res, payload, t)
                        if res.done:
                            break
                finally:
                    _ARRIVALS.pop(id(content), None)
                if not res.done:
                    for payload in parser.close():
                        _apply_event(res, payload, now_ns())
    except ValueError as exc:
        res.error = str(exc)[:200]
    except Exception as exc:
        res.error = classify_exception(exc, timeout_s)
    res.events, res.comments, res.ignored_lines = (
        parser.events,
        parser.comments,
        parser.ignored_lines,
    )
    if res.error is None and not res.done and not res.finish_reasons:
        res.error = (
            f"truncated stream: ended after {len(res.t_ns)} chunks without a finish_reason "
            "or [DONE]"
        )
    return res
