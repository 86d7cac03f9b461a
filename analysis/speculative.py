"""The ``speculative`` section of a summary: how a speculative-decoding run's draft did.

From the steps (``role == "draft"`` marks the draft's passes; a verify pass carries
``proposed_tokens`` and ``accepted_tokens``) and the engine's ``speculative`` config:

- ``acceptance_rate`` = accepted / proposed draft tokens (vLLM's "draft acceptance rate");
- ``mean_accepted_per_step``: accepted draft tokens per sequence and verify step (0..K), and
  ``mean_tokens_per_step`` one more (the target's own token; at most, since a request's last
  step may be cut at its ``max_output_tokens``);
- ``alpha``: the per-token acceptance probability whose expectation gives that mean
  (:func:`~perfscope.analysis.whatif.alpha_from_accepted`), the ``alpha`` of the speedup
  formula;
- time in draft passes and in verify passes, and ``cost_ratio`` ``c``: one draft pass's mean
  time over one verify pass's (measured), with ``cost_ratio_sol``, the same ratio at the
  roofline's speed of light;
- ``projected_speedup``: :func:`~perfscope.analysis.whatif.speculative_speedup` with the
  measured ``alpha`` and ``c``: what this run's draft should give over plain decoding of the
  target, to be checked against a run without speculation (``perfscope study
  num-speculative-tokens``).

``method``: ``draft`` (a draft model), or ``lookahead`` / ``medusa``
(:mod:`perfscope.profiler.engines.reference.decoding`): no draft passes run, the proposals
cost no pass of their own, so ``c`` is 0 and the projection is the expected tokens per step
over the verify pass's cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from perfscope.analysis.manifest import RunManifest, manifest_view
from perfscope.analysis.summary import Roofline, Speculative
from perfscope.analysis.whatif import (
    alpha_from_accepted,
    expected_tokens_per_step,
    speculative_speedup,
)

__all__ = ["speculative_config", "speculative_section"]


def speculative_config(manifest: Mapping[str, Any] | RunManifest) -> Mapping[str, Any] | None:
    """The engine's ``speculative`` config (draft, K, the draft's model spec) or None."""
    cfg = manifest_view(manifest).engine.config.speculative
    return cfg if cfg is not None and cfg.get("num_speculative_tokens") else None


def _sol_per_step(roofline: Roofline | None, phase: str) -> float | None:
    """Speed-of-light time per pass of ``phase`` (s), ``None`` when the roofline has none."""
    ph = roofline.phases.get(phase) if roofline is not None else None
    if ph is None or ph.sol_time_s is None or not ph.steps:
        return None
    return float(ph.sol_time_s) / float(ph.steps)


def _speedup(alpha: float | None, k: int, c: float | None) -> float | None:
    return speculative_speedup(alpha, k, c) if alpha is not None and c is not None else None


def speculative_section(
    steps: pd.DataFrame,
    manifest: Mapping[str, Any] | RunManifest,
    roofline: Roofline | None,
) -> Speculative | None:
    """The section (SI units) or None for a run without speculation."""
    cfg = speculative_config(manifest)
    if cfg is None or steps.empty or "proposed_tokens" not in steps:
        return None
    k = int(cfg["num_speculative_tokens"])
    verify = steps[steps["proposed_tokens"].notna()]
    role = steps["role"] if "role" in steps else pd.Series([None] * len(steps), steps.index)
    draft = steps[(role == "draft").to_numpy()]
    draft_dec = draft[draft["kind"] == "decode"]
    draft_pre = draft[draft["kind"] == "prefill"]

    def secs(df: pd.DataFrame) -> float:
        return float(((df["t_end"] - df["t_start"]).to_numpy(dtype=np.float64) * 1e-9).sum())

    proposed = int(verify["proposed_tokens"].sum())
    accepted = int(verify["accepted_tokens"].fillna(0).sum())
    row_steps = proposed / k if k else 0.0
    mean_acc = accepted / row_steps if row_steps else None
    alpha = alpha_from_accepted(mean_acc, k) if mean_acc is not None else None
    t_draft, t_verify = secs(draft_dec), secs(verify)
    method = str(cfg.get("method") or "draft")
    c = (
        (t_draft / len(draft_dec)) / (t_verify / len(verify))
        if len(draft_dec) and len(verify) and t_verify > 0
        else (0.0 if method != "draft" else None)
    )
    sol_d, sol_t = _sol_per_step(roofline, "draft_decode"), _sol_per_step(roofline, "decode")
    c_sol = sol_d / sol_t if sol_d is not None and sol_t else None
    if method != "draft":
        c_sol = 0.0
    draft_model = cfg.get("draft_model")
    return Speculative(
        method=method,
        draft=cfg.get("draft"),
        num_speculative_tokens=k,
        draft_model=dict(draft_model) if draft_model is not None else None,
        draft_n_params=cfg.get("draft_n_params"),
        target_n_params=cfg.get("target_n_params"),
        verify_steps=len(verify),
        draft_steps=len(draft_dec),
        proposed_tokens=proposed,
        accepted_tokens=accepted,
        acceptance_rate=accepted / proposed if proposed else None,
        mean_accepted_per_step=mean_acc,
        mean_tokens_per_step=None if mean_acc is None else mean_acc + 1.0,
        alpha=alpha,
        expected_tokens_per_step=None if alpha is None else expected_tokens_per_step(alpha, k),
        draft_time_s=t_draft,
        draft_prefill_time_s=secs(draft_pre),
        verify_time_s=t_verify,
        draft_time_share=t_draft / (t_draft + t_verify) if t_draft + t_verify > 0 else None,
        cost_ratio=c,
        cost_ratio_sol=c_sol,
        projected_speedup=_speedup(alpha, k, c),
        projected_speedup_sol=_speedup(alpha, k, c_sol),
        basis=(
            "Leviathan et al. 2023 (1 - a^(K+1)) / ((1 - a)(cK + 1)) with the measured a "
            "(from accepted tokens per step) and c (mean draft pass / mean verify pass time; "
            "_sol: at the roofline's speed of light); assumes a verify pass costs one target pass"
        ),
    )
