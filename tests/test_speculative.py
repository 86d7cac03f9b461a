"""Speculative decoding in the reference engine: exact target output, and honest records."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from perfscope.errors import UsageError
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.driver import Driver, LoadConfig
from perfscope.profiler.engines.base import EngineOptions, Inbox, Submission, create_engine
from perfscope.profiler.engines.reference.engine import ReferenceEngine
from perfscope.profiler.engines.reference.model import ReferenceModel
from perfscope.profiler.engines.reference.speculative import accept_greedy
from perfscope.profiler.engines.reference.train import TrainConfig, corpus, train
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec


def _serve(
    specs: list[RequestSpec], extra: dict[str, str], **opts: object
) -> tuple[ReferenceEngine, Recorder]:
    engine = create_engine(
        "reference",
        EngineOptions(model_preset="tiny", max_seq_len=64, extra=extra, **opts),  # type: ignore[arg-type]
    )
    assert isinstance(engine, ReferenceEngine)
    recorder = Recorder(MonotonicClock())
    inbox = Inbox()
    driver = Driver(specs, LoadConfig(mode="batch"), inbox, recorder)
    driver.start()
    engine.serve(inbox, recorder)
    driver.join()
    return engine, recorder


def _greedy(model: ReferenceModel, prompt: torch.Tensor, n: int) -> list[int]:
    """The target's own greedy output, one token per decode pass, no speculation."""
    cache = model.new_cache(1, 64)
    out = [int(model.prefill(prompt.view(1, -1), cache).argmax(-1))]
    length = prompt.numel()
    while len(out) < n:
        logits = model.decode(torch.tensor([out[-1]]), cache, torch.tensor([length]))
        length += 1
        out.append(int(logits.argmax(-1)))
    return out


def _expected(engine: ReferenceEngine, spec: RequestSpec) -> list[int]:
    prompt = engine._prompt_ids(Submission(spec=spec, handle=None))  # type: ignore[arg-type]
    return _greedy(engine.model, prompt, spec.max_output_tokens)


def _steps(recorder: Recorder) -> pd.DataFrame:
    return recorder.steps_table().to_pandas()


def test_greedy_acceptance_keeps_the_longest_matching_prefix() -> None:
    assert accept_greedy([5, 6, 7], [5, 6, 9, 1]) == 2
    assert accept_greedy([5, 6, 7], [4, 6, 7, 1]) == 0
    assert accept_greedy([5, 6, 7], [5, 6, 7, 1]) == 3


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_output_with_random_weights_equals_the_targets_greedy_output(scheduler: str) -> None:
    # Different prompt lengths and output lengths: rows leave at different steps.
    specs = [RequestSpec(i, 6 + 2 * i, 9 + 3 * i) for i in range(5)]
    for extra in (
        {"draft": "tiny", "num_speculative_tokens": "3"},  # same shape and seed: the target
        {"draft": "tiny", "draft_layers": "1", "num_speculative_tokens": "2"},
    ):
        engine, rec = _serve(specs, extra, batch_size=3, scheduler=scheduler)
        for s in specs:
            assert engine.outputs[s.request_id] == _expected(engine, s), (extra, s)
        reqs = rec.requests_table().to_pandas()
        assert reqs["error"].isna().all()
        assert list(reqs["output_tokens"]) == [s.max_output_tokens for s in specs]
    # The draft identical to the target is always right; the random 1-layer one almost never.
    steps = _steps(rec)
    verify = steps[steps["proposed_tokens"].notna()]
    assert verify["accepted_tokens"].sum() <= 0.2 * verify["proposed_tokens"].sum()


def test_a_draft_identical_to_the_target_is_always_accepted() -> None:
    specs = [RequestSpec(i, 8, 13) for i in range(3)]
    _, rec = _serve(specs, {"draft": "tiny", "num_speculative_tokens": "4"}, batch_size=3)
    steps = _steps(rec)
    verify = steps[steps["proposed_tokens"].notna()]
    assert (verify["accepted_tokens"] == verify["proposed_tokens"]).all()
    # 1 token from prefill, then 5 per step (4 accepted + the target's), the last step cut
    # at max_tokens: 1 + 5 + 5 + 2.
    assert len(verify) == 3
    chunks = rec.chunks_table().to_pandas()
    assert sorted(chunks.groupby("request_id")["n_tokens"].sum()) == [13, 13, 13]
    assert list(chunks[chunks["request_id"] == 0]["n_tokens"]) == [1, 5, 5, 2]


def _trained(layers: int) -> Path:
    """Weights of the tiny preset with ``layers`` blocks, trained briefly (cached per session)."""
    cfg = TrainConfig(overrides=(("n_layers", layers),), steps=200)
    return train(cfg).path


@pytest.mark.slow  # about 4 s on a quiet 2-core machine
def test_output_on_a_trained_model_equals_the_targets_greedy_output() -> None:
    target, draft = _trained(2), _trained(1)
    data = corpus(6, 40, 48, seed=777)
    specs = [
        RequestSpec(i, 16, 20, prompt_token_ids=tuple(data[i, :16].tolist())) for i in range(6)
    ]
    extra = {"weights": str(target), "draft": str(draft), "num_speculative_tokens": "3"}
    engine, rec = _serve(specs, extra, batch_size=4)
    for s in specs:
        assert engine.outputs[s.request_id] == _expected(engine, s)
    steps = _steps(rec)
    verify = steps[steps["proposed_tokens"].notna()]
    rate = verify["accepted_tokens"].sum() / verify["proposed_tokens"].sum()
    # Trained on the same corpus, the draft agrees with the target far above chance (1/1024).
    assert rate > 0.2
    info = engine.info().config["speculative"]
    assert isinstance(info, dict) and info["num_speculative_tokens"] == 3


def test_steps_record_draft_passes_apart_from_verify_passes() -> None:
    specs = [RequestSpec(0, 8, 7), RequestSpec(1, 8, 7)]
    _, rec = _serve(specs, {"draft": "tiny", "draft_layers": "1", "num_speculative_tokens": "2"})
    steps = _steps(rec)
    draft = steps[steps["role"] == "draft"]
    target = steps[steps["role"].isna()]
    assert list(draft["kind"].unique()) == ["prefill", "decode"]
    assert draft[draft["kind"] == "prefill"]["new_tokens"].sum() == 16
    verify = target[target["kind"] == "decode"]
    # Each verify pass checks K=2 draft tokens per row over K+1 positions.
    assert (verify["new_tokens"] == 3 * verify["batch_size"]).all()
    assert (verify["proposed_tokens"] == 2 * verify["batch_size"]).all()
    # Two draft passes before every verify pass; the first feeds 2 tokens per row.
    assert len(draft[draft["kind"] == "decode"]) == 2 * len(verify)
    assert draft["proposed_tokens"].isna().all()
    reqs = rec.requests_table().to_pandas()
    assert list(reqs["output_tokens"]) == [7, 7]


def test_output_stops_at_max_tokens_inside_an_accepted_run() -> None:
    specs = [RequestSpec(0, 8, 4)]
    engine, rec = _serve(specs, {"draft": "tiny", "num_speculative_tokens": "5"})
    assert engine.outputs[0] == _expected(engine, specs[0])
    assert rec.requests_table().to_pandas()["output_tokens"].tolist() == [4]


def test_bad_draft_options_are_usage_errors() -> None:
    def make(extra: dict[str, str], **kw: object) -> None:
        create_engine("reference", EngineOptions(model_preset="tiny", extra=extra, **kw))  # type: ignore[arg-type]

    with pytest.raises(UsageError, match="needs a draft model"):
        make({"num_speculative_tokens": "3"})
    with pytest.raises(UsageError, match="share the target's vocabulary"):
        make({"draft": "small"})
    with pytest.raises(UsageError, match="neither a preset"):
        make({"draft": "/nonexistent/file.pt"})
    with pytest.raises(UsageError, match="whole number >= 0"):
        make({"draft": "tiny", "num_speculative_tokens": "x"})
    with pytest.raises(UsageError, match="needs the KV cache"):
        make({"draft": "tiny", "kv_cache": "off"})
    # 0 = off: no draft is built.
    create_engine(
        "reference",
        EngineOptions(model_preset="tiny", extra={"draft": "tiny", "num_speculative_tokens": "0"}),
    )


# --------------------------------------------------------------------------- analysis


def test_speedup_formula_matches_its_limits_and_inverts_the_acceptance() -> None:
    from perfscope.analysis.whatif import (
        alpha_from_accepted,
        expected_tokens_per_step,
        speculative_speedup,
    )

    # Nothing accepted: K draft passes of cost c bought nothing.
    assert speculative_speedup(0.0, 4, 0.25) == pytest.approx(1 / 2.0)
    # Everything accepted, free draft: K + 1 tokens per target pass.
    assert speculative_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert speculative_speedup(0.5, 2, 0.1, verify_cost=1.5) == pytest.approx(1.75 / 1.7)
    assert alpha_from_accepted(0.5 + 0.25, 2) == pytest.approx(0.5, abs=1e-9)
    assert alpha_from_accepted(3.0, 3) == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="alpha"):
        speculative_speedup(1.5, 2, 0.1)


def test_summary_reports_acceptance_and_costs_draft_passes_with_the_drafts_spec(
    runs_dir: Path,
) -> None:
    import numpy as np
    import pyarrow.parquet as pq

    import perfscope
    from perfscope.analysis.costmodel import step_costs
    from perfscope.analysis.modelspec import ModelSpec

    r = perfscope.run(
        "reference",
        requests=4,
        prompt_len=8,
        output_len=9,
        model_preset="tiny",
        batch_size=4,
        telemetry=False,
        runs_dir=runs_dir,
        draft="tiny",  # identical to the target: every draft token is accepted
        num_speculative_tokens="3",
    )
    s = r.summary
    sp = s["speculative"]
    assert sp["num_speculative_tokens"] == 3
    assert sp["acceptance_rate"] == pytest.approx(1.0)
    assert sp["mean_accepted_per_step"] == pytest.approx(3.0)
    assert sp["alpha"] == pytest.approx(1.0, abs=1e-6)
    assert sp["draft_time_s"] > 0 and sp["verify_time_s"] > 0
    assert set(s["steps"]) == {"prefill", "decode", "draft_prefill", "draft_decode"}
    # 8 output tokens after the first: 1 + 4 + 4 per request, 2 verify passes.
    assert s["steps"]["decode"]["count"] == 2
    assert s["latency"]["tpot"]["count"] == 4
    steps = pq.read_table(Path(r.path) / "steps.parquet").to_pandas()
    assert {"role", "proposed_tokens", "accepted_tokens"} <= set(steps.columns)
    roof = s["roofline"]
    if not roof["available"]:
        pytest.skip(f"no roofline here: {roof['reason']}")
    assert {"draft_prefill", "draft_decode"} <= set(roof["phases"])
    # The verify passes are costed with logits at every position they feed.
    model = ModelSpec.from_dict(dict(s["model"]))
    verify = steps[steps["proposed_tokens"].notna()]
    n = verify["new_tokens"].to_numpy(dtype=float)
    costs = step_costs(
        model,
        verify["batch_size"].to_numpy(dtype=float),
        n,
        verify["context_tokens"].to_numpy(dtype=float),
        logits_tokens=n,
    )
    assert roof["phases"]["decode"]["flops"] == pytest.approx(float(np.sum(costs["flops"])))
    draft = ModelSpec.from_dict(dict(sp["draft_model"]))
    assert draft.n_layers == model.n_layers  # same preset; a 1-layer draft below
    # The CLI prints the section.
    from rich.console import Console

    from perfscope.cli.render import summary_view

    console = Console(width=160, record=True)
    console.print(summary_view(s))
    text = console.export_text()
    assert "Speculative decoding (draft tiny)" in text
    assert "24 / 24 = 1.000" in text  # accepted / proposed: 4 requests x 2 steps x 3


def test_study_projects_speculation_from_the_assumed_acceptance_before_the_run(
    runs_dir: Path,
) -> None:
    import perfscope
    from perfscope.analysis.whatif import ASSUMED_ACCEPTANCE

    st = perfscope.study(
        "num-speculative-tokens",
        "0,2",
        model_preset="tiny",
        requests=2,
        warmup=0,
        prompt_len=8,
        output_len=6,
        repeat=1,
        telemetry=False,
        runs_dir=runs_dir,
        draft="tiny",
        draft_layers="1",
    )
    cand = st.settings[1]
    proj = cand.projection
    assert proj is not None
    sp = proj["speculative"]
    assert sp["k"] == 2
    before = sp["before_run"]
    assert before["alpha"] == ASSUMED_ACCEPTANCE
    # Same target model and batch: the plain what-if ratio is 1, so the projection is the
    # formula's speedup alone.
    # The study projects from the baseline's fitted cost model when it has one, else derated.
    used = before["fitted"] if "fitted" in before else before["derated"]
    assert proj["ratios"]["tpot_s"] == pytest.approx(1 / used)
    # The draft prefills every prompt too, at its cost per pass relative to the target's,
    # so the two requests (one burst, one prefill) wait that much longer for a first token;
    # throughput over the run's window holds that prefill beside the faster (or slower)
    # tokens.
    cost = before["cost_ratio_fitted"] if "fitted" in before else before["cost_ratio_derated"]
    assert proj["ratios"]["ttft_s"] == pytest.approx(1 + cost)
    assert 0 < proj["ratios"]["throughput_tok_s"] <= max(used, 1.0) + 1e-9
    after = sp["after_run"]
    assert after is not None and 0 <= after["acceptance_rate"] <= 1
    # The draft's weights and cache are part of the setting's memory.
    assert cand.memory["draft_bytes"] > 0
    assert cand.memory["total_bytes"] > st.settings[0].memory["total_bytes"]
    with pytest.raises(UsageError, match="needs a draft model"):
        perfscope.study("num-speculative-tokens", "0,2", model_preset="tiny", runs_dir=runs_dir)
