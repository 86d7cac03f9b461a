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
    summary["contention"] = contention_record(manifest)
    summary["run_set"] = manifest.get("run_set")
    if manifest.get("model_spec") is not None:
        summary["model_spec"] = manifest.get("model_spec")
    if extra_sections:
        summary.update(extra_sections)
    return summary


#: Share of the machine's CPU capacity that other processes (or the hypervisor) may take
#: before the run's timings are flagged as inflated.
CONTENTION_WARN_SHARE = 0.15


def contention_record(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The run's CPU contention measurement with ``contended`` (others or steal above
    :data:`CONTENTION_WARN_SHARE`); ``None`` when the run has none. A window too short to
    measure has no shares and is never called contended."""
    c = (manifest.get("host") or {}).get("contention")
    if not isinstance(c, dict):
        return None
    out = dict(c)
    others, steal = c.get("others_share"), c.get("steal_share")
    out["contended"] = bool(
        (others is not None and others > CONTENTION_WARN_SHARE)
        or (steal is not None and steal > CONTENTION_WARN_SHARE)
    )
    return out


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
            f"{c.get('cpu_count')} cores"
            + (
                f"; the server under test on port {', '.join(map(str, c['server_ports']))} "
                f"used {c['server_cpu_s']:.1f} CPU-s and is not counted"
                if c.get("server_cpu_s") is not None and c.get("server_ports")
                else ""
            )
            + "): latencies and throughput are likely inflated; measure on a quiet machine"
        )
    if steal is not None and steal > CONTENTION_WARN_SHARE:
        out.append(
            f"the hypervisor took {steal:.0%} of the CPU capacity (steal time) during the run"
        )
    return out
