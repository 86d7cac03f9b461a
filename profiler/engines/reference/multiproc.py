"""The reference engine in worker processes: prefill/decode disaggregation and replicas.

``--engine-opt disaggregate=on``: prefill runs in one process and decode in another, each
with its own copy of the model (same seed, same weights). The prefill process prefills the
prompts that arrived (grouped by length, up to ``--batch-size`` at a time) and copies each
request's K and V (every layer, its prompt tokens) into a free slot of a ring of tensors in
shared memory (``share_memory_``, allocated once, two batches deep); a pipe tells the decode
process which slot holds which request, and the decode process copies it into a free slot
of its own KV cache and decodes with continuous batching. The first token counts as
emitted when its KV cache is in the decode cache, so TTFT includes the hand-off. Every
hand-off is timed per request (:class:`Handoff`: copy out, transit, copy in, in seconds,
and its bytes) and kept in the run's manifest (``engine.config.handoff``).

``--engine-opt replicas=N``: N full copies of the reference engine (any other options), one
per process, behind one inbox; each request goes to one replica, ``dispatch=least-loaded``
(default: the replica with the fewest requests in flight, lowest index on a tie) or
``round-robin``. ``--batch-size`` is per replica.

``threads=N`` is per process (default 1: N processes of one thread each). Workers start as
a copy of this process (``fork``) on the CPU with one thread each, else as a fresh
interpreter (``spawn``; ``start_method=fork|spawn`` to choose), and talk over queues only:
no TCP socket is opened. Each worker keeps its own :class:`~perfscope.profiler.recorder.
Recorder` on the parent's clock (``perf_counter_ns`` is one monotonic clock for every
process of the machine) and forwards its token chunks, steps and finished requests to the
parent's recorder as each request finishes. ``close()`` (also after an error) stops every
worker; a worker whose parent is gone exits within a second.
"""

from __future__ import annotations

import contextlib
import os
import queue as queue_mod
import statistics
import threading
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import torch

from perfscope.errors import UsageError
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.engines.base import (
    EngineInfo,
    EngineOptions,
    Inbox,
    Submission,
    option_choice,
    option_int,
)
from perfscope.profiler.engines.reference.engine import ReferenceEngine, _Seq, prompt_ids
from perfscope.profiler.engines.reference.model import ReferenceConfig, torch_dtype
from perfscope.profiler.engines.reference.parallel import mp_context, stop_processes
from perfscope.profiler.recorder import Recorder, RequestHandle
from perfscope.profiler.records import RequestSpec

__all__ = ["MULTI_KEYS", "Handoff", "MultiPlan", "MultiProcessEngine", "kv_handoff_bytes"]

#: The engine options this module reads (left out of the workers' own options).
MULTI_KEYS = ("disaggregate", "replicas", "dispatch", "start_method")
#: Seconds the workers may take to import torch and build their model.
START_TIMEOUT_S = 180.0
DISPATCH = ("least-loaded", "round-robin")
Mode = Literal["disaggregate", "replicas"]


@dataclass(frozen=True)
class Handoff:
    """One request's KV cache handed from the prefill process to the decode process.

    Attributes:
        request_id: the request.
        prompt_tokens: tokens whose K and V were handed over.
        nbytes: bytes handed over (K and V of every layer for the prompt tokens).
        copy_out_s: s, prefill cache -> a new shared-memory tensor.
        transit_s: s, put on the queue -> taken off it by the decode process (pickling the
            file descriptor, mapping the storage).
        copy_in_s: s, shared-memory tensor -> the decode cache slot.
        wait_s: s the decode process held it before a slot was free (not in ``seconds``).
    """

    request_id: int
    prompt_tokens: int
    nbytes: int
    copy_out_s: float
    transit_s: float
    copy_in_s: float
    wait_s: float

    @property
    def seconds(self) -> float:
        """The hand-off itself: copy out + transit + copy in (s)."""
        return self.copy_out_s + self.transit_s + self.copy_in_s


def kv_handoff_bytes(cfg: ReferenceConfig, tokens: int) -> int:
    """Bytes of one request's KV cache for ``tokens`` tokens: layers x 2 (K, V) x KV heads
    x head_dim x tokens x bytes per element of the model dtype."""
    itemsize = torch_dtype(cfg.dtype).itemsize
    return cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * tokens * itemsize


@dataclass(frozen=True)
class MultiPlan:
    """How to split the engine over processes.

    Attributes:
        mode: ``disaggregate`` (a prefill and a decode process) or ``replicas``.
        processes: worker processes.
        dispatch: ``least-loaded`` or ``round-robin`` (replicas only).
        threads: torch intra-op threads per process.
        inner: the options each worker's engine is built with.
        start_method: ``fork`` or ``spawn`` (see :meth:`parse`).
    """

    mode: Mode
    processes: int
    dispatch: str
    threads: int
    inner: EngineOptions
    start_method: str = "spawn"

    @staticmethod
    def parse(options: EngineOptions) -> MultiPlan | None:
        """The plan in ``options.extra`` (None: a single in-process engine). Raises a
        one-line UsageError for a bad value or a combination that cannot run."""
        extra = dict(options.extra)
        dis = option_choice(extra, "disaggregate", ("off", "on"), "off") == "on"
        replicas = option_int(extra, "replicas") or 1
        dispatch = option_choice(extra, "dispatch", DISPATCH, "least-loaded")
        if dis and replicas > 1:
            raise UsageError(
                "--engine-opt disaggregate=on and replicas= cannot be combined: pick one"
            )
        if not dis and replicas == 1:
            if "dispatch" in extra:
                raise UsageError("--engine-opt dispatch= needs replicas=N with N >= 2")
            return None
        threads = option_int(extra, "threads") or 1
        inner = {k: v for k, v in extra.items() if k not in MULTI_KEYS}
        inner["threads"] = str(threads)
        if dis:
            _check_disaggregable(options, inner)
        mode: Mode = "disaggregate" if dis else "replicas"
        start = option_choice(extra, "start_method", ("auto", "fork", "spawn"), "auto")
        if start == "auto":  # a copy of this process starts in milliseconds, a fresh one in
            # seconds; forking is safe without CUDA and without an OpenMP pool in the child
            cpu = options.device == "cpu" or (
                options.device is None and not torch.cuda.is_available()
            )
            start = "fork" if cpu and threads == 1 else "spawn"
        return MultiPlan(
            mode, 2 if dis else replicas, dispatch, threads, replace(options, extra=inner), start
        )


def _check_disaggregable(options: EngineOptions, inner: dict[str, str]) -> None:
    if options.scheduler != "continuous":
        raise UsageError("--engine-opt disaggregate=on needs --scheduler continuous")
    bad = [
        k
        for k, off in (
            ("prefix_cache", "off"),
            ("kv_cache", "on"),
            ("kv_paged", "off"),
            ("kv_dtype", "auto"),
            ("kv_cache_dtype", "auto"),
        )
        if k in inner and inner[k].strip().lower() != off
    ]
    bad += [k for k in ("max_batched_tokens", "draft", "kv_budget_mb") if k in inner]
    if bad:
        raise UsageError(
            f"--engine-opt disaggregate=on hands over a plain KV cache: drop {', '.join(bad)}"
        )


# --------------------------------------------------------------------------- worker side


@dataclass
class _Channel:
    """The prefill -> decode hand-off: ``ring`` (shared memory, ``[slots, n_layers, 2,
    n_kv_heads, max_seq_len, head_dim]`` in the model dtype), a pipe (``send`` on the
    prefill side, ``recv`` on the decode side: which slot holds which request, with its first
    token and times; a pipe, not a queue, so no feeder thread stands between the two) and
    ``free_q`` (slots the decode side has copied out). The ring holds two batches: prefill
    runs at most that far ahead."""

    ring: torch.Tensor
    recv: Any
    send: Any
    free_q: Any

    def get(self, parent: int) -> Any:
        """The next hand-off message; exits the process once its parent is gone."""
        while not self.recv.poll(1.0):
            if os.getppid() != parent:
                raise SystemExit(0)
        return self.recv.recv()

    @staticmethod
    def open(ctx: Any, cfg: ReferenceConfig, batch: int, max_len: int) -> _Channel:
        slots = 2 * batch
        shape = (slots, cfg.n_layers, 2, cfg.n_kv_heads, max_len, cfg.head_dim)
        ring = torch.zeros(shape, dtype=torch_dtype(cfg.dtype)).share_memory_()  # type: ignore[no-untyped-call]
        free_q = ctx.Queue()
        for i in range(slots):
            free_q.put(i)
        recv, send = ctx.Pipe(duplex=False)
        return _Channel(ring, recv, send, free_q)


def _next_message(q: Any, parent: int) -> Any:
    """The next message of ``q``; exits the process once its parent ``parent`` is gone."""
    while True:
        try:
            return q.get(timeout=1.0)
        except queue_mod.Empty:
            if os.getppid() != parent:
                raise SystemExit(0) from None


class _Link:
    """A worker's recorder and what it has forwarded to the parent so far."""

    def __init__(self, wid: int, out_q: Any, origin_ns: int, engine: ReferenceEngine) -> None:
        self.wid, self.out_q, self.engine = wid, out_q, engine
        self.rec = Recorder(MonotonicClock(origin_ns=origin_ns))
        self.rec.add_finish_listener(lambda rid: self.flush([rid]))
        self.handles: dict[int, RequestHandle] = {}
        self.handoffs: dict[int, Handoff] = {}
        self._chunks = self._steps = 0

    def add(self, spec: RequestSpec) -> RequestHandle:
        h = self.rec.add_request(spec)
        self.handles[spec.request_id] = h
        return h

    def flush(self, finished: list[int]) -> None:
        """Send the chunks and steps recorded since the last flush and ``finished``."""
        chunks = self.rec.chunk_rows(self._chunks)
        steps = self.rec.step_rows(self._steps)
        self._chunks += len(chunks)
        self._steps += len(steps)
        out = self.engine.output_ids or {}
        fins = []
        for rid in finished:
            r = self.handles.pop(rid).record
            h = self.handoffs.pop(rid, None)
            fins.append((rid, r.error, r.cached_tokens, out.pop(rid, []), h))
        if chunks or steps or fins:
            self.out_q.put(("rows", self.wid, (chunks, steps, fins)))

    def fail(self, spec: RequestSpec, error: str) -> None:
        self.add(spec).finish(error=error)


def _worker(
    role: str,
    wid: int,
    options: EngineOptions,
    in_q: Any,
    hand: _Channel | None,
    out_q: Any,
    parent: int,
) -> None:
    engine: ReferenceEngine | None = None
    try:
        engine = ReferenceEngine("reference", options)
        engine.output_ids = {}
        out_q.put(("ready", wid, None))
        msg = _next_message(in_q, parent)
        if msg[0] != "start":
            return
        link = _Link(wid, out_q, int(msg[1]), engine)
        if role == "replica":
            _serve_replica(link, in_q, parent)
        elif role == "prefill":
            assert hand is not None
            _serve_prefill(link, in_q, hand, parent)
        else:
            assert hand is not None
            _serve_decode(link, hand, parent)
        link.flush([])
        out_q.put(("done", wid, None))
        while _next_message(in_q, parent)[0] != "stop":  # exit when the parent says so
            pass
    except SystemExit:
        pass
    except BaseException as exc:  # reported to the parent, which fails the run
        last = traceback.format_exc(limit=4).strip().splitlines()[-1]
        out_q.put(("error", wid, str(exc) if isinstance(exc, UsageError) else last))
    finally:
        if engine is not None:
            engine.close()


def _serve_replica(link: _Link, in_q: Any, parent: int) -> None:
    inbox = Inbox()

    def feed() -> None:
        while True:
            msg = _next_message(in_q, parent)
            if msg[0] != "req":
                inbox.close()
                return
            inbox.put(Submission(msg[1], link.add(msg[1])))

    threading.Thread(target=feed, name="replica-feed", daemon=True).start()
    link.engine.serve(inbox, link.rec)


def _request_error(spec: RequestSpec, max_seq_len: int) -> str | None:
    need = spec.prompt_tokens + spec.max_output_tokens
    if spec.prompt_tokens < 1:
        return "empty prompt"
    if need > max_seq_len:
        return f"prompt + output = {need} tokens exceeds max_seq_len {max_seq_len}"
    return None


def _serve_prefill(link: _Link, in_q: Any, hand: _Channel, parent: int) -> None:
    """Prefill what arrived (by length, up to batch size), hand each KV cache over."""
    eng, rec = link.engine, link.rec
    model, bs = eng.model, eng.options.batch_size
    cache = model.new_cache(bs, eng.max_seq_len)
    cfg = eng.config
    ended = False
    while not ended:
        msgs = [_next_message(in_q, parent)]
        with contextlib.suppress(queue_mod.Empty):
            while len(msgs) < bs:
                msgs.append(in_q.get_nowait())
        groups: dict[int, list[RequestSpec]] = {}
        for msg in msgs:
            if msg[0] != "req":
                ended = True
                continue
            spec: RequestSpec = msg[1]
            error = _request_error(spec, eng.max_seq_len)
            if error is not None:
                link.fail(spec, error)
            else:
                groups.setdefault(spec.prompt_tokens, []).append(spec)
        for n_tok, specs in groups.items():
            ids = [prompt_ids(s, cfg.vocab_size, eng.options.seed) for s in specs]
            tokens = torch.stack(ids).to(eng.device)
            t0 = rec.clock.now_ns()
            first = model.prefill(tokens, cache.view(0, len(specs))).argmax(-1).tolist()
            t1 = rec.clock.now_ns()
            rids = [s.request_id for s in specs]
            rec.step("prefill", t0, t1, len(specs), n_tok * len(specs), 0, rids)
            for j, spec in enumerate(specs):
                slot = int(
                    _next_message(hand.free_q, parent)
                )  # waits while the decode side is full
                h0 = time.perf_counter_ns()
                buf = hand.ring[slot]
                for layer in range(cfg.n_layers):
                    buf[layer, 0, :, :n_tok].copy_(cache.k[layer][j, :, :n_tok])
                    buf[layer, 1, :, :n_tok].copy_(cache.v[layer][j, :, :n_tok])
                hand.send.send(("kv", spec, int(first[j]), slot, h0, time.perf_counter_ns()))
        link.flush([])
    hand.send.send(("end",))


def _serve_decode(link: _Link, hand: _Channel, parent: int) -> None:
    """Take handed-over requests into free slots; continuous-batching decode."""
    eng, rec = link.engine, link.rec
    cache = eng.model.new_cache(eng.options.batch_size, eng.max_seq_len)
    got: queue_mod.SimpleQueue[tuple[Any, ...]] = queue_mod.SimpleQueue()

    def receive() -> None:  # stamps each hand-off as it arrives, decode steps or not
        while True:
            msg = hand.get(parent)
            got.put((*msg, time.perf_counter_ns()))
            if msg[0] != "kv":
                return

    threading.Thread(target=receive, name="kv-receive", daemon=True).start()
    running: list[_Seq] = []
    pending: deque[tuple[Any, ...]] = deque()
    ended = False
    while True:
        while True:
            try:
                msg = got.get(block=not (running or pending or ended), timeout=1.0)
            except queue_mod.Empty:
                break
            if msg[0] == "kv":
                pending.append(msg)
            else:
                ended = True
        if not running and not pending:
            if ended:
                return
            continue
        while pending and len(running) < eng.options.batch_size:
            running.append(_admit(link, cache, len(running), hand, pending.popleft()))
        eng._drop_finished(running, cache, False)
        if running:
            eng._decode(running, cache, rec)
            eng._drop_finished(running, cache, False)


def _admit(link: _Link, cache: Any, slot: int, hand: _Channel, msg: tuple[Any, ...]) -> _Seq:
    _, spec, first, ring_slot, h0, h_put, h_got = msg
    eng = link.engine
    h_in = time.perf_counter_ns()
    n_tok = spec.prompt_tokens
    buf = hand.ring[ring_slot]
    for layer in range(buf.shape[0]):
        cache.k[layer][slot, :, :n_tok].copy_(buf[layer, 0, :, :n_tok])
        cache.v[layer][slot, :, :n_tok].copy_(buf[layer, 1, :, :n_tok])
    h_done = time.perf_counter_ns()
    hand.free_q.put(ring_slot)
    link.handoffs[spec.request_id] = Handoff(
        spec.request_id,
        n_tok,
        n_tok * buf[:, :, :, :1].numel() * buf.element_size(),
        (h_put - h0) / 1e9,
        (h_got - h_put) / 1e9,
        (h_done - h_in) / 1e9,
        (h_in - h_got) / 1e9,
    )
    handle = link.add(spec)
    sub = Submission(spec, handle)
    seq = _Seq(sub=sub, length=n_tok, generated=1, next_token=first)
    handle.tokens(1, link.rec.clock.now_ns())
    eng._keep(sub, first)
    if seq.generated >= spec.max_output_tokens or eng._is_eos(first):
        seq.done = True
        handle.finish()
    return seq


# --------------------------------------------------------------------------- parent side


class MultiProcessEngine:
    """The parent: one inbox, worker processes behind it (see the module docstring)."""

    def __init__(self, uri: str, options: EngineOptions, plan: MultiPlan) -> None:
        local = ReferenceEngine(uri, plan.inner)  # checks every option here, one line each
        try:
            self._info = local.info()
            self.config = local.config
        finally:
            local.close()
        self.plan = plan
        self.output_ids: dict[int, list[int]] | None = None
        #: Hand-offs by request id (disaggregation), filled as requests finish.
        self.handoffs: dict[int, Handoff] = {}
        #: The worker that finished each request id (the decode process for disaggregation).
        self.served_by: dict[int, int] = {}
        self._stop = threading.Event()
        ctx = mp_context(plan.start_method)
        self._out: Any = ctx.Queue()
        self._in: list[Any] = [ctx.Queue() for _ in range(plan.processes)]
        hand = (
            _Channel.open(ctx, self.config, options.batch_size, options.max_seq_len)
            if plan.mode == "disaggregate"
            else None
        )
        self._hand = hand
        roles = (
            ["prefill", "decode"] if plan.mode == "disaggregate" else ["replica"] * plan.processes
        )
        self._roles = roles
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(role, w, plan.inner, self._in[w], hand, self._out, os.getpid()),
                daemon=True,
                name=f"perfscope-{role}-{w}",
            )
            for w, role in enumerate(roles)
        ]
        try:
            for p in self._procs:
                p.start()
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        ready: set[int] = set()
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(ready) < len(self._procs):
            kind, wid, payload = self._next(deadline, "start")
            if kind == "error":
                raise UsageError(f"reference engine {self._roles[wid]} process: {payload}")
            ready.add(wid)

    def _next(self, deadline: float, what: str) -> tuple[str, int, Any]:
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker processes did not {what} in time")
            try:
                msg: tuple[str, int, Any] = self._out.get(timeout=0.5)
                return msg
            except queue_mod.Empty:
                dead = [p.exitcode for p in self._procs if p.exitcode is not None]
                if dead and what != "finish":
                    raise RuntimeError(
                        f"a worker process exited early (exit codes {dead})"
                    ) from None
                if any(c not in (None, 0) for c in dead):
                    raise RuntimeError(f"a worker process died (exit codes {dead})") from None

    def info(self) -> EngineInfo:
        cfg = self._info.config
        cfg.update(
            torch_threads=self.plan.threads,
            threads_rule=f"per process {self.plan.threads}",
            disaggregate=self.plan.mode == "disaggregate",
            replicas=self.plan.processes if self.plan.mode == "replicas" else 1,
            dispatch=self.plan.dispatch if self.plan.mode == "replicas" else None,
            processes=self.plan.processes,
        )
        return self._info

    def serve(self, inbox: Inbox, recorder: Recorder) -> None:
        origin = time.perf_counter_ns() - recorder.clock.now_ns()
        for q in self._in:
            q.put(("start", origin))
        handles: dict[int, RequestHandle] = {}
        loads = [0] * self.plan.processes
        lock = threading.Lock()
        feeder = threading.Thread(
            target=self._feed,
            args=(inbox, handles, loads, lock),
            name="multiproc-feed",
            daemon=True,
        )
        feeder.start()
        done: set[int] = set()
        try:
            while len(done) < len(self._procs):
                kind, wid, payload = self._next(time.monotonic() + 1e9, "finish")
                if kind == "error":
                    raise RuntimeError(f"reference engine {self._roles[wid]} process: {payload}")
                if kind == "done":
                    done.add(wid)
                    continue
                self._apply(recorder, handles, wid, payload)
                with lock:
                    loads[wid] -= len(payload[2])
        finally:
            self._stop.set()
            feeder.join(timeout=5)
            self._record_handoffs()

    def _feed(
        self,
        inbox: Inbox,
        handles: dict[int, RequestHandle],
        loads: list[int],
        lock: threading.Lock,
    ) -> None:
        targets = 1 if self.plan.mode == "disaggregate" else self.plan.processes
        turn = 0
        while not self._stop.is_set():
            sub = inbox.get(timeout_s=0.5)
            if sub is None:
                if inbox.finished:
                    break
                continue
            handles[sub.spec.request_id] = sub.handle
            with lock:
                if self.plan.dispatch == "round-robin":
                    w, turn = turn % targets, turn + 1
                else:
                    w = min(range(targets), key=lambda i: (loads[i], i))
                loads[w] += 1
            self._in[w].put(("req", sub.spec))
        for q in self._in[:targets]:
            q.put(("end",))

    def _apply(
        self, recorder: Recorder, handles: dict[int, RequestHandle], wid: int, payload: Any
    ) -> None:
        chunks, steps, fins = payload
        for rid, t, n, _ in chunks:
            h = handles.get(rid)
            if h is not None and not h.done:
                h.tokens(n, t)
        for row in steps:
            _, kind, t0, t1, b, new, ctx, ids, role, proposed, accepted = row
            recorder.step(
                kind,
                t0,
                t1,
                b,
                new,
                ctx,
                ids,
                role=role,
                proposed_tokens=proposed,
                accepted_tokens=accepted,
            )
        for rid, error, cached, ids, handoff in fins:
            h = handles.pop(rid)
            if cached is not None:
                h.record.cached_tokens = cached
            h.finish(error=error)
            self.served_by[rid] = wid
            if handoff is not None:
                self.handoffs[rid] = handoff
            if self.output_ids is not None:
                self.output_ids[rid] = list(ids)

    def _record_handoffs(self) -> None:
        """The hand-offs into the manifest (``engine.config.handoff``); replicas: the
        requests each replica served (``engine.config.replica_requests``)."""
        if self.plan.mode == "replicas":
            counts = [0] * self.plan.processes
            for w in self.served_by.values():
                counts[w] += 1
            self._info.config["replica_requests"] = counts
            return
        hs = sorted(self.handoffs.values(), key=lambda h: h.request_id)
        secs = [h.seconds for h in hs]
        self._info.config["handoff"] = {
            "requests": len(hs),
            "bytes_total": sum(h.nbytes for h in hs),
            "seconds_p50": statistics.median(secs) if secs else None,
            "seconds_max": max(secs) if secs else None,
            "per_request": [asdict(h) for h in hs],
        }

    def close(self) -> None:
        """Stop every worker (waits up to 3 s each, then terminates). Idempotent."""
        self._stop.set()
        if not self._in:
            return
        for q in self._in:
            with contextlib.suppress(Exception):
                q.put(("stop",))
        stop_processes(self._procs, timeout_s=3.0)
        for q in (*self._in, self._out):
            q.cancel_join_thread()
            q.close()
        self._in = []
