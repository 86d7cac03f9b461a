"""``hf:PATH`` — a local Hugging Face causal LM, decoded step by step.

The model and (when present) its tokenizer are loaded from ``PATH`` with
``local_files_only=True``: nothing is downloaded. Requests are grouped by prompt length
(so no padding is computed) into static batches of up to ``batch_size``; each group is
prefilled in one forward pass and decoded one token per row per forward pass with the
model's KV cache, greedily. Every pass is timed after device synchronisation and reported
as a step, with ``logits_to_keep=1`` so the lm_head runs on the last position only.
``--engine-opt attention=sdpa|eager`` picks transformers' attention implementation
(default: the model's own default).

The manifest's model spec is built from the model's ``config.json`` by the front door.
"""

from __future__ import annotations

import inspect
from collections import deque
from pathlib import Path
from typing import Any

from perfscope.errors import EngineNotFoundError, UsageError
from perfscope.profiler import nvtx_ranges
from perfscope.profiler.engines.base import (
    EngineInfo,
    EngineOptions,
    Inbox,
    Submission,
    register_engine,
)
from perfscope.profiler.recorder import Recorder

__all__ = ["HFEngine"]

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


#: ``--engine-opt attention=...`` → transformers' ``attn_implementation`` ("explicit" is
#: the reference engine's name for the plain matmul path transformers calls "eager").
_ATTENTION = {"eager": "eager", "explicit": "eager", "sdpa": "sdpa"}


def _attention(value: str | None) -> str | None:
    """transformers' ``attn_implementation`` for an ``attention`` option (None: its default)."""
    if value is None or not str(value).strip():
        return None
    key = str(value).strip().lower()
    if key not in _ATTENTION:
        raise UsageError(
            f"hf engine: attention={value!r}: use sdpa or eager (explicit matmuls; "
            "also spelled explicit)"
        )
    return _ATTENTION[key]


class HFEngine:
    """Serves requests on a local ``AutoModelForCausalLM``."""

    def __init__(self, uri: str, options: EngineOptions) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError as exc:  # pragma: no cover - the hf extra is missing
            raise UsageError(
                f"the hf engine needs transformers: pip install 'perfscope[hf]' ({exc})"
            ) from exc
        path = Path(uri.split(":", 1)[1] if ":" in uri else "")
        if not str(path) or not (path / "config.json").is_file():
            raise EngineNotFoundError(
                f"hf engine {uri!r}: expected 'hf:PATH' with a local model folder holding "
                "config.json (nothing is downloaded)"
            )
        self.uri = uri
        self.path = path
        self.options = options
        self.torch = torch
        if options.device is None:
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            try:
                self.device = torch.device(options.device)
            except (RuntimeError, ValueError):
                raise UsageError(
                    f"unknown device {options.device!r}: use cpu, cuda or cuda:N"
                ) from None
            if self.device.type == "cuda" and not torch.cuda.is_available():
                raise UsageError(f"device {options.device!r} requested but CUDA is not available")
        dtype_name = options.dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        self.dtype_name = dtype_name
        self.attention = _attention(options.extra.get("attention"))
        load: dict[str, Any] = {}
        if self.attention is not None:
            load["attn_implementation"] = self.attention
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, _DTYPES[dtype_name]), local_files_only=True, **load
            )
        except (OSError, ValueError) as exc:
            raise UsageError(f"hf engine: cannot load a causal LM from {path}: {exc}") from exc
        self.model = model.to(self.device).eval()
        self.tokenizer = _load_tokenizer(path)
        # transformers 5 renamed ``past_key_values`` to ``cache`` (argument and output).
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        cfg = self.model.config
        self.vocab_size = int(getattr(cfg, "vocab_size", 32000))
        self.eos_id = getattr(cfg, "eos_token_id", None)
        if isinstance(self.eos_id, list):
            self.eos_id = self.eos_id[0] if self.eos_id else None

    def info(self) -> EngineInfo:
        dev_name = (
            str(self.torch.cuda.get_device_name(self.device))
            if self.device.type == "cuda"
            else "cpu"
        )
        return EngineInfo(
            uri=self.uri,
            kind="hf",
            model=None,  # filled from config.json by the front door (hf_config below)
            device=str(self.device),
            dtype=self.dtype_name,
            config={
                "hf_config": str((self.path / "config.json").resolve()),
                "model_type": getattr(self.model.config, "model_type", None),
                "n_params": int(sum(p.numel() for p in self.model.parameters())),
                "scheduler": "static",
                "batch_size": self.options.batch_size,
                "stop_on_eos": self.options.stop_on_eos,
                "attention": getattr(self.model.config, "_attn_implementation", self.attention),
                "tokenizer": self.tokenizer is not None,
                "device_name": dev_name,
                "torch": self.torch.__version__,
            },
        )

    def close(self) -> None:
        self.model = None
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()

    def serve(self, inbox: Inbox, recorder: Recorder) -> None:
        pending: deque[Submission] = deque()
        while True:
            pending.extend(inbox.drain())
            if not pending:
                if inbox.finished:
                    return
                sub = inbox.get()
                if sub is not None:
                    pending.append(sub)
                continue
            # Static batch: the oldest request and up to batch_size-1 waiting ones of the
            # same prompt length.
            head = pending.popleft()
            batch = [head]
            keep: deque[Submission] = deque()
            while pending and len(batch) < self.options.batch_size:
                sub = pending.popleft()
                (batch if self._ids(sub).numel() == self._ids(head).numel() else keep).append(sub)
            pending = keep + pending
            self._run_batch(batch, recorder)

    # --- one static batch -------------------------------------------------------------

    def _ids(self, sub: Submission) -> Any:
        cached = getattr(sub, "_hf_ids", None)
        if cached is not None:
            return cached
        torch = self.torch
        spec = sub.spec
        if spec.prompt_token_ids is not None:
            ids = torch.tensor(spec.prompt_token_ids, dtype=torch.long) % self.vocab_size
        elif spec.prompt is not None and self.tokenizer is not None:
            ids = torch.tensor(self.tokenizer(spec.prompt)["input_ids"], dtype=torch.long)
            sub.handle.set_prompt_tokens(int(ids.numel()))
        else:
            gen = torch.Generator().manual_seed(self.options.seed * 1_000_003 + spec.request_id)
            ids = torch.randint(0, self.vocab_size, (spec.prompt_tokens,), generator=gen)
        sub._hf_ids = ids  # type: ignore[attr-defined]
        return ids

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _forward(
        self,
        kind: str,
        recorder: Recorder,
        batch: list[Submission],
        ids: Any,
        cache: Any,
        context: int,
    ) -> tuple[Any, Any]:
        torch = self.torch
        pushed = nvtx_ranges.push_step(kind, recorder.n_steps)
        t0 = recorder.clock.now_ns()
        with torch.no_grad():
            out = self.model(
                input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_arg: cache}
            )
        nxt = out.logits[:, -1].argmax(-1)
        tokens = nxt.tolist()
        self._sync()
        t1 = recorder.clock.now_ns()
        if pushed:
            nvtx_ranges.pop_range()
        b, t = ids.shape
        recorder.step(
            "prefill" if kind == "prefill" else "decode",
            t0,
            t1,
            b,
            b * t,
            context,
            [s.spec.request_id for s in batch],
        )
        return (nxt, tokens, t1), getattr(out, self._cache_arg)

    def _run_batch(self, batch: list[Submission], recorder: Recorder) -> None:
        torch = self.torch
        ids = torch.stack([self._ids(s) for s in batch]).to(self.device)
        prompt_len = ids.shape[1]
        (nxt, tokens, t1), cache = self._forward("prefill", recorder, batch, ids, None, 0)
        remaining = [s.spec.max_output_tokens for s in batch]
        done = [False] * len(batch)
        length = prompt_len
        while True:
            for i, sub in enumerate(batch):
                if done[i]:
                    continue
                sub.handle.tokens(1, t1)
                remaining[i] -= 1
                eos = self.options.stop_on_eos and tokens[i] == self.eos_id
                if remaining[i] <= 0 or eos:
                    done[i] = True
                    sub.handle.finish()
            if all(done):
                return
            (nxt, tokens, t1), cache = self._forward(
                "decode", recorder, batch, nxt.view(-1, 1), cache, length * len(batch)
            )
            length += 1


def _load_tokenizer(path: Path) -> Any:
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        return None


@register_engine("hf")
def _create(uri: str, options: EngineOptions) -> HFEngine:
    return HFEngine(uri, options)
