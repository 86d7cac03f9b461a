"""Thin layer over NVIDIA's NVML bindings (``nvidia-ml-py``, module ``pynvml``).

Every NVML call perfscope makes goes through :func:`call`, which looks the function up on the
``pynvml`` module at call time (so tests can replace functions at the binding layer, as zeus
does) and maps ``pynvml.NVMLError`` to perfscope's one exception tree:

::

    perfscope.errors.NVMLError
    ├── NVMLLibraryNotFoundError   no NVIDIA driver / libnvidia-ml.so.1 on this machine
    ├── NVMLDriverNotLoadedError   library present, kernel driver not running
    ├── NVMLNotSupportedError      the device does not support this query (also: function
    │                              missing from this driver, argument/version mismatch)
    ├── NVMLNoPermissionError      the query needs privileges this process lacks
    └── NVMLGpuLostError           the GPU fell off the bus or needs a reset

:class:`NvmlLibrary` holds the one ``nvmlInit`` of a run (NVML is reference-counted; a run
initialises it once and shuts it down once).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from perfscope.errors import NVMLError

__all__ = [
    "UNSUPPORTED_ERRORS",
    "NVMLDriverNotLoadedError",
    "NVMLGpuLostError",
    "NVMLLibraryNotFoundError",
    "NVMLNoPermissionError",
    "NVMLNotSupportedError",
    "NvmlLibrary",
    "call",
    "map_error",
    "pynvml_module",
]


class NVMLLibraryNotFoundError(NVMLError):
    """``libnvidia-ml.so.1`` could not be loaded: no NVIDIA driver on this machine."""


class NVMLDriverNotLoadedError(NVMLError):
    """The NVML library exists but the NVIDIA kernel driver is not running."""


class NVMLNotSupportedError(NVMLError):
    """The device (or driver) does not support this query."""


class NVMLNoPermissionError(NVMLError):
    """The query needs privileges this process does not have."""


class NVMLGpuLostError(NVMLError):
    """The GPU is lost or needs a reset; nothing more can be read from it."""


#: Errors that mean "this field will never work on this device in this run": detect once,
#: record as unsupported, never retry per sample.
UNSUPPORTED_ERRORS: tuple[type[NVMLError], ...] = (NVMLNotSupportedError, NVMLNoPermissionError)

# NVML return codes (nvml.h; the same values are constants in pynvml).
_CODE_CLASS: dict[int, type[NVMLError]] = {
    1: NVMLError,  # uninitialized
    2: NVMLNotSupportedError,  # invalid argument: e.g. a struct version this driver lacks
    3: NVMLNotSupportedError,  # not supported
    4: NVMLNoPermissionError,  # no permission
    9: NVMLDriverNotLoadedError,  # driver not loaded
    12: NVMLLibraryNotFoundError,  # library not found
    13: NVMLNotSupportedError,  # function not found (older driver)
    15: NVMLGpuLostError,  # GPU is lost
    16: NVMLGpuLostError,  # reset required
    25: NVMLNotSupportedError,  # argument version mismatch
    26: NVMLNotSupportedError,  # deprecated
}

_module_lock = threading.Lock()
_module: Any = None


def pynvml_module() -> Any:
    """The imported ``pynvml`` module (nvidia-ml-py), or raise NVMLLibraryNotFoundError."""
    global _module
    with _module_lock:
        if _module is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - a declared dependency
                raise NVMLLibraryNotFoundError(
                    "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"
                ) from exc
            _module = pynvml
        return _module


def map_error(exc: BaseException, what: str) -> NVMLError:
    """Turn a ``pynvml.NVMLError`` (or a binding-level failure) into perfscope's tree."""
    code = getattr(exc, "value", None)
    code_int = code if isinstance(code, int) else None
    cls = _CODE_CLASS.get(code_int, NVMLError) if code_int is not None else NVMLError
    if isinstance(exc, (AttributeError, OSError)) and code_int is None:
        # An old nvidia-ml-py without this function, or a ctypes symbol lookup failure.
        cls = NVMLNotSupportedError
    text = str(exc) or type(exc).__name__
    return cls(f"{what}: {text}", code=code_int)


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``pynvml.<name>(*args, **kwargs)``, raising perfscope NVML errors on failure."""
    nv = pynvml_module()
    try:
        fn: Callable[..., Any] = getattr(nv, name)
        return fn(*args, **kwargs)
    except nv.NVMLError as exc:
        raise map_error(exc, name) from exc
    except (AttributeError, OSError) as exc:
        raise map_error(exc, name) from exc


def _text(value: Any) -> str:
    """NVML strings come back as ``bytes`` from some binding versions and ``str`` from others."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class NvmlLibrary:
    """One ``nvmlInit`` / ``nvmlShutdown`` pair for a run.

    ``init()`` is idempotent for this object; ``shutdown()`` undoes it once. Construct one per
    telemetry session.
    """

    def __init__(self) -> None:
        self._initialised = False
        self._lock = threading.Lock()
        self.driver_version: str | None = None
        self.nvml_version: str | None = None

    @property
    def initialised(self) -> bool:
        """True between a successful :meth:`init` and :meth:`shutdown`."""
        return self._initialised

    def init(self) -> None:
        """Initialise NVML once; raises :class:`NVMLLibraryNotFoundError` etc. on failure."""
        with self._lock:
            if self._initialised:
                return
            call("nvmlInit")
            self._initialised = True
        try:
            self.driver_version = _text(call("nvmlSystemGetDriverVersion"))
        except NVMLError:
            self.driver_version = None
        try:
            self.nvml_version = _text(call("nvmlSystemGetNVMLVersion"))
        except NVMLError:
            self.nvml_version = None

    def shutdown(self) -> None:
        """Release this object's NVML reference (safe to call twice)."""
        with self._lock:
            if not self._initialised:
                return
            self._initialised = False
            with contextlib.suppress(NVMLError):
                call("nvmlShutdown")

    def device_count(self) -> int:
        """Number of GPUs NVML sees (all of them, regardless of ``CUDA_VISIBLE_DEVICES``)."""
        return int(call("nvmlDeviceGetCount"))

    def handle(self, index: int) -> Any:
        """The NVML handle of NVML device ``index`` (NVML order, not CUDA order)."""
        return call("nvmlDeviceGetHandleByIndex", index)

    @staticmethod
    def text(value: Any) -> str:
        """Decode an NVML string result."""
        return _text(value)
