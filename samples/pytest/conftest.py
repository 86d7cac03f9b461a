"""Setup shared by the sample perf suite.

PyTorch runs on one intra-op thread here (``PERFSCOPE_SAMPLE_THREADS`` to change it): on
a CPU runner shared with other jobs, threads that spin-wait for each other make the same
forward pass take 1 ms or 70 ms depending on the neighbours, and no gate survives that.

``PERFSCOPE_SAMPLE_SLOWDOWN_MS=N`` makes every forward pass of the reference model N
milliseconds slower, as a slower kernel would. It shows what a regression looks like::

    pytest samples/pytest --perfscope-save main
    PERFSCOPE_SAMPLE_SLOWDOWN_MS=5 pytest samples/pytest --perfscope-compare main
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from perfscope.profiler.engines.reference import ReferenceModel


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("PERFSCOPE_SAMPLE_THREADS", "1")))
    yield
    torch.set_num_threads(before)


def _slowed(method: Callable[..., Any], delay_s: float) -> Callable[..., Any]:
    @functools.wraps(method)
    def slow(*args: Any, **kwargs: Any) -> Any:
        out = method(*args, **kwargs)
        time.sleep(delay_s)
        return out

    return slow


@pytest.fixture(autouse=True)
def _injected_slowdown(monkeypatch: pytest.MonkeyPatch) -> None:
    delay_ms = float(os.environ.get("PERFSCOPE_SAMPLE_SLOWDOWN_MS", "0"))
    if delay_ms > 0:
        for name in ("prefill", "decode"):
            method = getattr(ReferenceModel, name)
            monkeypatch.setattr(ReferenceModel, name, _slowed(method, delay_ms / 1e3))
