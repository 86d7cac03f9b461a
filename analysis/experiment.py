"""Experiments that hold up on a noisy machine: balanced order, paired analysis by block,
robust intervals, one primary metric, multiplicity control, detectable change.

This module is pure (no I/O, no clock): it plans run orders and judges per-run values.
Every comparison in perfscope (``perfscope compare``, ``run --repeat --vs``, studies, the
pytest baseline gate, :func:`perfscope.assert_no_regression`) goes through
:func:`judge_metric` and :func:`judge_experiment`, so they share one rule, one vocabulary
(:data:`BETTER`, :data:`WORSE`, :data:`NO_CHANGE`) and one record (:class:`SetChange`).
The method is explained in ``docs/experiments.md``.

Design
    :func:`block_order` lays arms out in blocks, one run of every arm per block. Two arms
    alternate AB, BA, AB, BA... (ABBA, the first orientation drawn from the seed), so a
    position effect (the second run of a block being slower) and a linear drift cancel in
    the mean; more arms get a seeded random permutation per block.

Analysis
    With blocks (runs paired by their block), each block gives a *within-block log ratio*
    ``d = log(candidate / baseline)``. The ratio is ``exp`` of the Hodges–Lehmann estimate
    of ``d`` (median of the Walsh averages) and its interval is the distribution-free
    Wilcoxon signed-rank interval, read off the order statistics of the Walsh averages: one
    wild block moves it by one order statistic, not to ``[0.01, 798]``. Without blocks
    (run sets made apart), the same is done with the two-sample Hodges–Lehmann shift and
    the Mann–Whitney interval. Metrics that can be zero use differences relative to the
    baseline's median instead of log ratios.

    A change is :data:`BETTER` or :data:`WORSE` only when its (multiplicity-corrected) test
    rejects "no change" at the stated level; otherwise it is :data:`NO_CHANGE`. The fewest
    blocks that can show anything at 95% is 6 (``2 / 2**6 < 0.05``); fewer blocks give a
    ratio and "no detectable change" with the reason.

Multiplicity
    One metric is primary; it is tested at ``0.8 * alpha``. If it changed, the secondary
    metrics are tested with the Benjamini–Hochberg procedure at false discovery rate
    ``alpha``; otherwise at ``0.2 * alpha`` (a fallback split): when nothing changed (A/A),
    the chance of any false alarm over all metrics stays at ``alpha``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache

__all__ = [
    "BETTER",
    "DEFAULT_CONFIDENCE",
    "MIN_BLOCKS",
    "NO_CHANGE",
    "PRIMARY_SHARE",
    "VERDICTS",
    "WORSE",
    "Experiment",
    "PositionEffect",
    "SetChange",
    "benjamini_hochberg",
    "block_order",
    "blocks_needed",
    "detectable_change",
    "fewest_for_interval",
    "holm",
    "judge_experiment",
    "judge_metric",
    "level_text",
    "mann_whitney_interval",
    "outlier_indices",
    "position_effect",
    "robust_sd",
    "signed_rank_interval",
    "spread_interval",
    "t_quantile",
]

BETTER = "better"
WORSE = "worse"
NO_CHANGE = "no detectable change"
#: The one vocabulary of a judged change (``n/a`` is not a verdict: a value is missing).
VERDICTS = (BETTER, WORSE, NO_CHANGE)
DEFAULT_CONFIDENCE = 0.95
#: Share of alpha spent on the primary metric (the rest is the secondaries' fallback).
PRIMARY_SHARE = 0.8
#: Fewest blocks whose signed-rank test can reject at 95% (two-sided): 2 / 2**6 < 0.05.
MIN_BLOCKS = 6
#: A block (or run) is an outlier when it lies this many robust SDs from the median.
OUTLIER_SDS = 5.0
#: Exact null distributions up to this many blocks (runs per side); normal beyond.
_EXACT_MAX = 60


# --------------------------------------------------------------------------- design


def block_order(arms: int, blocks: int, seed: int) -> list[list[int]]:
    """The order of arm indices in each block: ``blocks`` lists, each a permutation of
    ``range(arms)``.

    Two arms alternate ``[0, 1]`` and ``[1, 0]`` (ABBA), starting with the orientation the
    seed draws, so over every pair of blocks each arm runs first once. More arms get a
    seeded random permutation per block. The same seed gives the same order.
    """
    if arms < 1 or blocks < 0:
        raise ValueError(f"need at least one arm and no negative blocks, got {arms}, {blocks}")
    rng = random.Random(seed)
    if arms == 2:
        flip = rng.random() < 0.5
        return [[1, 0] if (i % 2 == 1) != flip else [0, 1] for i in range(blocks)]
    out = []
    for _ in range(blocks):
        perm = list(range(arms))
        rng.shuffle(perm)
        out.append(perm)
    return out


# --------------------------------------------------------------------------- distributions


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (``0.5 < p < 1``) of Student's t with ``df`` degrees of freedom
    (``df`` rounded down, at least 1). Used for the detectable change."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"quantile must be between 0.5 and 1, got {p}")
    k = max(1, math.floor(df))
    if k > 300:
        return statistics.NormalDist().inv_cdf(p)
    target = 2.0 * p - 1.0

    def cdf2(t: float) -> float:  # P(|T| <= t), Abramowitz and Stegun 26.7.3-4
        theta = math.atan(t / math.sqrt(k))
        c2 = math.cos(theta) ** 2
        if k == 1:
            return 2.0 * theta / math.pi
        if k % 2 == 1:
            term = acc = math.cos(theta)
            for j in range(1, (k - 1) // 2):
                term *= c2 * (2 * j) / (2 * j + 1)
                acc += term
            return 2.0 / math.pi * (theta + math.sin(theta) * acc)
        term = acc = 1.0
        for j in range(1, k // 2):
            term *= c2 * (2 * j - 1) / (2 * j)
            acc += term
        return math.sin(theta) * acc

    lo, hi = 0.0, 1.0
    while cdf2(hi) < target:
        hi *= 2.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if cdf2(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


@cache
def _signed_rank_counts(n: int) -> tuple[int, ...]:
    """Number of sign assignments giving each signed-rank sum ``W+ = 0..n(n+1)/2``."""
    counts = [1]
    for r in range(1, n + 1):
        nxt = counts + [0] * r
        for w, c in enumerate(counts):
            nxt[w + r] += c
        counts = nxt
    return tuple(counts)


@cache
def _mann_whitney_counts(m: int, n: int) -> tuple[int, ...]:
    """Number of arrangements giving each Mann–Whitney ``U = 0..m*n``."""
    # f[i][j] = counts for i and j items; recurrence f(i,j,u) = f(i-1,j,u-j) + f(i,j-1,u).
    table: dict[tuple[int, int], list[int]] = {}
    for i in range(m + 1):
        for j in range(n + 1):
            if i == 0 or j == 0:
                table[(i, j)] = [1]
                continue
            a, b = table[(i - 1, j)], table[(i, j - 1)]
            out = [0] * (i * j + 1)
            for u, c in enumerate(a):
                out[u + j] += c
            for u, c in enumerate(b):
                out[u] += c
            table[(i, j)] = out
    return tuple(table[(m, n)])


def _lower_tail_index(counts: Sequence[int], alpha: float) -> int:
    """The largest ``k`` with ``P(S < k) <= alpha / 2`` (``S`` distributed as ``counts``):
    the interval is the ``k``-th smallest to ``k``-th largest of the sorted estimates
    (1-based); 0 when no such interval exists at this level."""
    total = sum(counts)
    acc = 0
    k = 0
    for s, c in enumerate(counts):
        if (acc + c) / total <= alpha / 2:
            acc += c
            k = s + 1
        else:
            break
    return k


def _normal_k(n_est: int, mean: float, var: float, alpha: float) -> int:
    z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
    return max(0, min(n_est // 2, math.floor(mean - z * math.sqrt(var))))


def _walsh(d: Sequence[float]) -> list[float]:
    return sorted((d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d)))


def signed_rank_interval(
    d: Sequence[float], confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, tuple[float, float] | None, float]:
    """Hodges–Lehmann estimate, Wilcoxon signed-rank interval and two-sided p-value of the
    centre of the paired differences ``d``.

    Returns ``(estimate, (lo, hi) or None, p)``; the interval is ``None`` when so few
    differences cannot give one at ``confidence`` (fewer than :data:`MIN_BLOCKS` at 95%).
    """
    n = len(d)
    if n == 0:
        raise ValueError("no differences")
    w = _walsh(d)
    est = statistics.median(w)
    alpha = 1 - confidence
    if n <= _EXACT_MAX:
        k = _lower_tail_index(_signed_rank_counts(n), alpha)
    else:
        mu = n * (n + 1) / 4
        k = _normal_k(len(w), mu, n * (n + 1) * (2 * n + 1) / 24, alpha)
    ci = (w[k - 1], w[len(w) - k]) if k >= 1 else None
    return est, ci, _signed_rank_p(d)


def _signed_rank_p(d: Sequence[float]) -> float:
    """Two-sided p-value of Wilcoxon's signed-rank test (zeros dropped, midranks for ties;
    exact null for no ties and small n, normal approximation otherwise)."""
    nz = [x for x in d if x != 0.0]
    n = len(nz)
    if n == 0:
        return 1.0
    order = sorted(range(n), key=lambda i: abs(nz[i]))
    ranks = [0.0] * n
    i = 0
    ties = False
    while i < n:
        j = i
        while j + 1 < n and abs(nz[order[j + 1]]) == abs(nz[order[i]]):
            j += 1
        if j > i:
            ties = True
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    w_plus = sum(r for r, x in zip(ranks, nz, strict=True) if x > 0)
    mu = n * (n + 1) / 4
    if not ties and n <= _EXACT_MAX:
        counts = _signed_rank_counts(n)
        total = sum(counts)
        w = round(w_plus)
        lo = sum(counts[: min(w, len(counts) - 1 - w) + 1])
        return min(1.0, 2 * lo / total)
    var = sum(r * r for r in ranks) / 4
    if var == 0:
        return 1.0
    z = (abs(w_plus - mu) - 0.5) / math.sqrt(var)
    return min(1.0, 2 * (1 - statistics.NormalDist().cdf(max(z, 0.0))))


def mann_whitney_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, tuple[float, float] | None, float]:
    """Two-sample Hodges–Lehmann shift of ``b`` over ``a`` (median of all ``b_j - a_i``),
    its Mann–Whitney interval and the two-sided p-value.

    Returns ``(estimate, (lo, hi) or None, p)``; the interval is ``None`` when the sets are
    too small to give one at ``confidence`` (4 and 4 runs are the fewest at 95%).
    """
    m, n = len(a), len(b)
    if not m or not n:
        raise ValueError("both sets need values")
    diffs = sorted(y - x for x in a for y in b)
    est = statistics.median(diffs)
    alpha = 1 - confidence
    exact = m * n <= 400
    if exact:
        counts = _mann_whitney_counts(m, n)
        k = _lower_tail_index(counts, alpha)
    else:
        k = _normal_k(len(diffs), m * n / 2, m * n * (m + n + 1) / 12, alpha)
    ci = (diffs[k - 1], diffs[len(diffs) - k]) if k >= 1 else None
    # U = number of pairs with b > a (ties count half).
    u = sum(1.0 if y > x else 0.5 if y == x else 0.0 for x in a for y in b)
    if exact and u == int(u):
        counts = _mann_whitney_counts(m, n)
        total = sum(counts)
        ui = int(u)
        lo = sum(counts[: min(ui, m * n - ui) + 1])
        p = min(1.0, 2 * lo / total)
    else:
        z = (abs(u - m * n / 2) - 0.5) / math.sqrt(m * n * (m + n + 1) / 12)
        p = min(1.0, 2 * (1 - statistics.NormalDist().cdf(max(z, 0.0))))
    return est, ci, p


# --------------------------------------------------------------------------- helpers


def robust_sd(values: Sequence[float]) -> float:
    """Normal-consistent spread of ``values``: 1.4826 · MAD, or the sample SD when the MAD
    is zero (fewer than half the values differ); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    mad = 1.4826 * statistics.median(abs(v - med) for v in values)
    return mad if mad > 0 else statistics.stdev(values)


def outlier_indices(values: Sequence[float], center: float | None = None) -> list[int]:
    """Indices of values more than :data:`OUTLIER_SDS` robust SDs from ``center``, the SD
    being 1.4826 · the median absolute distance from ``center`` (default: the median);
    needs 4+ values and a non-zero spread.

    The paired analysis passes ``center=0``: the rule then depends on ``|d|`` only, which
    the signed-rank test conditions on, so leaving outliers out keeps the test exact under
    no change."""
    if len(values) < 4:
        return []
    c = statistics.median(values) if center is None else center
    mad = 1.4826 * statistics.median(abs(v - c) for v in values)
    if mad <= 0:
        return []
    return [i for i, v in enumerate(values) if abs(v - c) > OUTLIER_SDS * mad]


def detectable_change(
    spread: float, n: int, *, confidence: float = DEFAULT_CONFIDENCE, power: float = 0.8
) -> float | None:
    """The smallest change (a log-ratio, ≈ a fraction) that ``n`` blocks with within-block
    SD ``spread`` of the log ratio detect with probability ``power`` at ``confidence``:
    ``(t_{1-α/2,n-1} + t_{power,n-1}) · spread / √n``, widened by ``√(π/3)`` for the
    signed-rank test's efficiency at small n (about 0.95 asymptotically: conservative).
    ``None`` when ``n`` blocks cannot detect any change (``n < MIN_BLOCKS`` at 95%)."""
    alpha = 1 - confidence
    if n < 2 or _lower_tail_index(_signed_rank_counts(min(n, _EXACT_MAX)), alpha) < 1:
        return None
    t = t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)
    return t * spread / math.sqrt(n) * math.sqrt(math.pi / 3)


def blocks_needed(
    spread: float,
    precision: float,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    power: float | None = None,
    max_blocks: int = 1000,
) -> int:
    """Blocks needed at within-block log-ratio SD ``spread``, for one of two goals.

    Without ``power``: the interval half-width of the ratio reaches ``precision`` (a
    fraction: 0.05 = ±5%): the smallest ``n ≥ MIN_BLOCKS`` with
    ``t_{1-α/2,n-1} · spread · √(π/3) / √n ≤ log(1 + precision)``.

    With ``power`` (0.8): a change of ``precision`` is *detected* with that probability:
    the smallest ``n`` whose :func:`detectable_change` is at most ``log(1 + precision)``
    (the inverse of that function, so ``detectable_change(s, blocks_needed(s, c,
    power=0.8)) ≤ log1p(c)``).

    Capped at ``max_blocks``. Unpaired run sets read ``n`` as runs a side (``spread``
    then being the SD of a log ratio between two independent runs)."""
    if precision <= 0:
        raise ValueError(f"precision must be positive, got {precision}")
    if power is not None and not 0.5 < power < 1.0:
        raise ValueError(f"power must be between 0.5 and 1, got {power}")
    goal = math.log1p(precision)
    alpha = 1 - confidence

    def enough(n: int) -> bool:
        if power is not None:
            det = detectable_change(spread, n, confidence=confidence, power=power)
            return det is not None and det <= goal
        half = t_quantile(1 - alpha / 2, n - 1) * spread * math.sqrt(math.pi / 3) / math.sqrt(n)
        return half <= goal

    # Both goals shrink monotonically with n: bisect (a few quantiles, not one per n).
    lo, hi = MIN_BLOCKS, max(MIN_BLOCKS, max_blocks)
    if not enough(hi):
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return lo


#: Efficiency of the MAD-based SD relative to the sample SD under normal noise (Var of
#: 1.4826·MAD ≈ 1.36 σ²/n against σ²/2n): it carries about this share of the degrees of
#: freedom.
MAD_EFFICIENCY = 0.37


def _chi2_cdf(x: float, k: float) -> float:
    """P(χ²_k ≤ x): the regularized lower incomplete gamma ``P(k/2, x/2)`` by its series
    (``k`` may be fractional)."""
    if x <= 0:
        return 0.0
    a, y = k / 2, x / 2
    term = total = 1.0 / a
    n = 1
    while abs(term) > 1e-15 * abs(total) and n < 10_000:
        term *= y / (a + n)
        total += term
        n += 1
    return min(1.0, math.exp(a * math.log(y) - y - math.lgamma(a)) * total)


def _chi2_quantile(p: float, k: float) -> float:
    """The ``p`` quantile of chi-square with ``k`` (possibly fractional) degrees of freedom,
    by bisection on :func:`_chi2_cdf`."""
    lo, hi = 0.0, k + 10.0 * math.sqrt(2 * k) + 20.0
    while _chi2_cdf(hi, k) < p:
        hi *= 2
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _chi2_cdf(mid, k) < p else (lo, mid)
    return 0.5 * (lo + hi)


def spread_interval(
    d: Sequence[float], confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, float] | None:
    """A ``confidence`` interval of the true spread behind :func:`robust_sd` of the
    within-block log ratios ``d``: the scaled-chi interval ``s · √(k / χ²_{1-α/2,k})`` to
    ``s · √(k / χ²_{α/2,k})`` with ``k = MAD_EFFICIENCY · (n − 1)`` degrees of freedom (the
    MAD's share of them). It assumes roughly normal ``d`` (outlier blocks left out first);
    simulated coverage at nominal 95% is 99% at 4–6 blocks, 98% at 8, 97% at 16 and
    95% at 40. ``None`` for fewer than 3 values or no spread."""
    if len(d) < 3:
        return None
    s = robust_sd(d)
    if s <= 0:
        return None
    k = MAD_EFFICIENCY * (len(d) - 1)
    alpha = 1 - confidence
    lo = s * math.sqrt(k / _chi2_quantile(1 - alpha / 2, k))
    hi = s * math.sqrt(k / _chi2_quantile(alpha / 2, k))
    return lo, hi


def benjamini_hochberg(p_values: Sequence[float], rate: float) -> list[bool]:
    """Benjamini–Hochberg step-up rejections at false discovery rate ``rate``, in input
    order (under the global null this is also family-wise control at ``rate``)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    top = -1
    for rank, i in enumerate(order):
        if p_values[i] <= rate * (rank + 1) / m:
            top = rank
    out = [False] * m
    for rank in range(top + 1):
        out[order[rank]] = True
    return out


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down rejections at family-wise level ``alpha``, in input order."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    out = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] <= alpha / (m - rank):
            out[i] = True
        else:
            break
    return out


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class SetChange:
    """How one metric moved from the baseline arm to a candidate arm: the one record of a
    judged change in perfscope.

    Attributes:
        ratio: candidate / baseline (``exp`` of the Hodges–Lehmann log-ratio estimate; for
            metrics that can be zero, ``1 +`` the estimate of the difference relative to
            the baseline median); ``None`` when not computable.
        ci: ``(lo, hi)`` interval of ``ratio`` at ``ci_level``, the level the verdict is
            tested at (so the interval excludes 1 exactly when the test can call a change);
            ``None`` when too few blocks (runs) give one at that level.
        noise: half-width of the interval at ``confidence`` (uncorrected, 95% by default)
            as a fraction (0.05 = ±5%): a measure of the run-to-run noise, not of the
            verdict; ``None`` without one.
        verdict: :data:`BETTER`, :data:`WORSE`, :data:`NO_CHANGE`, or ``n/a`` (a value is
            missing).
        n: values in the baseline and candidate arms (blocks used, for a paired design).
        method: how the interval was made, in words.
        p: two-sided p-value of "no change" before correction (``None`` when untested).
        detectable: the smallest change (fraction) this experiment detects with 80%
            probability at the observed noise; ``None`` when it cannot detect any.
        spread: run-to-run spread (robust SD of the within-block log ratios, or of the
            per-run logs unpaired), a fraction; ``None`` when unknown.
        outliers: run ids (or block labels) whose values are wild, named not averaged.
        paired: whether the values were paired by block.
        primary: whether this is the experiment's primary metric.
        metric: the metric's name (``""`` when judged alone).
        alpha: the level the verdict was tested at after correction.
        before, after: the arms' medians (SI units); ``None`` when missing.
        tolerance: relative change allowed before a significant change counts (a gate's
            practical threshold; 0 = any significant change counts).
        contended: contended runs among those judged.
        ci_level: confidence of ``ci`` (0.96: a 96% interval); ``None`` in records made
            before 2026-12-02, whose ``ci`` is the uncorrected 95% interval.
        corrected_out: the interval excludes 1 but the false-discovery correction over the
            secondary metrics did not reject, so the verdict is no detectable change.
    """

    ratio: float | None
    ci: tuple[float, float] | None
    noise: float | None
    verdict: str
    n: tuple[int, int]
    method: str
    p: float | None = None
    detectable: float | None = None
    spread: float | None = None
    outliers: tuple[str, ...] = ()
    paired: bool = False
    primary: bool = False
    metric: str = ""
    alpha: float | None = None
    before: float | None = None
    after: float | None = None
    tolerance: float = 0.0
    contended: int = 0
    ci_level: float | None = None
    corrected_out: bool = False

    @property
    def regressed(self) -> bool:
        """The metric got worse (beyond the noise and the tolerance)."""
        return self.verdict == WORSE

    @property
    def change(self) -> float | None:
        """Relative change of the estimate, ``ratio - 1`` (0.3 = 30% higher)."""
        return None if self.ratio is None else self.ratio - 1.0

    @property
    def significant(self) -> bool | None:
        """True for better/worse, False for no detectable change, None when n/a."""
        if self.verdict in (BETTER, WORSE):
            return True
        if self.verdict == NO_CHANGE:
            return False
        return None

    @property
    def verdict_level(self) -> float | None:
        """The confidence the verdict is tested at (``1 - alpha``); ``None`` when unknown."""
        return None if self.alpha is None else 1.0 - self.alpha

    def interval_text(self, digits: int = 3) -> str:
        """The interval as a table cell that names its level: ``[0.912, 0.981] at 96%``;
        or why there is none (``n/a (too few runs)``, ``none at 99%: 6 blocks are too few,
        8+ needed``). An older record's uncorrected interval says so."""
        if self.ratio is None:
            return "n/a (a value is missing)"
        level = self.verdict_level
        if self.ci is None:
            return self._too_few_text() or "n/a (too few runs)"
        lo, hi = self.ci
        cell = f"[{lo:.{digits}f}, {hi:.{digits}f}]"
        if self.ci_level is not None:
            cell += f" at {level_text(self.ci_level)}"
            if self.corrected_out:
                cell += " (not significant after the false-discovery correction)"
            return cell
        # An older record: its interval is the uncorrected 95% one.
        if level is None or abs(level - DEFAULT_CONFIDENCE) < 1e-9:
            held = (
                not self.primary
                and self.tolerance == 0.0
                and self.verdict == NO_CHANGE
                and not lo <= 1.0 <= hi
            )
            note = " (not significant after the false-discovery correction)" if held else ""
            return f"{cell} at {level_text(DEFAULT_CONFIDENCE)}{note}"
        short = self._too_few_text()
        if short:
            return f"{short}; uncorrected 95%: {cell}"
        return f"{cell} at 95% uncorrected (older record; verdict at {level_text(level)})"

    def _too_few_text(self) -> str:
        """``none at 99%: 6 blocks are too few, 8+ needed`` when the experiment has fewer
        blocks (runs a side) than any interval at the verdict's level needs; ``""`` when it
        has enough, or has fewer than 2."""
        level = self.verdict_level
        have = min(self.n) if self.n else 0
        need = None if level is None else fewest_for_interval(level, paired=self.paired)
        if level is None or need is None or not 2 <= have < need:
            return ""
        unit = "blocks" if self.paired else "runs a side"
        return f"none at {level_text(level)}: {have} {unit} are too few, {need}+ needed"

    def detectable_text(self) -> str:
        """``changes under ±7% are not detectable at this noise`` (or why none is)."""
        if self.detectable is None:
            need = MIN_BLOCKS if self.paired else 4
            unit = "blocks" if self.paired else "runs a side"
            return (
                f"no change is detectable with {min(self.n)} {unit} (need {need}+ at 95% "
                "without assuming normal noise)"
            )
        return f"changes under ±{100 * self.detectable:.0f}% are not detectable at this noise"

    def needs(self, change: float, *, power: float = 0.8) -> int | None:
        """Blocks (paired) or runs a side (unpaired) this experiment's noise needs to detect
        a change of ``change`` (a fraction: 0.1 = 10%) with probability ``power`` at its
        level (:func:`blocks_needed`); ``None`` when the noise is unknown."""
        if self.spread is None or change <= 0:
            return None
        level = self.alpha if self.alpha is not None else 1 - DEFAULT_CONFIDENCE
        return blocks_needed(self.spread, change, confidence=1 - level, power=power)

    def needs_text(self, change: float | None, *, power: float = 0.8) -> str:
        """What a "no detectable change" can and cannot claim: the smallest detectable
        change and, for a named ``change`` of interest, how many blocks (runs a side) would
        detect it (``""`` for a better/worse verdict, which needs no such notice)."""
        if self.verdict != NO_CHANGE:
            return ""
        text = self.detectable_text()
        unit = "blocks" if self.paired else "runs a side"
        have = min(self.n) if self.n else 0
        if change is None or change <= 0:
            return text
        if self.detectable is not None and self.detectable <= math.log1p(change):
            return f"{text}; a ±{100 * change:g}% change would have been seen ({have} {unit})"
        need = self.needs(change, power=power)
        if need is None:
            return (
                f"{text}; run-to-run noise unknown: repeat runs ({MIN_BLOCKS}+ {unit}) to "
                f"say how many detect ±{100 * change:g}%"
            )
        more = f"{need}+" if need >= 1000 else str(need)
        return (
            f"{text}; detecting ±{100 * change:g}% needs about {more} {unit} at this noise "
            f"(this experiment: {have}); no claim that it is absent"
        )


def level_text(level: float) -> str:
    """A confidence as a percentage to three figures: ``0.96`` → ``96%``, ``0.992`` →
    ``99.2%``."""
    return f"{100 * level:.3g}%"


@cache
def fewest_for_interval(level: float, *, paired: bool, most: int = 60) -> int | None:
    """Fewest blocks (paired) or runs a side (unpaired) that give any interval at
    ``level``: the exact signed-rank or Mann–Whitney null cannot reach a smaller two-sided
    tail with fewer. ``None`` beyond ``most``."""
    for n in range(2, most + 1):
        xs = [float(i) for i in range(1, n + 1)]
        iv = (
            signed_rank_interval(xs, level)[1]
            if paired
            else mann_whitney_interval(xs, [x + 0.5 for x in xs], level)[1]
        )
        if iv is not None:
            return n
    return None


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _direction(lo: float, better: str | None) -> str:
    """Verdict of a significant change whose interval lies above 1 (``lo > 1``) or below."""
    up = lo > 1.0
    if better not in ("lower", "higher"):
        return WORSE if up else BETTER  # no direction known: treat higher as worse
    return BETTER if up == (better == "higher") else WORSE


def judge_metric(
    baseline: Sequence[float | None],
    candidate: Sequence[float | None],
    better: str | None,
    *,
    paired: bool = False,
    confidence: float = DEFAULT_CONFIDENCE,
    alpha: float | None = None,
    ids: Sequence[str] | None = None,
    metric: str = "",
    primary: bool = False,
) -> SetChange:
    """Judge one metric between two arms from their per-run values.

    Args:
        baseline, candidate: one value per run (SI units); with ``paired`` the i-th values
            share block i (blocks where either is missing are dropped).
        better: ``lower`` or ``higher``.
        paired: analyse within-block log ratios (signed-rank) instead of two samples
            (Mann–Whitney).
        confidence: confidence of the reported interval.
        alpha: the level the verdict is tested at (default ``1 - confidence``): the
            correction for multiplicity lowers it.
        ids: a label per block (paired) or per run (``baseline`` then ``candidate``) to
            name outliers by.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    level = (1 - confidence) if alpha is None else alpha
    base = dict(metric=metric, primary=primary, paired=paired, alpha=level)
    if paired:
        if len(baseline) != len(candidate):
            raise ValueError("paired arms need one value per block on each side")
        pairs = [
            (i, float(x), float(y))
            for i, (x, y) in enumerate(zip(baseline, candidate, strict=True))
            if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
        ]
        a = [x for _, x, _ in pairs]
        b = [y for _, _, y in pairs]
        idx = [i for i, _, _ in pairs]
    else:
        a, b = _finite(baseline), _finite(candidate)
        idx = []
    n = (len(a), len(b))
    if not a or not b:
        return SetChange(None, None, None, "n/a", n, "a value is missing", **base)  # type: ignore[arg-type]
    logs = all(v > 0 for v in a + b)
    scale = statistics.median(a)
    if not logs and scale == 0:
        scale = statistics.median([abs(v) for v in a + b]) or 1.0

    def tx(v: float) -> float:
        return math.log(v) if logs else v / abs(scale)

    def back(x: float) -> float:
        return math.exp(x) if logs else 1.0 + x

    what = "log ratios" if logs else "differences relative to the baseline median"
    if paired:
        d = [tx(y) - tx(x) for x, y in zip(a, b, strict=True)]
        if len(d) < 2:
            est = d[0]
            return SetChange(
                back(est),
                None,
                None,
                NO_CHANGE,
                n,
                "one block: run-to-run noise unknown, ratio only",
                **base,  # type: ignore[arg-type]
            )
        bad = outlier_indices(d, center=0.0)
        names = tuple(
            (ids[idx[i]] if ids is not None and idx[i] < len(ids) else f"block {idx[i] + 1}")
            for i in bad
        )
        kept = [x for i, x in enumerate(d) if i not in bad]
        est, ci_d, _ = signed_rank_interval(kept, 1 - level)
        _, ci_r, p = signed_rank_interval(kept, confidence)
        spread = robust_sd(kept)
        how = f"Wilcoxon signed-rank interval of the within-block {what} ({len(kept)} blocks"
        how += f"; {len(bad)} outlier block(s) left out and named)" if bad else ")"
        det_n = len(kept)
        n_used = (len(kept), len(kept))
    else:
        la, lb = [tx(v) for v in a], [tx(v) for v in b]
        if len(a) < 2 or len(b) < 2:
            est = statistics.median(lb) - statistics.median(la)
            return SetChange(
                back(est),
                None,
                None,
                NO_CHANGE,
                n,
                "single run: run-to-run noise unknown, ratio only (repeat runs to test it)",
                **base,  # type: ignore[arg-type]
            )
        # Pooled, so the rule does not depend on which set a run is in (keeps the
        # Mann–Whitney null exact); a real shift widens the pooled spread instead.
        ra = list(la)
        run_ids = list(ids) if ids is not None else []
        bad = outlier_indices(la + lb)
        names = tuple(run_ids[i] if i < len(run_ids) else f"run {i + 1}" for i in bad)
        ka = [v for i, v in enumerate(la) if i not in bad]
        kb = [v for i, v in enumerate(lb) if i + len(ra) not in bad]
        if len(ka) >= 2 and len(kb) >= 2:
            la, lb = ka, kb
        else:
            bad = []
        est, ci_d, _ = mann_whitney_interval(la, lb, 1 - level)
        _, ci_r, p = mann_whitney_interval(la, lb, confidence)
        # The SD of one log ratio between two independent runs is √2 · the per-run SD.
        spread = robust_sd(
            [v - statistics.median(la) for v in la] + [v - statistics.median(lb) for v in lb]
        ) * math.sqrt(2)
        how = f"Mann–Whitney interval of the {what} between unpaired runs"
        how += f" ({len(bad)} outlier run(s) left out and named)" if bad else ""
        det_n = min(len(la), len(lb))
        n_used = (len(la), len(lb))
    det = (
        detectable_change(spread, det_n, confidence=1 - level)
        if paired
        else (
            detectable_change(spread, det_n, confidence=1 - level)
            if len(la) * len(lb) <= 400
            and _lower_tail_index(_mann_whitney_counts(len(la), len(lb)), level) >= 1
            else None
        )
    )
    ci = (back(ci_d[0]), back(ci_d[1])) if ci_d is not None else None
    noise = (
        (math.exp((ci_r[1] - ci_r[0]) / 2) - 1.0 if logs else (ci_r[1] - ci_r[0]) / 2)
        if ci_r
        else None
    )
    if ci_d is not None and not ci_d[0] <= 0.0 <= ci_d[1]:
        verdict = _direction(back(ci_d[0]) if ci_d[0] > 0 else back(ci_d[1]), better)
    else:
        verdict = NO_CHANGE
    return SetChange(
        back(est),
        ci,
        noise,
        verdict,
        n_used,
        how,
        p,
        det,
        spread,
        names,
        before=float(statistics.median(a)),
        after=float(statistics.median(b)),
        ci_level=1 - level,
        **base,  # type: ignore[arg-type]
    )


# --------------------------------------------------------------------------- experiments


@dataclass(frozen=True)
class PositionEffect:
    """Whether the run's place in its block moved the values (a drift or warm-up effect).

    Attributes:
        second_slower: estimated ratio of a metric's value when the candidate ran second
            over when it ran first, square-rooted (1.15: the second run of a block is
            about 15% higher); ``None`` when not estimable.
        p: two-sided Mann–Whitney p-value of "no position effect".
        present: ``p < 0.05``.
    """

    second_slower: float | None
    p: float | None
    present: bool


def position_effect(d: Sequence[float], candidate_second: Sequence[bool]) -> PositionEffect:
    """Test the within-block log ratios ``d`` for a position effect: blocks where the
    candidate ran second against blocks where it ran first. With a position effect ``δ``,
    the former read ``Δ + δ`` and the latter ``Δ - δ``; balanced order cancels ``δ`` in the
    estimate of ``Δ`` and this test reports it."""
    second = [x for x, s in zip(d, candidate_second, strict=True) if s]
    first = [x for x, s in zip(d, candidate_second, strict=True) if not s]
    if len(second) < 2 or len(first) < 2:
        return PositionEffect(None, None, False)
    est, _, p = mann_whitney_interval(first, second)
    return PositionEffect(math.exp(est / 2), p, p < 0.05)


@dataclass(frozen=True)
class Experiment:
    """A judged comparison of one candidate arm against the baseline arm.

    Attributes:
        primary: the primary metric's name (its verdict leads).
        changes: one record per metric, the primary first.
        confidence: confidence of the intervals.
        correction: how secondaries were corrected, in words.
        position: the position-effect test (paired designs).
        contended: ``(contended runs, all runs, largest share of others' CPU use or None)``.
        notes: what limits the conclusions.
    """

    primary: str
    changes: list[SetChange]
    confidence: float
    correction: str
    position: PositionEffect | None = None
    contended: tuple[int, int, float | None] = (0, 0, None)
    notes: list[str] = field(default_factory=list)

    @property
    def lead(self) -> SetChange:
        """The primary metric's change."""
        return self.changes[0]

    def headline(self, detect: float | None = None) -> str:
        """One line: the primary verdict with its ratio, interval and detectable change;
        for "no detectable change" with a change of interest ``detect`` (a fraction), how
        many blocks would detect it (:meth:`SetChange.needs_text`)."""
        c = self.lead
        if c.ratio is None:
            return f"{self.primary}: n/a ({c.method})"
        ci = f" [{c.ci[0]:.3f}, {c.ci[1]:.3f}]" if c.ci else ""
        limit = c.needs_text(detect) if c.verdict == NO_CHANGE else c.detectable_text()
        text = f"{self.primary}: {c.verdict} ({c.ratio:.3f}x{ci}); {limit}"
        k, total, share = self.contended
        if k:
            used = f"others used {share:.0%} of the CPU" if share is not None else "contended"
            text += f"; {k} of {total} runs contended ({used})"
        return text


def judge_experiment(
    metrics: Mapping[str, tuple[Sequence[float | None], Sequence[float | None], str | None]],
    primary: str,
    *,
    paired: bool = False,
    confidence: float = DEFAULT_CONFIDENCE,
    ids: Sequence[str] | None = None,
    candidate_second: Sequence[bool] | None = None,
    contended: tuple[int, int, float | None] = (0, 0, None),
) -> Experiment:
    """Judge every metric with the primary-first fallback correction.

    Args:
        metrics: name → (baseline values, candidate values, better direction).
        primary: the primary metric (must be in ``metrics``).
        paired, confidence, ids: see :func:`judge_metric`.
        candidate_second: per block, whether the candidate ran after the baseline (for the
            position-effect test of the primary metric).
        contended: contended runs, all runs, and the largest share of the CPU others used.
    """
    if primary not in metrics:
        raise ValueError(f"primary metric {primary!r} is not among the compared metrics")
    alpha = 1 - confidence
    a0, b0, better0 = metrics[primary]
    lead = judge_metric(
        a0,
        b0,
        better0,
        paired=paired,
        confidence=confidence,
        alpha=PRIMARY_SHARE * alpha,
        ids=ids,
        metric=primary,
        primary=True,
    )
    rest_alpha = alpha if lead.significant else (1 - PRIMARY_SHARE) * alpha
    raw = {
        name: judge_metric(
            a,
            b,
            better,
            paired=paired,
            confidence=confidence,
            alpha=rest_alpha,
            ids=ids,
            metric=name,
        )
        for name, (a, b, better) in metrics.items()
        if name != primary
    }
    tested = [k for k, c in raw.items() if c.p is not None]
    keep = benjamini_hochberg([raw[k].p or 1.0 for k in tested], rest_alpha)
    out = [lead]
    for name, c in raw.items():
        if c.p is None:
            out.append(c)
            continue
        ok = keep[tested.index(name)]
        # Changed only when BH rejects and the interval at that level excludes 1.
        verdict = c.verdict if ok else NO_CHANGE
        held = not ok and c.significant is True
        out.append(replace(c, verdict=verdict, alpha=rest_alpha, corrected_out=held))
    correction = (
        f"primary {primary} at α={PRIMARY_SHARE * alpha:.3g}; {len(tested)} secondary metrics "
        f"Benjamini–Hochberg at false discovery rate {rest_alpha:.3g}"
        + (
            " (primary changed: its α carried over)"
            if lead.significant
            else " (primary unchanged: family-wise false-alarm rate ≤ "
            f"{alpha:.3g} over all metrics)"
        )
    )
    position = None
    if paired and candidate_second is not None:
        pa, pb, _ = metrics[primary]
        d = []
        sec = []
        for x, y, s in zip(pa, pb, candidate_second, strict=True):
            if x is not None and y is not None and x > 0 and y > 0:
                d.append(math.log(y / x))
                sec.append(s)
        position = position_effect(d, sec)
    notes: list[str] = []
    if position is not None and position.present and position.second_slower is not None:
        notes.append(
            f"position effect: the second run of a block read {position.second_slower - 1:+.0%} "
            f"(p={position.p:.3f}); balanced order cancels it in the ratio"
        )
    if lead.outliers:
        notes.append(f"outlier runs (named, not averaged away): {', '.join(lead.outliers)}")
    k, total, share = contended
    if k:
        used = f"others used up to {share:.0%} of the CPU" if share is not None else "contended"
        notes.append(f"{k} of {total} runs were contended ({used}): timings likely inflated")
    return Experiment(primary, out, confidence, correction, position, contended, notes)
