"""The reference engine's paged KV cache, head pruning and compile knob."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from perfscope.errors import UsageError
from perfscope.profiler.engines.reference.heads import head_importance, prune_heads
from perfscope.profiler.engines.reference.model import PRESETS, ReferenceModel
from perfscope.profiler.engines.reference.train import quality
from perfscope.profiler.records import RequestSpec
from tests.test_reference_scheduling import serve_reference


def _serve(
    specs: list[RequestSpec], batch_size: int = 4, **extra: str
) -> tuple[dict[int, list[int]], pd.DataFrame, object]:
    outputs, recorder, info = serve_reference(specs, batch_size, **extra)
    return outputs, recorder.steps_table().to_pandas(), info


def _mixed_specs(n: int = 6) -> list[RequestSpec]:
    # Different prompt and output lengths: sequences leave at different steps, so slots
    # move and freed blocks are handed to later requests.
    return [RequestSpec(i, 5 + 7 * i, 3 + (i % 3) * 4) for i in range(n)]


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_paged_kv_gives_the_tokens_of_the_contiguous_cache(scheduler: str) -> None:
    specs = _mixed_specs()
    dense, _, _ = _serve(specs, scheduler=scheduler)
    paged, _, info = _serve(specs, kv_paged="on", kv_block_tokens="8", scheduler=scheduler)
    assert paged == dense
    assert info.config["kv_paged"] is True  # type: ignore[attr-defined]


def test_a_paged_budget_admits_by_free_blocks_and_a_contiguous_one_by_max_len_slots() -> None:
    # tiny: 1024 bytes of K and V per token. 0.1 MB contiguous holds 0 sequences of 128
    # positions... 0.2 MB holds 1; paged it holds 12 blocks of 16 = 192 positions.
    specs = [RequestSpec(i, 20, 8) for i in range(6)]  # 28 tokens = 2 blocks each
    dense, dsteps, dinfo = _serve(specs, batch_size=6, kv_budget_mb="0.2")
    paged, psteps, pinfo = _serve(specs, batch_size=6, kv_budget_mb="0.2", kv_paged="on")
    assert paged == dense
    assert dinfo.config["kv_slots"] == 1  # type: ignore[attr-defined]
    assert pinfo.config["kv_blocks"] == 12  # type: ignore[attr-defined]
    assert dsteps[dsteps["kind"] == "decode"]["batch_size"].max() == 1
    assert psteps[psteps["kind"] == "decode"]["batch_size"].max() == 6
    with pytest.raises(UsageError, match="holds no contiguous sequence"):
        _serve(specs, kv_budget_mb="0.1")


def test_head_pruning_keeps_shapes_runs_and_changes_quality() -> None:
    torch.manual_seed(0)
    cfg = PRESETS["tiny"].with_overrides(n_kv_heads=4)
    ref = ReferenceModel.build(cfg, seed=0)
    model = ReferenceModel.build(cfg, seed=0)
    scores = head_importance(model)
    assert scores.shape == (cfg.n_layers, cfg.n_heads) and bool((scores > 0).all())
    done = prune_heads(model, 1, scores)
    # The least important head of each layer went, with its K/V (MHA); heads keep width 32.
    assert done.removed == tuple((int(s.argmin()),) for s in scores)
    assert (model.cfg.n_heads, model.cfg.n_kv_heads, model.cfg.head_dim) == (3, 3, 32)
    assert model.blocks[0].wq.weight.shape == (96, 128)
    assert model.blocks[0].wo.weight.shape == (128, 96)
    cache = model.new_cache(2, 16)
    assert model.prefill(torch.randint(1, 100, (2, 8)), cache).shape == (2, cfg.vocab_size)
    q = quality(ref, model)
    assert q["top1_agreement"] < 1.0 and q["candidate_perplexity"] != q["reference_perplexity"]
    with pytest.raises(ValueError, match="multiple of 2"):
        prune_heads(ReferenceModel.build(PRESETS["tiny"], seed=0), 1)


def test_the_engine_prunes_heads_and_reports_the_smaller_model() -> None:
    out, _, info = _serve([RequestSpec(0, 8, 4)], prune_heads="2")
    assert len(out[0]) == 4
    assert info.model["n_heads"] == 2  # type: ignore[attr-defined]
    assert info.config["pruned_heads"] is not None  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="prune_heads"):
        _serve([RequestSpec(0, 8, 4)], prune_heads="x")


@pytest.mark.slow
def test_compile_on_gives_the_eager_tokens() -> None:
    """Compile path with the ``eager`` backend (dynamo traces the blocks, no C++ codegen):
    about 15 s of CPU, most of it importing and tracing; inductor takes minutes here and is
    measured by samples/studies/compile.py instead."""
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile is not available in this torch")
    specs = [RequestSpec(i, 6, 3) for i in range(2)]
    eager, _, _ = _serve(specs, batch_size=2)
    compiled, _, info = _serve(specs, batch_size=2, compile="on", compile_backend="eager")
    assert compiled == eager
    assert info.config["compile_backend"] == "eager"  # type: ignore[attr-defined]
