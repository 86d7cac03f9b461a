"""Engines for the distributed (Ray) tests, importable as python:tests.data.engines.ray_engines."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import time
from collections.abc import Callable, Iterator

#: The request id at which :func:`dies_at` kills its own process (the Ray actor).
KILL_AT = 20


def steady(request_id: int, max_tokens: int) -> Iterator[int]:
    """First token after 20 ms, then one every 5 ms."""
    time.sleep(0.020)
    yield 1
    for _ in range(max_tokens - 1):
        time.sleep(0.005)
        yield 1


#: Where :func:`dies_at` notes each request it finished and its kill, when set (lines
#: ``ID T`` and ``kill T``, ``T`` the machine's monotonic clock in s): the truth of what a
#: killed actor had finished, and when.
FINISH_LOG_ENV = "PERFSCOPE_TEST_FINISH_LOG"


def _note(text: str) -> None:
    log = os.environ.get(FINISH_LOG_ENV)
    if log:
        with open(log, "a", encoding="ascii") as f:
            f.write(f"{text} {time.monotonic()}\n")


def dies_at(request_id: int, max_tokens: int) -> Iterator[int]:
    """Like :func:`steady`, but the process serving request ``KILL_AT`` dies (SIGKILL) at it."""
    if request_id == KILL_AT:
        _note("kill")
        os.kill(os.getpid(), signal.SIGKILL)
    yield from steady(request_id, max_tokens)
    _note(str(request_id))


def _gil_holding_sleep() -> Callable[[int], object]:
    """libc ``usleep`` called through ``ctypes.PyDLL``, which keeps the GIL held during the
    call: the process's other threads (the actor's event-loop lag probe among them) stall,
    as they do behind a C extension that never releases the GIL."""
    libc = ctypes.PyDLL(ctypes.util.find_library("c"))
    usleep: Callable[[int], object] = libc.usleep
    return usleep


#: How long each token of an even-numbered request holds the GIL (s).
HOG_S = 0.05
#: The gap between tokens of the other requests (s).
CALM_GAP_S = 0.2


def gil_hog_on_even(request_id: int, max_tokens: int) -> Iterator[int]:
    """Even-numbered requests (load actor 0's share of a 2-actor run) hold the GIL for
    :data:`HOG_S` before each token; the others sleep :data:`CALM_GAP_S` between tokens."""
    usleep = _gil_holding_sleep()
    for _ in range(max_tokens):
        if request_id % 2 == 0:
            usleep(int(HOG_S * 1e6))
        else:
            time.sleep(CALM_GAP_S)
        yield 1
