"""A seeded rerun's TTFT against the previous run with the same prompts.

A run that asks for an exact repeat (``--seed`` without fresh prompts: ``workload.prompt_salt``
is None) sends the prompts an earlier run with the same workload sent, and a server with a
prefix cache may serve them from it. Whether that made TTFT lower is measured here, not
assumed: :func:`note_previous_run` finds the newest earlier run in the same runs folder with
the same engine URI, server model, workload (seed included) and load, reads its requests
(never writes to it), and compares its TTFT median with this run's. Each median carries its
distribution-free 95% interval (order statistics, binomial coverage); the medians differ when
the intervals do not overlap, which is a test at better than 95%. The result is recorded as
``engine.config.client.prompt_cache.previous_run`` (:class:`PreviousRun`), and the summary's
prefix-cache warning is worded from it, with both numbers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfscope.errors import PerfscopeError
from perfscope.profiler.records import Manifest
from perfscope.profiler.run_files import read_json_capped

__all__ = [
    "MAX_RUNS_SEARCHED",
    "PreviousRun",
    "find_previous_run",
    "median_interval",
    "note_previous_run",
    "ttft_seconds",
]

#: Newest runs of the folder whose manifests are read when looking for the previous run
#: (a folder of thousands of runs is not read in full at the end of every run).
MAX_RUNS_SEARCHED = 200
#: Coverage of each median's interval.
CONFIDENCE = 0.95


@dataclass(frozen=True)
class PreviousRun:
    """This run's TTFT median against the previous run's with the same prompts (seconds).

    Attributes:
        run_id: the previous run's directory name.
        started_at: its start (ISO 8601).
        ttft_p50_s: its TTFT median over its completed measured requests, seconds.
        ttft_p50_interval_s: the 95% interval of that median, seconds (None: under 6 requests).
        requests: its completed measured requests.
        this_ttft_p50_s, this_ttft_p50_interval_s, this_requests: the same for this run.
        verdict: ``lower`` / ``higher`` (this run's interval entirely below / above the
            previous one), ``no_change`` (they overlap) or ``unknown`` (an interval is missing).
    """

    run_id: str
    started_at: str
    ttft_p50_s: float
    ttft_p50_interval_s: tuple[float, float] | None
    requests: int
    this_ttft_p50_s: float
    this_ttft_p50_interval_s: tuple[float, float] | None
    this_requests: int
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("ttft_p50_interval_s", "this_ttft_p50_interval_s"):
            out[key] = list(out[key]) if out[key] is not None else None
        return out


def median_interval(
    values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """Distribution-free interval of the median: ``(x_(k), x_(n+1-k))`` of the sorted values,
    with the largest ``k`` whose binomial coverage is at least ``confidence`` (None when even
    ``(min, max)`` falls short: under 6 values at 95%)."""
    x = np.sort(np.asarray(values, dtype=float))
    n = int(x.size)
    alpha = 1.0 - confidence
    if n == 0 or 2.0 * 0.5**n > alpha:
        return None
    # Largest k with P(B <= k - 1) <= alpha / 2, B ~ Binomial(n, 1/2); pmf in log space.
    log_half_n = n * math.log(0.5)
    tail, k = 0.0, 0
    while True:
        pmf = math.exp(
            math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + log_half_n
        )
        if 2.0 * (tail + pmf) > alpha:
            break
        tail, k = tail + pmf, k + 1
    k = max(k, 1)
    return float(x[k - 1]), float(x[n - k])


def ttft_seconds(requests: pa.Table) -> np.ndarray:
    """TTFT (first token − sent, seconds) of the completed measured requests of a requests
    table: no error, a first token, at least one output token, not warm-up (the requests
    the summary's TTFT counts)."""
    ok = pc.and_(
        pc.and_(pc.is_null(requests["error"]), pc.is_valid(requests["t_first_token"])),
        pc.and_(
            pc.greater(requests["output_tokens"], 0),
            pc.invert(pc.fill_null(requests["is_warmup"], False)),
        ),
    )
    kept = requests.filter(ok)
    first = np.asarray(kept["t_first_token"].to_numpy(zero_copy_only=False), dtype=float)
    sent = np.asarray(kept["t_sent"].to_numpy(zero_copy_only=False), dtype=float)
    out: np.ndarray = (first - sent) * 1e-9
    return out


def _same_prompts(this: Manifest, other: dict[str, Any]) -> bool:
    """Whether ``other`` (a manifest's JSON) sent this run's prompts to the same server at the
    same load: same engine URI and server model, same workload (seed included, no salt), same
    load."""
    mine, theirs = this.engine, other.get("engine")
    if not isinstance(theirs, dict) or not isinstance(theirs.get("config"), dict):
        return False
    return bool(
        theirs.get("uri") == mine.get("uri")
        and theirs["config"].get("server_model") == (mine.get("config") or {}).get("server_model")
        and other.get("workload") == this.workload
        and other.get("load") == this.load
    )


def _started(text: Any) -> datetime | None:
    """A manifest's ``started_at`` (ISO 8601, UTC when it names no zone); None if unreadable."""
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def find_previous_run(
    run_dir: Path, manifest: Manifest
) -> tuple[tuple[Path, dict[str, Any]] | None, int]:
    """The newest complete run in ``run_dir``'s folder, started before this one, that sent the
    same prompts (:func:`_same_prompts`): its directory and manifest (None: none), and the
    number of run folders searched. Only the :data:`MAX_RUNS_SEARCHED` newest run folders (by
    name, which starts with the start time) are read; nothing is written."""
    start = _started(manifest.started_at)
    root = run_dir.parent
    try:
        names = sorted((e.name for e in os.scandir(root) if e.is_dir()), reverse=True)
    except OSError:
        return None, 0
    names = [n for n in names if n != run_dir.name and not n.startswith(".")]
    best: tuple[datetime, Path, dict[str, Any]] | None = None
    for name in names[:MAX_RUNS_SEARCHED]:
        path = root / name
        try:
            other = read_json_capped(path / "manifest.json")
        except (OSError, ValueError, PerfscopeError):  # not a run, or a broken one
            continue
        if not isinstance(other, dict) or other.get("status") != "complete":
            continue
        when = _started(other.get("started_at"))
        if when is None or (start is not None and when >= start):
            continue
        if not _same_prompts(manifest, other):
            continue
        if best is None or when > best[0]:
            best = (when, path, other)
    searched = min(len(names), MAX_RUNS_SEARCHED)
    return ((best[1], best[2]) if best is not None else None), searched


def _verdict(this: tuple[float, float] | None, prev: tuple[float, float] | None) -> str:
    if this is None or prev is None:
        return "unknown"
    if this[1] < prev[0]:
        return "lower"
    if this[0] > prev[1]:
        return "higher"
    return "no_change"


def compare_runs(
    run_id: str, started_at: str, previous: np.ndarray, this: np.ndarray
) -> PreviousRun | None:
    """This run's TTFTs (seconds) against the previous run's; None when either has none."""
    if previous.size == 0 or this.size == 0:
        return None
    prev_ci, this_ci = median_interval(previous), median_interval(this)
    return PreviousRun(
        run_id=run_id,
        started_at=started_at,
        ttft_p50_s=float(np.percentile(previous, 50)),
        ttft_p50_interval_s=prev_ci,
        requests=int(previous.size),
        this_ttft_p50_s=float(np.percentile(this, 50)),
        this_ttft_p50_interval_s=this_ci,
        this_requests=int(this.size),
        verdict=_verdict(this_ci, prev_ci),
    )


def note_previous_run(run_dir: Path, manifest: Manifest, requests: pa.Table) -> None:
    """For a run that repeats an earlier run's prompts (no prompt salt) on an ``openai:``
    engine, record in ``engine.config.client.prompt_cache`` how its TTFT median compares with
    the previous such run's (``previous_run``; None when there is none to compare with) and
    how many run folders were searched (``runs_searched``). Any other run is left as it is."""
    if manifest.workload.get("prompt_salt") is not None:
        return
    client = (manifest.engine.get("config") or {}).get("client")
    if not isinstance(client, dict) or not isinstance(client.get("prompt_cache"), dict):
        return
    cache: dict[str, Any] = client["prompt_cache"]
    found, searched = find_previous_run(run_dir, manifest)
    record: PreviousRun | None = None
    if found is not None:
        path, other = found
        try:
            previous = ttft_seconds(
                pq.read_table(
                    path / "requests.parquet",
                    columns=["t_sent", "t_first_token", "output_tokens", "error", "is_warmup"],
                )
            )
        except (OSError, ValueError, KeyError, pa.ArrowException):
            previous = np.zeros(0)
        record = compare_runs(
            path.name, str(other.get("started_at")), previous, ttft_seconds(requests)
        )
    cache["previous_run"] = record.to_dict() if record is not None else None
    cache["runs_searched"] = searched
