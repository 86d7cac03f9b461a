"""NVTX ranges for perfscope's phases, so Nsight Systems shows them on the GPU timeline.

Everything goes into one NVTX domain, ``perfscope``, with a category per level (``run``,
``request``, ``step``) and a colour per phase (prefill orange, decode blue, mixed purple). Step
ranges carry the step id as payload.

On by default only when an NVTX tool (Nsight Systems) is attached to the process; otherwise
every function returns at once (tens of nanoseconds). ``--nvtx`` / ``--no-nvtx`` call
:func:`set_enabled`. Ranges are pushed and popped on the calling thread's stack, so push and pop
in the same thread, as the engine loop does.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

__all__ = [
    "DOMAIN",
    "PHASE_COLORS",
    "is_enabled",
    "pop_range",
    "push_request",
    "push_step",
    "request_range",
    "run_range",
    "set_enabled",
    "step_range",
    "tool_attached",
]

DOMAIN = "perfscope"

#: 0xRRGGBB per phase (and for the run / request levels).
PHASE_COLORS: dict[str, int] = {
    "run": 0x7F7F7F,
    "request": 0x2CA02C,
    "prefill": 0xFF7F0E,
    "decode": 0x1F77B4,
    "mixed": 0x9467BD,
}

_enabled: bool | None = None  # None: follow whether a tool is attached
_domain: Any = None
_categories: dict[str, int] = {}


def _get_domain() -> Any:
    global _domain
    if _domain is None:
        import nvtx

        _domain = nvtx.get_domain(DOMAIN)
    return _domain


def tool_attached() -> bool:
    """True when an NVTX tool (e.g. Nsight Systems) is injected into this process."""
    if not (os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("NVTX_INJECTION32_PATH")):
        # No injection library: the nvtx package would hand out its dummy domain anyway.
        return False
    try:
        from nvtx._lib.lib import DummyDomain
    except ImportError:  # pragma: no cover - layout of another nvtx version
        return True
    return not isinstance(_get_domain(), DummyDomain)


def set_enabled(enabled: bool) -> None:
    """Turn perfscope's NVTX ranges on or off (``--nvtx`` / ``--no-nvtx``).

    Turning them on without a tool attached is allowed and costs a few hundred nanoseconds per
    range inside the nvtx package, which then records nothing.
    """
    global _enabled
    _enabled = bool(enabled)


def is_enabled() -> bool:
    """Whether ranges are emitted now (default: only when a tool is attached)."""
    global _enabled
    if _enabled is None:
        _enabled = tool_attached()
    return _enabled


def _category(name: str) -> int | None:
    cat = _categories.get(name)
    if cat is None:
        cat = _get_domain().get_category_id(name)
        if cat is None:  # dummy domain
            return None
        _categories[name] = cat
    return cat


def _push(message: str, color: int, category: str, payload: int | None = None) -> None:
    dom = _get_domain()
    if payload is None:
        dom.push_range(message=message, color=color, category=_category(category))
    else:
        dom.push_range(message=message, color=color, category=_category(category), payload=payload)


def pop_range() -> None:
    """Close the innermost range opened by :func:`push_step` / :func:`push_request`."""
    if _enabled:
        _get_domain().pop_range()


def push_step(kind: str, step_id: int) -> bool:
    """Open a step range (``kind`` = prefill | decode | mixed); True if one was pushed.

    Pair with :func:`pop_range` only when this returned True.
    """
    if not (_enabled if _enabled is not None else is_enabled()):
        return False
    _push(kind, PHASE_COLORS.get(kind, 0x8C564B), "step", step_id)
    return True


def push_request(request_id: int, phase: str) -> bool:
    """Open a request range (``phase`` = prefill | decode); True if one was pushed."""
    if not (_enabled if _enabled is not None else is_enabled()):
        return False
    _push(f"request {request_id} {phase}", PHASE_COLORS.get(phase, 0x2CA02C), "request")
    return True


class _NullRange:
    """The context manager handed out while disabled: does nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


_NULL = _NullRange()


class _Range:
    """A pushed-on-enter, popped-on-exit NVTX range (also pops when the body raises)."""

    __slots__ = ("_category", "_color", "_message", "_payload")

    def __init__(self, message: str, color: int, category: str, payload: int | None) -> None:
        self._message = message
        self._color = color
        self._category = category
        self._payload = payload

    def __enter__(self) -> None:
        _push(self._message, self._color, self._category, self._payload)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _get_domain().pop_range()


def run_range(name: str) -> _Range | _NullRange:
    """Context manager around a whole run (``with run_range(run_id): ...``)."""
    if not (_enabled if _enabled is not None else is_enabled()):
        return _NULL
    return _Range(f"run {name}", PHASE_COLORS["run"], "run", None)


def request_range(request_id: int, phase: str) -> _Range | _NullRange:
    """Context manager around one request's ``phase`` (prefill | decode)."""
    if not (_enabled if _enabled is not None else is_enabled()):
        return _NULL
    return _Range(
        f"request {request_id} {phase}", PHASE_COLORS.get(phase, 0x2CA02C), "request", None
    )


def step_range(kind: str, step_id: int) -> _Range | _NullRange:
    """Context manager around one forward pass; ``kind`` = prefill | decode | mixed."""
    if not (_enabled if _enabled is not None else is_enabled()):
        return _NULL
    return _Range(kind, PHASE_COLORS.get(kind, 0x8C564B), "step", step_id)
