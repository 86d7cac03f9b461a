"""One run folder read into one row of the index's ``runs`` table (never raises on bad files).

Values are copied from the files as stored (SI units: seconds, tokens per second, ratios); a
field a run does not have is NULL, and so is a value its column's type cannot hold (NaN or
infinity in a number column, a number in a text column). A run whose files cannot be parsed
keeps a row with ``state = 'broken'`` and the reason in ``problem``, so it shows up rather
than vanishing. SLO attainment and goodput are NULL for a run without SLOs
(``slo_count = 0``): a share of requests "meeting" no limit is no measurement.

The caller passes the dotted-path reader (:data:`Lookup`); every string in a row is made safe
for a UTF-8 store (:func:`safe_text`).
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.profiler.run_index.columns import _COLUMN_PLAN, ALL_COLUMN_NAMES, FileKey

if TYPE_CHECKING:
    from perfscope.profiler.store import TableCheck

__all__ = ["Lookup", "safe_text"]

#: Reads the value at a dotted path (or its keys, split) of a JSON object (``None`` when
#: absent): the metric catalogue's ``value_at``, passed in by the caller.
Lookup = Callable[[Any, str | tuple[str, ...]], Any]


def _coerce(value: Any, sql_type: str) -> Any:
    """The value as the column's type, or None when it does not fit (never raises)."""
    if value is None:
        return None
    return _COERCE[sql_type](value)


def _as_double(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _as_bigint(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return int(value)
    except (ValueError, OverflowError):  # NaN, infinity
        return None


def _as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _as_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


#: Each SQL type's :func:`_coerce` (a value that does not fit becomes None).
_COERCE: dict[str, Callable[[Any], Any]] = {
    "DOUBLE": _as_double,
    "BIGINT": _as_bigint,
    "BOOLEAN": _as_bool,
    "VARCHAR": _as_text,
    "TIMESTAMPTZ": _as_text,
}


def safe_text(value: str) -> str:
    """``value`` as text any UTF-8 store accepts: undecodable file-name bytes (Python's
    surrogate escapes) become ``\\xNN``, lone surrogates from JSON ``\\uD800`` escapes
    become ``\\udNNN``; valid text is returned unchanged."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        pass
    try:
        return os.fsencode(value).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _ratio(num: Any, den: Any) -> float | None:
    """``num / den`` for real numbers with ``den > 0``, else None."""
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (num, den))
    return float(num) / float(den) if ok and float(den) > 0 else None


def _read_json(path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """A run's JSON file read to the store's size cap, or ``(None, reason)``."""
    from perfscope.errors import BrokenRunError
    from perfscope.profiler.run_files import loads_json, read_json_capped

    try:
        data = read_json_capped(path, loads=loads_json)
    except FileNotFoundError:
        return None, None
    except BrokenRunError as exc:  # over the cap: the message names file, size and cap
        return None, str(exc)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{os.path.basename(path)}: {type(exc).__name__}: {exc}"
    if not isinstance(data, dict):
        return None, f"{os.path.basename(path)}: not a JSON object"
    return data, None


def _outside(root: Path, path: str | Path) -> bool:
    """Whether ``path`` (links resolved) lies outside ``root`` (already resolved).

    ``path`` is a file in a run folder the scan found as a real folder (not a link) in the
    runs folder, so only a link can lead out: a plain file is inside without resolving."""
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return False
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        return not Path(path).resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # unreadable, or a symlink loop
        return True


def _row(
    run_id: str, run_path: str, key: FileKey, lookup: Lookup, root: Path, tables: TableCheck
) -> dict[str, Any]:
    """The ``runs`` row of one run directory (never raises on bad files).

    Every string is passed through :func:`safe_text`, so one run with an undecodable name
    or a lone surrogate in its manifest cannot fail the insert for every run. ``tables``
    checks the Parquet footers, remembering verdicts per schema across runs."""
    row = _read_row(run_id, run_path, key, lookup, root, tables)
    for name, value in row.items():
        if isinstance(value, str):
            row[name] = safe_text(value)
    return row


def _reduced(reduce: str, raw: Any, summary: Mapping[str, Any]) -> Any:
    """The value ``reduce`` (an :class:`IndexColumn`'s) makes of ``raw``."""
    if reduce == "count":
        return len(raw) if isinstance(raw, dict | list) else None
    if reduce == "last":
        return str(raw[-1])[:200] if isinstance(raw, list) and raw else None
    if reduce == "count_lost":
        if not isinstance(raw, list):
            return None
        return sum(1 for a in raw if isinstance(a, dict) and a.get("lost"))
    if reduce == "ns_to_s":
        return _ratio(raw, 1e9)
    if reduce in ("per_request", "per_completed"):
        counts = summary.get("counts")
        per = "requests" if reduce == "per_request" else "completed"
        return _ratio(raw, counts.get(per) if isinstance(counts, dict) else None)
    return raw


#: The data columns as :func:`_read_row` walks them: (name, read from the summary, path
#: split into keys, reduce, the type's :func:`_coerce`), all looked up once.
_READ_PLAN: tuple[tuple[str, bool, tuple[str, ...], str | None, Callable[[Any], Any]], ...] = tuple(
    (name, source == "summary", parts, reduce, _COERCE[sql_type])
    for name, sql_type, source, parts, reduce in _COLUMN_PLAN
)


def _read_row(
    run_id: str, run_path: str, key: FileKey, lookup: Lookup, root: Path, tables: TableCheck
) -> dict[str, Any]:
    from perfscope.profiler.store import manifest_problems, run_state, summary_problem

    row: dict[str, Any] = dict.fromkeys(ALL_COLUMN_NAMES)
    row.update(
        run_id=run_id,
        path=run_path,
        manifest_mtime_ns=key[0],
        manifest_size=key[1],
        summary_mtime_ns=key[2],
        summary_size=key[3],
        files_key=key[4],
        has_summary=False,
    )
    folder = os.path.basename(run_path)
    if safe_text(folder) != folder:
        # Listed (escaped) so it shows up; not read, since no tool downstream can open it.
        row["state"] = "broken"
        row["problem"] = "folder name is not valid UTF-8; rename the folder to read the run"
        return row
    # Strings, not Path objects: a first build makes these for every run.
    manifest_path = os.path.join(run_path, "manifest.json")
    summary_path = os.path.join(run_path, "summary.json")
    # A file linked out of the runs folder is never read (the dashboard serves this table).
    away = [os.path.basename(f) for f in (manifest_path, summary_path) if _outside(root, f)]
    if away:
        row["state"] = "broken"
        row["problem"] = f"{away[0]} points outside the runs directory; not read"
        return row
    manifest, m_problem = _read_json(manifest_path)
    summary, s_problem = _read_json(summary_path)
    row["has_summary"] = summary is not None
    problems = [p for p in (m_problem, s_problem) if p]
    if manifest is None:
        row["state"] = "broken"
        row["problem"] = m_problem or "manifest.json missing"
        return row
    # A summary.json that parses but is not perfscope's (another tool's file) reads as no
    # summary with the reason, as in `perfscope ls`; its values are not indexed.
    foreign = summary_problem(summary) if summary is not None else None
    if foreign is not None:
        summary = None
        row["has_summary"] = False
    values = summary or {}
    for name, in_summary, parts, reduce, coerce in _READ_PLAN:
        raw = lookup(values if in_summary else manifest, parts)
        if reduce is not None:
            raw = _reduced(reduce, raw, values)
        row[name] = None if raw is None else coerce(raw)
    if summary is not None and not row["slo_count"]:
        # Without SLOs every request "meets" them: no attainment, no goodput.
        row["attainment"] = row["goodput_req_s"] = None
    warnings = summary.get("warnings") if summary else None
    row["warnings"] = len(warnings) if isinstance(warnings, list) else 0
    # The run store's own reading of the state (crashed when the writer is gone), so the
    # index and `perfscope ls` never disagree.
    state = run_state(manifest)
    row["state"] = state.state
    row["problem"] = state.reason if state.state != "complete" else None
    if foreign is not None:
        row["problem"] = f"{row['problem']}; {foreign}" if row["problem"] else foreign
    # Tables whose columns are not the store's make the run unreadable (footers only).
    problems.extend(manifest_problems(manifest) + tables.problems(run_path))
    if problems:
        row["state"] = "broken"
        row["problem"] = "; ".join(problems)
    return row
