"""The speculative-decoding projection of one setting: its speedup over plain decoding.

:func:`speculative_projection` gives, for a setting that decodes speculatively (a draft model,
lookahead or Medusa), the speedup before the run (:class:`SpeculativeBefore`: the assumed
acceptance, each pass priced by the baseline's derating, the speed of light or the fitted cost
model) and what the run measured (:class:`SpeculativeAfter`: its acceptance, its draft and
verify passes over the baseline's plain decode step, the speedups they give); a study stores
the median of the measured numbers over its rounds (``_after_run_median``). Pass costs are
ratios to a plain decode step and speedups ratios to plain decoding (unitless); step times
are in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from perfscope.analysis.costmodel import medusa_head_cost
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.overhead import OverheadFit, roof_times
from perfscope.analysis.study.stats import _median
from perfscope.analysis.summary import Roofline
from perfscope.analysis.whatif import (
    ASSUMED_ACCEPTANCE,
    Derating,
    expected_tokens_per_step,
    predict,
    run_derating,
    speculative_speedup,
)
from perfscope.jsontypes import (
    JsonObject,
    ReadOnlyJson,
    json_at,
    json_float,
    json_number,
    json_object,
    json_str,
)

__all__ = [
    "SpeculativeAfter",
    "SpeculativeBefore",
    "SpeculativeProjection",
    "speculative_projection",
]


def _mean_step_s(summary: ReadOnlyJson, kind: str) -> float | None:
    v = json_float(json_at(summary, "steps", kind).get("mean_step_s"))
    return v if v else None


@dataclass(frozen=True)
class SpeculativeBefore:
    """:func:`speculative_projection`'s ``before_run``: the speedup over plain decoding at
    the assumed acceptance ``alpha`` with ``k`` draft tokens, by each basis (``derated``: the
    baseline run's derating, ``sol``: speed of light, ``fitted``: the baseline's fitted cost
    model, ``None`` without one), each with the draft/target pass cost ratio it used
    (``cost_ratio_*``); ``verify_cost_roofline`` the verify pass over a plain step by the
    roofline when there is no draft pass (lookahead, Medusa), ``verify_cost_fitted`` the
    same by the fitted model. The ratios and speedups are unitless."""

    k: int
    cost_ratio_derated: float | None
    derated: float | None
    cost_ratio_sol: float | None
    sol: float | None
    alpha: float = ASSUMED_ACCEPTANCE
    verify_cost_roofline: float | None = None
    cost_ratio_fitted: float | None = None
    verify_cost_fitted: float | None = None
    fitted: float | None = None

    def speedup(self, basis: str) -> float | None:
        """The speedup by ``basis`` (``derated``, ``sol`` or ``fitted``)."""
        return {"derated": self.derated, "sol": self.sol, "fitted": self.fitted}[basis]

    def cost_ratio(self, basis: str) -> float | None:
        """The draft/target pass cost ratio by ``basis`` (as :meth:`speedup`)."""
        by = {
            "derated": self.cost_ratio_derated,
            "sol": self.cost_ratio_sol,
            "fitted": self.cost_ratio_fitted,
        }
        return by[basis]

    def to_dict(self) -> JsonObject:
        """The stored JSON form (the roofline's and the fitted keys only when known)."""
        out: JsonObject = {"alpha": self.alpha, "k": self.k}
        if self.verify_cost_roofline is not None:
            out["verify_cost_roofline"] = self.verify_cost_roofline
        out["cost_ratio_derated"] = self.cost_ratio_derated
        out["derated"] = self.derated
        out["cost_ratio_sol"] = self.cost_ratio_sol
        out["sol"] = self.sol
        if self.fitted is not None:
            out["cost_ratio_fitted"] = self.cost_ratio_fitted
            out["verify_cost_fitted"] = self.verify_cost_fitted
            out["fitted"] = self.fitted
        return out


@dataclass(frozen=True)
class SpeculativeAfter:
    """:func:`speculative_projection`'s ``after_run``: a speculative run's measured
    acceptance (``acceptance_rate``, ``mean_accepted_per_step``, per-token ``alpha``), its
    draft and verify passes over the baseline's plain decode step (``cost_ratio``,
    ``verify_cost``), the tokens a step they expect and the speedups they give (with the
    measured verify cost, the formula's, and with each pass's host time added); ``runs``
    the rounds a study's median is over (``None`` for one run's)."""

    acceptance_rate: float | None
    mean_accepted_per_step: float | None
    alpha: float | None
    cost_ratio: float | None
    verify_cost: float | None
    tokens_per_step: float | None
    speedup: float | None
    speedup_formula: float | None
    speedup_with_host: float | None
    runs: int | None = None

    def to_dict(self) -> JsonObject:
        """The stored JSON form (``runs`` only when set)."""
        out = asdict(self)
        if self.runs is None:
            del out["runs"]
        return out


@dataclass(frozen=True)
class SpeculativeProjection:
    """:func:`speculative_projection` of one setting: its ``k`` draft tokens, ``method``
    (``draft``, ``lookahead``, ``medusa``), ``draft`` model name, the projection before the
    run and what the run measured (``None`` when it measured too little)."""

    k: int
    method: str
    draft: str | None
    before_run: SpeculativeBefore
    after_run: SpeculativeAfter | None

    def to_dict(self) -> JsonObject:
        """The stored JSON form (a setting's ``projection["speculative"]``)."""
        return {
            "k": self.k,
            "method": self.method,
            "draft": self.draft,
            "before_run": self.before_run.to_dict(),
            "after_run": None if self.after_run is None else self.after_run.to_dict(),
        }


def _after_run_median(
    baselines: Sequence[ReadOnlyJson],
    candidates: Sequence[ReadOnlyJson],
    batch: int,
    prompt_len: int,
    output_len: int,
) -> SpeculativeAfter | None:
    """:func:`speculative_projection`'s ``after_run`` of each round (the candidate's run next
    to the baseline's run of the same round), each number the median over the rounds: one
    run's pass times on a shared machine can be far off."""
    from perfscope.hwdb.spec import DeviceSpec

    rows = []
    for base, cand in zip(baselines, candidates, strict=False):
        spec = json_object(json_at(base, "hardware").get("spec"))
        if not spec:
            continue
        dev = DeviceSpec.from_dict(spec)
        derate = run_derating(Roofline.from_dict(json_object(base.get("roofline"))))
        p = speculative_projection(cand, base, dev, derate, batch, prompt_len, output_len)
        if p is not None and p.after_run is not None:
            rows.append(p.after_run)
    if not rows:
        return None

    medians = {
        f.name: _median([getattr(r, f.name) for r in rows])
        for f in fields(SpeculativeAfter)
        if f.name != "runs"
    }
    return SpeculativeAfter(**medians, runs=len(rows))


def _gap_per_step(summary: ReadOnlyJson, phase: str) -> float | None:
    ph = json_at(summary, "roofline", "phases", phase)
    gap, steps = json_float(ph.get("gap_s")), json_float(ph.get("steps"))
    return gap / steps if gap is not None and steps else None


def speculative_projection(
    summary: ReadOnlyJson,
    baseline: ReadOnlyJson,
    dev: Any,
    derate: Derating,
    batch: int,
    prompt_len: int,
    output_len: int,
    fit: OverheadFit | None = None,
) -> SpeculativeProjection | None:
    """Speedup over plain decoding of one setting that decodes speculatively (None if it
    does not): :func:`~perfscope.analysis.whatif.speculative_speedup`, cited there.

    ``before_run["fitted"]`` (with ``fit``, the baseline's fitted cost model): the assumed
    acceptance, and each pass timed by the fit at the mean context: a draft pass is a
    decode step of the draft model (its layers pay the per-layer host time), the verify
    pass a step of ``K + 1`` tokens a row (:meth:`~perfscope.analysis.overhead.
    OverheadFit.prefill_step_time`), each with the baseline's measured host gap per decode
    step before it (``cost_ratio_fitted``, ``verify_cost_fitted``).

    ``before_run``: with the stated :data:`~perfscope.analysis.whatif.ASSUMED_ACCEPTANCE`
    and the draft/target pass cost ratio ``c`` from the what-if model (``derated``: the
    baseline run's derating applied to both models' decode steps; ``sol``: speed of light);
    the verify pass one target pass, as the formula assumes, after a draft; without one
    (lookahead, Medusa) the verify pass is the whole step and costs its roofline time over a
    plain step's (``verify_cost_roofline``: ``K + 1`` positions a row, and for Medusa the
    heads' FLOPs and weight reads, :func:`~perfscope.analysis.costmodel.medusa_head_cost`).
    ``after_run``: the measured
    ``alpha`` of this setting's run, ``c`` = its mean draft pass over the baseline's mean
    plain decode step, and ``verify_cost`` = its mean verify pass over that same step
    (``speedup``), and the same with the host time before each pass added to it
    (``speedup_with_host``), so the parts of the projection's error can be told apart (a
    study stores the median of each over its rounds).
    """
    sp = json_object(summary.get("speculative")) or {}
    k = int(json_float(sp.get("num_speculative_tokens")) or 0)
    draft_dict, model_dict = json_object(sp.get("draft_model")), json_object(summary.get("model"))
    method = json_str(sp.get("method")) or "draft"
    # Lookahead and Medusa propose without a pass of their own: c = 0.
    drafted = method == "draft"
    if k < 1 or not model_dict or (drafted and not draft_dict):
        return None
    target = ModelSpec.from_dict(dict(model_dict))
    draft = ModelSpec.from_dict(dict(draft_dict)) if drafted and draft_dict else None
    shape = {"batch": batch, "prompt_len": prompt_len, "output_len": output_len}
    heads = k if method == "medusa" else 0
    # Without a draft pass the verify pass is the whole step: its K + 1 positions a row (and
    # Medusa's heads) priced by the roofline against a plain step, not the formula's 1.
    v_roof = None if drafted else _verify_roof_ratio(target, dev, k, heads, **shape)
    ratio: dict[str, float | None] = {}
    speedup: dict[str, float | None] = {}
    for key, eff, over in (
        ("derated", derate.decode_efficiency, derate.decode_overhead_s or 0.0),
        ("sol", None, 0.0),
    ):

        def tpot(m: ModelSpec, eff: float | None = eff, over: float = over) -> float | None:
            return predict(
                m,
                dev,
                batch=batch,
                prompt_len=prompt_len,
                output_len=output_len,
                decode_efficiency=eff,
                decode_overhead_s=over,
            ).tpot_s

        t_target = tpot(target)
        t_draft = 0.0 if draft is None else tpot(draft)
        c = t_draft / t_target if t_target and t_draft is not None else None
        ratio[key] = c
        speedup[key] = (
            None if c is None else speculative_speedup(ASSUMED_ACCEPTANCE, k, c, v_roof or 1.0)
        )
    fitted = (
        _fitted_speculative(fit, target, draft, dev, baseline, k, heads, **shape)
        if fit is not None
        else (None, None, None)
    )
    before = SpeculativeBefore(
        k=k,
        verify_cost_roofline=v_roof,
        cost_ratio_derated=ratio["derated"],
        derated=speedup["derated"],
        cost_ratio_sol=ratio["sol"],
        sol=speedup["sol"],
        cost_ratio_fitted=fitted[0],
        verify_cost_fitted=fitted[1],
        fitted=fitted[2],
    )
    after: SpeculativeAfter | None = None
    plain = _mean_step_s(baseline, "decode") if not baseline.get("speculative") else None
    draft_s, verify_s = _mean_step_s(summary, "draft_decode"), _mean_step_s(summary, "decode")
    if not drafted:
        draft_s = 0.0
    alpha = json_number(sp.get("alpha"))
    if (
        plain
        and draft_s is not None
        and verify_s
        and alpha is not None
        and (draft_s or not drafted)
    ):
        c, v = draft_s / plain, verify_s / plain
        # The same with each pass's host time before it (Python and scheduling between
        # passes, the roofline's gap_s per step): the part the formula does not see.
        g_plain = _gap_per_step(baseline, "decode")
        g_draft, g_verify = _gap_per_step(summary, "draft_decode"), _gap_per_step(summary, "decode")
        g_draft = 0.0 if not drafted else g_draft
        host = None
        if g_plain is not None and g_draft is not None and g_verify is not None:
            unit = plain + g_plain
            host = speculative_speedup(
                float(alpha), k, (draft_s + g_draft) / unit, (verify_s + g_verify) / unit
            )
        after = SpeculativeAfter(
            acceptance_rate=json_number(sp.get("acceptance_rate")),
            mean_accepted_per_step=json_number(sp.get("mean_accepted_per_step")),
            alpha=alpha,
            cost_ratio=c,
            verify_cost=v,
            tokens_per_step=expected_tokens_per_step(float(alpha), k),
            speedup=speculative_speedup(float(alpha), k, c, v),
            speedup_formula=speculative_speedup(float(alpha), k, c),
            speedup_with_host=host,
        )
    return SpeculativeProjection(
        k=k, method=method, draft=json_str(sp.get("draft")), before_run=before, after_run=after
    )


def _verify_roof_ratio(
    target: ModelSpec,
    dev: Any,
    k: int,
    heads: int,
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
) -> float | None:
    """Roofline time of a verify pass (``K + 1`` positions a row, plus ``heads`` Medusa
    heads on each row) over a plain decode step's, at the mean context."""
    import numpy as np

    b = np.array([float(max(batch, 1))])
    ctx = b * (prompt_len + output_len / 2.0)
    plain = float(roof_times(target, dev, b, b, ctx)[0])
    h_flops, h_bytes = medusa_head_cost(target, heads, b)
    wide = roof_times(target, dev, b, b * (k + 1), ctx, h_bytes, h_flops)
    return float(wide[0]) / plain if plain > 0 else None


def _fitted_speculative(
    fit: OverheadFit,
    target: ModelSpec,
    draft: ModelSpec | None,
    dev: Any,
    baseline: ReadOnlyJson,
    k: int,
    heads: int = 0,
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
) -> tuple[float, float, float]:
    """:func:`speculative_projection`'s fitted-model (draft/target cost ratio, verify cost over
    a plain step, speedup) at the assumed acceptance: a
    draft pass a decode step of the draft (none for lookahead and Medusa), the verify pass
    a step of ``K + 1`` positions a row with ``heads`` Medusa heads' work on its roofline
    time (:func:`~perfscope.analysis.costmodel.medusa_head_cost`)."""
    import numpy as np

    b = np.array([float(max(batch, 1))])
    ctx = b * (prompt_len + output_len / 2.0)
    roof_t = roof_times(target, dev, b, b, ctx)
    plain = float(fit.step_time(roof_t, float(target.n_layers), b, b)[0])
    drafted = (
        0.0
        if draft is None
        else float(fit.step_time(roof_times(draft, dev, b, b, ctx), float(draft.n_layers), b, b)[0])
    )
    wide = b * (k + 1)
    h_flops, h_bytes = medusa_head_cost(target, heads, b)
    roof_v = roof_times(target, dev, b, wide, ctx, h_bytes, h_flops)
    verify = float(fit.prefill_step_time(roof_v, float(target.n_layers), b, wide, roof_t)[0])
    gap = _gap_per_step(baseline, "decode") or 0.0
    unit = plain + gap
    # No draft pass: no host gap before one either.
    c = (drafted + gap) / unit if draft is not None else 0.0
    v = (verify + gap) / unit
    return c, v, speculative_speedup(ASSUMED_ACCEPTANCE, k, c, v)
