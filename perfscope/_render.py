"""Rich renderables for runs and summaries (terminal output of the CLI)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["runs_table", "summary_view"]

_LATENCY_ROWS = (
    ("ttft", "TTFT"),
    ("tpot", "TPOT"),
    ("itl", "ITL/chunk"),
    ("itl_per_token", "ITL/token"),
    ("e2e", "E2E"),
    ("ntpot", "E2E/token"),
)


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    ms = v * 1e3
    return f"{ms:.2f}" if ms < 1000 else f"{ms:.0f}"


def _num(v: float | None, fmt: str = ",.1f") -> str:
    return "-" if v is None else format(v, fmt)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def latency_table(summary: dict[str, Any]) -> Table:
    t = Table(title="Latency (ms)", box=box.SIMPLE_HEAVY, title_justify="left")
    t.add_column("metric")
    for col in ("count", "mean", "p50", "p90", "p95", "p99", "max"):
        t.add_column(col, justify="right")
    lat = summary.get("latency", {})
    for key, label in _LATENCY_ROWS:
        d = lat.get(key)
        if not d:
            continue
        t.add_row(
            label,
            str(d["count"]),
            *(_ms(d[c]) for c in ("mean", "p50", "p90", "p95", "p99", "max")),
        )
    return t


def throughput_table(summary: dict[str, Any]) -> Table:
    t = Table(title="Throughput", box=box.SIMPLE_HEAVY, title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    c = summary.get("counts", {})
    tp = summary.get("throughput", {})
    gp = summary.get("goodput", {})
    lag = summary.get("driver_lag", {})
    t.add_row(
        "requests (completed / failed / warmup)",
        f"{c.get('completed', 0)} / {c.get('failed', 0)} / {c.get('warmup', 0)}",
    )
    t.add_row(
        "output tokens / prompt tokens",
        f"{c.get('output_tokens', 0):,} / {c.get('prompt_tokens', 0):,}",
    )
    t.add_row("measured window", f"{_num(summary.get('window_s'), ',.2f')} s")
    t.add_row("output tokens/s", _num(tp.get("output_tok_s")))
    t.add_row("total tokens/s (prompt + output)", _num(tp.get("total_tok_s")))
    t.add_row("requests/s", _num(tp.get("req_s"), ",.2f"))
    busy_src = "forward passes" if tp.get("busy_source") == "steps" else "request spans"
    t.add_row(
        f"busy tokens/s (busy {_num(tp.get('busy_s'), ',.2f')} s, from {busy_src})",
        _num(tp.get("busy_tok_s")),
    )
    slos = gp.get("slos") or {}
    if slos:
        from perfscope.analysis.slo import format_duration

        label = ", ".join(f"{k}<={format_duration(v)}" for k, v in slos.items())
        t.add_row(f"goodput req/s ({label})", _num(gp.get("goodput_req_s"), ",.2f"))
        t.add_row("SLO attainment", _pct(gp.get("attainment")))
    if lag and lag.get("count"):
        t.add_row("driver lag p50 / max (ms)", f"{_ms(lag['p50'])} / {_ms(lag['max'])}")
    return t


def steps_table(summary: dict[str, Any]) -> Table | None:
    steps = summary.get("steps") or {}
    if not steps:
        return None
    t = Table(title="Forward passes", box=box.SIMPLE_HEAVY, title_justify="left")
    for col in ("phase", "passes", "time (s)", "share", "mean batch", "tokens", "ms / pass"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for kind, s in steps.items():
        t.add_row(
            kind,
            str(s["count"]),
            f"{s['time_s']:.3f}",
            _pct(s["time_share"]),
            f"{s['mean_batch_size']:.1f}",
            f"{s['new_tokens']:,}",
            f"{s['mean_step_s'] * 1e3:.2f}",
        )
    return t


def summary_view(summary: dict[str, Any], path: Path | None = None) -> RenderableType:
    """The whole summary as the CLI prints it."""
    parts: list[RenderableType] = []
    eng = summary.get("engine") or {}
    status = summary.get("status") or "?"
    style = "green" if status == "complete" else "red"
    head = Text.assemble(
        ("run ", "bold"),
        (str(summary.get("run_id")), "bold cyan"),
        "  ",
        (status, style),
        f"  engine {eng.get('uri')}",
        f" on {eng.get('device')}" if eng.get("device") else "",
        f" ({eng.get('dtype')})" if eng.get("dtype") else "",
    )
    parts.append(head)
    for warning in summary.get("warnings") or []:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    parts.append(latency_table(summary))
    parts.append(throughput_table(summary))
    st = steps_table(summary)
    if st is not None:
        parts.append(st)
    for section_renderer in _extra_renderers():
        r = section_renderer(summary)
        if r is not None:
            parts.append(r)
    errors = summary.get("errors") or []
    if errors:
        et = Table(title="Errors", box=box.SIMPLE_HEAVY, title_justify="left")
        et.add_column("count", justify="right")
        et.add_column("error")
        for e in errors:
            et.add_row(str(e["count"]), e["error"])
        parts.append(et)
    if path is not None:
        parts.append(Text(f"run directory: {path}", style="dim"))
    return Group(*parts)


def _roofline_view(summary: dict[str, Any]) -> RenderableType | None:
    from perfscope.analysis.roofline import roofline_table

    roofline = summary.get("roofline")
    if not roofline:
        return None
    if not roofline.get("available"):
        return Text(f"Roofline: not available ({roofline.get('reason')})", style="dim")
    return roofline_table(roofline)


def _advice_view(summary: dict[str, Any]) -> RenderableType | None:
    advice = summary.get("advice") or []
    if not advice:
        return None
    t = Table(
        title="What to try (projected from the cost model)",
        box=box.SIMPLE_HEAVY,
        title_justify="left",
    )
    t.add_column("#", justify="right")
    t.add_column("technique")
    t.add_column("projected gain", justify="right")
    t.add_column("why")
    for item in advice:
        gain = item.get("projected_gain") or {}
        value, low = gain.get("value"), gain.get("low")
        shown = (
            "-"
            if value is None
            else (f"{low:.2f}–{value:.2f}" if low is not None and low < value else f"{value:.2f}")
        )
        t.add_row(
            str(item.get("rank")),
            str(item.get("technique")),
            f"{shown} {gain.get('unit', '')}" if value is not None else "-",
            str(item.get("why")) + (f" ({item['assumptions']})" if item.get("assumptions") else ""),
        )
    return t


def _projections_view(summary: dict[str, Any]) -> RenderableType | None:
    from perfscope.analysis.whatif import predictions_table

    projections = summary.get("projections") or []
    if not projections:
        return None
    return predictions_table(
        projections,
        title="This workload on other devices (each device's speed of light at a stated "
        "efficiency; TTFT/TPOT ranges: compiled engine – eager PyTorch)",
    )


def _energy_view(summary: dict[str, Any]) -> RenderableType | None:
    from perfscope.analysis.energy import energy_table

    energy = summary.get("energy")
    if not energy:
        return None
    return energy_table(energy)


def _extra_renderers() -> Iterable[Any]:
    """Renderers of the analysis sections (roofline, energy, advice, projections)."""
    return (_roofline_view, _energy_view, _advice_view, _projections_view)


def runs_table(rows: list[tuple[Path, dict[str, Any], dict[str, Any] | None]]) -> Table:
    """``perfscope ls``: one row per run, newest first."""
    t = Table(box=box.SIMPLE_HEAVY)
    for col in (
        "run",
        "status",
        "engine",
        "requests",
        "TTFT p50 ms",
        "TPOT p50 ms",
        "output tok/s",
        "SLO att.",
    ):
        t.add_column(col, justify="left" if col in ("run", "status", "engine") else "right")
    from perfscope.analysis.summary import contention_record

    for path, manifest, summary in rows:
        s = summary or {}
        lat = s.get("latency", {})
        status = str(manifest.get("status", "?"))
        contended = (contention_record(manifest) or {}).get("contended")
        t.add_row(
            path.name,
            Text(
                status + (" ⚠ contended" if contended else ""),
                style="green" if status == "complete" and not contended else "red",
            ),
            str((manifest.get("engine") or {}).get("uri", "?")),
            str((s.get("counts") or {}).get("completed", "-")),
            _ms((lat.get("ttft") or {}).get("p50")),
            _ms((lat.get("tpot") or {}).get("p50")),
            _num((s.get("throughput") or {}).get("output_tok_s")),
            _pct((s.get("goodput") or {}).get("attainment")),
        )
    return t
