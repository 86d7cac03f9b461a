"""Rich renderables for runs and summaries (terminal output of the CLI)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from perfscope.analysis import Summary
from perfscope.analysis.catalogue import (
    format_count,
    format_number,
    format_ratio,
    format_seconds,
)
from perfscope.cli.runs_list import runs_table
from perfscope.cli.safe import safe_markup
from perfscope.dashboard.queueing import queueing_line
from perfscope.dashboard.terminal import FitTable, energy_table, predictions_table, roofline_table
from perfscope.dashboard.view import (
    TABLE_STATS,
    latency_rows,
    model_spec_lines,
    run_view,
    step_rows,
    throughput_rows,
)

if TYPE_CHECKING:
    from perfscope.profiler.store import StoredRun

__all__ = ["runs_table", "summary_view"]


def latency_table(summary: Summary) -> FitTable:
    """Latency distributions, one row per metric (values with their own units)."""
    cols = ("metric", "count", *TABLE_STATS)
    t = FitTable(cols, title="Latency", right=frozenset(cols[1:]))
    for row in latency_rows(summary):
        t.add_row(row.label, row.count, *(row.values[c] for c in TABLE_STATS))
    return t


def throughput_table(summary: Summary) -> FitTable:
    """Counts, throughput, goodput and driver lag."""
    t = FitTable(
        ("what", "value"), title="Throughput", show_header=False, right=frozenset(("value",))
    )
    for row in throughput_rows(summary):
        t.add_row(row.label, row.value)
    return t


def steps_table(summary: Summary) -> FitTable | None:
    """Forward passes per step kind (local engines only)."""
    rows = step_rows(summary)
    if not rows:
        return None
    cols = ("phase", "passes", "time", "share", "mean batch", "tokens", "per pass")
    t = FitTable(cols, title="Forward passes", right=frozenset(cols[1:]))
    for r in rows:
        t.add_row(r.kind, r.passes, r.time, r.share, r.mean_batch, r.tokens, r.per_pass)
    return t


def _prompt_cache_line(summary: Summary) -> str | None:
    """One line on the prefix cache (engines that report cached prompt tokens)."""
    pc = summary.prompt_cache
    if pc is None or pc.share is None:
        return None
    return (
        f"prefix cache: {100 * pc.share:.0f}% of prompt tokens served from it "
        f"({pc.cached_tokens:,} of {pc.prompt_tokens:,}); {pc.requests_hit} of "
        f"{pc.requests_reporting} requests hit"
    )


def _client_line(summary: Summary) -> str | None:
    """One line on the HTTP client's own cost and stamping clock (``openai:`` runs)."""
    c = summary.client
    if c is None or c.cpu_s is None:
        return None
    rss = c.peak_rss_bytes or 0
    clock = f", chunks stamped by the {c.stamp_clock} clock" if c.stamp_clock else ""
    return f"client: {c.cpu_s:.2f} CPU-s, peak RSS {rss / 1e6:.0f} MB{clock}"


def summary_view(summary: Summary, run: StoredRun | Path | None = None) -> RenderableType:
    """The whole summary as the CLI prints it. ``run``: the run as read (its tables give a
    batch run's queue time without reading the directory again) or its directory."""
    view = run_view(summary)
    parts: list[RenderableType] = []
    style = "green" if view.status == "complete" else "red"
    head = Text.assemble(
        ("run ", "bold"),
        (view.title, "bold cyan"),
        "  ",
        (view.status, style),
        f"  engine {view.engine}",
    )
    parts.append(head)
    for warning in view.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    parts.append(latency_table(summary))
    queue_line = queueing_line(summary.load_mode, run)
    if queue_line is not None:
        parts.append(Text(queue_line, style="yellow"))
    parts.append(throughput_table(summary))
    st = steps_table(summary)
    if st is not None:
        parts.append(st)
    cache_line = _prompt_cache_line(summary)
    if cache_line is not None:
        parts.append(Text(cache_line))
    client_line = _client_line(summary)
    if client_line is not None:
        parts.append(Text(client_line, style="dim"))
    for section_renderer in _extra_renderers():
        r = section_renderer(summary)
        if r is not None:
            parts.append(r)
    if view.errors:
        et = FitTable(("count", "error"), title="Errors", right=frozenset(("count",)))
        et.wrap = frozenset(("error",))
        for e in view.errors:
            et.add_row(e.value, safe_markup(e.label))
        parts.append(et)
    if run is not None:
        parts.append(
            Text(f"run directory: {run if isinstance(run, Path) else run.path}", style="dim")
        )
    return Group(*parts)


def _roofline_view(summary: Summary) -> RenderableType | None:
    roofline = summary.roofline
    if not roofline.available:
        return Text(f"Roofline: not available ({roofline.reason})", style="dim")
    spec = model_spec_lines(summary)
    if not spec:
        return roofline_table(roofline)
    lines = Text(spec[0], style="dim")
    for line in spec[1:]:
        lines.append(f"\n  - {line}")
    return Group(roofline_table(roofline), lines)


def _advice_view(summary: Summary) -> RenderableType | None:
    """Numbered suggestions: technique and projected gain on one line, the reason below."""
    if not summary.advice:
        return None
    parts: list[RenderableType] = [
        Text("What to try (projected from the cost model)", style="bold")
    ]
    for item in summary.advice:
        gain = item.projected_gain
        value, low = gain.value, gain.low
        shown = (
            f"{format_number(low)}–{format_number(value)}"
            if value is not None and low is not None and low < value
            else format_number(value)
        )
        gain_text = f"{shown} {gain.unit}" if value is not None else ""
        parts.append(
            Text.assemble(
                (f"{item.rank}. ", "bold"),
                (item.technique, "bold"),
                (f" — {gain_text}" if gain_text else "", "green"),
            )
        )
        why = item.why + (f" ({item.assumptions})" if item.assumptions else "")
        parts.append(Padding(Text(why, style="dim"), (0, 0, 0, 3)))
        if item.calibration is not None and item.calibration.text:
            parts.append(
                Padding(
                    Text(f"calibration: {item.calibration.text}", style="dim italic"), (0, 0, 0, 3)
                )
            )
    return Group(*parts)


def _projections_view(summary: Summary) -> RenderableType | None:
    if not summary.projections:
        return None
    return predictions_table(
        summary.projections,
        title="This workload on other devices (each device's speed of light at a stated "
        "efficiency; TTFT/TPOT ranges: compiled engine – eager PyTorch)",
    )


def _energy_view(summary: Summary) -> RenderableType | None:
    return energy_table(summary.energy)


def _server_metrics_view(summary: Summary) -> RenderableType | None:
    """The server's own means for the run (from its /metrics), beside perfscope's."""
    sm = summary.server_metrics
    if sm is None or not sm.available:
        return None
    t = FitTable(
        ("metric", "server", "perfscope"),
        title=f"Server metrics ({sm.server}, its own /metrics, run deltas)",
        right=frozenset(("server", "perfscope")),
    )
    lat = sm.latency
    client = summary.latency.metrics()
    for key, label in (
        ("ttft", "TTFT mean"),
        ("queue", "  queue"),
        ("prefill", "  prefill"),
        ("tpot", "TPOT mean"),
        ("itl", "ITL mean per token"),
        ("e2e", "E2E mean"),
    ):
        if key not in lat:
            continue
        ours = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2e", "itl": "itl_per_token"}.get(key)
        mine = client[ours].mean if ours and ours in client else None
        t.add_row(label, format_seconds(lat[key].mean_s), format_seconds(mine))
    tokens = sm.tokens
    t.add_row(
        "output tokens",
        format_count(tokens.get("generation")),
        format_count(summary.counts.output_tokens),
    )
    if tokens.get("prompt_cached"):
        t.add_row("prompt tokens from cache", format_count(tokens.get("prompt_cached")), "")
    for key, label in (
        ("prefix_cache_hit_rate", "prefix-cache hit rate"),
        ("spec_decode_acceptance", "spec-decode acceptance"),
        ("kv_cache_usage_max", "KV-cache usage max"),
    ):
        if sm[key] is not None:
            t.add_row(label, format_ratio(sm[key]), "")
    if sm.running_max is not None:
        t.add_row(
            "running / waiting max",
            f"{sm.running_max:.0f} / {(sm.waiting_max or 0):.0f}",
            "",
        )
    ratio = sm.work.flops_ratio_server_to_model if sm.work is not None else None
    if ratio is not None:
        t.add_row("FLOPs: server / cost model", f"{ratio:.3f}", "")
    return t


def _speculative_view(summary: Summary) -> RenderableType | None:
    """Speculative decoding: acceptance, draft cost and the speedup they project."""
    sp = summary.speculative
    if sp is None:
        return None

    def num(v: float | None, fmt: str = ".3f") -> str:
        return "–" if v is None else format(v, fmt)

    drafted = (sp.method or "draft") == "draft"
    title = f"draft {sp.draft}" if drafted else f"{sp.method}, no draft model"
    t = FitTable(("quantity", "value"), title=f"Speculative decoding ({title})")
    t.add_row("tokens proposed per step (K)", str(sp.num_speculative_tokens))
    t.add_row("tokens emitted per sequence and step", num(sp.mean_tokens_per_step))
    t.add_row(
        "accepted / proposed draft tokens",
        f"{sp.accepted_tokens} / {sp.proposed_tokens} = {num(sp.acceptance_rate)}",
    )
    t.add_row("accepted per sequence and step", num(sp.mean_accepted_per_step))
    t.add_row("per-token acceptance alpha", num(sp.alpha))
    t.add_row(
        "time in draft / verify passes",
        f"{format_seconds(sp.draft_time_s)} / {format_seconds(sp.verify_time_s)}",
    )
    c_text = f"{num(sp.cost_ratio)} (SoL {num(sp.cost_ratio_sol)})"
    t.add_row("draft pass / verify pass (c)", c_text)
    t.add_row(
        "projected speedup over plain decoding",
        f"{num(sp.projected_speedup, '.2f')}x (SoL {num(sp.projected_speedup_sol, '.2f')}x; "
        "formula of Leviathan et al. 2023, measure it with a study)",
    )
    return t


def _extra_renderers() -> Iterable[Callable[[Summary], RenderableType | None]]:
    """Renderers of the analysis sections (roofline, energy, advice, projections, server,
    speculative decoding)."""
    return (
        _roofline_view,
        _energy_view,
        _advice_view,
        _projections_view,
        _server_metrics_view,
        _speculative_view,
    )
