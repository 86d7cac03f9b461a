"""``perfscope study KNOB --values V1,V2,...``: vary one knob, measured next to projected."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from perfscope.analysis.catalogue import find_metric, format_bytes, format_number
from perfscope.cli._argtypes import add_runs_dir
from perfscope.dashboard.terminal import FitTable
from perfscope.errors import PerfscopeError, UsageError

if TYPE_CHECKING:
    from perfscope.analysis.study import Study

__all__ = ["effects_table", "provisional_ceilings", "register", "study_table"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``perfscope study``."""
    from perfscope.api.study import APPLIES, KNOBS
    from perfscope.cli._argtypes import key_value, nonneg_int, positive_int
    from perfscope.cli.options import add_openai_options

    p = subparsers.add_parser(
        "study",
        help="vary one knob (batch-size, dtype, kv-heads, ...): measured vs projected effect",
        description=(
            "Run the workload once per value of one knob, everything else fixed, the "
            "settings interleaved (A B C A B C ...) --repeat times; report each setting's "
            "latency, throughput, goodput, roofline verdicts and memory, and the measured "
            "effect against the first value (with its between-run interval) next to the "
            "what-if projection of the same change and its error. Knobs by engine: "
            + "; ".join(
                f"{fam}: " + ", ".join(k for k in KNOBS if fam in APPLIES[k])
                for fam in ("reference", "hf", "openai", "python")
            )
        ),
    )
    p.add_argument("knob", help="a run flag name: " + ", ".join(KNOBS))
    p.add_argument(
        "--values", required=True, metavar="V1,V2,...", help="settings; first = baseline"
    )
    p.add_argument("--repeat", type=positive_int, default=3, help="runs per setting (3)")
    p.add_argument(
        "--precision",
        type=float,
        default=None,
        metavar="FRACTION",
        help="adaptive rounds: add rounds until every primary-metric interval is within "
        "±FRACTION (0.1 = ±10%%), from --repeat up to --max-repeats and --budget",
    )
    p.add_argument("--max-repeats", type=positive_int, default=20, help="most rounds (20)")
    p.add_argument(
        "--budget", type=float, default=None, metavar="SECONDS", help="most wall seconds"
    )
    p.add_argument("--engine", default="reference", help="engine URI (default reference)")
    w = p.add_argument_group("workload (fixed)")
    w.add_argument("--requests", type=positive_int, default=16, help="measured requests (16)")
    w.add_argument("--prompt-len", default="128", help="prompt tokens (128)")
    w.add_argument("--output-len", default="32", help="output tokens (32)")
    w.add_argument("--prompts", type=Path, default=None, help="JSONL prompts file")
    w.add_argument("--warmup", type=nonneg_int, default=2, help="warmup requests per run (2)")
    w.add_argument("--seed", type=int, default=0, help="seed of lengths, arrivals, weights (0)")
    w.add_argument("--mode", choices=("batch", "online"), default=None)
    w.add_argument("--rate", type=float, default=None, help="requests per second (online)")
    w.add_argument("--concurrency", type=positive_int, default=None, help="closed-loop users")
    w.add_argument("--arrival", choices=("poisson", "constant", "gamma"), default="poisson")
    w.add_argument("--burstiness", type=float, default=1.0)
    e = p.add_argument_group("engine (fixed)")
    e.add_argument("--batch-size", type=positive_int, default=8)
    e.add_argument("--scheduler", choices=("continuous", "static"), default="continuous")
    e.add_argument("--device", default=None)
    e.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
    e.add_argument("--model-preset", default=None, help="tiny, small (default), medium, ...")
    for flag, field in (
        ("--layers", "n_layers"),
        ("--hidden", "hidden_size"),
        ("--heads", "n_heads"),
        ("--kv-heads", "n_kv_heads"),
        ("--mlp", "intermediate_size"),
        ("--vocab", "vocab_size"),
    ):
        e.add_argument(flag, dest=f"shape_{field}", type=positive_int, default=None)
    e.add_argument("--engine-opt", type=key_value, action="append", default=[], metavar="KEY=VALUE")
    add_openai_options(p.add_argument_group("openai engine, datasets and duration"))
    a = p.add_argument_group("analysis and output")
    a.add_argument("--slo", action="append", default=[], metavar="METRIC=DURATION")
    a.add_argument("--hw", default=None, help="device to analyse against (default: detect)")
    a.add_argument("--no-telemetry", action="store_true", help="do not sample the hardware")
    add_runs_dir(a)
    a.add_argument("--name", default=None, help="name of the runs and the study file")
    a.add_argument("--json", action="store_true", help="print the study JSON")
    a.add_argument(
        "--quality",
        action="store_true",
        help="reference engine: top-1 agreement and perplexity of each setting's model against "
        "the first's (use with --engine-opt weights=trained)",
    )
    a.add_argument("-o", "--output", type=Path, default=None, help="write the study report HTML")
    a.add_argument(
        "--save",
        nargs="?",
        type=Path,
        const=Path("samples/studies/results"),
        default=None,
        metavar="DIR",
        help="also store the study where `perfscope advisor calibrate` reads it "
        "(default DIR: samples/studies/results)",
    )
    p.set_defaults(handler=_cmd_study)


def _cmd_study(args: argparse.Namespace, console: Console) -> int:
    from perfscope.api.study import _check_applies, _knob, _values, study_with
    from perfscope.cli.options import run_args

    knob = _knob(args.knob)  # one-line errors before anything runs
    _check_applies(knob, args.engine)
    _values(knob, args.values)
    base = run_args(args)
    if args.mode is None and args.rate is None and args.concurrency is None:
        base = replace(base, mode=None)
    say = (lambda line: None) if args.json else (lambda line: console.print(line))
    hook = None
    if args.quality:
        if base.engine != "reference":
            raise UsageError("--quality compares reference-engine models: use --engine reference")
        from perfscope.profiler.engines.reference.quality import reference_quality

        hook = reference_quality()
    result = study_with(
        base,
        args.knob,
        args.values,
        repeat=args.repeat,
        name=args.name,
        log=say,
        quality=hook,
        precision=args.precision,
        max_repeats=args.max_repeats,
        budget_s=args.budget,
    )
    if args.output is not None:
        from perfscope.dashboard.study_report import write_study_report

        write_study_report(result, args.output)
    from perfscope.api.study import save_study

    saved = save_study(result, args.save) if args.save is not None else None
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    console.print(study_table(result))
    console.print(effects_table(result))
    if any(st.quality for st in result.settings):
        console.print(quality_table(result))
    for note in result.notes:
        console.print(f"note: {note}")
    provisional = provisional_ceilings(result)
    if provisional is not None:
        console.print(f"⚠ {provisional}", style="bold yellow", markup=False, highlight=False)
    console.print(f"study: {result.path}")
    if saved is not None:
        console.print(f"saved: {saved} (rebuild the calibration: perfscope advisor calibrate)")
    if args.output is not None:
        console.print(f"report: {args.output}")
    return 0


def provisional_ceilings(study: Study) -> str | None:
    """The provisional-ceilings note of the study's runs (their CPU calibrated under
    contention), read from the first run's summary that has one: the phase verdicts and MFU
    above rest on those ceilings. ``None`` when no run's ceilings are provisional."""
    from perfscope.profiler.run_files import read_json_capped

    for setting in study.settings:
        for point in setting.runs:
            try:
                summary = read_json_capped(Path(point.run) / "summary.json")
            except (OSError, ValueError, PerfscopeError):  # moved or unreadable: says nothing
                continue
            roofline = summary.get("roofline") if isinstance(summary, dict) else None
            ceilings = (roofline or {}).get("ceilings") or {}
            if ceilings.get("provisional"):
                return str(ceilings["provisional"])
    return None


def _num(v: Any) -> str:
    return "–" if v is None else format_number(v, 4)


#: A study's metric names (:data:`perfscope.analysis.study.METRICS`) → the metric
#: catalogue's, whose label and display unit the tables use.
CATALOGUE_NAME = {
    "ttft_p50_s": "ttft.p50",
    "tpot_p50_s": "tpot.p50",
    "output_tok_s": "output_tok_s",
    "goodput_req_s": "goodput_req_s",
    "j_per_output_token": "j_per_token",
}


def _label(name: str) -> str:
    """The catalogue's label of a study metric (its own name when the catalogue has none)."""
    m = find_metric(CATALOGUE_NAME.get(name, name))
    return m.label if m is not None else name


def _value(name: str, v: Any) -> str:
    """A study metric's value in its catalogue unit (``1,108 tok/s``, ``99.6 ms``)."""
    m = find_metric(CATALOGUE_NAME.get(name, name))
    if v is None:
        return "–"
    return m.format(v) if m is not None else format_number(v, 4)


def study_table(study: Study) -> FitTable:
    """Per setting: latency, throughput, goodput, roofline verdicts, memory (stacked, one
    block per setting, when the terminal is too narrow); values in their catalogue units."""
    shown = ("ttft_p50_s", "tpot_p50_s", "output_tok_s", "goodput_req_s")
    labels = tuple(_label(n) for n in shown)
    cols = (study.knob, *labels, "phases", "memory")
    t = FitTable(
        cols,
        title=(
            f"study: {study.knob} ({study.repeat} run(s) per setting; baseline: median, "
            "others: baseline x the effect's paired ratio; phases: all runs)"
        ),
        right=frozenset((*labels, "memory")),
        wrap=frozenset(("phases",)),
    )
    from perfscope.dashboard.study_report import phase_summary

    for s in study.settings:
        ph = phase_summary(s)
        mem = s.memory.get("total_bytes")
        t.add_row(
            str(s.value),
            *(_value(n, study.estimate(s, n)) for n in shown),
            ph,
            "–" if mem is None else format_bytes(mem),
        )
    return t


def effects_table(study: Study) -> FitTable:
    """Measured ratio [interval] against the first setting, the projection, the speed-of-light
    ratio and the projection's error, per effect."""
    t = FitTable(
        (
            study.knob,
            "metric",
            "measured, interval",
            "detectable",
            "verdict",
            "projected",
            "SoL",
            "error",
        ),
        title=f"effect against {study.knob}={study.values[0]}: measured vs projected",
        right=frozenset(("measured, interval", "detectable", "projected", "SoL", "error")),
        hoist_constant=True,  # one run a setting: the same "noise unknown" in every row
    )
    from perfscope.analysis.study import detectable_cell
    from perfscope.dashboard.study_report import sol_ratio

    for s in study.settings[1:]:
        for e in s.effects:
            c = e.change
            if c.ratio is None:
                continue
            sol = sol_ratio(s, e.metric)
            t.add_row(
                str(s.value),
                _label(e.metric),
                f"{c.ratio:.3f}x {c.interval_text()}",
                detectable_cell(c, study.repeat),
                c.verdict,
                "–" if e.projected_ratio is None else f"{e.projected_ratio:.3f}x",
                "–" if sol is None else f"{sol:.3f}x",
                "–" if e.error is None else f"{100 * e.error:+.0f}%",
            )
    return t


def quality_table(study: Study) -> FitTable:
    """Per setting: top-1 agreement with the first setting's model and perplexities."""
    cols = (study.knob, "top-1 agreement", "perplexity", "baseline perplexity")
    t = FitTable(
        cols,
        title=f"quality against {study.knob}={study.values[0]} (held-out corpus)",
        right=frozenset(cols[1:]),
    )
    for s in study.settings:
        q = s.quality or {}
        t.add_row(
            str(s.value),
            _num(q.get("top1_agreement")),
            _num(q.get("candidate_perplexity")),
            _num(q.get("reference_perplexity")),
        )
    return t
