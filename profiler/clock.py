"""The one monotonic clock every perfscope record is stamped with.

All times in records are integer nanoseconds since the run's start, read from
``time.perf_counter_ns``. The wall-clock time of that start is kept so a run can be placed
in real time (manifest ``started_at``). Tests inject a :class:`ManualClock`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "MonotonicClock"]


@runtime_checkable
class Clock(Protocol):
    """Source of run-relative time in nanoseconds."""

    def now_ns(self) -> int:
        """Nanoseconds since the run's start (monotonic, never goes back)."""
        ...

    def sleep_until_ns(self, t_ns: int) -> None:
        """Block until ``now_ns() >= t_ns`` (returns at once if already past)."""
        ...

    @property
    def started_at(self) -> datetime:
        """Wall-clock (UTC) time at which ``now_ns()`` was 0."""
        ...


class MonotonicClock:
    """``time.perf_counter_ns`` shifted so that the run starts at 0.

    Args:
        origin_ns: the raw ``perf_counter_ns`` reading that maps to 0 (default: now); 0 keeps
            raw readings, as a distributed load actor does.
    """

    def __init__(self, origin_ns: int | None = None) -> None:
        self._origin_ns = time.perf_counter_ns() if origin_ns is None else origin_ns
        self._started_at = datetime.now(UTC)

    @property
    def origin_perf_counter_ns(self) -> int:
        """The raw ``perf_counter_ns`` value that maps to run time 0."""
        return self._origin_ns

    @property
    def started_at(self) -> datetime:
        return self._started_at

    def now_ns(self) -> int:
        return time.perf_counter_ns() - self._origin_ns

    def to_run_ns(self, perf_counter_ns: int) -> int:
        """Convert a raw ``perf_counter_ns`` reading (e.g. taken in another thread) to run time."""
        return perf_counter_ns - self._origin_ns

    def sleep_until_ns(self, t_ns: int) -> None:
        # Coarse sleep, then a short spin: time.sleep overshoots by ~50-100 us on Linux,
        # which would show up as driver lag on tightly spaced arrivals.
        while True:
            remaining = t_ns - self.now_ns()
            if remaining <= 0:
                return
            if remaining > 2_000_000:
                time.sleep((remaining - 1_000_000) / 1e9)
            elif remaining > 200_000:
                time.sleep(0)
            # else spin


class ManualClock:
    """A clock that only moves when told to; for tests of timing logic."""

    def __init__(self, start_ns: int = 0) -> None:
        self._t = start_ns
        self._started_at = datetime(2026, 1, 1, tzinfo=UTC)

    @property
    def started_at(self) -> datetime:
        return self._started_at

    def now_ns(self) -> int:
        return self._t

    def advance_ns(self, dt_ns: int) -> None:
        """Move time forward by ``dt_ns`` nanoseconds."""
        if dt_ns < 0:
            raise ValueError("a clock cannot go backwards")
        self._t += dt_ns

    def sleep_until_ns(self, t_ns: int) -> None:
        self._t = max(self._t, t_ns)
