"""Drivers: when each request arrives at the engine.

- ``batch``: every request is submitted at once; the engine batches them (the offline
  batch-API pattern).
- ``online`` with a rate: an open loop; gaps are drawn from an exponential (``poisson``),
  a gamma with shape ``burstiness`` (``gamma``: < 1 burstier, > 1 more regular than
  Poisson) or are constant.
- ``online`` with a concurrency: a closed loop of N users, each sending its next request
  as soon as its previous one finished.

Warmup requests run first, to completion, with the same pattern; the measured phase
starts after them. The driver runs in its own thread and never waits on the engine except
through the closed loop's completions.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfscope.errors import WorkloadError
from perfscope.profiler.engines.base import Inbox, Submission
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec

__all__ = ["MIN_RATE", "Driver", "LoadConfig", "arrival_offsets_ns"]

#: Lowest open-loop rate (requests/s): one a day on average. Slower rates plan arrivals that
#: overflow the nanosecond clock (and no run waits that long).
MIN_RATE = 1.0 / 86_400
#: Latest planned arrival (ns after the phase start) the clock can represent with margin.
_MAX_OFFSET_NS = 2**62


@dataclass(frozen=True)
class LoadConfig:
    """How requests arrive.

    Attributes:
        mode: ``batch`` or ``online``.
        rate: requests per second for an open loop (online).
        concurrency: users of a closed loop (online); exclusive with ``rate``.
        arrival: ``poisson | constant | gamma``.
        burstiness: gamma shape (1 = Poisson).
        seed: seeds the arrival gaps.
        duration_s: stop submitting measured requests this long after the measured phase
            starts (whichever comes first with the request count).
        warmup_s: warmup by time: submit warmup requests for this long, then go straight on
            to the measured phase while they finish (steady state). A count-only warmup
            instead waits until every warmup request has finished.
    """

    mode: str = "batch"
    rate: float | None = None
    concurrency: int | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    duration_s: float | None = None
    warmup_s: float | None = None

    def validate(self) -> None:
        if self.mode not in ("batch", "online"):
            raise WorkloadError(f"unknown --mode {self.mode!r}: use 'batch' or 'online'")
        if self.rate is not None and not (self.rate > 0 and np.isfinite(self.rate)):
            raise WorkloadError(f"--rate must be a positive number of requests/s, got {self.rate}")
        if self.rate is not None and self.rate < MIN_RATE:
            raise WorkloadError(
                f"--rate {self.rate:g} requests/s is a mean gap of {1 / self.rate:.3g} s; the "
                f"lowest rate is {MIN_RATE:.3g}/s (one a day)"
            )
        if self.concurrency is not None and self.concurrency < 1:
            raise WorkloadError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.arrival not in ("poisson", "constant", "gamma"):
            raise WorkloadError(
                f"unknown --arrival {self.arrival!r}: use poisson, constant or gamma"
            )
        for flag, v in (("--duration", self.duration_s), ("--warmup-duration", self.warmup_s)):
            if v is not None and not (v > 0 and np.isfinite(v)):
                raise WorkloadError(f"{flag} must be a positive number of seconds, got {v}")
        if not (1e-3 <= self.burstiness <= 1e3):
            raise WorkloadError(
                f"--burstiness must be between 0.001 and 1000 (gamma shape), got {self.burstiness}"
            )
        if self.mode == "online":
            if self.rate is None and self.concurrency is None:
                raise WorkloadError("--mode online needs --rate R or --concurrency N")
            if self.rate is not None and self.concurrency is not None:
                raise WorkloadError("give either --rate or --concurrency, not both")
        elif self.rate is not None or self.concurrency is not None:
            raise WorkloadError("--rate and --concurrency need --mode online")

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "rate": self.rate,
            "concurrency": self.concurrency,
            "arrival": self.arrival if self.rate is not None else None,
            "burstiness": self.burstiness if self.arrival == "gamma" else None,
            "seed": self.seed,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
        }


def arrival_offsets_ns(load: LoadConfig, n: int) -> np.ndarray:
    """Planned arrival times (ns from the phase start) of ``n`` open-loop requests.

    The first request arrives at 0. Batch mode: all at 0.
    """
    if load.mode == "batch" or load.rate is None or n == 0:
        return np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng(load.seed)
    mean_gap_s = 1.0 / load.rate
    if load.arrival == "constant":
        gaps = np.full(n - 1, mean_gap_s)
    elif load.arrival == "poisson":
        gaps = rng.exponential(mean_gap_s, size=n - 1)
    else:
        shape = load.burstiness
        gaps = rng.gamma(shape, mean_gap_s / shape, size=n - 1)
    offsets = np.concatenate([[0.0], np.cumsum(gaps * 1e9)])
    if not offsets[-1] < _MAX_OFFSET_NS:
        raise WorkloadError(
            f"{n} requests at {load.rate:g}/s would arrive over {offsets[-1] / 1e9:.3g} s, "
            "beyond what a run can span: raise --rate or send fewer requests"
        )
    return offsets.astype(np.int64)


class Driver:
    """Submits a workload to an engine's inbox on schedule, in a background thread."""

    def __init__(
        self,
        specs: Sequence[RequestSpec],
        load: LoadConfig,
        inbox: Inbox,
        recorder: Recorder,
    ) -> None:
        load.validate()
        self.load = load
        self.inbox = inbox
        self.recorder = recorder
        self.warmup = [s for s in specs if s.is_warmup]
        self.measured = [s for s in specs if not s.is_warmup]
        self._stop = threading.Event()
        self._done_cv = threading.Condition()
        self._finished: set[int] = set()
        self._thread = threading.Thread(target=self._run, name="perfscope-driver", daemon=True)
        self.error: BaseException | None = None
        recorder.add_finish_listener(self._on_finish)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop submitting (interrupt); the inbox is closed."""
        self._stop.set()
        with self._done_cv:
            self._done_cv.notify_all()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def _on_finish(self, request_id: int) -> None:
        with self._done_cv:
            self._finished.add(request_id)
            self._done_cv.notify_all()

    def _wait_finished(self, ids: set[int], at_most_open: int = 0) -> bool:
        """Block until no more than ``at_most_open`` of ``ids`` are unfinished."""
        with self._done_cv:
            while len(ids - self._finished) > at_most_open:
                if self._stop.is_set():
                    return False
                self._done_cv.wait(0.5)
        return not self._stop.is_set()

    def _submit(self, spec: RequestSpec, t_scheduled: int) -> None:
        handle = self.recorder.add_request(spec, t_scheduled)
        handle.sent()
        self.inbox.put(Submission(spec, handle))

    def _phase(
        self,
        specs: list[RequestSpec],
        duration_s: float | None = None,
        in_flight: set[int] | None = None,
    ) -> bool:
        """Submit ``specs`` on schedule, stopping after ``duration_s`` (if given).

        ``in_flight``: ids still running from a previous phase; a closed loop counts them
        against its concurrency. Ids submitted here are added to it.
        """
        clock = self.recorder.clock
        sent: set[int] = in_flight if in_flight is not None else set()
        if not specs:
            return True
        t0 = clock.now_ns()
        deadline = None if duration_s is None else t0 + int(duration_s * 1e9)
        if self.load.concurrency is not None:
            for spec in specs:
                if not self._wait_finished(sent, self.load.concurrency - 1):
                    return False
                if spec.after is not None and not self._wait_finished({spec.after}):
                    return False
                now = clock.now_ns()
                if deadline is not None and now >= deadline:
                    return True
                self._submit(spec, now)
                sent.add(spec.request_id)
            return True
        offsets = arrival_offsets_ns(self.load, len(specs))
        if all(s.arrival_s is not None for s in specs):  # a replayed trace: its own times
            first = float(specs[0].arrival_s or 0.0)
            offsets = np.asarray([(float(s.arrival_s or 0.0) - first) * 1e9 for s in specs])
        for spec, off in zip(specs, offsets, strict=True):
            t_plan = t0 + int(off)
            if deadline is not None and t_plan >= deadline:
                return True
            clock.sleep_until_ns(t_plan)
            if spec.after is not None:  # the next turn of a conversation waits for the reply
                if not self._wait_finished({spec.after}):
                    return False
                t_plan = max(t_plan, clock.now_ns())
            if self._stop.is_set():
                return False
            self._submit(spec, t_plan)
            sent.add(spec.request_id)
        return True

    def _run(self) -> None:
        try:
            in_flight: set[int] = set()
            if self.warmup:
                if not self._phase(self.warmup, self.load.warmup_s, in_flight):
                    return
                if self.load.warmup_s is None and not self._wait_finished(in_flight):
                    return
            self._phase(self.measured, self.load.duration_s, in_flight)
        except BaseException as exc:  # surfaced by the runner after the engine stops
            self.error = exc
        finally:
            self.inbox.close()
