"""The server's own view of a run, from its Prometheus metrics (``server_metrics.parquet``).

Per-run means come from histogram ``_sum``/``_count`` deltas between the start and end
snapshots, never from buckets (vLLM's are 10 ms wide for ITL and 0.3 s for request times).
Gauges (running and waiting requests, KV-cache usage) become time series on the run's clock;
counters (preemptions, prefix-cache queries and hits, speculative drafts) become totals for the
run and per-interval rates.

Every number here is the server's: its TTFT starts when the request reached its engine (after
HTTP parsing and tokenisation), so it is a lower bound of what a client sees; the gap to the
client's TTFT is the client/network/front-end share.

llama.cpp: ``llamacpp:prompt_seconds_total`` is prompt-processing *busy* time. With several
slots prefilled in one batch it is far below the sum of the requests' own prompt times (0.19 s
against 0.44 s in the recorded fixture), so it is reported as busy time and prompt throughput
and never divided by a request count into a per-request prefill or TTFT.
``tokens_predicted_seconds_total`` does equal the sum of the requests' own generation times, so
its ratio to ``tokens_predicted_total`` is the server's mean time per output token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from perfscope.analysis.costmodel import prefill_cost, step_cost, weight_bytes
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.summary import (
    CostModelWork,
    LlamacppCounters,
    ServerLatency,
    ServerMetrics,
    ServerWork,
    TtftSplit,
)

__all__ = [
    "SERVER_METRIC_NAMES",
    "ServerMetricNames",
    "histogram_delta",
    "server_metrics_section",
]


@dataclass(frozen=True)
class ServerMetricNames:
    """Which metric of one server means what (None: the server does not export it).

    Latency histograms (seconds): ``ttft``, ``itl`` (per token), ``tpot`` (per request),
    ``e2e``, ``queue``, ``prefill``, ``decode``, ``inference``. Gauges: ``running``,
    ``waiting``, ``kv_usage`` (fraction 0..1). Counters: ``prompt_tokens``,
    ``generation_tokens``, ``cached_tokens``, ``preemptions``, ``prefix_queries``,
    ``prefix_hits``, ``spec_accepted``, ``spec_drafted``, ``flops``, ``read_bytes``,
    ``write_bytes``, ``iterations`` (engine steps: a histogram's count).
    Gauges some servers give instead of counters: ``prefix_hit_rate_gauge``,
    ``spec_accept_rate_gauge``.
    """

    ttft: str | None = None
    itl: str | None = None
    tpot: str | None = None
    e2e: str | None = None
    queue: str | None = None
    prefill: str | None = None
    decode: str | None = None
    inference: str | None = None
    running: str | None = None
    waiting: str | None = None
    kv_usage: str | None = None
    prompt_tokens: str | None = None
    generation_tokens: str | None = None
    cached_tokens: str | None = None
    preemptions: str | None = None
    prefix_queries: str | None = None
    prefix_hits: str | None = None
    spec_accepted: str | None = None
    spec_drafted: str | None = None
    flops: str | None = None
    read_bytes: str | None = None
    write_bytes: str | None = None
    iterations: str | None = None
    prefix_hit_rate_gauge: str | None = None
    spec_accept_rate_gauge: str | None = None


#: Names per server kind (vLLM 0.32, SGLang's collector, TGI 3.x docs, llama.cpp 0c1e570).
SERVER_METRIC_NAMES: dict[str, ServerMetricNames] = {
    "vllm": ServerMetricNames(
        ttft="vllm:time_to_first_token_seconds",
        itl="vllm:inter_token_latency_seconds",
        tpot="vllm:request_time_per_output_token_seconds",
        e2e="vllm:e2e_request_latency_seconds",
        queue="vllm:request_queue_time_seconds",
        prefill="vllm:request_prefill_time_seconds",
        decode="vllm:request_decode_time_seconds",
        inference="vllm:request_inference_time_seconds",
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        kv_usage="vllm:kv_cache_usage_perc",
        prompt_tokens="vllm:prompt_tokens_total",
        generation_tokens="vllm:generation_tokens_total",
        cached_tokens="vllm:prompt_tokens_cached_total",
        preemptions="vllm:num_preemptions_total",
        prefix_queries="vllm:prefix_cache_queries_total",
        prefix_hits="vllm:prefix_cache_hits_total",
        spec_accepted="vllm:spec_decode_num_accepted_tokens_total",
        spec_drafted="vllm:spec_decode_num_draft_tokens_total",
        flops="vllm:estimated_flops_per_gpu_total",
        read_bytes="vllm:estimated_read_bytes_per_gpu_total",
        write_bytes="vllm:estimated_write_bytes_per_gpu_total",
        iterations="vllm:iteration_tokens_total",
    ),
    "sglang": ServerMetricNames(
        ttft="sglang:time_to_first_token_seconds",
        itl="sglang:inter_token_latency_seconds",
        e2e="sglang:e2e_request_latency_seconds",
        queue="sglang:queue_time_seconds",
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        kv_usage="sglang:token_usage",
        prompt_tokens="sglang:prompt_tokens_total",
        generation_tokens="sglang:generation_tokens_total",
        cached_tokens="sglang:cached_tokens_total",
        preemptions="sglang:num_retracted_requests_total",
        prefix_hit_rate_gauge="sglang:cache_hit_rate",
        spec_accept_rate_gauge="sglang:spec_accept_rate",
    ),
    "tgi": ServerMetricNames(
        tpot="tgi_request_mean_time_per_token_duration",
        e2e="tgi_request_duration",
        queue="tgi_request_queue_duration",
        inference="tgi_request_inference_duration",
        running="tgi_batch_current_size",
        waiting="tgi_queue_size",
    ),
    "llamacpp": ServerMetricNames(
        running="llamacpp:requests_processing",
        waiting="llamacpp:requests_deferred",
        kv_usage="llamacpp:kv_cache_usage_ratio",
        prompt_tokens="llamacpp:prompt_tokens_total",
        generation_tokens="llamacpp:tokens_predicted_total",
        cached_tokens="llamacpp:prompt_tokens_cached_total",
        spec_accepted="llamacpp:spec_decode_num_accepted_tokens_total",
        spec_drafted="llamacpp:spec_decode_num_draft_tokens_total",
    ),
}

_LATENCY_KEYS = ("ttft", "itl", "tpot", "e2e", "queue", "prefill", "decode", "inference")
#: Gauges that are shares (averaged over label sets); others are summed.
_SHARE_KEYS = ("kv_usage", "prefix_hit_rate_gauge", "spec_accept_rate_gauge")
#: Most points per time series in the summary (longer series are thinned evenly).
MAX_SERIES_POINTS = 400


def _snapshot(frame: pd.DataFrame, which: str) -> pd.DataFrame:
    sub: pd.DataFrame = frame[frame["snapshot"] == which]
    if sub.empty:
        return sub
    t = sub["t"].max() if which == "end" else sub["t"].min()
    out: pd.DataFrame = sub[sub["t"] == t]
    return out


def _total(snap: pd.DataFrame, name: str) -> float | None:
    """Sum of ``name`` over its label sets in one snapshot (None: absent)."""
    vals = snap.loc[snap["name"] == name, "value"]
    return float(vals.sum()) if len(vals) else None


def _delta(start: pd.DataFrame, end: pd.DataFrame, name: str | None) -> float | None:
    if name is None:
        return None
    a, b = _total(start, name), _total(end, name)
    if a is None or b is None:
        return None
    return b - a


def histogram_delta(
    start: pd.DataFrame, end: pd.DataFrame, name: str
) -> tuple[float, float] | None:
    """(sum delta, count delta) of histogram ``name`` between two snapshots (None: absent
    or a counter reset between them)."""
    s = _delta(start, end, f"{name}_sum")
    c = _delta(start, end, f"{name}_count")
    if s is None or c is None or c < 0 or s < 0:
        return None
    return s, c


def _series(frame: pd.DataFrame, name: str | None, *, share: bool) -> pd.Series:
    """``name`` per scrape (sum or mean over label sets), indexed by run time in seconds."""
    if name is None:
        return pd.Series(dtype=float)
    sub = frame[frame["name"] == name]
    if sub.empty:
        return pd.Series(dtype=float)
    grouped = sub.groupby("t")["value"]
    values = grouped.mean() if share else grouped.sum()
    values.index = values.index.astype(np.float64) * 1e-9
    return values.sort_index()


def _points(series: pd.Series) -> list[list[float]]:
    if series.empty:
        return []
    if len(series) > MAX_SERIES_POINTS:
        idx = np.linspace(0, len(series) - 1, MAX_SERIES_POINTS).round().astype(int)
        series = series.iloc[np.unique(idx)]
    return [[float(t), float(v)] for t, v in zip(series.index, series.to_numpy(), strict=True)]


def _ratio_series(num: pd.Series, den: pd.Series) -> pd.Series:
    """Per-interval ratio of two counters' increments (NaN where the denominator did not move)."""
    if num.empty or den.empty:
        return pd.Series(dtype=float)
    joined = pd.concat([num.rename("n"), den.rename("d")], axis=1).dropna()
    dn, dd = joined["n"].diff(), joined["d"].diff()
    out = (dn / dd.where(dd > 0)).iloc[1:]
    return out.dropna()


def _mean(pair: tuple[float, float] | None) -> float | None:
    if pair is None or pair[1] <= 0:
        return None
    return pair[0] / pair[1]


def _cost_model_work(
    model: ModelSpec, requests: pd.DataFrame, iterations: float | None
) -> CostModelWork | None:
    """perfscope's cost model for the run's completed requests: FLOPs (batch-invariant) and,
    when the server's step count is known, bytes (weights read once per step)."""
    if requests.empty:
        return None
    ok = requests[requests["error"].isna()]
    if "is_warmup" in ok:
        ok = ok[~ok["is_warmup"].astype(bool)]
    if ok.empty:
        return None
    flops = 0.0
    kv_act_bytes = 0.0
    for p, o in zip(ok["prompt_tokens"], ok["output_tokens"], strict=True):
        p, o = int(p), int(o)
        pre = prefill_cost(model, 1, p)
        flops += pre.flops
        kv_act_bytes += pre.bytes - pre.bytes_weights
        steps = max(o - 1, 0)
        if steps:
            ctx = p + np.arange(steps, dtype=np.float64)
            dec = [step_cost(model, 1, 1, int(c)) for c in (ctx[0], ctx[-1])]
            # Cost is affine in the context length: the mean of the ends times the steps.
            flops += steps * (dec[0].flops + dec[1].flops) / 2
            kv_act_bytes += steps * sum(d.bytes - d.bytes_weights for d in dec) / 2
    if iterations is None or iterations <= 0:
        return CostModelWork(flops=flops, requests=len(ok))
    return CostModelWork(
        flops=flops,
        bytes=iterations * weight_bytes(model) + kv_act_bytes,
        requests=len(ok),
        engine_steps=iterations,
    )


def server_metrics_section(
    frame: pd.DataFrame,
    info: Mapping[str, Any] | None = None,
    *,
    client_ttft_mean_s: float | None = None,
    client_tpot_mean_s: float | None = None,
    model: ModelSpec | None = None,
    requests: pd.DataFrame | None = None,
    client_stall: Mapping[str, Any] | None = None,
) -> ServerMetrics:
    """The ``server_metrics`` section: the server's own metrics over the run.

    Args:
        frame: ``server_metrics.parquet`` rows (t ns, snapshot, name, labels, value).
        info: the manifest's ``server_metrics`` entry (URL, server kind, scrapes, errors).
        client_ttft_mean_s / client_tpot_mean_s: perfscope's own means, for the split.
        model: the served model, for the cost-model comparison with vLLM's work counters.
        requests: REQUEST_SCHEMA rows, for the cost model.
        client_stall: the client's stall record (``manifest.engine.config.client.stall``):
            a stall inside user-space stamps is never booked as network time.

    Returns:
        The :class:`~perfscope.analysis.summary.ServerMetrics` record, or one with
        ``available`` false and the ``reason``.
    """
    info = info or {}
    base = ServerMetrics(
        reason=info.get("reason") or "no server metrics were recorded",
        server=info.get("server"),
        url=info.get("url"),
    )
    if frame is None or frame.empty:
        return base
    start, end = _snapshot(frame, "start"), _snapshot(frame, "end")
    kind = info.get("server")
    if kind is None:
        kind = _detect(frame["name"].unique())
    names = SERVER_METRIC_NAMES.get(kind or "")
    if names is None:
        return replace(base, reason="the endpoint exports no metrics of a known server")
    if start.empty or end.empty:
        return replace(base, server=kind, reason="the start or end snapshot is missing")
    notes: list[str] = []
    t0, t1 = float(start["t"].iloc[0]) * 1e-9, float(end["t"].iloc[0]) * 1e-9

    latency: dict[str, ServerLatency] = {}
    for key in _LATENCY_KEYS:
        name = getattr(names, key)
        pair = histogram_delta(start, end, name) if name else None
        if pair is None:
            continue
        latency[key] = ServerLatency(mean_s=_mean(pair), count=round(pair[1]), metric=name)

    tokens = {
        "prompt": _delta(start, end, names.prompt_tokens),
        "generation": _delta(start, end, names.generation_tokens),
        "prompt_cached": _delta(start, end, names.cached_tokens),
    }
    n_requests = latency["e2e"].count if "e2e" in latency else None

    hit_rate = None
    q, h = _delta(start, end, names.prefix_queries), _delta(start, end, names.prefix_hits)
    if q is not None and h is not None and q > 0:
        hit_rate = h / q
    elif names.prefix_hit_rate_gauge:
        hit_rate = _total(end, names.prefix_hit_rate_gauge)

    acceptance = None
    acc, drafted = _delta(start, end, names.spec_accepted), _delta(start, end, names.spec_drafted)
    if acc is not None and drafted is not None and drafted > 0:
        acceptance = acc / drafted
    elif names.spec_accept_rate_gauge:
        g = _series(frame, names.spec_accept_rate_gauge, share=True)
        acceptance = float(g[g > 0].mean()) if (g > 0).any() else None

    llamacpp: LlamacppCounters | None = None
    if kind == "llamacpp":
        llamacpp = _llamacpp_block(start, end)
        if llamacpp.tpot_mean_s is not None:
            latency["tpot"] = ServerLatency(
                mean_s=llamacpp.tpot_mean_s,
                count=int(llamacpp.generation_tokens or 0),
                metric="llamacpp:tokens_predicted_seconds_total / tokens_predicted_total",
            )
        notes.append(
            "llama.cpp exports no TTFT, queue or per-request prefill time; its "
            "prompt_seconds_total is prompt busy time (batched prefills counted once), "
            "reported as busy time and throughput, not as per-request prefill"
        )

    split = _ttft_split(latency, client_ttft_mean_s, client_stall)
    if split is not None and split.client_stall_max_s is not None:
        notes.append(
            f"the client stalled up to {1e3 * split.client_stall_max_s:.0f} ms with "
            "user-space stamps: the TTFT beyond the server's is client stall and network "
            "together, not network time"
        )
    server_tpot = latency["tpot"].mean_s if "tpot" in latency else None
    if client_tpot_mean_s is not None and server_tpot and client_tpot_mean_s < 0.9 * server_tpot:
        notes.append(
            f"the client's TPOT ({1e3 * client_tpot_mean_s:.2f} ms) is below the server's "
            f"({1e3 * server_tpot:.2f} ms): the client read chunks bunched "
            "(a stall), so its inter-token times are too short"
        )
    if split is None and client_ttft_mean_s is not None and "ttft" not in latency:
        notes.append("the server exports no TTFT: TTFT cannot be split")

    work: ServerWork | None = None
    flops_d = _delta(start, end, names.flops)
    if flops_d is not None:
        work = _work(start, end, names, flops_d, model, requests)
        if flops_d == 0:
            notes.append(
                "vLLM's estimated FLOP/byte counters did not move (they are off unless the "
                "server enables its MFU metrics)"
            )

    running = _series(frame, names.running, share=False)
    waiting = _series(frame, names.waiting, share=False)
    kv = _series(frame, names.kv_usage, share=True)
    preempt = _series(frame, names.preemptions, share=False)
    series: dict[str, list[list[float]]] = {
        "running": _points(running),
        "waiting": _points(waiting),
        "kv_cache_usage": _points(kv),
        "preemptions": _points(preempt - preempt.iloc[0]) if not preempt.empty else [],
    }
    if names.prefix_hits and names.prefix_queries:
        series["prefix_cache_hit_rate"] = _points(
            _ratio_series(
                _series(frame, names.prefix_hits, share=False),
                _series(frame, names.prefix_queries, share=False),
            )
        )
    elif names.prefix_hit_rate_gauge:
        series["prefix_cache_hit_rate"] = _points(
            _series(frame, names.prefix_hit_rate_gauge, share=True)
        )
    if names.spec_accepted and names.spec_drafted:
        series["spec_decode_acceptance"] = _points(
            _ratio_series(
                _series(frame, names.spec_accepted, share=False),
                _series(frame, names.spec_drafted, share=False),
            )
        )
    series = {k: v for k, v in series.items() if v}

    return ServerMetrics(
        available=True,
        reason=None,
        server=kind,
        url=info.get("url"),
        window_s=t1 - t0,
        scrapes=int(frame["t"].nunique()),
        interval_s=info.get("interval_s"),
        latency=latency,
        tokens=tokens,
        requests=n_requests,
        preemptions=_delta(start, end, names.preemptions),
        prefix_cache_hit_rate=hit_rate,
        spec_decode_acceptance=acceptance,
        running_max=float(running.max()) if not running.empty else None,
        waiting_max=float(waiting.max()) if not waiting.empty else None,
        kv_cache_usage_max=float(kv.max()) if not kv.empty else None,
        llamacpp=llamacpp,
        ttft_split=split,
        client_tpot_mean_s=client_tpot_mean_s,
        work=work,
        series=series,
        notes=tuple(notes),
    )


def _work(
    start: pd.DataFrame,
    end: pd.DataFrame,
    names: ServerMetricNames,
    flops: float,
    model: ModelSpec | None,
    requests: pd.DataFrame | None,
) -> ServerWork:
    """vLLM's work counters over the run (``flops``: its FLOP delta) beside the cost model's
    for the same requests, when the model is known."""
    iterations = histogram_delta(start, end, names.iterations) if names.iterations else None
    steps = iterations[1] if iterations else None
    work = ServerWork(
        server_flops=flops,
        server_read_bytes=_delta(start, end, names.read_bytes),
        server_write_bytes=_delta(start, end, names.write_bytes),
        engine_steps=steps,
    )
    if model is None or requests is None:
        return work
    cm = _cost_model_work(model, requests, steps)
    server_bytes = (work.server_read_bytes or 0.0) + (work.server_write_bytes or 0)
    return replace(
        work,
        cost_model=cm,
        flops_ratio_server_to_model=flops / cm.flops if cm and flops > 0 else None,
        bytes_ratio_server_to_model=(
            server_bytes / cm.bytes if cm and cm.bytes and server_bytes > 0 else None
        ),
    )


def _detect(names: Any) -> str | None:
    """The server kind whose metric prefix the most names carry."""
    prefixes = {"vllm:": "vllm", "sglang:": "sglang", "tgi_": "tgi", "llamacpp:": "llamacpp"}
    counts: dict[str, int] = {}
    for name in names:
        for prefix, k in prefixes.items():
            if str(name).startswith(prefix):
                counts[k] = counts.get(k, 0) + 1
    return max(counts, key=lambda k: counts[k]) if counts else None


def _ttft_split(
    latency: Mapping[str, ServerLatency],
    client_ttft: float | None,
    stall: Mapping[str, Any] | None = None,
) -> TtftSplit | None:
    """Client TTFT = client/network/front-end + server queue + server prefill + other.

    When the client's stamps are user-space and it stalled (``stall``: its stall record),
    the part beyond the server's TTFT is ``client_network_or_stall_s`` and
    ``client_network_s`` is None: a stall is never booked as network time."""
    server = latency["ttft"].mean_s if "ttft" in latency else None
    if server is None:
        return None
    queue = latency["queue"].mean_s if "queue" in latency else None
    prefill = latency["prefill"].mean_s if "prefill" in latency else None
    network = (client_ttft - server) if client_ttft is not None else None
    split = TtftSplit(
        client_ttft_mean_s=client_ttft,
        server_ttft_mean_s=server,
        client_network_s=network,
        queue_s=queue,
        prefill_s=prefill,
        server_other_s=server - queue - prefill
        if queue is not None and prefill is not None
        else None,
    )
    if not stall:
        return split
    split = replace(split, stamp_clock=stall.get("clock"))
    if stall.get("in_stamps") and stall.get("stalled"):
        split = replace(
            split,
            client_network_or_stall_s=network,
            client_network_s=None,
            client_stall_max_s=stall.get("worst_s"),
        )
    return split


def _llamacpp_block(start: pd.DataFrame, end: pd.DataFrame) -> LlamacppCounters:
    def d(name: str) -> float | None:
        return _delta(start, end, f"llamacpp:{name}")

    prompt_s, prompt_tok = d("prompt_seconds_total"), d("prompt_tokens_total")
    gen_s, gen_tok = d("tokens_predicted_seconds_total"), d("tokens_predicted_total")
    decodes = d("n_decode_total")

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b and b > 0 and math.isfinite(a) else None

    return LlamacppCounters(
        prompt_busy_s=prompt_s,
        prompt_tokens=prompt_tok,
        prompt_tokens_per_busy_s=ratio(prompt_tok, prompt_s),
        generation_s=gen_s,
        generation_tokens=gen_tok,
        tpot_mean_s=ratio(gen_s, gen_tok),
        decode_calls=decodes,
        tokens_per_decode_call=ratio(gen_tok, decodes),
    )
