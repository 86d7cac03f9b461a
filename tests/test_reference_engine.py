"""The built-in reference engine: a correct model and a serving-style scheduler."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from perfscope.api.runner import RunOptions, execute_run
from perfscope.errors import UsageError
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.driver import Driver, LoadConfig
from perfscope.profiler.engines.base import EngineOptions, Inbox, create_engine
from perfscope.profiler.engines.reference import PRESETS, ReferenceConfig, ReferenceModel
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec
from perfscope.profiler.workload import LengthDist, WorkloadConfig

TINY = PRESETS["tiny"]


def test_parameter_count_formula_matches_the_built_model() -> None:
    for cfg in (TINY, PRESETS["small"], TINY.with_overrides(tied_embeddings=True)):
        model = ReferenceModel.build(cfg, seed=0)
        assert cfg.n_params() == sum(p.numel() for p in model.parameters())


def test_weights_are_reproducible_from_the_seed() -> None:
    a = ReferenceModel.build(TINY, seed=3)
    b = ReferenceModel.build(TINY, seed=3)
    c = ReferenceModel.build(TINY, seed=4)
    assert torch.equal(a.blocks[0].wq.weight, b.blocks[0].wq.weight)
    assert not torch.equal(a.blocks[0].wq.weight, c.blocks[0].wq.weight)


def test_decoding_with_the_kv_cache_equals_a_full_prefill() -> None:
    model = ReferenceModel.build(TINY, seed=0)
    prompt = torch.randint(1, TINY.vocab_size, (2, 12))
    cache = model.new_cache(2, 32)
    logits = model.prefill(prompt, cache)
    lengths = torch.tensor([12, 12])
    seq = prompt
    for _ in range(3):
        nxt = logits.argmax(-1)
        seq = torch.cat([seq, nxt.view(2, 1)], dim=1)
        logits = model.decode(nxt, cache, lengths)
        lengths += 1
    full = model.prefill(seq, model.new_cache(2, 32))
    torch.testing.assert_close(logits, full, rtol=1e-4, atol=1e-4)


def test_decode_rows_with_different_lengths_are_masked_independently() -> None:
    model = ReferenceModel.build(TINY, seed=0)
    a = torch.randint(1, TINY.vocab_size, (1, 5))
    b = torch.randint(1, TINY.vocab_size, (1, 9))
    cache = model.new_cache(2, 16)
    la = model.prefill(a, cache.view(0, 1)).argmax(-1)
    lb = model.prefill(b, cache.view(1, 1)).argmax(-1)
    batched = model.decode(torch.cat([la, lb]), cache, torch.tensor([5, 9]))
    alone_cache = model.new_cache(1, 16)
    model.prefill(b, alone_cache)
    alone = model.decode(lb, alone_cache, torch.tensor([9]))
    torch.testing.assert_close(batched[1:], alone, rtol=1e-4, atol=1e-4)


def test_bad_shapes_are_usage_errors_naming_the_field() -> None:
    with pytest.raises(UsageError, match="not divisible by n_kv_heads"):
        create_engine(
            "reference", EngineOptions(model_preset="tiny", model_overrides={"n_kv_heads": 3})
        )
    with pytest.raises(UsageError, match="unknown model preset 'huge'"):
        create_engine("reference", EngineOptions(model_preset="huge"))
    with pytest.raises(ValueError, match="must be positive"):
        ReferenceConfig(n_layers=0)


def _serve(specs: list[RequestSpec], **opts: object) -> tuple[Recorder, pd.DataFrame]:
    engine = create_engine("reference", EngineOptions(model_preset="tiny", max_seq_len=64, **opts))  # type: ignore[arg-type]
    recorder = Recorder(MonotonicClock())
    inbox = Inbox()
    driver = Driver(specs, LoadConfig(mode="batch"), inbox, recorder)
    driver.start()
    engine.serve(inbox, recorder)
    driver.join()
    return recorder, recorder.steps_table().to_pandas()


def test_continuous_batching_refills_free_slots_at_the_next_step() -> None:
    # Batch 2; request 0 wants 2 tokens, 1 and 2 want 6: request 2 joins once 0 leaves.
    specs = [RequestSpec(0, 8, 2), RequestSpec(1, 8, 6), RequestSpec(2, 8, 6)]
    rec, steps = _serve(specs, batch_size=2, scheduler="continuous")
    assert list(steps["kind"][:2]) == ["prefill", "decode"]
    prefill_of_2 = steps[(steps["kind"] == "prefill") & steps["request_ids"].map(lambda r: 2 in r)]
    assert prefill_of_2["step_id"].iloc[0] == 2  # right after request 0's only decode step
    decode = steps[steps["kind"] == "decode"]
    assert decode["batch_size"].max() == 2
    reqs = rec.requests_table().to_pandas()
    assert list(reqs["output_tokens"]) == [2, 6, 6]
    assert reqs["error"].isna().all()


def test_static_batching_waits_for_the_longest_request_of_the_batch() -> None:
    specs = [RequestSpec(0, 8, 2), RequestSpec(1, 8, 6), RequestSpec(2, 8, 6)]
    _, steps = _serve(specs, batch_size=2, scheduler="static")
    prefills = steps[steps["kind"] == "prefill"]
    # Request 2 is prefilled only after the first batch's 5 decode steps.
    assert list(prefills["step_id"]) == [0, 6]
    first_batch_decodes = steps[(steps["kind"] == "decode") & (steps["step_id"] < 6)]
    assert (first_batch_decodes["batch_size"] == 2).all()


def test_step_records_count_tokens_and_context_exactly() -> None:
    specs = [RequestSpec(i, 10, 4) for i in range(3)]
    _, steps = _serve(specs, batch_size=4)
    prefill = steps[steps["kind"] == "prefill"].iloc[0]
    assert (prefill["batch_size"], prefill["new_tokens"], prefill["context_tokens"]) == (3, 30, 0)
    decode = steps[steps["kind"] == "decode"]
    assert list(decode["new_tokens"]) == [3, 3, 3]
    # Context before each decode token: 10, 11, 12 per row.
    assert list(decode["context_tokens"]) == [30, 33, 36]


def test_prompts_of_different_lengths_are_prefilled_in_separate_unpadded_passes() -> None:
    specs = [RequestSpec(0, 8, 2), RequestSpec(1, 12, 2), RequestSpec(2, 8, 2)]
    _, steps = _serve(specs, batch_size=4)
    prefill = steps[steps["kind"] == "prefill"]
    assert sorted(prefill["new_tokens"]) == [12, 16]


def test_request_longer_than_the_cache_fails_alone() -> None:
    specs = [RequestSpec(0, 8, 4), RequestSpec(1, 60, 10)]
    rec, _ = _serve(specs, batch_size=2)
    reqs = rec.requests_table().to_pandas().set_index("request_id")
    assert pd.isna(reqs.loc[0, "error"])
    assert "exceeds max_seq_len" in reqs.loc[1, "error"]


def test_online_arrivals_queue_behind_a_full_batch_and_show_in_ttft(runs_dir) -> None:  # type: ignore[no-untyped-def]
    opts = RunOptions(
        workload=WorkloadConfig(
            requests=6, prompt_len=LengthDist("constant", 16), output_len=LengthDist("constant", 16)
        ),
        load=LoadConfig(mode="online", rate=1000.0, arrival="constant"),
        engine_options=EngineOptions(model_preset="tiny", batch_size=2),
        runs_dir=runs_dir,
    )
    s = execute_run(opts).summary
    ttft = s["latency"]["ttft"]
    # Requests 3..6 wait for a free slot, so the slowest TTFT spans several decode steps.
    assert ttft["max"] > 5 * s["steps"]["decode"]["mean_step_s"]
    assert s["counts"]["completed"] == 6


def _online(batch_timeout_s: float, runs_dir) -> dict:  # type: ignore[no-untyped-def]
    opts = RunOptions(
        workload=WorkloadConfig(
            requests=4, prompt_len=LengthDist("constant", 8), output_len=LengthDist("constant", 4)
        ),
        load=LoadConfig(mode="online", rate=50.0, arrival="constant"),
        engine_options=EngineOptions(
            model_preset="tiny", batch_size=4, scheduler="static", batch_timeout_s=batch_timeout_s
        ),
        runs_dir=runs_dir,
    )
    return execute_run(opts).summary


def test_static_batch_timeout_lets_a_batch_fill_at_low_arrival_rates(runs_dir) -> None:  # type: ignore[no-untyped-def]
    # Arrivals every 20 ms: without a wait the first request runs alone; with a 500 ms
    # wait all four are prefilled together, and the first one's TTFT shows the wait.
    at_once = _online(0.0, runs_dir)
    waited = _online(0.5, runs_dir)
    assert at_once["steps"]["prefill"]["count"] >= 2
    assert waited["steps"]["prefill"]["count"] == 1
    assert waited["steps"]["prefill"]["mean_batch_size"] == 4
    assert waited["latency"]["ttft"]["max"] > 0.05  # the first request waited for the others
