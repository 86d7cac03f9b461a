"""A real third-party server: ``transformers serve`` on a tiny random Llama with a tokenizer
trained here, profiled in online and batch mode, plain and with continuous batching."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from perfscope.cli import main

pytest.importorskip("fastapi", reason="transformers serve needs transformers[serving]")
pytest.importorskip("uvicorn", reason="transformers serve needs transformers[serving]")

pytestmark = pytest.mark.slow


WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "and",
    "runs",
    "far",
    "away",
    "into",
    "the",
    "deep",
    "green",
    "forest",
    "while",
    "birds",
    "sing",
]


def build_tiny_llama(out: Path) -> None:
    """Save a 2-layer random Llama and a BPE tokenizer trained on a toy corpus to ``out``.

    The tokenizer's alphabet is only the corpus characters (no stray bytes), so every
    generated token decodes to text at once: chunks and tokens match one to one.
    """
    import random

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rnd = random.Random(0)
    corpus = [" ".join(rnd.choice(WORDS) for _ in range(30)) for _ in range(300)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"])
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    hf.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    hf.save_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(hf),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg)
    # Random weights may pick the end-of-sequence token at any step; with no EOS in the
    # generation config every request yields exactly max_tokens (transformers serve rejects
    # the ignore_eos field).
    model.generation_config.eos_token_id = None
    model.save_pretrained(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(model: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cli = Path(sys.executable).parent / "transformers"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        [
            str(cli),
            "serve",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("transformers serve exited") from None
            time.sleep(0.3)
    proc.terminate()
    raise RuntimeError("transformers serve did not come up in 60 s")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_llama(out)
    return out


@pytest.fixture(scope="module")
def served(tiny_model: Path) -> Iterator[str]:
    proc, url = _serve(tiny_model)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def _run(url: str, model: Path, runs: Path, *args: str) -> tuple[dict, Path]:  # type: ignore[type-arg]
    argv = [
        "run",
        f"openai:{url}",
        "--model",
        str(model),
        "--tokenizer",
        str(model),
        "--runs-dir",
        str(runs),
        "--no-progress",
        "--json",
        "--no-telemetry",
        *args,
    ]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    assert rc == 0
    summary = json.loads(buf.getvalue())
    return summary, runs / summary["run_id"]


def _check_consistent(summary: dict, run: Path, n: int, out_len: int) -> None:  # type: ignore[type-arg]
    assert summary["status"] == "complete"
    assert summary["counts"]["completed"] == n and summary["counts"]["failed"] == 0
    req = pd.read_parquet(run / "requests.parquet")
    chunks = pd.read_parquet(run / "chunks.parquet")
    # Server usage says out_len tokens each (max_tokens, no EOS stop in transformers serve's
    # default generation config for this model); chunk counts add up to it.
    assert (req["output_tokens"] == out_len).all()
    per_req = chunks.groupby("request_id")["n_tokens"].sum()
    assert (per_req == req.set_index("request_id")["output_tokens"]).all()
    # Timelines: sent <= first token <= last token, chunks in order inside [first, last].
    assert (req["t_sent"] <= req["t_first_token"]).all()
    assert (req["t_first_token"] <= req["t_last_token"]).all()
    span = chunks.merge(req, on="request_id")
    assert ((span["t"] >= span["t_first_token"]) & (span["t"] <= span["t_last_token"])).all()
    # Prompt lengths: the server's own count (synthetic text of 24 tokens, plus BOS).
    assert req["prompt_tokens"].between(24, 26).all()
    cfg = json.loads((run / "manifest.json").read_text())["engine"]["config"]
    assert cfg["client"]["token_count_source"]  # recorded
    mism = cfg["client"]["token_count_mismatch"]
    assert mism["compared"] == n  # client tokenizer vs server usage, compared per request


def test_transformers_serve_online_rate_and_batch(
    served: str, tiny_model: Path, tmp_path: Path
) -> None:
    summary, run = _run(
        served,
        tiny_model,
        tmp_path,
        "--rate",
        "4",
        "--requests",
        "12",
        "--prompt-len",
        "24",
        "--output-len",
        "8",
    )
    _check_consistent(summary, run, 12, 8)
    assert json.loads((run / "manifest.json").read_text())["load"]["mode"] == "online"
    summary, run = _run(
        served,
        tiny_model,
        tmp_path,
        "--mode",
        "batch",
        "--requests",
        "6",
        "--prompt-len",
        "24",
        "--output-len",
        "8",
        "--endpoint",
        "chat",
    )
    assert summary["counts"]["completed"] == 6, summary["errors"]
    assert summary["latency"]["ttft"]["count"] == 6


def test_transformers_serve_continuous_batching(tiny_model: Path, tmp_path: Path) -> None:
    proc, url = _serve(tiny_model, "--continuous-batching")
    try:
        summary, run = _run(
            url,
            tiny_model,
            tmp_path,
            "--mode",
            "batch",
            "--requests",
            "8",
            "--prompt-len",
            "24",
            "--output-len",
            "8",
        )
    finally:
        proc.terminate()
        proc.wait(20)
    _check_consistent(summary, run, 8, 8)
