"""summary.json: everything derived from a stored run, in one JSON-ready dict.

``build_summary`` is a pure function of the run's records, its manifest and the analysis
inputs (SLOs, hardware), so ``perfscope analyze`` reproduces a run's numbers exactly and can
re-derive them with other SLOs or another device.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from perfscope.analysis.metrics import compute_metrics

__all__ = ["SUMMARY_SCHEMA", "build_summary", "run_warnings", "step_breakdown"]

SUMMARY_SCHEMA = "perfscope.summary/1"


def step_breakdown(steps: pd.DataFrame) -> dict[str, dict[str, float | int]]:
    """Per step kind: passes, time (s), tokens processed, mean batch size, share of busy time."""
    if steps.empty:
        return {}
    dur = (steps["t_end"] - steps["t_start"]) * 1e-9
    total = float(dur.sum())
    out: dict[str, dict[str, float | int]] = {}
    for kind, g in steps.assign(dur=dur).groupby("kind", sort=True):
        t = float(g["dur"].sum())
        out[str(kind)] = {
            "count": len(g),
            "time_s": t,
            "time_share": t / total if total > 0 else 0.0,
            "new_tokens": int(g["new_tokens"].sum()),
            "context_tokens": int(g["context_tokens"].sum()),
            "mean_batch_size": float(g["batch_size"].mean()),
            "mean_step_s": t / len(g),
        }
    return out


def build_summary(
    manifest: dict[str, Any],
    requests: pd.DataFrame,
    chunks: pd.DataFrame,
    steps: pd.DataFrame,
    telemetry: pd.DataFrame | None = None,
    *,
    slos: dict[str, float] | None = None,
    extra_sections: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary of one run.

    Args:
        manifest: the run's manifest (engine, workload, status, ...).
        requests, chunks, steps, telemetry: the run's tables (``telemetry`` may be empty).
        slos: per-request limits in seconds (``{"ttft": 0.2}``); default: the manifest's.
        extra_sections: further top-level sections computed by the caller (``hardware``,
            ``roofline``, ``energy``, ``advice``, ...), merged in as given.
    """
    slos = dict(manifest.get("slos") or {}) if slos is None else slos
    metrics = compute_metrics(requests, chunks, steps, slos)
    engine = manifest.get("engine") or {}
    summary: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA,
        "run_id": manifest.get("run_id"),
        "name": manifest.get("name"),
        "status": manifest.get("status"),
        "started_at": manifest.get("started_at"),
        "perfscope_version": manifest.get("perfscope_version"),
        "engine": {
            "uri": engine.get("uri"),
            "kind": engine.get("kind"),
            "device": engine.get("device"),
            "dtype": engine.get("dtype"),
        },
        "workload": manifest.get("workload"),
        "load": manifest.get("load"),
        **metrics,
        "steps": step_breakdown(steps),
        "model": engine.get("model"),
    }
    summary["warnings"] = run_warnings(manifest)
    if extra_sections:
        summary.update(extra_sections)
    return summary


#: Share of the machine's CPU capacity that other processes (or the hypervisor) may take
#: before the run's timings are flagged as inflated.
CONTENTION_WARN_SHARE = 0.15


def run_warnings(manifest: dict[str, Any]) -> list[str]:
    """Conditions that make this run's numbers less trustworthy, as sentences."""
    out: list[str] = []
    host = manifest.get("host") or {}
    c = host.get("contention") or {}
    others, steal = c.get("others_share"), c.get("steal_share")
    if others is not None and others > CONTENTION_WARN_SHARE:
        out.append(
            f"other processes used {others:.0%} of this machine's CPU capacity during the "
            f"run ({c.get('others_cpu_s', 0):.1f} CPU-s over {c.get('window_s', 0):.1f} s on "
            f"{c.get('cpu_count')} cores): latencies and throughput are likely inflated; "
            "measure on a quiet machine"
        )
    if steal is not None and steal > CONTENTION_WARN_SHARE:
        out.append(
            f"the hypervisor took {steal:.0%} of the CPU capacity (steal time) during the run"
        )
    out.extend(_client_warnings(manifest))
    return out


#: Share of prompt tokens served from the server's prefix cache above which a run that was
#: not meant to test caching is flagged.
CACHE_WARN_SHARE = 0.1
#: Workloads that are about prefix caching: they report the hit rate instead of a warning.
CACHING_WORKLOADS = ("shared-prefix", "multi-turn")


def _client_warnings(manifest: dict[str, Any]) -> list[str]:
    """The HTTP client's own warnings (``engine.config.client``), plus the prompt-cache and
    prompt-length checks that need the workload to judge."""
    client = ((manifest.get("engine") or {}).get("config") or {}).get("client")
    if not isinstance(client, dict):
        return []
    out = [str(w) for w in client.get("warnings") or ()]
    workload = manifest.get("workload") or {}
    cache = client.get("prompt_cache") or {}
    share = cache.get("share")
    if share is not None:
        hits, n = cache.get("requests_hit", 0), cache.get("requests_reporting", 0)
        if workload.get("dataset") in CACHING_WORKLOADS or workload.get("trace"):
            out.append(
                f"prefix-cache hit rate {share:.0%} of prompt tokens ({hits} of {n} requests "
                "hit the cache)"
            )
        elif share > CACHE_WARN_SHARE:
            repeat = (
                " (the prompts repeat an earlier run: --seed asks for the same prompts)"
                if workload.get("prompt_salt") is None
                else ""
            )
            out.append(
                f"the server served {share:.0%} of prompt tokens from its prefix cache "
                f"({hits} of {n} requests){repeat}: TTFT and prefill are lower than for new "
                "prompts"
            )
    lens = client.get("prompt_lengths") or {}
    targeted = workload.get("dataset") in ("synthetic", "shared-prefix", "multi-turn", "trace")
    if targeted and not workload.get("tokenizer") and lens.get("inexact"):
        out.append(
            f"prompt lengths are not exact: asked {lens['asked_min']}-{lens['asked_max']} "
            f"tokens, the server counted {lens['server_min']}-{lens['server_max']}; give "
            "--tokenizer PATH (the server's tokenizer) for exact lengths; the recorded prompt "
            "lengths are the server's"
        )
    return out
