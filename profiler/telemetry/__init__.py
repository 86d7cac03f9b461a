"""Hardware samplers (NVML, CPU) on the run's clock.

Start a :class:`TelemetrySession` with :func:`start_telemetry` before the engine runs and call
:meth:`TelemetrySession.stop` after; every sample is a ``TELEMETRY_SCHEMA`` row (one per device
per sampling round) stamped with the same run-relative clock as the token events, so
:mod:`perfscope.analysis.energy` can join power and energy with steps and requests.

Without an NVIDIA driver the session still runs the CPU sampler and reports
``gpu telemetry unavailable: <reason>`` in :meth:`TelemetrySession.manifest_info`.
"""

from perfscope.profiler.telemetry.session import (
    MIN_INTERVAL_S,
    TelemetryConfig,
    TelemetrySession,
    parse_gpus,
    start_telemetry,
)

__all__ = [
    "MIN_INTERVAL_S",
    "TelemetryConfig",
    "TelemetrySession",
    "parse_gpus",
    "start_telemetry",
]
