"""``perfscope run --repeat N [--vs ENGINE]``: run sets for comparisons that know their noise.

With ``--vs`` the two configurations run in balanced blocks
(:func:`perfscope.analysis.experiment.block_order`: AB, BA, AB, ... from a seed), so a
position effect and slow drifts of the machine cancel; ``compare`` pairs the runs by
block. Every run records its place in the manifest (``run_set``: ``id``, ``label``,
``experiment``, ``block``, ``position``, ``order``, ``seed``, ``repeat``; ``warmup`` for a
discarded warm-up run). ``--precision 5%`` keeps adding blocks until the primary metric's
interval is within ±5% (at least ``--repeat`` blocks, at most ``--max-repeats``, within
``--budget``), printing the interval after every block. The method is in
``docs/experiments.md``.
"""

from __future__ import annotations

import json
import math
import secrets
import statistics
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from perfscope.analysis.summary import Summary
    from perfscope.api.run import RunArgs, RunPlan
    from perfscope.api.runner import ProgressHook, RunOutcome
    from perfscope.jsontypes import JsonObject

__all__ = ["RepeatOptions", "SetSummary", "run_repeated", "set_summary"]

#: Metrics a lone run set is summarised by (catalogue names), the primary's default first.
SUMMARY_METRICS = ("tpot.p50", "ttft.p50", "e2e.p50", "output_tok_s")


@dataclass(frozen=True)
class RepeatOptions:
    """How ``run --repeat`` lays out its runs.

    Attributes:
        repeat: blocks (runs per arm); with ``precision`` the fewest blocks.
        vs: the second engine (arm B), or ``None`` for a lone run set.
        warmup: discarded warm-up runs per arm before the first block.
        primary: the primary metric (catalogue name; default ``tpot.p50``).
        precision: target half-width of the primary interval (0.05 = ±5%), or ``None``.
        max_repeats: most blocks with ``precision``.
        budget_s: most wall seconds with ``precision`` (no block starts that would not end
            within it, judged from the blocks so far), or ``None``.
        exclude_contended: leave contended blocks out of the comparison and of the
            stopping rule.
        seed: seed of the block order (drawn and recorded when ``None``).
        confidence: confidence of the intervals.
        detect: a change of interest (fraction): a "no detectable change" says how many
            blocks would detect it.
    """

    repeat: int
    vs: str | None = None
    warmup: int = 0
    primary: str | None = None
    precision: float | None = None
    max_repeats: int = 20
    budget_s: float | None = None
    exclude_contended: bool = False
    seed: int | None = None
    confidence: float = 0.95
    detect: float | None = None


@dataclass(frozen=True)
class SetSummary:
    """One metric of a lone run set: median over the runs, robust spread (1.4826 · MAD of
    the log values, ≈ the run-to-run CV) and range, in SI units."""

    metric: str
    label: str
    median: float
    spread: float | None
    low: float
    high: float
    n: int


def set_summary(summaries: Sequence[Summary]) -> list[SetSummary]:
    """Median and spread of :data:`SUMMARY_METRICS` over a set's run summaries."""
    from perfscope.analysis.catalogue import metric, to_float, value_at
    from perfscope.analysis.experiment import robust_sd

    out = []
    for name in SUMMARY_METRICS:
        m = metric(name)
        vals = [v for s in summaries if (v := to_float(value_at(s, m.path))) is not None]
        if not vals:
            continue
        pos = [v for v in vals if v > 0]
        spread = robust_sd([math.log(v) for v in pos]) if len(pos) == len(vals) > 1 else None
        out.append(
            SetSummary(
                name,
                m.label,
                float(statistics.median(vals)),
                spread,
                min(vals),
                max(vals),
                len(vals),
            )
        )
    return out


def _label(engine: str, name: str | None) -> str:
    return name or engine


def _precision_of(interval: tuple[float, float] | None) -> float | None:
    """Half-width of a ratio interval as a fraction (``None`` without one)."""
    if interval is None or interval[0] <= 0:
        return None
    return math.exp((math.log(interval[1]) - math.log(interval[0])) / 2) - 1.0


def _lone_interval(values: list[float]) -> tuple[float, float] | None:
    """Signed-rank interval of a lone set's centre, as a ratio to its estimate."""
    from perfscope.analysis.experiment import signed_rank_interval

    pos = [math.log(v) for v in values if v > 0]
    if len(pos) < 2:
        return None
    est, ci, _ = signed_rank_interval(pos)
    return None if ci is None else (math.exp(ci[0] - est), math.exp(ci[1] - est))


def run_repeated(
    args: RunArgs,
    opts: RepeatOptions,
    hook: ProgressHook,
    console: Console,
    err: Console,
    *,
    as_json: bool = False,
    report: bool = False,
) -> int:
    """Run ``args`` as a run set (in balanced blocks with engine ``opts.vs``), then print
    the comparison (with ``vs``) or the set's summary; returns the exit code (1 if any
    run did not complete). Both configurations are planned (and so checked) before
    anything runs."""
    from perfscope.analysis.catalogue import find_metric
    from perfscope.analysis.experiment import MIN_BLOCKS, block_order
    from perfscope.api.run import execute, plan
    from perfscope.cli.report import write_run_report

    first = plan(args)
    o0 = first.options
    vs = opts.vs
    if vs is not None and vs == o0.engine:
        raise UsageError(f"--vs {vs!r} is the engine under test; give a different engine")
    if opts.primary is not None and find_metric(opts.primary) is None:
        raise UsageError(f"--primary {opts.primary!r} is not a metric; e.g. tpot.p50, ttft.p99")
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    set_id = f"{stamp}-{secrets.token_hex(2)}"
    seed = opts.seed if opts.seed is not None else secrets.randbits(31)
    configs: list[tuple[str, RunPlan]] = [("A", first)]
    if vs is not None:
        configs.append(("B", plan(replace(args, engine=vs))))
    labels = {
        "A": _label(o0.engine, o0.name),
        "B": _label(vs or "", f"{o0.name}-vs" if o0.name and vs else None),
    }
    adaptive = opts.precision is not None
    most = max(opts.repeat, opts.max_repeats) if adaptive else opts.repeat
    order = block_order(len(configs), most, seed)
    paths: dict[str, list[Path]] = {key: [] for key, _ in configs}
    summaries: dict[str, list[Summary]] = {key: [] for key, _ in configs}
    failed = 0
    total_runs = 0

    def one(key: str, base: RunPlan, run_set: JsonObject, suffix: str) -> RunOutcome:
        nonlocal failed, total_runs
        o = base.options
        name = o.name or o.engine.split(":", 1)[0]
        run_plan = replace(base, options=replace(o, run_set=run_set, name=f"{name}{suffix}"))
        outcome = execute(run_plan, hook)
        total_runs += 1
        if outcome.status != "complete":
            failed += 1
        if report:
            write_run_report(outcome.stored or outcome.path, err, summary=outcome.summary)
        return outcome

    common: JsonObject = {
        "experiment": set_id,
        "seed": seed,
        "repeat": opts.repeat,
        "interleaved": vs is not None,
        "arms": [labels[k] for k, _ in configs],
    }
    for key, base in configs:
        for w in range(opts.warmup):
            rs: JsonObject = {
                **common,
                "id": f"{set_id}-{key}-warmup",
                "label": labels[key],
                "warmup": True,
            }
            out = one(key, base, rs, f"-{key.lower()}-warmup" if vs else "-warmup")
            err.print(f"warm-up {w + 1}/{opts.warmup} {labels[key]}: {out.path.name} (discarded)")
    started = time.monotonic()
    stop_reason = ""
    block = 0
    while True:
        if not adaptive and block >= opts.repeat:
            break
        if adaptive:
            if block >= most:
                stop_reason = f"stopped at --max-repeats {most} blocks before reaching the target"
                break
            if opts.budget_s is not None and block:
                per_block = (time.monotonic() - started) / block
                if time.monotonic() - started + per_block > opts.budget_s:
                    stop_reason = (
                        f"stopped by --budget {opts.budget_s:g}s after {block} blocks, before "
                        "reaching the target"
                    )
                    break
        arms = order[block]
        tag = "".join(configs[a][0] for a in arms)
        for pos, a in enumerate(arms):
            key, base = configs[a]
            run_set: JsonObject = {
                **common,
                "id": f"{set_id}-{key}",
                "label": labels[key],
                "index": block,
                "block": block,
                "position": pos,
                "order": tag,
            }
            out = one(key, base, run_set, f"-{key.lower()}" if vs else "")
            paths[key].append(out.path)
            summaries[key].append(out.summary)
            warn = [w for w in out.summary.warnings if "CPU" in str(w)]
            err.print(
                f"block {block + 1} ({tag}) {labels[key]}: {out.path.name} ({out.status})"
                + (" [yellow]contended[/yellow]" if warn else "")
            )
        block += 1
        if adaptive and opts.precision is not None:
            half = _live_interval(opts, summaries, configs, labels, err)
            # Stop only after whole AB/BA pairs, so a position effect stays cancelled.
            enough = block >= max(opts.repeat, MIN_BLOCKS) and block % len(configs) == 0
            enough = enough or (len(configs) == 1 and block >= max(opts.repeat, MIN_BLOCKS))
            if enough and half is not None and half <= opts.precision:
                stop_reason = (
                    f"reached ±{100 * half:.1f}% (target ±{100 * opts.precision:g}%) "
                    f"after {block} blocks"
                )
                break
    if stop_reason:
        err.print(stop_reason)
    if vs is not None:
        from perfscope.cli.report import _load, _tables, config_diff_json, print_config_diff
        from perfscope.dashboard.compare import compare_sets, comparison_table, config_diff

        runs = [[_load(str(p), None) for p in paths[key]] for key, _ in configs]
        result = compare_sets(
            [[_tables(r) for r in g] for g in runs],
            [f"{labels[k]} ({block} runs)" for k, _ in configs],
            run_ids=[[r.run_id for r in g] for g in runs],
            confidence=opts.confidence,
            primary=opts.primary,
            exclude_contended=opts.exclude_contended,
            detect=opts.detect,
        )
        diff = config_diff([g[0].manifest or {} for g in runs])
        if as_json:
            payload: dict[str, object] = {
                **result.to_dict(),
                "experiment": {"id": set_id, "seed": seed, "blocks": block, "stop": stop_reason},
                "config_diff": config_diff_json(diff),
            }
            print(json.dumps(payload, indent=2))
        else:
            console.print(comparison_table(result))
            print_config_diff(result.labels, diff, console)
            console.print(
                f"order seed {seed}; compare again: perfscope compare {set_id}-A {set_id}-B"
            )
    else:
        rows = set_summary(summaries["A"])
        if as_json:
            print(
                json.dumps(
                    {
                        "run_set": f"{set_id}-A",
                        "runs": [str(p) for p in paths["A"]],
                        "summary": [r.__dict__ for r in rows],
                    }
                )
            )
        else:
            _print_set_summary(console, rows, f"{set_id}-A", block, labels["A"])
    if failed:
        err.print(f"[red]{failed} of {total_runs} runs did not complete[/red]")
        return 1
    return 0


def _print_set_summary(
    console: Console, rows: list[SetSummary], set_id: str, n: int, label: str
) -> None:
    from perfscope.analysis.catalogue import metric

    console.print(f"run set {set_id}: {n} runs of {label}")
    for r in rows:
        fmt = metric(r.metric).format
        spread = "n/a" if r.spread is None else f"±{100 * r.spread:.1f}% run to run"
        console.print(
            f"  {r.label}: median {fmt(r.median)} ({spread}; range {fmt(r.low)}–{fmt(r.high)})"
        )
    console.print(f"compare it with another set: perfscope compare {set_id} OTHER")


def _live_interval(
    opts: RepeatOptions,
    summaries: dict[str, list[Summary]],
    configs: list[tuple[str, RunPlan]],
    labels: dict[str, str],
    err: Console,
) -> float | None:
    """Print the primary metric's current interval; return its half-width (fraction)."""
    from perfscope.analysis.catalogue import metric, to_float, value_at
    from perfscope.analysis.compare import compare_run_sets

    if len(configs) == 1:
        name = opts.primary or "tpot.p50"
        vals = [
            v for s in summaries["A"] if (v := to_float(value_at(s, metric(name).path))) is not None
        ]
        ci = _lone_interval(vals)
        half = _precision_of(ci)
        shown = "no interval yet" if half is None else f"±{100 * half:.1f}%"
        err.print(f"  {name}: {len(vals)} runs, interval {shown}")
        return half
    if len(summaries["A"]) < 2:
        return None
    try:
        result = compare_run_sets(
            [labels["A"], labels["B"]],
            [summaries["A"], summaries["B"]],
            confidence=opts.confidence,
            primary=opts.primary,
            exclude_contended=opts.exclude_contended,
        )
    except ValueError:
        return None
    row = result.primary_row
    ci = row.ci[1]
    half = _precision_of(ci)
    target = f"target ±{100 * (opts.precision or 0):g}%"
    if half is None or ci is None:
        err.print(f"  {row.label}: ratio {row.ratios[1]:.3f}x, no interval yet ({target})")
    else:
        err.print(
            f"  {row.label}: ratio {row.ratios[1]:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}] "
            f"±{100 * half:.1f}% ({target})"
        )
    return half
