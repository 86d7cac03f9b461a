"""The reference engine's scheduler: batched prefill and decode like a serving engine.

``continuous`` (default): requests that arrived are prefilled and join the running decode
batch at the next step, up to ``batch_size``; finished sequences leave at once.
``static``: a batch starts when the engine is idle and ``batch_size`` requests are waiting,
or once the oldest waiting one has waited ``batch_timeout_s`` (0: at once), or when no
more requests will come; it runs until its longest request finishes, and rows that finish
early keep occupying their slot, as in classic static batching.

Engine options (``--engine-opt KEY=VALUE``): ``threads=N`` (``torch.set_num_threads`` while
the engine lives; ``--threads N`` on the command line; default on the CPU: the usable CPUs
that are not busy, see :mod:`perfscope.profiler.engines.threads`),
``attention=explicit|sdpa``, ``quant=none|int8|int8-wo``,
``kv_cache=on|off`` (off: every decode step recomputes the whole sequence, no cache is
read), ``compile=on|off`` (``torch.compile(dynamic=True)`` of each block: kernel fusion;
``compile_backend=inductor|aot_eager|eager``, default inductor, the others trace without
generating kernels, for checking the path quickly), ``kv_dtype=auto|int8|fp8`` (vLLM's
``kv_cache_dtype`` spelling accepted too: KV-cache storage dtype, upcast before attention),
``prune_heads=N`` (remove the N least important query heads of every layer, no fine-tuning:
:mod:`~perfscope.profiler.engines.reference.heads`),
``sparsity=none|unstructured:F|2:4`` (magnitude pruning of the block linears, run as sparse
matmuls; 2:4 needs CUDA) and ``weights=PATH`` (a
state dict saved by :mod:`perfscope.profiler.engines.reference.train`; with fewer
``n_layers`` than it was trained with, the first layers are kept: pruning) or
``weights=trained`` (this shape trained on the synthetic corpus, cached);
``draft=PRESET_OR_PATH`` with ``num_speculative_tokens=K`` and ``draft_layers=N``:
speculative decoding with a draft model (see
:mod:`perfscope.profiler.engines.reference.speculative`);
``decoding=plain|draft|lookahead|medusa`` with ``lookahead_window=N``, ``lookahead_ngram=G``,
``medusa_heads=K`` and ``medusa_steps=N``: parallel decoding without a draft model (see
:mod:`perfscope.profiler.engines.reference.decoding`).

Scheduling options (continuous scheduler, KV cache on): ``prefix_cache=on|off`` (default
off) reuses the K/V of 16-token prompt blocks an earlier request computed
(:mod:`~perfscope.profiler.engines.reference.prefix`; ``prefix_cache_tokens=N`` bounds the
store, LRU): prefill computes only the uncached suffix and each request records its
``cached_tokens``. ``max_batched_tokens=N`` (vLLM's name; default unlimited) caps the tokens
of one step: the running batch's decode tokens first, then chunks of pending prompts in
arrival order (chunked prefill); a step with both is a ``mixed`` step, one forward pass
(:func:`~perfscope.profiler.engines.reference.packed.packed_forward`).

Process options (:mod:`~perfscope.profiler.engines.reference.multiproc`):
``disaggregate=on`` (prefill in one process, decode in another, each request's KV cache
handed over through shared memory and timed) and ``replicas=N`` (N copies of the engine in N
processes, ``dispatch=least-loaded|round-robin``); ``threads=`` is then per process.

Prefill groups the admitted prompts by length, so no padding is ever computed; each group
is one forward pass (with either scheduling option set, the prompts of a step are packed into
one pass instead). A text prompt becomes one token per whitespace-separated word (as
perfscope's datasets count tokens without a tokenizer), so prompts that share words share
tokens. Every forward pass is timed after device synchronisation and
reported as a step.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from dataclasses import dataclass

import torch

from perfscope.errors import UsageError
from perfscope.profiler import nvtx_ranges
from perfscope.profiler.engines.base import (
    Engine,
    EngineInfo,
    EngineOptions,
    Inbox,
    Submission,
    check_options,
    option_choice,
    option_float,
    option_int,
    register_engine,
)
from perfscope.profiler.engines.reference.decoding import DecodingSpec, Proposer, parse_decoding
from perfscope.profiler.engines.reference.heads import HeadPruning, prune_heads
from perfscope.profiler.engines.reference.lookahead import Lookahead
from perfscope.profiler.engines.reference.medusa import HeadsConfig, Medusa, train_heads
from perfscope.profiler.engines.reference.model import (
    ATTENTION_IMPLS,
    KV_DTYPES,
    PRESETS,
    QUANT_MODES,
    KVCache,
    ReferenceConfig,
    ReferenceModel,
    SparsityStats,
    kv_bytes_per_element,
    parse_sparsity,
    quantize_weights,
    sparsify_weights,
    torch_dtype,
)
from perfscope.profiler.engines.reference.packed import Chunk, packed_forward
from perfscope.profiler.engines.reference.paged import (
    DEFAULT_BLOCK_TOKENS,
    PagedKVCache,
    PagedPlan,
    plan_paged,
)
from perfscope.profiler.engines.reference.prefix import DEFAULT_CAPACITY_TOKENS, PrefixCache
from perfscope.profiler.engines.reference.speculative import (
    Speculator,
    build_draft,
    parse_draft,
)
from perfscope.profiler.engines.threads import ThreadChoice, choose_threads
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec, StepKind

__all__ = ["ReferenceEngine"]

#: ``compile_backend`` engine option: torch.compile backends (inductor generates fused
#: kernels; aot_eager and eager only trace, to check the compiled path in seconds).
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")

#: Token id that ends a sequence when ``stop_on_eos`` is set.
EOS_TOKEN_ID = 0


@dataclass
class _Seq:
    sub: Submission
    length: int  # tokens in the KV cache
    generated: int  # output tokens emitted
    next_token: int
    done: bool = False
    ids: list[int] | None = None  # every token so far, kept only when the KV cache is off

    @property
    def over(self) -> bool:
        """Finished here, or given up on by the run (``--timeout`` expired it): either way
        its slot is free and decoding it further would only spend compute."""
        return self.done or self.sub.handle.done


@dataclass
class _Fill:
    """A prompt being prefilled (possibly over several steps) in cache ``slot``."""

    sub: Submission
    ids: torch.Tensor  # the whole prompt
    id_list: list[int]
    slot: int
    done: int  # prompt tokens in the cache (reused prefix + computed chunks)
    cached: int  # of which reused from the prefix cache


def _pick_device(requested: str | None) -> torch.device:
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(requested)
    except (RuntimeError, ValueError):
        raise UsageError(
            f"unknown device {requested!r}: the reference engine runs on cpu, cuda or cuda:N"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {requested!r} requested but CUDA is not available here")
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"device {requested!r}: the reference engine runs on cpu or cuda")
    return dev


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def memory_needed(
    cfg: ReferenceConfig, slots: int, max_len: int, kv_dtype: str = "auto"
) -> tuple[int, int, int]:
    """Bytes the engine allocates: (float32 weights while building on the CPU, weights in
    ``cfg.dtype``, KV cache of ``slots`` sequences of ``max_len`` tokens stored in
    ``kv_dtype``, int8 scales included)."""
    n = cfg.n_params()
    itemsize = torch_dtype(cfg.dtype).itemsize
    elements = 2 * cfg.n_layers * slots * cfg.n_kv_heads * max_len * cfg.head_dim
    kv = round(elements * kv_bytes_per_element(cfg, kv_dtype))
    return 4 * n, n * itemsize, kv


def check_memory(
    cfg: ReferenceConfig,
    slots: int,
    max_len: int,
    device: torch.device,
    kv_dtype: str = "auto",
) -> None:
    """Refuse (UsageError, with the numbers) a model or cache that cannot fit in memory.

    Checked before anything is allocated: the weights are drawn in float32 on the CPU and then
    cast and moved; the KV cache is allocated on ``device`` in ``kv_dtype``.
    """
    import psutil

    build, weights, kv = memory_needed(cfg, slots, max_len, kv_dtype)
    host_free = psutil.virtual_memory().available
    shape = (
        f"{cfg.n_params():,} parameters ({cfg.n_layers} layers, hidden {cfg.hidden_size}, "
        f"MLP {cfg.intermediate_size}, vocab {cfg.vocab_size})"
    )
    fix = "use a smaller preset or --layers/--hidden/--mlp/--vocab"
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        if build > host_free:
            raise UsageError(
                f"reference model of {shape} needs {_gb(build)} of host memory to build, "
                f"{_gb(host_free)} is available: {fix}"
            )
        need, where, avail = weights + kv, str(device), free
    else:
        # The float32 draft and the cast copy coexist for a moment unless dtype is float32.
        draft = build + (weights if cfg.dtype != "float32" else 0)
        need, where, avail = max(draft, weights + kv), "host", host_free
    if need > avail:
        raise UsageError(
            f"reference model of {shape} needs about {_gb(need)} of {where} memory "
            f"({_gb(weights)} weights in {cfg.dtype} + {_gb(kv)} KV cache for {slots} x "
            f"{max_len} tokens in {cfg.dtype if kv_dtype == 'auto' else kv_dtype}), "
            f"{_gb(avail)} is available: {fix}, or lower --batch-size "
            "or the prompt/output lengths"
        )


class ReferenceEngine:
    """Serves requests on a :class:`ReferenceModel` with random weights."""

    def __init__(self, uri: str, options: EngineOptions) -> None:
        preset = options.model_preset or "small"
        if preset not in PRESETS:
            raise UsageError(f"unknown model preset {preset!r}: use one of {', '.join(PRESETS)}")
        if options.scheduler not in ("continuous", "static"):
            raise UsageError(
                f"unknown scheduler {options.scheduler!r}: use 'continuous' or 'static'"
            )
        if options.batch_timeout_s < 0:
            raise UsageError(f"--batch-timeout must be 0 or more, got {options.batch_timeout_s}")
        if options.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, got {options.batch_size}")
        self.uri = uri
        self.options = options
        self.device = _pick_device(options.device)
        dtype = options.dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        try:
            self.config: ReferenceConfig = PRESETS[preset].with_overrides(
                dtype=dtype, **options.model_overrides
            )
        except (ValueError, TypeError) as exc:
            raise UsageError(f"reference model: {exc}") from exc
        self.preset = preset
        extra = dict(options.extra)
        check_options(extra, REFERENCE_OPTIONS, "reference", flags=_FLAG_OPTIONS)
        self.kv_dtype = _kv_dtype(extra)
        try:
            self.sparsity = parse_sparsity(extra.get("sparsity", "none"))
        except ValueError as exc:
            raise UsageError(f"--engine-opt {exc}") from None
        check_memory(
            self.config, options.batch_size, options.max_seq_len, self.device, self.kv_dtype
        )
        self.threads = option_int(extra, "threads")
        self.attention = option_choice(extra, "attention", ATTENTION_IMPLS, "explicit")
        self.quant = option_choice(extra, "quant", QUANT_MODES, "none")
        self.kv_cache = option_choice(extra, "kv_cache", ("on", "off"), "on") == "on"
        self.compiled = option_choice(extra, "compile", ("off", "on"), "off") == "on"
        self.compile_backend = option_choice(extra, "compile_backend", COMPILE_BACKENDS, "inductor")
        self.weights = extra.get("weights")
        self.prune_heads = _prune_heads(extra)
        self.kv_paged = option_choice(extra, "kv_paged", ("off", "on"), "off") == "on"
        self.kv_block_tokens = option_int(extra, "kv_block_tokens") or DEFAULT_BLOCK_TOKENS
        budget_mb = option_float(extra, "kv_budget_mb", 0.0) if "kv_budget_mb" in extra else None
        self.kv_budget_bytes = None if budget_mb is None else int(budget_mb * 1e6)
        self.prefix_cache = option_choice(extra, "prefix_cache", ("off", "on"), "off") == "on"
        self.prefix_cache_tokens = (
            option_int(extra, "prefix_cache_tokens") or DEFAULT_CAPACITY_TOKENS
        )
        self.max_batched_tokens = option_int(extra, "max_batched_tokens")
        #: Set to ``{}`` to keep every emitted token id per request id (tests compare the
        #: outputs of scheduling options); None keeps nothing.
        self.output_ids: dict[int, list[int]] | None = None
        self._check_scheduling_options()
        self._threads_before = torch.get_num_threads()
        # On the CPU the intra-op threads follow the CPUs really free (threads.py); on CUDA
        # only an explicit threads= changes them (host threads barely matter there).
        self.thread_choice: ThreadChoice | None = None
        if self.threads is not None or self.device.type == "cpu":
            self.thread_choice = choose_threads(self.threads)
            torch.set_num_threads(self.thread_choice.threads)
        self.model = ReferenceModel.build(self.config, seed=options.seed, device=self.device)
        if self.weights == "trained":
            from perfscope.profiler.engines.reference.train import TrainConfig, train

            overrides = tuple(sorted((k, int(v)) for k, v in options.model_overrides.items()))
            self.weights = str(train(TrainConfig(preset=preset, overrides=overrides)).path)
        if self.weights:
            _load_weights(self.model, self.weights)
        self.head_pruning: HeadPruning | None = None
        if self.prune_heads:
            try:
                self.head_pruning = prune_heads(self.model, self.prune_heads)
            except ValueError as exc:
                raise UsageError(f"--engine-opt {exc}") from None
            self.config = self.model.cfg
        self.model.set_attention(self.attention)
        self.model.set_kv_dtype(self.kv_dtype)
        if self.sparsity.kind != "none" and self.quant != "none":
            raise UsageError("--engine-opt sparsity= and quant= cannot be combined: pick one")
        try:
            self.model = quantize_weights(self.model, self.quant)
            self.sparse_stats: SparsityStats = sparsify_weights(self.model, self.sparsity)
        except ValueError as exc:
            raise UsageError(f"reference engine: {exc}") from exc
        if self.compiled:
            for block in self.model.blocks:
                block.forward = torch.compile(
                    block.forward, dynamic=True, backend=self.compile_backend
                )
        self.max_seq_len = options.max_seq_len
        self._spec: Proposer | None = None
        self.draft = parse_draft(extra, target_trained=bool(self.weights))
        self.decoding, self.parallel = parse_decoding(extra, has_draft=self.draft is not None)
        if self.decoding != "draft":
            self.draft = None  # decoding=plain (or another method) turns a given draft off
        self.medusa: Medusa | None = None
        #: Sequences decoded together: ``batch_size``, or fewer when a contiguous cache's
        #: ``kv_budget_mb`` holds fewer of ``max_seq_len`` (:meth:`_kv_plan`).
        self.slots = self._kv_plan()
        self.draft_model: ReferenceModel | None = None
        #: Emitted token ids per request id (speculative decoding only; tests compare them).
        self.outputs: dict[int, list[int]] = {}
        if self.decoding != "plain":
            what = "draft=" if self.draft is not None else f"decoding={self.decoding}"
            if not self.kv_cache:
                raise UsageError(
                    f"--engine-opt {what} needs the KV cache: speculative decoding rolls "
                    "caches back; drop kv_cache=off"
                )
            if self.prefix_cache or self.max_batched_tokens is not None:
                raise UsageError(
                    f"--engine-opt {what} cannot be combined with prefix_cache=on or "
                    "max_batched_tokens= yet (the packed scheduler has no speculative "
                    "step): drop one of them"
                )
        if self.parallel is not None and self.parallel.method == "medusa":
            if self.quant != "none" or self.sparsity.kind != "none":
                raise UsageError(
                    "--engine-opt decoding=medusa trains its heads on the float model: drop "
                    "quant= / sparsity="
                )
            heads = train_heads(
                self.model,
                self.weights,
                HeadsConfig(k=self.parallel.k, steps=self.parallel.train_steps),
            )
            self.medusa = Medusa(self.model, heads, self._sync)
        if self.draft is not None:
            self.draft_model = build_draft(
                self.draft, self.config, seed=options.seed, device=self.device, load=_load_weights
            )
            self.draft_model.set_attention(self.attention)

    # --- protocol -----------------------------------------------------------------------

    def info(self) -> EngineInfo:
        spec = self.config.model_spec()
        if self.quant != "none":
            spec["weight_dtype"] = "int8"
            spec["weight_bytes_per_param"] = 1.0
        if self.kv_dtype != "auto":
            spec["kv_dtype"] = self.kv_dtype
            spec["kv_bytes_per_element"] = kv_bytes_per_element(self.config, self.kv_dtype)
        if self.sparsity.kind != "none":
            spec["weight_density"] = self.sparse_stats.density
            spec["weight_index_bytes_per_nonzero"] = self.sparse_stats.index_bytes_per_nonzero
        return EngineInfo(
            uri=self.uri,
            kind="reference",
            model=spec,
            device=str(self.device),
            dtype=self.config.dtype,
            config={
                "preset": self.preset,
                "shape": self.config.to_dict(),
                "n_params": self.config.n_params(),
                "scheduler": self.options.scheduler,
                "batch_size": self.options.batch_size,
                "batch_timeout_s": self.options.batch_timeout_s,
                "seed": self.options.seed,
                "stop_on_eos": self.options.stop_on_eos,
                "max_seq_len": self.max_seq_len,
                "device_name": _device_name(self.device),
                "torch": torch.__version__,
                "torch_threads": torch.get_num_threads(),
                "threads_rule": self.thread_choice.rule if self.thread_choice else None,
                "omp_wait_policy": self.thread_choice.wait_policy if self.thread_choice else None,
                "attention": self.attention,
                "quant": self.quant,
                "kv_cache": self.kv_cache,
                "compile": self.compiled,
                "compile_backend": self.compile_backend if self.compiled else None,
                "prune_heads": self.prune_heads,
                "kv_paged": self.kv_paged,
                "kv_block_tokens": self.kv_block_tokens if self.kv_paged else None,
                "kv_budget_bytes": self.kv_budget_bytes,
                "kv_slots": self.slots,
                "kv_blocks": self.kv_plan.n_blocks if self.kv_plan and self.kv_paged else None,
                "pruned_heads": (
                    [list(r) for r in self.head_pruning.removed] if self.head_pruning else None
                ),
                "weights": self.weights,
                "kv_dtype": self.kv_dtype,
                "sparsity": self.sparsity.label,
                "weight_density": self.sparse_stats.density,
                "prefix_cache": self.prefix_cache,
                "prefix_cache_tokens": self.prefix_cache_tokens if self.prefix_cache else None,
                "max_batched_tokens": self.max_batched_tokens,
                "speculative": self._speculative_info(),
            },
        )

    def _speculative_info(self) -> dict[str, object] | None:
        """The method, the draft and K (None without speculation); ``draft_model`` is the
        draft's ModelSpec (absent for lookahead and medusa: no draft passes run)."""
        if self.parallel is not None:
            return _parallel_info(self.parallel, self.config.n_params())
        if self.draft is None or self.draft_model is None:
            return None
        cfg = self.draft_model.cfg
        return {
            "method": "draft",
            "draft": self.draft.source,
            "num_speculative_tokens": self.draft.k,
            "draft_weights": self.draft.weights,
            "draft_shape": cfg.to_dict(),
            "draft_n_params": cfg.n_params(),
            "draft_model": {**cfg.model_spec(), "name": f"draft:{self.draft.source}"},
            "target_n_params": self.config.n_params(),
        }

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        self.draft_model = None
        self._spec = None
        if self.medusa is not None:
            self.medusa.close()
            self.medusa = None
        torch.set_num_threads(self._threads_before)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def serve(self, inbox: Inbox, recorder: Recorder) -> None:
        if self.prefix_cache or self.max_batched_tokens is not None:
            self._serve_packed(inbox, recorder)
            return
        bs = self.slots
        spare = 0
        if self.draft is not None and self.draft_model is not None:
            # A verify pass writes up to K positions past the accepted length.
            spare = self.draft.k + 1
            self._spec = Speculator(
                self.draft_model, self.draft.k, bs, self.max_seq_len + spare, self._sync
            )
        elif self.parallel is not None:
            spare = self.parallel.k + 1
            self._spec = self._proposer(self.parallel)
        cache = self._new_cache(bs, self.max_seq_len + spare)
        pending: deque[Submission] = deque()
        running: list[_Seq] = []
        static = self.options.scheduler == "static"
        while True:
            pending.extend(inbox.drain())
            if not running and not pending:
                if inbox.finished:
                    return
                sub = inbox.get()  # idle: wait for the next arrival
                if sub is not None:
                    pending.append(sub)
                continue
            if static:
                if not running:
                    wait_s = self._batch_wait_s(pending, inbox, recorder)
                    if wait_s > 0:
                        sub = inbox.get(timeout_s=wait_s)  # let the batch fill
                        if sub is not None:
                            pending.append(sub)
                        continue
                    self._admit(pending, running, bs, cache, recorder)
            elif len(running) < bs and pending:
                self._admit(pending, running, bs, cache, recorder)
            self._drop_finished(running, cache, static)
            if running:
                self._decode(running, cache, recorder)
                self._drop_finished(running, cache, static)

    # --- scheduling -----------------------------------------------------------------------

    def _admit(
        self,
        pending: deque[Submission],
        running: list[_Seq],
        bs: int,
        cache: KVCache,
        recorder: Recorder,
    ) -> None:
        admitted: list[Submission] = []
        while pending and len(running) + len(admitted) < bs:
            sub = pending.popleft()
            need = sub.spec.prompt_tokens + sub.spec.max_output_tokens
            if sub.handle.done:
                continue  # --timeout expired it while it queued: never prefill it
            if sub.spec.prompt_tokens < 1:
                sub.handle.finish(error="empty prompt")
            elif need > self.max_seq_len:
                sub.handle.finish(
                    error=f"prompt + output = {need} tokens exceeds max_seq_len {self.max_seq_len}"
                )
            elif isinstance(cache, PagedKVCache):
                got = self._reserve(cache, sub, len(running) + len(admitted), pending)
                if got == "wait":
                    break
                if got == "ok":
                    admitted.append(sub)
            else:
                admitted.append(sub)
        groups: dict[int, list[Submission]] = {}
        for sub in admitted:
            groups.setdefault(sub.spec.prompt_tokens, []).append(sub)
        for length, subs in groups.items():
            start = len(running)
            tokens = torch.stack([self._prompt_ids(s) for s in subs]).to(self.device)
            pushed = nvtx_ranges.push_step("prefill", recorder.n_steps)
            t0 = recorder.clock.now_ns()
            logits = self.model.prefill(tokens, cache.view(start, len(subs)))
            first = logits.argmax(-1).tolist()  # .tolist() synchronises the device
            self._sync()
            t1 = recorder.clock.now_ns()
            if pushed:
                nvtx_ranges.pop_range()
            recorder.step(
                "prefill",
                t0,
                t1,
                len(subs),
                length * len(subs),
                0,
                [s.spec.request_id for s in subs],
            )
            if self._spec is not None:
                self._spec.prefill(tokens, start, [s.spec.request_id for s in subs], recorder)
            rows = tokens.tolist() if not self.kv_cache else [None] * len(subs)
            for sub, tok, row in zip(subs, first, rows, strict=True):
                seq = _Seq(sub=sub, length=length, generated=1, next_token=int(tok), ids=row)
                sub.handle.tokens(1, t1)
                self._keep(sub, int(tok))
                if self._spec is not None:
                    self.outputs[sub.spec.request_id] = [int(tok)]
                if seq.generated >= sub.spec.max_output_tokens or self._is_eos(tok):
                    seq.done = True
                    sub.handle.finish()
                running.append(seq)

    def _recompute(self, running: list[_Seq], cache: KVCache) -> list[int]:
        """Next tokens without a KV cache: each sequence so far goes through a full
        forward pass again (grouped by length; the cache is scratch, never read back)."""
        nxt = [0] * len(running)
        groups: dict[int, list[int]] = {}
        for i, seq in enumerate(running):
            assert seq.ids is not None
            seq.ids.append(seq.next_token)
            groups.setdefault(len(seq.ids), []).append(i)
        for idx in groups.values():
            tokens = torch.tensor([running[i].ids for i in idx], device=self.device)
            out = self.model.prefill(tokens, cache.view(0, len(idx))).argmax(-1).tolist()
            for i, tok in zip(idx, out, strict=True):
                nxt[i] = int(tok)
        return nxt

    def _decode(self, running: list[_Seq], cache: KVCache, recorder: Recorder) -> None:
        if self._spec is not None:
            self._speculative_decode(self._spec, running, cache, recorder)
            return
        tokens = torch.tensor([s.next_token for s in running], device=self.device)
        lengths = torch.tensor([s.length for s in running], device=self.device)
        context = sum(s.length for s in running)
        pushed = nvtx_ranges.push_step("decode", recorder.n_steps)
        t0 = recorder.clock.now_ns()
        if self.kv_cache:
            logits = self.model.decode(tokens, cache, lengths)
            nxt = logits.argmax(-1).tolist()
        else:
            nxt = self._recompute(running, cache)
        self._sync()
        t1 = recorder.clock.now_ns()
        if pushed:
            nvtx_ranges.pop_range()
        recorder.step(
            "decode",
            t0,
            t1,
            len(running),
            len(running),
            context,
            [s.sub.spec.request_id for s in running],
        )
        for seq, tok in zip(running, nxt, strict=True):
            seq.length += 1
            seq.next_token = int(tok)
            if seq.over:
                continue  # static batching: a finished row still occupies its slot
            seq.generated += 1
            seq.sub.handle.tokens(1, t1)
            self._keep(seq.sub, int(tok))
            if seq.generated >= seq.sub.spec.max_output_tokens or self._is_eos(tok):
                seq.done = True
                seq.sub.handle.finish()

    def _proposer(self, p: DecodingSpec) -> Proposer:
        if p.method == "lookahead":
            return Lookahead(p.k, p.ngram, self._sync)
        assert self.medusa is not None
        return self.medusa

    def _speculative_decode(
        self, spec: Proposer, running: list[_Seq], cache: KVCache, recorder: Recorder
    ) -> None:
        """One speculative step (draft K tokens, verify, accept); several tokens per row."""
        results, t1 = spec.step(
            self.model,
            cache,
            [s.sub.spec.request_id for s in running],
            [s.length for s in running],
            [s.next_token for s in running],
            [not s.done for s in running],
            recorder,
            self.device,
        )
        for seq, res in zip(running, results, strict=True):
            if seq.done:
                continue  # static batching: the row keeps its slot and its length
            room = seq.sub.spec.max_output_tokens - seq.generated
            emit = res.tokens[:room]
            if self.options.stop_on_eos:
                eos = [i for i, t in enumerate(emit) if t == EOS_TOKEN_ID]
                emit = emit[: eos[0] + 1] if eos else emit
            seq.length += res.accepted + 1
            seq.next_token = res.tokens[-1]
            seq.generated += len(emit)
            self.outputs.setdefault(seq.sub.spec.request_id, []).extend(emit)
            seq.sub.handle.tokens(len(emit), t1)
            if seq.generated >= seq.sub.spec.max_output_tokens or (emit and self._is_eos(emit[-1])):
                seq.done = True
                seq.sub.handle.finish()
                spec.forget(seq.sub.spec.request_id)

    def _drop_finished(self, running: list[_Seq], cache: KVCache, static: bool) -> None:
        if static:
            if running and all(s.over for s in running):
                if isinstance(cache, PagedKVCache):
                    for slot in range(len(running)):
                        cache.release(slot)
                running.clear()
            return
        i = 0
        while i < len(running):
            if running[i].over:
                if isinstance(cache, PagedKVCache):
                    cache.release(i)
                last = running.pop()
                if i < len(running):
                    cache.move(len(running), i, last.length)
                    if self._spec is not None:
                        self._spec.move(len(running), i, last.length)
                    running[i] = last
            else:
                i += 1

    # --- prefix caching and chunked prefill -------------------------------------------------

    def _check_scheduling_options(self) -> None:
        if not (self.prefix_cache or self.max_batched_tokens is not None):
            return
        what = "prefix_cache=on" if self.prefix_cache else "max_batched_tokens"
        if self.options.scheduler != "continuous":
            raise UsageError(f"--engine-opt {what} needs --scheduler continuous")
        if not self.kv_cache:
            raise UsageError(f"--engine-opt {what} needs the KV cache (kv_cache=on)")
        n = self.max_batched_tokens
        if n is not None and n < self.options.batch_size:
            raise UsageError(
                f"--engine-opt max_batched_tokens={n} is below --batch-size "
                f"{self.options.batch_size}: a step must fit one decode token per sequence "
                "(raise it or lower --batch-size)"
            )

    def _serve_packed(self, inbox: Inbox, recorder: Recorder) -> None:
        """The continuous scheduler with prefix reuse and/or a token budget per step.

        Slots: decoding sequences in ``0..R-1`` (as :meth:`ReferenceModel.decode` needs),
        prompts being prefilled right after them in arrival order. Without a budget each
        iteration is one prefill pass of every admitted prompt's uncached part, then one
        decode step (as :meth:`serve`); with one, each iteration is one step of at most
        ``max_batched_tokens`` tokens.
        """
        bs = self.options.batch_size
        cache = self.model.new_cache(bs, self.max_seq_len)
        store = PrefixCache(self.prefix_cache_tokens) if self.prefix_cache else None
        pending: deque[Submission] = deque()
        running: list[_Seq] = []
        filling: list[_Fill] = []
        budget = self.max_batched_tokens
        while True:
            pending.extend(inbox.drain())
            if not running and not pending and not filling:
                if inbox.finished:
                    return
                sub = inbox.get()
                if sub is not None:
                    pending.append(sub)
                continue
            self._admit_fill(pending, running, filling, bs, cache, store)
            if budget is None:
                if filling:
                    self._packed_step([], filling, running, None, cache, recorder, store)
                    self._compact(running, filling, cache)
                if running:
                    self._decode(running, cache, recorder)
                    self._compact(running, filling, cache)
            elif running or filling:
                self._packed_step(list(running), filling, running, budget, cache, recorder, store)
                self._compact(running, filling, cache)

    def _admit_fill(
        self,
        pending: deque[Submission],
        running: list[_Seq],
        filling: list[_Fill],
        bs: int,
        cache: KVCache,
        store: PrefixCache | None,
    ) -> None:
        while pending and len(running) + len(filling) < bs:
            sub = pending.popleft()
            need = sub.spec.prompt_tokens + sub.spec.max_output_tokens
            if sub.handle.done:
                continue  # --timeout expired it while it queued: never prefill it
            if sub.spec.prompt_tokens < 1:
                sub.handle.finish(error="empty prompt")
                continue
            if need > self.max_seq_len:
                sub.handle.finish(
                    error=f"prompt + output = {need} tokens exceeds max_seq_len {self.max_seq_len}"
                )
                continue
            ids = self._prompt_ids(sub)
            id_list = [int(t) for t in ids.tolist()]
            slot = len(running) + len(filling)
            cached = 0
            if store is not None:
                cached = store.load(store.match(id_list), cache, slot)
                sub.handle.record.cached_tokens = cached
            filling.append(_Fill(sub, ids, id_list, slot, done=cached, cached=cached))

    def _packed_step(
        self,
        dec: list[_Seq],
        filling: list[_Fill],
        running: list[_Seq],
        budget: int | None,
        cache: KVCache,
        recorder: Recorder,
        store: PrefixCache | None,
    ) -> None:
        """One forward pass: decode rows ``dec`` (slots 0..R-1) and, within ``budget``
        tokens (None: no limit), the next chunks of ``filling`` in order. Prompts that
        complete emit their first token and join ``running``."""
        left = math.inf if budget is None else budget - len(dec)
        chunks: list[Chunk] = []
        for f in filling:
            if left <= 0:
                break
            q = int(min(len(f.id_list) - f.done, left))
            end = f.done + q
            chunks.append(Chunk(f.slot, f.done, f.ids[f.done : end], end == len(f.id_list)))
            left -= q
        if not chunks:
            if dec:
                self._decode(dec, cache, recorder)
            return
        kind: StepKind = "mixed" if dec else "prefill"
        tokens = torch.tensor([s.next_token for s in dec], dtype=torch.long, device=self.device)
        lengths = torch.tensor([s.length for s in dec], dtype=torch.long, device=self.device)
        pushed = nvtx_ranges.push_step(kind, recorder.n_steps)
        t0 = recorder.clock.now_ns()
        dec_logits, firsts = packed_forward(self.model, cache, tokens, lengths, chunks)
        nxt = dec_logits.argmax(-1).tolist() if dec_logits is not None else []
        first = [int(x.argmax().item()) for x in firsts]
        self._sync()
        t1 = recorder.clock.now_ns()
        if pushed:
            nvtx_ranges.pop_range()
        recorder.step(
            kind,
            t0,
            t1,
            len(dec) + len(chunks),
            len(dec) + sum(len(c.ids) for c in chunks),
            sum(s.length for s in dec) + sum(c.start for c in chunks),
            [s.sub.spec.request_id for s in dec]
            + [f.sub.spec.request_id for f in filling[: len(chunks)]],
        )
        for seq, tok in zip(dec, nxt, strict=True):
            self._advance(seq, int(tok), t1)
        done = 0
        for f, c in zip(filling, chunks, strict=False):
            f.done += len(c.ids)
            if not c.logits:
                continue
            tok = first[done]
            done += 1
            if store is not None:
                store.store(f.id_list, cache, f.slot)
            seq = _Seq(sub=f.sub, length=len(f.id_list), generated=1, next_token=tok)
            f.sub.handle.tokens(1, t1)
            self._keep(f.sub, tok)
            if seq.generated >= f.sub.spec.max_output_tokens or self._is_eos(tok):
                seq.done = True
                f.sub.handle.finish()
            running.append(seq)
        del filling[:done]
        assert all(f.slot == len(running) + j for j, f in enumerate(filling))

    def _advance(self, seq: _Seq, tok: int, t_ns: int) -> None:
        """A decode row got its next token ``tok`` at ``t_ns`` (continuous scheduler)."""
        seq.length += 1
        seq.next_token = tok
        seq.generated += 1
        seq.sub.handle.tokens(1, t_ns)
        self._keep(seq.sub, tok)
        if seq.generated >= seq.sub.spec.max_output_tokens or self._is_eos(tok):
            seq.done = True
            seq.sub.handle.finish()

    @staticmethod
    def _compact(running: list[_Seq], filling: list[_Fill], cache: KVCache) -> None:
        """Drop finished sequences; keep decoding slots contiguous from 0 and the prompts
        being filled right after them."""
        i = 0
        while i < len(running):
            if not running[i].over:
                i += 1
                continue
            last = running.pop()
            if i < len(running):
                cache.move(len(running), i, last.length)
                running[i] = last
            for f in filling:
                cache.move(f.slot, f.slot - 1, f.done)
                f.slot -= 1

    # --- KV budget and paged cache ---------------------------------------------------------

    def _kv_plan(self) -> int:
        """Check the paged-cache options; the slots (sequences decoded together)."""
        bs = self.options.batch_size
        self.kv_plan: PagedPlan | None = None
        if not self.kv_paged and self.kv_budget_bytes is None:
            return bs
        spec = self.draft is not None or self.parallel is not None
        if self.prefix_cache or self.max_batched_tokens is not None or spec:
            raise UsageError(
                "--engine-opt kv_paged= / kv_budget_mb= run with the plain scheduler only: "
                "drop prefix_cache, max_batched_tokens, draft or decoding"
            )
        if not self.kv_cache or self.kv_dtype != "auto":
            raise UsageError(
                "--engine-opt kv_paged= / kv_budget_mb= need kv_cache=on and kv_dtype=auto"
            )
        budget = self.kv_budget_bytes
        if budget is None:  # paged, no budget: as many blocks as the contiguous cache holds
            plan = plan_paged(self.config, 1, self.max_seq_len, self.kv_block_tokens)
            budget = bs * self.max_seq_len * plan.bytes_per_token
        plan = plan_paged(self.config, budget, self.max_seq_len, self.kv_block_tokens)
        self.kv_plan = plan
        if self.kv_paged:
            if plan.n_blocks < 1:
                raise UsageError(
                    f"--engine-opt kv_budget_mb={budget / 1e6:g} holds no KV block of "
                    f"{plan.block_bytes} bytes: raise it"
                )
            return bs
        if plan.contiguous_slots < 1:
            raise UsageError(
                f"--engine-opt kv_budget_mb={budget / 1e6:g} holds no contiguous sequence of "
                f"max_seq_len {self.max_seq_len} ({self.max_seq_len * plan.bytes_per_token} "
                "bytes): raise it, lower max_seq_len or use kv_paged=on"
            )
        return min(bs, plan.contiguous_slots)

    def _new_cache(self, slots: int, max_len: int) -> KVCache:
        if self.kv_paged and self.kv_plan is not None:
            return PagedKVCache(
                self.config,
                slots,
                max_len,
                self.kv_plan.n_blocks,
                self.kv_block_tokens,
                self.device,
            )
        return self.model.new_cache(slots, max_len)

    def _reserve(
        self, cache: PagedKVCache, sub: Submission, slot: int, pending: deque[Submission]
    ) -> str:
        """Blocks for ``sub``'s prompt and whole output in ``slot``: ``ok``; ``wait`` (``sub``
        back at the head of ``pending``) when too few are free now; ``skip`` for a request
        that could never fit (finished with an error)."""
        need = sub.spec.prompt_tokens + sub.spec.max_output_tokens
        if math.ceil(need / cache.block_tokens) > cache.n_blocks:
            sub.handle.finish(
                error=f"prompt + output = {need} tokens needs more KV blocks than the "
                f"budget's {cache.n_blocks}"
            )
            return "skip"
        if not cache.can_allocate(need):
            pending.appendleft(sub)
            return "wait"
        cache.allocate(slot, need)
        return "ok"

    # --- helpers ------------------------------------------------------------------------

    def _batch_wait_s(self, pending: deque[Submission], inbox: Inbox, recorder: Recorder) -> float:
        """Seconds a static batch should still wait to fill (0: start now)."""
        timeout_s = self.options.batch_timeout_s
        if timeout_s <= 0 or len(pending) >= self.options.batch_size or inbox.finished:
            return 0.0
        oldest = pending[0].handle.record.t_sent or recorder.clock.now_ns()
        return max(0.0, (oldest + timeout_s * 1e9 - recorder.clock.now_ns()) / 1e9)

    def _keep(self, sub: Submission, token: int) -> None:
        if self.output_ids is not None:
            self.output_ids.setdefault(sub.spec.request_id, []).append(token)

    def _is_eos(self, token: int) -> bool:
        return self.options.stop_on_eos and token == EOS_TOKEN_ID

    def _prompt_ids(self, sub: Submission) -> torch.Tensor:
        return prompt_ids(sub.spec, self.config.vocab_size, self.options.seed)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def prompt_ids(spec: RequestSpec, vocab: int, seed: int) -> torch.Tensor:
    """The prompt token ids [prompt_tokens] of ``spec``: its ids (mod ``vocab``), one id per
    word of its text, or random ids from a generator seeded by ``seed`` and the request id."""
    if spec.prompt_token_ids is not None:
        ids = torch.tensor(spec.prompt_token_ids[: spec.prompt_tokens], dtype=torch.long)
        return ids % vocab
    if spec.prompt is not None:
        # One token per word, ids from 1 (0 ends a sequence); padded with spaces' id.
        raw = [
            1 + zlib.crc32(w.encode("utf-8")) % (vocab - 1)
            for w in spec.prompt.split()[: spec.prompt_tokens]
        ]
        raw += [32 % vocab] * (spec.prompt_tokens - len(raw))
        return torch.tensor(raw, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + spec.request_id)
    # Ids from 1: 0 is the end-of-sequence token.
    return torch.randint(1, vocab, (spec.prompt_tokens,), generator=gen)


def _kv_dtype(extra: dict[str, str]) -> str:
    """``kv_dtype`` (or vLLM's ``kv_cache_dtype``) option: auto | int8 | fp8 (vLLM's
    ``fp8_e4m3`` is fp8)."""
    keys = [k for k in ("kv_dtype", "kv_cache_dtype") if k in extra]
    if (
        len(keys) == 2
        and extra["kv_dtype"].strip().lower() != extra["kv_cache_dtype"].strip().lower()
    ):
        raise UsageError("--engine-opt kv_dtype= and kv_cache_dtype= disagree: give one")
    text = extra[keys[0]].strip().lower() if keys else "auto"
    text = {"fp8_e4m3": "fp8", "float8_e4m3fn": "fp8", "float8": "fp8"}.get(text, text)
    if text not in KV_DTYPES:
        raise UsageError(
            f"--engine-opt {keys[0]}= must be one of {', '.join(KV_DTYPES)}, got {text!r}"
        )
    return text


def _prune_heads(extra: dict[str, str]) -> int:
    """``prune_heads`` option: query heads removed per layer, a whole number >= 0 (0: none)."""
    text = extra.get("prune_heads", "0").strip()
    if not text.isdigit():
        raise UsageError(f"--engine-opt prune_heads= must be a whole number >= 0, got {text!r}")
    return int(text)


def _load_weights(model: ReferenceModel, path: str) -> None:
    """Load a trained state dict; blocks beyond the model's layers are dropped (pruning)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as exc:
        raise UsageError(f"--engine-opt weights={path}: cannot load ({exc})") from exc
    n = len(model.blocks)
    keep = {
        k: v
        for k, v in state.items()
        if not (k.startswith("blocks.") and int(k.split(".")[1]) >= n)
    }
    try:
        model.load_state_dict(keep, strict=True)
    except RuntimeError as exc:
        raise UsageError(
            f"--engine-opt weights={path} does not fit this model shape: {str(exc)[:200]}"
        ) from exc
    dt = next(model.parameters()).dtype
    model.to(dtype=dt)


def _parallel_info(p: DecodingSpec, target_n_params: int) -> dict[str, object]:
    """The ``speculative`` config of a lookahead or medusa run (no draft model)."""
    return {
        "method": p.method,
        "draft": p.method,
        "num_speculative_tokens": p.k,
        "lookahead_ngram": p.ngram if p.method == "lookahead" else None,
        "medusa_heads": p.k if p.method == "medusa" else None,
        "target_n_params": target_n_params,
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return "cpu"


#: Every ``--engine-opt`` key the reference engine reads (its own, the draft's, parallel
#: decoding's and the multi-process wrapper's); any other key is refused with a hint.
REFERENCE_OPTIONS = (
    "threads", "attention", "quant", "kv_cache", "compile", "compile_backend", "kv_dtype",
    "kv_cache_dtype", "prune_heads", "sparsity", "weights", "draft", "num_speculative_tokens",
    "draft_layers", "decoding", "lookahead_window", "lookahead_ngram", "medusa_heads",
    "medusa_steps", "prefix_cache", "prefix_cache_tokens", "max_batched_tokens", "kv_paged",
    "kv_block_tokens", "kv_budget_mb", "disaggregate", "replicas", "dispatch", "start_method",
)  # fmt: skip
#: ``--engine-opt`` keys users reach for that are flags of ``perfscope run`` instead.
_FLAG_OPTIONS = {
    "preset": "--model-preset",
    "model_preset": "--model-preset",
    "batch_size": "--batch-size",
    "dtype": "--dtype",
    "device": "--device",
    "scheduler": "--scheduler",
    "seed": "--seed",
}


@register_engine("reference")
def _create(uri: str, options: EngineOptions) -> Engine:
    if uri.strip().lower() != "reference":
        raise UsageError(
            f"engine {uri!r}: the reference engine takes no arguments; use 'reference'"
        )
    from perfscope.profiler.engines.reference.multiproc import MultiPlan, MultiProcessEngine

    plan = MultiPlan.parse(options)
    if plan is not None:
        return MultiProcessEngine(uri, options, plan)
    return ReferenceEngine(uri, options)
