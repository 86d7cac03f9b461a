"""The run index for the CLI (``perfscope index``, ``query``, ``ls --where``).

The index itself lives in the store layer (:mod:`perfscope.profiler.run_index`) so the
dashboard can read it too; this module binds it to the metric catalogue's getter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from perfscope.analysis.catalogue import value_at
from perfscope.profiler import run_index as _core
from perfscope.profiler.run_index import (
    ALL_COLUMN_NAMES,
    BOOKKEEPING_DOCS,
    INDEX_COLUMNS,
    INDEX_FILE,
    IndexColumn,
    RefreshStats,
    RunIndex,
)

__all__ = [
    "ALL_COLUMN_NAMES",
    "BOOKKEEPING_DOCS",
    "INDEX_COLUMNS",
    "INDEX_FILE",
    "IndexColumn",
    "RefreshStats",
    "RunIndex",
    "open_index",
]


@contextmanager
def open_index(
    root: Path,
    *,
    refresh: bool = True,
    rebuild: bool = False,
    on_refresh: Callable[[RefreshStats], None] | None = None,
    allow_files: bool = False,
    newest: int | None = None,
) -> Iterator[RunIndex]:
    """:func:`perfscope.profiler.run_index.open_index` reading fields with ``value_at``;
    ``allow_files`` lets the SQL use DuckDB's file functions (off by default); ``newest``:
    only the N newest runs are read (plain ``perfscope ls``)."""
    with _core.open_index(
        root,
        lookup=value_at,
        refresh=refresh,
        rebuild=rebuild,
        on_refresh=on_refresh,
        allow_files=allow_files,
        newest=newest,
    ) as index:
        yield index
