"""Measured latencies of an engine with known timing match the truth."""

from __future__ import annotations

import importlib
import itertools
from pathlib import Path

import pytest

from perfscope._run import load_run
from perfscope._runner import RunOptions, execute_run
from perfscope.profiler.driver import LoadConfig
from perfscope.profiler.workload import LengthDist, WorkloadConfig

pytestmark = pytest.mark.usefixtures("engines_on_path")

TTFT, PER_TOKEN = 0.050, 0.010
OUTPUT = 31  # 1 + 10 chunks of 3


def _truth() -> dict[int, list[int]]:
    """The test engines' own timestamps (the module is importable once the fixture ran)."""
    module = importlib.import_module("timed_engines")
    truth: dict[int, list[int]] = module.TRUTH
    return truth


def _run(engine: str, runs_dir: Path, concurrency: int = 2, requests: int = 8) -> dict:
    _truth().clear()
    opts = RunOptions(
        engine=engine,
        workload=WorkloadConfig(
            requests=requests,
            prompt_len=LengthDist("constant", 16),
            output_len=LengthDist("constant", OUTPUT),
        ),
        load=LoadConfig(mode="online", concurrency=concurrency),
        runs_dir=runs_dir,
    )
    out = execute_run(opts)
    assert out.status == "complete"
    return out.summary


@pytest.mark.parametrize(
    "engine", ["python:timed_engines:single_tokens", "python:timed_engines:triple_chunks"]
)
def test_ttft_tpot_and_per_token_itl_match_known_sleeps_within_1ms(
    engine: str, runs_dir: Path
) -> None:
    s = _run(engine, runs_dir)
    lat = s["latency"]
    assert lat["ttft"]["p50"] == pytest.approx(TTFT, abs=1e-3)
    assert lat["tpot"]["p50"] == pytest.approx(PER_TOKEN, abs=1e-3)
    assert lat["itl_per_token"]["p50"] == pytest.approx(PER_TOKEN, abs=1e-3)
    chunk_gap = PER_TOKEN * (3 if "triple" in engine else 1)
    assert lat["itl"]["p50"] == pytest.approx(chunk_gap, abs=1e-3)
    assert s["counts"]["output_tokens"] == 8 * OUTPUT


@pytest.mark.parametrize(
    "engine", ["python:timed_engines:single_tokens", "python:timed_engines:triple_chunks"]
)
def test_every_request_matches_the_engines_own_clock_within_1ms(
    engine: str, runs_dir: Path
) -> None:
    # Sleeps overshoot on a busy machine; the engine's own timestamps are the truth that
    # perfscope's measurement must match, request by request.
    s = _run(engine, runs_dir)
    run = load_run(Path(runs_dir) / s["run_id"])
    reqs = run.requests.set_index("request_id")
    for rid, stamps in _truth().items():
        start, first, last = stamps[0], stamps[1], stamps[-1]
        r = reqs.loc[rid]
        assert (r["t_first_token"] - r["t_sent"]) / 1e9 == pytest.approx(
            (first - start) / 1e9, abs=1e-3
        )
        assert (r["t_last_token"] - r["t_sent"]) / 1e9 == pytest.approx(
            (last - start) / 1e9, abs=1e-3
        )
        chunks = run.chunks[run.chunks["request_id"] == rid].sort_values("t")
        measured_gaps = chunks["t"].diff().dropna().to_numpy() / 1e9
        true_gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(stamps[1:])]
        assert max(abs(m - t) for m, t in zip(measured_gaps, true_gaps, strict=True)) < 1e-3


def test_throughput_matches_known_request_time_within_2_percent(runs_dir: Path) -> None:
    s = _run("python:timed_engines:triple_chunks", runs_dir, concurrency=2, requests=8)
    # Closed loop of 2 users, 8 requests: 4 back-to-back requests per user; the truth is the
    # engine's own request durations.
    per_user = sorted((st[-1] - st[0]) / 1e9 for st in _truth().values())
    truth_window = sum(per_user) / 2
    truth_tok_s = 8 * OUTPUT / truth_window
    assert s["throughput"]["output_tok_s"] == pytest.approx(truth_tok_s, rel=0.02)
    e2e = TTFT + (OUTPUT - 1) * PER_TOKEN
    assert s["throughput"]["req_s"] == pytest.approx(8 / (4 * e2e), rel=0.05)
