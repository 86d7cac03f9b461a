"""Measured latencies of an engine with known timing match the truth."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from perfscope.api.results import load_run
from perfscope.api.runner import RunOptions, execute_run
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


def _truth_metrics() -> dict[str, np.ndarray]:
    """TTFT, TPOT and chunk gaps as the engine itself saw them (seconds)."""
    ttft: list[float] = []
    tpot: list[float] = []
    gaps: list[float] = []
    for stamps in _truth().values():
        start, first, last = stamps[0], stamps[1], stamps[-1]
        ttft.append((first - start) / 1e9)
        tpot.append((last - first) / 1e9 / (OUTPUT - 1))
        g = np.diff(np.asarray(stamps[1:], dtype=np.int64)) / 1e9
        gaps.extend(g)
    return {"ttft": np.asarray(ttft), "tpot": np.asarray(tpot), "itl": np.asarray(gaps)}


@pytest.mark.parametrize(
    "engine", ["python:timed_engines:single_tokens", "python:timed_engines:triple_chunks"]
)
def test_ttft_tpot_and_per_token_itl_match_known_sleeps_within_1ms(
    engine: str, runs_dir: Path
) -> None:
    s = _run(engine, runs_dir)
    lat = s["latency"]
    truth = _truth_metrics()
    per_chunk = 3 if "triple" in engine else 1
    # The engine slept at least what it was told (how much longer is the machine's load) ...
    assert np.median(truth["ttft"]) >= TTFT * 0.999
    assert np.median(truth["tpot"]) >= PER_TOKEN * 0.999
    # ... and perfscope measured what the engine did, within 1 ms at p50.
    assert lat["ttft"]["p50"] == pytest.approx(np.median(truth["ttft"]), abs=1e-3)
    assert lat["tpot"]["p50"] == pytest.approx(np.median(truth["tpot"]), abs=1e-3)
    assert lat["itl"]["p50"] == pytest.approx(np.median(truth["itl"]), abs=1e-3)
    assert lat["itl_per_token"]["p50"] == pytest.approx(
        np.median(truth["itl"]) / per_chunk, abs=1e-3
    )
    assert s["counts"]["output_tokens"] == 8 * OUTPUT


@pytest.mark.parametrize(
    "engine", ["python:timed_engines:single_tokens", "python:timed_engines:triple_chunks"]
)
def test_every_request_matches_the_engines_own_clock(engine: str, runs_dir: Path) -> None:
    # Request by request, perfscope's stamps against the engine's own: the median error
    # is well under a millisecond; the tail is allowed the odd descheduled thread.
    s = _run(engine, runs_dir)
    run = load_run(Path(runs_dir) / s["run_id"])
    reqs = run.requests.set_index("request_id")
    errors: list[float] = []
    for rid, stamps in _truth().items():
        start, first, last = stamps[0], stamps[1], stamps[-1]
        r = reqs.loc[rid]
        errors.append((r["t_first_token"] - r["t_sent"]) - (first - start))
        errors.append((r["t_last_token"] - r["t_sent"]) - (last - start))
        chunks = run.chunks[run.chunks["request_id"] == rid].sort_values("t")
        measured_gaps = np.diff(chunks["t"].to_numpy())
        true_gaps = np.diff(np.asarray(stamps[1:], dtype=np.int64))
        assert len(measured_gaps) == len(true_gaps)
        errors.extend(measured_gaps - true_gaps)
    err_ms = np.abs(np.asarray(errors, dtype=float)) / 1e6
    assert np.median(err_ms) < 0.5, np.percentile(err_ms, [50, 90, 100])
    assert np.percentile(err_ms, 90) < 1.0, np.percentile(err_ms, [50, 90, 100])


def test_throughput_matches_the_engines_own_window_within_2_percent(runs_dir: Path) -> None:
    s = _run("python:timed_engines:triple_chunks", runs_dir, concurrency=2, requests=8)
    # Closed loop of 2 users, 8 requests. The truth is the engine's own window, from its
    # first request's start to its last token (how long the sleeps took, and the client's
    # gaps between a user's requests, are the machine's load and count on both sides).
    stamps = _truth().values()
    truth_window = (max(st[-1] for st in stamps) - min(st[0] for st in stamps)) / 1e9
    assert s["throughput"]["output_tok_s"] == pytest.approx(8 * OUTPUT / truth_window, rel=0.02)
    assert s["throughput"]["req_s"] == pytest.approx(8 / truth_window, rel=0.02)
