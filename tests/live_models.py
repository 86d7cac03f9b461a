"""Tiny random-weight models for the live engine tests (no hub downloads): a byte-level BPE
tokenizer trained here on mixed ASCII/CJK text (so some tokens are lone UTF-8 lead bytes, as
with a real tokenizer), a Hugging Face Llama folder for vLLM and a GGUF file for llama.cpp.

Also used by ``scripts/wire_accuracy.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

__all__ = ["LLAMA_SHAPE", "build_gguf", "build_hf_llama", "train_tokenizer"]

#: The model shape of engines.md: 4 layers, hidden 256, vocab set by the tokenizer.
LLAMA_SHAPE: dict[str, int] = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}

_WORDS = [
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
    "deep",
    "green",
    "forest",
    "while",
    "birds",
    "sing",
    "of",
    "rivers",
    "mountains",
    "light",
    "stone",
]
_CJK = "日本語の文章と中文字符和한국어문장이섞인텍스트"
SPECIALS = ["<unk>", "<s>", "</s>"]


def _corpus(n: int = 400, seed: int = 0) -> list[str]:
    rnd = random.Random(seed)
    lines = []
    for _ in range(n):
        parts = []
        for _ in range(24):
            if rnd.random() < 0.25:
                parts.append("".join(rnd.choice(_CJK) for _ in range(rnd.randint(1, 3))))
            else:
                parts.append(rnd.choice(_WORDS))
        lines.append(" ".join(parts))
    return lines


def train_tokenizer(vocab_size: int = 512) -> Any:
    """A byte-level BPE (``tokenizers.Tokenizer``) with all 256 byte tokens plus merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    return tok


def build_hf_llama(out: Path, *, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Save a random Llama (``LLAMA_SHAPE``) with the trained tokenizer to ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    hf.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    hf.save_pretrained(out)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(hf), bos_token_id=1, eos_token_id=2, torch_dtype=dtype, **LLAMA_SHAPE
    )
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    model.save_pretrained(out)
    return out


def build_gguf(path: Path, *, seed: int = 0, n_ctx: int = 2048) -> Path:
    """Write a random-weight llama GGUF (``LLAMA_SHAPE``, f32) with the trained tokenizer
    stored as tokenizer model ``gpt2`` (byte-level BPE)."""
    import gguf
    import numpy as np

    tok = train_tokenizer()
    state = json.loads(tok.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    merges = state["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    n_vocab = len(tokens)
    hidden = LLAMA_SHAPE["hidden_size"]
    ff = LLAMA_SHAPE["intermediate_size"]
    heads = LLAMA_SHAPE["num_attention_heads"]
    kv_heads = LLAMA_SHAPE["num_key_value_heads"]
    head_dim = hidden // heads
    layers = LLAMA_SHAPE["num_hidden_layers"]

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(n_ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    w.add_add_bos_token(False)

    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(n_vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.add_tensor("output.weight", rand(n_vocab, hidden))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rand(heads * head_dim, hidden))
        w.add_tensor(p + "attn_k.weight", rand(kv_heads * head_dim, hidden))
        w.add_tensor(p + "attn_v.weight", rand(kv_heads * head_dim, hidden))
        w.add_tensor(p + "attn_output.weight", rand(hidden, heads * head_dim))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(ff, hidden))
        w.add_tensor(p + "ffn_up.weight", rand(ff, hidden))
        w.add_tensor(p + "ffn_down.weight", rand(hidden, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def save_tokenizer(path: Path) -> Path:
    """The trained tokenizer as ``tokenizer.json`` in folder ``path`` (for ``--tokenizer``)."""
    path.mkdir(parents=True, exist_ok=True)
    train_tokenizer().save(str(path / "tokenizer.json"))
    return path
