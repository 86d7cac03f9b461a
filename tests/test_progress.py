"""The live progress view: what the recorder reports while a run goes on, how it is drawn,
and that it stays quiet when stderr is not a terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from perfscope.api.runner import ProgressHook, RunOptions, execute_run
from perfscope.cli.progress import (
    LiveProgress,
    ProgressState,
    RateEstimator,
    format_duration,
    progress_hook,
    render_progress,
)
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.engines.base import EngineOptions
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec
from perfscope.profiler.telemetry import TelemetryConfig
from perfscope.profiler.workload import LengthDist, WorkloadConfig


def _spec(i: int) -> RequestSpec:
    return RequestSpec(request_id=i, prompt_tokens=4, max_output_tokens=10)


def test_live_counts_separate_done_failed_and_in_flight_and_sum_tokens() -> None:
    rec = Recorder(MonotonicClock())
    done, failed, open_ = (rec.add_request(_spec(i)) for i in range(3))
    for h in (done, failed, open_):
        h.sent()
    done.tokens(1)
    done.tokens(3)
    done.finish()
    failed.finish(error="boom")
    open_.tokens(2)
    c = rec.live_counts()
    assert (c.registered, c.completed, c.failed, c.in_flight, c.waiting) == (3, 1, 1, 1, 0)
    assert c.output_tokens == 6
    assert len(c.ttft_s) == 2  # the two requests with a first token
    assert len(c.itl_s) == 1 and c.itl_s[0] >= 0  # only one has two tokens or more


def test_the_view_shows_tokens_requests_latency_and_eta_without_cutting() -> None:
    rec = Recorder(MonotonicClock())
    h = rec.add_request(_spec(0))
    h.sent()
    h.tokens(1)
    h.tokens(1)
    state = ProgressState(
        counts=rec.live_counts(), total_requests=48, total_output_tokens=6144, elapsed_s=2.0
    )
    for width in (60, 80, 120):
        console = Console(width=width, record=True, file=io.StringIO())
        console.print(render_progress(state, width))
        text = console.export_text()
        assert "…" not in text
        assert max(len(line) for line in text.splitlines()) <= width
        for word in ("2 / ≤6,144", "0/48 done", "1 in flight", "0 failed", "1 tok/s"):
            assert word in " ".join(text.split()), (word, text)
        assert "TTFT p50" in text and "ITL p50" in text
        assert "ETA 1 h 42 min" in " ".join(text.split())  # 6,142 tokens left at 1 tok/s


def test_progress_is_quiet_when_stderr_is_not_a_terminal() -> None:
    pipe = Console(file=io.StringIO(), force_terminal=False)
    assert type(progress_hook(pipe, disabled=False)) is ProgressHook
    tty = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(progress_hook(tty, disabled=False), LiveProgress)
    assert type(progress_hook(tty, disabled=True)) is ProgressHook


def test_a_real_run_drives_the_live_view_to_its_totals(tmp_path: Path) -> None:
    out = io.StringIO()
    hook = LiveProgress(Console(file=out, force_terminal=True, width=100), refresh_per_second=20)
    opts = RunOptions(
        engine="reference",
        workload=WorkloadConfig(
            requests=4, prompt_len=LengthDist("constant", 8), output_len=LengthDist("constant", 6)
        ),
        engine_options=EngineOptions(batch_size=2, model_preset="tiny", device="cpu"),
        telemetry=TelemetryConfig(enabled=False),
        runs_dir=tmp_path,
    )
    outcome = execute_run(opts, hook)
    assert outcome.status == "complete"
    final = hook.state()
    assert final.total_requests == 4 and final.total_output_tokens == 24
    assert final.counts.completed == 4 and final.counts.in_flight == 0
    assert final.counts.output_tokens == 24
    assert "tokens" in out.getvalue()  # at least one frame was drawn


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(42.4, "42 s"), (200, "3 min 20 s"), (3076, "51 min"), (7500, "2 h 05 min"), (None, "n/a")],
)
def test_the_eta_reads_as_a_duration(seconds: float | None, said: str) -> None:
    assert format_duration(seconds) == said


def test_the_eta_follows_the_current_rate_not_the_mean_since_the_start() -> None:
    # 20 s of prefill at 5 tok/s, then decode at 50 tok/s for 40 s: the mean since the start
    # (about 35 tok/s) would overstate what is left by ~40%; the smoothed rate is near 50.
    est = RateEstimator(tau_s=10.0)
    tokens = 0
    for t in range(61):
        est.update(float(t), tokens)
        tokens += 5 if t < 20 else 50
    assert est.rate is not None and 45 < est.rate <= 50


def test_the_view_takes_its_eta_from_the_smoothed_rate() -> None:
    rec = Recorder(MonotonicClock())
    h = rec.add_request(_spec(0))
    h.sent()
    h.tokens(1)
    h.tokens(1)
    state = ProgressState(
        counts=rec.live_counts(),
        total_requests=48,
        total_output_tokens=6144,
        elapsed_s=2.0,
        smoothed_tok_s=2.0,  # the mean is 1 tok/s; the current rate twice that
    )
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(render_progress(state, 120))
    assert "ETA 51 min" in " ".join(console.export_text().split())  # 6,142 tokens at 2 tok/s


def test_the_estimator_says_nothing_before_it_has_seen_a_few_seconds() -> None:
    est = RateEstimator(tau_s=15.0)
    est.update(0.0, 0)
    est.update(1.0, 10)
    assert est.rate is None
