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
"""

from __future__ import annotations

__all__ = ["SSEParser"]

_DATA = b"data"
_IGNORED_FIELDS = frozenset((b"event", b"id", b"retry"))


class SSEParser:
    """Incremental SSE parser.

    Attributes:
        comments: ``:`` comment (keep-alive) lines seen.
        ignored_lines: lines that are not SSE fields (garbage) and were skipped.
        events: events returned so far.
    """

    __slots__ = ("_buf", "_data", "comments", "events", "ignored_lines")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self.comments = 0
        self.ignored_lines = 0
        self.events = 0

    def feed(self, data: bytes) -> list[str]:
        """Parse ``data`` (any slice of the stream); return the payloads completed by it."""
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            hold = b""
            if buf.endswith(b"\r"):  # may be the first half of a CRLF split across reads
                buf, hold = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            lines = buf.split(b"\n")
            self._buf = lines.pop() + hold
        else:
            lines = buf.split(b"\n")
            self._buf = lines.pop()
        out: list[str] = []
        for line in lines:
            self._line(line, out)
        return out

    def close(self) -> list[str]:
        """End of stream: return an event left without its terminating blank line."""
        out: list[str] = []
        if self._buf:
            rest, self._buf = self._buf.rstrip(b"\r"), b""
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
                self._data.append(value)
        elif sep and field in _IGNORED_FIELDS:
            return
        else:
            self.ignored_lines += 1

    def _dispatch(self, out: list[str]) -> None:
        if self._data:
            payload = b"\n".join(self._data) if len(self._data) > 1 else self._data[0]
            self._data = []
            out.append(payload.decode("utf-8", "replace"))
            self.events += 1
