"""Queueing under a load: a request's wait for the engine, simulated with projected steps.

A projection of one batch (:func:`perfscope.analysis.whatif.predict`,
:func:`perfscope.analysis.overhead.fitted_times`) times a request once it is in the batch. A
measured TTFT also holds the wait before its prefill, which dominates when more requests
are in flight than the batch has slots (batch 1 under a burst of eight), and a measured
throughput is over the run's window. :func:`simulate` adds both with a stated model: the
continuous-batching scheduler of the reference engine (and of vLLM-like servers), stepped
with projected step times:

- each iteration admits the requests that have arrived, up to the free slots, and prefills
  them in one step (``prefill_s(k)`` for ``k`` prompts); then one decode step of every
  running sequence (``decode_s(b)`` for ``b`` rows); a sequence leaves after its last token;
- arrivals: ``batch`` loads send every request at t = 0; an open loop at ``rate`` sends
  request ``i`` at ``i / rate`` (the mean spacing: deterministic, not the run's random draw,
  so a Poisson run's bursts are not in it); a closed loop of ``concurrency`` users sends
  each user's next request when its last one finishes (no think time).

Per request: TTFT = its first token minus its arrival (the wait for a slot, for the step in
flight, and for the prefill), TPOT = decode time over its decode tokens; the run's p50 of
each, and output tokens over first arrival to last token. All in seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Load", "LoadTimes", "simulate"]


@dataclass(frozen=True)
class Load:
    """How requests reach the engine (a run summary's ``load`` section).

    Attributes:
        mode: ``batch`` (all at once) or ``online``.
        requests: measured requests in the run.
        rate: offered requests per second (online, open loop), or None.
        concurrency: closed-loop users (online), or None.
        arrival: ``poisson``, ``constant`` or ``gamma`` (open loop).
        burstiness: the gamma shape (1 = Poisson; lower = burstier).
    """

    mode: str
    requests: int
    rate: float | None = None
    concurrency: int | None = None
    arrival: str | None = None
    burstiness: float | None = None

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> Load | None:
        """The load of a run summary (None when it names none, or replays a trace)."""
        load = summary.get("load") or {}
        work = summary.get("workload") or {}
        mode = load.get("mode")
        requests = work.get("requests")
        if mode not in ("batch", "online") or not requests or work.get("trace"):
            return None
        rate, conc = load.get("rate"), load.get("concurrency")
        if mode == "online" and rate is None and conc is None:
            return None
        return cls(
            mode=str(mode),
            requests=int(requests),
            rate=None if rate is None else float(rate),
            concurrency=None if conc is None else int(conc),
            arrival=load.get("arrival"),
            burstiness=None if load.get("burstiness") is None else float(load["burstiness"]),
        )

    @property
    def arrival_cv2(self) -> float:
        """Squared coefficient of variation of the inter-arrival times."""
        if self.arrival == "constant":
            return 0.0
        if self.arrival == "gamma" and self.burstiness:
            return 1.0 / self.burstiness
        return 1.0

    def describe(self) -> str:
        """The load in words."""
        if self.mode == "batch":
            return f"{self.requests} requests at once"
        if self.rate is not None:
            return f"{self.requests} requests at {self.rate:g}/s ({self.arrival or 'poisson'})"
        return f"{self.requests} requests from {self.concurrency} closed-loop users"


@dataclass(frozen=True)
class LoadTimes:
    """What :func:`simulate` gives (seconds).

    Attributes:
        ttft_p50_s: median time from a request's arrival to its first token.
        tpot_p50_s: median decode time per output token after the first.
        queue_p50_s: median wait from arrival to the start of the request's prefill.
        window_s: first arrival to last token.
        throughput_tok_s: output tokens of the run over ``window_s``.
        batch_mean: mean rows of a decode step.
        model: the model in words.
    """

    ttft_p50_s: float
    tpot_p50_s: float
    queue_p50_s: float
    window_s: float
    throughput_tok_s: float | None
    batch_mean: float
    model: str


def simulate(
    load: Load,
    *,
    slots: int,
    prefill_s: Callable[[int], float],
    decode_s: Callable[[int], float],
    output_len: int,
) -> LoadTimes:
    """The run of ``load`` on a continuous-batching engine of ``slots`` sequences whose
    prefill of ``k`` prompts takes ``prefill_s(k)`` and decode step of ``b`` rows
    ``decode_s(b)`` (see the module docstring); every request generates ``output_len``."""
    n = max(int(load.requests), 1)
    c = max(int(slots), 1)
    out = max(int(output_len), 1)
    users = max(int(load.concurrency or 1), 1) if load.mode == "online" and not load.rate else 0
    arrival: list[float] = [0.0] * n
    if load.mode == "online" and load.rate:
        arrival = [i / float(load.rate) for i in range(n)]
    elif users:
        arrival = [0.0 if i < users else float("inf") for i in range(n)]
    start = [0.0] * n
    first = [0.0] * n
    done = [0.0] * n
    left = [0] * n
    nxt = 0  # next request not yet admitted (arrival order)
    running: list[int] = []
    t = 0.0
    rows = 0
    steps = 0
    while nxt < n or running:
        room = c - len(running)
        admit = []
        while room > 0 and nxt < n and arrival[nxt] <= t:
            admit.append(nxt)
            nxt += 1
            room -= 1
        if admit:
            for i in admit:
                start[i] = t
            t += prefill_s(len(admit))
            for i in admit:
                first[i] = t
                left[i] = out - 1
                if left[i] == 0:
                    done[i] = t
                else:
                    running.append(i)
        elif not running:
            if arrival[nxt] == float("inf"):
                break  # a closed loop with no request in flight (cannot happen)
            t = max(t, arrival[nxt])  # idle until the next arrival
            continue
        finished = []
        if running:
            t += decode_s(len(running))
            rows += len(running)
            steps += 1
            for i in running:
                left[i] -= 1
                if left[i] == 0:
                    done[i] = t
                    finished.append(i)
            running = [i for i in running if left[i] > 0]
        if users:
            # closed loop: each finished request's user sends the next one now
            for i in [*finished, *(a for a in admit if left[a] == 0)]:
                later = next((j for j in range(nxt, n) if arrival[j] == float("inf")), None)
                if later is not None:
                    arrival[later] = done[i]
    ttft = [first[i] - arrival[i] for i in range(n)]
    tpot = [(done[i] - first[i]) / (out - 1) for i in range(n)] if out > 1 else [0.0] * n
    queue = [start[i] - arrival[i] for i in range(n)]
    window = max(done) - min(arrival)
    if load.mode == "batch":
        how = f"all {n} requests at t = 0"
    elif load.rate:
        how = f"{n} requests {1 / float(load.rate):.3g} s apart (rate {float(load.rate):g}/s)"
    else:
        how = f"{n} requests from {users} closed-loop users"
    return LoadTimes(
        ttft_p50_s=float(statistics.median(ttft)),
        tpot_p50_s=float(statistics.median(tpot)),
        queue_p50_s=float(statistics.median(queue)),
        window_s=window,
        throughput_tok_s=n * out / window if window > 0 else None,
        batch_mean=rows / steps if steps else 0.0,
        model=f"continuous batching of {c} slots simulated with projected steps, {how}",
    )
