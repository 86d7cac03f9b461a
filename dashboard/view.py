"""The presentation view of a summary: labelled, formatted rows and cards.

One function per block turns a typed :class:`~perfscope.analysis.Summary` into display rows
whose labels and formats come from the metric catalogue. The terminal renderer
(``perfscope show``), the HTML report and the Dash run page all draw these rows, so a number
reads the same everywhere. Nothing here knows about rich, HTML or Dash.

Also here: :func:`roofline_ceilings`, the roof lines every roofline figure draws, and
:func:`request_rows`, the per-request table of the report and the dashboard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfscope.analysis import Summary
from perfscope.analysis.catalogue import (
    LATENCY_METRICS,
    format_count,
    format_duration_short,
    format_ratio,
    format_seconds,
    metric,
    to_float,
)

if TYPE_CHECKING:  # pandas and the metrics (numpy) load when a table is drawn, not for `ls`
    import pandas as pd

__all__ = [
    "TABLE_STATS",
    "Card",
    "LatencyRow",
    "RoofLines",
    "Row",
    "RunView",
    "as_summary",
    "headline_cards",
    "latency_rows",
    "model_spec_lines",
    "request_rows",
    "roofline_ceilings",
    "run_view",
    "slo_text",
    "step_rows",
    "throughput_rows",
]

#: Latency statistics shown in the tables, in order.
TABLE_STATS = ("mean", "p50", "p90", "p95", "p99", "max")


@dataclass(frozen=True)
class Row:
    """One labelled value: ``label``, the formatted ``value``, and the catalogue metric name
    it shows (``None`` for composite rows)."""

    label: str
    value: str
    metric: str | None = None


@dataclass(frozen=True)
class Card:
    """A headline card: ``title``, big ``value``, small ``detail`` line."""

    title: str
    value: str
    detail: str


@dataclass(frozen=True)
class LatencyRow:
    """One latency distribution: metric ``key`` (``ttft``), ``label``, sample ``count``, and
    per statistic the formatted value (``values``) and the raw seconds (``raw``)."""

    key: str
    label: str
    count: str
    values: dict[str, str]
    raw: dict[str, float | None]


@dataclass(frozen=True)
class StepRow:
    """One step kind: passes, time, share of busy time, mean batch, tokens, time per pass."""

    kind: str
    passes: str
    time: str
    share: str
    mean_batch: str
    tokens: str
    per_pass: str


@dataclass(frozen=True)
class RunView:
    """Every block of a run's view."""

    title: str
    status: str
    engine: str
    warnings: tuple[str, ...]
    cards: tuple[Card, ...]
    latency: tuple[LatencyRow, ...]
    throughput: tuple[Row, ...]
    steps: tuple[StepRow, ...]
    errors: tuple[Row, ...]


def as_summary(summary: Summary | Mapping[str, Any] | None) -> Summary:
    """``summary`` as a typed :class:`Summary` (a summary.json dict is read, ``/1`` or ``/2``)."""
    if isinstance(summary, Summary):
        return summary
    return Summary.from_dict(summary or {})


def _fmt(name: str, value: Any) -> str:
    return metric(name).format(value)


def slo_text(s: Summary, sep: str = "≤") -> str:
    """``ttft≤200ms, tpot≤50ms`` (or ``""`` without SLOs)."""
    return ", ".join(f"{k}{sep}{format_duration_short(v)}" for k, v in s.goodput.slos.items())


def latency_rows(s: Summary, keys: tuple[str, ...] | None = None) -> list[LatencyRow]:
    """The latency table: one row per distribution that has values."""
    out = []
    dists = s.latency.metrics()
    for key in keys or tuple(LATENCY_METRICS):
        d = dists.get(key)
        if d is None or not d.count:
            continue
        raw = {stat: to_float(getattr(d, stat)) for stat in TABLE_STATS}
        out.append(
            LatencyRow(
                key=key,
                label=LATENCY_METRICS[key],
                count=format_count(d.count),
                values={stat: format_seconds(v) for stat, v in raw.items()},
                raw=raw,
            )
        )
    return out


def throughput_rows(s: Summary) -> list[Row]:
    """Counts, rates, goodput and driver lag as labelled rows."""
    c, tp, gp, lag = s.counts, s.throughput, s.goodput, s.driver_lag
    busy_src = "forward passes" if tp.busy_source == "steps" else "request spans"
    rows = [
        Row(
            "requests (completed / failed / warmup)",
            f"{format_count(c.completed)} / {format_count(c.failed)} / {format_count(c.warmup)}",
        ),
        Row(
            "output tokens / prompt tokens",
            f"{format_count(c.output_tokens)} / {format_count(c.prompt_tokens)}",
        ),
        Row("measured window", _fmt("window_s", s.window_s), "window_s"),
        Row("output tokens/s", _fmt("output_tok_s", tp.output_tok_s), "output_tok_s"),
        Row("total tokens/s (prompt + output)", _fmt("total_tok_s", tp.total_tok_s), "total_tok_s"),
        Row("requests/s", _fmt("req_s", tp.req_s), "req_s"),
        Row(
            f"busy tokens/s (busy {format_seconds(tp.busy_s)}, from {busy_src})",
            _fmt("busy_tok_s", tp.busy_tok_s),
            "busy_tok_s",
        ),
    ]
    if gp.slos:
        rows.append(
            Row(
                f"goodput ({slo_text(s)})", _fmt("goodput_req_s", gp.goodput_req_s), "goodput_req_s"
            )
        )
        rows.append(Row("SLO attainment", _fmt("attainment", gp.attainment), "attainment"))
    if lag.count:
        rows.append(
            Row("driver lag p50 / max", f"{format_seconds(lag.p50)} / {format_seconds(lag.max)}")
        )
    return rows


def step_rows(s: Summary) -> list[StepRow]:
    """The forward-pass breakdown, one row per step kind."""
    return [
        StepRow(
            kind=kind,
            passes=format_count(st.count),
            time=format_seconds(st.time_s),
            share=format_ratio(st.time_share),
            mean_batch=_fmt("decode.batch_size_mean", st.mean_batch_size),
            tokens=format_count(st.new_tokens),
            per_pass=format_seconds(st.mean_step_s),
        )
        for kind, st in s.steps.items()
    ]


def headline_cards(s: Summary) -> list[Card]:
    """The headline: TTFT, TPOT, throughput, goodput (only with SLOs), MFU/MBU per phase,
    energy, requests."""
    cards = []
    for key in ("ttft", "tpot"):
        d = s.latency.metrics()[key]
        cards.append(
            Card(
                f"{LATENCY_METRICS[key]} p50 / p99",
                f"{format_seconds(d.p50)} / {format_seconds(d.p99)}",
                f"mean {format_seconds(d.mean)}, n={format_count(d.count)}",
            )
        )
    tp, gp = s.throughput, s.goodput
    cards.append(
        Card(
            "output throughput",
            _fmt("output_tok_s", tp.output_tok_s),
            f"{_fmt('req_s', tp.req_s)}; busy {_fmt('busy_tok_s', tp.busy_tok_s)}",
        )
    )
    if gp.slos:  # without SLOs every request "meets" them: no card rather than a 100%
        cards.append(
            Card(
                "goodput / SLO attainment",
                f"{_fmt('goodput_req_s', gp.goodput_req_s)} / {_fmt('attainment', gp.attainment)}",
                slo_text(s),
            )
        )
    roof = s.roofline
    if roof.available:
        for phase, p in roof.phases.items():
            cards.append(
                Card(
                    f"MFU / MBU {phase}",
                    f"{format_ratio(p.mfu)} / {format_ratio(p.mbu)}",
                    p.verdict + (" (estimated)" if p.estimated else ""),
                )
            )
    else:
        cards.append(Card("MFU / MBU", "n/a", "no roofline (needs model and device)"))
    en = s.energy
    if en.available:
        cards.append(
            Card(
                "energy per output token",
                _fmt("j_per_token", en.j_per_output_token),
                f"{_fmt('energy.total_j', en.total_j)} total, avg "
                f"{_fmt('avg_power_w', en.avg_power_w)} ({en.method})",
            )
        )
    else:
        cards.append(Card("energy per output token", "n/a", "no energy telemetry"))
    c = s.counts
    cards.append(
        Card(
            "requests",
            f"{format_count(c.completed)} ok / {format_count(c.failed)} failed",
            f"{format_count(c.warmup)} warmup; window {format_seconds(s.window_s)}",
        )
    )
    return cards


def run_view(summary: Summary | Mapping[str, Any]) -> RunView:
    """Every block of the run's view, from its summary."""
    s = as_summary(summary)
    eng = s.engine
    engine = str(eng.uri) + (f" on {eng.device}" if eng.device else "")
    engine += f" ({eng.dtype})" if eng.dtype else ""
    return RunView(
        title=str(s.run_id),
        status=s.status or "?",
        engine=engine,
        warnings=s.warnings,
        cards=tuple(headline_cards(s)),
        latency=tuple(latency_rows(s)),
        throughput=tuple(throughput_rows(s)),
        steps=tuple(step_rows(s)),
        errors=tuple(Row(e.error, format_count(e.count)) for e in s.errors),
    )


def model_spec_lines(s: Summary) -> list[str]:
    """The model shape a run was given (``--model-spec``) and every counting assumption its
    roofline rests on (family, layer mix, MLA mode, routing, windows, quantised layout), as
    ``perfscope roofline --model`` prints them; empty when the run measured its own model."""
    spec = s.model_spec
    if not spec:
        return []
    name = spec.get("name") or "model"
    source = spec.get("source") or "--model-spec"
    head = f"model {name} from {source} (an estimate: the shape was given, not read from "
    head += "the engine)"
    assumptions = spec.get("assumptions")
    return [head, *(str(a) for a in (assumptions if isinstance(assumptions, list) else ()))]


# ---------------------------------------------------------------------- roofline ceilings


@dataclass(frozen=True)
class RoofLines:
    """The roof of one (peak, bandwidth) pair between ``x_lo`` and ``x_hi`` (FLOP/byte), as
    two segments for log-log axes: the bandwidth slope ``memory_x``/``memory_y`` up to the
    ``ridge`` and the flat compute ceiling ``peak_x``/``peak_y`` after it (FLOP/s)."""

    ridge: float
    memory_x: list[float]
    memory_y: list[float]
    peak_x: list[float]
    peak_y: list[float]


def roofline_ceilings(
    peak_flops: float | None, mem_bw_bytes_s: float | None, x_lo: float, x_hi: float
) -> RoofLines | None:
    """The roof of a device's ``peak_flops`` (FLOP/s) and a memory bandwidth (bytes/s) over
    the intensity range ``[x_lo, x_hi]``; ``None`` without both. Every roofline figure (run,
    comparison, what-if) draws its ceilings from this."""
    peak, bw = to_float(peak_flops), to_float(mem_bw_bytes_s)
    if not peak or not bw or peak <= 0 or bw <= 0:
        return None
    ridge = peak / bw
    return RoofLines(
        ridge=ridge,
        memory_x=[x_lo, ridge],
        memory_y=[bw * x_lo, peak],
        peak_x=[ridge, x_hi],
        peak_y=[peak, peak],
    )


# ---------------------------------------------------------------------- request table


def request_rows(requests: pd.DataFrame) -> pd.DataFrame:
    """Per-request table of a run: :func:`~perfscope.analysis.metrics.per_request` (times in
    seconds) plus ``error`` text and ``is_warmup``; one derivation shared by the report and
    the dashboard."""
    import pandas as pd

    from perfscope.analysis.metrics import per_request

    if requests.empty:
        return pd.DataFrame(
            columns=[
                "request_id",
                "is_warmup",
                "ok",
                "prompt_tokens",
                "output_tokens",
                "ttft",
                "tpot",
                "e2e",
                "ntpot",
                "error",
            ]
        )
    frame = per_request(requests)
    err = requests.set_index("request_id")["error"]
    frame["error"] = frame["request_id"].map(err).where(lambda x: x.notna(), None)
    return frame
