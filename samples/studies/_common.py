"""Shared driver of the study samples: run one ``perfscope.study`` and print its tables as
Markdown (the numbers in each write-up come from this output). Public names only."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from typing import Any

from perfscope.profiler.engines.threads import prefer_passive_wait

# As `perfscope` on the command line, before torch loads: OpenMP threads that wait sleep
# instead of spinning on the cores their partners need (docs/performance.md).
prefer_passive_wait()

import perfscope  # noqa: E402

#: What a ``--smoke`` run uses: tiny model, few tokens, one run per setting.
SMOKE = {
    "model_preset": "tiny",
    "requests": 2,
    "warmup": 0,
    "prompt_len": 8,
    "output_len": 4,
    "repeat": 1,
}


def _ms(v: Any) -> str:
    return "–" if v is None else f"{v * 1e3:.3g}"


def _r(v: Any) -> str:
    return "–" if v is None else f"{v:.3f}"


def markdown(s: Any) -> str:
    """The study's settings table and its effects table, as Markdown."""
    from perfscope.dashboard.study_report import phase_cell

    # Chunked prefill runs have a third phase: steps with decode rows and prompt chunks.
    mixed = any("mixed" in r.phases for st in s.settings for r in st.runs)
    lines = [
        f"Settings: the baseline's values are the medians of its {s.repeat} run(s), every "
        "other setting's the baseline's times its paired effect ratio (the effects table's "
        "statistic); phase columns summarise all runs of a setting (median MFU/MBU "
        "[range]).",
        "",
        f"| {s.knob} | TTFT p50 ms | TPOT p50 ms | output tok/s | memory MB | prefill | decode |"
        + (" mixed |" if mixed else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if mixed else ""),
    ]
    for st in s.settings:

        def v(p: str, st: Any = st) -> str:
            return phase_cell(st, p) or "–"

        mem = st.memory.get("total_bytes")
        mb = "–" if mem is None else f"{mem / 1e6:.3g}"
        lines.append(
            f"| {st.value} | {_ms(s.estimate(st, 'ttft_p50_s'))} "
            f"| {_ms(s.estimate(st, 'tpot_p50_s'))} "
            f"| {_r(s.estimate(st, 'output_tok_s'))} | {mb} "
            f"| {v('prefill')} | {v('decode')} |" + (f" {v('mixed')} |" if mixed else "")
        )
    lines += [
        "",
        f"| {s.knob} | metric | measured ratio | interval (at the verdict's level) | verdict "
        "| projected (derated) | error | roofline alone (SoL) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = {"ttft_p50_s": "ttft_s", "tpot_p50_s": "tpot_s", "output_tok_s": "throughput_tok_s"}
    for st in s.settings[1:]:
        for e in st.effects:
            if e.metric not in keys:
                continue
            c = e.change
            ci = c.interval_text()
            sol = ((st.projection or {}).get("sol_ratios") or {}).get(keys[e.metric])
            err = "–" if e.error is None else f"{100 * e.error:+.0f}%"
            lines.append(
                f"| {st.value} | {e.metric} | {_r(c.ratio)} | {ci} | {c.verdict} "
                f"| {_r(e.projected_ratio)} | {err} | {_r(sol)} |"
            )
    extra = [
        ("itl_p99_s", "ITL p99 ms", _ms),
        ("decode_stall_share", "decode time stalled by prefill", _r),
        ("prompt_cache_share", "prompt tokens from prefix cache", _r),
        ("prompt_cache_hit_rate", "requests hitting the cache", _r),
    ]
    shown = [x for x in extra if any(st.median.get(x[0]) is not None for st in s.settings)]
    if shown and s.knob in ("prefix-cache", "max-batched-tokens"):
        lines += [
            "",
            f"| {s.knob} | " + " | ".join(label for _, label, _ in shown) + " |",
            "|---" * (len(shown) + 1) + "|",
        ]
        for st in s.settings:
            cells = " | ".join(fmt(st.median.get(key)) for key, _, fmt in shown)
            lines.append(f"| {st.value} | {cells} |")
    q = [(st.value, st.quality) for st in s.settings if st.quality]
    if q:
        lines += [
            "",
            f"| {s.knob} | top-1 agreement with baseline | perplexity | baseline perplexity |",
            "|---|---|---|---|",
        ]
        for value, qual in q:
            lines.append(
                f"| {value} | {qual['top1_agreement']:.3f} | {qual['candidate_perplexity']:.3f} "
                f"| {qual['reference_perplexity']:.3f} |"
            )
    lines += ["", *[f"- note: {n}" for n in s.notes], f"- study file: `{s.path}`"]
    return "\n".join(lines)


def quality_hook() -> Callable[[dict[str, Any]], Any]:
    """A study ``quality`` hook: top-1 agreement and perplexity of each setting's model
    against the first setting's (both built exactly as the engine builds them)."""
    from perfscope.profiler.engines.reference.quality import reference_quality

    return reference_quality()


def sample_args(
    doc: str,
    smoke: str = "a few seconds: tiny, 1 run each",
    save_to: str = "samples/studies/results",
) -> argparse.Namespace:
    """The command line every study sample takes: ``--smoke`` (``smoke`` says what it runs),
    ``--runs-dir DIR`` and ``--save [DIR]`` (default ``save_to``, relative to the repository
    root, where the samples are run from)."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--smoke", action="store_true", help=smoke)
    ap.add_argument("--runs-dir", default=None)
    ap.add_argument(
        "--save",
        nargs="?",
        const=save_to,
        default=None,
        help=f"also store the record as `perfscope study --save DIR` does (default {save_to})",
    )
    return ap.parse_args()


def run_study(
    knob: str,
    values: str,
    *,
    doc: str,
    smoke_values: str | None = None,
    smoke: dict[str, Any] | None = None,
    with_quality: bool = False,
    **options: Any,
) -> Any:
    """Parse ``--smoke``, run the study, print Markdown; returns the study."""
    a = sample_args(doc)
    opts = dict(options)
    if a.smoke:
        opts.update(SMOKE)
        opts.update(smoke or {})
        opts.pop("weights", None)  # training takes a minute; the smoke uses random weights
        values = smoke_values or values
    runs_dir = a.runs_dir or tempfile.mkdtemp(prefix="perfscope-study-")
    hook = quality_hook() if with_quality else None
    s = perfscope.study(
        knob, values, runs_dir=runs_dir, telemetry=False, seed=0, quality=hook, **opts
    )
    print(markdown(s))
    if a.save is not None:
        target = perfscope.save_study(s, a.save)
        print(f"- saved: `{target}`")
    return s
