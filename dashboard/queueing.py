"""How much of TTFT is queueing: the wait before a request's first forward pass.

In batch mode every request arrives at once, so most of its TTFT is the time it waited for a
slot in the batch, not prefill. A request's queue time is the start of the first forward
pass that included it (``steps.parquet``'s ``request_ids``) minus when it was scheduled
(``requests.parquet``'s ``t_scheduled``), in seconds; engines that record no steps (HTTP
servers) give none, and the caveat then says the queueing happens inside the server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from perfscope.analysis.run_records import RunRecords

__all__ = ["Queueing", "batch_queueing", "queueing_line"]

_NA = pd.NA
_STEP_COLUMNS = ("t_start", "request_ids")
_REQUEST_COLUMNS = ("request_id", "t_scheduled", "t_first_token", "is_warmup")


@dataclass(frozen=True)
class Queueing:
    """Queue time of the measured requests (seconds): median and p90 of the wait before their
    first forward pass, the median TTFT over the same requests, and how many had both."""

    count: int
    queue_p50_s: float
    queue_p90_s: float
    ttft_p50_s: float

    @property
    def share(self) -> float:
        """Median queue time as a share of median TTFT (0–1)."""
        return self.queue_p50_s / self.ttft_p50_s if self.ttft_p50_s > 0 else 0.0


def _tables(run: RunRecords | Path) -> tuple[dict[str, list[Any]], dict[str, list[Any]]] | None:
    """The step and request columns the queue time needs: from the run's tables when it is
    already in memory (no second read of the directory), else read from ``run``'s Parquet
    files."""
    if not isinstance(run, Path):
        steps, reqs = run.steps, run.requests
        if not set(_STEP_COLUMNS) <= set(steps.columns) or not set(_REQUEST_COLUMNS) <= set(
            reqs.columns
        ):
            return None
        return (
            {c: steps[c].tolist() for c in _STEP_COLUMNS},
            {c: reqs[c].tolist() for c in _REQUEST_COLUMNS},
        )
    import pyarrow.parquet as pq

    steps_path, req_path = run / "steps.parquet", run / "requests.parquet"
    if not steps_path.is_file() or not req_path.is_file():
        return None
    try:
        return (
            pq.read_table(steps_path, columns=list(_STEP_COLUMNS)).to_pydict(),
            pq.read_table(req_path, columns=list(_REQUEST_COLUMNS)).to_pydict(),
        )
    except (OSError, ValueError, KeyError):
        return None


def batch_queueing(run: RunRecords | Path) -> Queueing | None:
    """Queue times of a run's measured requests, or None without step records.

    ``run`` is the run as read (a ``StoredRun``: its tables are used as they are) or its
    directory (two columns of two tables are read)."""
    tables = _tables(run)
    if tables is None:
        return None
    steps, reqs = tables
    first_step: dict[int, int] = {}
    for t_start, ids in zip(steps["t_start"], steps["request_ids"], strict=True):
        for rid in [] if ids is None else ids:
            if rid not in first_step or t_start < first_step[rid]:
                first_step[rid] = t_start
    queue, ttft = [], []
    for rid, t_sched, t_first, warm in zip(
        reqs["request_id"],
        reqs["t_scheduled"],
        reqs["t_first_token"],
        reqs["is_warmup"],
        strict=True,
    ):
        if warm or _missing(t_first) or rid not in first_step:
            continue
        queue.append(max(0, first_step[rid] - t_sched) / 1e9)
        ttft.append((t_first - t_sched) / 1e9)
    if not queue:
        return None
    import numpy as np

    return Queueing(
        count=len(queue),
        queue_p50_s=float(np.percentile(queue, 50)),
        queue_p90_s=float(np.percentile(queue, 90)),
        ttft_p50_s=float(np.percentile(ttft, 50)),
    )


def _missing(value: object) -> bool:
    """None, or the NaN/NA a pandas column holds for a missing first token."""
    return value is None or value is _NA or (isinstance(value, float) and math.isnan(value))


def queueing_line(mode: str | None, run: RunRecords | Path | None) -> str | None:
    """The caveat a batch-mode run's TTFT needs (None for other modes), e.g. ``TTFT includes
    queueing (batch mode: all requests arrive at once): queue p50 31.2 s of TTFT p50 31.6 s``."""
    from perfscope.analysis.catalogue import format_seconds

    if mode != "batch":
        return None
    head = "TTFT includes queueing (batch mode: every request arrives at once and waits for a slot)"
    q = batch_queueing(run) if run is not None else None
    if q is None:
        return f"{head}; the wait is inside the engine and not measured separately"
    return (
        f"{head}: queue p50 {format_seconds(q.queue_p50_s)} (p90 "
        f"{format_seconds(q.queue_p90_s)}) of TTFT p50 {format_seconds(q.ttft_p50_s)}, "
        f"{100 * q.share:.0f}%; use --rate or --concurrency for TTFT without the queue"
    )
