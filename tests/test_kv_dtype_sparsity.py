"""KV-cache storage dtype (int8, fp8) and weight sparsity in the reference engine.

The quality bounds are measured on a model trained on the synthetic corpus (200 steps,
about 5 s on one core): top-1 agreement with the fp32-KV model was 0.998 (int8) and 0.988
(fp8) at 200 steps, 0.997 and 0.985 for the 600-step model the studies use.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from perfscope.errors import UsageError
from perfscope.profiler.engines.base import EngineOptions
from perfscope.profiler.engines.reference.engine import (
    ReferenceEngine,
    check_memory,
    memory_needed,
)
from perfscope.profiler.engines.reference.model import (
    PRESETS,
    QuantizedKV,
    Sparsity,
    dequantize_kv,
    kv_bytes_per_element,
    magnitude_mask,
    parse_sparsity,
    quantize_kv,
)
from tests.conftest import subprocess_env


def _engine(**extra: str) -> ReferenceEngine:
    return ReferenceEngine(
        "reference", EngineOptions(model_preset="tiny", device="cpu", extra=extra)
    )


# ----------------------------------------------------------------------------- quantiser


def _kv_like(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # vectors of very different magnitudes, as K/V of different tokens and heads are
    scales = torch.logspace(-4, 2, 24).view(2, 3, 4, 1)
    return torch.randn(2, 3, 4, 64, generator=g) * scales


def test_int8_kv_round_trip_is_within_half_a_step_of_each_vector() -> None:
    x = _kv_like(0)
    q, scale = quantize_kv(x, "int8")
    assert q.dtype == torch.int8 and scale is not None and scale.shape == (2, 3, 4, 1)
    back = dequantize_kv(q, scale, torch.float32)
    amax = x.abs().amax(-1, keepdim=True)
    err = (back - x).abs()
    assert bool((err <= amax / 254 * (1 + 1e-5)).all())
    # the largest element of each vector is exact (it defines the scale)
    idx = x.abs().argmax(-1, keepdim=True)
    torch.testing.assert_close(back.gather(-1, idx), x.gather(-1, idx))


def test_fp8_kv_round_trip_is_within_e4m3_precision() -> None:
    x = _kv_like(1).clamp(-448, 448)
    q, scale = quantize_kv(x, "fp8")
    assert q.dtype == torch.float8_e4m3fn and scale is None
    back = dequantize_kv(q, scale, torch.float32)
    bound = torch.maximum(x.abs() * 2.0**-4, torch.full_like(x, 2.0**-10))
    assert bool(((back - x).abs() <= bound).all())
    # beyond the e4m3 range values saturate instead of turning into NaN
    big, _ = quantize_kv(torch.tensor([1e4, -1e4]), "fp8")
    assert big.float().tolist() == [448.0, -448.0]


def test_quantized_cache_writes_reads_views_and_moves_like_a_tensor() -> None:
    cfg = PRESETS["tiny"]
    model = _engine(kv_dtype="int8").model
    cache = model.new_cache(3, 8)
    assert all(isinstance(t, QuantizedKV) for t in (*cache.k, *cache.v))
    x = torch.randn(1, 5, cfg.n_kv_heads, cfg.head_dim)
    rows = torch.zeros(1, 5, dtype=torch.long)
    pos = torch.arange(5).view(1, 5)
    view = cache.view(2, 1)  # slot 2 through a one-slot view: shares storage
    view.k[0][rows, :, pos] = x
    stored = cache.k[0][2:3, :, :5]  # [1, kvH, 5, hd]
    torch.testing.assert_close(stored.permute(0, 2, 1, 3), x, atol=x.abs().max() / 127, rtol=0)
    cache.move(2, 0, 5)
    torch.testing.assert_close(cache.k[0][0, :, :5], cache.k[0][2, :, :5], atol=0, rtol=0)
    per_token = cache.nbytes / (3 * 8)
    assert per_token == 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * (1 + 4 / cfg.head_dim)


# ----------------------------------------------------------------------------- quality


@pytest.fixture(scope="module")
def trained_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from perfscope.profiler.engines.reference.train import TrainConfig, train

    mp = pytest.MonkeyPatch()
    mp.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("trained")))
    try:
        return str(train(TrainConfig(steps=200)).path)
    finally:
        mp.undo()


@pytest.mark.parametrize(("kv_dtype", "at_least"), [("int8", 0.99), ("fp8", 0.97)])
@pytest.mark.slow  # about 6 s on a quiet 2-core machine
def test_quantised_kv_outputs_agree_with_fp32_kv_on_the_trained_model(
    trained_path: str, kv_dtype: str, at_least: float
) -> None:
    from perfscope.profiler.engines.reference.train import corpus, quality

    base = _engine(weights=trained_path).model
    cand = _engine(weights=trained_path, kv_dtype=kv_dtype).model
    q = quality(base, cand)
    assert q["top1_agreement"] >= at_least
    assert q["reference_top1_accuracy"] > 0.4  # the model learnt the corpus
    assert abs(q["candidate_perplexity"] / q["reference_perplexity"] - 1) < 0.02
    # The serving path too: prefill a prompt, then teacher-forced decode steps read the cache.
    data = corpus(16, 24, 48, seed=777)
    same = total = 0
    caches = [m.new_cache(16, 24) for m in (base, cand)]
    outs = [m.prefill(data[:, :8], c).argmax(-1) for m, c in zip((base, cand), caches, strict=True)]
    for t in range(8, 23):
        same += int((outs[0] == outs[1]).sum())
        total += 16
        lengths = torch.full((16,), t)
        outs = [
            m.decode(data[:, t], c, lengths).argmax(-1)
            for m, c in zip((base, cand), caches, strict=True)
        ]
    assert same / total >= at_least


# ----------------------------------------------------------------------------- memory


def test_memory_check_and_cost_model_use_the_kv_dtype_bytes() -> None:
    from perfscope.analysis.costmodel import kv_bytes_per_token
    from perfscope.analysis.modelspec import ModelSpec

    cfg = PRESETS["tiny"]
    elements = 2 * cfg.n_layers * 4 * cfg.n_kv_heads * 64 * cfg.head_dim
    assert memory_needed(cfg, 4, 64)[2] == elements * 4
    assert memory_needed(cfg, 4, 64, "fp8")[2] == elements
    assert memory_needed(cfg, 4, 64, "int8")[2] == round(elements * (1 + 4 / cfg.head_dim))
    for kv in ("auto", "int8", "fp8"):
        eng = _engine(kv_dtype=kv)
        assert eng.model.new_cache(4, 64).nbytes == memory_needed(cfg, 4, 64, kv)[2]
        spec = ModelSpec.from_dict(eng.info().model)
        assert spec.kv_bytes_per_element == kv_bytes_per_element(cfg, kv)
        assert kv_bytes_per_token(spec) * 4 * 64 == memory_needed(cfg, 4, 64, kv)[2]
        assert eng.info().config["kv_dtype"] == kv
    # A cache of about twice the free host memory in fp32 fits in int8 (3.6x smaller).
    free = psutil.virtual_memory().available
    per_slot_fp32 = 2 * cfg.n_layers * cfg.n_kv_heads * 4096 * cfg.head_dim * 4
    slots = int(2 * free / per_slot_fp32) + 1
    with pytest.raises(UsageError, match="KV cache"):
        check_memory(cfg, slots, 4096, torch.device("cpu"))
    check_memory(cfg, slots, 4096, torch.device("cpu"), "int8")


def test_vllm_spelling_kv_cache_dtype_is_accepted_and_conflicts_refused() -> None:
    assert _engine(kv_cache_dtype="fp8_e4m3").kv_dtype == "fp8"
    with pytest.raises(UsageError, match="disagree"):
        _engine(kv_dtype="int8", kv_cache_dtype="fp8")
    with pytest.raises(UsageError, match="auto, int8, fp8"):
        _engine(kv_dtype="int4")


# ----------------------------------------------------------------------------- sparsity


@pytest.mark.parametrize("fraction", [0.5, 0.3, 0.9])
def test_unstructured_mask_drops_exactly_the_smallest_weights(fraction: float) -> None:
    w = torch.randn(37, 53, generator=torch.Generator().manual_seed(3))
    keep = magnitude_mask(w, Sparsity("unstructured", fraction))
    assert int((~keep).sum()) == round(fraction * w.numel())
    assert float(w[keep].abs().min()) >= float(w[~keep].abs().max())


def test_two_four_mask_keeps_the_two_largest_of_every_four() -> None:
    w = torch.randn(8, 16, generator=torch.Generator().manual_seed(4))
    keep = magnitude_mask(w, parse_sparsity("2:4"))
    groups, mags = keep.view(-1, 4), w.abs().view(-1, 4)
    assert (groups.sum(1) == 2).all()
    for g, m in zip(groups, mags, strict=True):
        assert float(m[g].min()) >= float(m[~g].max())


def test_sparse_engine_runs_csr_matmuls_and_reports_density_to_the_cost_model() -> None:
    from perfscope.analysis.costmodel import step_costs, weight_bytes
    from perfscope.analysis.modelspec import ModelSpec

    dense = _engine()
    sparse = _engine(sparsity="unstructured:0.5")
    block = sparse.model.blocks[0]
    assert block.wq.weight.layout == torch.sparse_csr
    assert sparse.info().config["sparsity"] == "unstructured:0.5"
    stats = sparse.sparse_stats
    assert stats.density == 0.5  # every tiny matrix has an even number of weights
    # CSR is what a dense matmul with the pruned weight computes
    x = torch.randn(3, PRESETS["tiny"].hidden_size)
    w = dense.model.blocks[0].wq.weight
    pruned = w * magnitude_mask(w, Sparsity("unstructured", 0.5))
    torch.testing.assert_close(block.wq(x), x @ pruned.T, rtol=1e-5, atol=1e-6)
    # The cost model: half the block FLOPs, stored weights at value + index bytes.
    ds, ss = (ModelSpec.from_dict(e.info().model) for e in (dense, sparse))
    assert ss.weight_density == 0.5 and ss.weight_index_bytes_per_nonzero > 8.0
    cd, cs = step_costs(ds, 1, 1, 10), step_costs(ss, 1, 1, 10)
    assert float(cs["flops_linear"]) == pytest.approx(0.5 * float(cd["flops_linear"]))
    block_params = stats.params
    extra = block_params * 0.5 * (4 + ss.weight_index_bytes_per_nonzero) - block_params * 4
    assert weight_bytes(ss) == pytest.approx(weight_bytes(ds) + extra)
    assert float(cs["bytes_weights"]) == pytest.approx(float(cd["bytes_weights"]) + extra)


def test_two_four_on_cpu_is_refused_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="2:4 runs only on CUDA") as exc:
        _engine(sparsity="2:4")
    assert "\n" not in str(exc.value)
    import perfscope

    with pytest.raises(UsageError, match="2:4 runs only on CUDA"):  # before any run
        perfscope.study("sparsity", "none,2:4", model_preset="tiny", device="cpu")
    argv = ["run", "--model-preset", "tiny", "--device", "cpu", "--requests", "1"]
    argv += ["--prompt-len", "4", "--output-len", "2", "--no-progress", "--no-report"]
    argv += ["--no-telemetry", "--engine-opt", "sparsity=2:4"]
    proc = subprocess.run(
        [sys.executable, "-m", "perfscope", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env=subprocess_env(),
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "CUDA" in lines[0]


def test_sparsity_refuses_what_torch_cannot_run_here() -> None:
    with pytest.raises(UsageError, match="float32 only"):
        ReferenceEngine(
            "reference",
            EngineOptions(
                model_preset="tiny",
                device="cpu",
                dtype="bfloat16",
                extra={"sparsity": "unstructured:0.5"},
            ),
        )
    with pytest.raises(UsageError, match="cannot be combined"):
        _engine(sparsity="unstructured:0.5", quant="int8-wo")
    with pytest.raises(UsageError, match="between 0 and 1"):
        _engine(sparsity="unstructured:1")


def test_study_knobs_for_kv_dtype_and_sparsity() -> None:
    from perfscope.api.study import KNOBS, _knob

    assert _knob("kv_cache_dtype").name == "kv-dtype"
    assert KNOBS["kv-dtype"].parse("FP8_E4M3") == "fp8"
    assert KNOBS["sparsity"].parse("unstructured") == "unstructured:0.5"
    assert KNOBS["sparsity"].parse("2:4") == "2:4"
    with pytest.raises(ValueError, match="must be"):
        KNOBS["sparsity"].parse("half")


@pytest.mark.slow  # trains the 200-step model of the fixture (shared with the tests above)
def test_the_quality_only_path_agrees_with_itself_and_not_with_a_lossy_setting(
    trained_path: str,
) -> None:
    """``study_quality`` (no speed run) with the reference hook on a trained tiny model: the
    baseline against itself agrees on every prediction with equal perplexities; 90% magnitude
    pruning changes predictions and perplexity; what it was measured on is described."""
    from perfscope import study_quality
    from perfscope.profiler.engines.reference.quality import describe_model

    rows = study_quality(
        "sparsity",
        "none,unstructured:0.9",
        model_preset="tiny",
        weights=trained_path,
        threads=1,
    )
    assert [label for label, _, _ in rows] == ["none", "unstructured:0.9"]
    (_, base_args, same), (_, _, pruned) = rows
    assert same is not None and pruned is not None
    assert same["top1_agreement"] == 1.0
    assert same["candidate_perplexity"] == same["reference_perplexity"]
    assert same["reference_top1_accuracy"] > 0.4  # the model learnt the corpus
    assert pruned["top1_agreement"] < 1.0
    assert pruned["candidate_perplexity"] > pruned["reference_perplexity"]
    assert pruned["reference_perplexity"] == same["reference_perplexity"]
    info = describe_model(base_args)
    assert info["weights"] == "trained" and info["training"]["steps"] == 200
    assert info["evaluation"]["predictions"] == 64 * 31
    with pytest.raises(UsageError, match="quant"):
        study_quality("sparsity", "none,unstructured:0.5", quant="int8")


def test_study_cli_quality_flag_stores_agreement_per_setting(tmp_path: Path) -> None:
    import json

    argv = ["study", "kv-dtype", "--values", "auto,int8", "--repeat", "1", "--requests", "2"]
    argv += ["--warmup", "0", "--prompt-len", "8", "--output-len", "4", "--model-preset", "tiny"]
    argv += ["--device", "cpu", "--no-telemetry", "--quality", "--json"]
    argv += ["--runs-dir", str(tmp_path / "runs")]
    proc = subprocess.run(
        [sys.executable, "-m", "perfscope", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    study = json.loads(proc.stdout)
    quality = [s["quality"] for s in study["settings"]]
    assert quality[0]["top1_agreement"] == 1.0
    assert 0.5 < quality[1]["top1_agreement"] <= 1.0  # random weights: a sanity bound only
    assert [s["memory"]["kv_cache_bytes"] > 0 for s in study["settings"]] == [True, True]
    fp32, int8 = (s["memory"]["kv_cache_bytes"] for s in study["settings"])
    assert int8 / fp32 == pytest.approx((1 + 4 / PRESETS["tiny"].head_dim) / 4)
