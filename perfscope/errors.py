"""Every error perfscope raises on purpose, in one tree.

::

    PerfscopeError                 base of everything below
    ├── UsageError                 the user asked for something that cannot work (CLI exit 2)
    │   ├── EngineNotFoundError    unknown engine URI scheme, or a module/attribute not found
    │   ├── WorkloadError          bad lengths, distributions, prompt files, rates
    │   ├── SLOError               malformed ``--slo`` / threshold expressions
    │   ├── RunNotFoundError       a run directory that is missing or unreadable
    │   │   └── BrokenRunError     a run directory whose files are malformed (names file, field)
    │   └── UnknownDeviceError     a device name the hardware database cannot resolve
    ├── HardwareDatabaseError      a device file that is malformed or conflicts with another
    ├── EngineError                the engine failed while running (CLI exit 1; data kept)
    ├── StorageError               a file could not be written: disk full, read-only (exit 1)
    └── TelemetryError             a sampler could not start or read its device
        └── NVMLError              an NVML call failed (wraps ``pynvml.NVMLError``)

    AssertionError
    └── PerfAssertionError         ``perfscope.expect``/``check`` found a limit broken

Messages are written for the person at the terminal: they name the problem and what to do.
The CLI prints ``error: <message>`` for these and never a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "BrokenRunError",
    "EngineError",
    "EngineNotFoundError",
    "HardwareDatabaseError",
    "NVMLError",
    "PerfAssertionError",
    "PerfscopeError",
    "RunNotFoundError",
    "SLOError",
    "StorageError",
    "TelemetryError",
    "UnknownDeviceError",
    "UsageError",
    "WorkloadError",
]


class PerfscopeError(Exception):
    """Base class of all perfscope errors."""


class UsageError(PerfscopeError):
    """The request cannot work as given; fix the input and retry (exit code 2)."""


class EngineNotFoundError(UsageError):
    """The engine URI names no registered engine or an unimportable callable."""


class WorkloadError(UsageError):
    """A workload option or prompt file is invalid."""


class SLOError(UsageError):
    """An SLO or threshold expression could not be parsed."""


class RunNotFoundError(UsageError):
    """A run directory does not exist or has no readable manifest."""


class BrokenRunError(RunNotFoundError):
    """A run directory exists but a file in it is malformed (wrong-typed manifest field,
    foreign table columns); the message names the file, the field and the problem."""


class UnknownDeviceError(UsageError):
    """The hardware database has no device of that name.

    Attributes:
        suggestions: nearest known device keys, best first.
    """

    def __init__(self, message: str, suggestions: list[str] | None = None) -> None:
        super().__init__(message)
        self.suggestions = suggestions or []


class HardwareDatabaseError(PerfscopeError):
    """A device file is malformed, incomplete or conflicts with another file."""


class EngineError(PerfscopeError):
    """The engine raised or stopped responding during a run."""


class StorageError(PerfscopeError):
    """A run file could not be written (disk full, read-only folder, permissions).

    Attributes:
        path: the file that was being written.
        errno: the operating system's error number, when known.
    """

    def __init__(self, message: str, path: str | None = None, errno: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno


class TelemetryError(PerfscopeError):
    """A telemetry sampler could not start or read its device."""


class NVMLError(TelemetryError):
    """An NVML call failed; ``code`` is the NVML return code when known."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class PerfAssertionError(AssertionError):
    """A performance assertion failed; the message has the numbers.

    An ``AssertionError`` (not a :class:`PerfscopeError`): pytest reports it as a failed
    test, and the CLI never raises it.

    Attributes:
        outcomes: every evaluated assertion, failed and passed
            (``perfscope.checks.expect.Outcome``).
    """

    def __init__(self, message: str, outcomes: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.outcomes = list(outcomes)
