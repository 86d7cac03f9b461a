"""Engines for the reliability tests: each logs when its requests end, to compare with disk.

``PERFSCOPE_TEST_LOG`` names a file; every request that completes appends
``<request_id> <time.time()>`` to it just before returning, so a test that kills the run can
tell which requests had ended, and when, from outside the profiler.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator


def _log(request_id: int) -> None:
    path = os.environ.get("PERFSCOPE_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{request_id} {time.time():.6f}\n")


def logged_stream(request_id: int, max_tokens: int) -> Iterator[int]:
    """``max_tokens`` single-token chunks, 10 ms apart; logs its end."""
    for _ in range(max_tokens):
        time.sleep(0.01)
        yield 1
    _log(request_id)


def hangs_on_odd(request_id: int, max_tokens: int) -> Iterator[int]:
    """Even requests stream normally; odd ones yield one token and then hang for an hour."""
    yield 1
    if request_id % 2:
        time.sleep(3600)
    for _ in range(max_tokens - 1):
        time.sleep(0.005)
        yield 1


def negative(max_tokens: int) -> Iterator[int]:
    yield 3
    yield -5


def absurd(max_tokens: int) -> Iterator[int]:
    yield 10**12


def fractional(max_tokens: int) -> Iterator[float]:
    yield 2.5


def returns_zero(max_tokens: int) -> int:
    return 0


def too_many(max_tokens: int) -> Iterator[int]:
    """Ten times more tokens than asked for (a count far beyond max_tokens)."""
    yield max_tokens * 10


def always_fails(request_id: int) -> Iterator[int]:
    raise ConnectionRefusedError("server refused the request")
    yield 0  # pragma: no cover - makes this a generator


def half_fail(request_id: int, max_tokens: int) -> Iterator[int]:
    if request_id % 2:
        raise ValueError("odd request rejected")
    yield max_tokens


def never_yields(max_tokens: int) -> Iterator[int]:
    return
    yield 0  # pragma: no cover


def burst(max_tokens: int) -> Iterator[int]:
    """Single-token chunks as fast as the recorder takes them (a pause every 8)."""
    for i in range(max_tokens):
        if i % 8 == 7:
            time.sleep(0.001)
        yield 1
