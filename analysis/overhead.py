"""A fitted cost model: per-step time = roofline time of the work + a host/overhead term.

The what-if's speed of light prices FLOPs and bytes; what dominates small engines is the
rest. This module fits that rest from steps a run already recorded::

    t_step = k * roof(step) + per_layer * L + per_sequence * b + per_token * n + per_step

where ``roof`` is ``max(FLOPs / peak, bytes / bandwidth)`` of the step's work on the run's
device (:func:`perfscope.analysis.costmodel.step_costs`), ``L`` the model's layers, ``b``
the sequences in the step (per-row sampling and bookkeeping), ``n`` its new tokens. All
coefficients are fitted together by non-negative least squares (:func:`nnls`, Lawson and
Hanson's active-set method), so no term can go negative to absorb another's noise. A term
the data cannot tell apart (one model shape cannot separate per-layer from per-step, a run
at one batch cannot separate per-sequence from per-step) is folded into ``per_step`` and
named in ``folded``; samples from two runs of different shapes pin it.

Priced beside the fit (bytes the roofline does not see, and per-device costs):

- :func:`quantisation_bytes`: int8 dynamic re-quantisation of activations, weight-only
  dequantisation of a full-precision copy per call;
- :func:`cast_bytes`: a KV cache stored in a dtype the device computes in another (CPU fp8
  to fp32) is read, written as the compute dtype and read again;
- :func:`sparse_bytes_factor`: a CSR weight reads value + column index per non-zero;
- :func:`launch_time`: kernels launched per layer on a GPU (``kernel_launch_s`` of the
  device file) times layers;
- :func:`chunked_prefill_steps`: a per-step token budget splits a prompt into chunks, each
  paying the per-step terms and re-reading the weights;
- :class:`PassCosts`: the *measured* extra time of the passes a technique adds inside its
  kernel calls (int8 re-quantisation, weight-only dequantisation, CSR kernels, 16-bit CPU
  matmuls, a quantised KV cache's casts), timed on the machine against the baseline's
  calls (``perfscope.profiler.engines.reference.passes``) and added to each step
  (:func:`fitted_times`).

:meth:`OverheadFit.on_device` is the projection onto another device: only the parts that
move with the device move (the roofline term at the target's ceilings, the target's kernel
launches); host terms fitted on a GPU run stay (the same host drives the new device); terms
fitted on a CPU run are CPU compute mixed with host work and are not carried.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from perfscope.analysis.costmodel import step_costs, weight_bytes
from perfscope.analysis.modelspec import ModelSpec, weight_bytes_per_param
from perfscope.jsontypes import JsonObject

if TYPE_CHECKING:
    import pandas as pd

    from perfscope.hwdb.spec import DeviceSpec

__all__ = [
    "KERNELS_OUTSIDE_LAYERS",
    "KERNELS_PER_LAYER",
    "TERMS",
    "FittedTimes",
    "OverheadFit",
    "PassCosts",
    "StepSamples",
    "cast_bytes",
    "chunked_prefill_steps",
    "fit_baseline",
    "fit_overhead",
    "fitted_times",
    "launch_time",
    "nnls",
    "quantisation_bytes",
    "roof_times",
    "samples_from_steps",
    "sparse_bytes_factor",
]

#: The fitted terms, in the order of :attr:`OverheadFit.coefficients`.
TERMS = ("roof_scale", "per_layer_s", "per_sequence_s", "per_token_s", "per_step_s")

#: Kernels an eager decoder block launches per step: norms (2), q/k/v and output projections
#: (4), rotary embedding (2), attention (about 3: scores, softmax, weighted sum; 1 fused),
#: residual adds (2), MLP (3 GEMMs + activation + multiply = 5): about 18. An assumption for
#: unfused engines; a compiled engine (CUDA graphs) launches one graph per step instead.
KERNELS_PER_LAYER = 18

#: Ops a step runs outside the decoder blocks: the embedding lookup, the final norm, the LM
#: head GEMM and sampling (about 2: the logits' argmax or softmax and the draw): about 5.
#: With :data:`KERNELS_PER_LAYER` it splits a per-step host term that one model shape cannot
#: separate from a per-layer one (:meth:`OverheadFit.split_layers`): host time per step is
#: assumed to follow the ops the step dispatches.
KERNELS_OUTSIDE_LAYERS = 5


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """Non-negative least squares: ``argmin ||a x - b||`` subject to ``x >= 0``.

    Lawson and Hanson (1974), *Solving Least Squares Problems*, ch. 23 (the active-set
    algorithm ``scipy.optimize.nnls`` implements), in numpy.
    """
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 10 * np.finfo(float).eps * max(m, n) * (np.abs(a).max() if a.size else 1.0)
    for _ in range(max_iter):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


@dataclass(frozen=True)
class StepSamples:
    """Steps to fit, as equal-length arrays.

    Attributes:
        time_s: measured step durations, s.
        roof_s: the roofline time of each step's work on the run's device, s.
        layers: the model's layers for each step.
        sequences: sequences (rows) in each step.
        tokens: new tokens in each step.
        device: key of the device the roofline time is against.
        platform: ``cpu`` or ``gpu`` (where the host terms belong).
        prefill: which steps are prefill steps (``None``: not told apart; one fit for all).
        base_roof_s: per step, the roofline time of a decode step of its rows (the host
            work a prefill step shares with a decode step; a decode step's own roof), s.
        act_dtype: the compute dtype the roofline times are at (``""`` unknown or mixed).
    """

    time_s: np.ndarray
    roof_s: np.ndarray
    layers: np.ndarray
    sequences: np.ndarray
    tokens: np.ndarray
    device: str = ""
    platform: str = "cpu"
    prefill: np.ndarray | None = None
    base_roof_s: np.ndarray | None = None
    act_dtype: str = ""

    def __len__(self) -> int:
        return int(self.time_s.shape[0])

    @staticmethod
    def concat(parts: Sequence[StepSamples]) -> StepSamples:
        """Samples of several runs together (their device and platform must agree)."""
        if not parts:
            raise ValueError("no samples to fit")
        devices = {p.device for p in parts}
        if len(devices) > 1:
            raise ValueError(f"samples from different devices: {', '.join(sorted(devices))}")

        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(p, name) for p in parts])

        kinds = all(p.prefill is not None and p.base_roof_s is not None for p in parts)
        return StepSamples(
            time_s=cat("time_s"),
            roof_s=cat("roof_s"),
            layers=cat("layers"),
            sequences=cat("sequences"),
            tokens=cat("tokens"),
            device=parts[0].device,
            platform=parts[0].platform,
            prefill=cat("prefill") if kinds else None,
            base_roof_s=cat("base_roof_s") if kinds else None,
            act_dtype=parts[0].act_dtype if len({p.act_dtype for p in parts}) == 1 else "",
        )

    def subset(self, keep: np.ndarray) -> StepSamples:
        """The samples where ``keep`` (a boolean mask) is true."""
        return StepSamples(
            time_s=self.time_s[keep],
            roof_s=self.roof_s[keep],
            layers=self.layers[keep],
            sequences=self.sequences[keep],
            tokens=self.tokens[keep],
            device=self.device,
            platform=self.platform,
            prefill=None if self.prefill is None else self.prefill[keep],
            base_roof_s=None if self.base_roof_s is None else self.base_roof_s[keep],
            act_dtype=self.act_dtype,
        )


def roof_times(
    model: ModelSpec,
    device: DeviceSpec,
    batch: np.ndarray,
    new_tokens: np.ndarray,
    context_tokens: np.ndarray,
    extra_bytes: float | np.ndarray = 0.0,
    extra_flops: float | np.ndarray = 0.0,
) -> np.ndarray:
    """The roofline time of each step's work on ``device`` (DRAM bandwidth), s;
    ``extra_bytes`` and ``extra_flops`` per step (work the roofline's cost model does not
    count: other passes, Medusa's heads)."""
    c = step_costs(model, batch, new_tokens, context_tokens)
    peak = device.peak_flops_for(model.act_dtype) or device.peak_flops_for("fp32") or math.inf
    return np.asarray(
        np.maximum(
            (c["flops"] + extra_flops) / peak, (c["bytes"] + extra_bytes) / device.mem_bw_bytes_s
        ),
        dtype=np.float64,
    )


def samples_from_steps(
    steps: pd.DataFrame, model: ModelSpec, device: DeviceSpec, extra_bytes: float = 0.0
) -> StepSamples:
    """The samples of one run's step table (``t_start``, ``t_end`` in ns, ``batch_size``,
    ``new_tokens``, ``context_tokens``, optional ``kind``); steps of zero or negative length
    are dropped. With ``kind``, prefill steps are marked and each carries the roofline time
    of a decode step of its rows at its context (:attr:`StepSamples.base_roof_s`)."""
    dur = (steps["t_end"].to_numpy(np.float64) - steps["t_start"].to_numpy(np.float64)) / 1e9
    keep = dur > 0
    b = steps["batch_size"].to_numpy(np.float64)[keep]
    n = steps["new_tokens"].to_numpy(np.float64)[keep]
    c = steps["context_tokens"].to_numpy(np.float64)[keep]
    roof = roof_times(model, device, b, n, c, extra_bytes)
    prefill = base = None
    if "kind" in steps.columns:
        prefill = (steps["kind"].to_numpy() == "prefill")[keep]
        base = np.where(prefill, roof_times(model, device, b, b, c + n, extra_bytes), roof)
    return StepSamples(
        time_s=dur[keep],
        roof_s=roof,
        layers=np.full(b.shape, float(model.n_layers)),
        sequences=b,
        tokens=n,
        device=device.key,
        platform="cpu" if device.kind in ("cpu", "soc") else "gpu",
        prefill=prefill,
        base_roof_s=base,
        act_dtype=model.act_dtype,
    )


@dataclass(frozen=True)
class OverheadFit:
    """Fitted per-step time (see the module docstring).

    Attributes:
        roof_scale: multiplier on the roofline time (1 / efficiency of the device work).
        per_layer_s, per_sequence_s, per_token_s, per_step_s: host/overhead terms, s.
        folded: terms the samples could not separate, folded into ``per_step_s``.
        samples: steps fitted.
        residual_rms_s: root-mean-square residual, s.
        residual_rel: that over the mean step time (0.1: steps scatter 10% around the fit).
        device: device key the roofline term is against.
        platform: ``cpu`` or ``gpu``.
        prefill_scale: with separate prefill and decode fits, the multiplier on a prefill
            step's roofline time beyond the time of a decode step of its rows
            (:meth:`prefill_step_time`); ``None``: one fit prices both kinds of step.
        act_dtype: the compute dtype of the fitted steps' roofline (``""`` unknown): a
            projection at another dtype scales the work at this dtype's ceilings and is no
            faster than its own dtype's roofline (:func:`fitted_times`).
    """

    roof_scale: float
    per_layer_s: float
    per_sequence_s: float
    per_token_s: float
    per_step_s: float
    folded: tuple[str, ...] = ()
    samples: int = 0
    residual_rms_s: float = 0.0
    residual_rel: float = 0.0
    device: str = ""
    platform: str = "cpu"
    notes: list[str] = field(default_factory=list)
    prefill_scale: float | None = None
    act_dtype: str = ""

    def host_time(self, layers: Any, sequences: Any, tokens: Any) -> Any:
        """The host/overhead term of steps of this shape, s."""
        return (
            self.per_layer_s * layers
            + self.per_sequence_s * np.asarray(sequences, dtype=np.float64)
            + self.per_token_s * np.asarray(tokens, dtype=np.float64)
            + self.per_step_s
        )

    def step_time(self, roof_s: Any, layers: Any, sequences: Any, tokens: Any) -> Any:
        """Predicted step time from its roofline time and shape, s."""
        return self.roof_scale * np.asarray(roof_s, dtype=np.float64) + self.host_time(
            layers, sequences, tokens
        )

    def prefill_step_time(
        self, roof_s: Any, layers: Any, sequences: Any, tokens: Any, base_roof_s: Any
    ) -> Any:
        """Predicted prefill step time, s: with separate fits, the time of a decode step of
        the same rows (``base_roof_s``: its roofline time; the same ops dispatched, so the
        same host time) plus ``prefill_scale x`` the prefill's roofline time ``roof_s``;
        otherwise :meth:`step_time` of the step."""
        if self.prefill_scale is None:
            return self.step_time(roof_s, layers, sequences, tokens)
        base = self.step_time(base_roof_s, layers, sequences, sequences)
        return base + self.prefill_scale * np.asarray(roof_s, dtype=np.float64)

    def predict(self, samples: StepSamples) -> np.ndarray:
        """Predicted time of each of ``samples``' steps, s: :meth:`prefill_step_time` for
        the steps it marks as prefill (when it tells them apart), :meth:`step_time` for the
        rest. The residual the fit states is against these."""
        s = samples
        plain = np.asarray(self.step_time(s.roof_s, s.layers, s.sequences, s.tokens))
        if s.prefill is None or s.base_roof_s is None:
            return plain
        pre = self.prefill_step_time(s.roof_s, s.layers, s.sequences, s.tokens, s.base_roof_s)
        return np.where(s.prefill, pre, plain)

    def split_layers(self, layers: int) -> OverheadFit:
        """The fit with a folded per-layer term split out of ``per_step_s``, for models of
        ``layers`` blocks (the shape it was fitted on).

        When the fitted steps all had one model shape, per layer was folded into per step
        (:func:`fit_overhead`); a projection that changes the layer count would then keep
        the whole host time fixed. The split assumes host time per step follows the ops the
        step dispatches: ``KERNELS_PER_LAYER x layers`` of ``KERNELS_PER_LAYER x layers +
        KERNELS_OUTSIDE_LAYERS`` is per layer, the rest per step. The fit itself is
        unchanged where per layer was fitted (or ``layers`` < 1); the note says which.
        """
        folded = [f for f in self.folded if f.startswith("per layer")]
        if not folded or layers < 1 or self.per_layer_s > 0:
            return self
        in_layers = KERNELS_PER_LAYER * layers
        share = in_layers / (in_layers + KERNELS_OUTSIDE_LAYERS)
        return OverheadFit(
            roof_scale=self.roof_scale,
            per_layer_s=self.per_step_s * share / layers,
            per_sequence_s=self.per_sequence_s,
            per_token_s=self.per_token_s,
            per_step_s=self.per_step_s * (1.0 - share),
            folded=tuple(f for f in self.folded if not f.startswith("per layer")),
            samples=self.samples,
            residual_rms_s=self.residual_rms_s,
            residual_rel=self.residual_rel,
            device=self.device,
            platform=self.platform,
            prefill_scale=self.prefill_scale,
            act_dtype=self.act_dtype,
            notes=[
                *self.notes,
                f"per layer not separable (one model shape): {100 * share:.0f}% of the per-step "
                f"host term taken as per layer ({KERNELS_PER_LAYER} ops x {layers} layers of "
                f"{in_layers + KERNELS_OUTSIDE_LAYERS} per step, an assumption)",
            ],
        )

    def with_rows(self, per_row_s: float, rows: int, how: str) -> OverheadFit:
        """The fit with a per-sequence cost it could not separate (every fitted step had one
        batch, so per sequence was folded into per step) set to ``per_row_s``, measured
        elsewhere (``how``), and taken out of per step at the fitted steps' ``rows``, so a
        step of the fitted batch is predicted as before. Unchanged when per sequence was
        fitted."""
        if not any(f.startswith("per sequence") for f in self.folded) or per_row_s <= 0:
            return self
        return replace(
            self,
            per_sequence_s=per_row_s,
            per_step_s=max(self.per_step_s - per_row_s * rows, 0.0),
            folded=tuple(f for f in self.folded if not f.startswith("per sequence")),
            notes=[
                *self.notes,
                f"per sequence not separable (one batch of {rows}): "
                f"{per_row_s * 1e6:.3g} us a row, {how}",
            ],
        )

    def on_device(
        self, target: DeviceSpec, model: ModelSpec, *, launches: bool = True
    ) -> OverheadFit:
        """The fit carried to ``target``: the roofline term is recomputed there by the caller
        (``roof_scale`` 1, speed of light, unless the target is the fitted device); host
        terms stay when fitted on a GPU run (the host does not change), are dropped when
        fitted on a CPU (CPU compute and host work are not separable); a GPU target adds
        its kernel launches (:func:`launch_time`) per step unless ``launches`` is false
        (the caller prices them)."""
        if target.key == self.device:
            return self
        notes = []
        if self.platform == "gpu":
            layer, seq, tok, step = (
                self.per_layer_s,
                self.per_sequence_s,
                self.per_token_s,
                self.per_step_s,
            )
            notes.append("host terms carried from the fitted GPU run (same host)")
        else:
            layer = seq = tok = step = 0.0
            notes.append(
                "host terms fitted on a CPU are CPU compute and host work together: not carried"
            )
        launch = launch_time(target, model) if launches else 0.0
        if launch:
            layer += launch / max(model.n_layers, 1)
            notes.append(
                f"{KERNELS_PER_LAYER} kernel launches per layer at "
                f"{(target.kernel_launch_s or 0.0) * 1e6:.3g} us each ({target.key})"
            )
        return OverheadFit(
            roof_scale=1.0,
            per_layer_s=layer,
            per_sequence_s=seq,
            per_token_s=tok,
            per_step_s=step,
            folded=self.folded,
            samples=self.samples,
            residual_rms_s=self.residual_rms_s,
            residual_rel=self.residual_rel,
            device=target.key,
            platform="cpu" if target.kind in ("cpu", "soc") else "gpu",
            notes=notes,
        )

    def to_dict(self) -> JsonObject:
        """JSON-ready dict."""
        d = asdict(self)
        d["folded"] = list(self.folded)
        return d

    @classmethod
    def from_dict(cls, data: Any) -> OverheadFit:
        """Inverse of :meth:`to_dict`."""
        scale = data.get("prefill_scale")
        return cls(
            roof_scale=float(data["roof_scale"]),
            per_layer_s=float(data["per_layer_s"]),
            per_sequence_s=float(data["per_sequence_s"]),
            per_token_s=float(data["per_token_s"]),
            per_step_s=float(data["per_step_s"]),
            folded=tuple(str(f) for f in data.get("folded") or ()),
            samples=int(data.get("samples") or 0),
            residual_rms_s=float(data.get("residual_rms_s") or 0.0),
            residual_rel=float(data.get("residual_rel") or 0.0),
            device=str(data.get("device") or ""),
            platform=str(data.get("platform") or "cpu"),
            notes=[str(n) for n in data.get("notes") or []],
            prefill_scale=None if scale is None else float(scale),
            act_dtype=str(data.get("act_dtype") or ""),
        )

    def describe(self) -> str:
        """One line: the terms and the residual."""
        us = 1e6
        parts = [
            f"{self.roof_scale:.3g} x roofline",
            f"{self.per_layer_s * us:.3g} us/layer",
            f"{self.per_sequence_s * us:.3g} us/sequence",
            f"{self.per_token_s * us:.3g} us/token",
            f"{self.per_step_s * us:.3g} us/step",
        ]
        text = " + ".join(parts) + (
            f" (residual {self.residual_rms_s * us:.3g} us rms, "
            f"{100 * self.residual_rel:.0f}% of the mean step; {self.samples} steps)"
        )
        if self.folded:
            text += f"; folded into per step: {', '.join(self.folded)}"
        if self.prefill_scale is not None:
            text += (
                f"; prefill steps fitted apart: a decode step of their rows + "
                f"{self.prefill_scale:.3g} x their roofline"
            )
        return text


def fit_overhead(samples: StepSamples | Sequence[StepSamples]) -> OverheadFit:
    """Fit :class:`OverheadFit` to steps (one run's, or several runs' on one device).

    When the samples tell prefill steps apart (:attr:`StepSamples.prefill`) and hold at
    least two other steps, the terms are fitted to the decode (non-prefill) steps alone and
    the prefill steps get their own roofline multiplier (``prefill_scale``, least squares,
    non-negative): a prefill step is a decode step of its rows (same ops dispatched: the
    same host time) plus ``prefill_scale x`` its roofline time. One fit of both kinds, by
    contrast, prices a prompt's tokens at the decode steps' roofline multiplier, which on
    an overhead-bound engine is host time that varies with the context, not the prefill's
    work: an 8-prompt prefill was projected at 2-3x its measured time.

    Raises:
        ValueError: fewer than two steps, or runs on different devices.
    """
    s = StepSamples.concat(list(samples)) if not isinstance(samples, StepSamples) else samples
    if len(s) < 2:
        raise ValueError(f"need at least two steps to fit, got {len(s)}")
    if s.prefill is not None and s.base_roof_s is not None and s.prefill.any():
        decode = s.subset(~s.prefill)
        if len(decode) >= 2:
            return _fit_prefill_apart(s, fit_overhead(replace(decode, prefill=None)))
    cols = {
        "roof_scale": s.roof_s,
        "per_layer_s": s.layers,
        "per_sequence_s": s.sequences,
        "per_token_s": s.tokens,
        "per_step_s": np.ones(len(s)),
    }
    folded = []
    for name in ("per_layer_s", "per_sequence_s", "per_token_s"):
        v = cols[name]
        if float(np.ptp(v)) == 0.0:
            folded.append(name.removesuffix("_s").replace("_", " "))
    # per-sequence and per-token coincide when every step has one token per row (decode only)
    if (
        "per sequence" not in folded
        and "per token" not in folded
        and np.allclose(cols["per_sequence_s"], cols["per_token_s"])
    ):
        folded.append("per token (= per sequence in these steps)")
    use = [
        n
        for n in TERMS
        if not any(f.startswith(n.removesuffix("_s").replace("_", " ")) for f in folded)
    ]
    a = np.column_stack([cols[n] for n in use])
    # scale columns so the active-set tolerances see comparable magnitudes
    scale = np.where(np.abs(a).max(axis=0) > 0, np.abs(a).max(axis=0), 1.0)
    x = nnls(a / scale, s.time_s) / scale
    coef = dict.fromkeys(TERMS, 0.0)
    coef.update({n: float(v) for n, v in zip(use, x, strict=True)})
    resid = s.time_s - a @ x
    rms = float(np.sqrt(np.mean(resid**2)))
    mean = float(np.mean(s.time_s))
    return OverheadFit(
        roof_scale=coef["roof_scale"],
        per_layer_s=coef["per_layer_s"],
        per_sequence_s=coef["per_sequence_s"],
        per_token_s=coef["per_token_s"],
        per_step_s=coef["per_step_s"],
        folded=tuple(folded),
        samples=len(s),
        residual_rms_s=rms,
        residual_rel=rms / mean if mean > 0 else 0.0,
        device=s.device,
        platform=s.platform,
        act_dtype=s.act_dtype,
    )


def _fit_prefill_apart(s: StepSamples, decode: OverheadFit) -> OverheadFit:
    """``decode`` (fitted to the decode steps of ``s``) with the prefill steps' roofline
    multiplier fitted to what they took beyond a decode step of their rows; the residual
    over all of ``s``."""
    assert s.prefill is not None and s.base_roof_s is not None
    p = s.subset(s.prefill)
    assert p.base_roof_s is not None
    base = decode.step_time(p.base_roof_s, p.layers, p.sequences, p.sequences)
    rest = p.time_s - base
    denom = float(np.sum(p.roof_s**2))
    scale = max(float(np.sum(p.roof_s * rest)) / denom, 0.0) if denom > 0 else 0.0
    fit = replace(decode, prefill_scale=scale, samples=len(s))
    pred = fit.predict(s)
    rms = float(np.sqrt(np.mean((s.time_s - pred) ** 2)))
    mean = float(np.mean(s.time_s))
    return replace(fit, residual_rms_s=rms, residual_rel=rms / mean if mean > 0 else 0.0)


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``(intercept, slope)`` of the least-squares line through the points (a constant
    through one point, or through points at one x)."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if y.size == 0:
        return 0.0, 0.0
    if y.size == 1 or float(np.ptp(x)) == 0.0:
        return float(np.mean(y)), 0.0
    slope, icpt = np.polyfit(x, y, 1)
    return float(icpt), float(slope)


@dataclass(frozen=True)
class PassCosts:
    """The measured extra time of a setting's passes over the baseline's (candidate minus
    baseline, seconds; negative where the candidate's call is faster), as lines through the
    sizes timed on the machine (``perfscope.profiler.engines.reference.passes``).

    A technique that changes what happens *inside* a kernel call (int8 re-quantisation of
    every linear input, a weight-only int8 weight dequantised per call, torch's CSR matmul,
    a 16-bit CPU matmul, a quantised KV cache written and cast back) is invisible to the
    roofline of an overhead-bound engine and to a fit of the baseline's steps; these are
    its calls timed against the baseline's, interleaved, at the study's load and threads.

    Attributes:
        linears_s, linears_per_row_s: one block's seven linear layers, fixed and per row.
        head_s, head_per_row_s: the LM head, fixed and per row.
        kv_read_s, kv_read_per_element_s: one layer's K and V read (cast), fixed and per
            element of K (or V) read.
        kv_write_s, kv_write_per_row_s: one layer's K and V write, fixed and per token.
        decode_rows, decode_span, isolated_decode_s: the baseline model's whole decode
            step at that batch and cache span, timed alone (0: not timed), s.
        prefill_rows, prefill_tokens, isolated_prefill_s: the same for its prefill.
        more_rows, isolated_more_rows_s: the baseline's decode step alone at another batch
            (the candidate's; 0: not timed): with ``isolated_decode_s`` the cost of a row,
            which a fit of steps at one batch cannot separate (:meth:`OverheadFit.with_rows`).
        source: how they were measured (points, rounds, load, threads).

    The timed calls ran outside the engine, briefly; the engine's steps ran under the
    study's load and scheduling. :func:`fitted_times` stretches the differences by how much
    longer the fitted baseline step is than the same step timed alone (:meth:`stretch`):
    the assumption is that whatever lengthens the engine's steps (other processes' share of
    the CPU, above all) lengthens the candidate's extra calls alike.
    """

    linears_s: float = 0.0
    linears_per_row_s: float = 0.0
    head_s: float = 0.0
    head_per_row_s: float = 0.0
    kv_read_s: float = 0.0
    kv_read_per_element_s: float = 0.0
    kv_write_s: float = 0.0
    kv_write_per_row_s: float = 0.0
    decode_rows: float = 0.0
    decode_span: float = 0.0
    isolated_decode_s: float = 0.0
    prefill_rows: float = 0.0
    prefill_tokens: float = 0.0
    isolated_prefill_s: float = 0.0
    more_rows: float = 0.0
    isolated_more_rows_s: float = 0.0
    source: str = ""

    @classmethod
    def from_points(
        cls,
        *,
        rows: Sequence[float],
        linears_s: Sequence[float],
        head_s: Sequence[float],
        kv_elements: Sequence[float],
        kv_read_s: Sequence[float],
        write_rows: Sequence[float],
        kv_write_s: Sequence[float],
        decode: tuple[float, float] = (0.0, 0.0),
        isolated_decode_s: float = 0.0,
        prefill: tuple[float, float] = (0.0, 0.0),
        isolated_prefill_s: float = 0.0,
        more_rows: tuple[float, float] = (0.0, 0.0),
        source: str = "",
    ) -> PassCosts:
        """Lines through timed points (each a candidate-minus-baseline difference), with
        the baseline's whole decode step (``decode``: rows, span) and prefill (``prefill``:
        rows, tokens) as timed alone, and ``more_rows`` (rows, seconds) the decode step at
        another batch."""
        lin = _line(rows, linears_s)
        head = _line(rows, head_s)
        read = _line(kv_elements, kv_read_s)
        write = _line(write_rows, kv_write_s)
        return cls(
            *lin,
            *head,
            *read,
            *write,
            *decode,
            isolated_decode_s,
            *prefill,
            isolated_prefill_s,
            *more_rows,
            source=source,
        )

    @property
    def times_calls(self) -> bool:
        """Whether any kernel call of the candidate was timed against the baseline's (not
        only the baseline's own steps)."""
        return any(
            getattr(self, f)
            for f in (
                "linears_s",
                "linears_per_row_s",
                "head_s",
                "head_per_row_s",
                "kv_read_s",
                "kv_read_per_element_s",
                "kv_write_s",
                "kv_write_per_row_s",
            )
        )

    @property
    def isolated_per_row_s(self) -> float | None:
        """The baseline's decode step alone, per row more (``None``: one batch timed)."""
        rows = self.more_rows - self.decode_rows
        if self.isolated_more_rows_s <= 0 or self.isolated_decode_s <= 0 or rows == 0:
            return None
        return max((self.isolated_more_rows_s - self.isolated_decode_s) / rows, 0.0)

    def stretch(
        self, fit: OverheadFit, model: ModelSpec, device: DeviceSpec
    ) -> tuple[float, float]:
        """(decode, prefill): the fitted baseline step over the same step timed alone, at
        the shapes timed (1 where nothing was timed). ``model``: the baseline's."""
        k_d = k_p = 1.0
        if self.isolated_decode_s > 0 and self.decode_rows >= 1 and self.decode_span >= 2:
            at = fitted_times(
                fit,
                model,
                device,
                batch=int(self.decode_rows),
                prompt_len=int(self.decode_span) - 1,
                output_len=2,
            )
            k_d = at.tpot_s / self.isolated_decode_s
        if self.isolated_prefill_s > 0 and self.prefill_rows >= 1 and self.prefill_tokens >= 1:
            at = fitted_times(
                fit,
                model,
                device,
                batch=int(self.prefill_rows),
                prompt_len=int(self.prefill_tokens),
                output_len=2,
            )
            k_p = at.ttft_s / self.isolated_prefill_s
        return k_d, k_p

    def step_s(
        self, model: ModelSpec, rows: Any, span: Any, written: Any, head_rows: Any
    ) -> np.ndarray:
        """Extra seconds of steps: per layer the linears over ``rows`` rows, the K and V
        read of ``rows``-independent ``span`` positions per batch row (``head_rows`` batch
        rows) and the write of ``written`` tokens; once the LM head over ``head_rows``."""
        r = np.asarray(rows, dtype=np.float64)
        b = np.asarray(head_rows, dtype=np.float64)
        elements = b * np.asarray(span, dtype=np.float64) * model.n_kv_heads * model.head_dim
        per_layer = (
            self.linears_s
            + self.linears_per_row_s * r
            + self.kv_read_s
            + self.kv_read_per_element_s * elements
            + self.kv_write_s
            + self.kv_write_per_row_s * np.asarray(written, dtype=np.float64)
        )
        return np.asarray(
            model.n_layers * per_layer + self.head_s + self.head_per_row_s * b, dtype=np.float64
        )

    def to_dict(self) -> JsonObject:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> PassCosts:
        """Inverse of :meth:`to_dict`."""
        names = {f for f in cls.__dataclass_fields__ if f != "source"}
        return cls(
            **{k: float(data.get(k) or 0.0) for k in names}, source=str(data.get("source", ""))
        )


@dataclass(frozen=True)
class FittedTimes:
    """A static batch timed by a fitted cost model on the fitted device (seconds).

    Attributes:
        ttft_s: the prefill step of the whole batch (no queueing).
        tpot_s: the mean decode step.
        e2e_s: ``ttft_s + (output_len - 1) x tpot_s``.
        throughput_tok_s: output tokens of the batch over ``e2e_s``, tokens/s.
        prefill_host_s, decode_host_s: the host/overhead part of the prefill step and of the
            mean decode step.
        sol_ttft_s, sol_tpot_s: the roofline time alone of the same steps.
    """

    ttft_s: float
    tpot_s: float
    e2e_s: float
    throughput_tok_s: float | None
    prefill_host_s: float
    decode_host_s: float
    sol_ttft_s: float
    sol_tpot_s: float


def fitted_times(
    fit: OverheadFit,
    model: ModelSpec,
    device: DeviceSpec,
    *,
    batch: int,
    prompt_len: int,
    output_len: int,
    cached_prefix_len: int = 0,
    extra_bytes: float = 0.0,
    extra_bytes_per_token: float = 0.0,
    passes: PassCosts | None = None,
) -> FittedTimes:
    """Time a static batch (one prefill of ``batch`` prompts, then ``output_len - 1`` decode
    steps with a growing cache) by ``fit`` on ``device``: each step is ``roof_scale x``
    its roofline time (:func:`roof_times`, the roofline the fit was made against) plus the
    host terms of its shape (:meth:`OverheadFit.host_time`), so a larger batch pays its
    per-row and per-token host cost and a shallower model its per-layer one.

    ``cached_prefix_len``: prompt tokens per sequence a prefix cache serves (the prefill
    computes the rest); ``extra_bytes``: bytes per step the roofline does not count, and
    ``extra_bytes_per_token`` per new token of a step (:func:`quantisation_bytes`: int8-wo
    per step, int8 per token). ``passes``: the measured extra time of the setting's kernel
    calls over the fitted baseline's (:class:`PassCosts`), stretched as the fitted steps
    are over the same steps timed alone (:meth:`PassCosts.stretch`) and added to every
    step; a dtype other than the fitted one is then priced by those measured calls, not by
    its own dtype's roofline ceiling.
    """
    b = max(int(batch), 1)
    p = max(int(prompt_len), 1)
    out = max(int(output_len), 1)
    cached = min(max(int(cached_prefix_len), 0), p - 1)
    layers = float(model.n_layers)
    new_p = p - cached
    # A dtype other than the fitted one: the fitted multiplier applies to the work at the
    # fitted dtype's ceilings, and the step is no faster than its own dtype's roofline.
    other = bool(fit.act_dtype) and fit.act_dtype != model.act_dtype
    at_fit = replace(model, act_dtype=fit.act_dtype) if other else model
    use_floor = other and passes is None  # measured calls price a dtype the fit never saw

    def work(scale: float, rows: Any, tokens: Any, context: Any, extra: float) -> np.ndarray:
        r = (np.asarray(rows, dtype=np.float64), np.asarray(tokens, dtype=np.float64))
        ctx_a = np.asarray(context, dtype=np.float64)
        scaled = scale * roof_times(at_fit, device, r[0], r[1], ctx_a, extra)
        if not use_floor:
            return np.asarray(scaled, dtype=np.float64)
        floor = roof_times(model, device, r[0], r[1], ctx_a, extra)
        return np.asarray(np.maximum(scaled, floor), dtype=np.float64)

    one = [float(b)]
    prefill_extra = extra_bytes + extra_bytes_per_token * b * new_p
    decode_extra = extra_bytes + extra_bytes_per_token * b
    roof_p = roof_times(
        model, device, np.array(one), np.array([b * new_p]), np.array([b * cached]), prefill_extra
    )
    if fit.prefill_scale is not None:
        # a decode step of the batch's rows (same ops, same host time) + the prompts' work
        host_p = float(fit.host_time(layers, b, b))
        base = work(fit.roof_scale, one, one, [float(b * p)], decode_extra)
        prompts = work(fit.prefill_scale, one, [b * new_p], [b * cached], prefill_extra)
        ttft = host_p + float(base[0]) + float(prompts[0])
    else:
        host_p = float(fit.host_time(layers, b, b * new_p))
        ttft = float(work(fit.roof_scale, one, [b * new_p], [b * cached], prefill_extra)[0])
        ttft += host_p
    steps = max(out - 1, 1)
    ctx = p + np.arange(steps, dtype=np.float64)
    rows = np.full(steps, float(b))
    roof_d = roof_times(model, device, rows, rows, b * ctx, decode_extra)
    host_d = float(fit.host_time(layers, b, b))
    tpot = float(np.mean(work(fit.roof_scale, rows, rows, b * ctx, decode_extra))) + host_d
    if passes is not None:
        k_d, k_p = passes.stretch(fit, model, device)
        ttft += k_p * float(passes.step_s(model, b * new_p, p, b * new_p, b))
        tpot += k_d * float(np.mean(passes.step_s(model, rows, ctx + 1, rows, rows)))
    e2e = ttft + (out - 1) * tpot
    return FittedTimes(
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        throughput_tok_s=b * out / e2e if e2e > 0 else None,
        prefill_host_s=host_p,
        decode_host_s=host_d,
        sol_ttft_s=float(roof_p[0]),
        sol_tpot_s=float(np.mean(roof_d)),
    )


# --------------------------------------------------------------------------- priced passes


def quantisation_bytes(model: ModelSpec, mode: str, tokens: float) -> float:
    """Bytes a quantised linear layer stack moves per step beyond its weights, B.

    ``int8`` (dynamic): every linear reads its fp32 input and writes an int8 copy (5 bytes
    per input element); per token and layer the inputs are q, k, v, output, gate and up
    projections' (``6 x hidden``) and the down projection's (``intermediate``).
    ``int8-wo`` (weight-only, dequantised per call): every weight is written as an
    activation-dtype copy and read again (``2 x`` the activation dtype's bytes per
    parameter, beyond the int8 read the roofline counts). ``none``: 0.
    """
    if mode in ("none", "", None):
        return 0.0
    if mode == "int8":
        per_token = (6 * model.hidden_size + model.intermediate_size) * model.n_layers
        return float(5.0 * per_token * max(tokens, 0.0))
    if mode == "int8-wo":
        params = weight_bytes(model) / max(model.weight_bytes_per_param, 1e-9)
        return float(params * 2 * weight_bytes_per_param(model.act_dtype))
    raise ValueError(f"unknown quantisation mode {mode!r} (none, int8, int8-wo)")


def cast_bytes(kv_bytes_read: float, stored_bytes: float, compute_bytes: float) -> float:
    """Extra bytes of casting a cache stored at ``stored_bytes`` per element to the compute
    dtype (``compute_bytes``) per step: the cast writes and the attention reads a
    compute-dtype copy of everything read. 0 when the device computes in the stored dtype.
    """
    if stored_bytes >= compute_bytes:
        return 0.0
    elements = kv_bytes_read / stored_bytes
    return float(2.0 * elements * compute_bytes)


def sparse_bytes_factor(
    density: float, value_bytes: float = 4.0, index_bytes: float = 8.0
) -> float:
    """Bytes a CSR weight reads relative to its dense form: ``density x (value + index) /
    value`` (torch CSR: int64 column indices; row pointers are negligible). At 50% density
    with fp32 values: 1.5 (more bytes than dense, so unstructured sparsity slows a
    memory-bound step)."""
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density}")
    return density * (value_bytes + index_bytes) / value_bytes


def launch_time(
    device: DeviceSpec, model: ModelSpec, kernels_per_layer: int = KERNELS_PER_LAYER
) -> float:
    """Kernel-launch time of one eager step on ``device``: launches per layer x layers x the
    device's ``kernel_launch_s`` (0 when the device file gives none, e.g. CPUs), s."""
    if not device.kernel_launch_s:
        return 0.0
    return float(device.kernel_launch_s * kernels_per_layer * model.n_layers)


def chunked_prefill_steps(
    prompt_tokens: int, budget: int | None, decode_rows: int = 0
) -> list[int]:
    """Prompt tokens per step when each step may carry at most ``budget`` tokens, decode
    rows first (``None``: the whole prompt in one step)."""
    if prompt_tokens <= 0:
        return []
    if budget is None:
        return [prompt_tokens]
    room = budget - decode_rows
    if room <= 0:
        raise ValueError(
            f"a budget of {budget} tokens leaves no room beside {decode_rows} decode rows"
        )
    full, rest = divmod(prompt_tokens, room)
    return [room] * full + ([rest] if rest else [])


def fit_baseline(
    runs: Sequence[tuple[pd.DataFrame, Mapping[str, Any] | None, Mapping[str, Any] | None]],
) -> tuple[OverheadFit | None, str]:
    """The fitted cost model (:func:`fit_overhead`) of a study's baseline runs, each given as
    ``(steps, model, device spec)`` (the run's steps table, its summary's ``model`` and
    ``hardware.spec``), and a note saying what it rests on; ``(None, why)`` when a run has no
    engine steps, model or device to fit."""
    from perfscope.hwdb.spec import DeviceSpec

    parts: list[StepSamples] = []
    for steps, model, spec in runs:
        if steps.empty or not spec or not model:
            return None, "no fitted cost model: the baseline runs record no engine steps"
        parts.append(
            samples_from_steps(
                steps, ModelSpec.from_dict(dict(model)), DeviceSpec.from_dict(dict(spec))
            )
        )
    try:
        fit = fit_overhead(parts)
    except ValueError as exc:
        return None, f"no fitted cost model: {exc}"
    return fit, (
        f"projections from the fitted cost model of the baseline's {len(parts)} runs "
        f"({fit.samples} steps; residual {100 * fit.residual_rel:.0f}% of the mean step); "
        "the candidates' runs are not fitted, so the projection is checked on runs it never saw"
    )
