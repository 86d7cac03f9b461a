"""The repeat and experiment options of ``perfscope run`` (``--repeat``, ``--vs``,
``--precision``, ...), and their conversion to :class:`perfscope.api.repeat.RepeatOptions`."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from perfscope.cli._argtypes import nonneg_int, positive_int

if TYPE_CHECKING:
    from perfscope.api.repeat import RepeatOptions

__all__ = ["add_repeat_arguments", "budget", "precision", "repeat_options", "wants_repeats"]


def precision(text: str) -> float:
    """``5%`` or ``0.05`` → 0.05: a target half-width of the primary interval."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage like 5%, got {text!r}") from None
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0% and 100%, got {text}")
    return v


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*$")


def budget(text: str) -> float:
    """``90s``, ``10m``, ``1.5h`` (or plain seconds) → seconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a duration like 90s, 10m or 1h, got {text!r}")
    factor = {"s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[m.group(2)]
    v = float(m.group(1)) * factor
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return v


def add_repeat_arguments(r: argparse._ArgumentGroup) -> None:
    """Add the repeat/experiment options to ``perfscope run``'s argument group."""
    r.add_argument(
        "--repeat",
        type=positive_int,
        default=1,
        metavar="N",
        help="run N times as one run set (with --vs: N balanced blocks AB, BA, ...), so "
        "comparisons can measure run-to-run noise",
    )
    r.add_argument(
        "--vs",
        default=None,
        metavar="ENGINE",
        help="a second engine to compare with: the two run in balanced blocks (AB BA AB ...) "
        "and the paired comparison is printed at the end",
    )
    r.add_argument(
        "--warmup-runs",
        type=nonneg_int,
        default=0,
        metavar="K",
        help="discarded warm-up runs per arm before the first block (default 0)",
    )
    r.add_argument(
        "--primary",
        default=None,
        metavar="METRIC",
        help="the metric whose verdict leads (default tpot.p50, else e2e.p50)",
    )
    r.add_argument(
        "--precision",
        type=precision,
        default=None,
        metavar="PCT",
        help="keep adding blocks until the primary metric's 95%% interval is within ±PCT "
        "(e.g. 5%%); at least --repeat (6 or more) blocks",
    )
    r.add_argument(
        "--max-repeats",
        type=positive_int,
        default=20,
        metavar="N",
        help="most blocks with --precision (default 20)",
    )
    r.add_argument(
        "--budget",
        type=budget,
        default=None,
        metavar="DURATION",
        help="most wall time with --precision, e.g. 10m (no block starts that would overrun)",
    )
    r.add_argument(
        "--detect",
        type=precision,
        default=None,
        metavar="PCT",
        help="with --vs: a change of interest, e.g. 10%%; where the primary shows no "
        "detectable change, say how many blocks would detect one that large",
    )
    r.add_argument(
        "--exclude-contended",
        action="store_true",
        help="leave blocks measured while other processes took the CPU out of the comparison",
    )
    r.add_argument(
        "--order-seed",
        type=int,
        default=None,
        metavar="SEED",
        help="seed of the block order (default: drawn and printed)",
    )


def wants_repeats(args: argparse.Namespace) -> bool:
    """Whether the run is a run set (any repeat option given)."""
    return bool(args.repeat > 1 or args.vs or args.precision is not None or args.warmup_runs)


def repeat_options(args: argparse.Namespace) -> RepeatOptions:
    """The parsed options as :class:`~perfscope.api.repeat.RepeatOptions`."""
    from perfscope.api.repeat import RepeatOptions

    return RepeatOptions(
        repeat=args.repeat,
        vs=args.vs,
        warmup=args.warmup_runs,
        primary=args.primary,
        precision=args.precision,
        max_repeats=args.max_repeats,
        budget_s=args.budget,
        exclude_contended=args.exclude_contended,
        seed=args.order_seed,
        detect=args.detect,
    )
