"""Projections of the scheduling knobs, and when a ``threads`` change is not projected.

Four knobs are projected apart from a plain change of model, dtype or batch
(``_scheduling_projection``, with a study note): ``prefix-cache`` from each setting's
measured cached prompt tokens (the prefill's work scales by the uncached share);
``replicas`` by the cost model of one replica decoding its share of the batch;
``disaggregate`` by the disaggregation what-if of the baseline alone; ``max-batched-tokens``
by the baseline's fitted cost model stepping the load through the engine's scheduler
(:func:`simulate_budget`) when the study has both, else not at all (no ratio, never 1.0x),
with the disaggregation what-if of the baseline next to it. :func:`oversubscribed_threads`
says why a ``threads`` change is not projected (more threads than the free cores,
:func:`free_cores`). Times are in seconds, throughput in tokens/s, prompt lengths and
budgets in tokens; ratios are unitless.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from functools import partial

from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.overhead import OverheadFit, roof_times
from perfscope.analysis.queueing import Load, LoadTimes
from perfscope.analysis.study.projection import project_change
from perfscope.jsontypes import (
    JsonArray,
    JsonObject,
    ReadOnlyJson,
    json_at,
    json_float,
    json_object,
)

__all__ = ["free_cores", "oversubscribed_threads", "simulate_budget"]


_NO_RATIOS: JsonObject = {"ttft_s": None, "tpot_s": None, "throughput_tok_s": None}
#: Knobs whose projection is not a plain change of model, dtype or batch.
_SCHEDULING_KNOBS = ("prefix-cache", "max-batched-tokens", "disaggregate", "replicas")


def free_cores(summaries: Sequence[ReadOnlyJson]) -> float | None:
    """CPU cores the other processes left free during these runs: the cores less the median
    of the others' CPU seconds over each run's window (its ``contention`` section); ``None``
    when no run measured it."""
    free = []
    for summary in summaries:
        c = json_at(summary, "contention")
        cores, others = json_float(c.get("cpu_count")), json_float(c.get("others_cpu_s"))
        window = json_float(c.get("window_s"))
        if cores and others is not None and window:
            free.append(max(cores - others / window, 0.0))
    return statistics.median(free) if free else None


def oversubscribed_threads(
    baseline_threads: str, threads: str, summaries: Sequence[ReadOnlyJson]
) -> str | None:
    """Why a ``threads`` change is not projected, or ``None`` when it is: more intra-op
    threads than the baseline's and than the whole cores the other load left free during the
    baseline's runs (:func:`free_cores`). Each parallel op then waits for a thread that has
    no core (a scheduler time slice, not a FLOP), which the cost model does not price; on
    this 2-core machine under a load near 10 two threads ran 15-34x slower, not 1x."""
    try:
        base, cand = int(baseline_threads), int(threads)
    except ValueError:
        return None
    free = free_cores(summaries)
    if free is None or cand <= max(base, round(free)):
        return None
    return (
        f"no projection: {cand} threads on {free:.2g} free cores (the other load's share "
        "during the baseline runs) wait for a core at every parallel op, which the cost "
        "model does not price"
    )


def _scheduling_projection(
    knob: str,
    baseline: ReadOnlyJson,
    candidate: ReadOnlyJson,
    *,
    batch: tuple[int, int],
    prompt_len: int,
    output_len: int,
    fit: OverheadFit | None = None,
    loads: tuple[Load | None, Load | None] | None = None,
    values: tuple[str, str] = ("", ""),
    prompt_spec: str = "",
) -> JsonObject:
    """The projection of a scheduling knob, with a ``note`` saying what it rests on.

    ``disaggregate``: the disaggregation what-if below as the TPOT projection. ``replicas``
    (``values``: the two settings): the cost model for one replica decoding
    ``ceil(batch / N)`` sequences (the load split evenly), throughput times N; each replica
    on cores of its own (no contention priced) and no queueing.

    ``prefix-cache``: :func:`project_change` with each setting's measured mean cached prompt
    tokens per request (its ``prompt_cache`` section; 0 without one) at the measured mean
    prompt length, so the prefill's FLOPs and bytes scale by the uncached share.
    ``max-batched-tokens``: no projection (``ratios`` all None; the what-if prices one
    static batch with prefill and decode apart and has no per-step token budget), and next
    to it the advisor's prefill/decode disaggregation what-if for the baseline run
    (``disaggregation``): TPOT x ``1 - decode_stall_share``.
    """
    if knob == "prefix-cache":
        pcs = [json_at(s, "prompt_cache") for s in (baseline, candidate)]
        cached = tuple(round(json_float(pc.get("cached_tokens_mean")) or 0.0) for pc in pcs)
        means = [m for pc in pcs if (m := json_float(pc.get("prompt_tokens_mean")))]
        plen = round(means[0]) if means else prompt_len
        proj = project_change(
            baseline,
            candidate,
            batch=batch,
            prompt_len=plen,
            output_len=output_len,
            cached_prefix_len=(int(cached[0]), int(cached[1])),
            fit=fit,
            loads=loads,
        )
        if proj is None:
            return {
                "ratios": dict(_NO_RATIOS),
                "sol_ratios": dict(_NO_RATIOS),
                "note": "no projection: the baseline run has no roofline",
            }
        shares = [json_float(pc.get("share")) for pc in pcs]
        said = ", ".join(
            "no cache" if sh is None else f"{100 * sh:.0f}% of prompt tokens cached"
            for sh in shares
        )
        cached_lens: JsonArray = [*cached]
        proj["cached_prefix_len"] = cached_lens
        proj["note"] = (
            f"projected with the measured cache use ({said}; {cached[0]} → {cached[1]} cached "
            f"of {plen} prompt tokens per request): prefill FLOPs and bytes scaled by the "
            "uncached share, decode unchanged"
        )
        return proj
    if knob == "replicas":  # one replica decoding ceil(batch / N) sequences, throughput x N
        try:
            n = tuple(max(1, int(v or 1)) for v in values)
        except ValueError:
            n = (1, 1)
        per = (max(1, math.ceil(batch[0] / n[0])), max(1, math.ceil(batch[0] / n[1])))
        proj = project_change(
            baseline, candidate, batch=per, prompt_len=prompt_len, output_len=output_len, fit=fit
        )
        if proj is None:
            return {
                "ratios": dict(_NO_RATIOS),
                "sol_ratios": dict(_NO_RATIOS),
                "note": "no projection: the baseline run has no roofline",
            }
        for key in ("ratios", "sol_ratios"):
            r = json_object(proj.get(key)) or {}
            tok_s = json_float(r.get("throughput_tok_s"))
            if tok_s is not None:
                r["throughput_tok_s"] = tok_s * n[1] / n[0]
        proj["note"] = (
            f"projected with the cost model per replica: {n[1]} replicas decode {per[1]} of the "
            f"{batch[0]} sequences each (baseline {n[0]}: {per[0]}), throughput x{n[1] / n[0]:g}; "
            "assumes each replica has cores of its own (no contention) and an even split"
        )
        return proj
    lat = json_at(baseline, "roofline", "latency")
    share = lat.get("decode_stall_share")
    dis: JsonObject | None = None
    dis_ratios: JsonObject = dict(_NO_RATIOS)
    dis_txt = "no disaggregation what-if (the baseline has no prefill/decode steps to weigh)"
    if isinstance(share, int | float):
        dis_ratios = {"ttft_s": None, "tpot_s": 1.0 - float(share), "throughput_tok_s": None}
        dis = {
            "ratios": dis_ratios,
            "decode_stall_share": float(share),
            "basis": "the baseline's decode time spent waiting for prefill passes disappears "
            "(a second device takes the prefills; KV transfer not priced)",
        }
        dis_txt = (
            f"the disaggregation what-if next to it: TPOT x{1.0 - float(share):.3f} "
            f"({100 * float(share):.0f}% of the baseline's decode time waited for prefills)"
        )
    if knob == "disaggregate":
        return {
            "ratios": dict(dis_ratios),
            "sol_ratios": dict(_NO_RATIOS),
            "disaggregation": dis,
            "note": "projected by the disaggregation what-if alone (TTFT and throughput not "
            "projected; the hand-off is measured, not priced): " + dis_txt,
        }
    budgets = (_budget_of(values[0]), _budget_of(values[1]))
    load0, load1 = loads or (None, None)
    chunked = None
    if fit is not None and load0 is not None and load1 is not None:
        lengths = _prompt_lengths(prompt_spec, load0.requests, prompt_len)
        chunked = _chunked_projection(
            baseline, budgets, fit, (load0, load1), batch, lengths, output_len
        )
    if chunked is not None:
        chunked["disaggregation"] = dis
        chunked["note"] = (
            "projected by the baseline's fitted cost model stepping the load through the "
            "engine's scheduler: without a budget one prefill pass of the admitted prompts "
            "then one decode step; with one, each step the decode rows first and the next "
            "prompt chunks up to the budget (a prompt's first token when its last chunk "
            "ends), each step paying the fitted per-step, per-row and per-layer host time; "
            f"prompts of {min(lengths)}-{max(lengths)} tokens spread over the workload's "
            "distribution; " + dis_txt
        )
        return chunked
    return {
        "ratios": dict(_NO_RATIOS),
        "sol_ratios": dict(_NO_RATIOS),
        "disaggregation": dis,
        "note": "no projection: a per-step token budget is projected from the baseline's "
        "fitted cost model and its load, and this study has "
        + ("no load" if fit is not None else "no fitted cost model")
        + "; "
        + dis_txt,
    }


def _prompt_lengths(spec: str, n: int, mean: int) -> list[int]:
    """``n`` prompt lengths spread over a ``uniform:A:B`` workload (quantiles in a
    golden-ratio order, so neighbours differ as random draws would), else ``mean`` each."""
    parts = str(spec).split(":")
    if len(parts) == 3 and parts[0] == "uniform":
        try:
            lo, hi = float(parts[1]), float(parts[2])
        except ValueError:
            return [mean] * n
        frac = [((i + 1) * 0.6180339887498949) % 1.0 for i in range(n)]
        return [max(1, round(lo + (hi - lo) * f)) for f in frac]
    return [mean] * n


def _budget_of(value: str) -> int | None:
    """A ``max-batched-tokens`` setting as a token budget (``None``: unlimited)."""
    try:
        v = int(str(value).strip())
    except ValueError:
        return None
    return v if v > 0 else None


def _chunked_projection(
    baseline: ReadOnlyJson,
    budgets: tuple[int | None, int | None],
    fit: OverheadFit,
    loads: tuple[Load, Load],
    batch: tuple[int, int],
    prompt_lens: Sequence[int],
    output_len: int,
) -> JsonObject | None:
    """TTFT, TPOT and throughput of each budget by :func:`simulate_budget` with step times
    from ``fit`` (its per-layer term split out as for any projection), and the same at the
    speed of light (the roofline alone, no host time); ``None`` without a roofline."""
    import numpy as np

    from perfscope.hwdb.spec import DeviceSpec

    spec = json_object(json_at(baseline, "hardware").get("spec"))
    model_dict = json_object(baseline.get("model"))
    if not spec or not model_dict:
        return None
    dev = DeviceSpec.from_dict(spec)
    model = ModelSpec.from_dict(dict(model_dict))
    used = fit.split_layers(model.n_layers)
    ctx = statistics.fmean(prompt_lens) + output_len / 2.0

    def step(f: OverheadFit | None, rows: int, chunk: int, chunks: int) -> float:
        decode = (
            float(
                roof_times(model, dev, np.array([rows]), np.array([rows]), np.array([rows * ctx]))[
                    0
                ]
            )
            if rows
            else 0.0
        )
        prompt = (
            float(
                roof_times(model, dev, np.array([1.0]), np.array([chunk]), np.array([chunk / 2.0]))[
                    0
                ]
            )
            if chunk
            else 0.0
        )
        if f is None:  # speed of light
            return decode + prompt
        seqs = max(rows + chunks, 1)
        pre = f.prefill_scale if f.prefill_scale is not None else f.roof_scale
        host = float(f.host_time(float(model.n_layers), seqs, seqs))
        return host + f.roof_scale * decode + pre * prompt

    out: list[tuple[LoadTimes, LoadTimes]] = []
    for budget, load, slots in zip(budgets, loads, batch, strict=True):
        pair = tuple(
            simulate_budget(
                load,
                slots=slots,
                budget=budget,
                step_s=partial(step, f),
                prompt_len=prompt_lens,
                output_len=output_len,
            )
            for f in (used, None)
        )
        out.append((pair[0], pair[1]))
    keys = {"ttft_s": "ttft_p50_s", "tpot_s": "tpot_p50_s", "throughput_tok_s": "throughput_tok_s"}

    def ratio(j: int, key: str) -> float | None:
        a, c = getattr(out[0][j], keys[key]), getattr(out[1][j], keys[key])
        return c / a if a and c is not None else None

    return {
        "ratios": {k: ratio(0, k) for k in keys},
        "sol_ratios": {k: ratio(1, k) for k in keys},
        "baseline": {k: getattr(out[0][0], v) for k, v in keys.items()},
        "candidate": {k: getattr(out[1][0], v) for k, v in keys.items()},
        "basis": "the fitted cost model of the baseline's steps: "
        + used.describe()
        + "".join(f"; {n}" for n in used.notes)
        + "; queueing: "
        + " → ".join(x[0].model for x in out),
        "overhead_fit": used.to_dict(),
        "queue": [
            {
                "queue_p50_s": x[0].queue_p50_s,
                "window_s": x[0].window_s,
                "batch_mean": x[0].batch_mean,
                "model": x[0].model,
            }
            for x in out
        ],
    }


def simulate_budget(
    load: Load,
    *,
    slots: int,
    budget: int | None,
    step_s: Callable[[int, int, int], float],
    prompt_len: int | Sequence[int],
    output_len: int,
) -> LoadTimes:
    """The run of ``load`` on the reference engine's continuous scheduler with a per-step
    token ``budget`` (``None``: unlimited), request ``i``'s prompt ``prompt_len[i]`` tokens
    (or every prompt ``prompt_len``).

    Unlimited: each iteration one prefill pass per distinct length of the admitted prompts
    (``step_s(0, tokens, prompts)``; each prompt's first token when its pass ends), then
    one decode step of the running rows (``step_s(rows, 0, 0)``).
    With a budget: each iteration one step of the decode rows first and then the next
    prompt chunks, in admission order, up to ``budget`` tokens (``step_s(rows, chunk
    tokens, chunks)``); a prompt whose last chunk ends in a step has its first token then
    and decodes from the next step. Requests arrive as :func:`~perfscope.analysis.queueing.
    simulate` has them (a burst, an open loop at the rate, or closed-loop users)."""
    n = max(int(load.requests), 1)
    c = max(int(slots), 1)
    out = max(int(output_len), 1)
    plen = (
        [max(int(prompt_len), 1)] * n
        if isinstance(prompt_len, int)
        else [max(int(x), 1) for x in list(prompt_len)[:n]]
    )
    plen += [plen[-1]] * (n - len(plen))
    users = max(int(load.concurrency or 1), 1) if load.mode == "online" and not load.rate else 0
    arrival: list[float] = [0.0] * n
    if load.mode == "online" and load.rate:
        arrival = [i / float(load.rate) for i in range(n)]
    elif users:
        arrival = [0.0 if i < users else math.inf for i in range(n)]
    start, first, done = [0.0] * n, [0.0] * n, [0.0] * n
    left = [0] * n
    filling: list[list[int]] = []  # [request, prompt tokens still to compute]
    running: list[int] = []
    nxt, t, rows_sum, steps = 0, 0.0, 0, 0

    def finish(i: int) -> None:
        done[i] = t
        if users:  # closed loop: this user sends the next request now
            later = next((j for j in range(nxt, n) if arrival[j] == math.inf), None)
            if later is not None:
                arrival[later] = t

    def started(i: int, at: float | None = None) -> None:
        first[i] = t if at is None else at
        left[i] = out - 1
        if left[i] == 0:
            finish(i)
        else:
            running.append(i)

    while nxt < n or running or filling:
        while len(running) + len(filling) < c and nxt < n and arrival[nxt] <= t:
            start[nxt] = t
            filling.append([nxt, plen[nxt]])
            nxt += 1
        if not running and not filling:
            if nxt >= n or arrival[nxt] == math.inf:
                break
            t = max(t, arrival[nxt])
            continue
        if budget is None:
            # one prefill pass per distinct prompt length (the engine pads nothing), each
            # pass's prompts starting to decode together after the last pass
            by_len: dict[int, list[int]] = {}
            for i, tokens in filling:
                by_len.setdefault(tokens, []).append(i)
            passed = []
            for tokens, group in by_len.items():
                t += step_s(0, tokens * len(group), len(group))
                for i in group:
                    first[i] = t
                passed.extend(group)
            for i in passed:
                started(i, first[i])
            filling = []
            if not running:
                continue
            rows = len(running)
            t += step_s(rows, 0, 0)
            dec = list(running)
            completed: list[int] = []
        else:
            dec = list(running)
            room = budget - len(dec)
            completed = []  # prompts whose last chunk ends in this step
            chunk = chunks = 0
            for f in filling:
                if room <= 0:
                    break
                q = min(f[1], room)
                f[1] -= q
                room -= q
                chunk += q
                chunks += 1
                if f[1] == 0:
                    completed.append(f[0])
            t += step_s(len(dec), chunk, chunks)
            filling = [f for f in filling if f[1] > 0]
        rows_sum += len(dec)
        steps += 1 if dec else 0
        for i in dec:
            left[i] -= 1
            if left[i] == 0:
                finish(i)
        running = [i for i in running if left[i] > 0]
        for i in completed:
            started(i)
    ttft = [first[i] - arrival[i] for i in range(n)]
    tpot = [(done[i] - first[i]) / (out - 1) for i in range(n)] if out > 1 else [0.0] * n
    window = max(done) - min(arrival)
    how = (
        f"all {n} requests at t = 0"
        if load.mode == "batch"
        else f"{n} requests at rate {float(load.rate):g}/s"
        if load.rate
        else f"{n} requests from {users} closed-loop users"
    )
    rule = "no token budget" if budget is None else f"a {budget}-token budget a step"
    return LoadTimes(
        ttft_p50_s=float(statistics.median(ttft)),
        tpot_p50_s=float(statistics.median(tpot)),
        queue_p50_s=float(statistics.median(start[i] - arrival[i] for i in range(n))),
        window_s=window,
        throughput_tok_s=n * out / window if window > 0 else None,
        batch_mean=rows_sum / steps if steps else 0.0,
        model=f"the engine's scheduler with {rule}, {c} slots, stepped with projected steps, {how}",
    )
