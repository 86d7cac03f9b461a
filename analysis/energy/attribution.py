"""Who used the energy: the run's window split into phases and requests.

With steps (local engines) a phase's energy is the sum over its step windows, the rest of the
window is ``between_steps``, and each step's energy is split among its requests by tokens
(decode: one each; prefill: prompt lengths; mixed: equally). Without steps (HTTP engines),
every moment's energy is split equally among the requests in flight, and counted as prefill
before a request's first token and decode after it.

Times are run-relative nanoseconds, energy in J.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfscope.analysis.energy.curves import (
    EnergyCurve,
    column,
    energy_between,
    finite,
    merge_windows,
    ratio,
)
from perfscope.analysis.summary import EnergyPhase, EnergyRequests, EnergyStats

__all__ = ["Attribution", "attribute", "request_energy"]


@dataclass
class Attribution:
    """The window's energy split by phase and by request.

    Attributes:
        method: ``steps`` or ``concurrency``; ``None`` when there was nothing to split by.
        phases: phase → its energy (dynamic energy not yet separated).
        per_request: request id → its energy (J).
        windows: step kind → its steps' windows merged (starts, ends in ns); with steps only.
        median_step_s: the median step's duration in the window (s); with steps only.
    """

    method: str | None = None
    phases: dict[str, EnergyPhase] = field(default_factory=dict)
    per_request: dict[int, float] = field(default_factory=dict)
    windows: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    median_step_s: float | None = None


def attribute(
    steps: pd.DataFrame | None,
    requests: pd.DataFrame | None,
    measured: pd.DataFrame,
    curves: dict[str, EnergyCurve],
    w0: float,
    w1: float,
    total: float,
) -> Attribution:
    """Split ``total`` (J, the energy of ``curves`` over [w0, w1]) by the steps when the run
    has them, else by the ``measured`` requests in flight (warmup left out)."""
    window_s = (w1 - w0) / 1e9
    if steps is not None and len(steps):
        st, phases = _step_phases(steps, curves, w0, w1)
        in_steps = sum(p.energy_j or 0.0 for p in phases.values())
        gap_s = max(0.0, window_s - sum(p.time_s or 0.0 for p in phases.values()))
        phases["between_steps"] = EnergyPhase(
            energy_j=total - in_steps,
            time_s=gap_s,
            avg_power_w=ratio(total - in_steps, gap_s),
        )
        return Attribution(
            method="steps",
            phases=phases,
            per_request=_split_steps_to_requests(st, requests),
            windows={
                str(k): merge_windows(g["_a"].to_numpy(), g["_b"].to_numpy())
                for k, g in st.groupby("kind", sort=False)
            },
            median_step_s=(
                float(np.median((st["_b"] - st["_a"]).to_numpy())) / 1e9 if len(st) else None
            ),
        )
    if len(measured):
        per_request, ph = _split_concurrency(measured, curves, w0, w1)
        return Attribution(
            method="concurrency",
            phases={k: EnergyPhase(energy_j=ph.get(k, 0.0)) for k in ("prefill", "decode", "idle")},
            per_request=per_request,
        )
    return Attribution()


def _step_phases(
    steps: pd.DataFrame, curves: dict[str, EnergyCurve], w0: float, w1: float
) -> tuple[pd.DataFrame, dict[str, EnergyPhase]]:
    """The steps clipped to the window, with their window (``_a``, ``_b``, ns) and energy
    (``_e``, J) as columns, and the energy of each step kind."""
    st = steps.copy()
    a = np.maximum(column(st, "t_start"), w0)
    b = np.minimum(column(st, "t_end"), w1)
    keep = b > a
    st = st[keep].copy()
    a, b = a[keep], b[keep]
    st["_a"], st["_b"] = a, b
    st["_e"] = energy_between(curves, a, b)
    phases: dict[str, EnergyPhase] = {}
    for kind, g in st.groupby("kind", sort=False):
        e = float(g["_e"].sum())
        dur = float((g["_b"] - g["_a"]).sum()) / 1e9
        tokens = int(pd.to_numeric(g["new_tokens"], errors="coerce").fillna(0).sum())
        phases[str(kind)] = EnergyPhase(
            energy_j=e,
            time_s=dur,
            steps=len(g),
            tokens=tokens,
            j_per_token=ratio(e, float(tokens)),
            avg_power_w=ratio(e, dur),
        )
    return st, phases


def _split_steps_to_requests(st: pd.DataFrame, requests: pd.DataFrame | None) -> dict[int, float]:
    """Each step's energy split among its requests by tokens processed in the step.

    Prefill steps split by prompt length (at least 1 per request), other steps equally.
    """
    if "request_ids" not in st.columns or len(st) == 0:
        return {}
    lists = [np.asarray(x if x is not None else [], dtype=np.int64) for x in st["request_ids"]]
    counts = np.array([len(x) for x in lists], dtype=np.int64)
    if counts.sum() == 0:
        return {}
    ids = np.concatenate(lists)
    step = np.repeat(np.arange(len(lists)), counts)
    w = np.ones(len(ids), dtype=np.float64)
    is_prefill = (st["kind"].to_numpy(dtype=object) == "prefill")[step]
    if (
        is_prefill.any()
        and requests is not None
        and len(requests)
        and "prompt_tokens" in requests.columns
    ):
        prompt = pd.Series(
            pd.to_numeric(requests["prompt_tokens"], errors="coerce").fillna(1.0).to_numpy(),
            index=requests["request_id"].astype(int).to_numpy(),
        )
        prompt = prompt[~prompt.index.duplicated(keep="last")]
        looked_up = prompt.reindex(ids[is_prefill]).fillna(1.0).to_numpy(dtype=np.float64)
        w[is_prefill] = np.maximum(looked_up, 1.0)
    w_sum = np.bincount(step, weights=w, minlength=len(lists))
    energy = st["_e"].to_numpy(dtype=np.float64)
    share = energy[step] * (w / w_sum[step])
    uniq, inv = np.unique(ids, return_inverse=True)
    total = np.bincount(inv, weights=share, minlength=len(uniq))
    return {int(i): float(v) for i, v in zip(uniq, total, strict=True)}


def _split_concurrency(
    requests: pd.DataFrame, curves: dict[str, EnergyCurve], w0: float, w1: float
) -> tuple[dict[int, float], dict[str, float]]:
    """Energy of each moment split equally among requests in flight; phase by first token.

    The window is cut at every send, first-token and last-token time. Within one piece the set
    of requests in flight is fixed: those with ``sent <= piece < last``, in prefill while the
    piece lies before their first token. A piece's share (its energy over the number in
    flight) is summed into a running total, so a request's energy is the difference of that
    total between its last-token and send pieces: O(n log n) in the number of requests.
    """
    req = requests.dropna(subset=["t_sent", "t_last_token"])
    if len(req) == 0:
        return {}, {}
    ids = req["request_id"].astype(int).to_numpy()
    s = np.clip(column(req, "t_sent"), w0, w1)
    f = np.clip(column(req, "t_first_token"), w0, w1)
    f = np.where(np.isnan(f), s, f)
    e_ = np.clip(column(req, "t_last_token"), w0, w1)
    bounds = np.unique(np.concatenate((s, f, e_, [w0, w1])))
    energy = energy_between(curves, bounds[:-1], bounds[1:])
    # Piece k is (bounds[k], bounds[k+1]); a request spans pieces js..je-1 (none if it ends
    # before it starts), and is in prefill over js..min(jf, je)-1.
    js = np.searchsorted(bounds, s)
    je = np.maximum(np.searchsorted(bounds, e_), js)
    jf = np.clip(np.searchsorted(bounds, f), js, je)
    delta = np.zeros(len(bounds), dtype=np.int64)
    np.add.at(delta, js, 1)
    np.add.at(delta, je, -1)
    n = np.cumsum(delta)[:-1]
    share = np.where(n > 0, energy / np.maximum(n, 1), 0.0)
    cum = np.concatenate(([0.0], np.cumsum(share)))
    per_req = cum[je] - cum[js]
    pre = cum[jf] - cum[js]
    phase = {
        "prefill": float(pre.sum()),
        "decode": float((per_req - pre).sum()),
        "idle": float(energy[n == 0].sum()),
    }
    return {int(i): float(v) for i, v in zip(ids, per_req, strict=True)}, phase


def _stats(values: np.ndarray) -> EnergyStats:
    v = values[~np.isnan(values)] if len(values) else values
    if len(v) == 0:
        return EnergyStats()
    return EnergyStats(
        mean=finite(np.mean(v)),
        p50=finite(np.percentile(v, 50)),
        p90=finite(np.percentile(v, 90)),
        max=finite(np.max(v)),
    )


def request_energy(
    per_request: dict[int, float], measured: pd.DataFrame, total: float
) -> EnergyRequests | None:
    """The distribution of the ``measured`` requests' energy (J) and energy per output token
    (J/token), and the share of ``total`` (J) they carry; ``None`` when none got a share."""
    if not per_request or not len(measured):
        return None
    ids = measured["request_id"].astype(int).to_numpy()
    e = np.array([per_request.get(int(i), np.nan) for i in ids])
    toks = column(measured, "output_tokens")
    with np.errstate(divide="ignore", invalid="ignore"):
        jpt = np.where(toks > 0, e / toks, np.nan)
    return EnergyRequests(
        count=int(np.sum(~np.isnan(e))),
        energy_j=_stats(e),
        j_per_output_token=_stats(jpt),
        attributed_share=ratio(float(np.nansum(e)), total),
    )
