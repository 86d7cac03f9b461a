"""Lookahead (Jacobi) and Medusa decoding in the reference engine: exactly greedy's tokens,
consistent acceptance counters, one-line errors for bad options and knob values."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.errors import UsageError
from perfscope.profiler.engines.reference.lookahead import ngram_guess
from perfscope.profiler.engines.reference.train import TrainConfig, corpus, train
from perfscope.profiler.records import RequestSpec
from tests.test_speculative import _expected, _serve, _steps


def _trained() -> Path:
    """The tiny preset trained briefly (the same cached file test_speculative.py trains)."""
    return train(TrainConfig(overrides=(("n_layers", 2),), steps=200)).path


def _corpus_specs(n: int, out: int) -> list[RequestSpec]:
    data = corpus(n, 16, 48, seed=777)
    return [RequestSpec(i, 16, out + i, prompt_token_ids=tuple(data[i].tolist())) for i in range(n)]


def test_ngram_guess_proposes_what_followed_the_last_match() -> None:
    assert ngram_guess([1, 2, 3, 4, 1, 2], 2, 3) == [3, 4, 1]
    assert ngram_guess([1, 2, 3, 1, 2, 9, 1, 2], 2, 2) == [9, 1]  # the most recent match
    assert ngram_guess([5, 6, 7], 2, 4) == []
    assert ngram_guess([5, 5, 5], 0, 4) == []


@pytest.mark.parametrize(
    ("extra", "scheduler"),
    [
        ({"decoding": "lookahead"}, "continuous"),
        ({"decoding": "lookahead", "lookahead_ngram": "0", "lookahead_window": "3"}, "static"),
        ({"decoding": "medusa", "medusa_heads": "3", "medusa_steps": "20"}, "continuous"),
    ],
    ids=["lookahead", "jacobi-static", "medusa"],
)
@pytest.mark.slow  # about 6 s on a quiet 2-core machine
def test_outputs_on_the_trained_model_are_exactly_greedy_decodings(
    extra: dict[str, str], scheduler: str
) -> None:
    specs = _corpus_specs(5, 14)
    engine, rec = _serve(
        specs, {"weights": str(_trained()), **extra}, batch_size=3, scheduler=scheduler
    )
    for s in specs:
        assert engine.outputs[s.request_id] == _expected(engine, s), s
    reqs = rec.requests_table().to_pandas()
    assert list(reqs["output_tokens"]) == [s.max_output_tokens for s in specs]
    steps = _steps(rec)
    assert (steps["role"] != "draft").all()  # no pass but the target's
    info = engine.info().config["speculative"]
    assert isinstance(info, dict) and info["method"] == extra["decoding"]


def test_acceptance_counters_are_consistent_and_steps_emit_at_least_one_token() -> None:
    from perfscope.analysis.speculative import speculative_section

    specs = _corpus_specs(4, 20)
    engine, rec = _serve(specs, {"weights": str(_trained()), "decoding": "lookahead"})
    steps = _steps(rec)
    verify = steps[steps["proposed_tokens"].notna()]
    assert (verify["accepted_tokens"] <= verify["proposed_tokens"]).all()
    assert (verify["new_tokens"] == verify["batch_size"] * 5).all()  # x + a window of 4
    # The corpus repeats motifs: the n-gram pool guesses right far above chance (1/1024).
    assert verify["accepted_tokens"].sum() > 0.1 * verify["proposed_tokens"].sum()
    chunks = rec.chunks_table().to_pandas()
    assert (chunks["n_tokens"] >= 1).all() and (chunks["n_tokens"] <= 5).all()
    manifest = {"engine": {"config": engine.info().config}}
    sec = speculative_section(steps, manifest, None)
    assert sec is not None and sec["method"] == "lookahead"
    assert 0 <= sec["acceptance_rate"] <= 1 and sec["mean_tokens_per_step"] >= 1
    assert sec["cost_ratio"] == 0.0 and sec["draft_steps"] == 0
    assert sec["projected_speedup"] == pytest.approx(sec["expected_tokens_per_step"])


def test_bad_decoding_options_are_one_line_usage_errors() -> None:
    spec = [RequestSpec(0, 4, 2)]
    for extra, message in (
        ({"decoding": "jacobi"}, "decoding= must be one of plain, draft, lookahead, medusa"),
        ({"decoding": "draft"}, "decoding=draft needs a draft model"),
        ({"decoding": "lookahead", "lookahead_window": "0"}, "lookahead_window= must be"),
        ({"decoding": "medusa", "medusa_heads": "x"}, "medusa_heads= must be"),
        ({"decoding": "medusa", "quant": "int8"}, "drop quant= / sparsity="),
        ({"decoding": "lookahead", "kv_cache": "off"}, "needs the KV cache"),
    ):
        with pytest.raises(UsageError, match=message) as err:
            _serve(spec, extra)
        assert "\n" not in str(err.value)


def test_the_decoding_knob_rejects_an_unknown_method_in_one_line(runs_dir: Path) -> None:
    import perfscope

    with pytest.raises(UsageError, match="decoding value 'beam' must be one of") as err:
        perfscope.study("decoding", "plain,beam", model_preset="tiny", runs_dir=runs_dir)
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="decoding=draft needs a draft model"):
        perfscope.study("decoding", "plain,draft", model_preset="tiny", runs_dir=runs_dir)


def test_a_decoding_change_is_calibrated_as_its_technique() -> None:
    from perfscope.analysis.calibration import TECHNIQUES, technique_of_change

    assert technique_of_change("decoding", "lookahead") == "parallel-decoding"
    assert technique_of_change("decoding", "medusa") == "parallel-decoding"
    assert technique_of_change("decoding", "draft") == "speculative"
    assert "parallel-decoding" in TECHNIQUES


def test_medusa_head_cost_counts_what_flopcountermode_counts_of_the_real_heads() -> None:
    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    from perfscope.analysis.costmodel import medusa_head_cost
    from perfscope.analysis.modelspec import ModelSpec
    from perfscope.profiler.engines.reference.medusa import MedusaHeads

    d, v, k, rows = 32, 96, 3, 5
    spec = ModelSpec(
        name="t",
        n_layers=1,
        hidden_size=d,
        n_heads=4,
        n_kv_heads=4,
        head_dim=8,
        intermediate_size=64,
        vocab_size=v,
    )
    heads, lm_head = MedusaHeads(d, k), nn.Linear(d, v, bias=False)
    with FlopCounterMode(display=False) as counter:
        heads(torch.zeros(rows, d), lm_head)
    flops, weight_bytes = medusa_head_cost(spec, k, rows)
    assert float(flops) == counter.get_total_flops()
    assert float(weight_bytes) == k * (d * d + d * v) * spec.embedding_bytes_per_param
    assert float(medusa_head_cost(spec, k, 0)[1]) == 0.0  # no rows, no step


def test_a_verify_pass_without_a_draft_is_priced_wider_than_a_plain_step_and_medusa_more() -> None:
    from perfscope.analysis.modelspec import ModelSpec
    from perfscope.analysis.study import _verify_roof_ratio
    from perfscope.hwdb import resolve_device
    from perfscope.profiler.engines.reference.model import PRESETS

    spec = ModelSpec.from_dict(PRESETS["tiny"].model_spec())
    dev = resolve_device("h100-sxm5-80gb")
    kw = {"batch": 4, "prompt_len": 16, "output_len": 32}
    lookahead = _verify_roof_ratio(spec, dev, 4, 0, **kw)
    medusa = _verify_roof_ratio(spec, dev, 4, 4, **kw)
    assert lookahead is not None and medusa is not None
    assert 1.0 <= lookahead < medusa


def test_a_medusa_runs_roofline_counts_its_heads_on_every_verify_row() -> None:
    import pandas as pd

    from perfscope.analysis.costmodel import medusa_head_cost
    from perfscope.analysis.modelspec import ModelSpec
    from perfscope.analysis.roofline import roofline_section
    from perfscope.hwdb import resolve_device
    from perfscope.profiler.engines.reference.model import PRESETS

    spec = ModelSpec.from_dict(PRESETS["tiny"].model_spec())
    dev = resolve_device("h100-sxm5-80gb")
    # A prefill of 2 rows, then 3 verify steps of 2 rows x 5 positions (K = 4).
    steps = pd.DataFrame(
        {
            "kind": ["prefill", "decode", "decode", "decode"],
            "batch_size": [2, 2, 2, 1],
            "new_tokens": [32, 10, 10, 5],
            "context_tokens": [0, 32, 40, 24],
            "t_start": [0, 1_000_000, 2_000_000, 3_000_000],
            "t_end": [900_000, 1_900_000, 2_900_000, 3_900_000],
            "proposed_tokens": [None, 8.0, 8.0, 4.0],
        }
    )
    plain = roofline_section(steps, None, None, spec, dev)
    medusa = roofline_section(steps, None, None, spec, dev, medusa_heads=4)
    flops, weight_bytes = medusa_head_cost(spec, 4, [2.0, 2.0, 1.0])
    dp, dm = plain.phases["decode"], medusa.phases["decode"]
    assert dm.flops == pytest.approx(dp.flops + float(flops.sum()))
    assert dm.bytes_weights == pytest.approx(dp.bytes_weights + float(weight_bytes.sum()))
    assert medusa.phases["prefill"].flops == plain.phases["prefill"].flops  # no heads there
