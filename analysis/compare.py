"""Run comparison with between-run statistics: is a change bigger than run-to-run noise?

A comparison is made between *run sets*: the same configuration run one or more times. Each
metric (a latency percentile, a throughput, MFU...) is one number per run, read from the
runs' own summaries (never recomputed). Whether two sets differ is decided by
:mod:`perfscope.analysis.experiment`, the one rule perfscope uses everywhere:

- runs made together in blocks (``perfscope run --repeat N --vs ENGINE``, whose manifests
  record each run's block) are **paired by block**: the interval is the Wilcoxon
  signed-rank interval of the within-block log ratios;
- other run sets are compared **unpaired** (Mann–Whitney interval of the log ratios);
- one metric is **primary** (``primary=``; default :data:`DEFAULT_PRIMARY`) and leads;
  the others are Holm-corrected (``docs/experiments.md``);
- every verdict is ``better``, ``worse`` or ``no detectable change``, with the smallest
  change the experiment could detect.

Every compared run's CPU contention (other processes' share of the machine while it was
measured) travels with the result, and a comparison involving a contended run says so;
``exclude_contended`` drops contended runs (their blocks, when paired).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from perfscope.analysis._record import Record
from perfscope.analysis.catalogue import Metric, find_metric, metric, to_float, value_at
from perfscope.analysis.experiment import (
    NO_CHANGE,
    SetChange,
    judge_experiment,
    t_quantile,
)
from perfscope.analysis.metrics import itl_gaps, per_request
from perfscope.analysis.summary import Summary
from perfscope.jsontypes import JsonObject, json_float, json_object
from perfscope.units import Kind

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_PRIMARY",
    "ComparedMetric",
    "Comparison",
    "ComparisonPrimary",
    "MetricDef",
    "PositionCheck",
    "SetChange",
    "compare_run_sets",
    "compare_runs",
    "comparison_metrics",
    "contention_of",
    "latency_samples",
    "primary_metric",
    "t_quantile",
]

DEFAULT_CONFIDENCE = 0.95
#: The primary metric of a comparison when none is named (``--primary``), then the
#: fallbacks for runs that lack it (no decode steps: no TPOT).
DEFAULT_PRIMARY = ("tpot.p50", "e2e.p50", "output_tok_s")
#: Other processes' share of the machine's CPU above which a run counts as contended
#: (the same threshold as the run's own warning).
CONTENTION_SHARE = 0.15

#: A run's summary as the comparison reads it: the typed record or its summary.json object.
SummaryLike = Summary | Mapping[str, Any]


@dataclass(frozen=True)
class MetricDef:
    """One compared metric: a catalogue :class:`~perfscope.analysis.catalogue.Metric`.

    Attributes:
        key: dotted path in the summary (``latency.ttft.p99``).
        label: display name (from the catalogue).
        unit: the catalogue unit kind (``seconds``, ``rate``, ``ratio``, ...).
        better: ``lower`` or ``higher``.
        metric: the catalogue entry (name, format).
    """

    key: str
    label: str
    unit: Kind
    better: str
    metric: Metric | None = None


#: Compared metrics (catalogue names), in order; each is one number per run, judged between
#: the sets by :func:`perfscope.analysis.experiment.judge_metric`.
COMPARED = (
    *(f"{m}.p{p}" for m in ("ttft", "tpot", "itl", "e2e") for p in (50, 90, 99)),
    "output_tok_s",
    "total_tok_s",
    "req_s",
    "goodput_req_s",
    "attainment",
    "prefill.mfu",
    "prefill.mbu",
    "decode.mfu",
    "decode.mbu",
    "j_per_token",
)
#: Metrics that mean something only when the run set SLOs.
_SLO_JUDGED = ("goodput.goodput_req_s", "goodput.attainment")


def _has_slos(summary: SummaryLike) -> bool:
    return bool(value_at(summary, "goodput.slos"))


def comparison_metrics() -> list[MetricDef]:
    """The metrics ``perfscope compare`` shows, in order (names, units, directions from the
    catalogue)."""
    out: list[MetricDef] = []
    for name in COMPARED:
        m = metric(name)
        out.append(MetricDef(m.path, m.label, m.kind, m.better or "higher", m))
    return out


def latency_samples(
    requests: pd.DataFrame, chunks: pd.DataFrame, *, rows: pd.DataFrame | None = None
) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT, E2E, NTPOT and pooled ITL gaps (seconds) of the measured,
    completed requests (the same selection the summary's distributions use).

    Args:
        rows: the run's per-request rows (:func:`~perfscope.analysis.metrics.per_request`,
            or the dashboard's ``request_rows``) when the caller has them already; they are
            derived from ``requests`` otherwise.
    """
    keys = ("ttft", "tpot", "e2e", "ntpot", "itl")
    if requests.empty:
        return {k: np.empty(0) for k in keys}
    pr = per_request(requests) if rows is None else rows
    ok = pr[pr["ok"] & ~pr["is_warmup"]]
    out = {k: ok[k].to_numpy(dtype=float) for k in ("ttft", "tpot", "e2e", "ntpot")}
    gaps, _ = itl_gaps(chunks, ok["request_id"].to_numpy())
    out["itl"] = np.asarray(gaps, dtype=float)
    return {k: v[np.isfinite(v)] for k, v in out.items()}


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True, kw_only=True)
class ComparedMetric(Record):
    """One metric across the compared sets (index 0 is the baseline, which has ``None`` or
    ``[]`` in every against-the-baseline list).

    Attributes:
        key, label, unit, better: the catalogue's path, display name, unit kind and
            direction (``lower``/``higher``); ``primary``: the comparison's primary metric.
        values: each set's median (SI units); ``per_run``: each set's runs' values; ``n``:
            how many runs of each set have a value.
        ratios: set / baseline; ``ci``: its ``(lo, hi)`` interval at ``ci_level``, the level
            the verdict was tested at after the multiplicity correction; ``interval``: the
            cell text naming that level; ``noise``: the uncorrected 95% half-width
            (fraction); ``detectable``: the smallest change detected with 80% probability
            (fraction); ``needs``: the blocks (runs a side) a "no detectable change" would
            need for the change of interest; ``p``: the uncorrected p-value.
        outliers: run (block) ids whose values are wild; ``change``: ``better``, ``worse``
            or ``no detectable change``.
    """

    key: str = ""
    label: str = ""
    unit: Kind = "number"
    better: str = ""
    primary: bool = False
    values: tuple[float | None, ...] = ()
    per_run: tuple[tuple[float | None, ...], ...] = ()
    ratios: tuple[float | None, ...] = ()
    ci: tuple[tuple[float, float] | None, ...] = ()
    ci_level: tuple[float | None, ...] = ()
    interval: tuple[str | None, ...] = ()
    noise: tuple[float | None, ...] = ()
    detectable: tuple[float | None, ...] = ()
    needs: tuple[int | None, ...] = ()
    p: tuple[float | None, ...] = ()
    outliers: tuple[tuple[str, ...], ...] = ()
    change: tuple[str | None, ...] = ()
    n: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ComparisonPrimary(Record):
    """The primary metric: catalogue ``name``, summary ``key``, display ``label``, and
    whether it is the ``default`` (none was named)."""

    name: str = ""
    key: str = ""
    label: str = ""
    default: bool = False


@dataclass(frozen=True, kw_only=True)
class PositionCheck(Record):
    """A paired comparison's test of the run's place in its block
    (:class:`~perfscope.analysis.experiment.PositionEffect`): ``second_slower`` the ratio
    (second / first, square-rooted), ``p`` its p-value, ``present`` ``p < 0.05``."""

    second_slower: float | None = None
    p: float | None = None
    present: bool = False


@dataclass(frozen=True, kw_only=True)
class Comparison(Record):
    """The comparison of run sets against the first (the baseline); its JSON form is what
    ``perfscope compare --json`` prints.

    Attributes:
        baseline, labels: the sets' display names (the baseline first); ``runs``: each
            set's run ids.
        confidence: the family-wise level over all metrics (0-1); ``method``: how the
            intervals were made, in words; ``noise_known``: every set has two or more runs.
        primary: the primary metric; ``headlines``: its verdict against each set, in words;
            ``detect``: the change of interest (fraction) or ``None``.
        correction: per set, how the secondary metrics were corrected; ``paired``: per set,
            whether its runs were paired by block with the baseline's; ``position``: per
            set, the position-effect test (paired sets only).
        contention: per set, its contended runs (``run_id`` and the contention record).
        notes: what limits the conclusions; ``metrics``: the compared metrics, the primary
            first.
    """

    baseline: str = ""
    labels: tuple[str, ...] = ()
    runs: tuple[tuple[str, ...], ...] = ()
    confidence: float = DEFAULT_CONFIDENCE
    method: str = ""
    noise_known: bool = False
    primary: ComparisonPrimary = field(default_factory=ComparisonPrimary)
    headlines: tuple[str, ...] = ()
    detect: float | None = None
    correction: tuple[str, ...] = ()
    paired: tuple[bool, ...] = ()
    position: tuple[PositionCheck | None, ...] = ()
    contention: tuple[tuple[Mapping[str, Any], ...], ...] = ()
    notes: tuple[str, ...] = ()
    metrics: tuple[ComparedMetric, ...] = ()

    @property
    def primary_row(self) -> ComparedMetric:
        """The primary metric's row."""
        return next(m for m in self.metrics if m.primary)


# --------------------------------------------------------------------------- between runs


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _json_of(node: Any) -> Any:
    """A record's JSON object (a JSON value is returned as it is)."""
    return node.to_dict() if isinstance(node, Record) else node


def contention_of(summary: SummaryLike) -> JsonObject | None:
    """The run's CPU contention record (``summary["contention"]``, else rebuilt from its
    warnings), with ``contended`` set when others took more than :data:`CONTENTION_SHARE`
    of the machine or the hypervisor stole that much. ``None`` when not recorded."""
    record = value_at(summary, "contention")
    c = json_object(_json_of(record))
    if c is not None:
        out: JsonObject = dict(c)
        share, steal = json_float(out.get("others_share")), json_float(out.get("steal_share"))
        over = bool(
            (share is not None and share > CONTENTION_SHARE)
            or (steal is not None and steal > CONTENTION_SHARE)
        )
        if isinstance(record, Record):
            # A typed record always has ``contended`` (False when read from a summary that
            # lacked it): the shares decide as they do for such a summary's JSON object.
            out["contended"] = bool(out.get("contended")) or over
        elif "contended" not in out:
            out["contended"] = over
        return out
    warned = [w for w in value_at(summary, "warnings") or () if "CPU capacity" in str(w)]
    if warned:
        return {"contended": True, "note": str(warned[0])}
    return None


def _center(values: Sequence[float | None]) -> float | None:
    """A set's value: the median of its runs (robust to one wild run)."""
    xs = _finite(values)
    return float(statistics.median(xs)) if xs else None


def primary_metric(
    name: str | None, sets: Sequence[Sequence[SummaryLike]]
) -> tuple[MetricDef, bool]:
    """The comparison's primary metric and whether it is the default.

    ``name`` is a catalogue name (``tpot.p99``, ``output_tok_s``) or summary path; ``None``
    picks the first of :data:`DEFAULT_PRIMARY` that every set has.

    Raises:
        ValueError: ``name`` is not a compared metric (the message lists them).
    """
    defs = comparison_metrics()
    if name is not None:
        m = find_metric(name)
        key = m.path if m is not None else name
        for d in defs:
            if key in (d.key, d.metric.name if d.metric else None):
                return d, False
        raise ValueError(
            f"--primary {name!r} is not a compared metric; use one of " + ", ".join(COMPARED)
        )
    for cand in DEFAULT_PRIMARY:
        d = next(x for x in defs if x.metric is not None and x.metric.name == cand)
        if all(any(to_float(value_at(s, d.key)) is not None for s in g) for g in sets):
            return d, True
    return next(
        x for x in defs if x.metric is not None and x.metric.name == DEFAULT_PRIMARY[0]
    ), True


def _block_of(summary: SummaryLike) -> tuple[str, int, int | None] | None:
    """``(experiment id, block, position in block)`` of a run made in blocks, else None."""
    rs = _json_of(value_at(summary, "run_set"))
    if not isinstance(rs, Mapping) or rs.get("warmup"):
        return None
    exp = rs.get("experiment")
    block = rs.get("block", rs.get("index"))
    if not isinstance(block, int) or not rs.get("interleaved"):
        return None
    if not isinstance(exp, str):
        sid = str(rs.get("id") or "")
        exp = sid.rsplit("-", 1)[0] if "-" in sid else sid
    pos = rs.get("position")
    return exp, block, pos if isinstance(pos, int) else None


def _pairing(
    base: Sequence[SummaryLike], cand: Sequence[SummaryLike]
) -> list[tuple[int, int, bool | None]] | None:
    """Blocks shared by two sets as ``(baseline run, candidate run, candidate ran second)``,
    or None when the sets were not made in the same blocks."""
    ba = [_block_of(s) for s in base]
    bb = [_block_of(s) for s in cand]
    if any(x is None for x in ba + bb):
        return None
    if len({x[0] for x in ba + bb if x}) != 1:
        return None
    ia = {x[1]: i for i, x in enumerate(ba) if x}
    ib = {x[1]: i for i, x in enumerate(bb) if x}
    if len(ia) != len(ba) or len(ib) != len(bb):
        return None
    shared = sorted(set(ia) & set(ib))
    if len(shared) < 2:
        return None
    out = []
    for blk in shared:
        pa, pb = ba[ia[blk]], bb[ib[blk]]
        second = (
            None if pa is None or pb is None or pa[2] is None or pb[2] is None else pb[2] > pa[2]
        )
        out.append((ia[blk], ib[blk], second))
    return out


def compare_run_sets(
    labels: Sequence[str],
    sets: Sequence[Sequence[SummaryLike]],
    *,
    run_ids: Sequence[Sequence[str]] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    primary: str | None = None,
    exclude_contended: bool = False,
    detect: float | None = None,
) -> Comparison:
    """Compare run sets against the first one (the baseline).

    Args:
        labels: one display name per set.
        sets: per set, the summaries of its runs (one or more): typed, or summary.json
            objects.
        run_ids: per set, its runs' ids (default: each summary's ``run_id``).
        confidence: confidence of the intervals (0-1); the family-wise false-alarm rate
            over all metrics of one comparison is at most ``1 - confidence``.
        primary: the primary metric (catalogue name); default :data:`DEFAULT_PRIMARY`.
        exclude_contended: leave out contended runs (with their blocks when paired).
        detect: a change of interest (fraction, 0.1 = 10%): where the primary shows no
            detectable change, the headline says how many blocks (runs a side) would
            detect it, and each row's ``needs`` holds that count per set.

    Returns:
        The :class:`Comparison`. Each :class:`ComparedMetric` holds each set's median in
        ``values``; ``ratios``, ``ci``, ``noise``, ``detectable`` and ``change`` hold
        ``None`` for the baseline; ``change`` is ``better``, ``worse`` or ``no detectable
        change``. ``ci`` is at ``ci_level``, the level that row's verdict is tested at after
        the multiplicity correction (not ``confidence``, which is the family-wise level over
        all metrics); ``interval`` is its display text naming that level. The primary
        metric's row comes first.

    Raises:
        ValueError: fewer than two sets, an empty set, or an unknown primary metric.
    """
    if len(labels) != len(sets) or len(sets) < 2:
        raise ValueError("compare_run_sets needs two or more run sets with one label each")
    if any(len(s) == 0 for s in sets):
        raise ValueError("every run set needs at least one run")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    ids = (
        [list(x) for x in run_ids]
        if run_ids is not None
        else [[str(value_at(s, "run_id") or f"run {j}") for j, s in enumerate(g)] for g in sets]
    )
    lead_def, lead_default = primary_metric(primary, sets)
    contended = [[bool((contention_of(s) or {}).get("contended")) for s in g] for g in sets]
    shares = [[(contention_of(s) or {}).get("others_share") for s in g] for g in sets]
    # A run without SLOs counts every completed request as good (100% attainment): that
    # is no measurement, so its goodput and attainment are left out rather than compared.
    judged = [[_has_slos(s) for s in g] for g in sets]
    slo_less = sum(not j for g in judged for j in g)
    defs = [d for d in comparison_metrics()]
    defs.sort(key=lambda d: d.key != lead_def.key)
    per_run_all: dict[str, list[list[float | None]]] = {}
    for m in defs:
        per_run_all[m.key] = [
            [
                to_float(value_at(s, m.key)) if ok or m.key not in _SLO_JUDGED else None
                for s, ok in zip(g, js, strict=True)
            ]
            for g, js in zip(sets, judged, strict=True)
        ]
    present = [m for m in defs if not all(v is None for g in per_run_all[m.key] for v in g)]
    if lead_def.key not in {m.key for m in present}:
        raise ValueError(f"no run has the primary metric {lead_def.label} ({lead_def.key})")
    experiments = []
    paired_flags: list[bool] = []
    excluded = 0
    for i in range(1, len(sets)):
        pairing = _pairing(sets[0], sets[i])
        fam: dict[str, tuple[list[float | None], list[float | None], str | None]] = {}
        k_cont = sum(contended[0]) + sum(contended[i])
        total = len(sets[0]) + len(sets[i])
        share_vals = [x for x in shares[0] + shares[i] if isinstance(x, int | float)]
        top_share = max(share_vals) if share_vals and k_cont else None
        if pairing is not None:
            if exclude_contended:
                kept = [p for p in pairing if not (contended[0][p[0]] or contended[i][p[1]])]
                excluded += len(pairing) - len(kept)
                pairing = kept
            for m in present:
                pr = per_run_all[m.key]
                fam[m.key] = (
                    [pr[0][a] for a, _, _ in pairing],
                    [pr[i][b] for _, b, _ in pairing],
                    m.better,
                )
            block_ids = [f"{ids[0][a]}/{ids[i][b]}" for a, b, _ in pairing]
            second = [bool(s) for _, _, s in pairing]
            has_order = all(s is not None for _, _, s in pairing)
            exp = judge_experiment(
                fam,
                lead_def.key,
                paired=True,
                confidence=confidence,
                ids=block_ids,
                candidate_second=second if has_order else None,
                contended=(k_cont, total, top_share),
            )
        else:
            keep_a = [j for j in range(len(sets[0])) if not (exclude_contended and contended[0][j])]
            keep_b = [j for j in range(len(sets[i])) if not (exclude_contended and contended[i][j])]
            excluded += len(sets[0]) + len(sets[i]) - len(keep_a) - len(keep_b)
            for m in present:
                pr = per_run_all[m.key]
                fam[m.key] = ([pr[0][j] for j in keep_a], [pr[i][j] for j in keep_b], m.better)
            exp = judge_experiment(
                fam,
                lead_def.key,
                paired=False,
                confidence=confidence,
                ids=[ids[0][j] for j in keep_a] + [ids[i][j] for j in keep_b],
                contended=(k_cont, total, top_share),
            )
        experiments.append(exp)
        paired_flags.append(pairing is not None)
    by_key = [{c.metric: c for c in e.changes} for e in experiments]
    rows: list[ComparedMetric] = []
    for m in present:
        changes: list[SetChange | None] = [None, *(b.get(m.key) for b in by_key)]
        rest = changes[1:]
        rows.append(
            ComparedMetric(
                key=m.key,
                label=m.label,
                unit=m.unit,
                better=m.better,
                primary=m.key == lead_def.key,
                values=tuple(_center(g) for g in per_run_all[m.key]),
                per_run=tuple(tuple(g) for g in per_run_all[m.key]),
                ratios=(None, *(c.ratio if c else None for c in rest)),
                ci=(None, *(c.ci if c and c.ci else None for c in rest)),
                ci_level=(None, *(c.ci_level if c else None for c in rest)),
                interval=(None, *(c.interval_text() if c else None for c in rest)),
                noise=(None, *(c.noise if c else None for c in rest)),
                detectable=(None, *(c.detectable if c else None for c in rest)),
                needs=(
                    None,
                    *(
                        c.needs(detect) if c and detect and c.verdict == NO_CHANGE else None
                        for c in rest
                    ),
                ),
                p=(None, *(c.p if c else None for c in rest)),
                outliers=((), *(tuple(c.outliers) if c else () for c in rest)),
                change=(None, *(c.verdict if c else None for c in rest)),
                n=tuple(len(_finite(g)) for g in per_run_all[m.key]),
            )
        )
    contention: list[list[JsonObject]] = []
    for g, gid in zip(sets, ids, strict=True):
        hits = []
        for s, rid in zip(g, gid, strict=True):
            c = contention_of(s)
            if c and c.get("contended"):
                hits.append({"run_id": rid, **c})
        contention.append(hits)
    noise_known = all(len(g) >= 2 for g in sets)
    lead_name = lead_def.metric.name if lead_def.metric else lead_def.key
    notes: list[str] = [
        f"primary metric: {lead_def.label}"
        + (" (the default; --primary METRIC to choose)" if lead_default else "")
        + "; its verdict leads, the others are corrected for multiplicity"
    ]
    for lab, e in zip(labels[1:], experiments, strict=True):
        notes.extend(f"{lab}: {n}" if len(labels) > 2 else n for n in e.notes)
    if excluded:
        notes.append(f"--exclude-contended left out {excluded} contended runs")
    if slo_less:
        total = sum(len(g) for g in sets)
        notes.append(
            "goodput and SLO attainment: no SLOs set in "
            + ("any run" if slo_less == total else f"{slo_less} of {total} runs")
            + " (left out: without SLOs every completed request counts as good)"
        )
    if not noise_known:
        single = [lab for lab, g in zip(labels, sets, strict=True) if len(g) < 2]
        notes.append(
            f"run-to-run noise unknown ({', '.join(single)}: "
            f"{'a single run' if len(single) == 1 else 'single runs'}): ratios only, no "
            "better/worse claims; repeat each configuration (perfscope run --repeat N) and "
            "compare the run sets"
        )
    elif not all(paired_flags):
        notes.append(
            "runs not made in shared blocks are compared unpaired (weaker): "
            "perfscope run --repeat N --vs ENGINE runs both in balanced blocks"
        )
    for lab, hits in zip(labels, contention, strict=True):
        if hits:
            shown = [
                f"{h['run_id']} ({h['others_share']:.0%} of the CPU)"
                if isinstance(h.get("others_share"), float)
                else str(h["run_id"])
                for h in hits
            ]
            who = "" if [h["run_id"] for h in hits] == [lab] else f"{lab}: "
            notes.append(
                f"{who}other processes competed for the CPU during {', '.join(shown)}; "
                "its timings are likely inflated and the comparison is unreliable"
            )
    methods = sorted({e.lead.method.split(" (")[0] for e in experiments if e.lead.ci})
    return Comparison(
        baseline=labels[0],
        labels=tuple(labels),
        runs=tuple(tuple(g) for g in ids),
        confidence=confidence,
        method="; ".join(methods)
        or (
            "single runs: ratios only, run-to-run noise unknown"
            if not noise_known
            else "too few runs for an interval at this confidence"
        ),
        noise_known=noise_known,
        primary=ComparisonPrimary(
            name=lead_name, key=lead_def.key, label=lead_def.label, default=lead_default
        ),
        headlines=tuple(
            e.headline(detect).replace(lead_def.key, lead_def.label, 1) for e in experiments
        ),
        detect=detect,
        correction=tuple(e.correction for e in experiments),
        paired=tuple(paired_flags),
        position=tuple(
            None
            if e.position is None
            else PositionCheck(
                second_slower=e.position.second_slower,
                p=e.position.p,
                present=e.position.present,
            )
            for e in experiments
        ),
        contention=tuple(tuple(hits) for hits in contention),
        notes=tuple(notes),
        metrics=tuple(rows),
    )


def compare_runs(
    labels: Sequence[str],
    summaries: Sequence[SummaryLike],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Comparison:
    """Compare single runs against the first: ratios only, run-to-run noise unknown (a
    :func:`compare_run_sets` of one-run sets)."""
    return compare_run_sets(labels, [[s] for s in summaries], confidence=confidence)
