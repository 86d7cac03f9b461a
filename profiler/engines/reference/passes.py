"""The measured cost of the passes a technique adds to the reference model, on this machine.

A projection prices work by the roofline and host time by a fit of the baseline's steps
(``perfscope.analysis.overhead``); neither sees what a technique changes *inside* a kernel
call: int8 dynamic quantisation re-quantises every linear input, weight-only int8
dequantises a full copy of every weight per call, CSR weights run torch's sparse kernel,
a 16-bit dtype runs CPU matmuls without a vector unit, and an int8 or fp8 KV cache is
quantised on every write and cast back on every read. :func:`measure_passes` times those
calls, built by the engine's own functions (:func:`~.model.quantize_weights`,
:func:`~.model.sparsify_weights`, :class:`~.model.KVCache`), for a baseline and a candidate
setting of the same model, interleaved so that the machine's load hits both alike, and
returns the candidate minus the baseline at each size it timed.

Only the calls that differ are timed: one block's seven linear layers (every block has the
same shapes), the LM head, and one layer's K and V cache write and read. The caller fits a
line through the points (:class:`perfscope.analysis.overhead.PassCosts`) and adds the
difference to each projected step; nothing here is a guess.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from perfscope.profiler.engines.reference.model import (
    KVCache,
    ReferenceConfig,
    ReferenceModel,
    parse_sparsity,
    quantize_weights,
    sparsify_weights,
)

__all__ = ["PassSetting", "PassTimes", "measure_passes"]


@dataclass(frozen=True)
class PassSetting:
    """The options of one setting that change a timed pass.

    Attributes:
        dtype: the model dtype (``float32``, ``bfloat16``, ``float16``).
        quant: ``none``, ``int8`` or ``int8-wo``.
        sparsity: ``none`` or ``unstructured:F``.
        kv_dtype: ``auto``, ``int8`` or ``fp8``.
        kv_paged: a paged cache (block pools read through a block table) instead of one
            contiguous slot a sequence.
        kv_block_tokens: positions a block holds (paged only).
    """

    dtype: str = "float32"
    quant: str = "none"
    sparsity: str = "none"
    kv_dtype: str = "auto"
    kv_paged: bool = False
    kv_block_tokens: int = 16


@dataclass(frozen=True)
class PassTimes:
    """Candidate minus baseline time of each timed pass, at each size timed (seconds).

    Attributes:
        rows: rows (tokens) fed to the linear layers at each point.
        linears_s: one block's seven linear layers at each of ``rows``.
        head_s: the LM head at each of ``rows``.
        kv_elements: K (or V) elements of one layer read at each point (rows x KV heads x
            span x head dim).
        kv_read_s: reading one layer's K and V (a view, or a cast copy) at each of
            ``kv_elements``.
        write_rows: tokens written to the cache at each point (batch rows x tokens a row).
        kv_write_s: writing one layer's K and V of ``write_rows`` tokens.
        decode: ``(batch rows, cache span)`` of the baseline's whole decode step timed.
        decode_s: that step of the baseline model alone (no engine), s.
        more_rows: the batch rows of a second timing of the baseline's decode step (the
            candidate's batch), at the same span; 0: not timed.
        more_rows_s: that step, s.
        prefill: ``(batch rows, prompt tokens)`` of the baseline's whole prefill timed.
        prefill_s: that prefill of the baseline model alone, s.
        rounds: interleaved rounds each timing is the fastest of.
        load: the 1-minute load average when the timing started.
        threads: torch's intra-op threads during the timing.
    """

    rows: tuple[int, ...]
    linears_s: tuple[float, ...]
    head_s: tuple[float, ...]
    kv_elements: tuple[int, ...]
    kv_read_s: tuple[float, ...]
    write_rows: tuple[int, ...]
    kv_write_s: tuple[float, ...]
    decode: tuple[int, int]
    decode_s: float
    more_rows: int
    more_rows_s: float
    prefill: tuple[int, int]
    prefill_s: float
    rounds: int
    load: float
    threads: int


def _model(cfg: ReferenceConfig, s: PassSetting) -> ReferenceModel:
    """The model as the engine builds it for ``s`` (random weights: timing only)."""
    from dataclasses import replace

    m = ReferenceModel.build(replace(cfg, dtype=s.dtype), seed=0)
    m.set_kv_dtype(s.kv_dtype)
    m = quantize_weights(m, s.quant)
    sparsify_weights(m, parse_sparsity(s.sparsity))
    return m


def _cache(model: ReferenceModel, s: PassSetting, rows: int, length: int) -> KVCache:
    """A cache of ``rows`` sequences of ``length`` positions as the engine builds it for
    ``s``: contiguous, or paged with every row's blocks allocated."""
    if not s.kv_paged:
        return KVCache(model.cfg, rows, length, torch.device("cpu"), model.kv_dtype)
    from perfscope.profiler.engines.reference.paged import PagedKVCache

    per_row = -(-length // s.kv_block_tokens)
    c = PagedKVCache(
        model.cfg, rows, length, rows * per_row, s.kv_block_tokens, torch.device("cpu")
    )
    for slot in range(rows):
        c.allocate(slot, length)
    return c


def _linears(block: nn.Module) -> list[tuple[nn.Module, int]]:
    """A block's linear layers (any of the engine's kinds) with their input widths."""
    names = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
    out = []
    for n in names:
        mod = getattr(block, n)
        width = int(getattr(mod, "in_features", 0) or 0)
        if not width:
            w = getattr(mod, "qweight", None)
            w = w if w is not None else mod.weight
            width = int(w.shape[1])
        out.append((mod, width))
    return out


def _clock(fn: Callable[[], object], budget_s: float) -> float:
    """Seconds of one call of ``fn``: the fastest of five batches that each last about
    ``budget_s`` / 5 (so a microsecond call is not timed by the clock's resolution). The
    fastest batch is the call's own cost, the least disturbed by other processes on a
    shared machine; what the load adds to the engine's steps is the caller's stretch
    (:meth:`perfscope.analysis.overhead.PassCosts.stretch`)."""
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    calls = max(1, min(1000, int(budget_s / 5 / one)))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    return min(times)


def _steps(
    model: ReferenceModel, decode: tuple[int, int], prefill: tuple[int, int]
) -> tuple[Callable[[], object], Callable[[], object]]:
    """``model``'s whole decode step of ``decode`` (rows, cache span) and prefill of
    ``prefill`` (rows, prompt tokens), as calls to time."""
    db, span = decode
    dcache = model.new_cache(db, span + 1)
    dtok = torch.zeros(db, dtype=torch.long)
    lengths = torch.full((db,), span - 1)
    pb, pt = prefill
    pcache = model.new_cache(pb, pt + 1)
    ptok = torch.zeros(pb, pt, dtype=torch.long)
    return (lambda: model.decode(dtok, dcache, lengths), lambda: model.prefill(ptok, pcache))


@torch.no_grad()
def measure_passes(
    cfg: ReferenceConfig,
    baseline: PassSetting,
    candidate: PassSetting,
    *,
    rows: Sequence[int],
    spans: Sequence[tuple[int, int]],
    writes: Sequence[tuple[int, int]] = (),
    decode: tuple[int, int] = (1, 16),
    prefill: tuple[int, int] = (1, 16),
    more_rows: int = 0,
    rounds: int = 5,
    budget_s: float = 0.01,
) -> PassTimes:
    """Time the passes that differ between ``baseline`` and ``candidate`` on this machine.

    Args:
        cfg: the model shape (the candidate's; only the dtype and options differ).
        rows: linear-layer row counts to time (a decode step's batch, a prefill's tokens).
        spans: ``(batch rows, cache span)`` points of a KV read.
        writes: ``(batch rows, tokens per row)`` points of a KV write (a decode step's
            ``(b, 1)``, a prefill's ``(b, prompt)``); default one token per row of each
            of ``spans``.
        decode, prefill: the shapes at which the baseline model's whole decode step and
            prefill are timed alone: how long the same work takes outside the engine and
            its load, which the caller compares with the engine's steps
            (:class:`perfscope.analysis.overhead.PassCosts`).
        more_rows: also time the baseline's decode step at this many rows (the
            candidate's batch; 0: not), for the cost of a row.
        rounds: interleaved baseline/candidate rounds; each difference is of the fastest
            timing of each setting over the rounds.
            Passes the two settings share (the linears when only the KV dtype differs, the
            cache when only the weights do) are not timed: their difference is 0.
        budget_s: about how long each timing of one setting at one point lasts.
    """
    import os

    load = os.getloadavg()[0]
    models = (_model(cfg, baseline), _model(cfg, candidate))
    dts = [m.embed.weight.dtype if hasattr(m, "embed") else torch.float32 for m in models]
    blocks = [m.blocks[0] for m in models]
    heads = [m.lm_head for m in models]
    d = cfg.hidden_size

    def diff(make: Callable[[int], Callable[[], object]]) -> float:
        calls = (make(0), make(1))
        per = [[], []]  # type: list[list[float]]
        for _ in range(rounds):
            for j in (0, 1):
                per[j].append(_clock(calls[j], budget_s))
        return min(per[1]) - min(per[0])

    same_weights = (baseline.dtype, baseline.quant, baseline.sparsity) == (
        candidate.dtype,
        candidate.quant,
        candidate.sparsity,
    )
    same_cache = (baseline.dtype, baseline.kv_dtype, baseline.kv_paged) == (
        candidate.dtype,
        candidate.kv_dtype,
        candidate.kv_paged,
    )
    settings = (baseline, candidate)
    base = models[0]
    db, span = decode
    pb, pt = prefill
    steps = [_steps(m, decode, prefill) for m in models]
    decode_s = min(_clock(steps[0][0], budget_s) for _ in range(rounds))
    prefill_s = min(_clock(steps[0][1], budget_s) for _ in range(rounds))
    more_s = 0.0
    if more_rows > 0 and more_rows != db:
        more_step = _steps(base, (more_rows, span), prefill)[0]
        more_s = min(_clock(more_step, budget_s) for _ in range(rounds))
    common = {
        "decode": (int(db), int(span)),
        "decode_s": decode_s,
        "more_rows": int(more_rows) if more_s > 0 else 0,
        "more_rows_s": more_s,
        "prefill": (int(pb), int(pt)),
        "prefill_s": prefill_s,
        "rounds": rounds,
        "load": load,
        "threads": torch.get_num_threads(),
    }
    if baseline.dtype != candidate.dtype:
        # Every op of a step runs at the other dtype (norms, attention, the cache too), not
        # only the linears: the whole decode step and prefill are timed at both dtypes, and
        # their difference per layer is the line through the two row counts.
        layers = max(cfg.n_layers, 1)
        d_dec = diff(lambda j: steps[j][0]) / layers
        d_pre = diff(lambda j: steps[j][1]) / layers
        return PassTimes(
            rows=(int(db), int(pb * pt)),
            linears_s=(d_dec, d_pre),
            head_s=(0.0, 0.0),
            kv_elements=(),
            kv_read_s=(),
            write_rows=(),
            kv_write_s=(),
            **common,  # type: ignore[arg-type]
        )
    lin: list[float] = []
    head: list[float] = []
    for r in rows:
        if same_weights:
            lin.append(0.0)
            head.append(0.0)
            continue

        def linears(j: int, r: int = r) -> Callable[[], object]:
            xs = [(mod, torch.randn(r, w, dtype=dts[j])) for mod, w in _linears(blocks[j])]
            return lambda: [mod(x) for mod, x in xs]

        def lm_head(j: int, r: int = r) -> Callable[[], object]:
            x = torch.randn(r, d, dtype=dts[j])
            return lambda: heads[j](x)

        lin.append(diff(linears))
        head.append(diff(lm_head))
    elements: list[int] = []
    reads: list[float] = []
    kvh, hd = cfg.n_kv_heads, cfg.head_dim
    for b, span in spans:
        elements.append(b * kvh * span * hd)
        if same_cache:
            reads.append(0.0)
            continue
        caches = [_cache(m, st, b, span + 1) for m, st in zip(models, settings, strict=True)]

        def read(
            j: int, b: int = b, span: int = span, caches: list[KVCache] = caches
        ) -> Callable[[], object]:
            c = caches[j]
            return lambda: (c.k[0][:b, :, :span], c.v[0][:b, :, :span])

        reads.append(diff(read))
    write_rows: list[int] = []
    wrote: list[float] = []
    for b, t in writes or [(b, 1) for b, _ in spans]:
        write_rows.append(b * t)
        if same_cache:
            wrote.append(0.0)
            continue
        caches = [_cache(m, st, b, t + 1) for m, st in zip(models, settings, strict=True)]

        def write(
            j: int, b: int = b, t: int = t, caches: list[KVCache] = caches
        ) -> Callable[[], object]:
            # as the engine's block writes: rows x positions, every KV head at once
            c = caches[j]
            x = torch.randn(b, t, kvh, hd, dtype=dts[j])
            rws = torch.arange(b).unsqueeze(1).expand(b, t)
            pos = torch.arange(t).unsqueeze(0).expand(b, t)

            def go() -> None:
                c.k[0][rws, :, pos] = x
                c.v[0][rws, :, pos] = x

            return go

        wrote.append(diff(write))
    return PassTimes(
        rows=tuple(int(r) for r in rows),
        linears_s=tuple(lin),
        head_s=tuple(head),
        kv_elements=tuple(elements),
        kv_read_s=tuple(reads),
        write_rows=tuple(write_rows),
        kv_write_s=tuple(wrote),
        **common,  # type: ignore[arg-type]
    )
