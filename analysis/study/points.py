"""Per run: what a study keeps of each of its runs.

:func:`run_metrics` reads the compared metrics of one run summary (seconds, tokens/s,
requests/s, J/token, shares as fractions); :func:`phase_points` its roofline phases as
:class:`PhasePoint` records (MFU and MBU as fractions, intensity in FLOP/byte, achieved
FLOP/s, the verdict, time per step in seconds); :class:`RunPoint` is one run with where it
sits in the interleaved order (order, round, setting).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfscope.jsontypes import JsonObject, ReadOnlyJson, json_object, json_str

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


def _number(value: object) -> float | None:
    """``value`` as read if it is a JSON number (an int stays an int: what is stored is what
    the summary held), else ``None`` (a bool is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _json_at(summary: ReadOnlyJson, *path: str) -> JsonObject:
    """The JSON object at ``path`` in ``summary`` (``{}`` where a step of it is missing or
    not an object)."""
    out = json_object(summary.get(path[0])) or {}
    for key in path[1:]:
        out = json_object(out.get(key)) or {}
    return out


def phase_points(summary: ReadOnlyJson) -> dict[str, PhasePoint]:
    """The roofline phases of a run summary."""
    roof = json_object(summary.get("roofline")) or {}
    out: dict[str, PhasePoint] = {}
    for name, raw in (json_object(roof.get("phases")) or {}).items():
        ph = json_object(raw) or {}
        out[name] = PhasePoint(
            phase=name,
            mfu=_number(ph.get("mfu")),
            mbu=_number(ph.get("mbu")),
            intensity=_number(ph.get("intensity")),
            achieved_flops_s=_number(ph.get("achieved_flops_s")),
            verdict=json_str(ph.get("verdict")),
            time_per_step_s=_number(ph.get("time_per_step_s")),
        )
    return out


def run_metrics(summary: ReadOnlyJson) -> dict[str, float | None]:
    """The compared metrics of one run summary (seconds, tokens/s, requests/s, J/token)."""
    lat = json_object(summary.get("latency")) or {}
    thr = json_object(summary.get("throughput")) or {}
    good = json_object(summary.get("goodput")) or {}
    energy = json_object(summary.get("energy")) or {}

    def p50(name: str, q: str = "p50") -> float | None:
        v = _number((json_object(lat.get(name)) or {}).get(q))
        return None if v is None else float(v)

    cache = json_object(summary.get("prompt_cache")) or {}
    roof_lat = _json_at(summary, "roofline", "latency")
    return {
        "ttft_p50_s": p50("ttft"),
        "tpot_p50_s": p50("tpot"),
        "e2e_p50_s": p50("e2e"),
        "output_tok_s": _number(thr.get("output_tok_s")),
        # Without SLOs every completed request counts as good: no goodput was measured.
        "goodput_req_s": _number(good.get("goodput_req_s")) if good.get("slos") else None,
        "attainment": _number(good.get("attainment")) if good.get("slos") else None,
        "j_per_output_token": _number(energy.get("j_per_output_token")),
        "itl_p99_s": p50("itl", "p99"),
        "prompt_cache_share": _number(cache.get("share")),
        "prompt_cache_hit_rate": _number(cache.get("hit_rate")),
        "decode_stall_share": _number(roof_lat.get("decode_stall_share")),
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
