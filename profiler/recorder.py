"""The recorder: where engines report what happened, cheaply, on one clock.

Engines (or users of the manual API) get a :class:`RequestHandle` per request and call
``sent()`` once, ``tokens(n)`` per streamed chunk and ``finish()`` at the end; local engines
also call :meth:`Recorder.step` once per forward pass. The per-chunk path is a clock read
and four list appends; everything else happens after the run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import pyarrow as pa

from perfscope.profiler.clock import Clock
from perfscope.profiler.records import (
    CHUNK_SCHEMA,
    REQUEST_SCHEMA,
    STEP_SCHEMA,
    RequestRecord,
    RequestSpec,
    StepKind,
)

__all__ = ["LiveCounts", "Recorder", "RequestHandle"]


@dataclass(frozen=True)
class LiveCounts:
    """What a recorder holds so far, for a live progress view (cheap to take while the run
    goes on; times are seconds).

    Attributes:
        registered: requests submitted to the engine so far.
        completed: finished without an error.
        failed: finished with an error.
        in_flight: submitted and not finished.
        waiting: in flight without a first token yet (queued in the engine, or in prefill).
        output_tokens: output tokens received so far (all requests, warmup included).
        ttft_s: time to first token of every request that has one so far.
        itl_s: mean gap between tokens of each request with two tokens or more.
    """

    registered: int
    completed: int
    failed: int
    in_flight: int
    waiting: int
    output_tokens: int
    ttft_s: tuple[float, ...]
    itl_s: tuple[float, ...]


class RequestHandle:
    """Report the life of one request. Also a context manager (manual API):
    entering marks it sent, leaving finishes it (an exception is recorded as its error
    and re-raised)."""

    __slots__ = ("_append", "_idx", "_recorder", "record")

    def __init__(self, recorder: Recorder, record: RequestRecord) -> None:
        self._recorder = recorder
        self.record = record
        self._idx = 0
        self._append = recorder._chunks.append

    @property
    def request_id(self) -> int:
        return self.record.request_id

    @property
    def done(self) -> bool:
        """True once :meth:`finish` was called."""
        return self.record.request_id in self._recorder._finished

    def sent(self, t_ns: int | None = None) -> None:
        """Mark the moment the request reached the engine (default: now)."""
        self.record.t_sent = self._recorder.clock.now_ns() if t_ns is None else t_ns

    def tokens(self, n: int = 1, t_ns: int | None = None) -> None:
        """Record a chunk of ``n`` tokens that arrived now (or at ``t_ns``)."""
        t = self._recorder.clock.now_ns() if t_ns is None else t_ns
        rec = self.record
        if rec.t_first_token is None:
            rec.t_first_token = t
        rec.t_last_token = t
        rec.output_tokens += n
        # One tuple per chunk: a single list.append is atomic under the GIL, so chunks from
        # concurrent engine threads never interleave column-wise.
        self._append((rec.request_id, t, n, self._idx))
        self._idx += 1

    def set_prompt_tokens(self, n: int) -> None:
        """Correct the prompt length once the engine knows it exactly (e.g. server usage)."""
        self.record.prompt_tokens = n

    def set_output_tokens(self, n: int) -> None:
        """Override the output count with an authoritative one (e.g. server usage)."""
        self.record.output_tokens = n

    def finish(self, error: str | None = None) -> None:
        """Close the request; ``error`` (short text) marks it failed. Idempotent."""
        rec = self.record
        if rec.request_id in self._recorder._finished:
            return
        if rec.t_sent is None:
            rec.t_sent = self._recorder.clock.now_ns()
        if error is None and rec.t_first_token is None:
            error = "no tokens received"
        rec.error = error
        self._recorder._mark_finished(rec.request_id)

    def __enter__(self) -> RequestHandle:
        if self.record.t_sent is None:
            self.sent()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.finish()
        else:
            self.finish(error=_short_error(exc))


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text}"[:300] if text else name


class Recorder:
    """Collects requests, chunks and steps of one run, column-wise.

    Args:
        clock: the run's clock; every timestamp comes from it.
        on_finish: called (from the engine's thread) with the request id each time a
            request finishes; drivers use it for closed-loop arrivals and progress.
    """

    def __init__(self, clock: Clock, on_finish: Callable[[int], None] | None = None) -> None:
        self.clock = clock
        self._on_finish: list[Callable[[int], None]] = [on_finish] if on_finish else []
        self._lock = threading.Lock()
        self._requests: dict[int, RequestRecord] = {}
        self._finished: set[int] = set()
        self._chunks: list[tuple[int, int, int, int]] = []
        self._steps: list[tuple[Any, ...]] = []

    def add_finish_listener(self, fn: Callable[[int], None]) -> None:
        """Also call ``fn(request_id)`` whenever a request finishes."""
        self._on_finish.append(fn)

    def add_request(self, spec: RequestSpec, t_scheduled: int | None = None) -> RequestHandle:
        """Register a request; ``t_scheduled`` (default now) is when it was meant to arrive."""
        rec = RequestRecord(
            request_id=spec.request_id,
            prompt_tokens=spec.prompt_tokens,
            max_output_tokens=spec.max_output_tokens,
            t_scheduled=self.clock.now_ns() if t_scheduled is None else t_scheduled,
            is_warmup=spec.is_warmup,
        )
        with self._lock:
            if spec.request_id in self._requests:
                raise ValueError(f"request id {spec.request_id} registered twice")
            self._requests[spec.request_id] = rec
        return RequestHandle(self, rec)

    def _mark_finished(self, request_id: int) -> None:
        with self._lock:
            self._finished.add(request_id)
        for fn in self._on_finish:
            fn(request_id)

    def step(
        self,
        kind: StepKind,
        t_start_ns: int,
        t_end_ns: int,
        batch_size: int,
        new_tokens: int,
        context_tokens: int,
        request_ids: Sequence[int] = (),
    ) -> None:
        """Record one forward pass (times after device synchronisation)."""
        self._steps.append(
            (
                len(self._steps),
                kind,
                t_start_ns,
                t_end_ns,
                batch_size,
                new_tokens,
                context_tokens,
                list(request_ids),
            )
        )

    @property
    def n_steps(self) -> int:
        """Forward passes recorded so far (the next step's id)."""
        return len(self._steps)

    @property
    def n_requests(self) -> int:
        return len(self._requests)

    @property
    def n_finished(self) -> int:
        return len(self._finished)

    def fail_unfinished(self, reason: str) -> int:
        """Finish every open request with ``reason`` (run interrupted); returns how many."""
        open_ids = [rid for rid in self._requests if rid not in self._finished]
        for rid in open_ids:
            rec = self._requests[rid]
            rec.error = reason
            self._finished.add(rid)
        return len(open_ids)

    def live_counts(self) -> LiveCounts:
        """A snapshot for progress views (reads records an engine thread may be updating;
        each field is read once, so a value is at worst one chunk old)."""
        with self._lock:
            recs = list(self._requests.values())
            finished = set(self._finished)
        failed = sum(1 for r in recs if r.request_id in finished and r.error is not None)
        ttft, itl = [], []
        for r in recs:
            first, last, sent = r.t_first_token, r.t_last_token, r.t_sent
            if first is not None and sent is not None:
                ttft.append((first - sent) * 1e-9)
            if first is not None and last is not None and r.output_tokens > 1 and last > first:
                itl.append((last - first) * 1e-9 / (r.output_tokens - 1))
        return LiveCounts(
            registered=len(recs),
            completed=len(finished) - failed,
            failed=failed,
            in_flight=len(recs) - len(finished),
            waiting=sum(
                1 for r in recs if r.request_id not in finished and r.t_first_token is None
            ),
            output_tokens=sum(r.output_tokens for r in recs),
            ttft_s=tuple(ttft),
            itl_s=tuple(itl),
        )

    # --- export -------------------------------------------------------------------------

    def requests_table(self) -> pa.Table:
        recs = sorted(self._requests.values(), key=lambda r: r.request_id)
        cols: dict[str, list[Any]] = {name: [] for name in REQUEST_SCHEMA.names}
        for r in recs:
            for name in REQUEST_SCHEMA.names:
                cols[name].append(getattr(r, name))
        return pa.table(cols, schema=REQUEST_SCHEMA)

    def chunks_table(self) -> pa.Table:
        rows = list(self._chunks)  # snapshot: an engine thread may still be appending
        cols: list[list[Any]] = (
            [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in CHUNK_SCHEMA.names]
        )
        return pa.table(
            dict(zip(CHUNK_SCHEMA.names, cols, strict=True)),
            schema=CHUNK_SCHEMA,
        )

    def steps_table(self) -> pa.Table:
        rows = list(self._steps)
        cols: list[list[Any]] = (
            [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in STEP_SCHEMA.names]
        )
        return pa.table(
            dict(zip(STEP_SCHEMA.names, cols, strict=True)),
            schema=STEP_SCHEMA,
        )
