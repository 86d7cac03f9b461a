"""Workloads are reproducible and drivers deliver the arrival pattern asked for."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from perfscope.errors import WorkloadError
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.driver import Driver, LoadConfig, arrival_offsets_ns
from perfscope.profiler.engines.base import EngineInfo, Inbox, PerRequestEngine
from perfscope.profiler.recorder import Recorder, RequestHandle
from perfscope.profiler.records import RequestSpec
from perfscope.profiler.workload import WorkloadConfig, build_workload, parse_length


def test_length_distributions_parse_and_sample_within_bounds() -> None:
    rng = np.random.default_rng(0)
    assert parse_length("128").sample(rng, 3).tolist() == [128, 128, 128]
    u = parse_length("uniform:64:256").sample(rng, 1000)
    assert u.min() >= 64 and u.max() <= 256 and abs(u.mean() - 160) < 8
    n = parse_length("normal:128:32").sample(rng, 2000)
    assert n.min() >= 1 and abs(n.mean() - 128) < 3 and abs(n.std() - 32) < 3


@pytest.mark.parametrize("text", ["abc", "0", "uniform:5", "normal:0:1", "zipf:1:2", "-4"])
def test_bad_lengths_are_workload_errors(text: str) -> None:
    with pytest.raises(WorkloadError):
        parse_length(text)


def test_workloads_are_reproducible_from_the_seed() -> None:
    cfg = WorkloadConfig(requests=50, prompt_len=parse_length("uniform:1:1000"), seed=7)
    assert build_workload(cfg) == build_workload(cfg)
    other = build_workload(
        WorkloadConfig(requests=50, prompt_len=parse_length("uniform:1:1000"), seed=8)
    )
    assert other != build_workload(cfg)


def test_warmup_requests_come_first_and_are_marked() -> None:
    specs = build_workload(WorkloadConfig(requests=5, warmup=2))
    assert [s.is_warmup for s in specs] == [True, True, False, False, False, False, False]
    assert [s.request_id for s in specs] == list(range(7))


def test_jsonl_prompts_give_text_token_ids_and_lengths(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(
        "\n".join(
            [
                json.dumps({"prompt": "hello world", "output_tokens": 5}),
                json.dumps({"prompt_tokens": 40}),
                json.dumps({"prompt_token_ids": [1, 2, 3]}),
                "",
            ]
        )
    )
    specs = build_workload(
        WorkloadConfig(requests=None, prompts_file=f, output_len=parse_length("9"))
    )
    assert [(s.prompt_tokens, s.max_output_tokens) for s in specs] == [(11, 5), (40, 9), (3, 9)]
    assert specs[0].prompt == "hello world"
    assert specs[2].prompt_token_ids == (1, 2, 3)


def test_malformed_jsonl_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{broken\n')
    with pytest.raises(WorkloadError, match=r"p.jsonl:2: not valid JSON"):
        build_workload(WorkloadConfig(prompts_file=f))
    f.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(WorkloadError, match=r":1: each line needs 'prompt'"):
        build_workload(WorkloadConfig(prompts_file=f))


def test_poisson_and_gamma_gaps_have_the_requested_mean_and_burstiness() -> None:
    n = 20000
    pois = np.diff(arrival_offsets_ns(LoadConfig(mode="online", rate=100.0), n)) / 1e9
    assert pois.mean() == pytest.approx(0.01, rel=0.03)
    assert pois.std() / pois.mean() == pytest.approx(1.0, rel=0.05)  # CV of an exponential
    bursty = (
        np.diff(
            arrival_offsets_ns(
                LoadConfig(mode="online", rate=100.0, arrival="gamma", burstiness=0.25), n
            )
        )
        / 1e9
    )
    assert bursty.mean() == pytest.approx(0.01, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.08)  # CV = 1/sqrt(shape)
    const = np.diff(
        arrival_offsets_ns(LoadConfig(mode="online", rate=50.0, arrival="constant"), 10)
    )
    assert np.all(const == 20_000_000)


class _Sleeper(PerRequestEngine):
    """Each request takes 30 ms; tracks the most requests in flight at once.

    With ``gather=N`` the first requests also wait (up to 10 s) until N are in flight
    together, so a loaded machine that runs one request to its end before the driver hands
    over the next cannot hide whether the driver sends N at once.
    """

    def __init__(self, gather: int = 0) -> None:
        self.active = 0
        self.peak = 0
        self.gather = gather
        self.cond = threading.Condition()

    def info(self) -> EngineInfo:
        return EngineInfo(uri="test", kind="test")

    def generate(self, spec: RequestSpec, handle: RequestHandle) -> None:
        with self.cond:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.peak >= self.gather, timeout=10.0)
        time.sleep(0.03)
        handle.tokens(1)
        with self.cond:
            self.active -= 1


def _drive(load: LoadConfig, n: int, warmup: int = 0, gather: int = 0) -> tuple[_Sleeper, Recorder]:
    specs = build_workload(WorkloadConfig(requests=n, warmup=warmup))
    engine = _Sleeper(gather)
    recorder = Recorder(MonotonicClock())
    inbox = Inbox()
    driver = Driver(specs, load, inbox, recorder)
    driver.start()
    engine.serve(inbox, recorder)
    driver.join()
    assert driver.error is None
    return engine, recorder


def test_closed_loop_never_exceeds_its_concurrency() -> None:
    engine, rec = _drive(LoadConfig(mode="online", concurrency=3), 12, gather=3)
    assert engine.peak == 3
    assert rec.n_finished == 12


def test_batch_mode_submits_everything_at_once() -> None:
    engine, rec = _drive(LoadConfig(mode="batch"), 10, gather=10)
    reqs = rec.requests_table().to_pandas()
    assert (reqs["t_scheduled"] == reqs["t_scheduled"].iloc[0]).all()
    assert engine.peak == 10


def test_open_loop_sends_on_schedule_with_small_driver_lag() -> None:
    _, rec = _drive(LoadConfig(mode="online", rate=200.0, arrival="constant"), 20)
    reqs = rec.requests_table().to_pandas().sort_values("request_id")
    gaps = np.diff(reqs["t_scheduled"].to_numpy())
    assert np.all(gaps == 5_000_000)
    lag = (reqs["t_sent"] - reqs["t_scheduled"]).to_numpy()
    assert np.median(lag) < 2_000_000  # 2 ms, generous for a shared 2-core machine


def test_rate_with_a_concurrency_cap_keeps_the_schedule_but_never_exceeds_the_cap() -> None:
    # 1,000 req/s of 30 ms requests would put ~30 in flight; the cap holds it at 2.
    engine, rec = _drive(
        LoadConfig(mode="online", rate=1000.0, concurrency=2, arrival="constant"), 8
    )
    assert engine.peak == 2
    assert rec.n_finished == 8
    reqs = rec.requests_table().to_pandas().sort_values("request_id")
    assert np.all(np.diff(reqs["t_scheduled"].to_numpy()) == 1_000_000)  # planned arrivals
    lag = (reqs["t_sent"] - reqs["t_scheduled"]).to_numpy()
    assert lag[-1] > 50_000_000  # the last one waited for two 30 ms slots to free up, twice+


def test_a_low_rate_under_the_cap_is_a_plain_open_loop() -> None:
    engine, rec = _drive(LoadConfig(mode="online", rate=20.0, concurrency=4, arrival="constant"), 5)
    assert engine.peak == 1  # 50 ms gaps, 30 ms requests: never two at once
    reqs = rec.requests_table().to_pandas()
    assert (reqs["t_sent"] - reqs["t_scheduled"]).max() < 20_000_000


def test_measured_requests_start_after_warmup_requests_finished() -> None:
    _, rec = _drive(LoadConfig(mode="batch"), 4, warmup=2)
    reqs = rec.requests_table().to_pandas()
    warm = reqs[reqs["is_warmup"]]
    measured = reqs[~reqs["is_warmup"]]
    assert measured["t_scheduled"].min() >= warm["t_last_token"].max()


def test_load_config_rejects_contradictions() -> None:
    for bad, msg in [
        (LoadConfig(mode="online"), "needs --rate"),
        (LoadConfig(mode="batch", rate=1.0), "need --mode online"),
        (LoadConfig(mode="online", rate=float("inf")), "positive"),
        (LoadConfig(mode="online", rate=1.0, arrival="gamma", burstiness=0), "burstiness"),
    ]:
        with pytest.raises(WorkloadError, match=msg):
            bad.validate()
