"""The reference engine's prefix caching and chunked prefill (token budget per step)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import perfscope
from perfscope.analysis.roofline import _interference
from perfscope.analysis.summary import Summary
from perfscope.api.run import RunArgs
from perfscope.api.study import KNOBS, _apply, _values
from perfscope.cli.render import _prompt_cache_line
from perfscope.errors import UsageError
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.driver import Driver, LoadConfig
from perfscope.profiler.engines.base import EngineOptions, Inbox, create_engine
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec

PREFIX = " ".join(f"system{i}" for i in range(40))  # 40 words = 40 tokens: 2 full blocks


def _shared_prefix_specs(n: int, out: int = 6) -> list[RequestSpec]:
    specs = []
    for i in range(n):
        suffix = " ".join(f"q{i}w{j}" for j in range(5 + i))
        specs.append(RequestSpec(i, 40 + 5 + i, out, prompt=f"{PREFIX} {suffix}"))
    return specs


def serve_reference(
    specs: list[RequestSpec], batch_size: int, scheduler: str = "continuous", **extra: str
) -> tuple[dict[int, list[int]], Recorder, object]:
    """Serve ``specs`` on a tiny reference engine (all at once) with ``scheduler``
    (``continuous`` or ``static``, the ``--scheduler`` flag): the greedy token ids per
    request, the recorder that saw them, and the engine's info."""
    engine = create_engine(
        "reference",
        EngineOptions(
            model_preset="tiny",
            batch_size=batch_size,
            scheduler=scheduler,
            max_seq_len=128,
            device="cpu",
            extra=extra,
        ),
    )
    engine.output_ids = {}  # type: ignore[attr-defined]
    recorder = Recorder(MonotonicClock())
    inbox = Inbox()
    driver = Driver(specs, LoadConfig(mode="batch"), inbox, recorder)
    driver.start()
    engine.serve(inbox, recorder)
    driver.join()
    outputs: dict[int, list[int]] = engine.output_ids  # type: ignore[attr-defined]
    info = engine.info()
    engine.close()
    return outputs, recorder, info


def _serve(
    specs: list[RequestSpec], batch_size: int = 1, **extra: str
) -> tuple[dict[int, list[int]], pd.DataFrame, pd.DataFrame]:
    outputs, recorder, _ = serve_reference(specs, batch_size, **extra)
    return (
        outputs,
        recorder.steps_table().to_pandas(),
        recorder.requests_table().to_pandas(),
    )


def test_prefix_cache_gives_the_same_tokens_and_prefills_only_the_uncached_suffix() -> None:
    specs = _shared_prefix_specs(4)
    off_out, off_steps, off_req = _serve(specs)
    on_out, on_steps, on_req = _serve(specs, prefix_cache="on")
    assert on_out == off_out
    assert all(len(v) == 6 for v in on_out.values())
    # The first request computes the prefix; the others reuse its two full 16-token blocks.
    assert list(on_req["cached_tokens"]) == [0, 32, 32, 32]
    assert off_req["cached_tokens"].isna().all()  # off: the engine makes no claim
    pre_on = on_steps[on_steps["kind"] == "prefill"]
    pre_off = off_steps[off_steps["kind"] == "prefill"]
    assert pre_on["new_tokens"].sum() == pre_off["new_tokens"].sum() - 3 * 32
    # The reused entries are read as context by the suffix's prefill.
    assert list(pre_on["context_tokens"]) == [0, 32, 32, 32]


def test_prefix_cache_bound_evicts_the_least_recently_used_blocks() -> None:
    specs = _shared_prefix_specs(3)
    _, _, kept = _serve(specs, prefix_cache="on", prefix_cache_tokens="32")
    assert list(kept["cached_tokens"]) == [0, 32, 32]
    # 16 tokens hold one block: the second block of the prefix evicts the first, and a
    # later prompt can only reuse a run of blocks from its start, so nothing is reused.
    _, _, evicted = _serve(specs, prefix_cache="on", prefix_cache_tokens="16")
    assert list(evicted["cached_tokens"]) == [0, 0, 0]


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    specs = [RequestSpec(i, 32, 4, prompt=" ".join(f"t{j}" for j in range(32))) for i in range(2)]
    off_out, _, _ = _serve(specs)
    on_out, steps, req = _serve(specs, prefix_cache="on")
    assert on_out == off_out
    assert list(req["cached_tokens"]) == [0, 16]  # 32 tokens: the second block is recomputed
    assert list(steps[steps["kind"] == "prefill"]["new_tokens"]) == [32, 16]


def test_chunked_prefill_splits_a_long_prompt_and_keeps_the_outputs() -> None:
    # Request 0 decodes long; request 1 leaves at once; then request 2's 60-token prompt
    # arrives in the freed slot while request 0 is decoding.
    specs = [RequestSpec(0, 4, 30), RequestSpec(1, 4, 2), RequestSpec(2, 60, 4)]
    whole_out, whole, _ = _serve(specs, batch_size=2)
    chunk_out, chunked, _ = _serve(specs, batch_size=2, max_batched_tokens="8")
    assert chunk_out == whole_out
    assert chunked["new_tokens"].max() <= 8
    of_2 = chunked[chunked["request_ids"].map(lambda r: 2 in r)]
    prefill_of_2 = of_2[of_2["kind"].isin(("prefill", "mixed"))]
    assert len(prefill_of_2) >= 60 // 8  # the prompt is spread over many steps
    assert "mixed" in set(chunked["kind"])

    def steps_while_0_decodes(steps: pd.DataFrame) -> pd.DataFrame:
        has0 = steps["request_ids"].map(lambda r: 0 in r).to_numpy()
        first, last = has0.argmax(), len(has0) - 1 - has0[::-1].argmax()
        return steps.iloc[first + 1 : last + 1]

    # Unchunked, request 0 waits for a whole 60-token prefill pass; chunked, every step
    # while it decodes carries its token and at most 8 tokens in all.
    during = steps_while_0_decodes(whole)
    assert during["new_tokens"].max() == 60
    assert not during[during["new_tokens"] == 60]["request_ids"].iloc[0].__contains__(0)
    during = steps_while_0_decodes(chunked)
    assert during["new_tokens"].max() <= 8
    assert during["request_ids"].map(lambda r: 0 in r).all()


def test_mixed_steps_stall_decoding_requests_by_their_time_beyond_a_decode_step() -> None:
    ms = 1_000_000

    def step(kind: str, a: int, b: int, n: int) -> dict[str, Any]:
        return {
            "kind": kind,
            "t_start": a * ms,
            "t_end": b * ms,
            "batch_size": 2,
            "new_tokens": n,
            "context_tokens": 0,
            "request_ids": [0, 1],
        }

    # Two requests decode from 0 to 100 ms; decode steps take 10 ms, the one mixed step 50.
    steps = pd.DataFrame(
        [
            step("decode", 0, 10, 2),
            step("mixed", 10, 60, 9),
            step("decode", 60, 70, 2),
            step("decode", 70, 80, 2),
        ]
    )
    req = pd.DataFrame(
        {
            "request_id": [0, 1],
            "t_sent": [0, 0],
            "t_first_token": [0, 0],
            "t_last_token": [100 * ms, 100 * ms],
            "output_tokens": [10, 10],
            "error": [None, None],
            "is_warmup": [False, False],
        }
    )
    out = _interference(steps, req)
    # 40 ms beyond a decode step, for both requests, over 200 ms of decode time.
    assert out["decode_stall_share"] == pytest.approx(2 * 40 / 200)
    assert out["prefill_stall_max_s"] == pytest.approx(0.040)


def test_a_chunked_run_reports_its_mixed_phase_on_the_roofline(runs_dir: Any) -> None:
    run = perfscope.run(
        "reference",
        model_preset="tiny",
        requests=3,
        warmup=0,
        prompt_len=40,
        output_len=6,
        batch_size=2,
        telemetry=False,
        runs_dir=runs_dir,
        seed=0,
        max_batched_tokens="8",
        concurrency=2,
    )
    s = run.summary.to_dict()
    assert s["steps"]["mixed"]["count"] > 0
    mixed = s["roofline"]["phases"]["mixed"]
    assert mixed["verdict"] in ("compute-bound", "memory-bound", "overhead-bound")
    assert mixed["tokens"] == s["steps"]["mixed"]["new_tokens"]
    assert s["roofline"]["latency"]["decode_stall_share"] is not None


def test_prefix_cache_and_chunking_together_keep_the_outputs() -> None:
    specs = _shared_prefix_specs(5)
    base, _, _ = _serve(specs, batch_size=2)
    both, steps, req = _serve(specs, batch_size=2, prefix_cache="on", max_batched_tokens="12")
    assert both == base
    assert steps["new_tokens"].max() <= 12
    assert (req["cached_tokens"] > 0).any()


@pytest.mark.parametrize(
    ("extra", "scheduler", "message"),
    [
        ({"prefix_cache": "on"}, "static", "needs --scheduler continuous"),
        ({"max_batched_tokens": "8", "kv_cache": "off"}, "continuous", "needs the KV cache"),
        ({"max_batched_tokens": "2"}, "continuous", "below --batch-size 4"),
        ({"max_batched_tokens": "0"}, "continuous", "whole number >= 1"),
        ({"prefix_cache": "maybe"}, "continuous", "one of off, on"),
    ],
)
def test_scheduling_options_that_cannot_work_are_usage_errors(
    extra: dict[str, str], scheduler: str, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        create_engine(
            "reference",
            EngineOptions(
                model_preset="tiny", batch_size=4, scheduler=scheduler, device="cpu", extra=extra
            ),
        )


def test_max_batched_tokens_knob_reads_unlimited_as_the_default() -> None:
    knob = KNOBS["max-batched-tokens"]
    parsed = _values(knob, "unlimited,64")
    assert parsed == [("unlimited", None), ("64", 64)]
    base = RunArgs(engine_options={"max_batched_tokens": "8"})
    assert "max_batched_tokens" not in _apply(base, knob, None).engine_options
    assert _apply(base, knob, 64).engine_options["max_batched_tokens"] == "64"
    with pytest.raises(UsageError, match="max-batched-tokens value '0'"):
        _values(knob, "unlimited,0")


def _tiny_study(knob: str, values: str, runs_dir: Any, **options: Any) -> Any:
    return perfscope.study(
        knob,
        values,
        model_preset="tiny",
        repeat=1,
        requests=4,
        warmup=1,
        output_len=4,
        batch_size=2,
        telemetry=False,
        seed=0,
        runs_dir=runs_dir,
        **options,
    )


def test_prefix_cache_study_projects_from_the_measured_cached_share(runs_dir: Any) -> None:
    s = _tiny_study(
        "prefix-cache",
        "off,on",
        runs_dir,
        dataset="shared-prefix",
        prefix_len=48,
        prompt_len=8,
        concurrency=1,
    )
    on = s.settings[1]
    assert on.median["prompt_cache_share"] > 0.5
    assert s.settings[0].median["prompt_cache_share"] is None
    proj = on.projection
    assert proj["cached_prefix_len"][0] == 0 and proj["cached_prefix_len"][1] >= 32
    # Less prefill work: the roofline alone projects a shorter TTFT, never "no change".
    assert proj["sol_ratios"]["ttft_s"] < 1.0
    assert any("measured cache use" in n for n in s.notes)
    summary = Summary.from_dict(json.loads((Path(on.runs[0].run) / "summary.json").read_text()))
    line = _prompt_cache_line(summary)
    assert line is not None and "% of prompt tokens served from it" in line


def test_chunked_prefill_study_steps_the_scheduler_with_its_token_budget(runs_dir: Any) -> None:
    s = _tiny_study("max-batched-tokens", "unlimited,4", runs_dir, prompt_len=24, concurrency=2)
    chunked = s.settings[1]
    proj = {e.metric: e.projected_ratio for e in chunked.effects}
    assert all(proj[m] is not None for m in ("ttft_p50_s", "tpot_p50_s", "output_tok_s"))
    # 24-token prompts in steps of 4 tokens (fewer beside decode rows): six or more steps,
    # each paying the fitted per-step host time, before a prompt's first token
    assert proj["ttft_p50_s"] > 1.0
    assert any(e.change.ratio is not None for e in chunked.effects)
    assert "a 4-token budget a step" in chunked.projection["basis"]
    assert "disaggregation" in chunked.projection
    assert any("mixed" in r.phases for r in chunked.runs)
    assert any(n.startswith("max-batched-tokens=4: projected by") for n in s.notes)


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_reuse_and_chunks_keep_the_outputs_with_a_quantised_kv_cache(kv_dtype: str) -> None:
    specs = _shared_prefix_specs(4)
    base, _, _ = _serve(specs, batch_size=2, kv_dtype=kv_dtype)
    both, _, req = _serve(
        specs, batch_size=2, kv_dtype=kv_dtype, prefix_cache="on", max_batched_tokens="12"
    )
    assert both == base
    assert (req["cached_tokens"] > 0).any()
