"""Stop signals during capture: SIGTERM and SIGHUP stop a run as Ctrl-C does, and no
signal cuts the writing of what was captured short (docs/architecture.md, Durability)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["STOP_SIGNALS", "Terminated", "stop_signals_as_interrupt", "stop_signals_deferred"]


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: handled as Ctrl-C (flush, finalise, ``interrupted``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def signame(self) -> str:
        """The signal's name (``SIGTERM``, ``SIGHUP``)."""
        return signal.Signals(self.signum).name


#: Signals that stop a run the way Ctrl-C does.
STOP_SIGNALS: tuple[int, ...] = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s
)


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise :class:`Terminated` (a KeyboardInterrupt)
    in the main thread, so ``timeout``, ``docker stop`` and a closed terminal stop a run
    as cleanly as Ctrl-C. Elsewhere than the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_terminated) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Hold off Ctrl-C, SIGTERM and SIGHUP while the captured data is being written; a
    stop signal that arrived meanwhile is raised (as KeyboardInterrupt) once it is written.
    Elsewhere than the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    sigs = (signal.SIGINT, *STOP_SIGNALS)
    previous = {s: signal.signal(s, signal.SIG_IGN if s == signal.SIGINT else note) for s in sigs}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        raise Terminated(received[0])
