"""Clocks of the load actors against the driver's: NTP-style offsets, and the kernel boot id
that says two processes share one monotonic clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Clock exchanges per offset measurement.
OFFSET_SAMPLES = 9


@dataclass(frozen=True)
class ClockOffset:
    """An actor's clock against the driver's, from NTP-style exchanges.

    Attributes:
        offset_ns: actor ``perf_counter_ns`` minus driver ``perf_counter_ns`` at one moment.
        rtt_ns: round trip of the sample used (the smallest seen).
        uncertainty_ns: half that round trip: the offset is exact to within it.
    """

    offset_ns: int
    rtt_ns: int
    uncertainty_ns: int
    method: str = "exchange"


def measure_offset(remote_now: Callable[[], int], samples: int = OFFSET_SAMPLES) -> ClockOffset:
    """Offset of a remote clock (``remote_now`` returns its ``perf_counter_ns``)."""
    best: tuple[int, int] | None = None
    for _ in range(max(1, samples)):
        t0 = time.perf_counter_ns()
        t_remote = remote_now()
        t1 = time.perf_counter_ns()
        rtt = t1 - t0
        offset = t_remote - (t0 + t1) // 2
        if best is None or rtt < best[1]:
            best = (offset, rtt)
    assert best is not None
    return ClockOffset(offset_ns=best[0], rtt_ns=best[1], uncertainty_ns=(best[1] + 1) // 2)


def boot_id() -> str | None:
    """This kernel's boot id: processes that share it read one ``CLOCK_MONOTONIC``, which is
    what ``time.perf_counter_ns`` returns on Linux, so their stamps need no alignment."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def actor_offset(ray: Any, actor: Any, same_clock: bool) -> tuple[ClockOffset, int | None]:
    """The clock offset to apply to the stamps of an actor with a ``now_ns`` method, and on
    a shared clock what the exchange measured as a check (None otherwise).

    On a shared clock (same kernel boot id) the offset is 0 exactly; elsewhere it is the
    NTP-style exchange's."""
    measured = measure_offset(lambda: int(ray.get(actor.now_ns.remote())))
    if same_clock:
        return (
            ClockOffset(
                offset_ns=0,
                rtt_ns=measured.rtt_ns,
                uncertainty_ns=0,
                method="shared CLOCK_MONOTONIC (same kernel boot id)",
            ),
            measured.offset_ns,
        )
    return measured, None
