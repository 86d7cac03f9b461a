"""Safe terminal text for every string that comes from outside perfscope.

Server error text, model ids, run names, prompts and file contents reach the terminal in
``show``, ``ls``, ``query``, ``compare`` and ``run``'s error lines. Printed raw, such a
string can write the clipboard (OSC 52), clear the screen, set the window title, plant a
hyperlink whose text is not its target (OSC 8), or (read as rich markup) raise a
``MarkupError`` on ``[/]``, become a ``[link=...]`` or turn ``:x:`` into an emoji.

Two layers:

- :func:`safe_text` / :func:`safe_markup` render one outside string as inert text (control
  characters shown escaped, ``\\x1b`` as ``\\x1b``; markup escaped); every CLI print of an
  outside string goes through one of them.
- :class:`SafeConsole`, the console every command prints with, is the backstop for any
  string that slips through: it escapes control characters in what it renders, drops
  hyperlinks, has emoji replacement off, and renders a string whose markup does not parse
  as plain text instead of raising.

:func:`configure_streams` makes a terminal that cannot encode UTF-8 (``LC_ALL=C``,
``PYTHONIOENCODING=ascii``) get ASCII stand-ins (``µ`` → ``u``, ``–`` → ``-``, ``⚠`` →
``!``, box lines → ``-``/``|``/``+``) rather than a ``UnicodeEncodeError`` traceback.
"""

from __future__ import annotations

import codecs
import io
import os
import re
import sys
import unicodedata
from collections.abc import Iterable
from typing import Any, TextIO

from rich.console import Console, ConsoleOptions, RenderableType
from rich.errors import MarkupError
from rich.markup import escape
from rich.segment import Segment
from rich.text import Text

__all__ = [
    "ASCII_ERRORS",
    "SafeConsole",
    "configure_streams",
    "safe_markup",
    "safe_text",
    "safe_text_obj",
]

#: C0 controls (newline and tab too: an outside string is shown on one line), DEL, C1
#: controls, and the bidirectional overrides that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f]")
#: The same, but keeping newlines: for whole rendered lines (SafeConsole's backstop).
_CONTROL_KEEP_NL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\x1b": "\\x1b"}


def _escape_char(m: re.Match[str]) -> str:
    ch = m.group(0)
    return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def safe_text(value: object, max_len: int | None = None) -> str:
    """``value`` as one line of inert text: control characters (ESC, BEL, CR, newline,
    C1, bidi overrides) written as visible escapes; cut to ``max_len`` characters with
    ``...`` when given. Not markup-escaped: use :func:`safe_markup` inside markup."""
    text = value if isinstance(value, str) else str(value)
    text = _CONTROL.sub(_escape_char, text)
    if max_len is not None and len(text) > max_len:
        text = text[: max(0, max_len - 3)] + "..."
    return text


def safe_markup(value: object, max_len: int | None = None) -> str:
    """:func:`safe_text` with rich markup escaped (``[`` → ``\\[``): for outside strings
    placed inside a markup string or a table cell; emoji codes are inert because every
    console has emoji off."""
    return escape(safe_text(value, max_len))


def safe_text_obj(value: object, max_len: int | None = None, style: str = "") -> Text:
    """:func:`safe_text` as a rich ``Text`` (never parsed as markup or emoji)."""
    return Text(safe_text(value, max_len), style=style)


class SafeConsole(Console):
    """A rich console that cannot be made to emit terminal controls or outside markup.

    Emoji replacement is off; a string whose markup does not parse is printed as plain
    text; in everything rendered, control characters other than newline are shown
    escaped, and hyperlinks are dropped (perfscope prints none of its own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("emoji", False)
        super().__init__(*args, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        try:
            return super().render_str(text, **kwargs)
        except MarkupError:
            kwargs["markup"] = False
            return super().render_str(text, **kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if seg.control:
                yield seg
                continue
            text, style = seg.text, seg.style
            if _CONTROL_KEEP_NL.search(text):
                text = _CONTROL_KEEP_NL.sub(_escape_char, text)
            if style is not None and style.link:
                style = style.update_link(None)
            yield Segment(text, style, seg.control)


#: Codec error handler that writes ASCII stand-ins (see :func:`configure_streams`).
ASCII_ERRORS = "perfscope-ascii"
_STANDINS = {
    "µ": "u",
    "–": "-",
    "—": "-",
    "−": "-",
    "…": "...",
    "⚠": "!",
    "×": "x",
    "≈": "~",
    "≤": "<=",
    "≥": ">=",
    "→": "->",
    "←": "<-",
    "•": "*",
    "·": ".",
    "✓": "ok",
    "✗": "x",
    "±": "+/-",
    "°": "deg",
    "“": '"',
    "”": '"',
    "‘": "'",
    "’": "'",
}


def _standin(ch: str) -> str:
    if ch in _STANDINS:
        return _STANDINS[ch]
    code = ord(ch)
    if 0x2500 <= code <= 0x257F:  # box drawing
        name = unicodedata.name(ch, "")
        if "VERTICAL AND" in name or "DOWN AND" in name or "UP AND" in name:
            return "+"
        return "|" if "VERTICAL" in name else "-"
    if 0x2580 <= code <= 0x259F:  # block elements (bars)
        return "#"
    decomposed = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    return decomposed or "?"


def _ascii_handler(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start : exc.end]
    return "".join(_standin(ch) for ch in bad), exc.end


codecs.register_error(ASCII_ERRORS, _ascii_handler)


def _can_encode(stream: TextIO) -> bool:
    enc = getattr(stream, "encoding", None) or "ascii"
    try:
        "µ–⚠─".encode(enc)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _locale_is_ascii() -> bool:
    """The user's locale is C/POSIX (``LC_ALL=C``): Python then writes UTF-8 anyway (its
    UTF-8 mode), which such a terminal shows as garbage. ``PYTHONIOENCODING`` wins."""
    if os.environ.get("PYTHONIOENCODING"):
        return False
    for key in ("LC_ALL", "LC_CTYPE", "LANG"):
        value = os.environ.get(key)
        if value:
            return value.split(".")[0] in ("C", "POSIX") and "utf" not in value.lower()
    return False


def configure_streams() -> None:
    """Give stdout and stderr ASCII stand-ins when they cannot write UTF-8's characters
    (``PYTHONIOENCODING=ascii``) or the locale is C/POSIX (``LC_ALL=C``), so output
    degrades to ASCII (rich then draws ASCII tables), never a traceback."""
    ascii_locale = _locale_is_ascii()
    for stream in (sys.stdout, sys.stderr):
        if not isinstance(stream, io.TextIOWrapper):
            continue
        if ascii_locale:
            stream.reconfigure(encoding="ascii", errors=ASCII_ERRORS)
        elif not _can_encode(stream):
            stream.reconfigure(errors=ASCII_ERRORS)
