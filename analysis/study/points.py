"""Per run: what a study keeps of each of its runs.

:func:`run_metrics` reads the compared metrics of one run summary (seconds, tokens/s,
requests/s, J/token, shares as fractions); :func:`phase_points` its roofline phases as
:class:`PhasePoint` records (MFU and MBU as fractions, intensity in FLOP/byte, achieved
FLOP/s, the verdict, time per step in seconds); :class:`RunPoint` is one run with where it
sits in the interleaved order (order, round, setting).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfscope.jsontypes import ReadOnlyJson, json_at, json_number, json_object, json_str

__all__ = ["PhasePoint", "RunPoint", "phase_points", "run_metrics"]


@dataclass(frozen=True)
class PhasePoint:
    """One phase of one run on the roofline: MFU and MBU (fractions), intensity
    (FLOP/byte), achieved FLOP/s, the verdict (``compute-bound`` ...)."""

    phase: str
    mfu: float | None
    mbu: float | None
    intensity: float | None
    achieved_flops_s: float | None
    verdict: str | None
    time_per_step_s: float | None


def phase_points(summary: ReadOnlyJson) -> dict[str, PhasePoint]:
    """The roofline phases of a run summary."""
    roof = json_object(summary.get("roofline")) or {}
    out: dict[str, PhasePoint] = {}
    for name, raw in (json_object(roof.get("phases")) or {}).items():
        ph = json_object(raw) or {}
        out[name] = PhasePoint(
            phase=name,
            mfu=json_number(ph.get("mfu")),
            mbu=json_number(ph.get("mbu")),
            intensity=json_number(ph.get("intensity")),
            achieved_flops_s=json_number(ph.get("achieved_flops_s")),
            verdict=json_str(ph.get("verdict")),
            time_per_step_s=json_number(ph.get("time_per_step_s")),
        )
    return out


def run_metrics(summary: ReadOnlyJson) -> dict[str, float | None]:
    """The compared metrics of one run summary (seconds, tokens/s, requests/s, J/token)."""
    lat = json_object(summary.get("latency")) or {}
    thr = json_object(summary.get("throughput")) or {}
    good = json_object(summary.get("goodput")) or {}
    energy = json_object(summary.get("energy")) or {}

    def p50(name: str, q: str = "p50") -> float | None:
        v = json_number((json_object(lat.get(name)) or {}).get(q))
        return None if v is None else float(v)

    cache = json_object(summary.get("prompt_cache")) or {}
    roof_lat = json_at(summary, "roofline", "latency")
    return {
        "ttft_p50_s": p50("ttft"),
        "tpot_p50_s": p50("tpot"),
        "e2e_p50_s": p50("e2e"),
        "output_tok_s": json_number(thr.get("output_tok_s")),
        # Without SLOs every completed request counts as good: no goodput was measured.
        "goodput_req_s": json_number(good.get("goodput_req_s")) if good.get("slos") else None,
        "attainment": json_number(good.get("attainment")) if good.get("slos") else None,
        "j_per_output_token": json_number(energy.get("j_per_output_token")),
        "itl_p99_s": p50("itl", "p99"),
        "prompt_cache_share": json_number(cache.get("share")),
        "prompt_cache_hit_rate": json_number(cache.get("hit_rate")),
        "decode_stall_share": json_number(roof_lat.get("decode_stall_share")),
    }


@dataclass(frozen=True)
class RunPoint:
    """One run of a study: where it sits in the interleaved order and what it measured."""

    order: int
    round: int
    setting: int
    run: str
    metrics: dict[str, float | None]
    phases: dict[str, PhasePoint]
