"""Scripted NVML for the Ray worker processes of the distributed tests.

``ray.init(runtime_env={"worker_process_setup_hook": "tests.data.ray_fake_nvml.install"})``
runs :func:`install` in every worker before it serves anything, so a telemetry agent there
samples one scripted GPU through the real ``pynvml`` binding layer (as the in-process tests
do with ``FakeNvml.install(monkeypatch)``): the machine has no GPU.

The GPU draws :data:`POWER_W` constantly (its energy counter is the exact integral), and its
temperature reads the worker's own raw ``perf_counter_ns`` at the moment of the sample, so a
test can compare each merged row's aligned time with the node's own clock.
"""

from __future__ import annotations

import time
from typing import Any

#: The scripted GPU's constant power draw (W).
POWER_W = 300.0


class _Setattr:
    """What ``FakeNvml.install`` needs of pytest's monkeypatch, for a process with no test."""

    def setattr(self, target: Any, name: str, value: Any) -> None:
        setattr(target, name, value)


def install() -> None:
    from perfscope.profiler.telemetry.testing import FakeGpu, FakeNvml, PowerSchedule

    schedule = PowerSchedule([(0, POWER_W)])
    gpu = FakeGpu(
        power_w=schedule.power_w,
        energy_mj=schedule.energy_mj,
        temp_c=lambda t: float(t),
        unsupported={"gpm"},
    )
    # now_ns: this worker's raw perf_counter_ns, the clock its telemetry agent stamps with.
    FakeNvml([gpu], time.perf_counter_ns).install(_Setattr())
