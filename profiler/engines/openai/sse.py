"""Server-sent events, parsed incrementally and leniently, as OpenAI-compatible servers send them.

The parser takes bytes exactly as they come off the socket and returns the ``data`` payloads
of complete events. It copes with what real servers do:

- lines split across reads (also a ``\\r\\n`` split between two reads), ``\\n``, ``\\r\\n``
  and lone ``\\r`` line endings;
- ``:`` comment lines (keep-alives), blank keep-alive lines, ``event:``, ``id:``,
  ``retry:`` fields;
- garbage lines that are not SSE fields (counted, ignored);
- servers that omit the blank line between events: a ``data:`` line that is a complete JSON
  object (``{...}``) or ``[DONE]`` is dispatched at once, so its arrival time is the time the
  line arrived and not the time of some later blank line;
- multi-line ``data:`` (joined with ``\\n`` as the SSE specification says).

Bounded and linear: each byte is copied into a line once (a line split over many reads is
kept as a list of pieces and joined when its end arrives, never re-concatenated per read),
and a line or event longer than ``max_line_bytes`` raises :class:`SSELineTooLongError` (a
``ValueError``: the client fails that request with its text) instead of growing without
limit. One 100 MB ``data:`` line used to take minutes and several times its size in memory.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_LINE_BYTES", "SSELineTooLongError", "SSEParser"]

#: Longest SSE line (and event) accepted, in bytes: far beyond any token chunk (a few
#: hundred bytes) or final usage event, small enough that a runaway server cannot exhaust
#: memory. Set per run with ``--engine-opt sse_line_cap=BYTES``.
DEFAULT_MAX_LINE_BYTES = 4 << 20


class SSELineTooLongError(ValueError):
    """A line or event of the stream exceeded the parser's cap."""


_DATA = b"data"
_IGNORED_FIELDS = frozenset((b"event", b"id", b"retry"))


class SSEParser:
    """Incremental SSE parser.

    Attributes:
        comments: ``:`` comment (keep-alive) lines seen.
        ignored_lines: lines that are not SSE fields (garbage) and were skipped.
        events: events returned so far.
    """

    __slots__ = (
        "_data",
        "_data_len",
        "_pending",
        "_pending_len",
        "_skip_lf",
        "comments",
        "events",
        "ignored_lines",
        "max_line_bytes",
    )

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._pending: list[bytes] = []  # pieces of the line not yet ended
        self._pending_len = 0
        self._skip_lf = False  # the last read ended in CR: a leading LF is its CRLF's half
        self._data: list[bytes] = []
        self._data_len = 0
        self.comments = 0
        self.ignored_lines = 0
        self.events = 0

    def _too_long(self, n: int, what: str) -> SSELineTooLongError:
        return SSELineTooLongError(
            f"stream {what} over {self.max_line_bytes:,} bytes ({n:,} so far): the server "
            "sent a runaway line; raise --engine-opt sse_line_cap=BYTES if it is genuine"
        )

    def feed(self, data: bytes) -> list[str]:
        """Parse ``data`` (any slice of the stream); return the payloads completed by it.
        Raises :class:`SSELineTooLongError` when a line or event exceeds the cap."""
        if self._skip_lf:
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        if not data:
            return []
        tail_cr = data[-1:] == b"\r"
        if tail_cr:  # a CR ends a line now; a LF at the start of the next read is its pair
            data = data[:-1]
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if tail_cr:
            data += b"\n"
            self._skip_lf = True
        if b"\n" not in data:
            self._hold(data)
            return []
        lines = data.split(b"\n")
        rest = lines.pop()
        if self._pending:
            self._pending.append(lines[0])
            lines[0] = b"".join(self._pending)
            self._pending, self._pending_len = [], 0
        out: list[str] = []
        cap = self.max_line_bytes
        for line in lines:
            if len(line) > cap:
                raise self._too_long(len(line), "line")
            self._line(line, out)
        if rest:
            self._hold(rest)
        return out

    def _hold(self, piece: bytes) -> None:
        self._pending.append(piece)
        self._pending_len += len(piece)
        if self._pending_len > self.max_line_bytes:
            n = self._pending_len
            self._pending, self._pending_len = [], 0
            raise self._too_long(n, "line")

    def close(self) -> list[str]:
        """End of stream: return an event left without its terminating blank line."""
        out: list[str] = []
        if self._pending:
            rest = b"".join(self._pending).rstrip(b"\r")
            self._pending, self._pending_len = [], 0
            self._line(rest, out)
        self._dispatch(out)
        return out

    def _line(self, line: bytes, out: list[str]) -> None:
        if not line:
            self._dispatch(out)
            return
        if line[0] == 58:  # b":"
            self.comments += 1
            return
        field, sep, value = line.partition(b":")
        if field == _DATA:
            if value[:1] == b" ":
                value = value[1:]
            stripped = value.strip()
            if (stripped[:1] == b"{" and stripped[-1:] == b"}") or stripped == b"[DONE]":
                # A complete payload: deliver it now (see the module docstring).
                self._dispatch(out)
                self._data.append(stripped)
                self._dispatch(out)
            else:
                self._data_len += len(value) + 1
                if self._data_len > self.max_line_bytes:
                    n = self._data_len
                    self._data, self._data_len = [], 0
                    raise self._too_long(n, "event")
                self._data.append(value)
        elif sep and field in _IGNORED_FIELDS:
            return
        else:
            self.ignored_lines += 1

    def _dispatch(self, out: list[str]) -> None:
        if self._data:
            payload = b"\n".join(self._data) if len(self._data) > 1 else self._data[0]
            self._data, self._data_len = [], 0
            out.append(payload.decode("utf-8", "replace"))
            self.events += 1
