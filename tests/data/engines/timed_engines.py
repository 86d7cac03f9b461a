"""Engines with known timing, for ground-truth tests (importable as python:timed_engines:...)."""

from __future__ import annotations

import time
from collections.abc import Iterator

TTFT_S = 0.050
PER_TOKEN_S = 0.010

#: request_id -> perf_counter_ns at the generator's start, then at each yield: the
#: engine's own truth, so tests can separate perfscope's error from sleep overshoot.
TRUTH: dict[int, list[int]] = {}


def precise_sleep(seconds: float) -> None:
    """Sleep, then spin for the last 2 ms: the truth must be exact to well under 1 ms."""
    end = time.perf_counter() + seconds
    if seconds > 0.002:
        time.sleep(seconds - 0.002)
    while time.perf_counter() < end:
        pass


def single_tokens(request_id: int, max_tokens: int) -> Iterator[int]:
    """First token after 50 ms, then one token every 10 ms."""
    truth = TRUTH.setdefault(request_id, [time.perf_counter_ns()])
    precise_sleep(TTFT_S)
    truth.append(time.perf_counter_ns())
    yield 1
    for _ in range(max_tokens - 1):
        precise_sleep(PER_TOKEN_S)
        truth.append(time.perf_counter_ns())
        yield 1


def triple_chunks(request_id: int, max_tokens: int) -> Iterator[list[str]]:
    """First token after 50 ms, then chunks of 3 tokens every 30 ms (10 ms per token)."""
    truth = TRUTH.setdefault(request_id, [time.perf_counter_ns()])
    precise_sleep(TTFT_S)
    truth.append(time.perf_counter_ns())
    yield ["a"]
    sent = 1
    while sent < max_tokens:
        n = min(3, max_tokens - sent)
        precise_sleep(PER_TOKEN_S * n)
        truth.append(time.perf_counter_ns())
        yield ["t"] * n
        sent += n


def slow_stream(max_tokens: int) -> Iterator[int]:
    """A slow engine for interrupt tests: 20 ms per token."""
    for _ in range(max_tokens):
        time.sleep(0.02)
        yield 1


def flaky(request_id: int, max_tokens: int) -> Iterator[int]:
    """Every third request fails after its first token."""
    yield 1
    if request_id % 3 == 2:
        raise ConnectionResetError("server went away")
    for _ in range(max_tokens - 1):
        yield 1


def not_a_generator(prompt_tokens: int) -> object:
    return object()


#: How much slower :func:`slower_tokens` is than :func:`single_tokens`.
SLOWDOWN = 1.3


def slower_tokens(max_tokens: int) -> Iterator[int]:
    """:func:`single_tokens` made 30% slower (first token after 65 ms, then every 13 ms)."""
    precise_sleep(TTFT_S * SLOWDOWN)
    yield 1
    for _ in range(max_tokens - 1):
        precise_sleep(PER_TOKEN_S * SLOWDOWN)
        yield 1


def same_tokens(max_tokens: int) -> Iterator[int]:
    """The timing of :func:`single_tokens` under another name (an identical configuration)."""
    precise_sleep(TTFT_S)
    yield 1
    for _ in range(max_tokens - 1):
        precise_sleep(PER_TOKEN_S)
        yield 1
