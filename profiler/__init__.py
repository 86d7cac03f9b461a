"""Capture: clock, records, recorder, engines, workloads and drivers, telemetry, run store.

The names below are the profiler's public surface (for writing an engine adapter, driving
capture by hand or reading a stored run); the submodules hold the rest. They load on first
use, so ``import perfscope.profiler`` costs nothing (no torch, pandas or pyarrow).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "Clock",
    "Engine",
    "EngineInfo",
    "EngineOptions",
    "Inbox",
    "LengthDist",
    "LoadConfig",
    "ManualClock",
    "MonotonicClock",
    "PerRequestEngine",
    "Recorder",
    "RequestHandle",
    "RequestRecord",
    "RequestSpec",
    "StoredRun",
    "Submission",
    "TelemetryConfig",
    "WorkloadConfig",
    "create_engine",
    "default_runs_root",
    "list_runs",
    "read_run",
    "register_engine",
]

if TYPE_CHECKING:
    from perfscope.profiler.clock import Clock, ManualClock, MonotonicClock
    from perfscope.profiler.driver import LoadConfig
    from perfscope.profiler.engines.base import (
        Engine,
        EngineInfo,
        EngineOptions,
        Inbox,
        PerRequestEngine,
        Submission,
        create_engine,
        register_engine,
    )
    from perfscope.profiler.recorder import Recorder, RequestHandle
    from perfscope.profiler.records import RequestRecord, RequestSpec
    from perfscope.profiler.store import StoredRun, default_runs_root, list_runs, read_run
    from perfscope.profiler.telemetry import TelemetryConfig
    from perfscope.profiler.workload import LengthDist, WorkloadConfig

_HOME = {
    **dict.fromkeys(("Clock", "ManualClock", "MonotonicClock"), "clock"),
    "LoadConfig": "driver",
    **dict.fromkeys(
        (
            "Engine",
            "EngineInfo",
            "EngineOptions",
            "Inbox",
            "PerRequestEngine",
            "Submission",
            "create_engine",
            "register_engine",
        ),
        "engines.base",
    ),
    **dict.fromkeys(("Recorder", "RequestHandle"), "recorder"),
    **dict.fromkeys(("RequestRecord", "RequestSpec"), "records"),
    **dict.fromkeys(("StoredRun", "default_runs_root", "list_runs", "read_run"), "store"),
    "TelemetryConfig": "telemetry",
    **dict.fromkeys(("LengthDist", "WorkloadConfig"), "workload"),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'perfscope.profiler' has no attribute {name!r}")
    return getattr(importlib.import_module(f"perfscope.profiler.{home}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
