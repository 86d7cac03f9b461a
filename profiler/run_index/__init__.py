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

One module per concern:

* :mod:`~perfscope.profiler.run_index.columns`: the column catalogue (what each column of
  ``runs`` holds, where it is read from, its unit);
* :mod:`~perfscope.profiler.run_index.rows`: one run folder read into one row;
* :mod:`~perfscope.profiler.run_index.scan`: the run folders a refresh must read (file
  stamps), and the worker processes a first build reads them in (``python -m
  perfscope.profiler.run_index``, this package's ``__main__``);
* :mod:`~perfscope.profiler.run_index.index`: :class:`RunIndex` and :func:`open_index`
  (the index file, refreshing it, answering SQL over it, locking the connection down).
"""

from __future__ import annotations

from perfscope.profiler.run_index.columns import _BOOKKEEPING as _BOOKKEEPING
from perfscope.profiler.run_index.columns import (
    ALL_COLUMN_NAMES,
    BOOKKEEPING_DOCS,
    COLUMN_UNITS,
    INDEX_COLUMNS,
    IndexColumn,
)
from perfscope.profiler.run_index.index import (
    INDEX_FILE,
    NewestRun,
    RefreshStats,
    RunIndex,
    open_index,
)
from perfscope.profiler.run_index.rows import Lookup

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
