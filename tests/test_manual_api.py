"""The manual API: instrument any engine by hand and get a stored, analysed run."""

from __future__ import annotations

from pathlib import Path

import pytest

import perfscope
from perfscope.analysis.summary import ErrorCount
from perfscope.profiler.clock import ManualClock

MS = 1_000_000


def test_manual_requests_with_an_injected_clock_give_exact_metrics(runs_dir: Path) -> None:
    clock = ManualClock()
    with perfscope.profile(
        name="by-hand", runs_dir=runs_dir, clock=clock, slos={"ttft": 0.05}
    ) as p:
        for _ in range(2):
            with p.request(prompt_tokens=16) as r:
                clock.advance_ns(40 * MS)
                r.tokens(1)
                for _ in range(4):
                    clock.advance_ns(20 * MS)
                    r.tokens(2)
    run = p.run
    assert run.status == "complete"
    assert run.ttft.p50 == pytest.approx(0.040)
    assert run.tpot.p50 == pytest.approx(0.080 / 8)
    assert run.itl_per_token.p50 == pytest.approx(0.010)
    assert run.counts.output_tokens == 18
    assert run.goodput.attainment == 1.0
    assert run.path.parent == runs_dir


def test_steps_recorded_by_hand_are_stored(runs_dir: Path) -> None:
    with perfscope.profile(runs_dir=runs_dir) as p, p.request(prompt_tokens=4) as r:
        with p.step("prefill", batch_size=1, new_tokens=4):
            pass
        r.tokens(1)
        with p.step("decode", batch_size=1, new_tokens=1, context_tokens=4):
            pass
        r.tokens(1)
    steps = p.run.steps
    assert list(steps["kind"]) == ["prefill", "decode"]
    assert p.run.summary["steps"]["decode"]["context_tokens"] == 4


def test_an_exception_inside_a_request_marks_it_failed_and_is_raised(runs_dir: Path) -> None:
    with perfscope.profile(runs_dir=runs_dir) as p:
        with p.request(prompt_tokens=4) as r:
            r.tokens(1)
        with pytest.raises(RuntimeError), p.request(prompt_tokens=4) as r:
            r.tokens(1)
            raise RuntimeError("engine crashed")
    assert p.run.counts.failed == 1
    assert p.run.errors == [ErrorCount(error="RuntimeError: engine crashed", count=1)]


def test_an_exception_out_of_the_profile_block_still_stores_the_run(runs_dir: Path) -> None:
    p = perfscope.profile(runs_dir=runs_dir)
    with pytest.raises(ValueError, match="boom"), p:
        with p.request(prompt_tokens=1) as r:
            r.tokens(3)
        raise ValueError("boom")
    assert p.run.status == "failed"
    assert p.run.counts.completed == 1
    assert "ValueError: boom" in p.run.manifest["errors"][0]


def test_load_run_reads_back_by_path_and_as_latest(runs_dir: Path) -> None:
    with perfscope.profile(runs_dir=runs_dir) as p, p.request(prompt_tokens=1) as r:
        r.tokens(1)
    again = perfscope.load_run(p.run.path)
    assert again.summary == p.run.summary
    assert perfscope.load_run("latest", runs_dir=runs_dir).path == p.run.path
    with pytest.raises(AttributeError, match="p42"):
        _ = again.ttft.p42  # type: ignore[attr-defined]


def test_run_sections_read_naturally_with_short_names(runs_dir: Path) -> None:
    run = perfscope.load_run(_reference_run(runs_dir))
    assert run.roofline.decode.mbu == run.summary.roofline.phases["decode"].mbu
    assert run.roofline.decode.verdict in {"compute-bound", "memory-bound", "overhead-bound"}
    # No energy counter on this machine: the short name explains why instead of guessing.
    if run.summary.energy.available:
        assert run.energy.j_per_token == run.summary.energy.j_per_output_token
    else:
        with pytest.raises(AttributeError, match="energy is not available"):
            _ = run.energy.j_per_token


def _reference_run(runs_dir: Path) -> Path:
    run = perfscope.run(
        "reference", requests=4, prompt_len=8, output_len=4, model_preset="tiny", runs_dir=runs_dir
    )
    return run.path
