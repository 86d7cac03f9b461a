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
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.streams import StreamReader

from perfscope.profiler.engines.openai.sse import DEFAULT_MAX_LINE_BYTES, SSEParser

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_SERVER_COUNT",
    "Candidate",
    "ReadLimits",
    "RequestTrace",
    "StreamResult",
    "build_body",
    "classify_exception",
    "error_text",
    "install_select_stamps",
    "read_limits",
    "stream_request",
    "trace_config",
]


#: Most bytes read of an error body or a non-streamed JSON body (the rest is not read:
#: a 500 MB error page once took 1.3 GB of memory).
DEFAULT_MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class ReadLimits:
    """What one request may read and follow.

    Attributes:
        max_line_bytes: longest SSE line or event (``--engine-opt sse_line_cap=BYTES``).
        max_body_bytes: most bytes read of an error or non-streamed body
            (``--engine-opt body_cap=BYTES``).
        follow_redirects: follow HTTP redirects (``--engine-opt follow_redirects=1``);
            off, a redirect fails the request naming its target, since the timings would
            be of another server than the one named.
    """

    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    follow_redirects: bool = False


def read_limits(options: dict[str, str]) -> ReadLimits:
    """:class:`ReadLimits` from engine options ``sse_line_cap``, ``body_cap`` (bytes, at
    least 1024) and ``follow_redirects`` (1/true/yes); UsageError naming a bad value."""
    from perfscope.errors import UsageError

    def size(key: str, default: int) -> int:
        text = (options.get(key) or "").strip()
        if not text:
            return default
        try:
            n = int(text)
        except ValueError:
            raise UsageError(f"{key} {text!r}: give a number of bytes, e.g. {default}") from None
        if n < 1024:
            raise UsageError(f"{key} must be at least 1024 bytes, got {n}")
        return n

    follow = (options.get("follow_redirects") or "").strip().lower() in ("1", "true", "yes", "on")
    return ReadLimits(
        max_line_bytes=size("sse_line_cap", DEFAULT_MAX_LINE_BYTES),
        max_body_bytes=size("body_cap", DEFAULT_MAX_BODY_BYTES),
        follow_redirects=follow,
    )


@dataclass
class Candidate:
    """One SSE event that had a non-empty ``choices`` list (a chunk that may carry output).

    Attributes:
        t_ns: arrival time (run clock, ns) of the event's last byte.
        pieces: its ``(choice index, text)`` pieces with non-empty text.
        cum: the running ``usage.completion_tokens`` it carried, or None.
        finishing: it carried a ``finish_reason``.
    """

    t_ns: int
    pieces: list[tuple[int, str]]
    cum: int | None
    finishing: bool


@dataclass
class StreamResult:
    """What came back for one streamed request.

    The arrivals (``t_ns``, ``texts``, ``cumulative``) are filled by :meth:`settle` from the
    candidates once the stream has ended: a chunk is an arrival when it carried text, or when
    the server sends a running usage per chunk and the chunk raised ``completion_tokens`` (a
    token that rendered no text yet: a partial UTF-8 sequence, a special token).

    Attributes:
        candidates: every event with a non-empty ``choices`` list, in order.
        t_ns: arrival time (run clock, ns) of each arrival.
        texts: per arrival, its ``(choice index, text)`` pieces (may be empty).
        cumulative: per arrival, the running ``usage.completion_tokens`` it carried.
        prompt_tokens / completion_tokens: the server's final usage, when sent.
        cached_tokens: prompt tokens the server served from its prefix cache, when it says
            (``usage.prompt_tokens_details.cached_tokens``, llama.cpp ``timings.cache_n``).
        usage_per_chunk: the server sent a running usage on token chunks.
        finish_reasons: ``finish_reason`` of each finished choice.
        model: the ``model`` the server named in its chunks (None if it named none).
        done: ``data: [DONE]`` was received.
        status: HTTP status (0 when no response).
        error: short text when the request failed, else None.
        retryable: the request failed before any of it can have reached the server (the
            write failed, or a reused pooled connection was found dead before any response
            byte); only such a failure may be retried.
        events: SSE events parsed; comments / ignored_lines: keep-alives and garbage skipped.
        t_sent_ns: when the request's last byte was handed to the socket (run clock, ns).
        connect_ns: time spent opening a new TCP connection (None: a pooled one was reused).
        reused: the request went out on a pooled (kept-alive) connection.
        t_headers_ns: when the client read the response headers.
        t_usage_ns: when the last event with a usage arrived.
        kernel_stamped: the arrival times are the kernel's receive stamps (:mod:`.kstamp`),
            not user-space read times.
        stall_ns: the longest a read of this stream waited between the kernel's receive
            stamp and the event loop's processing (kernel-stamped streams only; ns).
        final_url: the URL that answered, when a redirect was followed (else None).
    """

    candidates: list[Candidate] = field(default_factory=list)
    t_ns: list[int] = field(default_factory=list)
    texts: list[list[tuple[int, str]]] = field(default_factory=list)
    cumulative: list[int | None] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    usage_per_chunk: bool = False
    finish_reasons: list[str] = field(default_factory=list)
    model: str | None = None
    done: bool = False
    status: int = 0
    error: str | None = None
    retryable: bool = False
    events: int = 0
    comments: int = 0
    ignored_lines: int = 0
    t_sent_ns: int | None = None
    connect_ns: int | None = None
    reused: bool = False
    t_headers_ns: int | None = None
    t_usage_ns: int | None = None
    kernel_stamped: bool = False
    stall_ns: int | None = None
    final_url: str | None = None

    def settle(self) -> None:
        """Decide which candidates are token arrivals (see the class docstring)."""
        cands = self.candidates
        with_cum = [c for c in cands if c.cum is not None]
        # Per-chunk usage: a usage on a chunk that also carried text, or on several chunks.
        # A usage on the finishing, text-less chunk alone (llama.cpp) is a final usage.
        per_chunk = len(with_cum) >= 2 or any(c.pieces for c in with_cum)
        self.usage_per_chunk = per_chunk
        self.t_ns, self.texts, self.cumulative = [], [], []
        prev = 0
        for c in cands:
            grew = per_chunk and c.cum is not None and c.cum > prev
            if c.pieces or grew:
                self.t_ns.append(c.t_ns)
                self.texts.append(c.pieces)
                self.cumulative.append(c.cum if per_chunk else None)
            if c.cum is not None:
                prev = max(prev, c.cum)


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
        text = f"{exc} {exc.__cause__ or ''}".lower()
        if "invalid character in chunk" in text or "chunk size" in text:
            return "transport error: the server's chunked encoding is broken (bad chunk)"
        return "connection reset during the stream"  # also a stream cut mid-chunk
    if isinstance(exc, aiohttp.ClientResponseError) and exc.status == 400:
        # aiohttp's parser reports a malformed response (a bad chunk size on a 200) as a
        # "400": the server said no such thing, the bytes on the wire were broken.
        what = " ".join(str(exc.message).split())[:120]
        if "chunk" in what.lower():
            return f"transport error: the server's chunked encoding is broken ({what})"
        return f"transport error: malformed response from the server ({what})"
    if isinstance(exc, ConnectionResetError | aiohttp.ClientOSError):
        return "connection reset"
    return f"{type(exc).__name__}: {exc}"[:200]


#: The largest token count a server may report for one request (one billion: far beyond
#: any context window, and well inside the int64 columns the counts are stored in).
MAX_SERVER_COUNT = 1_000_000_000
#: The largest choice ``index`` taken as a number at all (any index but 0 is then refused:
#: perfscope asks for one choice per request, see ``_apply_event``).
MAX_CHOICE_INDEX = 1023


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _count(x: Any, name: str, limit: int = MAX_SERVER_COUNT) -> int | None:
    """A count the server sent, range-checked where it enters: None when absent or not an
    integer; ValueError naming the field and value when negative or beyond ``limit``
    (10^30 or 2^64 would overflow the int64 columns and poison the run's files)."""
    n = _int(x)
    if n is not None and not 0 <= n <= limit:
        shown = str(n) if len(str(n)) <= 24 else f"{str(n)[:12]}...({len(str(n))} digits)"
        raise ValueError(
            f"server sent an impossible {name} ({shown}; allowed 0..{limit:,}): "
            "the request is failed, the run goes on"
        )
    return n


def _cached_of(obj: dict[str, Any]) -> int | None:
    """Cached prompt tokens in one event: OpenAI/vLLM ``usage.prompt_tokens_details``,
    llama.cpp's ``timings.cache_n``."""
    usage = obj.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            n = _count(details.get("cached_tokens"), "usage.prompt_tokens_details.cached_tokens")
            if n is not None:
                return n
        n = _count(usage.get("cached_tokens"), "usage.cached_tokens")
        if n is not None:
            return n
    timings = obj.get("timings")
    if isinstance(timings, dict):
        return _count(timings.get("cache_n"), "timings.cache_n")
    return None


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
    model = obj.get("model")
    if isinstance(model, str) and model:
        res.model = model
    usage = obj.get("usage")
    cum: int | None = None
    if isinstance(usage, dict):
        ct = _count(usage.get("completion_tokens"), "usage.completion_tokens")
        if ct is not None:
            cum = ct
            res.completion_tokens = ct
            res.t_usage_ns = t
        pt = _count(usage.get("prompt_tokens"), "usage.prompt_tokens")
        if pt is not None:
            res.prompt_tokens = pt
    cached = _cached_of(obj)
    if cached is not None:
        res.cached_tokens = cached
    pieces: list[tuple[int, str]] = []
    choices = obj.get("choices") or ()
    finishing = False
    for ch in choices:
        if not isinstance(ch, dict):
            continue
        idx = _count(ch.get("index", 0), "choices[].index", MAX_CHOICE_INDEX)
        if idx:
            # Each request asks for one choice; merging a second into the first's token
            # times would be wrong, and per-choice records are not kept: refuse it.
            raise ValueError(
                f"server sent choice index {idx}: more than one choice per request (n > 1) "
                "is not measured; remove n from the request body"
            )
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
            pieces.append((0, text))
        fr = ch.get("finish_reason")
        if fr:
            res.finish_reasons.append(str(fr))
            finishing = True
    if choices:
        res.candidates.append(Candidate(t, pieces, cum, finishing))


#: id(StreamReader) → (clock, arrivals) for the streams being read. StreamReader has
#: ``__slots__`` and no weakref slot, so the registry is keyed by id and entries are removed
#: when the request ends.
_ARRIVALS: dict[int, tuple[Callable[[], int], deque[tuple[int, int]]]] = {}
_ORIGINAL_FEED = StreamReader.feed_data


def _feed_data_stamped(self: StreamReader, data: bytes, *args: Any, **kwargs: Any) -> Any:
    entry = _ARRIVALS.get(id(self))
    if entry is not None and data:
        entry[1].append((len(data), entry[0]()))
        sel = _SELECT
        if sel.returned_ns and len(STAMP_DELAYS_NS) < _MAX_DELAYS:
            STAMP_DELAYS_NS.append(time.thread_time_ns() - sel.returned_ns + sel.busy_ns)
    return _ORIGINAL_FEED(self, data, *args, **kwargs)


class _SelectStamps:
    """The loop thread's CPU time (``thread_time_ns``) when its selector last returned, and
    the CPU it spent before it asked again (the longest that bytes arriving meanwhile waited
    for the selector through the client's own work). CPU time, not wall time: waiting for a
    CPU held by other processes is not the client's work and is not counted."""

    __slots__ = ("busy_ns", "returned_ns")

    def __init__(self) -> None:
        self.returned_ns = 0
        self.busy_ns = 0


_SELECT = _SelectStamps()
_MAX_DELAYS = 2_000_000
#: Per stamped arrival, an upper bound of how late its stamp is through the client's own
#: work (ns of the loop thread's CPU): the loop's work before the selector returned the
#: bytes plus its work from that return to the stamp. Waits for a CPU are not in it.
STAMP_DELAYS_NS: list[int] = []


def install_select_stamps(loop: asyncio.AbstractEventLoop) -> bool:
    """Wrap the running loop's selector so arrivals know their stamp delay (see
    ``STAMP_DELAYS_NS``); False when the loop has no selector to wrap."""
    sel = getattr(loop, "_selector", None)
    if sel is None or getattr(sel, "_perfscope_stamps", False):
        return sel is not None
    original = sel.select
    stamps = _SELECT

    def select(timeout: float | None = None) -> Any:
        t_enter = time.thread_time_ns()
        stamps.busy_ns = t_enter - stamps.returned_ns if stamps.returned_ns else 0
        events = original(timeout)
        stamps.returned_ns = time.thread_time_ns()
        return events

    sel.select = select
    sel._perfscope_stamps = True
    return True


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


class RequestTrace:
    """Per-request stamps taken by aiohttp's trace hooks (see :func:`trace_config`).

    Attributes:
        now_ns: the run clock.
        t_sent: when the request's last byte was handed to the socket: the hook runs
            synchronously right before aiohttp's ``transport.write`` of each body chunk,
            so the last stamp is the last write, microseconds from the syscall.
        t_connect_start: when a new connection began to open.
        connect_ns: how long the new connection took (TCP handshake); None when reused.
        reused: the request went out on a pooled connection.
    """

    __slots__ = ("connect_ns", "now_ns", "reused", "t_connect_start", "t_sent")

    def __init__(self, now_ns: Callable[[], int]) -> None:
        self.now_ns = now_ns
        self.t_sent: int | None = None
        self.t_connect_start: int | None = None
        self.connect_ns: int | None = None
        self.reused = False


def _trace_of(ctx: Any) -> RequestTrace | None:
    tr = getattr(ctx, "trace_request_ctx", None)
    return tr if isinstance(tr, RequestTrace) else None


async def _on_sent(session: Any, ctx: Any, params: Any) -> None:
    tr = _trace_of(ctx)
    if tr is not None:
        tr.t_sent = tr.now_ns()


async def _on_connect_start(session: Any, ctx: Any, params: Any) -> None:
    tr = _trace_of(ctx)
    if tr is not None:
        tr.t_connect_start = tr.now_ns()


async def _on_connect_end(session: Any, ctx: Any, params: Any) -> None:
    tr = _trace_of(ctx)
    if tr is not None and tr.t_connect_start is not None:
        tr.connect_ns = tr.now_ns() - tr.t_connect_start


async def _on_reuse(session: Any, ctx: Any, params: Any) -> None:
    tr = _trace_of(ctx)
    if tr is not None:
        tr.reused = True


def trace_config() -> aiohttp.TraceConfig:
    """The trace hooks a session needs for exact send stamps and connection set-up times."""
    tc = aiohttp.TraceConfig()
    tc.on_request_headers_sent.append(_on_sent)  # a body-less request: headers are last
    tc.on_request_chunk_sent.append(_on_sent)
    tc.on_connection_create_start.append(_on_connect_start)
    tc.on_connection_create_end.append(_on_connect_end)
    tc.on_connection_reuseconn.append(_on_reuse)
    return tc


#: Failures that happen on the connection before any response: retryable when nothing of
#: the request can have been processed (see ``StreamResult.retryable``).
_CONNECTION_ERRORS = (
    aiohttp.ClientConnectorError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    ConnectionResetError,
    BrokenPipeError,
)


def error_text(status: int, reason: str | None, body: str) -> str:
    """``HTTP 404 Not Found: <the server's message>`` with the server's own words: the
    ``error.message`` / ``message`` / ``detail`` of a JSON body, else the body text."""
    msg = body.strip()
    try:
        obj = json.loads(msg) if msg else None
    except json.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        inner = obj.get("error", obj)
        if isinstance(inner, dict):
            found = inner.get("message") or inner.get("detail") or inner.get("msg")
            if found is None and "detail" in obj:
                found = obj["detail"]
            msg = json.dumps(found) if isinstance(found, list | dict) else str(found or msg)
        elif isinstance(inner, str):
            msg = inner
    msg = " ".join(msg.split())
    head = f"HTTP {status} {reason or ''}".strip()
    return head + (f": {msg[:400]}" if msg else "")


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> tuple[bytes, bool]:
    """At most ``cap`` bytes of the body, and whether there was more (then the connection
    is closed, not drained: the rest is never read)."""
    parts: list[bytes] = []
    n = 0
    while n < cap:
        data = await resp.content.readany()
        if not data:
            return b"".join(parts), False
        parts.append(data)
        n += len(data)
    more = not resp.content.at_eof()
    if more:
        resp.close()
    return b"".join(parts)[:cap], more


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    now_ns: Callable[[], int],
    timeout_s: float | None,
    limits: ReadLimits | None = None,
) -> StreamResult:
    """POST ``body`` to ``url`` and read the SSE stream to its end; never raises for a failed
    request (the failure is in ``error``). The session needs :func:`trace_config` for the
    send stamp and connection times (without it ``t_sent_ns`` is when the POST began).
    ``limits`` caps what is read and whether redirects are followed (:class:`ReadLimits`)."""
    lim = limits or ReadLimits()
    res = StreamResult()
    parser = SSEParser(lim.max_line_bytes)
    tr = RequestTrace(now_ns)
    t_begin = now_ns()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                url,
                data=body,
                headers=headers,
                trace_request_ctx=tr,
                allow_redirects=lim.follow_redirects,
            ) as resp:
                res.t_headers_ns = now_ns()
                res.status = resp.status
                if resp.history:
                    res.final_url = str(resp.url)
                if 300 <= resp.status < 400 and resp.headers.get("Location"):
                    where = resp.headers["Location"][:200]
                    res.error = (
                        f"HTTP {resp.status} redirect to {where!r} refused: the timings would "
                        "be of another server; use that URL, or --engine-opt follow_redirects=1"
                    )
                    return res
                if resp.status != 200:
                    raw, more = await _read_capped(resp, lim.max_body_bytes)
                    text = raw.decode("utf-8", "replace")
                    res.error = error_text(resp.status, resp.reason, text)
                    if more:
                        res.error += f" (body cut at {lim.max_body_bytes:,} bytes)"
                    return res
                ctype = resp.headers.get("Content-Type", "")
                if "text/event-stream" not in ctype and "application/json" in ctype:
                    await _read_capped(resp, lim.max_body_bytes)
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
        # Nothing came back, and either the request was never fully written or it went out
        # on a pooled connection the server had already closed: it never reached the server.
        res.retryable = (
            isinstance(exc, _CONNECTION_ERRORS)
            and res.t_headers_ns is None
            and (tr.t_sent is None or tr.reused)
        )
    finally:
        res.t_sent_ns = tr.t_sent if tr.t_sent is not None else t_begin
        res.connect_ns = tr.connect_ns
        res.reused = tr.reused
    res.settle()
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
