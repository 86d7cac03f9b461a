"""The live progress view of ``perfscope run`` (rich Live on stderr, only on a terminal).

It polls :meth:`Recorder.live_counts` a few times a second, so the engine's threads pay
nothing beyond what the recorder already does. Progress is counted in output tokens as well
as requests: in batch mode requests finish together at the end, tokens arrive throughout.
"""

from __future__ import annotations

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

__all__ = ["LiveProgress", "ProgressState", "progress_hook", "render_progress"]


@dataclass(frozen=True)
class ProgressState:
    """One frame of the view: the recorder's counts, the workload's size, elapsed seconds."""

    counts: LiveCounts
    total_requests: int
    total_output_tokens: int
    elapsed_s: float


def _median(xs: tuple[float, ...]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    n = len(s)
    return float(s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2]))


def _eta_s(state: ProgressState) -> float | None:
    """Seconds left, from the token rate so far (tokens are the finer measure of work)."""
    c = state.counts
    done = c.output_tokens
    if done <= 0 or state.elapsed_s <= 0 or state.total_output_tokens <= 0:
        return None
    left = max(0, state.total_output_tokens - done)
    return left / (done / state.elapsed_s)


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
        f"ETA {format_seconds(eta)}" if eta is not None else "ETA (after the first token)",
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

    def on_watch(self, recorder: Recorder, total_output_tokens: int) -> None:
        self.recorder = recorder
        self.total_tokens = total_output_tokens

    def state(self) -> ProgressState:
        """The current frame's data."""
        assert self.recorder is not None
        return ProgressState(
            counts=self.recorder.live_counts(),
            total_requests=self.total_requests,
            total_output_tokens=self.total_tokens,
            elapsed_s=time.monotonic() - self.t0,
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
