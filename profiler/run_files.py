"""Reading a run's JSON files within a size cap, and the run id pattern: the part of the run
store a listing needs, with no pyarrow or pandas import (``perfscope ls`` from the index).

:mod:`perfscope.profiler.store` re-exports every name here; import them from there unless
start-up time matters.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import Any

from perfscope.errors import BrokenRunError, UsageError

__all__ = [
    "DEFAULT_JSON_CAP_BYTES",
    "JSON_CAP_ENV",
    "RUN_ID_PATTERN",
    "json_cap_bytes",
    "loads_json",
    "mark_crashed",
    "read_json_capped",
]

#: A run id (the run folder's name): what ``perfscope ls`` lists as a run.
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")

#: Default cap on a run's manifest.json / summary.json, bytes (a real run's are a few kB;
#: a 1 GB manifest took 11.5 s and 2.2 GB of memory to list before this cap).
DEFAULT_JSON_CAP_BYTES = 8 * 1024 * 1024
#: Environment variable that sets the cap (bytes; ``k``/``M``/``G`` suffixes allowed).
JSON_CAP_ENV = "PERFSCOPE_MAX_JSON_BYTES"


def json_cap_bytes() -> int:
    """The cap on a run's JSON files, bytes: ``$PERFSCOPE_MAX_JSON_BYTES`` or 8 MiB.

    Raises:
        UsageError: the variable is set to something that is not a positive size.
    """
    raw = os.environ.get(JSON_CAP_ENV, "").strip()
    if not raw:
        return DEFAULT_JSON_CAP_BYTES
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(raw[-1].lower(), 1)
    digits = raw[:-1] if scale > 1 else raw
    if not digits.isdigit() or int(digits) <= 0:
        raise UsageError(f"{JSON_CAP_ENV}={raw!r} is not a size; give bytes, e.g. 8M or 8388608")
    return int(digits) * scale


def _size_text(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _stdlib_loads(raw: bytes) -> Any:
    return json.loads(raw.decode("utf-8"))


@functools.cache
def _fast_loads() -> Callable[[bytes], Any] | None:
    """orjson's ``loads`` when installed (optional: ``perfscope[index]``), else ``None``;
    imported on first use, so a listing that parses nothing does not pay for it."""
    try:
        import orjson
    except ImportError:
        return None
    loads: Callable[[bytes], Any] = orjson.loads
    return loads


#: Every byte as the big-integer check reads it: a digit as ``9``, ``-`` and ``.`` as
#: themselves, anything else as a space.
_DIGIT_SHAPE = bytes(57 if 48 <= b <= 57 else b if b in (45, 46) else 32 for b in range(256))
_DIGITS_19 = b"9" * 19


def _may_hold_a_big_integer(raw: bytes) -> bool:
    """Whether ``raw`` may hold an integer past 64 bits (more than 2**64 - 1, less than
    -2**63), which orjson reads as a float and :mod:`json` as an int: 20 digits in a row,
    or ``-`` and 19, not after a ``.`` (a fraction's digits never make an integer). A
    superset (digits in strings and exponents count too), in a few microseconds: runs
    that long are rare, so the bytes are searched, not walked."""
    shape = raw.translate(_DIGIT_SHAPE)
    at = shape.find(_DIGITS_19)
    while at >= 0:
        start = at
        while start and shape[start - 1] == 0x39:  # back to the first digit of the run
            start -= 1
        stop = at + 19
        while stop < len(shape) and shape[stop] == 0x39:  # on to its end
            stop += 1
        before = shape[start - 1] if start else 0
        if before != 0x2E and (before == 0x2D or stop - start >= 20):  # "." and "-"
            return True
        at = shape.find(_DIGITS_19, stop)
    return False


def loads_json(raw: bytes) -> Any:
    """``json.loads(raw.decode("utf-8"))``, several times faster when orjson is installed.

    orjson answers only where it reads as :mod:`json` does: every document it refuses
    (``NaN``/``Infinity``, lone surrogates, numbers past a double, invalid UTF-8, a byte
    order mark) and every one that may hold an integer past 64 bits is handed to
    :mod:`json`, which returns or raises exactly what it always did."""
    fast = _fast_loads()
    if fast is not None and not _may_hold_a_big_integer(raw):
        try:
            return fast(raw)
        except ValueError:  # orjson.JSONDecodeError: json decides, as it always did
            pass
    return _stdlib_loads(raw)


def _read_up_to(fd: int, n: int, regular: bool) -> bytes:
    """``n`` bytes of ``fd`` or up to its end, as a file object's ``read(n)``; a short read
    of a regular file is its end (no second call to see nothing)."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        chunk = os.read(fd, n - got)
        parts.append(chunk)
        got += len(chunk)
        if not chunk or (regular and got < n):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_json_capped(
    path: Path | str, cap: int | None = None, *, loads: Callable[[bytes], Any] = _stdlib_loads
) -> Any:
    """The JSON value in ``path``, read only when the file is at most ``cap`` bytes
    (default :func:`json_cap_bytes`): a run file grown huge never costs its size in time
    or memory. ``loads`` parses the bytes (:func:`loads_json` for the fast path).

    Raises:
        BrokenRunError: the file is over the cap (the message names it, its size and the
            cap, on one line); the parse errors of :func:`json.loads` and ``OSError`` pass.
    """
    limit = json_cap_bytes() if cap is None else cap
    # os-level calls, not open(): a first build of the run index reads two files a run, and
    # a file object costs three more system calls each (and its own objects).
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if S_ISDIR(st.st_mode):  # as open() refuses it
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        size, regular = st.st_size, S_ISREG(st.st_mode)
        # Read what fstat saw (a read of ``limit`` bytes would allocate the whole cap, 8 MiB,
        # for every small file); a file still growing is read on up to the cap.
        raw = _read_up_to(fd, size + 1, regular) if size <= limit else b""
        if size < len(raw) <= limit:
            raw += _read_up_to(fd, limit + 1 - len(raw), regular)
    finally:
        os.close(fd)
    if size > limit or len(raw) > limit:
        size = max(size, len(raw))
        raise BrokenRunError(
            f"{path}: {_size_text(size)} ({size} bytes), over the {_size_text(limit)} cap on "
            f"run files; not read (set {JSON_CAP_ENV} to raise it)"
        )
    return loads(raw)


def mark_crashed(manifest: dict[str, Any], reason: str | None) -> dict[str, Any]:
    """A copy of a crashed run's manifest that says so: status ``crashed``, why, partial,
    and a warning that its numbers cover only what was flushed (the store's reading)."""
    out = dict(manifest)
    out["status"] = "crashed"
    out["status_reason"] = reason
    out["partial"] = True
    warnings = [w for w in (out.get("warnings") or []) if isinstance(w, str)]
    warnings.append(
        f"this run crashed ({reason}): the numbers cover only the records flushed "
        "before that (partial)"
    )
    out["warnings"] = warnings
    return out
