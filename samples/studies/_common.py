"""Shared driver of the study samples: run one ``perfscope.study`` and print its tables as
Markdown (the numbers in each write-up come from this output). Public names only."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
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
        lines += ["", *quality_table(s.knob, q)]
    lines += ["", *[f"- note: {n}" for n in s.notes], f"- study file: `{s.path}`"]
    return "\n".join(lines)


def quality_table(knob: str, rows: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[str]:
    """The quality table's lines: per setting (label, what the quality hook returned), the
    top-1 agreement with the baseline's model and both perplexities."""
    lines = [
        f"| {knob} | top-1 agreement with baseline | perplexity | baseline perplexity |",
        "|---|---|---|---|",
    ]
    for value, qual in rows:
        if not qual:
            lines.append(f"| {value} | – | – | – |")
            continue
        lines.append(
            f"| {value} | {qual['top1_agreement']:.3f} | {qual['candidate_perplexity']:.3f} "
            f"| {qual['reference_perplexity']:.3f} |"
        )
    return lines


def quality_hook() -> Callable[[Mapping[str, Any]], Any]:
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
        "--quality-only",
        action="store_true",
        help="only each setting's quality (top-1 agreement, perplexity) against the baseline "
        "model, no speed runs (seconds once the trained model is cached); --save stores it "
        "as DIR/<sample>/<time>-quality.json",
    )
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
    if a.quality_only:
        if not with_quality:
            raise SystemExit(f"the {knob} study measures no quality: drop --quality-only")
        record = quality_record(knob, values, **opts)
        print(quality_markdown(record))
        if a.save is not None:
            print(f"- saved: `{save_quality(record, a.save)}`")
        return record
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


#: The format of a quality record (``results/<sample>/<time>-quality.json``).
QUALITY_FORMAT = "perfscope.study-quality/1"
#: Study options that shape only the speed runs, not the model a quality figure is taken on.
_SPEED_ONLY = (
    "requests",
    "warmup",
    "prompt_len",
    "output_len",
    "repeat",
    "threads",
    "batch_size",
    "scheduler",
    "precision",
    "max_repeats",
    "budget_s",
)


def quality_record(knob: str, values: str, **options: Any) -> dict[str, Any]:
    """Each setting's quality against the first setting's model, with no speed run
    (``perfscope.study_quality`` with the reference hook), and what it was
    measured on: each setting's model (``describe_model``) and the evaluation set."""
    from perfscope.profiler.engines.reference.quality import describe_model

    opts = {k: v for k, v in options.items() if k not in _SPEED_ONLY}
    rows = perfscope.study_quality(knob, values, quality=quality_hook(), seed=0, **opts)
    models = [describe_model(args) for _, args, _ in rows]
    return {
        "format": QUALITY_FORMAT,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "knob": knob,
        "values": [label for label, _, _ in rows],
        # A weights file is named, not located (the path is this machine's cache).
        "options": json.loads(
            json.dumps(
                {
                    k: Path(v).name if k == "weights" and v != "trained" else v
                    for k, v in opts.items()
                },
                default=str,
            )
        ),
        "evaluation": models[0]["evaluation"],
        "torch": models[0]["torch"],
        "settings": [
            {
                "value": label,
                "quality": None if q is None else dict(q),
                "model": {k: v for k, v in m.items() if k not in ("evaluation", "torch")},
            }
            for (label, _, q), m in zip(rows, models, strict=True)
        ],
    }


def save_quality(record: Mapping[str, Any], root: str | Path, name: str | None = None) -> Path:
    """Store ``record`` as ``root/<name>/<time>-quality.json`` (``name``: the running
    sample's file name without ``.py``)."""
    stem = name or Path(sys.argv[0]).stem
    stamp = datetime.fromisoformat(str(record["created_at"])).strftime("%Y%m%d-%H%M%S")
    target = Path(root) / stem / f"{stamp}-quality.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return target


def read_quality(path: str | Path) -> dict[str, Any]:
    """A stored quality record; refuses another format."""
    record: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    if record.get("format") != QUALITY_FORMAT:
        raise ValueError(f"{path}: not a {QUALITY_FORMAT} record")
    return record


def _model_words(m: Mapping[str, Any]) -> str:
    """``tiny preset (2 layers, hidden 128, ...; 0.6 M parameters, float32)``."""
    sh = m["shape"]
    return (
        f"the {m['preset']} preset ({sh['n_layers']} layers, hidden {sh['hidden_size']}, "
        f"{sh['n_heads']} heads / {sh['n_kv_heads']} KV heads, MLP {sh['intermediate_size']}, "
        f"vocabulary {sh['vocab_size']}; {m['parameters'] / 1e6:.2f} M parameters, {sh['dtype']})"
    )


def _weights_words(m: Mapping[str, Any]) -> str:
    t = m.get("training")
    if m["weights"] == "random":
        return "random weights (seeded)"
    if not t:
        return f"weights from `{m['weights_file']}`"
    return (
        "trained on the synthetic corpus (`profiler/engines/reference/train.py`: "
        f"{t['steps']} AdamW steps of {t['batch']} sequences x {t['seq_len']} tokens, "
        f"alphabet {t['alphabet']}, seed {t['seed']}; final training loss "
        f"{t['final_loss']:.3f} nats/token)"
    )


def quality_markdown(record: Mapping[str, Any], speed: str | None = None) -> str:
    """A quality record as Markdown: what was measured on what, then the table. ``speed``:
    a sentence on how the write-up's speed figures were measured."""
    settings = record["settings"]
    base = settings[0]["model"]
    ev = record["evaluation"]
    lines = [
        f"Top-1 agreement with the {record['knob']}={record['values'][0]} model (the fraction "
        "of next-token predictions where both pick the same token) and perplexity, on "
        f"{ev['sequences']} held-out sequences of {ev['tokens_per_sequence']} tokens of the "
        f"synthetic corpus ({ev['predictions']} predictions, corpus seed {ev['seed']}; torch "
        f"{record['torch']}). Model: {_model_words(base)}, {_weights_words(base)}."
    ]
    for st in settings[1:]:
        m = st["model"]
        if m["shape"] != base["shape"] or m["weights_file"] != base["weights_file"]:
            same = m["weights_file"] == base["weights_file"]
            lines[0] += (
                f" {record['knob']}={st['value']}: {_model_words(m)}, "
                + (
                    _weights_words(m).replace("trained on", "trained separately on", 1)
                    if not same
                    else "the baseline's weights without its later layers (no fine-tuning)"
                    if m["shape"]["n_layers"] < base["shape"]["n_layers"]
                    else "the baseline's weights"
                )
                + "."
            )
    if speed:
        lines[0] += " " + speed
    rows = [(str(st["value"]), st["quality"]) for st in settings]
    return "\n".join([*lines, "", *quality_table(str(record["knob"]), rows)])
