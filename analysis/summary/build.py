"""How a run's :class:`Summary` is built from its manifest and tables, and the warnings that
say which of its numbers to trust less."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from perfscope.analysis.catalogue import format_seconds
from perfscope.analysis.manifest import (
    CONTENTION_WARN_SHARE,
    RunManifest,
    is_contended,
    manifest_view,
    server_share,
)
from perfscope.analysis.summary.context import (
    Contention,
)
from perfscope.analysis.summary.measured import (
    EngineInfo,
    StepStats,
)
from perfscope.jsontypes import json_float, json_object

if TYPE_CHECKING:  # the typed record loads without pandas or hwdb (`perfscope ls` reads it)
    import pandas as pd

__all__ = [
    "CACHE_WARN_SHARE",
    "CACHING_WORKLOADS",
    "CONTENTION_WARN_SHARE",
    "contention_record",
    "engine_info",
    "run_warnings",
    "server_share",
    "step_breakdown",
]


def step_breakdown(steps: pd.DataFrame) -> dict[str, StepStats]:
    """Per step kind: passes, time (s), tokens processed, mean batch size, share of busy time.

    A draft model's passes (speculative decoding) are kinds of their own: ``draft_prefill``,
    ``draft_decode``."""
    if steps.empty:
        return {}
    dur = (steps["t_end"] - steps["t_start"]) * 1e-9
    total = float(dur.sum())
    out: dict[str, StepStats] = {}
    key = steps["kind"].astype(str)
    if "role" in steps:
        key = key.where((steps["role"] != "draft").to_numpy(), "draft_" + key)
    for kind, g in steps.assign(dur=dur, _key=key).groupby("_key", sort=True):
        t = float(g["dur"].sum())
        out[str(kind)] = StepStats(
            count=len(g),
            time_s=t,
            time_share=t / total if total > 0 else 0.0,
            new_tokens=int(g["new_tokens"].sum()),
            context_tokens=int(g["context_tokens"].sum()),
            mean_batch_size=float(g["batch_size"].mean()),
            mean_step_s=t / len(g),
        )
    return out


def engine_info(manifest: Mapping[str, Any] | RunManifest) -> EngineInfo:
    """The engine the run measured, as the manifest records it."""
    engine = manifest_view(manifest).engine
    return EngineInfo(uri=engine.uri, kind=engine.kind, device=engine.device, dtype=engine.dtype)


def contention_record(manifest: Mapping[str, Any] | RunManifest) -> Contention | None:
    """The run's CPU contention measurement with ``contended`` (others, steal, or others and
    the server under test on this machine together above :data:`CONTENTION_WARN_SHARE`: a
    server that takes the cores the client needs delays the client's stamps as any other
    process would; :func:`~perfscope.analysis.manifest.is_contended`); ``None`` when the run
    has none. A window too short to measure has no shares and is never called contended."""
    c = manifest_view(manifest).host.contention
    if c is None:
        return None
    return Contention.from_dict({**c, "contended": is_contended(c)})


def run_warnings(manifest: Mapping[str, Any] | RunManifest) -> list[str]:
    """Conditions that make this run's numbers less trustworthy, as sentences."""
    man = manifest_view(manifest)
    # Recorded at capture (counts beyond max_tokens, a crashed run read back, ...).
    out: list[str] = list(man.warnings)
    c = contention_record(man) or Contention()
    if c.others_share is not None and c.others_share > CONTENTION_WARN_SHARE:
        out.append(
            f"other processes used {c.others_share:.0%} of this machine's CPU capacity during "
            f"the run ({c.others_cpu_s or 0:.1f} CPU-s over {c.window_s or 0:.1f} s on "
            f"{c.cpu_count} cores"
            + (
                f"; the server under test on port {', '.join(map(str, c.server_ports))} "
                f"used {c.server_cpu_s:.1f} CPU-s, counted apart"
                if c.server_cpu_s is not None and c.server_ports
                else ""
            )
            + "): latencies and throughput are likely inflated; measure on a quiet machine"
        )
    shared = server_share(man.host.contention or {})
    if shared is not None and shared > CONTENTION_WARN_SHARE:
        out.append(
            f"the server under test shares this machine: on port "
            f"{', '.join(map(str, c.server_ports))} it used {shared:.0%} of the CPU capacity "
            f"({c.server_cpu_s or 0:.1f} CPU-s over {c.window_s or 0:.1f} s), competing with "
            "the client for the cores; the run counts as contended (a client on another "
            "machine, or kernel receive stamps, keep the stamps exact)"
        )
    if c.steal_share is not None and c.steal_share > CONTENTION_WARN_SHARE:
        out.append(
            f"the hypervisor took {c.steal_share:.0%} of the CPU capacity (steal time) during "
            "the run"
        )
    if c.contended:  # the one rule (manifest.is_contended): others, steal or the server
        out.extend(_spinning_threads_warning(man))
    out.extend(_client_warnings(man))
    out.extend(_distributed_warnings(man))
    out.extend(_telemetry_warnings(man))
    return out


def _spinning_threads_warning(manifest: RunManifest) -> list[str]:
    """A contended run whose torch engine ran several OpenMP threads that spin while they
    wait (``OMP_WAIT_POLICY`` unset, as under the Python API when torch was imported first):
    a spinning thread burns the core its partner needs, so the run measured the contention
    more than the engine (docs/performance.md)."""
    cfg = manifest.engine.config
    if not cfg.several_torch_threads or cfg.omp_wait_policy is not None:
        return []
    return [
        f"the engine's {cfg.torch_threads} OpenMP threads spun while waiting "
        "(OMP_WAIT_POLICY unset) on a machine other processes kept busy: beside two busy "
        "loops spinning made the "
        "reference engine 12.6x slower, passive waiting 1.6x (docs/performance.md); set "
        "OMP_WAIT_POLICY=PASSIVE before torch is imported (the perfscope command line does) "
        "or use --threads 1"
    ]


def _distributed_warnings(manifest: RunManifest) -> list[str]:
    """A ``--ray`` run: lost load actors (the run is partial), actors that were saturated, and
    the clock alignment below which no latency difference can be claimed."""
    dist = manifest.distributed
    if dist is None:
        return []
    out: list[str] = []
    actors = dist.actors
    lost = [a for a in actors if a.lost]
    if lost:
        out.append(
            f"partial run: {len(lost)} of {len(actors)} load actors were lost "
            f"({'; '.join(str(a.lost) for a in lost)}); their unfinished requests are "
            "recorded as failed"
        )
    unc = dist.clock_uncertainty_ns
    if isinstance(unc, int | float) and unc > 0:
        out.append(
            f"records of {len(actors)} load actors were aligned to the driver's clock within "
            f"±{format_seconds(unc / 1e9)}: latency differences smaller than that are not "
            "resolvable in this run"
        )
    lagging = [
        a.send_lag_p99_s
        for a in actors
        if isinstance(a.send_lag_p99_s, int | float) and a.send_lag_p99_s > 0.005
    ]
    if lagging:
        out.append(
            f"{len(lagging)} load actor(s) sent late (send lag p99 up to "
            f"{format_seconds(float(max(lagging)))}): they were saturated; use more actors or "
            "fewer streams"
        )
    for d in dist.autoscale_decisions:
        if d.action == "added":
            out.append(
                f"load actor {d.actor}'s event-loop lag p99 reached "
                f"{format_seconds(d.lag_p99_s)} at {d.t_s or 0:.1f} s (threshold "
                f"{format_seconds(d.threshold_s)}): --ray-autoscale added actor "
                f"{d.new_actor} and moved {d.moved_requests} of its requests to "
                "it; its stamps before that may be late"
            )
    return out


def _telemetry_warnings(manifest: RunManifest) -> list[str]:
    """A ``--ray`` run's telemetry agents that were lost: their nodes' samples stop there."""
    tele = manifest.telemetry
    lost = tele.lost_agents if tele is not None else ()
    if tele is None or not lost:
        return []
    return [
        f"{len(lost)} of {len(tele.nodes)} telemetry agents were lost "
        f"({'; '.join(lost)}): their nodes' power and memory stop at the last samples received"
    ]


#: Share of prompt tokens served from the server's prefix cache above which a run that was
#: not meant to test caching is flagged.
CACHE_WARN_SHARE = 0.1
#: Workloads that are about prefix caching: they report the hit rate instead of a warning.
CACHING_WORKLOADS = ("shared-prefix", "multi-turn")


def _ms_interval(ci: Any) -> str:
    return f"[{1e3 * ci[0]:.1f}, {1e3 * ci[1]:.1f}] ms" if ci else "none"


def _repeat_text(cache: Mapping[str, Any]) -> str:
    """The rest of the prefix-cache warning of a run whose prompts repeat an earlier run's,
    worded from the TTFT comparison capture recorded (``prompt_cache.previous_run``)."""
    prev = cache.get("previous_run")
    if not prev:
        searched = cache.get("runs_searched")
        where = f"the {searched} newest runs of this folder" if searched else "this runs folder"
        return (
            " (the prompts repeat an earlier run: --seed asks for the same prompts; no earlier "
            f"run with the same engine, model, workload and load is in {where} to compare "
            "TTFT with): TTFT and prefill may be lower than for new prompts"
        )
    this_p50, prev_p50 = 1e3 * prev["this_ttft_p50_s"], 1e3 * prev["ttft_p50_s"]
    both = (
        f"TTFT p50 {this_p50:.1f} ms against {prev_p50:.1f} ms in {prev['run_id']}, whose "
        "prompts this run repeats (--seed asks for the same prompts)"
    )
    intervals = (
        f"95% intervals of the medians {_ms_interval(prev.get('this_ttft_p50_interval_s'))} "
        f"and {_ms_interval(prev.get('ttft_p50_interval_s'))}"
    )
    verdict = prev.get("verdict")
    if verdict == "lower":
        return (
            f": {both}: lower beyond both {intervals} (within-run noise, one run each), so "
            "the cache likely lowered it: these are not new prompts' TTFTs"
        )
    if verdict == "higher":
        return f": {both}: higher beyond both {intervals}: the cache did not lower TTFT"
    if verdict == "no_change":
        return (
            f": {both}: no difference beyond their {intervals}: the cache did not measurably "
            "lower TTFT"
        )
    return (
        f": {both}; {prev.get('this_requests')} and {prev.get('requests')} requests are too "
        "few for a 95% interval of each median (6+ needed), so whether the cache lowered "
        "TTFT is not known"
    )


def _client_warnings(manifest: RunManifest) -> list[str]:
    """The HTTP client's own warnings (``engine.config.client``), plus the prompt-cache and
    prompt-length checks that need the workload to judge."""
    client = manifest.engine.config.client
    if client is None:
        return []
    warnings = client.get("warnings")
    out = [str(w) for w in warnings] if isinstance(warnings, list | tuple) else []
    workload = manifest.workload or {}
    cache = json_object(client.get("prompt_cache")) or {}
    share = json_float(cache.get("share"))
    if share is not None:
        hits, n = cache.get("requests_hit", 0), cache.get("requests_reporting", 0)
        if workload.get("dataset") in CACHING_WORKLOADS or workload.get("trace"):
            out.append(
                f"prefix-cache hit rate {share:.0%} of prompt tokens ({hits} of {n} requests "
                "hit the cache)"
            )
        elif share > CACHE_WARN_SHARE:
            served = (
                f"the server served {share:.0%} of prompt tokens from its prefix cache "
                f"({hits} of {n} requests)"
            )
            if workload.get("prompt_salt") is None:
                out.append(served + _repeat_text(cache))
            else:
                out.append(served + ": TTFT and prefill may be lower than for new prompts")
    lens = json_object(client.get("prompt_lengths")) or {}
    targeted = workload.get("dataset") in ("synthetic", "shared-prefix", "multi-turn", "trace")
    if targeted and not workload.get("tokenizer") and lens.get("inexact"):
        out.append(
            f"prompt lengths are not exact: asked {lens['asked_min']}-{lens['asked_max']} "
            f"tokens, the server counted {lens['server_min']}-{lens['server_max']}; give "
            "--tokenizer PATH (the server's tokenizer) for exact lengths; the recorded prompt "
            "lengths are the server's"
        )
    return out
