"""What recording costs on the per-token path.

Measures, side by side in one process:

1. ``RequestHandle.tokens()`` — the call an engine makes per streamed chunk — against an
   empty loop of the same length (ns per call, median of repeats);
2. the same call from 8 threads at once (GIL contention, as with concurrent requests);
3. a ``python:`` engine streaming N tokens with no sleeps: perfscope's end-to-end cost per
   token through driver, inbox, worker thread and recorder (``--long`` also runs one long
   enough for the segment flusher to run many times, every 0.5 s, beside the engine);
4. what one segment flush costs the flusher's thread (the GIL it holds meanwhile) per 10 000
   new chunks.

Run:  python benchmarks/recorder_overhead.py [--chunks 200000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from perfscope.api.runner import RunOptions, execute_run
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.driver import LoadConfig
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec
from perfscope.profiler.telemetry import TelemetryConfig
from perfscope.profiler.workload import LengthDist, WorkloadConfig


def _per_call_ns(n: int, repeats: int) -> tuple[float, float]:
    empty, record = [], []
    for r in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            pass
        empty.append((time.perf_counter_ns() - t0) / n)
        rec = Recorder(MonotonicClock())
        h = rec.add_request(RequestSpec(r, 1, n))
        h.sent()
        tokens = h.tokens
        t0 = time.perf_counter_ns()
        for _ in range(n):
            tokens(1)
        record.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(empty), statistics.median(record)


def _threaded_ns(n: int, threads: int) -> float:
    rec = Recorder(MonotonicClock())
    handles = [rec.add_request(RequestSpec(i, 1, n)) for i in range(threads)]

    def work(i: int) -> None:
        tokens = handles[i].tokens
        for _ in range(n):
            tokens(1)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter_ns()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    total = time.perf_counter_ns() - t0
    assert len(rec.chunks_table()) == n * threads
    return total / (n * threads)


def free_stream(max_tokens: int):  # type: ignore[no-untyped-def]
    """A python: engine with no work at all: every microsecond measured is perfscope's."""
    for _ in range(max_tokens):
        yield 1


def _end_to_end_us_per_token(tokens_per_request: int, requests: int) -> float:
    import sys

    sys.modules.setdefault("recorder_overhead_bench", sys.modules[__name__])
    with tempfile.TemporaryDirectory() as d:
        opts = RunOptions(
            engine="python:recorder_overhead_bench:free_stream",
            workload=WorkloadConfig(
                requests=requests,
                prompt_len=LengthDist("constant", 1),
                output_len=LengthDist("constant", tokens_per_request),
            ),
            load=LoadConfig(mode="online", concurrency=4),
            runs_dir=Path(d),
            telemetry=TelemetryConfig(enabled=False),
            hw="cpu",
        )
        t0 = time.perf_counter()
        out = execute_run(opts)
        wall = time.perf_counter() - t0
        streamed = out.summary["counts"]["output_tokens"]
        window = out.summary["window_s"]
    print(
        f"  end-to-end: {streamed} tokens in a {window:.3f} s window "
        f"({wall:.2f} s with set-up, analysis and writing)"
    )
    return float(window / streamed * 1e6)


def _flush_ms_per_10k(n: int, repeats: int) -> float:
    from perfscope.profiler.segments import SegmentFlusher

    out = []
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(MonotonicClock())
        flusher = SegmentFlusher(Path(d), rec)
        for r in range(repeats):
            h = rec.add_request(RequestSpec(r, 1, n))
            for _ in range(n):
                h.tokens(1)
            h.finish()
            t0 = time.perf_counter_ns()
            flusher.flush()
            out.append((time.perf_counter_ns() - t0) / 1e6 * 10_000 / n)
        flusher.close()
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--chunks", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--long", action="store_true", help="also a ~3 s end-to-end run")
    args = ap.parse_args()
    empty, record = _per_call_ns(args.chunks, args.repeats)
    print(
        f"tokens() per call: {record:.0f} ns (empty loop {empty:.0f} ns; "
        f"net {record - empty:.0f} ns), median of {args.repeats} x {args.chunks} calls"
    )
    print(f"tokens() from 8 threads: {_threaded_ns(args.chunks // 8, 8):.0f} ns per call")
    us = _end_to_end_us_per_token(2000, 40)
    print(
        f"python: engine end to end: {us:.2f} us per streamed token "
        f"(driver + worker thread + recorder; the engine itself does nothing)"
    )
    if args.long:
        us = _end_to_end_us_per_token(20_000, 100)
        print(f"python: engine end to end, long run: {us:.2f} us per streamed token")
    ms = _flush_ms_per_10k(100_000, args.repeats)
    print(f"segment flush: {ms:.2f} ms of the flusher's thread per 10 000 new chunks")


if __name__ == "__main__":
    main()
