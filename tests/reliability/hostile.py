"""A real loopback HTTP server that misbehaves on purpose, one behaviour per request.

``hostile_server(["ok", "huge_completion", ...])`` serves the i-th POST with the i-th
behaviour (the last one repeats), writing raw bytes on the socket so that broken chunked
encodings, redirects and oversized lines are exactly what a broken server would send.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: Terminal attacks an error message or model id may carry: OSC 52 clipboard write, screen
#: clear, window title, OSC 8 hyperlink, and rich markup that would be read as markup.
HOSTILE_TEXT = (
    "\x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b]0;pwned\x07"
    "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\ [/] [link=http://evil.example]x[/link]"
    " :x: [bold red]boom"
)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(text: str, usage: dict[str, Any] | None = None, index: int = 0) -> bytes:
    obj: dict[str, Any] = {"model": "m", "choices": [{"index": index, "text": text}]}
    if usage is not None:
        obj["usage"] = usage
    return _event(obj)


def _final(usage: dict[str, Any]) -> bytes:
    finish = {"model": "m", "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
    return _event(finish) + _event({"model": "m", "choices": [], "usage": usage})


def stream_body(mode: str, n_choices: int = 1) -> bytes:
    """The SSE body of one behaviour (5 text chunks, then a final usage); ``n_choices`` > 1
    interleaves the chunks of choices 0, 1, ... as a server honouring ``n`` does."""
    good = {"prompt_tokens": 8, "completion_tokens": 5}
    usage = {
        "ok": good,
        "huge_completion": {"prompt_tokens": 8, "completion_tokens": 10**30},
        "u64_prompt": {"prompt_tokens": 2**64, "completion_tokens": 5},
        "negative": {"prompt_tokens": 8, "completion_tokens": -3},
    }.get(mode, good)
    head = b"".join(_chunk(f" w{i}", index=c) for i in range(5) for c in range(n_choices))
    if mode == "two_choices":
        head += _chunk(" other", index=1)
    return head + _final(usage) + b"data: [DONE]\n\n"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._raw(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size)
        if not self.path.endswith("completions"):  # /tokenize and other probes
            self._raw(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        mode = self.server.next_mode()
        try:
            request = json.loads(raw)
        except ValueError:
            request = {}
        if not isinstance(request, dict):
            request = {}
        self.server.bodies.append(request)
        if mode == "error_text":
            body = json.dumps({"error": {"message": HOSTILE_TEXT}}).encode()
            self._raw(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body
            )
            return
        if mode == "huge_error_body":
            size = self.server.huge_bytes
            self._raw(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
                b"Content-Length: %d\r\n\r\n" % size
            )
            block = b"x" * (1 << 20)
            try:
                for _ in range(size // len(block)):
                    self.wfile.write(block)
            except OSError:
                pass  # the client stopped reading at its cap: what we want
            self.close_connection = True
            return
        if mode == "redirect":
            loc = f"http://127.0.0.1:{self.server.server_address[1]}/elsewhere/v1/completions"
            self._raw(
                b"HTTP/1.1 307 Temporary Redirect\r\nLocation: " + loc.encode() + b"\r\n"
                b"Content-Length: 0\r\n\r\n"
            )
            return
        if mode == "long_line":
            line = b'data: {"choices":[{"index":0,"text":"' + b"A" * self.server.huge_bytes
            self._raw(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            )
            try:
                for i in range(0, len(line), 1 << 20):
                    self.wfile.write(line[i : i + (1 << 20)])
            except OSError:
                pass
            self.close_connection = True
            return
        n_choices = request.get("n", 1) if mode == "honour_n" else 1
        if mode == "two_choices_unasked":  # a server that ignores the body and sends two
            n_choices = 2
        body = stream_body(mode, n_choices if isinstance(n_choices, int) else 1)
        if mode == "slow":  # one event every 0.2 s: a request stays in flight for ~1.5 s
            self._raw(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            )
            for event in body.split(b"\n\n"):
                if event:
                    self._raw(event + b"\n\n")
                    time.sleep(0.2)
            self.close_connection = True
            return
        if mode == "bad_chunked":
            # A valid first chunk, then a size line that is not hex.
            first = body[:40]
            self._raw(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + b"%x\r\n" % len(first)
                + first
                + b"\r\nZZZZ\r\nnot a chunk\r\n"
            )
            self.close_connection = True
            return
        self._raw(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )

    def _raw(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, modes: list[str], huge_bytes: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.modes = modes
        self.huge_bytes = huge_bytes
        self.served: list[str] = []
        #: the JSON body of every completions request, in arrival order
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def next_mode(self) -> str:
        with self._lock:
            i = len(self.served)
            mode = self.modes[min(i, len(self.modes) - 1)]
            self.served.append(mode)
            return mode

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        super().server_bind()


#: Options of a short, bounded ``perfscope run`` against a hostile server: one stream,
#: 5 tokens a request, a 30 s request timeout, no warm-up, preflight, progress or report.
BOUNDED_RUN = (
    "--no-preflight",
    "--warmup",
    "0",
    "--concurrency",
    "1",
    "--output-len",
    "5",
    "--timeout",
    "30",
    "--no-progress",
    "--no-report",
)


@contextmanager
def hostile_server(modes: list[str], huge_bytes: int = 64 << 20) -> Iterator[_Server]:
    """Serve ``modes`` (one per POST, in order) on 127.0.0.1; ``server.url`` is the base."""
    srv = _Server(modes, huge_bytes)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def base_url(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/v1"
