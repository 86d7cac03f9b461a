"""`hf:PATH` profiles a local Hugging Face causal LM (built here from a config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.api.runner import RunOptions, execute_run
from perfscope.errors import EngineNotFoundError, UsageError
from perfscope.profiler.engines.base import EngineOptions, create_engine
from perfscope.profiler.telemetry import TelemetryConfig
from perfscope.profiler.workload import LengthDist, WorkloadConfig

transformers = pytest.importorskip("transformers")


def test_hf_engine_records_steps_and_a_model_spec_from_config(
    tiny_llama: Path, runs_dir: Path
) -> None:
    opts = RunOptions(
        engine=f"hf:{tiny_llama}",
        workload=WorkloadConfig(
            requests=5, prompt_len=LengthDist("constant", 12), output_len=LengthDist("constant", 6)
        ),
        engine_options=EngineOptions(batch_size=4),
        runs_dir=runs_dir,
        telemetry=TelemetryConfig(enabled=False),
    )
    out = execute_run(opts)
    s = out.summary
    assert out.status == "complete"
    assert s["counts"]["completed"] == 5
    assert s["counts"]["output_tokens"] == 30
    assert s["steps"]["prefill"]["count"] == 2  # 4 + 1 requests
    assert s["steps"]["decode"]["count"] == 2 * 5
    assert s["model"]["n_layers"] == 2
    assert s["model"]["n_kv_heads"] == 2
    assert s["roofline"]["available"]
    assert set(s["roofline"]["phases"]) == {"prefill", "decode"}


def test_hf_engine_needs_a_local_model_folder(tmp_path: Path) -> None:
    with pytest.raises(EngineNotFoundError, match="local model folder"):
        create_engine(f"hf:{tmp_path / 'nowhere'}")


@pytest.fixture(scope="module")
def tiny_mla(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = transformers.DeepseekV3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=2,  # dense MLPs only: the test is about attention
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=0,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=256,
    )
    model = transformers.DeepseekV3ForCausalLM(cfg)
    path = tmp_path_factory.mktemp("tiny-mla")
    model.save_pretrained(path)
    return path


def test_hf_engine_prices_mla_attention_as_expanded_not_absorbed(
    tiny_mla: Path, runs_dir: Path
) -> None:
    """transformers expands the MLA latent per attended token; the spec must say so, or
    decode's FLOPs and bytes would be those of vLLM's absorbed kernel."""
    opts = RunOptions(
        engine=f"hf:{tiny_mla}",
        workload=WorkloadConfig(
            requests=2, prompt_len=LengthDist("constant", 8), output_len=LengthDist("constant", 4)
        ),
        engine_options=EngineOptions(batch_size=2),
        runs_dir=runs_dir,
        telemetry=TelemetryConfig(enabled=False),
    )
    out = execute_run(opts)
    assert out.status == "complete"
    model = out.summary["model"]
    assert model["kv_lora_rank"] == 16
    assert model["mla_absorbed"] is False


def test_assisted_generation_records_proposed_and_accepted_tokens(
    tiny_llama: Path, runs_dir: Path, tmp_path: Path
) -> None:
    # The assistant is the model itself: every proposed token is accepted.
    same = tmp_path / "same"
    transformers.LlamaForCausalLM.from_pretrained(tiny_llama).save_pretrained(same)
    opts = RunOptions(
        engine=f"hf:{tiny_llama}",
        workload=WorkloadConfig(
            requests=2, prompt_len=LengthDist("constant", 10), output_len=LengthDist("constant", 15)
        ),
        engine_options=EngineOptions(extra={"assistant": str(same), "num_assistant_tokens": "3"}),
        runs_dir=runs_dir,
        telemetry=TelemetryConfig(enabled=False),
    )
    out = execute_run(opts)
    s = out.summary
    assert out.status == "complete"
    assert s["counts"]["output_tokens"] == 30
    sp = s["speculative"]
    assert sp["num_speculative_tokens"] == 3
    assert sp["acceptance_rate"] == pytest.approx(1.0)
    # 15 tokens in passes of 4 (3 accepted + the model's own): 4, 4, 4, 3.
    assert sp["verify_steps"] == 2 * 4
    assert "draft_decode" in s["steps"]
    assert s["latency"]["tpot"]["count"] == 2
    if s["roofline"]["available"]:
        assert "draft_decode" in s["roofline"]["phases"]


def test_assistant_with_another_vocabulary_is_refused(tiny_llama: Path, tmp_path: Path) -> None:
    cfg = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    other = tmp_path / "other"
    transformers.LlamaForCausalLM(cfg).save_pretrained(other)
    with pytest.raises(UsageError, match="shared tokenizer"):
        create_engine(f"hf:{tiny_llama}", EngineOptions(extra={"assistant": str(other)}))
