"""The reference model split across processes with ``torch.distributed`` (gloo, 127.0.0.1).

Two ways to split, both run as ``world`` processes on this machine:

- **Tensor parallel** (:func:`run_parallel` with ``mode="tp"``), Megatron-style: ``wq``,
  ``wk``, ``wv``, ``w_gate`` and ``w_up`` are column-split (each rank owns
  ``n_heads/world`` query heads, ``n_kv_heads/world`` KV heads and its KV cache slice, and
  ``intermediate/world`` MLP columns); ``wo`` and ``w_down`` are row-split and end with an
  all-reduce of the hidden states (one per attention and one per MLP block). The embedding
  is vocab-parallel (a masked lookup plus one all-reduce) and the lm_head vocab-parallel (an
  all-gather of the logits), so a forward pass makes ``2·n_layers + 1`` all-reduces and one
  gather -- exactly the collectives :func:`perfscope.analysis.parallel.predict_parallel`
  counts.
- **Pipeline parallel** (``mode="pp"``): the blocks split into ``world`` equal stages (the
  first also holds the embedding, the last the final norm and lm_head); the batch is cut
  into ``microbatches`` micro-batches that follow each other through the stages, so while
  stage 1 runs micro-batch 0, stage 0 runs micro-batch 1. The last stage picks the greedy
  token and sends it back to stage 0 for the next step. Sends are ``isend`` (never block);
  receives block.

Every collective and send/receive is timed with ``time.perf_counter`` around the call
(gloo on CPU is synchronous, so the time is the call's own), summed per decode step and per
rank. For PP the receive time also holds the wait for the other stage's compute; the
compute time of each stage is timed apart so the communication on the critical path can be
derived (:attr:`ParallelRun.pp_critical_comm_s`). Every call's enter and exit times are kept
(:attr:`ParallelRun.events`, one monotonic clock for all processes of the machine), which
splits a TP collective into the link's part and the wait for the other rank
(:meth:`ParallelRun.tp_split_s`) and times each PP hop (:meth:`ParallelRun.pp_hops_s`).

:func:`calibrate_loopback` measures the link itself: a ping-pong (one-way time of a send)
and a 2-process all-reduce over a range of message sizes, each fitted to
``latency + bytes / bandwidth``.

The single-process reference (:func:`run_single`) runs the unsplit model in this process
with the same seed, prompts and thread count per process. Nothing here changes
:mod:`~perfscope.profiler.engines.reference.model`: ranks build the full model from the
seed and replace modules with their shards.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.context import ForkContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Literal

import torch
from torch import nn

from perfscope.profiler.engines.reference.model import (
    KVCache,
    ReferenceConfig,
    ReferenceModel,
    _Block,
    torch_dtype,
)

__all__ = [
    "LinkCalibration",
    "LinkFit",
    "ParallelGroup",
    "ParallelJob",
    "ParallelRun",
    "calibrate_loopback",
    "run_parallel",
    "run_parallel_many",
    "run_single",
]

Mode = Literal["single", "tp", "pp"]
#: One timed communication call: (kind, peer rank or -1, enter s, exit s).
Event = tuple[str, int, float, float]

#: Seconds a spawned group may take before it is stopped.
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ParallelJob:
    """What to run.

    Attributes:
        cfg: model shape.
        seed: weight seed (every rank builds the same weights from it).
        batch: sequences decoded together.
        prompt_len: prompt tokens per sequence (random ids from ``seed + 1``).
        output_len: generated tokens per sequence (the prefill's token included).
        microbatches: PP micro-batches (``batch`` must divide by it); ignored for TP.
        threads: torch intra-op threads per process.
        warmup: decode passes run (and discarded) before the timed run, on a separate cache.
    """

    cfg: ReferenceConfig
    seed: int = 0
    batch: int = 1
    prompt_len: int = 16
    output_len: int = 16
    microbatches: int = 1
    threads: int = 1
    warmup: int = 2


@dataclass(frozen=True)
class ParallelRun:
    """One run's outputs and timings (seconds).

    Attributes:
        mode: ``single``, ``tp`` or ``pp``.
        world: processes.
        microbatches: PP micro-batches (1 otherwise).
        tokens: generated token ids, ``[batch][output_len]``.
        logits: the logits of every step (the prefill's first), each ``[batch, vocab]``
            float32, from rank 0 (TP) or the last stage (PP).
        prefill_s: wall time of the prefill (rank 0).
        step_s: wall time of each decode step on rank 0 (one token for every sequence).
        comm_s: per rank, time inside collectives / send / receive in each decode step.
        compute_s: per rank, time in its own forward passes in each decode step.
        collectives_per_step: TP all-reduces + gathers (PP: sends + receives) per step on
            rank 0.
        message_bytes: bytes of one decode-step hidden-state message.
        events: per rank, every timed communication call of the decode steps (TP) or of
            the whole timed generation (PP): ``(kind, peer, enter s, exit s)``.
    """

    mode: str
    world: int
    microbatches: int
    tokens: list[list[int]]
    logits: list[torch.Tensor]
    prefill_s: float
    step_s: list[float]
    comm_s: list[list[float]] = field(default_factory=list)
    compute_s: list[list[float]] = field(default_factory=list)
    collectives_per_step: int = 0
    message_bytes: int = 0
    events: list[list[Event]] = field(default_factory=list)

    @property
    def tpot_s(self) -> float:
        """Median decode step time (= time per output token of one sequence)."""
        return statistics.median(self.step_s)

    def comm_per_step_s(self, rank: int = 0) -> float:
        """Median communication time of a decode step on ``rank``."""
        return statistics.median(self.comm_s[rank]) if self.comm_s else 0.0

    def compute_per_step_s(self, rank: int = 0) -> float:
        """Median compute time of a decode step on ``rank``."""
        return statistics.median(self.compute_s[rank]) if self.compute_s else 0.0

    def tp_split_s(self) -> tuple[float, float]:
        """TP, medians per decode step on rank 0: (link time, wait time). A collective's
        link time is rank 0's exit less the *last* rank's entry (what the wire and gloo
        take once both are there); its wait is that last entry less rank 0's own (waiting
        for the other rank to finish its compute or to be scheduled)."""
        if self.mode != "tp" or not self.events or self.collectives_per_step == 0:
            return 0.0, 0.0
        n = min(len(e) for e in self.events)
        link, wait = [], []
        for k in range(n):
            last_in = max(e[k][2] for e in self.events)
            link.append(self.events[0][k][3] - last_in)
            wait.append(last_in - self.events[0][k][2])
        c = self.collectives_per_step
        steps = n // c
        per_link = [sum(link[i * c : (i + 1) * c]) for i in range(steps)]
        per_wait = [sum(wait[i * c : (i + 1) * c]) for i in range(steps)]
        return _median_or_zero(per_link), _median_or_zero(per_wait)

    def pp_hops_s(self) -> tuple[float, float]:
        """PP, medians over decode hops of (hidden-state hop stage 0 -> 1, token hop back).
        A hop is the receive's exit less the later of the send's and the receive's entry;
        sends and receives are matched first-in first-out per direction, and the prefill's
        hidden-state hops (larger messages) are left out."""
        if self.mode != "pp" or len(self.events) < 2:
            return 0.0, 0.0
        last = len(self.events) - 1

        def hops(src: int, dst: int) -> list[float]:
            sends = [e for e in self.events[src] if e[0] == "send" and e[1] == dst]
            recvs = [e for e in self.events[dst] if e[0] == "recv" and e[1] == src]
            return [r[3] - max(s[2], r[2]) for s, r in zip(sends, recvs, strict=False)]

        hidden = hops(0, 1)[self.microbatches :]
        token = hops(last, 0)
        return _median_or_zero(hidden), _median_or_zero(token)

    @property
    def pp_critical_comm_s(self) -> float:
        """PP with one micro-batch: step time minus every stage's compute (median over
        steps) -- the sends and receives on the critical path, token hop back included."""
        if self.mode != "pp" or not self.compute_s:
            return 0.0
        per_step = [
            s - sum(self.compute_s[r][i] for r in range(self.world))
            for i, s in enumerate(self.step_s)
        ]
        return statistics.median(per_step)


@dataclass(frozen=True)
class LinkFit:
    """``time = latency_s + bytes / bw_bytes_s`` from medians, as nccl-tests reads its
    table: the latency is the median time of the smallest message, the bandwidth the
    largest message's bytes over its median time less that latency.

    Attributes:
        latency_s: s.
        bw_bytes_s: bytes/s (per direction for a send or a 2-rank all-reduce).
        sizes_bytes: message sizes measured.
        times_s: median time at each size.
        p10_times_s: 10th percentile at each size (what the link does when neither
            process waits for a CPU).
    """

    latency_s: float
    bw_bytes_s: float
    sizes_bytes: tuple[int, ...]
    times_s: tuple[float, ...]
    p10_times_s: tuple[float, ...]


@dataclass(frozen=True)
class LinkCalibration:
    """The loopback link between two gloo processes on this machine.

    Attributes:
        send: one-way time of a send (half a ping-pong round trip).
        allreduce: a 2-rank all-reduce (ring: ``latency + bytes/bw`` for n = 2).
        reps: timed repetitions per size.
    """

    send: LinkFit
    allreduce: LinkFit
    reps: int


def _median_or_zero(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


# --------------------------------------------------------------------------- process group


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Comm:
    """Timed wrappers of the collectives a rank uses; accumulates seconds and calls."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.pending: list[torch.distributed.Work] = []
        #: every call since the last :meth:`clear_log`: (kind, peer, enter s, exit s) on
        #: ``time.perf_counter`` (CLOCK_MONOTONIC: one clock for every process here).
        self.log: list[Event] = []

    @contextlib.contextmanager
    def _timed(self, kind: str = "", peer: int = -1) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            self.seconds += t1 - t0
            self.calls += 1
            if kind:
                self.log.append((kind, peer, t0, t1))

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        with self._timed("all_reduce"):
            torch.distributed.all_reduce(t)
        return t

    def all_gather_last(self, t: torch.Tensor, world: int) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(world)]
        with self._timed("all_gather"):
            torch.distributed.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=-1)

    def send(self, t: torch.Tensor, dst: int) -> None:
        with self._timed("send", dst):
            work = torch.distributed.isend(t.contiguous(), dst)
        if work is not None:
            self.pending.append(work)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        with self._timed("recv", src):
            torch.distributed.recv(t, src)
        return t

    def flush(self) -> None:
        with self._timed():
            for w in self.pending:
                w.wait()
        self.pending.clear()

    def take(self) -> tuple[float, int]:
        s, c = self.seconds, self.calls
        self.seconds, self.calls = 0.0, 0
        return s, c


# --------------------------------------------------------------------------- TP shards


def _rows(w: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = w.shape[0] // world
    return w[rank * n : (rank + 1) * n].clone()


def _cols(w: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = w.shape[1] // world
    return w[:, rank * n : (rank + 1) * n].clone()


def _linear(weight: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
    return lin


class _RowParallelLinear(nn.Module):
    """A row-split linear: this rank's input columns, then an all-reduce of the output."""

    def __init__(self, weight: torch.Tensor, comm: _Comm) -> None:
        super().__init__()
        self.inner = _linear(weight)
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.inner(x))


class _VocabParallelEmbedding(nn.Module):
    """Rows ``[lo, hi)`` of the table; ids outside are looked up as zeros; all-reduce."""

    def __init__(self, table: torch.Tensor, lo: int, comm: _Comm) -> None:
        super().__init__()
        self.weight = nn.Parameter(table, requires_grad=False)
        self.lo, self.hi = lo, lo + table.shape[0]
        self.comm = comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        inside = (ids >= self.lo) & (ids < self.hi)
        local = torch.where(inside, ids - self.lo, torch.zeros_like(ids))
        x = nn.functional.embedding(local, self.weight) * inside.unsqueeze(-1).to(self.weight.dtype)
        return self.comm.all_reduce(x)


class _VocabParallelHead(nn.Module):
    """This rank's vocab rows of the lm_head; the logits all-gathered along the vocab."""

    def __init__(self, weight: torch.Tensor, comm: _Comm, world: int) -> None:
        super().__init__()
        self.inner = _linear(weight)
        self.comm, self.world = comm, world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather_last(self.inner(x), self.world)


def _check_split(cfg: ReferenceConfig, mode: Mode, world: int, job: ParallelJob) -> None:
    if mode == "tp":
        for name, n in (
            ("n_kv_heads", cfg.n_kv_heads),
            ("intermediate_size", cfg.intermediate_size),
            ("vocab_size", cfg.vocab_size),
        ):
            if n % world:
                raise ValueError(f"tensor parallel {world}: {name} {n} does not divide by it")
    if mode == "pp":
        if cfg.n_layers < world:
            raise ValueError(f"pipeline parallel {world}: only {cfg.n_layers} blocks")
        if job.batch % job.microbatches:
            raise ValueError(
                f"batch {job.batch} does not divide into {job.microbatches} micro-batches"
            )


def shard_tensor_parallel(
    model: ReferenceModel, rank: int, world: int, comm: _Comm
) -> ReferenceConfig:
    """Replace ``model``'s modules by rank ``rank``'s shards, in place; returns the config
    of this rank's KV cache (its share of the KV heads)."""
    cfg = model.cfg
    with torch.no_grad():
        for block in model.blocks:
            assert isinstance(block, _Block)
            block.wq = _linear(_rows(block.wq.weight, rank, world))
            block.wk = _linear(_rows(block.wk.weight, rank, world))
            block.wv = _linear(_rows(block.wv.weight, rank, world))
            block.wo = _RowParallelLinear(_cols(block.wo.weight, rank, world), comm)  # type: ignore[assignment]
            block.w_gate = _linear(_rows(block.w_gate.weight, rank, world))
            block.w_up = _linear(_rows(block.w_up.weight, rank, world))
            block.w_down = _RowParallelLinear(_cols(block.w_down.weight, rank, world), comm)  # type: ignore[assignment]
            block.n_heads = cfg.n_heads // world
            block.n_kv_heads = cfg.n_kv_heads // world
        n = cfg.vocab_size // world
        table = _rows(model.embed.weight, rank, world)
        head = _rows(model.lm_head.weight, rank, world)
        model.embed = _VocabParallelEmbedding(table, rank * n, comm)  # type: ignore[assignment]
        model.lm_head = _VocabParallelHead(head, comm, world)  # type: ignore[assignment]
    # The cache's shape only: head_dim stays, heads are this rank's.
    return _cache_cfg(cfg, n_kv_heads=cfg.n_kv_heads // world, n_layers=cfg.n_layers)


def _cache_cfg(cfg: ReferenceConfig, *, n_kv_heads: int, n_layers: int) -> ReferenceConfig:
    hd = cfg.head_dim
    return replace(
        cfg,
        n_layers=n_layers,
        n_heads=n_kv_heads,
        n_kv_heads=n_kv_heads,
        hidden_size=hd * n_kv_heads,
    )


# --------------------------------------------------------------------------- inputs


def _prompts(job: ParallelJob) -> torch.Tensor:
    gen = torch.Generator().manual_seed(job.seed + 1)
    return torch.randint(0, job.cfg.vocab_size, (job.batch, job.prompt_len), generator=gen)


def _prefill_inputs(cfg: ReferenceConfig, b: int, t: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """positions, span and mask of a prefill, as :meth:`ReferenceModel.prefill` makes them."""
    positions = torch.arange(t).unsqueeze(0).expand(b, t)
    g = cfg.n_heads // cfg.n_kv_heads
    causal = torch.ones(t, t, dtype=torch.bool).triu(1)
    return positions, t, causal.repeat(g, 1).view(1, 1, g * t, t)


def _decode_inputs(lengths: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
    """positions, span and mask of a decode step, as :meth:`ReferenceModel.decode`."""
    b = lengths.shape[0]
    span = int(lengths.max().item()) + 1
    positions = lengths.view(b, 1)
    idx = torch.arange(span).view(1, span)
    return positions, span, (idx > positions).view(b, 1, 1, span)


# --------------------------------------------------------------------------- single process


def run_single(job: ParallelJob) -> ParallelRun:
    """The unsplit model in this process (``job.threads`` threads), greedy."""
    old = torch.get_num_threads()
    torch.set_num_threads(job.threads)
    try:
        model = ReferenceModel.build(job.cfg, seed=job.seed)
        return _run_unsplit(model, job, None)
    finally:
        torch.set_num_threads(old)


def _run_unsplit(
    model: ReferenceModel,
    job: ParallelJob,
    comm: _Comm | None,
    cache_cfg: ReferenceConfig | None = None,
) -> ParallelRun:
    """Prefill + greedy decode of ``job`` on ``model`` (the whole model, or a TP shard whose
    collectives go through ``comm``)."""
    prompts = _prompts(job)
    b, max_len = job.batch, job.prompt_len + job.output_len
    shape = cache_cfg or model.cfg

    def new_cache() -> KVCache:
        return KVCache(shape, b, max_len, model.device)

    # warm-up on its own cache
    if job.warmup:
        wc = new_cache()
        lg = model.prefill(prompts, wc)
        lengths = torch.full((b,), job.prompt_len, dtype=torch.long)
        for _ in range(job.warmup):
            lg = model.decode(lg.argmax(-1), wc, lengths)
            lengths += 1
    if comm is not None:
        torch.distributed.barrier()
        comm.take()
    cache = new_cache()
    t0 = time.perf_counter()
    logits = model.prefill(prompts, cache)
    prefill_s = time.perf_counter() - t0
    out_logits = [logits.float().clone()]
    tok = logits.argmax(-1)
    tokens = [tok]
    lengths = torch.full((b,), job.prompt_len, dtype=torch.long)
    steps: list[float] = []
    comm_s: list[float] = []
    compute_s: list[float] = []
    calls = 0
    if comm is not None:
        comm.take()
        comm.log.clear()
    for _ in range(job.output_len - 1):
        t0 = time.perf_counter()
        logits = model.decode(tok, cache, lengths)
        tok = logits.argmax(-1)
        dt = time.perf_counter() - t0
        lengths += 1
        steps.append(dt)
        c, calls = comm.take() if comm is not None else (0.0, 0)
        comm_s.append(c)
        compute_s.append(dt - c)
        out_logits.append(logits.float().clone())
        tokens.append(tok)
    toks = torch.stack(tokens, dim=1).tolist()
    return ParallelRun(
        mode="single" if comm is None else "tp",
        world=1 if comm is None else torch.distributed.get_world_size(),
        microbatches=1,
        tokens=toks,
        logits=out_logits,
        prefill_s=prefill_s,
        step_s=steps,
        comm_s=[comm_s],
        compute_s=[compute_s],
        collectives_per_step=calls,
        message_bytes=b * job.cfg.hidden_size * torch_dtype(job.cfg.dtype).itemsize,
        events=[list(comm.log)] if comm is not None else [],
    )


# --------------------------------------------------------------------------- PP stage


class _Stage:
    """Blocks ``[lo, hi)`` of the model (embedding on stage 0, norm + lm_head on the last)."""

    def __init__(self, model: ReferenceModel, rank: int, world: int) -> None:
        cfg = model.cfg
        per = [cfg.n_layers // world + (1 if s < cfg.n_layers % world else 0) for s in range(world)]
        self.lo = sum(per[:rank])
        self.hi = self.lo + per[rank]
        self.model = model
        self.blocks = [model.blocks[i] for i in range(self.lo, self.hi)]
        self.first, self.last = rank == 0, rank == world - 1
        self.cache_cfg = _cache_cfg(cfg, n_kv_heads=cfg.n_kv_heads, n_layers=per[rank])

    @torch.no_grad()
    def forward(
        self,
        x: torch.Tensor,
        cache: KVCache,
        positions: torch.Tensor,
        span: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Token ids ``[B, T]`` (first stage) or hidden states ``[B, T, d]`` in; hidden
        states (or, on the last stage, logits ``[B, V]`` of the last position) out."""
        m = self.model
        if self.first:
            x = m.embed(x)
        cos, sin = m._rope_tables(positions)
        for j, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache.k[j], cache.v[j], positions, span, mask)
        if self.last:
            logits: torch.Tensor = m.lm_head(m.norm(x[:, -1]))
            return logits
        return x


def _run_pipeline(model: ReferenceModel, job: ParallelJob, rank: int, world: int) -> ParallelRun:
    cfg = model.cfg
    stage = _Stage(model, rank, world)
    comm = _Comm()
    m = job.microbatches
    mb = job.batch // m
    all_prompts = _prompts(job)
    prompts = [all_prompts[i * mb : (i + 1) * mb] for i in range(m)]
    max_len = job.prompt_len + job.output_len
    d = cfg.hidden_size
    dt_ = torch_dtype(cfg.dtype)
    prev, nxt = (rank - 1) % world, (rank + 1) % world

    def one_pass(
        i: int, cache: KVCache, inputs: tuple[torch.Tensor, int, torch.Tensor], t: int
    ) -> tuple[torch.Tensor | None, float]:
        """Micro-batch ``i`` through this stage; returns (logits on the last stage, compute s)."""
        positions, span, mask = inputs
        if stage.first:
            if t == job.prompt_len:  # prefill: the prompt
                x: torch.Tensor = prompts[i]
            else:
                x = comm.recv(torch.empty(mb, dtype=torch.long), prev).view(mb, 1)
        else:
            x = comm.recv(torch.empty(mb, t, d, dtype=dt_), prev)
        t0 = time.perf_counter()
        y = stage.forward(x, cache, positions, span, mask)
        tok = y.argmax(-1) if stage.last else None
        compute = time.perf_counter() - t0
        if stage.last:
            assert tok is not None
            if world > 1 and len_left[i] > 1:
                comm.send(tok, nxt)
            return y, compute
        comm.send(y, nxt)
        return None, compute

    def generate(
        warm: bool,
    ) -> tuple[list[list[torch.Tensor]], list[float], list[float], list[float], float]:
        caches = [KVCache(stage.cache_cfg, mb, max_len, model.device) for _ in range(m)]
        lengths = [torch.full((mb,), job.prompt_len, dtype=torch.long) for _ in range(m)]
        n_out = job.warmup + 1 if warm else job.output_len
        for i in range(m):
            len_left[i] = n_out
        logits: list[list[torch.Tensor]] = [[] for _ in range(m)]
        pin = _prefill_inputs(cfg, mb, job.prompt_len)
        comm.log.clear()
        t0 = time.perf_counter()
        for i in range(m):
            y, _ = one_pass(i, caches[i], pin, job.prompt_len)
            if y is not None:
                logits[i].append(y.float().clone())
                len_left[i] -= 1
        comm.flush()
        prefill_s = time.perf_counter() - t0
        comm.take()
        steps: list[float] = []
        comm_steps: list[float] = []
        compute_steps: list[float] = []
        for _ in range(n_out - 1):
            t0 = time.perf_counter()
            compute = 0.0
            for i in range(m):
                y, c = one_pass(i, caches[i], _decode_inputs(lengths[i]), 1)
                compute += c
                lengths[i] += 1
                if y is not None:
                    logits[i].append(y.float().clone())
                    len_left[i] -= 1
            steps.append(time.perf_counter() - t0)
            comm_steps.append(comm.take()[0])
            compute_steps.append(compute)
        comm.flush()
        return logits, steps, comm_steps, compute_steps, prefill_s

    len_left = [0] * m
    if job.warmup:
        generate(True)
    torch.distributed.barrier()
    comm.take()
    logits, steps, comm_steps, compute_steps, prefill_s = generate(False)
    calls = 2 if world > 1 else 0
    out_logits = (
        [torch.cat([logits[i][s] for i in range(m)]) for s in range(job.output_len)]
        if stage.last
        else []
    )
    toks = torch.stack([lg.argmax(-1) for lg in out_logits], dim=1).tolist() if out_logits else []
    return ParallelRun(
        mode="pp",
        world=world,
        microbatches=m,
        tokens=toks,
        logits=out_logits,
        prefill_s=prefill_s,
        step_s=steps,
        comm_s=[comm_steps],
        compute_s=[compute_steps],
        collectives_per_step=calls * m,
        message_bytes=mb * d * dt_.itemsize,
        events=[list(comm.log)],
    )


# --------------------------------------------------------------------------- workers


def _init(rank: int, world: int, port: int, threads: int) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(threads)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )


def _worker(rank: int, world: int, port: int, tasks: object, queue: object) -> None:
    put = queue.put  # type: ignore[attr-defined]
    try:
        assert isinstance(tasks, list)
        results: list[object] = []
        for mode, task in tasks:
            if not torch.distributed.is_initialized():
                threads = task.threads if isinstance(task, ParallelJob) else 1
                _init(rank, world, port, threads)
            if isinstance(task, ParallelJob):
                torch.set_num_threads(task.threads)
                model = ReferenceModel.build(task.cfg, seed=task.seed)
                if mode == "tp":
                    comm = _Comm()
                    cache_cfg = shard_tensor_parallel(model, rank, world, comm)
                    run = _run_unsplit(model, task, comm, cache_cfg)
                else:
                    run = _run_pipeline(model, task, rank, world)
                # numpy arrays pickle by value (a tensor would be shared memory that dies
                # with this process)
                results.append((replace(run, logits=[]), [lg.numpy() for lg in run.logits]))
            else:
                assert isinstance(task, _CalibrationTask)
                torch.set_num_threads(1)
                results.append(_calibrate(rank, task))
            torch.distributed.barrier()
        put((rank, results, None))
    except Exception:  # pragma: no cover - reported to the parent
        put((rank, None, traceback.format_exc(limit=6)))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def mp_context(start_method: str = "spawn") -> ForkContext | SpawnContext:
    """The multiprocessing context worker processes start from (``spawn``: a fresh
    interpreter, safe when this process holds threads; ``fork``: a copy, no second import);
    torch's, so tensors put on its queues travel through shared memory."""
    import multiprocessing as mp

    import torch.multiprocessing  # noqa: F401  (registers the tensor reductions)

    if start_method not in ("fork", "spawn"):
        raise ValueError(f"unknown start method {start_method!r}: use spawn or fork")
    return mp.get_context("fork") if start_method == "fork" else mp.get_context("spawn")


def stop_processes(procs: Sequence[BaseProcess], timeout_s: float = 10.0) -> None:
    """Wait up to ``timeout_s`` seconds for each process to exit, then terminate (and, past
    another ``timeout_s``, kill) any still alive, so none outlives its caller."""
    for p in procs:
        if p.pid is None:  # never started
            continue
        p.join(timeout=timeout_s)
        if p.is_alive():
            p.terminate()
            p.join(timeout=timeout_s)
        if p.is_alive():
            p.kill()
            p.join()


def _spawn(
    world: int, tasks: list[tuple[str, object]], timeout_s: float, start_method: str = "spawn"
) -> list[list[object]]:
    import queue as queue_mod

    ctx = mp_context(start_method)
    q = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world, port, tasks, q), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, list[object]] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) + len(errors) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"parallel run did not finish within {timeout_s:.0f} s")
            try:
                rank, res, err = q.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    codes = [p.exitcode for p in procs]
                    raise RuntimeError(f"a rank exited early (exit codes {codes})") from None
                continue
            if err is not None:
                errors.append(f"rank {rank}: {err.strip().splitlines()[-1]}")
            else:
                results[rank] = list(res)
        if errors:
            raise RuntimeError("; ".join(errors))
    finally:
        stop_processes(procs)
    return [results[r] for r in range(world)]


def _unpack(res: object) -> ParallelRun:
    assert isinstance(res, tuple)
    run, arrays = res
    assert isinstance(run, ParallelRun)
    return replace(run, logits=[torch.from_numpy(a) for a in arrays])


def run_parallel(
    job: ParallelJob, mode: Mode, world: int = 2, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> ParallelRun:
    """Run ``job`` split ``mode`` (``tp`` or ``pp``) over ``world`` gloo processes on
    127.0.0.1: :func:`run_parallel_many` with one run."""
    return run_parallel_many([(mode, job)], world, timeout_s=timeout_s).runs[0]


@dataclass(frozen=True)
class ParallelGroup:
    """What one group of processes measured.

    Attributes:
        runs: one per ``(mode, job)`` asked for, in order.
        link: the loopback link measured in the same group (``None`` unless asked for).
    """

    runs: list[ParallelRun]
    link: LinkCalibration | None = None


def run_parallel_many(
    runs: Sequence[tuple[Mode, ParallelJob]],
    world: int = 2,
    *,
    link_reps: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    start_method: str = "spawn",
) -> ParallelGroup:
    """Each ``(mode, job)`` in turn in one group of ``world`` gloo processes on 127.0.0.1
    (one process start for all), then, with ``link_reps`` > 0 and ``world`` 2, the link
    calibration of :func:`calibrate_loopback` (so the link is measured under the same load
    as the runs). Each run is rank 0's (TP) or the last stage's outputs (PP), with rank 0's
    step times and every rank's ``comm_s``/``compute_s``. ``start_method``: how the ranks
    start (``spawn``: a fresh interpreter each, safe anywhere; ``fork``: a copy of this
    process, no second torch import, for callers that hold no threads of their own).

    Raises:
        ValueError: a mode other than ``tp``/``pp``, fewer than 2 processes, or a model
            that does not split that way (a dimension not divisible, fewer blocks than
            stages, a batch that does not divide into micro-batches).
        RuntimeError: a rank failed (its last error line) or the group timed out.
    """
    if world < 2:
        raise ValueError("a parallel run needs at least 2 processes")
    for mode, job in runs:
        if mode not in ("tp", "pp"):
            raise ValueError(f"unknown parallel mode {mode!r}: use tp or pp")
        _check_split(job.cfg, mode, world, job)
    tasks: list[tuple[str, object]] = [(m, j) for m, j in runs]
    if link_reps > 0 and world == 2:
        tasks.append(("calibrate", _CalibrationTask(CALIBRATION_SIZES, link_reps)))
    per_rank = _spawn(world, tasks, timeout_s, start_method)
    out: list[ParallelRun] = []
    for i, (mode, _) in enumerate(runs):
        typed = [_unpack(per_rank[r][i]) for r in range(world)]
        head = typed[0] if mode == "tp" else typed[-1]
        first = typed[0]
        out.append(
            replace(
                head,
                mode=mode,
                prefill_s=first.prefill_s,
                step_s=first.step_s,
                comm_s=[r.comm_s[0] for r in typed],
                compute_s=[r.compute_s[0] for r in typed],
                events=[r.events[0] for r in typed],
                collectives_per_step=first.collectives_per_step,
            )
        )
    link = None
    if len(tasks) > len(runs):
        link = _link_calibration(per_rank[0][-1], link_reps)
    return ParallelGroup(out, link)


# --------------------------------------------------------------------------- link calibration


@dataclass(frozen=True)
class _CalibrationTask:
    sizes_bytes: tuple[int, ...]
    reps: int


def _fit(sizes: list[int], samples: list[list[float]]) -> LinkFit:
    med = [statistics.median(x) for x in samples]
    p10 = [sorted(x)[len(x) // 10] for x in samples]
    lat = med[0]
    extra = med[-1] - lat
    bw = sizes[-1] / extra if extra > 0 else float("inf")
    return LinkFit(lat, bw, tuple(sizes), tuple(med), tuple(p10))


def _calibrate(rank: int, task: _CalibrationTask) -> tuple[list[list[float]], list[list[float]]]:
    """Rounds over every size (so a change of machine load spreads over all sizes): a
    ping-pong (half the round trip) and an all-reduce of each, the first 2 rounds dropped."""
    peer = 1 - rank
    bufs = [torch.zeros(max(size // 4, 1), dtype=torch.float32) for size in task.sizes_bytes]
    send_t: list[list[float]] = [[] for _ in bufs]
    ar_t: list[list[float]] = [[] for _ in bufs]
    for rep in range(task.reps + 2):
        for j, buf in enumerate(bufs):
            torch.distributed.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                torch.distributed.send(buf, peer)
                torch.distributed.recv(buf, peer)
            else:
                torch.distributed.recv(buf, peer)
                torch.distributed.send(buf, peer)
            t1 = time.perf_counter()
            torch.distributed.barrier()
            t2 = time.perf_counter()
            torch.distributed.all_reduce(buf)
            t3 = time.perf_counter()
            if rep >= 2:
                send_t[j].append((t1 - t0) / 2)
                ar_t[j].append(t3 - t2)
    return send_t, ar_t


#: Message sizes of :func:`calibrate_loopback`: 4 B to 4 MiB.
CALIBRATION_SIZES = (4, 256, 4096, 16384, 65536, 262144, 1048576, 4194304)


def calibrate_loopback(
    sizes_bytes: tuple[int, ...] = CALIBRATION_SIZES,
    reps: int = 20,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> LinkCalibration:
    """Ping-pong and all-reduce between 2 gloo processes on 127.0.0.1 (1 thread each);
    medians of ``reps`` per size, rank 0's clock, fitted to latency + bytes/bandwidth."""
    task = _CalibrationTask(tuple(sizes_bytes), reps)
    return _link_calibration(_spawn(2, [("calibrate", task)], timeout_s)[0][0], reps, sizes_bytes)


def _link_calibration(
    raw: object, reps: int, sizes_bytes: tuple[int, ...] = CALIBRATION_SIZES
) -> LinkCalibration:
    assert isinstance(raw, tuple)
    send_t, ar_t = raw
    sizes = list(sizes_bytes)
    return LinkCalibration(_fit(sizes, send_t), _fit(sizes, ar_t), reps)
