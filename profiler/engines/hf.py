"""``hf:PATH`` — a local Hugging Face causal LM, decoded step by step.

The model and (when present) its tokenizer are loaded from ``PATH`` with
``local_files_only=True``: nothing is downloaded. Requests are grouped by prompt length
(so no padding is computed) into static batches of up to ``batch_size``; each group is
prefilled in one forward pass and decoded one token per row per forward pass with the
model's KV cache, greedily. Every pass is timed after device synchronisation and reported
as a step, with ``logits_to_keep=1`` so the lm_head runs on the last position only.
``--engine-opt attention=sdpa|eager`` picks transformers' attention implementation
(default: the model's own default). ``--threads N`` (``--engine-opt threads=N``) sets the
intra-op threads on the CPU; by default they follow the idle usable CPUs
(:mod:`perfscope.profiler.engines.threads`).

The manifest's model spec is built from the model's ``config.json`` by the front door.

Assisted generation (speculative decoding, ``--engine-opt assistant=PATH`` with a local draft
model folder sharing the tokenizer, and ``num_assistant_tokens=K``, default 4): each request
runs alone through ``generate(assistant_model=...)`` (transformers supports assisted
generation for a batch of one only), greedily, with a constant ``K`` and no confidence cut-off
so the draft proposes exactly ``K`` tokens per step. Forward hooks on both models time every
pass: the draft's are steps with ``role="draft"``; each target pass verifies the candidates
(the first one also prefills the prompt, so it is a ``prefill`` step) and carries
``proposed_tokens`` (draft passes since the previous target pass, one token each) and
``accepted_tokens`` (tokens it emitted, from the streamer, minus its own one).
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
    check_options,
    option_int,
    register_engine,
)
from perfscope.profiler.engines.threads import ThreadChoice, choose_threads
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import StepKind

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


#: The ``--engine-opt`` keys the hf engine reads; any other is refused (see
#: :func:`~perfscope.profiler.engines.base.check_options`).
HF_OPTIONS = ("threads", "attention", "assistant", "num_assistant_tokens")
#: Keys that are command-line flags of their own for this engine.
_HF_FLAGS = {"dtype": "--dtype", "device": "--device", "batch_size": "--batch-size"}


class HFEngine:
    """Serves requests on a local ``AutoModelForCausalLM``."""

    def __init__(self, uri: str, options: EngineOptions) -> None:
        check_options(options.extra, HF_OPTIONS, "hf", flags=_HF_FLAGS)
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
        self._threads_before = torch.get_num_threads()
        self.thread_choice: ThreadChoice | None = None
        requested = option_int(options.extra, "threads")
        if requested is not None or self.device.type == "cpu":
            self.thread_choice = choose_threads(requested)
            torch.set_num_threads(self.thread_choice.threads)
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
        self.assistant: Any = None
        self.num_assistant_tokens = 0
        if options.extra.get("assistant"):
            self._load_assistant(options.extra["assistant"], options.extra)

    def _load_assistant(self, where: str, extra: dict[str, str]) -> None:
        from transformers import AutoModelForCausalLM

        k = option_int(extra, "num_assistant_tokens") or 4
        path = Path(where).expanduser()
        if not (path / "config.json").is_file():
            raise UsageError(
                f"--engine-opt assistant={where!r}: expected a local model folder holding "
                "config.json (nothing is downloaded)"
            )
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(
                path, dtype=self.model.dtype, local_files_only=True
            )
        except (OSError, ValueError) as exc:
            raise UsageError(f"hf engine: cannot load the assistant from {path}: {exc}") from exc
        vocab = int(getattr(model.config, "vocab_size", 0))
        if vocab != self.vocab_size:
            raise UsageError(
                f"assistant {path} has a vocabulary of {vocab} tokens, the model "
                f"{self.vocab_size}: assisted generation here needs a shared tokenizer"
            )
        gc = model.generation_config
        gc.num_assistant_tokens = k
        gc.num_assistant_tokens_schedule = "constant"
        gc.assistant_confidence_threshold = 0.0
        self.assistant = model.to(self.device).eval()
        self.assistant_path = path
        self.num_assistant_tokens = k

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
                # Assisted generation runs one request at a time.
                "batch_size": 1 if self.assistant is not None else self.options.batch_size,
                "stop_on_eos": self.options.stop_on_eos,
                "attention": getattr(self.model.config, "_attn_implementation", self.attention),
                "tokenizer": self.tokenizer is not None,
                "device_name": dev_name,
                "torch": self.torch.__version__,
                "torch_threads": self.torch.get_num_threads(),
                "threads_rule": self.thread_choice.rule if self.thread_choice else None,
                "omp_wait_policy": self.thread_choice.wait_policy if self.thread_choice else None,
                # transformers expands an MLA latent to per-head K/V for every attended
                # token (no absorbed up-projections): the cost model must price that.
                "mla_absorbed": False,
                "speculative": None
                if self.assistant is None
                else {
                    "draft": str(self.assistant_path),
                    "num_speculative_tokens": self.num_assistant_tokens,
                    "method": "transformers assisted generation (batch of one)",
                    "draft_n_params": int(sum(p.numel() for p in self.assistant.parameters())),
                    "draft_hf_config": str((self.assistant_path / "config.json").resolve()),
                },
            },
        )

    def close(self) -> None:
        self.model = None
        self.assistant = None
        self.torch.set_num_threads(self._threads_before)
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
            if self.assistant is not None:
                self._run_assisted(pending.popleft(), recorder)
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

    def _run_assisted(self, sub: Submission, recorder: Recorder) -> None:
        """One request through ``generate(assistant_model=...)`` (see the module doc)."""
        torch = self.torch
        ids = self._ids(sub).view(1, -1).to(self.device)
        run = _Assisted(self, sub, recorder)
        hooks = [
            self.assistant.register_forward_pre_hook(run.draft_pre, with_kwargs=True),
            self.assistant.register_forward_hook(run.draft_post, with_kwargs=True),
            self.model.register_forward_pre_hook(run.target_pre, with_kwargs=True),
            self.model.register_forward_hook(run.target_post, with_kwargs=True),
        ]
        n = sub.spec.max_output_tokens
        eos = self.eos_id if self.options.stop_on_eos else None
        try:
            with torch.no_grad():
                self.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    assistant_model=self.assistant,
                    streamer=run,
                    max_new_tokens=n,
                    min_new_tokens=None if self.options.stop_on_eos else n,
                    do_sample=False,
                    eos_token_id=eos,
                    pad_token_id=self.eos_id if self.eos_id is not None else 0,
                )
        except (RuntimeError, ValueError) as exc:
            sub.handle.finish(error=f"assisted generation failed: {exc}")
            return
        finally:
            for h in hooks:
                h.remove()
        sub.handle.finish()

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


class _Assisted:
    """Hooks and streamer of one assisted ``generate`` call: turn its passes into steps and
    its streamed tokens into chunks."""

    def __init__(self, engine: HFEngine, sub: Submission, recorder: Recorder) -> None:
        self.engine, self.sub, self.recorder = engine, sub, recorder
        self.rid = sub.spec.request_id
        self.prompt_seen = False
        self.drafts = 0  # draft passes since the last target pass
        self.draft_calls = 0
        self.target_calls = 0
        self.t0 = 0
        self.shape = (1, 0, 0)  # rows, new tokens, cached tokens of the pass under way
        self.pending: tuple[StepKind, int, int, tuple[int, int, int], int] | None = None
        self.emitted = 0

    def _start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        cache: Any = kwargs.get(self.engine._cache_arg, kwargs.get("past_key_values"))
        seq_len = getattr(cache, "get_seq_length", None)
        ctx = int(seq_len()) if callable(seq_len) else 0
        b, t = (ids.shape[0], ids.shape[1]) if ids is not None else (1, 0)
        self.shape = (int(b), int(t), int(ctx) * int(b))
        self.engine._sync()
        self.t0 = self.recorder.clock.now_ns()

    def draft_pre(self, _m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._start(args, kwargs)

    def draft_post(self, _m: Any, _args: Any, _kwargs: Any, _out: Any) -> None:
        self.engine._sync()
        t1 = self.recorder.clock.now_ns()
        b, n, ctx = self.shape
        kind: StepKind = "prefill" if self.draft_calls == 0 else "decode"
        self.recorder.step(kind, self.t0, t1, b, b * n, ctx, [self.rid], role="draft")
        self.draft_calls += 1
        self.drafts += 1

    def target_pre(self, _m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._start(args, kwargs)

    def target_post(self, _m: Any, _args: Any, _kwargs: Any, _out: Any) -> None:
        self.engine._sync()
        t1 = self.recorder.clock.now_ns()
        kind: StepKind = "prefill" if self.target_calls == 0 else "decode"
        self.target_calls += 1
        # Recorded when the streamer says how many tokens this pass emitted.
        self.pending = (kind, self.t0, t1, self.shape, self.drafts)
        self.drafts = 0

    # streamer protocol
    def put(self, value: Any) -> None:
        n = int(value.numel())
        if not self.prompt_seen:
            self.prompt_seen = True  # generate streams the prompt first
            return
        t = self.recorder.clock.now_ns()
        n = min(n, self.sub.spec.max_output_tokens - self.emitted)
        if n <= 0:
            return
        self.emitted += n
        if self.pending is not None:
            kind, t0, t1, (b, new, ctx), proposed = self.pending
            self.pending = None
            self.recorder.step(
                kind,
                t0,
                t1,
                b,
                b * new,
                ctx,
                [self.rid],
                proposed_tokens=proposed,
                accepted_tokens=min(max(n - 1, 0), proposed),
            )
        self.sub.handle.tokens(n, t)

    def end(self) -> None:
        pass


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
