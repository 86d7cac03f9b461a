"""A scripted OpenAI-compatible SSE server for tests and benchmarks (standard library only).

Run: ``python sse_server.py [--port 0] [--ttft 0.05] [--itl 0.01] [--tokens-per-chunk 1]
[--usage final|per_chunk|none] [--no-stream]``; it prints ``PORT <n>`` on stdout when ready.

Every request streams ``max_tokens`` (or ``max_completion_tokens``) tokens, in chunks named
as vLLM names them (``chat.completion.chunk``, ``text_completion``): the first chunk ``ttft``
seconds after the request was read, then one chunk every ``itl`` seconds (an absolute
schedule, so delays do not accumulate). A prompt containing ``fault=NAME`` selects a fault:

``http500``  HTTP 500 with a JSON error body
``reset``    the connection is reset (RST) after half the chunks
``truncate`` the stream ends cleanly after half the chunks, without finish_reason or [DONE]
``garbage``  garbage lines, comments, keep-alives, role-only and empty chunks, CRLF line ends
             and lines split across writes, between valid chunks (still a good response)
``badjson``  a data line that is not JSON
``slow_first_byte``  even the response headers wait for ``ttft``
``error_event``  a ``data: {"error": ...}`` event mid-stream

A prompt containing ``id=TAG`` makes the server log, under TAG, the ``perf_counter_ns`` at
which the request's last byte arrived (stamped in the event loop's socket callback, like the
client's chunk stamps) and just before each chunk write (CLOCK_MONOTONIC on Linux,
comparable across processes); ``GET /_log`` returns and clears that log.

Server behaviours of real engines, by flag:

``--empty-first``  the first token renders no text yet (a partial UTF-8 sequence, as vLLM
    sends it): ``{"text": "", "usage": {"completion_tokens": 1}}`` with per-chunk usage; its
    text comes with the second token.
``--close-after-stream S``  advertise ``Keep-Alive`` but close every connection S seconds
    after its stream without reading anything more (llama-server): a request sent on that
    pooled connection in the meantime is reset, never read.
``--cache``  a prompt cache: ``cached_tokens`` (``usage.prompt_tokens_details`` and
    llama.cpp's ``timings.cache_n``) = the words shared with the longest earlier prompt.
``--cache-ttft S``  with ``--cache``: the TTFT of a fully cached prompt; a partly cached one
    waits ``S + (ttft - S) * (uncached share of its words)`` (prefill skipped for what the
    cache holds).
``--served-model NAME``  the one model listed by ``/v1/models``; with ``--unknown-model``
    ``404`` another name gets vLLM's 404 body, ``echo`` answers as NAME anyway (llama.cpp),
    ``accept`` (default) answers as the name requested.
``--max-model-len N``  listed in ``/v1/models``; longer prompt + max_tokens gets vLLM's 400.
``--slot-len N``  stop at N context tokens with ``finish_reason: "length"`` (llama.cpp slot).
``--token-factor F``  the server's tokenizer: a prompt's tokens = round(words * F).
``--tokenize prompt|content|none``  ``POST /tokenize`` as vLLM (``prompt``) or llama.cpp
    (``content``) takes it, or absent. ``GET /version`` always answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import socket
import struct
import sys
import time
from typing import Any

LOG: dict[str, dict[str, Any]] = {}
VERSION = "scripted-1.0"

_FEED = asyncio.StreamReader.feed_data


def _feed_stamped(self: asyncio.StreamReader, data: bytes) -> None:
    # The time the latest bytes reached the loop's socket callback (not when a coroutine ran).
    self._t_last_feed = time.perf_counter_ns()  # type: ignore[attr-defined]
    _FEED(self, data)


asyncio.StreamReader.feed_data = _feed_stamped  # type: ignore[method-assign]
_FAULT = re.compile(r"fault=(\w+)")
_TAG = re.compile(r"id=(\w+)")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        # A server with capacity: at most this many streams generate at once; the others
        # wait (queueing shows up in TTFT), so a rate sweep has a knee.
        self.slots = asyncio.Semaphore(args.max_concurrent) if args.max_concurrent else None
        self.seen: list[list[str]] = []  # prompts seen, as words (the prompt cache)

    def prompt_tokens(self, prompt: str) -> int:
        return max(1, round(len(prompt.split()) * self.a.token_factor))

    def cached(self, words: list[str]) -> int:
        best = 0
        for old in self.seen:
            n = 0
            for x, y in zip(old, words, strict=False):
                if x != y:
                    break
                n += 1
            best = max(best, n)
        self.seen.append(words)
        return round(min(best, len(words)) * self.a.token_factor)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                t_recv_head = time.perf_counter_ns()
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0"))
                body = await reader.readexactly(n) if n else b""
                t_recv = getattr(reader, "_t_last_feed", t_recv_head) if n else t_recv_head
                keep = await self.route(method, path, headers, body, t_recv, writer)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def simple(self, writer: asyncio.StreamWriter, status: str, obj: Any) -> None:
        data = json.dumps(obj).encode()
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nServer: scripted\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    async def route(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        t_recv: int,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if method == "GET" and path == "/_log":
            out = dict(LOG)
            LOG.clear()
            await self.simple(writer, "200 OK", out)
            return True
        a = self.a
        if method == "GET" and path == "/v1/models":
            model: dict[str, Any] = {"id": a.served_model, "object": "model"}
            if a.max_model_len:
                model["max_model_len"] = a.max_model_len
            await self.simple(writer, "200 OK", {"object": "list", "data": [model]})
            return True
        if method == "GET" and path == "/version":
            await self.simple(writer, "200 OK", {"version": VERSION})
            return True
        if method == "POST" and path == "/tokenize" and a.tokenize != "none":
            try:
                text = str(json.loads(body)[a.tokenize])
            except (json.JSONDecodeError, KeyError, TypeError):
                await self.simple(writer, "400 Bad Request", {"error": f"needs '{a.tokenize}'"})
                return True
            n = self.prompt_tokens(text)
            await self.simple(writer, "200 OK", {"count": n, "tokens": list(range(n))})
            return True
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            await self.simple(writer, "404 Not Found", {"detail": "Not Found"})
            return True
        if self.a.api_key and headers.get("authorization") != f"Bearer {self.a.api_key}":
            await self.simple(writer, "401 Unauthorized", {"error": "bad key"})
            return True
        try:
            req = json.loads(body)
        except json.JSONDecodeError:
            await self.simple(writer, "400 Bad Request", {"error": "body is not JSON"})
            return True
        if self.a.reject_ignore_eos and "ignore_eos" in req:
            await self.simple(
                writer, "422 Unprocessable Entity", {"detail": "Unexpected fields: {'ignore_eos'}"}
            )
            return True
        chat = path.endswith("chat/completions")
        if chat:
            prompt = " ".join(str(m.get("content", "")) for m in req.get("messages", [{}]))
        else:
            prompt = str(req["prompt"])
        asked = str(req.get("model", ""))
        if asked != a.served_model and a.unknown_model == "404":
            await self.simple(
                writer,
                "404 Not Found",
                {
                    "error": {
                        "message": f"The model `{asked}` does not exist. Valid aliases: "
                        f"{a.served_model}",
                        "type": "NotFoundError",
                        "param": "model",
                        "code": 404,
                    }
                },
            )
            return True
        req["_model"] = asked if a.unknown_model == "accept" else a.served_model
        n_prompt = self.prompt_tokens(prompt)
        req["_prompt_tokens"] = n_prompt
        words = prompt.split()
        req["_cached"] = self.cached(words) if a.cache else None
        req["_ttft"] = a.ttft
        if req["_cached"] is not None and a.cache_ttft is not None and words:
            share = req["_cached"] / len(words)
            req["_ttft"] = a.cache_ttft + (a.ttft - a.cache_ttft) * (1 - share)
        if a.max_model_len and n_prompt + int(req.get("max_tokens") or 16) > a.max_model_len:
            await self.simple(
                writer,
                "400 Bad Request",
                {
                    "error": {
                        "message": f"This model's maximum context length is {a.max_model_len} "
                        f"tokens. However, you requested {n_prompt + int(req['max_tokens'])} "
                        "tokens.",
                        "type": "BadRequestError",
                        "code": 400,
                    }
                },
            )
            return True
        fault_m, tag_m = _FAULT.search(prompt), _TAG.search(prompt)
        fault = fault_m.group(1) if fault_m else None
        tag = tag_m.group(1) if tag_m else None
        writes: list[int] = []
        if tag is not None:
            LOG[tag] = {"recv": t_recv, "writes": writes}
        if fault == "http500":
            await self.simple(writer, "500 Internal Server Error", {"error": "scripted failure"})
            return True
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        if self.a.no_stream:
            await asyncio.sleep(self.a.ttft)
            await self.simple(
                writer,
                "200 OK",
                {"choices": [{"index": 0, "text": " tok" * n, "finish_reason": "length"}]},
            )
            return True
        if self.slots is None:
            return await self.stream(writer, req, n, chat, fault, t_recv, writes)
        async with self.slots:
            return await self.stream(writer, req, n, chat, fault, time.perf_counter_ns(), writes)

    async def stream(
        self,
        writer: asyncio.StreamWriter,
        req: dict[str, Any],
        n: int,
        chat: bool,
        fault: str | None,
        t_recv: int,
        writes: list[int],
    ) -> bool:
        a = self.a
        opts = req.get("stream_options") or {}
        usage_mode = a.usage
        if usage_mode == "per_chunk" and not opts.get("continuous_usage_stats"):
            usage_mode = "final"
        if usage_mode == "final" and not opts.get("include_usage") and a.usage_needs_option:
            usage_mode = "none"
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nServer: scripted\r\n"
            b"Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n"
            b"Keep-Alive: timeout=5, max=100\r\n\r\n"
        )
        if a.slot_len:
            n = max(1, min(n, a.slot_len - req["_prompt_tokens"]))
        model = req["_model"]
        kind = "chat.completion.chunk" if chat else "text_completion"
        start = t_recv
        if fault == "slow_first_byte":
            await _sleep_until(start + int(a.ttft * 1e9))
        writer.write(head)
        if chat and fault == "garbage":
            writer.write(_chunk(_sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})))
        k = max(1, a.tokens_per_chunk)
        n_chunks = (n + k - 1) // k
        sent = 0
        for i in range(n_chunks):
            await _sleep_until(start + int((req["_ttft"] + i * a.itl) * 1e9))
            m = min(k, n - sent)
            sent += m
            text = "".join(f" t{sent - m + j}" for j in range(m))
            if a.empty_first and i == 0:
                text = ""  # the first token is half a UTF-8 sequence: nothing to show yet
            elif a.empty_first and i == 1:
                text = " t0" + text
            piece: dict[str, Any] = (
                {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            )
            obj: dict[str, Any] = {"object": kind, "model": model, "choices": [piece]}
            if usage_mode == "per_chunk" or (a.empty_first and usage_mode != "none"):
                obj["usage"] = {"prompt_tokens": req["_prompt_tokens"], "completion_tokens": sent}
            data = _sse(obj)
            if fault == "garbage":
                data = b": keep-alive\n\nthis is not a field\nevent: token\nid: 7\n" + data.replace(
                    b"\n\n", b"\r\n\r\n"
                )
                data += _sse({"choices": []}) + b"\n\n"
                half = len(data) // 2
                writes.append(time.perf_counter_ns())
                writer.write(_chunk(data[:half]))
                await writer.drain()
                writer.write(_chunk(data[half:]))
            else:
                writes.append(time.perf_counter_ns())
                writer.write(_chunk(data))
            await writer.drain()
            if fault in ("reset", "truncate", "badjson", "error_event") and i == n_chunks // 2:
                if fault == "reset":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return False
                if fault == "truncate":
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    return True
                if fault == "badjson":
                    writer.write(_chunk(b"data: {not json at all\n\n"))
                if fault == "error_event":
                    writer.write(_chunk(_sse({"error": {"message": "scripted engine error"}})))
        final: dict[str, Any] = {
            "object": kind,
            "model": model,
            "choices": [
                {"index": 0, "finish_reason": "length", **({"delta": {}} if chat else {"text": ""})}
            ],
        }
        tail = _sse(final)
        if usage_mode in ("final", "per_chunk"):
            usage: dict[str, Any] = {
                "prompt_tokens": req["_prompt_tokens"],
                "completion_tokens": n,
            }
            last: dict[str, Any] = {"choices": [], "model": model, "usage": usage}
            if req["_cached"] is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": req["_cached"]}
                last["timings"] = {"cache_n": req["_cached"], "prompt_n": req["_prompt_tokens"]}
            tail += _sse(last)
        if not a.no_done:
            tail += b"data: [DONE]\n\n"
        writer.write(_chunk(tail) + b"0\r\n\r\n")
        await writer.drain()
        if a.close_after_stream is not None:
            # Keep-alive advertised, then closed without reading: a request the client wrote
            # on this connection meanwhile is never read (the kernel answers it with a reset).
            await asyncio.sleep(a.close_after_stream)
            return False
        return True


async def _sleep_until(t_ns: int) -> None:
    delay = (t_ns - time.perf_counter_ns()) / 1e9
    if delay > 0:
        await asyncio.sleep(delay)


async def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--itl", type=float, default=0.01)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--usage", choices=("final", "per_chunk", "none"), default="final")
    p.add_argument("--usage-needs-option", action="store_true")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--no-done", action="store_true")
    p.add_argument("--reject-ignore-eos", action="store_true")
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-concurrent", type=int, default=0, help="streams at once (0: any)")
    p.add_argument("--empty-first", action="store_true")
    p.add_argument("--close-after-stream", type=float, default=None, metavar="S")
    p.add_argument("--cache", action="store_true")
    p.add_argument("--cache-ttft", type=float, default=None, metavar="S")
    p.add_argument("--served-model", default="scripted")
    p.add_argument("--unknown-model", choices=("accept", "404", "echo"), default="accept")
    p.add_argument("--max-model-len", type=int, default=0)
    p.add_argument("--slot-len", type=int, default=0)
    p.add_argument("--token-factor", type=float, default=1.0)
    p.add_argument("--tokenize", choices=("prompt", "content", "none"), default="prompt")
    a = p.parse_args(argv)
    srv = Server(a)
    server = await asyncio.start_server(srv.handle, "127.0.0.1", a.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(sys.argv[1:]))
