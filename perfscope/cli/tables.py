"""Rows of SQL results as a terminal table: ``perfscope query`` and ``perfscope ls --where``.

The same :class:`~perfscope.dashboard.terminal.FitTable` as every other command's table (it
never cuts a cell and stacks the rows when the terminal is too narrow), with

- each column's values in the unit the metric catalogue gives its name (``ttft_p50_s`` in
  ``ms``/``s``, ``output_tok_s`` in ``tok/s``, ``decode_mfu`` in ``%``), never raw SI floats
  or exponent notation;
- run ids shortened, as git shortens hashes, to the shortest end of the id that no other
  run in the folder shares (``77ea``, else ``online-77ea``, ...): every command that takes a
  run id takes it back (:func:`perfscope.profiler.store.resolve_run_path` matches a unique
  start or end of an id);
- times to the second (``2026-12-05 23:08:37``).

``--json`` keeps the full ids and raw SI values.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from perfscope.analysis.catalogue import format_number, format_value, kind_of, unit_of
from perfscope.cli.safe import safe_markup
from perfscope.dashboard.terminal import FitTable
from perfscope.units import Kind

__all__ = ["column_format", "folder_run_ids", "index_rows_table", "rows_table", "short_run_ids"]

#: Columns shown as run ids (and shortened).
RUN_ID_COLUMNS = frozenset({"run_id"})
#: The shortest end of an id that is shown: git's four characters.
MIN_SHORT = 4
#: Headers of ``ls --where``'s index columns: the words plain ``perfscope ls`` uses
#: (:func:`perfscope.cli.runs_list.runs_table`), so both listings read alike.
LISTING_HEADERS: Mapping[str, str] = {
    "run_id": "run",
    "state": "status",
    "engine_kind": "engine",
    "ttft_p50_s": "TTFT p50",
    "tpot_p50_s": "TPOT p50",
    "output_tok_s": "output tok/s",
    "attainment": "SLO met",
    "problem": "reason",
}


def folder_run_ids(root: Path) -> list[str]:
    """Names of the folders under the runs folder ``root`` (the ids a short id must not
    share its start or end with); empty when it cannot be read."""
    try:
        with os.scandir(root) as it:
            return [e.name for e in it if not e.name.startswith(".")]
    except OSError:
        return []


def short_run_ids(ids: Sequence[str], universe: Iterable[str]) -> list[str]:
    """Each id cut to its shortest end that starts after a ``-`` (or is the whole id), is at
    least :data:`MIN_SHORT` characters long and names that id alone among ``ids`` and
    ``universe``: no other id starts or ends with it (the rule by which run ids are
    resolved, so the short id can be given back to ``show``, ``compare``, ``report``)."""
    tails = {
        rid: [rid[i + 1 :] for i, ch in enumerate(rid) if ch == "-" and len(rid) - i > MIN_SHORT]
        for rid in ids
    }
    # How many ids start and end with each candidate: a few slices per id instead of a scan
    # of every id per candidate (10,000 listed against 10,000 would be 10^8 comparisons).
    candidates = {t for ts in tails.values() for t in ts}
    lengths = {len(t) for t in candidates}
    starts: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    for o in set(universe) | set(ids):
        for n in lengths:
            if (head := o[:n]) in candidates:
                starts[head] += 1
            if (end := o[-n:]) in candidates:
                ends[end] += 1
    out = []
    for rid in ids:
        short = rid
        for tail in reversed(tails[rid]):  # shortest end first
            # rid itself ends with tail (and may start with it): no other id may do either
            if ends[tail] == 1 and starts[tail] == int(rid.startswith(tail)):
                short = tail
                break
        out.append(short)
    return out


def column_format(name: str, kinds: Mapping[str, str] | None = None) -> tuple[Kind | None, str]:
    """The unit kind and rate noun of a result column: from ``kinds`` (the index column's
    summary path, when the caller knows it), else read from the name by the catalogue."""
    path = (kinds or {}).get(name, "")
    kind = (kind_of(path) if path else None) or kind_of(name)
    unit = (unit_of(path) if path else "") or unit_of(name)
    return kind, unit


def _cell(value: Any, kind: Kind | None, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, _dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, int | float) and kind is not None:
        return format_value(value, kind, unit=unit)
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, int):
        return str(value)
    return safe_markup(value)  # run names, errors, model ids: inert text


def rows_table(
    names: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    universe: Iterable[str] | None = None,
    kinds: Mapping[str, str] | None = None,
    drop_empty: bool = False,
    headers: Mapping[str, str] | None = None,
) -> FitTable:
    """``rows`` under the headers ``names`` (or their ``headers`` entry): values in their
    catalogue units, run ids shortened against ``universe`` (the runs folder's ids; ``None``
    keeps them whole), prose-like text columns (``problem``, ``last_error``, ``meaning``)
    wrapping.

    ``kinds`` maps a column name to the summary path its values come from (the run index's
    columns), for the unit where the name alone does not say it (``decode_mfu``).
    ``drop_empty`` leaves out the columns no row has a value in (named in the caption), for
    listings whose columns were not chosen by the user."""
    empty: list[str] = []
    if drop_empty and rows:
        keep = [i for i in range(len(names)) if any(r[i] is not None for r in rows)]
        empty = [n for i, n in enumerate(names) if i not in keep]
        names = [names[i] for i in keep]
        rows = [[r[i] for i in keep] for r in rows]
    formats = [column_format(n, kinds) for n in names]
    short: dict[int, list[str]] = {}
    if universe is not None:
        pool = list(universe)
        for i, n in enumerate(names):
            if n in RUN_ID_COLUMNS:
                ids = [str(r[i]) for r in rows if r[i] is not None]
                short[i] = short_run_ids(ids, pool)
    numeric = {
        n
        for i, n in enumerate(names)
        if rows
        and all(
            (isinstance(r[i], int | float) and not isinstance(r[i], bool)) or r[i] is None
            for r in rows
        )
    }
    wrap = {n for n in names if n in ("problem", "last_error", "meaning", "reason")}
    shown = {n: (headers or {}).get(n, n) for n in names}
    t = FitTable(
        tuple(shown[n] for n in names),
        right=frozenset(shown[n] for n in numeric),
        wrap=frozenset(shown[n] for n in wrap),
    )
    seen = dict.fromkeys(short, 0)
    for r in rows:
        cells = []
        for i, v in enumerate(r):
            if i in short and v is not None:
                cells.append(safe_markup(short[i][seen[i]]))
                seen[i] += 1
            else:
                cells.append(_cell(v, *formats[i]))
        t.add_row(*cells)
    cut = any(
        len(s) < len(str(v))
        for i in short
        for s, v in zip(short[i], [r[i] for r in rows if r[i] is not None], strict=True)
    )
    notes = []
    if cut:
        notes.append(
            "run ids shortened to the end no other run shares (perfscope show ID takes it; "
            "--json prints them whole)"
        )
    if empty:
        notes.append(f"no value in any row: {', '.join((headers or {}).get(n, n) for n in empty)}")
    t.caption = "\n".join(notes) or None
    return t


def index_rows_table(
    names: Sequence[str],
    rows: Sequence[Sequence[Any]],
    root: Path | None,
    *,
    listing: bool = False,
) -> FitTable:
    """:func:`rows_table` of a run-index answer: units from the index columns' summary paths,
    run ids shortened against the runs folder ``root`` (kept whole when ``root`` is None).
    ``listing``: perfscope's own listing (``ls --where``), not the user's SQL: the headers
    plain ``ls`` uses and no column without a value."""
    from perfscope.profiler.run_index import INDEX_COLUMNS

    # A reduced column (a count, a per-request mean) is not in its path's unit; only the
    # columns that store the value itself take the unit of their path.
    kinds = {c.name: c.path for c in INDEX_COLUMNS if c.reduce is None}
    universe = folder_run_ids(root) if root is not None else None
    return rows_table(
        names,
        rows,
        universe=universe,
        kinds=kinds,
        drop_empty=listing,
        headers=LISTING_HEADERS if listing else None,
    )
