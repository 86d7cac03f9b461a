"""``perfscope sweep``: one run per offered rate (or concurrency), then the sweep summary
(throughput-latency curve, knee, ``max_goodput_rate``), through :func:`perfscope.sweep`.
The lengths, the ``openai:`` flags and :func:`perfscope.cli.options.run_args` come from the one
set of run options (:mod:`perfscope.cli.options`)."""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING, Any

from perfscope.cli._argtypes import (
    add_runs_dir,
    nonneg_int,
    positive_int,
    positive_number,
    request_count,
)
from perfscope.cli.options import add_length_options, add_openai_options, run_args
from perfscope.cli.safe import SafeConsole as Console

if TYPE_CHECKING:
    from perfscope.analysis.sweep import SweepSummary

__all__ = ["register"]


def _float_list(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got {text!r}") from None
    if not vals or any(not (v > 0 and math.isfinite(v)) for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive numbers like 1,2,4, got {text!r}")
    return vals


def _rates_arg(text: str) -> list[float] | str:
    if text.strip().lower() == "auto":
        return "auto"
    from perfscope.profiler.driver import MIN_RATE

    vals = _float_list(text)
    if min(vals) < MIN_RATE:
        raise argparse.ArgumentTypeError(
            f"the lowest rate is {MIN_RATE:.3g} requests/s (one a day), got {min(vals):g}"
        )
    return vals


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``perfscope sweep``."""
    p = subparsers.add_parser(
        "sweep",
        help="one run per offered rate or concurrency; curve, knee, max goodput rate",
        description=(
            "Run the workload at a series of request rates (open loop) or concurrencies "
            "(closed loop), one stored run per point, and summarise the throughput-latency "
            "curve: its knee and max_goodput_rate, the highest rate whose SLO attainment is "
            ">= 90%. --rates auto probes the server's saturation throughput first."
        ),
    )
    p.add_argument("engine", help="engine URI, e.g. openai:http://127.0.0.1:8000/v1")
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--rates",
        type=_rates_arg,
        default=None,
        metavar="R1,R2,..|auto",
        help="requests/s per point, or 'auto' (default): probe, then --points rates up to "
        "the saturation throughput",
    )
    load.add_argument(
        "--concurrencies",
        type=_float_list,
        default=None,
        metavar="C1,C2,..",
        help="closed-loop users per point",
    )
    p.add_argument("--points", type=int, default=6, help="points of an automatic sweep (default 6)")
    p.add_argument(
        "--probe-requests",
        type=int,
        default=None,
        help="requests of the saturation probe (default: --requests, at least 16)",
    )
    w = p.add_argument_group("workload (per point)")
    w.add_argument(
        "--requests",
        "--num-prompts",
        type=request_count,
        default=None,
        help="measured requests per point (default 32)",
    )
    add_length_options(w)
    w.add_argument(
        "--warmup", type=nonneg_int, default=0, help="warmup requests per point (default 0)"
    )
    w.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seeds lengths and arrivals (default 0); given, prompts repeat exactly (a server "
        "may then answer from its prefix cache); without it, each run's prompts are new",
    )
    w.add_argument(
        "--arrival",
        choices=("poisson", "constant", "gamma"),
        default="poisson",
        help="gaps between arrivals at each rate (default poisson)",
    )
    w.add_argument(
        "--burstiness",
        type=positive_number,
        default=1.0,
        help="gamma shape for --arrival gamma: <1 burstier, >1 smoother (default 1)",
    )
    o = p.add_argument_group("openai engine")
    add_openai_options(o)
    o.add_argument(
        "--engine-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine-specific option (repeatable; default: none)",
    )
    r = p.add_argument_group("reference engine (as perfscope run)")
    r.add_argument(
        "--model-preset",
        default=None,
        help="reference model shape: tiny, small (default), medium, 1b, 7b",
    )
    r.add_argument(
        "--batch-size",
        type=positive_int,
        default=8,
        help="most sequences decoded together (default 8)",
    )
    a = p.add_argument_group("analysis and output")
    a.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC=DURATION",
        help="SLOs for attainment and max_goodput_rate, e.g. --slo ttft=200ms --slo tpot=50ms",
    )
    a.add_argument(
        "--knee-metric",
        default="e2e_p50",
        choices=("e2e_p50", "e2e_p99", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99"),
        help="latency the knee is found on (default e2e_p50)",
    )
    add_runs_dir(a)
    a.add_argument("--name", default="sweep", help="name prefix of the point runs")
    a.add_argument("--json", action="store_true", help="print the sweep summary as JSON")
    p.set_defaults(handler=_cmd_sweep)


#: Requests per point below which the sweep warns that its tail percentiles are thin.
SMALL_SAMPLE = 100


def _cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    from perfscope.api.run import sweep_with

    err = Console(stderr=True)
    per_point = args.requests or 32
    if args.duration is None and per_point < SMALL_SAMPLE:
        err.print(
            f"[yellow]warning:[/] {per_point} requests per point: each point's p90 and p99 "
            f"rest on a handful of requests (a p99 needs about 100); use --requests "
            f"{SMALL_SAMPLE} or more for tail latencies",
            highlight=False,
        )
    result = sweep_with(
        run_args(args),
        rates=args.rates,
        concurrencies=(
            [int(c) for c in args.concurrencies] if args.concurrencies is not None else None
        ),
        points=args.points,
        probe_requests=args.probe_requests,
        knee_metric=args.knee_metric,
        name=args.name,
        log=err.print,
    )
    if args.json:
        print(json.dumps(result.summary.to_dict(), indent=2))
    else:
        console.print(sweep_table(result.summary))
    return 1 if result.failed else 0


#: Sweep table columns: (sweep point column, header); cells are formatted by the catalogue
#: metric the column reads (:data:`perfscope.analysis.sweep.POINT_METRICS`).
_SWEEP_COLUMNS = (
    ("req_s", "done req/s"),
    ("output_tok_s", "out tok/s"),
    ("ttft_p50", "TTFT p50"),
    ("ttft_p99", "TTFT p99"),
    ("tpot_p50", "TPOT p50"),
    ("e2e_p99", "E2E p99"),
    ("attainment", "SLO met"),
    ("failed", "failed"),
)


def sweep_table(summary: SweepSummary) -> Any:
    """The sweep as a terminal table (stacked per point when narrow), with the knee and max
    goodput rate in the caption; every number through the metric catalogue's formats."""
    from perfscope.analysis.catalogue import format_number, metric
    from perfscope.analysis.sweep import POINT_METRICS
    from perfscope.dashboard.terminal import FitTable

    kind = summary.kind
    knee = summary.knee
    cols = ("offered req/s" if kind == "rate" else "concurrency", *(h for _, h in _SWEEP_COLUMNS))
    t = FitTable(cols, title=f"sweep ({kind})", right=frozenset(cols))
    for p in summary.points:
        mark = " ◀ knee" if knee and p.offered == knee.point.offered else ""
        cells = [
            "no SLOs"
            if col == "attainment" and not summary.slos
            else ("n/a" if (v := p.column(col)) is None else metric(POINT_METRICS[col]).format(v))
            for col, _ in _SWEEP_COLUMNS
        ]
        t.add_row(f"{format_number(p.offered)}{mark}", *cells)
    key = "max_goodput_rate" if kind == "rate" else "max_goodput_concurrency"
    knee_txt = (
        f"knee at {format_number(knee.point.offered)} ({knee.metric})"
        if knee
        else "no knee in the range tested (latency did not climb)"
    )
    if summary.slos:
        good = summary.max_goodput
        good_txt = (
            f"{key} = {format_number(good)}"
            if good is not None
            else f"{key}: no point reached 90% attainment"
        )
    else:
        good_txt = f"{key}: give --slo to compute it"
    t.caption = f"{knee_txt}; {good_txt}; saved to {summary.path}"
    return t
