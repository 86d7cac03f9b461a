"""A DuckDB index over a runs folder: one row per run, refreshed incrementally.

Teams that gate every commit on performance keep thousands of runs; listing them by reading
every ``manifest.json`` and ``summary.json`` takes seconds. The index keeps the fields people
filter and sort on (identity, state, engine, workload, the headline metrics) in one table named
``runs`` inside ``<runs root>/.perfscope-index.duckdb``, so ``perfscope query "SQL"`` and
``perfscope ls --where ...`` answer in milliseconds.

This package is the store layer's, so the front door (``perfscope index``, ``query``, ``ls
--where``) and the dashboard's runs list share it. It imports only the run store and
:mod:`perfscope.errors`; the caller passes the dotted-path reader (``lookup``), which is the
metric catalogue's :func:`~perfscope.analysis.catalogue.value_at` everywhere, so the summary
is read through the one getter.
"""

from __future__ import annotations

from perfscope.profiler.run_index.index import _BOOKKEEPING as _BOOKKEEPING
from perfscope.profiler.run_index.index import (
    ALL_COLUMN_NAMES,
    BOOKKEEPING_DOCS,
    COLUMN_UNITS,
    INDEX_COLUMNS,
    INDEX_FILE,
    IndexColumn,
    Lookup,
    NewestRun,
    RefreshStats,
    RunIndex,
    open_index,
)

__all__ = [
    "ALL_COLUMN_NAMES",
    "BOOKKEEPING_DOCS",
    "COLUMN_UNITS",
    "INDEX_COLUMNS",
    "INDEX_FILE",
    "IndexColumn",
    "Lookup",
    "NewestRun",
    "RefreshStats",
    "RunIndex",
    "open_index",
]
