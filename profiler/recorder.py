"""The recorder: where engines report what happened, cheaply, on one clock.

Engines (or users of the manual API) get a :class:`RequestHandle` per request and call
``sent()`` once, ``tokens(n)`` per streamed chunk and ``finish()`` at the end; local engines
also call :meth:`Recorder.step` once per forward pass. The per-chunk path is a clock read
and four list appends; everything else happens after the run or on the segment flusher's
thread (:mod:`perfscope.profiler.segments`), which reads the append-only lists below by
position while the engine keeps appending.

Counts are checked once per request, in :meth:`RequestHandle.finish` (never per chunk): a
negative total, or one beyond :data:`MAX_PLAUSIBLE_TOKENS`, fails the request; a total far
beyond the request's ``max_output_tokens`` is kept and counted in :attr:`Recorder.warnings`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import pyarrow as pa

from perfscope.profiler.arrow_safe import safe_table
from perfscope.profiler.clock import Clock
from perfscope.profiler.records import (
    CHUNK_SCHEMA,
    REQUEST_TABLE_SCHEMA,
    STEP_TABLE_SCHEMA,
    RequestRecord,
    RequestSpec,
    StepKind,
)
from perfscope.profiler.redact import redact_text

__all__ = ["MAX_PLAUSIBLE_TOKENS", "LiveCounts", "Recorder", "RequestHandle", "RequestRow"]

#: More output tokens than this in one request is a counting bug, not a measurement.
MAX_PLAUSIBLE_TOKENS = 100_000_000

#: One request as the segment files store it: REQUEST_TABLE_SCHEMA's columns in order.
RequestRow = tuple[Any, ...]


def _discard(_row: tuple[int, int, int, int]) -> None:
    """Where chunks of a request that already timed out go."""


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

    __slots__ = ("__weakref__", "_append", "_idx", "_recorder", "record")

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
        recorder = self._recorder
        if rec.request_id in recorder._finished:
            return
        if rec.t_sent is None:
            rec.t_sent = recorder.clock.now_ns()
        if error is None:
            error = recorder._check_counts(rec)
        elif not error.strip():
            error = "failed (the engine gave no reason)"
        else:
            error = redact_text(error)
        rec.error = error
        recorder._mark_finished(rec.request_id)

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


_REQUEST_FIELDS = tuple(REQUEST_TABLE_SCHEMA.names)


def _row(rec: RequestRecord) -> RequestRow:
    return tuple(getattr(rec, name) for name in _REQUEST_FIELDS)


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
        # Append-only, for the segment flusher: request ids in registration and in finish order.
        self._registered: list[int] = []
        self._finish_order: list[int] = []
        # Weak: a handle points at its recorder, so a strong map would make every open
        # request a reference cycle that keeps old recorders (and their chunks) for the GC.
        self._handles: weakref.WeakValueDictionary[int, RequestHandle] = (
            weakref.WeakValueDictionary()
        )
        #: Conditions worth a warning in the manifest (e.g. counts beyond max_tokens), each
        #: with how many requests showed it.
        self.warnings: dict[str, int] = {}

    def add_finish_listener(self, fn: Callable[[int], None]) -> None:
        """Also call ``fn(request_id)`` whenever a request finishes."""
        self._on_finish.append(fn)

    def add_request(
        self,
        spec: RequestSpec,
        t_scheduled: int | None = None,
        *,
        actor: int | None = None,
        host: str | None = None,
    ) -> RequestHandle:
        """Register a request; ``t_scheduled`` (default now) is when it was meant to arrive.

        ``actor`` and ``host``: the ``--ray`` load actor that served it and that actor's
        host (set here, before the segment flusher can see the row, so even a request's
        first, unfinished row carries them)."""
        rec = RequestRecord(
            request_id=spec.request_id,
            prompt_tokens=spec.prompt_tokens,
            max_output_tokens=spec.max_output_tokens,
            t_scheduled=self.clock.now_ns() if t_scheduled is None else t_scheduled,
            is_warmup=spec.is_warmup,
            actor=actor,
            host=host,
        )
        with self._lock:
            if spec.request_id in self._requests:
                raise ValueError(f"request id {spec.request_id} registered twice")
            self._requests[spec.request_id] = rec
            handle = RequestHandle(self, rec)
            self._handles[spec.request_id] = handle
            self._registered.append(spec.request_id)
        return handle

    def _mark_finished(self, request_id: int) -> None:
        with self._lock:
            if request_id in self._finished:
                return
            self._finished.add(request_id)
            self._finish_order.append(request_id)
            self._handles.pop(request_id, None)
        for fn in self._on_finish:
            fn(request_id)

    def _check_counts(self, rec: RequestRecord) -> str | None:
        """The error of a request that ended without one, or None (once per request)."""
        n = rec.output_tokens
        if rec.t_first_token is None:
            return "no tokens received"
        if not isinstance(n, int) or isinstance(n, bool):
            return f"token count is not an integer ({n!r}); the engine reported a bad count"
        if n < 0:
            return f"negative token count ({n}); the engine reported a bad count"
        if n > MAX_PLAUSIBLE_TOKENS:
            return (
                f"implausible token count ({n:,} > {MAX_PLAUSIBLE_TOKENS:,}); the engine "
                "reported a bad count"
            )
        if n > 2 * rec.max_output_tokens + 16:
            key = "requests reported far more output tokens than their max_tokens"
            with self._lock:
                self.warnings[key] = self.warnings.get(key, 0) + 1
        return None

    def expire(self, request_id: int, error: str) -> bool:
        """Fail an open request now (a timeout) and ignore whatever its engine reports
        later; returns False if it had already finished. Safe from any thread."""
        with self._lock:
            handle = self._handles.get(request_id)
        if handle is None or request_id in self._finished:
            return False
        real = handle.record
        # Later tokens() calls of the still-running engine land on a throwaway record.
        handle.record = RequestRecord(
            request_id=real.request_id,
            prompt_tokens=real.prompt_tokens,
            max_output_tokens=real.max_output_tokens,
            t_scheduled=real.t_scheduled,
        )
        handle._append = _discard
        if real.t_sent is None:
            real.t_sent = self.clock.now_ns()
        real.error = error
        self._mark_finished(request_id)
        return True

    def open_requests(self) -> list[RequestRecord]:
        """Requests registered and not yet finished (a snapshot)."""
        with self._lock:
            return [h.record for h in list(self._handles.values())]

    # --- incremental reads (the segment flusher) -----------------------------------------

    def chunk_rows(self, start: int) -> list[tuple[int, int, int, int]]:
        """Chunks recorded from position ``start`` on (a copy; engines keep appending)."""
        return self._chunks[start:]

    def step_rows(self, start: int) -> list[tuple[Any, ...]]:
        """Steps recorded from position ``start`` on."""
        return self._steps[start:]

    def request_rows(
        self, registered_from: int, finished_from: int
    ) -> tuple[list[RequestRow], list[RequestRow], int, int]:
        """Rows of requests registered since ``registered_from`` (as they are now, not
        final) and finished since ``finished_from`` (final), with the new positions."""
        with self._lock:
            reg = self._registered[registered_from:]
            fin = self._finish_order[finished_from:]
            recs = self._requests
            new_rows = [_row(recs[i]) for i in reg]
            fin_rows = [_row(recs[i]) for i in fin]
        return new_rows, fin_rows, registered_from + len(reg), finished_from + len(fin)

    def step(
        self,
        kind: StepKind,
        t_start_ns: int,
        t_end_ns: int,
        batch_size: int,
        new_tokens: int,
        context_tokens: int,
        request_ids: Sequence[int] = (),
        *,
        role: str | None = None,
        proposed_tokens: int | None = None,
        accepted_tokens: int | None = None,
    ) -> None:
        """Record one forward pass (times after device synchronisation).

        ``role="draft"`` marks a draft model's pass; ``proposed_tokens`` and
        ``accepted_tokens`` go on a speculative verify step (see
        :data:`~perfscope.profiler.records.STEP_OPTIONAL_SCHEMA`).
        """
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
                role,
                proposed_tokens,
                accepted_tokens,
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
        with self._lock:
            open_ids = [rid for rid in self._requests if rid not in self._finished]
            for rid in open_ids:
                rec = self._requests[rid]
                rec.error = reason
                self._finished.add(rid)
                self._finish_order.append(rid)
                self._handles.pop(rid, None)
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
        cols: dict[str, list[Any]] = {name: [] for name in REQUEST_TABLE_SCHEMA.names}
        for r in recs:
            for name in REQUEST_TABLE_SCHEMA.names:
                cols[name].append(getattr(r, name))
        return safe_table(cols, REQUEST_TABLE_SCHEMA)  # an impossible count keeps its row

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
            [list(c) for c in zip(*rows, strict=True)]
            if rows
            else [[] for _ in STEP_TABLE_SCHEMA.names]
        )
        return pa.table(
            dict(zip(STEP_TABLE_SCHEMA.names, cols, strict=True)),
            schema=STEP_TABLE_SCHEMA,
        )
