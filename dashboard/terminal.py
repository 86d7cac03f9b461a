"""Terminal (rich) tables of a summary's analysis sections: roofline, energy, projections.

They were part of ``perfscope.analysis``; the analysis now computes and this layer shows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from perfscope.analysis.catalogue import (
    format_bytes,
    format_count,
    format_number,
    format_seconds,
    format_si,
    format_value,
)
from perfscope.analysis.catalogue import format_ratio as fmt_pct

if TYPE_CHECKING:  # the records load lazily: ls and query render tables without them
    from perfscope.analysis.summary import Energy, Projection, Roofline

__all__ = ["FitTable", "energy_table", "fmt_utilisation", "predictions_table", "roofline_table"]

#: The one table style of every terminal table.
BOX = box.SIMPLE_HEAD

Cell = str | Text


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _longest_word(text: str) -> int:
    return max((cell_len(w) for w in text.split()), default=0)


@dataclass
class FitTable:
    """A table that never cuts an identifier or a number, at any terminal width.

    Columns named in ``wrap`` hold prose and may wrap at spaces; every other column keeps
    each cell on one line. When the table does not fit the width it is drawn into, it is
    drawn stacked instead: one block per row, headed by the row's first cell, with one
    ``column: value`` line per other cell.

    Attributes:
        columns: column headers, in order.
        rows: one list of cells per row (``str`` or rich ``Text``).
        title: printed above the table (or above the blocks).
        right: columns aligned right (numbers).
        wrap: prose columns that may wrap.
        caption: a dim line under the table.
        show_header: ``False`` for two-column key/value tables.
        hoist_constant: a column whose cell is the same in every row (two rows or more) is
            printed once under the table (``column: value, every row``) instead of in
            each row.
    """

    columns: Sequence[str]
    rows: list[list[Cell]] = field(default_factory=list)
    title: str | None = None
    right: frozenset[str] = frozenset()
    wrap: frozenset[str] = frozenset()
    caption: str | None = None
    show_header: bool = True
    hoist_constant: bool = False

    def add_row(self, *cells: Cell) -> None:
        """Append a row (one cell per column)."""
        self.rows.append(list(cells))

    def required_width(self) -> int:
        """Cells needed to draw the table without cutting anything."""
        total = 0
        for i, col in enumerate(self.columns):
            texts = [_plain(r[i]) for r in self.rows if i < len(r)]
            head = self._head_width(col)
            if col in self.wrap:
                body = max((_longest_word(t) for t in texts), default=0)
                body = max(body, min(24, max((cell_len(t) for t in texts), default=0)))
            else:
                body = max((max(map(cell_len, t.split("\n"))) for t in texts), default=0)
            total += max(head, body) + 2  # one space of padding either side
        # The box draws a (blank) separator between columns (no edges: show_edge=False).
        return total + len(self.columns) - 1

    def _head_width(self, col: str) -> int:
        """Cells the header needs: whole on one line in a one-line column (rich does not
        wrap the header of a no-wrap column), its longest word in a prose column."""
        if not self.show_header:
            return 0
        return _longest_word(col) if col in self.wrap else cell_len(col)

    def _min_widths(self) -> list[int]:
        widths = []
        for i, col in enumerate(self.columns):
            texts = [_plain(r[i]) for r in self.rows if i < len(r)]
            head = self._head_width(col)
            if col in self.wrap:
                body = max((_longest_word(t) for t in texts), default=0)
            else:
                body = max((max(map(cell_len, t.split("\n"))) for t in texts), default=0)
            widths.append(max(head, body))
        return widths

    def table(self) -> Table:
        """The side-by-side form."""
        t = Table(
            title=self.title,
            title_justify="left",
            box=BOX,
            caption=self.caption,
            caption_justify="left",
            show_header=self.show_header,
            show_edge=False,
            header_style="bold",
            caption_style="dim",
        )
        for col, w in zip(self.columns, self._min_widths(), strict=True):
            t.add_column(
                col,
                justify="right" if col in self.right else "left",
                no_wrap=col not in self.wrap,
                min_width=w,
                overflow="fold",
            )
        for r in self.rows:
            t.add_row(*r)
        return t

    def stacked(self, width: int = 80) -> Group:
        """The narrow form: one block per row, its fields packed into lines of ``width``
        cells (a field is never split; a field wider than the line gets a line of its own
        and wraps at spaces)."""
        parts: list[RenderableType] = []
        if self.title:
            parts.append(Text(self.title, style="bold"))
        for r in self.rows:
            head = r[0].copy() if isinstance(r[0], Text) else Text(str(r[0]))
            head.stylize("bold")
            parts.append(head)
            line = Text()
            for col, cell in zip(self.columns[1:], r[1:], strict=False):
                if not _plain(cell).strip():
                    continue
                value = cell if isinstance(cell, Text) else Text(str(cell))
                fld = Text.assemble((f"{col} " if self.show_header else "", "dim"), value)
                if line.cell_len and line.cell_len + 3 + fld.cell_len > width - 2:
                    parts.append(Padding(line, (0, 0, 0, 2)))
                    line = Text()
                if line.cell_len:
                    line.append(" · ", style="dim")
                line.append_text(fld)
            if line.cell_len:
                parts.append(Padding(line, (0, 0, 0, 2)))
        if self.caption:
            parts.append(Text(self.caption, style="dim"))
        return Group(*parts)

    def hoisted(self) -> FitTable:
        """This table without its constant columns, which move to the caption (the first
        column, the rows' names, always stays)."""
        if len(self.rows) < 2:
            return self
        keep = [0]
        same: list[str] = []
        for i, col in enumerate(self.columns[1:], start=1):
            cells = {_plain(r[i]) if i < len(r) else "" for r in self.rows}
            if len(cells) == 1:
                (value,) = cells
                if value.strip():
                    same.append(f"{col}: {value}")
            else:
                keep.append(i)
        if len(keep) == len(self.columns):
            return self
        lines = [*([self.caption] if self.caption else [])]
        if same:
            lines.append("every row: " + " · ".join(same))
        return FitTable(
            [self.columns[i] for i in keep],
            rows=[[r[i] for i in keep if i < len(r)] for r in self.rows],
            title=self.title,
            right=self.right,
            wrap=self.wrap,
            caption="\n".join(lines) or None,
            show_header=self.show_header,
        )

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        fit = self.hoisted() if self.hoist_constant else self
        if fit.required_width() <= options.max_width:
            yield fit.table()
        else:
            yield fit.stacked(options.max_width)


_fmt_time = format_seconds
_fmt_si = format_si


def _ms(s: float | None) -> str:
    return format_seconds(s)


def _gb(b: float | None) -> str:
    return format_bytes(b)


def _fmt(v: Any, unit: str = "", digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{format_number(v, digits)}{unit}"
    return f"{v}{unit}"


def _bytes(v: float | None) -> str:
    return "—" if v is None else format_bytes(v)


def fmt_utilisation(v: float | None) -> str:
    """MFU or MBU as a percentage; above 100% it is not a fact but a ceiling to suspect."""
    text = fmt_pct(v)
    if v is not None and v > 1.0:
        text += " (ceiling suspect)"
    return text


def roofline_table(r: Roofline) -> RenderableType:
    """The roofline section of ``perfscope run``/``show``: a table plus the evidence lines."""
    if not r.available:
        return Text(f"roofline: not available ({r.reason or 'no data'})", style="dim")
    from perfscope.analysis.summary import RooflineCeilings

    c = r.ceilings or RooflineCeilings()
    title = f"Roofline — {r.model} on {r.device.name if r.device is not None else '?'}"
    if r.estimated:
        title += " (estimated from the request timeline)"
    if r.what_if is not None:
        title += (
            f" — WHAT-IF: measured on {r.what_if.measured_on}, no measured "
            "MFU/MBU against this device"
        )
    table = FitTable(
        (
            "phase",
            "steps",
            "time",
            "FLOPs",
            "bytes",
            "intensity",
            "ridge",
            "MFU",
            "MBU",
            "FLOP/s",
            "bytes/s",
            "efficiency",
            "verdict",
        ),
        title=title,
        right=frozenset(("steps", "time", "FLOPs", "bytes", "intensity", "ridge", "MFU", "MBU"))
        | {"FLOP/s", "bytes/s", "efficiency"},
    )
    styles = {"compute-bound": "green", "memory-bound": "cyan", "overhead-bound": "yellow"}
    for phase, p in r.phases.items():
        ridge = p.ridge_point
        cache = " (cache)" if p.memory_level == "cache" else ""
        name = phase + (" (est.)" if p.estimated else "")
        table.add_row(
            name,
            format_count(p.steps),
            _fmt_time(p.time_s),
            _fmt_si(p.flops, "FLOP"),
            _fmt_si(p.bytes, "B"),
            f"{format_number(p.intensity)} FLOP/B",
            (f"{format_number(ridge)} FLOP/B" if ridge else "n/a") + cache,
            fmt_utilisation(p.mfu),
            fmt_utilisation(p.mbu) + cache,
            _fmt_si(p.achieved_flops_s, "FLOP/s"),
            _fmt_si(p.achieved_bytes_s, "B/s"),
            fmt_pct(p.efficiency),
            Text(
                p.verdict + (" (mixed)" if p.class_verdict == "mixed" else ""),
                style=styles.get(p.verdict, ""),
            ),
        )
    src = c.source or "?"
    ceil = Text(
        f"ceilings ({src}): {_fmt_si(c.peak_flops, 'FLOP/s')} {c.dtype}, "
        f"{_fmt_si(c.mem_bw_bytes_s, 'B/s')} DRAM"
        + (
            f", {_fmt_si(c.cache_bw_bytes_s, 'B/s')} cache ({_fmt_si(c.cache_bytes, 'B')})"
            if c.cache_bw_bytes_s
            else ""
        )
        + (
            "; calibration spread (IQR/2 of the trials) "
            + ", ".join(f"{k} ±{100 * v / 2:.1f}%" for k, v in c.spread.items())
            if c.spread
            else (
                "; calibration spread not recorded (an older calibration: 'perfscope hw "
                "calibrate --force' measures it)"
                if src == "calibrated"
                else ""
            )
        )
        + f"; FLOPs {r.flops_convention or 'as executed'}; "
        f"overhead-bound below {fmt_pct(r.overhead_threshold)} MFU and MBU",
        style="dim",
    )
    lines = [Text(f"• {p.evidence}") for p in r.phases.values() if p.evidence]
    if c.provisional:
        lines.insert(0, Text(f"⚠ {c.provisional}", style="bold yellow"))
    return Group(table, ceil, *lines)


def _span(p: Projection, key: str, fmt: Callable[[Any], str]) -> str:
    """``compiled – eager`` for a ranged projection, else the one value."""
    rng = p.range
    if not rng:
        v = getattr(p, key)
        return fmt(v) if v else "n/a"
    lo, hi = p.range_value("compiled", key), p.range_value("eager", key)
    if not lo or not hi:
        return "n/a"
    return f"{fmt(lo)} – {fmt(hi)}"


def _said_once(checks: list[str]) -> list[str]:
    """Several devices' "unchecked" notes (:func:`~perfscope.analysis.calibration.
    projection_check`) as one line naming every device; other notes as they are."""
    from perfscope.analysis.calibration import UNCHECKED_HOW, UNCHECKED_PREFIX

    tail = " " + UNCHECKED_HOW
    unchecked = [c for c in checks if c.startswith(UNCHECKED_PREFIX) and c.endswith(tail)]
    if len(unchecked) < 2:
        return checks
    places = [c[len(UNCHECKED_PREFIX) : -len(tail)] for c in unchecked]
    engine = places[0].rpartition(", ")[2]
    common = engine.endswith(" engine") and all(w.endswith(", " + engine) for w in places)
    if common:
        places = [w[: -len(", " + engine)] for w in places]
    where = (", ".join(places) + f"; {engine}") if common else "; ".join(places)
    merged = f"{UNCHECKED_PREFIX}any device shown ({where}) {UNCHECKED_HOW}"
    return [merged, *(c for c in checks if c not in unchecked)]


def predictions_table(
    predictions: Sequence[Projection], *, title: str | None = None
) -> RenderableType:
    """A rich table of projections (:func:`~perfscope.analysis.whatif.predict` /
    :func:`~perfscope.analysis.whatif.project_run` results as records), one row per device."""
    if not predictions:
        return Text("no devices to project onto", style="dim")
    first = predictions[0]
    w = first.workload
    sol = all(p.speed_of_light for p in predictions)
    bases = list(dict.fromkeys(str(p.basis) for p in predictions if p.basis))
    basis = (
        "at speed of light (100% of roofline)"
        if sol
        else " | ".join(bases)
        or (
            f"derated: prefill {fmt_pct(first.efficiency['prefill'])}, "
            f"decode {fmt_pct(first.efficiency['decode'])} of speed of light"
        )
    )
    # How far each projection was checked against measurement (stored studies), said once.
    checks = _said_once(list(dict.fromkeys(str(p.checked) for p in predictions if p.checked)))
    ranged = any(p.range for p in predictions)
    # A state-space model holds a recurrent state, constant in context, instead of a KV cache.
    state = all(p.memory.cache_kind == "recurrent state" for p in predictions)
    cache_col = "state" if state else "KV cache"
    cols = (
        "device",
        "ceilings",
        *(("SOL TTFT", "SOL TPOT") if ranged else ()),
        "TTFT",
        "TPOT",
        "tok/s",
        "weights",
        cache_col,
        "fits",
        "max batch",
        "prefill",
        "decode",
    )
    table = FitTable(
        cols,
        title=title
        or (
            f"{first.model} ({first.dtypes['weights']} weights, "
            f"{first.dtypes['kv_cache']} {'state' if state else 'KV'}) — "
            f"batch {w['batch']}, prompt {w['prompt_len']}, "
            f"output {w['output_len']}" + (f", TP {w['tp']}" if w["tp"] > 1 else "")
        ),
        caption=basis
        + "; tok/s counts output tokens over the whole request (prefill included)"
        + "".join(f"; {c}" for c in checks),
        right=frozenset(("TTFT", "TPOT", "tok/s", "weights", cache_col, "fits", "max batch")),
        # Devices of one workload share weights, KV size and often the verdicts: say those
        # once, so the columns that differ fit side by side.
        hoist_constant=True,
    )
    for p in predictions:
        m = p.memory
        fits = "n/a" if m.fits is None else ("yes" if m.fits else "NO")
        sol_cells: tuple[str, ...] = ()
        if ranged:
            sol_cells = (
                _ms(p.range_value("speed_of_light", "ttft_s")),
                _ms(p.range_value("speed_of_light", "tpot_s")),
            )
        table.add_row(
            p.device.key,
            str(p.device.source),
            *sol_cells,
            _span(p, "ttft_s", _ms),
            _span(p, "tpot_s", _ms),
            _span(p, "throughput_tok_s", lambda v: format_value(v, "rate", unit="tok/s")),
            _gb(m.weights_bytes),
            _gb(m.kv_cache_bytes),
            fits,
            "n/a" if p.max_batch is None else format_count(p.max_batch),
            str(p.prefill.bound),
            str(p.decode.bound),
        )
    notes = sorted({n for p in predictions for n in p.notes if not n.startswith("at speed")})
    return Group(table, *[Text(f"note: {n}", style="dim") for n in notes])


def energy_table(section: Energy) -> RenderableType:
    """A rich table of the energy section (:func:`~perfscope.analysis.energy.energy_section`);
    one line when energy is unavailable and nothing else was sampled."""
    cpu = section.cpu
    if not section.available and not section.memory and not cpu.sampled:
        return Text(f"Energy: unavailable ({section.reason or 'no data'})", style="dim")
    table = FitTable(
        ("metric", "value", "detail"),
        title="Energy and power",
        right=frozenset(("value",)),
        wrap=frozenset(("detail",)),
    )
    if not section.available:
        table.add_row("energy", "unavailable", str(section.reason or ""))
    else:
        table.add_row(
            "method",
            str(section.method),
            f"source {section.source}: {', '.join(section.devices)}",
        )
        table.add_row("window", _fmt(section.window_s, " s"), "")
        table.add_row("energy", _fmt(section.total_j, " J", 4), "")
        table.add_row(
            "energy / output token",
            _fmt(section.j_per_output_token, " J", 4),
            f"{_fmt(section.tokens_per_j, ' tok/J', 4)}",
        )
        if section.idle_baseline_w is not None:
            table.add_row(
                "idle baseline",
                _fmt(section.idle_baseline_w, " W"),
                f"dynamic energy {_fmt(section.dynamic_energy_j, ' J', 4)}",
            )
        pw = section.power
        table.add_row(
            "power avg / peak",
            f"{_fmt(pw.avg_w, ' W')} / {_fmt(pw.peak_w, ' W')}",
            f"limit {_fmt(pw.limit_w, ' W')} (avg {_fmt(pw.avg_pct_of_limit, '%')},"
            f" peak {_fmt(pw.peak_pct_of_limit, '%')}); TDP {_fmt(pw.tdp_w, ' W')}",
        )
        for name, p in section.phases.items():
            detail = []
            if p.time_s is not None:
                detail.append(format_seconds(p.time_s))
            if p.avg_power_w is not None:
                detail.append(format_value(p.avg_power_w, "watts"))
            if p.j_per_token is not None:
                detail.append(format_value(p.j_per_token, "joules_per_token"))
            table.add_row(f"  {name}", _fmt(p.energy_j, " J", 4), ", ".join(detail))
        rq = section.requests
        if rq:
            table.add_row(
                "per request",
                _fmt(rq.energy_j.p50, " J", 4),
                f"p50; p90 {_fmt(rq.energy_j.p90, ' J', 4)}; "
                f"J/token p50 {_fmt(rq.j_per_output_token.p50, '', 4)}",
            )
        if section.throttle.share is not None:
            table.add_row("throttled", _fmt(100 * section.throttle.share, "%"), "share of samples")
        for name, row in section.hardware_counters.items():
            if row.dram_bw_util_pct is not None:
                table.add_row(
                    f"measured DRAM bw ({name})",
                    _fmt(row.dram_bw_util_pct, "%"),
                    f"tensor {_fmt(row.tensor_util_pct, '%')}, "
                    f"SM occupancy {_fmt(row.sm_occupancy_pct, '%')}",
                )
    for dev, m in section.memory.items():
        table.add_row(
            f"peak memory {dev}",
            _bytes(m.peak_used_bytes),
            f"of {_bytes(m.capacity_bytes)} ({_fmt(m.peak_pct_of_capacity, '%')})",
        )
    for node, n in section.nodes.items():
        table.add_row(
            f"node {node}",
            _fmt(n.energy_j, " J", 4) if n.energy_j is not None else "no power",
            f"avg {_fmt(n.avg_power_w, ' W')}, peak {_fmt(n.peak_power_w, ' W')}; "
            f"GPU memory peak {_bytes(n.gpu_mem_used_peak_bytes)} "
            f"({n.gpus} GPUs), system memory peak "
            f"{_bytes(n.system_mem_used_peak_bytes)}",
        )
    cluster = section.cluster
    if cluster:
        table.add_row(
            f"cluster ({len(cluster.nodes)} nodes)",
            _fmt(cluster.energy_j, " J", 4),
            f"avg {_fmt(cluster.avg_power_w, ' W')}; GPU memory peak "
            f"{_bytes(cluster.gpu_mem_used_peak_bytes)}, system memory peak "
            f"{_bytes(cluster.system_mem_used_peak_bytes)}",
        )
    if cpu.sampled:
        table.add_row(
            "process peak RSS",
            _bytes(cpu.peak_rss_bytes),
            f"avg CPU {_fmt(cpu.avg_process_cpu_pct, '% of a core')}",
        )
        if cpu.energy_available:
            table.add_row("CPU package energy", _fmt(cpu.package_energy_j, " J", 4), "RAPL")
        elif str(cpu.energy_reason) not in str(section.reason):  # once, not twice
            table.add_row("CPU energy", "unavailable", str(cpu.energy_reason or ""))
    for note in section.notes:
        table.add_row("note", "", note)
    return table
