"""Reading a run's JSON files within a size cap, and the run id pattern: the part of the run
store a listing needs, with no pyarrow or pandas import (``perfscope ls`` from the index).

:mod:`perfscope.profiler.store` re-exports every name here; import them from there unless
start-up time matters.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from perfscope.errors import BrokenRunError, UsageError

__all__ = [
    "DEFAULT_JSON_CAP_BYTES",
    "JSON_CAP_ENV",
    "RUN_ID_PATTERN",
    "json_cap_bytes",
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


def read_json_capped(path: Path, cap: int | None = None) -> Any:
    """The JSON value in ``path``, read only when the file is at most ``cap`` bytes
    (default :func:`json_cap_bytes`): a run file grown huge never costs its size in time
    or memory.

    Raises:
        BrokenRunError: the file is over the cap (the message names it, its size and the
            cap, on one line); the parse errors of :func:`json.loads` and ``OSError`` pass.
    """
    limit = json_cap_bytes() if cap is None else cap
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        # Read what fstat saw (a read of ``limit`` bytes would allocate the whole cap, 8 MiB,
        # for every small file); a file still growing is read on up to the cap.
        raw = fh.read(size + 1) if size <= limit else b""
        if size < len(raw) <= limit:
            raw += fh.read(limit + 1 - len(raw))
    if size > limit or len(raw) > limit:
        size = max(size, len(raw))
        raise BrokenRunError(
            f"{path}: {_size_text(size)} ({size} bytes), over the {_size_text(limit)} cap on "
            f"run files; not read (set {JSON_CAP_ENV} to raise it)"
        )
    return json.loads(raw.decode("utf-8"))


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
