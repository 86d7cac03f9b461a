"""Whether the HTTP client stalled during a run, by how much, and which requests it touched.

A *stall* is time the client spent not reading a stream that had bytes waiting: a slow
callback on its event loop, or a CPU taken by the server under test. Its size is measured
two ways, by the stamping clock of the run:

- ``kernel``: per read, the event loop processed the bytes ``stall`` ns after the kernel
  received them (:class:`.kstamp.TransportStats`). The chunk stamps are the kernel's, so a
  stall delays processing, not measurement; it is still reported, because the same stall
  delays the *next requests* the client sends.
- ``user``: there is no arrival time to compare with; the evidence is the event loop's own
  lateness (a timer due every 2 ms that ran ``lag`` late), and per request whether its
  chunks came bunched (gaps under :data:`BUNCHED_GAP_NS`, several chunks read at once) or
  its response headers were read together with its first chunk. A stall here is in the
  stamps: latencies of the affected requests are too high by up to its size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["STALL_WARN_S", "RequestSpan", "StallReport", "judge_kernel", "judge_user"]

#: A run is said to have stalled when a read waited longer than this (seconds).
STALL_WARN_S = 0.010
#: Chunk gaps below this (ns) are reads of bytes that waited together, not server pacing.
BUNCHED_GAP_NS = 100_000
#: At most this many affected request ids are kept in the record.
MAX_IDS = 500


@dataclass(frozen=True)
class RequestSpan:
    """One request as the stall judgement needs it (run clock, ns).

    Attributes:
        request_id: the request.
        t_sent: its send stamp.
        t_headers: when its response headers were stamped (None: no response).
        chunks: its chunk stamps, in order.
        stall_ns: kernel mode only: its longest kernel-stamp-to-processing wait.
    """

    request_id: int
    t_sent: int
    t_headers: int | None
    chunks: tuple[int, ...]
    stall_ns: int | None = None


@dataclass
class StallReport:
    """The stall record of a run (``manifest.engine.config.client.stall``).

    Attributes:
        clock: ``kernel`` or ``user``: which clock stamped the chunks.
        threshold_s: the stall size that counts (:data:`STALL_WARN_S`).
        worst_s / p99_s / p50_s: the stall sizes (kernel: per read; user: event-loop lag).
        requests: requests judged; affected: those touched by a stall over the threshold;
        affected_ids: their ids (at most :data:`MAX_IDS`).
        in_stamps: whether the stall is inside the recorded latencies (user clock).
        evidence: user clock: counts of bunched requests and headers read with the first
            chunk; kernel clock: reads merged by the kernel and the reader thread's delay.
    """

    clock: str
    threshold_s: float = STALL_WARN_S
    worst_s: float = 0.0
    p99_s: float = 0.0
    p50_s: float = 0.0
    requests: int = 0
    affected: int = 0
    affected_ids: list[int] = field(default_factory=list)
    in_stamps: bool = False
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def stalled(self) -> bool:
        """Whether any stall exceeded the threshold."""
        return self.worst_s > self.threshold_s

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written to the manifest."""
        return {
            "clock": self.clock,
            "threshold_s": self.threshold_s,
            "worst_s": self.worst_s,
            "p99_s": self.p99_s,
            "p50_s": self.p50_s,
            "requests": self.requests,
            "affected": self.affected,
            "affected_ids": self.affected_ids,
            "in_stamps": self.in_stamps,
            "stalled": self.stalled,
            "evidence": self.evidence,
        }

    def warning(self) -> str | None:
        """The first-screen sentence, or None when the client did not stall."""
        if not self.stalled:
            return None
        size = f"up to {1e3 * self.worst_s:.0f} ms (p99 {1e3 * self.p99_s:.1f} ms)"
        who = f"{self.affected} of {self.requests} requests"
        if not self.in_stamps:
            return (
                f"the client stalled {size}; {who} were read late, but their chunks carry the "
                "kernel's receive time, so their latencies are not affected; a stall this size "
                "may delay later sends"
            )
        return (
            f"the client's event loop stalled {size} while {who} were in flight: their "
            "chunk stamps may be late by as much, and server-side splits cannot tell it from "
            "network time; kernel receive stamps (transport=kernel, plain http:// on Linux) "
            "or fewer streams per client avoid it"
        )


def _pcts(values_ns: list[int]) -> tuple[float, float, float]:
    if not values_ns:
        return 0.0, 0.0, 0.0
    a = np.asarray(values_ns, dtype=float) * 1e-9
    return float(a.max()), float(np.percentile(a, 99)), float(np.percentile(a, 50))


def judge_kernel(
    spans: list[RequestSpan],
    loop_delays_ns: list[int],
    reader_delays_ns: list[int],
    merged_reads: int,
    reads: int,
) -> StallReport:
    """The stall record of a kernel-stamped run (see the module docstring)."""
    worst, p99, p50 = _pcts(loop_delays_ns)
    limit = int(STALL_WARN_S * 1e9)
    hit = [s.request_id for s in spans if (s.stall_ns or 0) > limit]
    r_worst, r_p99, _ = _pcts(reader_delays_ns)
    return StallReport(
        clock="kernel",
        worst_s=worst,
        p99_s=p99,
        p50_s=p50,
        requests=len(spans),
        affected=len(hit),
        affected_ids=hit[:MAX_IDS],
        in_stamps=False,
        evidence={
            "reads": reads,
            "merged_reads": merged_reads,
            "reader_delay_max_s": r_worst,
            "reader_delay_p99_s": r_p99,
        },
    )


def judge_user(spans: list[RequestSpan], lag_events: list[tuple[int, int]]) -> StallReport:
    """The stall record of a user-stamped run from the loop's lag events ``(t_end, lag)``
    (run clock, ns; only lags over the threshold need be given) and each request's chunks."""
    lags = [lag for _, lag in lag_events]
    worst, p99, p50 = _pcts(lags)
    limit = int(STALL_WARN_S * 1e9)
    big = sorted((t - lag, t) for t, lag in lag_events if lag > limit)
    hit: list[int] = []
    bunched = headers_with_first = 0
    for s in spans:
        end = s.chunks[-1] if s.chunks else (s.t_headers or s.t_sent)
        if any(a < end and b > s.t_sent for a, b in big):
            hit.append(s.request_id)
        gaps = np.diff(np.asarray(s.chunks, dtype=np.int64)) if len(s.chunks) > 2 else None
        if gaps is not None and int((gaps < BUNCHED_GAP_NS).sum()) >= max(2, len(gaps) // 2):
            bunched += 1
        if s.t_headers is not None and s.chunks and 0 <= s.chunks[0] - s.t_headers < 50_000:
            headers_with_first += 1
    return StallReport(
        clock="user",
        worst_s=worst,
        p99_s=p99,
        p50_s=p50,
        requests=len(spans),
        affected=len(hit),
        affected_ids=hit[:MAX_IDS],
        in_stamps=True,
        evidence={
            "bunched_requests": bunched,
            "headers_read_with_first_chunk": headers_with_first,
        },
    )
