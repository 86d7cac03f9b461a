"""Prompt datasets: synthetic text of exact token lengths, ShareGPT, shared prefix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from perfscope.errors import WorkloadError
from perfscope.profiler.datasets import WORDS, build_dataset_specs, synthetic_text
from perfscope.profiler.workload import LengthDist, WorkloadConfig, build_workload


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        [" ".join(WORDS)] * 20, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"])
    )
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.mark.parametrize("n", [1, 7, 128, 600])
def test_synthetic_text_has_exactly_the_target_tokens(tok_path: Path, n: int) -> None:
    tok = Tokenizer.from_file(str(tok_path))
    text, got = synthetic_text(n, np.random.default_rng(n), tok)
    assert got == n == len(tok.encode(text, add_special_tokens=False).ids)


def test_synthetic_workload_prompts_differ_and_reproduce(tok_path: Path) -> None:
    cfg = WorkloadConfig(
        requests=5,
        prompt_len=LengthDist("constant", 32),
        dataset="synthetic",
        tokenizer=str(tok_path),
        warmup=1,
    )
    a, b = build_workload(cfg), build_workload(cfg)
    assert [s.prompt for s in a] == [s.prompt for s in b]
    assert len({s.prompt for s in a}) == 6 and a[0].is_warmup and not a[1].is_warmup
    assert all(s.prompt_tokens == 32 for s in a)


def test_shared_prefix_prompts_share_exactly_the_prefix(tok_path: Path) -> None:
    cfg = WorkloadConfig(
        requests=6,
        prompt_len=LengthDist("constant", 16),
        dataset="shared-prefix",
        prefix_len=64,
        tokenizer=str(tok_path),
    )
    specs = build_workload(cfg)
    tok = Tokenizer.from_file(str(tok_path))
    ids = [tok.encode(s.prompt or "", add_special_tokens=False).ids for s in specs]
    assert all(i[:64] == ids[0][:64] for i in ids)
    assert len({tuple(i[64:]) for i in ids}) == 6
    assert all(78 <= s.prompt_tokens <= 82 for s in specs)
    with pytest.raises(WorkloadError, match="--prefix-len"):
        build_workload(WorkloadConfig(requests=2, dataset="shared-prefix"))


def test_sharegpt_uses_first_human_turn_and_reply_length(tmp_path: Path) -> None:
    data = [
        {
            "conversations": [
                {"from": "human", "value": "Tell me a story about a cat"},
                {"from": "gpt", "value": "x" * 400},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "y" * 40},
            ]
        },
        {"conversations": [{"from": "gpt", "value": "no human turn"}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    specs = build_dataset_specs(
        "sharegpt",
        n=4,
        warmup=0,
        prompt_lens=LengthDist("constant", 1),
        output_lens=LengthDist("constant", 9),
        seed=0,
        path=path,
    )
    assert {s.prompt for s in specs} == {"Tell me a story about a cat", "Hi there"}
    assert {s.max_output_tokens for s in specs} == {100, 10}
    fixed = build_dataset_specs(
        "sharegpt",
        n=2,
        warmup=0,
        prompt_lens=LengthDist("constant", 1),
        output_lens=LengthDist("constant", 9),
        seed=0,
        path=path,
        output_len_given=True,
    )
    assert {s.max_output_tokens for s in fixed} == {9}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    with pytest.raises(WorkloadError, match="no usable conversations"):
        build_dataset_specs(
            "sharegpt", n=1, warmup=0, prompt_lens=None, output_lens=None, seed=0, path=bad
        )
