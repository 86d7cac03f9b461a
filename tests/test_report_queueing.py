"""Batch-mode runs say that TTFT includes queueing, with the queue time beside it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from perfscope.analysis import Summary
from perfscope.cli.render import summary_view
from perfscope.dashboard.queueing import batch_queueing, queueing_line
from perfscope.dashboard.report import render_report
from perfscope.profiler.store import read_run
from tests.data.runs.builders import complete_run


@pytest.fixture(scope="module")
def batch_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return complete_run(tmp_path_factory.mktemp("queue-runs"))


@pytest.mark.slow
def test_queue_time_is_the_wait_before_the_first_forward_pass(batch_run: Path) -> None:
    q = batch_queueing(batch_run)
    assert q is not None and q.count == 8
    # 8 requests arrive at once into a batch of 4: the second four wait for a slot, so the
    # queue is real and part of TTFT, never more than it.
    assert q.queue_p90_s > 0 and q.queue_p50_s <= q.ttft_p50_s


@pytest.mark.slow
def test_the_queue_time_of_a_run_in_memory_is_the_one_read_from_its_directory(
    batch_run: Path,
) -> None:
    in_memory = batch_queueing(read_run(batch_run))
    assert in_memory is not None and in_memory == batch_queueing(batch_run)


@pytest.mark.slow
def test_the_terminal_summary_of_a_batch_run_names_the_queueing(batch_run: Path) -> None:
    run = read_run(batch_run)
    buf = io.StringIO()
    summary = Summary.from_dict(run.summary or {})
    Console(file=buf, width=120).print(summary_view(summary, batch_run))
    text = buf.getvalue()
    assert "TTFT includes queueing" in text and "queue p50" in text


@pytest.mark.slow
def test_the_report_of_a_batch_run_shows_the_queue_time(batch_run: Path) -> None:
    html = render_report(read_run(batch_run))
    assert 'id="queueing"' in html and "queue p50" in html


def test_runs_at_a_rate_carry_no_queueing_caveat(tmp_path: Path) -> None:
    assert queueing_line("rate", tmp_path) is None
    assert queueing_line("concurrency", tmp_path) is None


def test_a_batch_run_without_steps_says_the_wait_is_not_measured(tmp_path: Path) -> None:
    line = queueing_line("batch", tmp_path)
    assert line is not None and "not measured separately" in line
