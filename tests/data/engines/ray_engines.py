"""Engines for the distributed (Ray) tests, importable as python:tests.data.engines.ray_engines."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

#: The request id at which :func:`dies_at` kills its own process (the Ray actor).
KILL_AT = 20


def steady(request_id: int, max_tokens: int) -> Iterator[int]:
    """First token after 20 ms, then one every 5 ms."""
    time.sleep(0.020)
    yield 1
    for _ in range(max_tokens - 1):
        time.sleep(0.005)
        yield 1


def dies_at(request_id: int, max_tokens: int) -> Iterator[int]:
    """Like :func:`steady`, but the process serving request ``KILL_AT`` dies (SIGKILL) at it."""
    if request_id == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    yield from steady(request_id, max_tokens)
