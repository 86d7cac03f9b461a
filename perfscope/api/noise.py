"""``perfscope noise ENGINE``: measure this machine's run-to-run noise for one engine and
workload, from A/A runs in balanced blocks, bounded in count and time.

:func:`measure_noise` runs the configuration as two identical arms, A and A', in blocks
ordered AB, BA, ... (:func:`perfscope.analysis.experiment.block_order`, seeded and recorded
in every run's manifest, so ``perfscope compare ID-A ID-B`` pairs them again), after
optional discarded warm-up runs. It stops after ``blocks`` blocks, or earlier when the next
block would overrun ``budget_s``. The noise of each metric
(:func:`perfscope.analysis.noise.metric_noise`) is stored as
``<runs dir>/noise/<stamp>-<label>.json`` (schema ``perfscope.noise/1``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.errors import UsageError

if TYPE_CHECKING:
    from perfscope.analysis.noise import NoiseRecord
    from perfscope.api.run import RunArgs
    from perfscope.api.runner import ProgressHook

__all__ = ["MIN_NOISE_BLOCKS", "NoiseOptions", "check_options", "measure_noise"]

#: Fewest A/A blocks that give a spread (and its interval); 8 or more are better.
MIN_NOISE_BLOCKS = 3


@dataclass(frozen=True)
class NoiseOptions:
    """How ``perfscope noise`` measures.

    Attributes:
        blocks: A/A blocks to run (each one run of A and one of A'), at least 3.
        budget_s: most wall seconds, warm-ups included (no block starts that would not
            end within it, judged from the blocks so far); ``None``: no limit.
        warmup: discarded warm-up runs before the first block.
        primary: the primary metric (catalogue name); default ``tpot.p50``, else
            ``e2e.p50``, else ``output_tok_s`` (the first every run has).
        at_blocks: blocks of the future comparison the detectable change is stated for.
        power: probability of detecting a change of the stated size (0.5-1).
        detect: the change of interest (fraction, 0.1 = 10%) the blocks needed are
            stated for.
        seed: seed of the block order (drawn and recorded when ``None``).
        confidence: confidence of the intervals.
    """

    blocks: int = 8
    budget_s: float | None = 600.0
    warmup: int = 1
    primary: str | None = None
    at_blocks: int = 8
    power: float = 0.8
    detect: float = 0.10
    seed: int | None = None
    confidence: float = 0.95


def check_options(opts: NoiseOptions) -> None:
    """Refuse bad options with a one-line :class:`~perfscope.errors.UsageError`."""
    from perfscope.analysis.catalogue import find_metric

    if opts.blocks < MIN_NOISE_BLOCKS:
        raise UsageError(
            f"--blocks {opts.blocks}: the noise needs at least {MIN_NOISE_BLOCKS} A/A blocks "
            "(8 or more give a usable interval)"
        )
    if opts.at_blocks < 1:
        raise UsageError(f"--at-blocks {opts.at_blocks}: give a positive number of blocks")
    if not 0.5 < opts.power < 1.0:
        raise UsageError(f"--power {opts.power}: give a probability between 0.5 and 1, e.g. 0.8")
    if not 0.0 < opts.detect < 1.0:
        raise UsageError(f"--detect {opts.detect}: give a change between 0% and 100%, e.g. 10%")
    if opts.budget_s is not None and opts.budget_s <= 0:
        raise UsageError("--budget must be positive, e.g. 5m")
    if opts.primary is not None and find_metric(opts.primary) is None:
        raise UsageError(f"--primary {opts.primary!r} is not a metric; e.g. tpot.p50, ttft.p99")


def measure_noise(
    args: RunArgs,
    opts: NoiseOptions,
    *,
    progress: ProgressHook | None = None,
    log: Callable[[str], None] | None = None,
) -> NoiseRecord:
    """Run A/A blocks of ``args`` and store and return the noise record.

    Every run is stored in the runs folder as any run is (named ``NAME-noise-a`` and
    ``NAME-noise-b``); ``log`` gets one line per run. Bad options are a
    :class:`~perfscope.errors.UsageError` before anything runs.
    """
    from perfscope.analysis.calibration import machine_of_summary
    from perfscope.analysis.catalogue import metric, to_float, value_at
    from perfscope.analysis.compare import DEFAULT_PRIMARY, contention_of
    from perfscope.analysis.experiment import block_order
    from perfscope.analysis.noise import NOISE_METRICS, NoiseRecord, metric_noise
    from perfscope.api.run import execute, plan
    from perfscope.profiler.store import default_runs_root, write_json_atomic

    check_options(opts)
    say = log or (lambda line: None)
    base = plan(args)  # checked before anything runs
    o = base.options
    label = o.name or o.engine.split(":", 1)[0]
    stamp = datetime.now(UTC)
    set_id = f"{stamp.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    seed = opts.seed if opts.seed is not None else secrets.randbits(31)
    order = block_order(2, opts.blocks, seed)
    arms = ("A", "B")
    common_labels = (f"{label} A", f"{label} A'")
    common: dict[str, object] = {
        "experiment": set_id,
        "seed": seed,
        "repeat": opts.blocks,
        "interleaved": True,
        "noise": True,
        "arms": list(common_labels),
    }
    started = time.monotonic()
    summaries: list[list[dict[str, object]]] = [[], []]
    run_ids: list[list[str]] = [[], []]
    failed = 0
    first_summary: dict[str, object] | None = None

    def one(run_set: dict[str, object], suffix: str, tag: str) -> dict[str, object]:
        nonlocal failed, first_summary
        run_plan = replace(base, options=replace(o, run_set=run_set, name=f"{label}{suffix}"))
        out = execute(run_plan, progress)
        if out.status != "complete":
            failed += 1
        summary: dict[str, object] = dict(out.summary.to_dict())
        if first_summary is None:
            first_summary = summary
        say(f"{tag}: {out.path.name} ({out.status})")
        return summary | {"_run_id": out.path.name}

    for w in range(opts.warmup):
        rs = {**common, "id": f"{set_id}-warmup", "label": label, "warmup": True}
        one(rs, "-noise-warmup", f"warm-up {w + 1}/{opts.warmup} (discarded)")
    stop = ""
    done = 0
    for block in range(opts.blocks):
        if opts.budget_s is not None:
            elapsed = time.monotonic() - started
            per_block = elapsed / block if block else 0.0
            if block and elapsed + per_block > opts.budget_s:
                stop = (
                    f"stopped by --budget {opts.budget_s:g}s after {block} of {opts.blocks} blocks"
                )
                break
        tag = "".join(arms[a] for a in order[block])
        for pos, a in enumerate(order[block]):
            rs = {
                **common,
                "id": f"{set_id}-{arms[a]}",
                "label": common_labels[a],
                "index": block,
                "block": block,
                "position": pos,
                "order": tag,
            }
            s = one(rs, f"-noise-{arms[a].lower()}", f"block {block + 1}/{opts.blocks} ({tag})")
            rid = str(s.pop("_run_id"))
            summaries[a].append(s)
            run_ids[a].append(rid)
        done = block + 1
    wall = time.monotonic() - started
    if stop:
        say(stop)
    # The primary: the first default every run has (as compare picks it), or the named one.
    names = list(NOISE_METRICS)
    if opts.primary is not None:
        primary = metric(opts.primary).name
    else:
        primary = next(
            (
                n
                for n in DEFAULT_PRIMARY
                if all(
                    to_float(value_at(s, metric(n).path)) is not None for g in summaries for s in g
                )
            ),
            DEFAULT_PRIMARY[0],
        )
    names = [primary, *(n for n in names if n != primary)]
    blocks_ids = [f"block {i + 1}" for i in range(done)]
    rows = []
    for n in names:
        m = metric(n)
        va = [to_float(value_at(s, m.path)) for s in summaries[0]]
        vb = [to_float(value_at(s, m.path)) for s in summaries[1]]
        if all(v is None for v in va + vb) and n != primary:
            continue
        rows.append(
            metric_noise(
                m,
                va,
                vb,
                at_blocks=opts.at_blocks,
                detect=opts.detect,
                power=opts.power,
                confidence=opts.confidence,
                block_ids=blocks_ids,
            )
        )
    contended = sum(bool((contention_of(s) or {}).get("contended")) for g in summaries for s in g)
    notes: list[str] = []
    if done < 8:
        notes.append(f"{done} A/A blocks: the spread's interval is wide; 8 or more are better")
    if contended:
        notes.append(
            f"{contended} of {2 * done} runs were contended (other processes took the CPU): "
            "this is the noise under that load"
        )
    if failed:
        notes.append(f"{failed} runs did not complete: their blocks are left out")
    lead = rows[0]
    if lead.aa.significant:
        notes.append(
            f"the A/A comparison itself reads {lead.aa.verdict} on {lead.label}: a drift or "
            "position effect larger than the noise (expected in 4% of measurements by chance)"
        )
    record = NoiseRecord(
        id=set_id,
        engine=o.engine,
        label=label,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        blocks=done,
        seed=seed,
        runs=run_ids,
        primary=primary,
        confidence=opts.confidence,
        alpha=lead.aa.alpha if lead.aa.alpha is not None else 1 - opts.confidence,
        power=opts.power,
        at_blocks=opts.at_blocks,
        detect=opts.detect,
        metrics=rows,
        wall_s=wall,
        stop=stop,
        contended=contended,
        failed=failed,
        notes=notes,
        machine=dict(machine_of_summary(first_summary)) if first_summary else {},
    )
    root = Path(args.runs_dir) if args.runs_dir is not None else default_runs_root()
    path = root / "noise" / f"{set_id}-{label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = replace(record, path=str(path))
    write_json_atomic(path, record.to_dict())
    return record
