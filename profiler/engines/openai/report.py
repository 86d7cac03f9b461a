"""The HTTP client's account of itself over one run: :class:`ClientStats` (counters the
serve loop adds to) and :func:`client_report`, the record of them that becomes
``engine.config.client`` in the manifest, with its warnings.

The record says how far the client's chunk stamps can be trusted: the event loop's lag
(``loop_lag_s``: how late a timer due every 2 ms fired), the client's own work between a
chunk's arrival and its stamp (``stamp_delay_s``) against the median gap between a request's
chunks (``chunk_gap_s``), all in seconds; which clock stamped the chunks (``stamp_clock``:
``kernel``, ``user`` or ``mixed``) and whether the client stalled (:mod:`.stall`); what it
cost (``cpu_s``, ``peak_rss_bytes``, see :mod:`.cost`). Beside them: connections and
retries, how tokens were counted (:mod:`.tokens`) and whether client and server agree, the
models and finish reasons the server answered with, prompt-cache hits, and SSE lines
skipped. A warning is added where a number says the run measured something else than was
asked (late stamps, a stall, retries, another model, cut-short outputs, another tokenizer).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from perfscope.profiler.engines.openai import client as _client
from perfscope.profiler.engines.openai.config import OpenAIConfig
from perfscope.profiler.engines.openai.cost import ClientCost
from perfscope.profiler.engines.openai.kstamp import TransportStats
from perfscope.profiler.engines.openai.stall import RequestSpan, judge_kernel, judge_user

__all__ = [
    "PROMPT_LEN_TOLERANCE",
    "SATURATION_GAP_SHARE",
    "SATURATION_LAG_S",
    "ClientStats",
    "client_report",
    "is_saturated",
]

#: The client is called saturated when its stamps may be late (loop-lag p99) by more than
#: this many seconds *and* by more than ``SATURATION_GAP_SHARE`` of the median gap between a
#: request's chunks: lateness matters relative to what is being measured.
SATURATION_LAG_S = 1e-3
SATURATION_GAP_SHARE = 0.1

#: Prompt lengths differ from the server's count beyond this share (and 2 tokens) on the
#: median request: they are not exact.
PROMPT_LEN_TOLERANCE = 0.05


class ClientStats:
    """Counters of the client over a run (loop thread only)."""

    def __init__(self) -> None:
        self.token_source: Counter[str] = Counter()
        self.mismatched = 0
        self.compared = 0
        self.client_tokens = 0
        self.server_tokens = 0
        self.max_abs_mismatch = 0
        self.multi_token_chunks = 0
        self.chunks = 0
        self.comments = 0
        self.ignored_lines = 0
        self.errors: Counter[str] = Counter()
        self.lag_ns: list[int] = []
        self.retried = 0
        self.retry_reasons: Counter[str] = Counter()
        self.retry_failed = 0
        self.new_connections = 0
        self.connect_ns: list[int] = []
        self.queue_ns: list[int] = []
        self.send_path_ns: list[int] = []
        self.gap_ns: list[float] = []
        self.served_models: Counter[str] = Counter()
        self.finish_reasons: Counter[str] = Counter()
        self.truncated = 0
        self.truncated_examples: list[tuple[int, int, int]] = []
        self.cache_reported = 0
        self.cache_hits = 0
        self.cached_tokens = 0
        self.cache_prompt_tokens = 0
        self.prompt_asked: list[int] = []
        self.prompt_server: list[int] = []
        self.reconciled = 0
        self.unexplained = 0
        self.spans: list[RequestSpan] = []
        self.lag_events: list[tuple[int, int]] = []
        self.kernel_stamped = 0


def client_report(
    st: ClientStats,
    cfg: OpenAIConfig,
    *,
    cpu_s: float,
    wall_s: float,
    cost: ClientCost,
    transport_stats: Sequence[TransportStats],
    workers: int,
    preflight_warnings: Sequence[str],
) -> dict[str, Any]:
    """The client's record of one run (``engine.config.client``), its ``warnings`` last:
    ``preflight_warnings`` first, then those of the run.

    Args:
        st: the counters the serve loop kept.
        cfg: the engine's options (model asked for, connection policy).
        cpu_s, wall_s: the event-loop thread's CPU and wall seconds over the serve (with
            worker processes, the busiest worker's).
        cost: the client's CPU seconds and peak RSS (bytes).
        transport_stats: the kernel-stamp transports' counters (empty: aiohttp stamps).
        workers: event loops that served the streams.
        preflight_warnings: the warnings of the preflight, already logged.
    """
    warnings: list[str] = list(preflight_warnings)
    lag = np.asarray(st.lag_ns, dtype=float) * 1e-9
    cpu_share = cpu_s / wall_s if wall_s > 0 else 0.0
    lag_p50 = float(np.percentile(lag, 50)) if lag.size else None
    lag_p99 = float(np.percentile(lag, 99)) if lag.size else None
    gap = float(np.median(st.gap_ns)) * 1e-9 if st.gap_ns else None
    delays = np.asarray(_client.STAMP_DELAYS_NS, dtype=float) * 1e-9
    delay_p50 = float(np.percentile(delays, 50)) if delays.size else None
    delay_p99 = float(np.percentile(delays, 99)) if delays.size else None
    # The client's own lateness: its loop's work between a chunk's arrival and its stamp.
    # (The lag probe also counts waits for a CPU, which fewer streams would not cure.)
    late = delay_p99 if delay_p99 is not None else (lag_p99 or 0.0)
    kernel_clock = st.kernel_stamped > 0
    # Kernel stamps do not wait for the loop: its lateness is not in them.
    saturated = is_saturated(late, gap) and not kernel_clock
    if kernel_clock:
        ts = TransportStats()
        for t in transport_stats:
            ts.merge(t)
        stall = judge_kernel(
            st.spans, ts.loop_delay_ns, ts.reader_delay_ns, ts.merged_reads, ts.reads
        )
        stall.evidence["kernel_send_stamps"] = ts.kernel_send_stamps
        stall.evidence["user_send_stamps"] = ts.user_send_stamps
        stall.evidence["per_segment_reads"] = ts.per_segment_reads
        stall.evidence["tap_gaps"] = ts.tap_gaps
    else:
        stall = judge_user(st.spans, st.lag_events)
        if lag.size:  # the probe's own distribution, not just the events over 1 ms
            stall.p50_s, stall.p99_s = lag_p50 or 0.0, lag_p99 or 0.0
    n_spans = len(st.spans)
    stamp_clock = (
        "kernel"
        if kernel_clock and st.kernel_stamped == n_spans
        else "mixed"
        if kernel_clock
        else "user"
    )
    client: dict[str, Any] = {
        "loop_lag_s": {
            "samples": int(lag.size),
            "p50": lag_p50,
            "p99": lag_p99,
            "max": float(lag.max()) if lag.size else None,
        },
        "stamp_delay_s": {
            "samples": int(delays.size),
            "p50": delay_p50,
            "p99": delay_p99,
            "max": float(delays.max()) if delays.size else None,
        },
        "chunk_gap_s": gap,
        "stamp_lateness_share_of_gap": late / gap if gap else None,
        "loop_cpu_share": cpu_share,
        "stamp_clock": stamp_clock,
        "stall": stall.to_dict(),
        "cpu_s": cost.cpu_s,
        "peak_rss_bytes": cost.peak_rss_bytes,
        "workers": workers,
        "saturated": saturated,
        "client_queue_s": _pcts(st.queue_ns),
        "send_path_s": _pcts(st.send_path_ns),
        "connect_s": _pcts(st.connect_ns),
        "new_connections": st.new_connections,
        "connection": cfg.connection,
        "retried": st.retried,
        "retry_reasons": dict(st.retry_reasons),
        "retry_failed": st.retry_failed,
        "chunks": st.chunks,
        "multi_token_chunks": st.multi_token_chunks,
        "token_count_source": dict(st.token_source),
        "token_count_mismatch": {
            "compared": st.compared,
            "mismatched": st.mismatched,
            "beyond_round_trip": st.unexplained,
            "reconciled_to_server": st.reconciled,
            "client_tokens": st.client_tokens,
            "server_tokens": st.server_tokens,
            "max_abs": st.max_abs_mismatch,
        },
        "served_models": dict(st.served_models),
        "finish_reasons": dict(st.finish_reasons),
        "truncated": st.truncated,
        "prompt_cache": {
            "requests_reporting": st.cache_reported,
            "requests_hit": st.cache_hits,
            "cached_tokens": st.cached_tokens,
            "prompt_tokens": st.cache_prompt_tokens,
            "share": st.cached_tokens / st.cache_prompt_tokens if st.cache_prompt_tokens else None,
        },
        "sse_comments": st.comments,
        "sse_ignored_lines": st.ignored_lines,
        "errors": dict(st.errors),
    }
    if saturated:
        warnings.append(
            f"perfscope's HTTP client may stamp chunks late by up to {1e3 * late:.2f} ms "
            f"(its own work before a stamp, p99; p50 {1e3 * (delay_p50 or 0.0):.2f} ms), "
            + (f"{late / gap:.0%} of the {1e3 * gap:.2f} ms gap between chunks" if gap else "")
            + f"; loop thread at {100 * cpu_share:.0f}% of a core: use fewer concurrent "
            "streams per client"
        )
    stall_warning = stall.warning()
    if stall_warning is not None:
        warnings.append(stall_warning)
    if st.retried:
        warnings.append(
            f"{st.retried} requests failed before reaching the server (pooled connection "
            f"closed by the server, or the write failed) and were retried once on a new "
            f"connection ({st.retry_failed} failed again); --connection new avoids reuse"
        )
    asked = cfg.model
    other = {m: n for m, n in st.served_models.items() if m != asked}
    if asked and other:
        warnings.append(
            f"{sum(other.values())} responses named model {', '.join(sorted(other))} "
            f"although {asked!r} was requested"
        )
    if st.truncated:
        ex = ", ".join(f"#{r}: {got} of {want}" for r, got, want in st.truncated_examples)
        warnings.append(
            f"{st.truncated} requests were cut short by the server (finish_reason "
            f"'length' before the tokens asked for; {ex}): they count as completed, and "
            "their TPOT and SLO checks use the tokens they delivered"
        )
    # The right tokenizer's round trip differs on a few requests (random-weight output
    # decodes and re-encodes differently); another tokenizer differs on most.
    if st.unexplained and st.unexplained * 2 > st.compared:
        warnings.append(
            f"client and server token counts differ beyond the tokenizer round trip on "
            f"{st.unexplained} of {st.compared} requests (client {st.client_tokens}, "
            f"server {st.server_tokens} tokens): is --tokenizer the server's tokenizer? "
            "The server's counts are used"
        )
    if st.prompt_asked:
        asked_a = np.asarray(st.prompt_asked, dtype=float)
        got = np.asarray(st.prompt_server, dtype=float)
        off = float(np.median(np.abs(got - asked_a)))
        # Judged with the workload in the summary (only generated prompts have a target).
        client["prompt_lengths"] = {
            "asked_min": int(asked_a.min()),
            "asked_max": int(asked_a.max()),
            "server_min": int(got.min()),
            "server_max": int(got.max()),
            "median_abs_diff": off,
            "inexact": off > max(2.0, PROMPT_LEN_TOLERANCE * float(np.median(asked_a))),
        }
    client["warnings"] = warnings
    return client


def is_saturated(late_s: float, gap_s: float | None) -> bool:
    """Whether stamps late by ``late_s`` (event-loop lag p99) distort chunks ``gap_s`` apart
    (median gap between a request's chunks; None: unknown): late by more than
    ``SATURATION_LAG_S`` and by more than ``SATURATION_GAP_SHARE`` of the gap. A 1 ms lag is
    noise against 50 ms gaps and a third of a 3 ms gap; stream counts say nothing."""
    return late_s > SATURATION_LAG_S and (gap_s is None or late_s > SATURATION_GAP_SHARE * gap_s)


def _pcts(values_ns: list[int]) -> dict[str, float | None]:
    """p50 / p99 / max in seconds of a list of ns durations."""
    if not values_ns:
        return {"p50": None, "p99": None, "max": None}
    a = np.asarray(values_ns, dtype=float) * 1e-9
    return {
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }
