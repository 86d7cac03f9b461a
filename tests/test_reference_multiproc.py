"""The reference engine in worker processes: prefill/decode disaggregation and replicas."""

from __future__ import annotations

import os
import signal
import time

import pytest

from perfscope.analysis.calibration import technique_of_change
from perfscope.analysis.costmodel import kv_bytes_per_token
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.study import _scheduling_projection
from perfscope.api.study import APPLIES, KNOBS
from perfscope.errors import UsageError
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.engines.base import EngineOptions, Inbox, create_engine
from perfscope.profiler.engines.reference.multiproc import MultiProcessEngine, kv_handoff_bytes
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec
from tests.test_reference_scheduling import serve_reference

SPECS = [RequestSpec(i, 6 + 5 * i, 5) for i in range(5)]


def _engine(**extra: str) -> MultiProcessEngine:
    opts = EngineOptions(
        model_preset="tiny", batch_size=2, max_seq_len=64, device="cpu", extra=extra
    )
    engine = create_engine("reference", opts)
    assert isinstance(engine, MultiProcessEngine)
    return engine


def _gone(pids: list[int], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped already
                continue
            if done == 0:
                alive.append(pid)
        if not alive:
            return True
        time.sleep(0.05)
    return False


def test_disaggregated_engine_gives_the_single_engines_tokens_and_hands_over_the_kv_cache() -> None:
    single, _, _ = serve_reference(SPECS, 2)
    split, recorder, info = serve_reference(SPECS, 2, disaggregate="on")
    assert split == single
    spec = ModelSpec.from_dict(dict(info.model or {}))
    handoff = info.config["handoff"]
    assert handoff["requests"] == len(SPECS)
    for row, s in zip(handoff["per_request"], SPECS, strict=True):
        predicted = kv_bytes_per_token(spec) * s.prompt_tokens  # 2 x L x K x h_d x b
        assert row["nbytes"] == predicted == 2 * 2 * 2 * 32 * s.prompt_tokens * 4
        assert row["copy_out_s"] > 0 and row["transit_s"] > 0 and row["copy_in_s"] > 0
    reqs = recorder.requests_table().to_pandas()
    assert (reqs["output_tokens"] == 5).all() and reqs["error"].isna().all()
    kinds = set(recorder.steps_table().to_pandas()["kind"])
    assert kinds == {"prefill", "decode"}


def test_replicas_serve_every_request_exactly_once_with_the_single_engines_tokens() -> None:
    single, _, _ = serve_reference(SPECS, 2)
    out, recorder, info = serve_reference(SPECS, 2, replicas="2")
    assert out == single
    counts = info.config["replica_requests"]
    assert sum(counts) == len(SPECS) and min(counts) >= 1
    steps = recorder.steps_table().to_pandas()
    prefilled = sorted(r for ids in steps[steps["kind"] == "prefill"]["request_ids"] for r in ids)
    assert prefilled == [s.request_id for s in SPECS]


def test_worker_processes_are_gone_after_close_and_after_a_worker_dies() -> None:
    engine = _engine(replicas="2", dispatch="round-robin")
    pids = [p.pid for p in engine._procs if p.pid is not None]
    engine.close()
    engine.close()  # idempotent
    assert _gone(pids)

    engine = _engine(disaggregate="on")
    pids = [p.pid for p in engine._procs if p.pid is not None]
    os.kill(pids[1], signal.SIGKILL)
    recorder = Recorder(MonotonicClock())
    inbox = Inbox()
    inbox.close()
    with pytest.raises(RuntimeError, match="worker process"):
        engine.serve(inbox, recorder)
    engine.close()
    assert _gone(pids)


@pytest.mark.parametrize(
    "extra",
    [
        {"disaggregate": "maybe"},
        {"replicas": "0"},
        {"replicas": "two"},
        {"replicas": "2", "dispatch": "random"},
        {"dispatch": "round-robin"},
        {"disaggregate": "on", "replicas": "2"},
        {"disaggregate": "on", "prefix_cache": "on"},
        {"disaggregate": "on", "max_batched_tokens": "64"},
        {"replicas": "2", "start_method": "thread"},
    ],
)
def test_bad_multiprocess_options_are_one_line_usage_errors(extra: dict[str, str]) -> None:
    with pytest.raises(UsageError) as err:
        _engine(**extra)
    assert "\n" not in str(err.value) and "--engine-opt" in str(err.value)


def test_study_knobs_project_disaggregation_by_the_what_if_and_replicas_by_the_cost_model() -> None:
    assert KNOBS["disaggregate"].parse("true") == "on" and KNOBS["replicas"].parse("2") == 2
    assert APPLIES["disaggregate"] == APPLIES["replicas"] == ("reference",)
    assert technique_of_change("disaggregate", "on") == "disaggregation"
    assert technique_of_change("replicas", "2") == "replicas"
    base = {"roofline": {"latency": {"decode_stall_share": 0.19}}}
    proj = _scheduling_projection(
        "disaggregate", base, base, batch=(4, 4), prompt_len=32, output_len=8
    )
    assert proj["ratios"]["tpot_s"] == pytest.approx(0.81)
    assert proj["ratios"]["ttft_s"] is None


def test_kv_handoff_bytes_follow_the_model_shape() -> None:
    from perfscope.profiler.engines.reference.model import PRESETS

    cfg = PRESETS["small"]
    assert kv_handoff_bytes(cfg, 10) == cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 10 * 4
