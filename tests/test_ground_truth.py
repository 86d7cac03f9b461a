"""Measured latencies of an engine with known timing match the truth."""

from __future__ import annotations

from pathlib import Path

import pytest
from perfscope.profiler.driver import LoadConfig
from perfscope.profiler.workload import LengthDist, WorkloadConfig

from perfscope._runner import RunOptions, execute_run

TTFT, PER_TOKEN = 0.050, 0.010
OUTPUT = 31  # 1 + 10 chunks of 3


def _run(engine: str, runs_dir: Path, concurrency: int = 2, requests: int = 8) -> dict:
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


@pytest.mark.usefixtures("engines_on_path")
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
    e2e = TTFT + (OUTPUT - 1) * PER_TOKEN
    assert lat["e2e"]["p50"] == pytest.approx(e2e, abs=2e-3)
    assert s["counts"]["output_tokens"] == 8 * OUTPUT


@pytest.mark.usefixtures("engines_on_path")
def test_throughput_matches_known_request_time_within_2_percent(runs_dir: Path) -> None:
    s = _run("python:timed_engines:triple_chunks", runs_dir, concurrency=2, requests=8)
    e2e = TTFT + (OUTPUT - 1) * PER_TOKEN
    # Closed loop of 2 users, 8 requests: 4 back-to-back requests per user.
    truth_tok_s = 8 * OUTPUT / (4 * e2e)
    assert s["throughput"]["output_tok_s"] == pytest.approx(truth_tok_s, rel=0.02)
    assert s["throughput"]["req_s"] == pytest.approx(8 / (4 * e2e), rel=0.02)
