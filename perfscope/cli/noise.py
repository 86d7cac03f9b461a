"""``perfscope noise ENGINE [run options]``: this machine's run-to-run noise for one engine
and workload, from A/A runs in balanced blocks (docs/experiments.md, "Noise floor")."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from perfscope.cli._argtypes import nonneg_int, positive_int

if TYPE_CHECKING:
    from rich.console import Console

    from perfscope.analysis.noise import MetricNoise, NoiseRecord
    from perfscope.dashboard.terminal import FitTable

__all__ = ["noise_table", "register"]


def _power(text: str) -> float:
    try:
        v = float(text.strip().removesuffix("%")) / (100 if text.strip().endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability like 0.8, got {text!r}") from None
    if not 0.5 < v < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0.5 and 1 (e.g. 0.8), got {text}")
    return v


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``perfscope noise``."""
    from perfscope.cli import add_run_options
    from perfscope.cli.repeat import budget, precision

    p = subparsers.add_parser(
        "noise",
        help="measure this machine's run-to-run noise for an engine: the smallest change a "
        "comparison can detect, and the blocks a change needs",
        description="Run the configuration as two identical arms (A/A) in balanced blocks "
        "(AB, BA, ...), bounded by --blocks and --budget, and report each metric's "
        "run-to-run spread with its interval, the smallest change a comparison of "
        "--at-blocks blocks could detect (at --power, at the level 'perfscope compare' tests "
        "its primary metric at), and the blocks a --detect change needs. The runs are "
        "stored as usual; the result is stored under RUNS_DIR/noise/. Takes every "
        "'perfscope run' option for the engine and workload.",
    )
    add_run_options(p, experiments=False)
    n = p.add_argument_group("noise measurement (docs/experiments.md)")
    n.add_argument(
        "--blocks",
        type=positive_int,
        default=8,
        metavar="N",
        help="A/A blocks to run, each one run of A and one of A' (default 8, at least 3)",
    )
    n.add_argument(
        "--budget",
        type=budget,
        default=600.0,
        metavar="DURATION",
        help="most wall time, e.g. 5m (default 10m; no block starts that would overrun)",
    )
    n.add_argument(
        "--warmup-runs",
        type=nonneg_int,
        default=1,
        metavar="K",
        help="discarded warm-up runs before the first block (default 1)",
    )
    n.add_argument(
        "--primary",
        default=None,
        metavar="METRIC",
        help="the metric that leads (default tpot.p50, else e2e.p50, else output_tok_s)",
    )
    n.add_argument(
        "--at-blocks",
        type=positive_int,
        default=8,
        metavar="N",
        help="blocks of the comparison the detectable change is stated for (default 8)",
    )
    n.add_argument(
        "--power",
        type=_power,
        default=0.8,
        metavar="P",
        help="probability of detecting the stated change (default 0.8)",
    )
    n.add_argument(
        "--detect",
        type=precision,
        default=0.10,
        metavar="PCT",
        help="the change of interest the blocks needed are stated for (default 10%%)",
    )
    n.add_argument(
        "--order-seed",
        type=int,
        default=None,
        metavar="SEED",
        help="seed of the block order (default: drawn and recorded)",
    )
    p.set_defaults(handler=_cmd_noise)


def _cmd_noise(args: argparse.Namespace, console: Console) -> int:
    from perfscope.api.noise import NoiseOptions, check_options, measure_noise

    opts = NoiseOptions(
        blocks=args.blocks,
        budget_s=args.budget,
        warmup=args.warmup_runs,
        primary=args.primary,
        at_blocks=args.at_blocks,
        power=args.power,
        detect=args.detect,
        seed=args.order_seed,
    )
    check_options(opts)  # one line before anything heavy loads
    from perfscope.cli import infinite_rate_as_mode
    from perfscope.cli.options import run_args
    from perfscope.cli.progress import progress_hook
    from perfscope.cli.safe import SafeConsole

    err = SafeConsole(stderr=True)
    note = infinite_rate_as_mode(args)
    if note is not None:
        err.print(f"note: {note}", style="dim")
    record = measure_noise(
        run_args(args),
        opts,
        progress=progress_hook(err, args.no_progress),
        log=lambda line: err.print(line, markup=False, highlight=False),
    )
    if args.json:
        print(json.dumps(record.to_dict(), indent=2))
    else:
        print_noise(record, console)
    return 1 if record.failed else 0


def _pct(x: float | None) -> str:
    return "–" if x is None else f"±{100 * x:.1f}%"


def _spread_cell(m: MetricNoise) -> str:
    from perfscope.analysis.catalogue import metric

    if m.spread is None:
        return "unknown (too few blocks)"
    fmt = metric(m.metric).format
    ci = m.spread_ci
    rel = f"{_pct(m.spread)}" + ("" if ci is None else f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]%")
    absolute = m.absolute(m.spread)
    if absolute is None:
        return rel
    unit = f"±{fmt(absolute)}"
    if ci is not None:
        lo, hi = m.absolute(ci[0]), m.absolute(ci[1])
        unit += f" [{fmt(lo)}, {fmt(hi)}]"
    return f"{unit} ({rel})"


def noise_table(record: NoiseRecord) -> FitTable:
    """One row per metric: median, per-run spread, within-block spread with its interval
    (in the metric's unit and relative), the A/A ratio, the detectable change and blocks
    needed."""
    from perfscope.analysis.catalogue import metric
    from perfscope.dashboard.terminal import FitTable

    conf = f"{100 * record.confidence:g}%"
    det_col = f"detectable @{record.at_blocks} blocks"
    need_col = f"blocks for ±{100 * record.detect:g}%"
    cols = (
        "metric",
        "median",
        "run to run",
        f"within a block [{conf}]",
        "A/A ratio",
        det_col,
        need_col,
    )
    t = FitTable(
        cols,
        title=(
            f"run-to-run noise of {record.engine} on this machine: {record.blocks} A/A blocks "
            f"({2 * record.blocks} runs), {record.wall_s:.1f} s"
        ),
        right=frozenset(cols[1:]),
    )
    for m in record.metrics:
        fmt = metric(m.metric).format
        aa = m.aa
        ratio = "–" if aa.ratio is None else f"{aa.ratio:.3f}x"
        if aa.ci is not None:
            ratio += f" [{aa.ci[0]:.3f}, {aa.ci[1]:.3f}]"
        t.add_row(
            f"{m.label} (primary)" if m.metric == record.primary else m.label,
            "–" if m.median is None else fmt(m.median),
            _pct(m.run_spread),
            _spread_cell(m),
            ratio,
            "none" if m.detectable is None else f"±{100 * m.detectable:.1f}%",
            "–" if m.needs is None else (f"{m.needs}+" if m.needs >= 1000 else str(m.needs)),
        )
    return t


def headline(record: NoiseRecord) -> str:
    """One line: the primary's noise, its detectable change and the blocks a change needs."""
    m = record.lead
    if m.spread is None:
        return f"{m.label}: run-to-run noise unknown ({m.blocks} usable blocks)"
    pw = f"{100 * record.power:g}% power, α={record.alpha:.2g}"
    det = (
        f"a comparison of {record.at_blocks} blocks detects changes of "
        f"±{100 * m.detectable:.1f}% or more ({pw})"
        if m.detectable is not None
        else f"{record.at_blocks} blocks cannot detect any change ({pw})"
    )
    return (
        f"{m.label}: within-block noise {_spread_cell(m)}; {det}; detecting "
        f"±{100 * record.detect:g}% needs about {m.needs} blocks"
    )


def print_noise(record: NoiseRecord, console: Console) -> None:
    """The table, the headline, the notes and where the record and runs are."""
    console.print(noise_table(record))
    console.print(f"→ {headline(record)}")
    if record.stop:
        console.print(f"note: {record.stop}")
    for note in record.notes:
        console.print(f"note: {note}")
    console.print(f"noise record: {record.path}")
    console.print(f"the A/A runs, compared: perfscope compare {record.id}-A {record.id}-B")
