"""The live progress view of ``perfscope run`` (rich Live on stderr, only on a terminal).

It polls :meth:`Recorder.live_counts` a few times a second, so the engine's threads pay
nothing beyond what the recorder already does. Progress is counted in output tokens as well
as requests: in batch mode requests finish together at the end, tokens arrive throughout.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from perfscope.analysis.catalogue import format_count, format_ratio, format_seconds, format_si
from perfscope.api.runner import ProgressHook
from perfscope.profiler.recorder import LiveCounts, Recorder

__all__ = [
    "LiveProgress",
    "ProgressState",
    "RateEstimator",
    "format_duration",
    "progress_hook",
    "render_progress",
]


@dataclass(frozen=True)
class ProgressState:
    """One frame of the view: the recorder's counts, the workload's size, elapsed seconds."""

    counts: LiveCounts
    total_requests: int
    total_output_tokens: int
    elapsed_s: float
    #: Output tokens per second, smoothed (:class:`RateEstimator`); None: the mean so far.
    smoothed_tok_s: float | None = None


def format_duration(seconds: float | None) -> str:
    """A time left as people say it: ``42 s``, ``3 min 20 s``, ``51 min``, ``2 h 05 min``."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


@dataclass
class RateEstimator:
    """Output tokens per second, exponentially smoothed over the last ``tau_s`` seconds.

    The mean rate since the start is pessimistic mid-run (the first seconds are model
    warm-up and prefill of a whole batch, with few tokens out) and blind to the tail (the
    last requests decode in a shrinking batch, slower). The smoothed rate follows the
    current phase, so the ETA tracks both; :attr:`rate` is None for the first few seconds.
    """

    tau_s: float = 15.0
    _t: float | None = None
    _tokens: int = 0
    _rate: float | None = None
    _warm_s: float = 0.0

    def update(self, t_s: float, tokens: int) -> float | None:
        """Feed the elapsed seconds and the output tokens so far; the smoothed tok/s."""
        if self._t is None:
            self._t, self._tokens = t_s, tokens
            return None
        dt = t_s - self._t
        if dt <= 0:
            return self._rate
        inst = max(0, tokens - self._tokens) / dt
        if self._rate is None:
            self._rate = inst if tokens > 0 else None
        else:
            a = 1.0 - math.exp(-dt / self.tau_s)
            self._rate = a * inst + (1 - a) * self._rate
        self._warm_s += dt
        self._t, self._tokens = t_s, tokens
        return self._rate

    @property
    def rate(self) -> float | None:
        """The smoothed rate once a few seconds have been seen (None before)."""
        return self._rate if self._warm_s >= min(5.0, self.tau_s) else None


def _median(xs: tuple[float, ...]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    n = len(s)
    return float(s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2]))


def _eta_s(state: ProgressState) -> float | None:
    """Seconds left: output tokens left over the smoothed token rate (the mean so far
    until the smoothed rate exists)."""
    c = state.counts
    done = c.output_tokens
    if done <= 0 or state.elapsed_s <= 0 or state.total_output_tokens <= 0:
        return None
    left = max(0, state.total_output_tokens - done)
    rate = state.smoothed_tok_s or done / state.elapsed_s
    return left / rate if rate > 0 else None


def render_progress(state: ProgressState, width: int = 80) -> RenderableType:
    """The view of one frame: a token bar, then request counts, rates and latencies so far,
    laid out in as many lines as ``width`` needs (nothing is cut)."""
    c = state.counts
    share = c.output_tokens / state.total_output_tokens if state.total_output_tokens else 0.0
    bar_width = max(10, min(40, width - 30))
    bar = Table.grid(padding=(0, 1))
    bar.add_row(
        Text("tokens", style="bold"),
        ProgressBar(total=1.0, completed=min(1.0, share), width=bar_width),
        Text(
            f"{format_count(c.output_tokens)} / ≤{format_count(state.total_output_tokens)} "
            f"({format_ratio(min(1.0, share))})"
        ),
    )
    tok_s = c.output_tokens / state.elapsed_s if state.elapsed_s > 0 else None
    eta = _eta_s(state)
    fields: list[str | Text] = [
        f"requests {format_count(c.completed)}/{format_count(state.total_requests)} done",
        f"{format_count(c.in_flight)} in flight ({format_count(c.waiting)} before a first token)"
        if c.waiting
        else f"{format_count(c.in_flight)} in flight",
        Text(f"{format_count(c.failed)} failed", style="red" if c.failed else ""),
        f"{format_si(tok_s, 'tok/s')}" if tok_s is not None else "tok/s n/a",
        f"TTFT p50 {format_seconds(_median(c.ttft_s))}" if c.ttft_s else "TTFT p50 (none yet)",
        f"ITL p50 {format_seconds(_median(c.itl_s))}" if c.itl_s else "ITL p50 (none yet)",
        f"elapsed {format_seconds(state.elapsed_s)}",
        f"ETA {format_duration(eta)}" if eta is not None else "ETA (after the first token)",
    ]
    lines: list[Text] = []
    line = Text()
    for f in fields:
        t = f if isinstance(f, Text) else Text(f)
        if line.cell_len and line.cell_len + 3 + t.cell_len > width:
            lines.append(line)
            line = Text()
        if line.cell_len:
            line.append(" · ", style="dim")
        line.append_text(t)
    if line.cell_len:
        lines.append(line)
    return Group(bar, *lines)


class LiveProgress(ProgressHook):
    """A :class:`ProgressHook` that draws :func:`render_progress` with rich Live, four
    frames a second, and removes it when capture ends."""

    def __init__(self, console: Console, refresh_per_second: float = 4.0) -> None:
        self.console = console
        self.refresh = refresh_per_second
        self.recorder: Recorder | None = None
        self.total_tokens = 0
        self.total_requests = 0
        self.t0 = 0.0
        self.live: Live | None = None
        self.rate = RateEstimator()

    def on_watch(self, recorder: Recorder, total_output_tokens: int) -> None:
        self.recorder = recorder
        self.total_tokens = total_output_tokens

    def state(self) -> ProgressState:
        """The current frame's data."""
        assert self.recorder is not None
        counts = self.recorder.live_counts()
        elapsed = time.monotonic() - self.t0
        self.rate.update(elapsed, counts.output_tokens)
        return ProgressState(
            counts=counts,
            total_requests=self.total_requests,
            total_output_tokens=self.total_tokens,
            elapsed_s=elapsed,
            smoothed_tok_s=self.rate.rate,
        )

    def __rich__(self) -> RenderableType:
        if self.recorder is None:
            return Text("starting…")
        return render_progress(self.state(), self.console.width)

    def on_start(self, total_requests: int) -> None:
        self.total_requests = total_requests
        self.t0 = time.monotonic()
        self.live = Live(
            self,
            console=self.console,
            refresh_per_second=self.refresh,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.live.start()

    def on_end(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def progress_hook(err: Console, disabled: bool) -> ProgressHook:
    """The live view on a terminal; a silent hook when ``disabled`` or stderr is not one."""
    if disabled or not err.is_terminal:
        return ProgressHook()
    return LiveProgress(err)
