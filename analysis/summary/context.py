"""The run's context (CPU contention, its run set) and the sections from the client and
the server: prompt cache, the HTTP client, the server's own metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from perfscope.analysis._record import Record
from perfscope.jsontypes import JsonObject

__all__ = [
    "Client",
    "Contention",
    "CostModelWork",
    "LlamacppCounters",
    "PromptCache",
    "RunSet",
    "ServerLatency",
    "ServerMetrics",
    "ServerWork",
    "TtftSplit",
]


@dataclass(frozen=True, kw_only=True)
class Contention(Record):
    """CPU time other processes and the hypervisor took during the run
    (:mod:`perfscope.profiler.contention`): the window (s), the machine's cores, CPU seconds
    of this process, of the others and stolen, their shares of the capacity (0..1; ``None``
    when the window was ``too_short``), the server under test (ports, pids, CPU-s, not counted
    as others) and ``contended``: others or steal above :data:`CONTENTION_WARN_SHARE`.

    ``helper_pids``/``helper_cpu_s``: a ``--ray`` run's own helpers (load actors, the request
    mailbox, the Ray daemons) and their CPU seconds, not counted as others; ``excluded_s``:
    the start-up time left out of the window (s); ``loadavg_1m``: the 1-minute load average
    at the end. Runs recorded before perfscope measured them lack them (and their summaries
    keep them out).
    """

    window_s: float | None = None
    cpu_count: int | None = None
    own_cpu_s: float | None = None
    others_cpu_s: float | None = None
    others_share: float | None = None
    steal_s: float | None = None
    steal_share: float | None = None
    server_ports: tuple[int, ...] = ()
    server_pids: tuple[int, ...] = ()
    server_cpu_s: float | None = None
    too_short: bool = False
    min_window_s: float | None = None
    contended: bool = False
    helper_pids: tuple[int, ...] = ()
    helper_cpu_s: float | None = None
    excluded_s: float | None = None
    loadavg_1m: float | None = None

    _NEWER: ClassVar[tuple[str, ...]] = ("helper_pids", "helper_cpu_s", "excluded_s", "loadavg_1m")


@dataclass(frozen=True, kw_only=True)
class RunSet(Record):
    """The repeated set a run belongs to (``--repeat``): the set ``id``, its ``label``, this
    run's ``index`` (0-based) of ``repeat`` runs, and whether it was ``interleaved`` with a
    ``--vs`` set.

    A run made in balanced blocks (``run --repeat N --vs``, ``perfscope noise``) also records
    its ``experiment`` id, the order ``seed``, the ``arms`` (labels), its ``block`` and its
    ``position`` in it (0: ran first) and the block's ``order`` (``AB``/``BA``); ``noise``
    marks a noise measurement's A/A' arms and ``warmup`` a discarded warm-up run. Those are
    written only when the run has them (``_NEWER``).
    """

    id: str = ""
    label: str | None = None
    index: int = 0
    repeat: int = 1
    interleaved: bool = False
    experiment: str | None = None
    seed: int | None = None
    noise: bool | None = None
    arms: tuple[str, ...] = ()
    block: int | None = None
    position: int | None = None
    order: str | None = None
    warmup: bool | None = None

    _NEWER: ClassVar[tuple[str, ...]] = (
        "experiment",
        "seed",
        "noise",
        "arms",
        "block",
        "position",
        "order",
        "warmup",
    )


@dataclass(frozen=True, kw_only=True)
class PromptCache(Record):
    """Prefix-cache statistics over the measured, successful requests that report
    ``cached_tokens``: how many report and hit, the hit rate (0..1), cached and prompt token
    sums, ``share`` (cached / prompt tokens) and per-request means (tokens)."""

    requests_reporting: int = 0
    requests_hit: int = 0
    hit_rate: float | None = None
    cached_tokens: int = 0
    prompt_tokens: int = 0
    share: float | None = None
    cached_tokens_mean: float | None = None
    prompt_tokens_mean: float | None = None


@dataclass(frozen=True, kw_only=True)
class Client(Record):
    """The HTTP client's own account of a run (:mod:`perfscope.analysis.client`):
    ``cpu_s`` its CPU seconds over the serve loop, ``peak_rss_bytes`` its peak resident set
    (bytes), ``stamp_clock`` which clock stamped the chunks (``kernel``, ``user``, ``mixed``)
    and ``stall`` the stall record (threshold, worst and p99 read delay in seconds, requests
    affected) when the client measured one."""

    cpu_s: float | None = None
    peak_rss_bytes: int | None = None
    stamp_clock: str | None = None
    stall: JsonObject | None = None


@dataclass(frozen=True, kw_only=True)
class ServerLatency(Record):
    """One latency the server measured over the run: the mean (s) of its histogram's
    ``_sum``/``_count`` deltas, the count, and the ``metric`` it came from."""

    mean_s: float | None = None
    count: int = 0
    metric: str = ""


@dataclass(frozen=True, kw_only=True)
class TtftSplit(Record):
    """The client's mean TTFT split (s): the server's TTFT (its queue, prefill and the rest
    of it) and the remainder, the client/network/front-end share (``client_network_s``).

    ``stamp_clock``: which clock stamped the client's chunks (with a stall record). When the
    client's user-space stamps stalled, the remainder is ``client_network_or_stall_s`` and
    ``client_network_s`` is ``None`` (a stall is never booked as network time), with the
    worst stall ``client_stall_max_s`` (s). Those three are left out of the JSON when unset.
    """

    client_ttft_mean_s: float | None = None
    server_ttft_mean_s: float | None = None
    client_network_s: float | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    server_other_s: float | None = None
    stamp_clock: str | None = None
    client_network_or_stall_s: float | None = None
    client_stall_max_s: float | None = None

    def _omitted(self) -> frozenset[str]:
        out = {"stamp_clock"} if self.stamp_clock is None else set()
        if self.client_stall_max_s is None:
            out |= {"client_network_or_stall_s", "client_stall_max_s"}
        return frozenset(out)


@dataclass(frozen=True, kw_only=True)
class LlamacppCounters(Record):
    """llama.cpp's counters over the run: prompt-processing busy time (s, batched prefills
    counted once), prompt tokens and their rate per busy second, generation time (s) and
    tokens, the mean time per output token (s), decode calls and tokens per call."""

    prompt_busy_s: float | None = None
    prompt_tokens: float | None = None
    prompt_tokens_per_busy_s: float | None = None
    generation_s: float | None = None
    generation_tokens: float | None = None
    tpot_mean_s: float | None = None
    decode_calls: float | None = None
    tokens_per_decode_call: float | None = None


@dataclass(frozen=True, kw_only=True)
class CostModelWork(Record):
    """perfscope's cost model for the run's completed, measured requests: ``flops`` (FLOP,
    batch-invariant) and, when the server's step count is known (``engine_steps``, left out
    of the JSON otherwise), ``bytes`` (weights read once per step plus KV and activations)."""

    flops: float = 0.0
    bytes: float | None = None
    requests: int = 0
    engine_steps: float | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ("engine_steps",)


@dataclass(frozen=True, kw_only=True)
class ServerWork(Record):
    """vLLM's estimated work counters over the run (FLOP, bytes read and written, engine
    steps) beside the cost model's, and their ratios server / model (left out of the JSON
    when there is no model figure to divide by)."""

    server_flops: float | None = None
    server_read_bytes: float | None = None
    server_write_bytes: float | None = None
    engine_steps: float | None = None
    cost_model: CostModelWork | None = None
    flops_ratio_server_to_model: float | None = None
    bytes_ratio_server_to_model: float | None = None

    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = (
        "flops_ratio_server_to_model",
        "bytes_ratio_server_to_model",
    )


@dataclass(frozen=True, kw_only=True)
class ServerMetrics(Record):
    """The server's own Prometheus metrics over the run
    (:mod:`perfscope.analysis.server_metrics`), or ``available`` false with the ``reason``.

    ``latency``: per phase (ttft, queue, prefill, decode, tpot, e2e) the server's mean (s),
    count and metric name; ``tokens``: prompt, generation and cached token deltas;
    ``ttft_split``: the client's TTFT split into network, queue and prefill (s); ``work``:
    the server's FLOP/byte counters against the cost model; ``series``: ``[t_s, value]``
    points of running/waiting requests, KV-cache usage (0..1) and preemptions.
    """

    available: bool = False
    reason: str | None = None
    server: str | None = None
    url: str | None = None
    window_s: float | None = None
    scrapes: int | None = None
    interval_s: float | None = None
    latency: dict[str, ServerLatency] = field(default_factory=dict)
    tokens: dict[str, float | None] = field(default_factory=dict)
    requests: int | None = None
    preemptions: float | None = None
    prefix_cache_hit_rate: float | None = None
    spec_decode_acceptance: float | None = None
    running_max: float | None = None
    waiting_max: float | None = None
    kv_cache_usage_max: float | None = None
    llamacpp: LlamacppCounters | None = None
    ttft_split: TtftSplit | None = None
    client_tpot_mean_s: float | None = None
    work: ServerWork | None = None
    series: dict[str, list[list[float]]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
