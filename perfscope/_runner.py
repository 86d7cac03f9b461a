"""``perfscope run`` as a library call: workload → driver → engine → recorder → run store."""

from __future__ import annotations

import dataclasses
import os
import platform
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from perfscope import __version__
from perfscope._analyze import analyze_stored
from perfscope.analysis import Summary
from perfscope.errors import PerfscopeError
from perfscope.hwdb import load_database, resolve_hardware
from perfscope.profiler import nvtx_ranges
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.contention import ContentionMeter, local_server_ports
from perfscope.profiler.driver import Driver, LoadConfig
from perfscope.profiler.engines.base import Engine, EngineOptions, Inbox, create_engine
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.store import (
    default_runs_root,
    new_run_dir,
    read_run,
    write_json_atomic,
    write_table_atomic,
)
from perfscope.profiler.telemetry import TelemetryConfig, TelemetrySession, start_telemetry
from perfscope.profiler.workload import WorkloadConfig, build_workload, with_fresh_salt

__all__ = ["ProgressHook", "RunOptions", "RunOutcome", "execute_run", "host_info"]

MANIFEST_SCHEMA = "perfscope.manifest/1"


@dataclass
class RunOptions:
    """Everything ``perfscope run`` needs (the CLI fills it from its flags).

    Attributes:
        engine: engine URI (``reference``, ``python:mod:fn``, ...).
        workload: what to send.
        load: how it arrives.
        engine_options: batch size, scheduler, device, dtype, model shape, ...
        slos: per-request limits in seconds.
        runs_dir: root folder of run directories (default ``$PERFSCOPE_RUNS_DIR`` or
            ``./perfscope-runs``).
        name: short name in the run id (default: the engine kind).
        hw: device to analyse against; ``None`` = detect.
        telemetry: hardware sampling (interval, GPUs, on/off).
        nvtx: ``True``/``False`` force NVTX ranges on/off; ``None`` = on only when a profiler
            (Nsight Systems) is attached.
        command: the command line, for the manifest.
        ray: spread load generation over Ray actors (``local:N``, a cluster address, or
            ``auto``); ``None`` = this process alone.
        run_set: the run set this run belongs to (``perfscope run --repeat``): ``id``,
            ``label``, ``index``, ``repeat``; stored in the manifest and the summary.
        model_spec: the model to analyse an engine that reports none (HTTP, python
            engines) against: a :class:`~perfscope.analysis.modelspec.ModelSpec` dict with
            ``estimated`` and ``method`` saying where it came from.
    """

    engine: str = "reference"
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    engine_options: EngineOptions = field(default_factory=EngineOptions)
    slos: dict[str, float] = field(default_factory=dict)
    runs_dir: Path | None = None
    name: str | None = None
    hw: str | None = None
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    nvtx: bool | None = None
    command: list[str] | None = None
    ray: str | None = None
    run_set: dict[str, Any] | None = None
    model_spec: dict[str, Any] | None = None


@dataclass
class RunOutcome:
    """Where the run went and how it ended (``complete``, ``interrupted``, ``failed``)."""

    path: Path
    status: str
    summary: Summary
    error: str | None = None


class ProgressHook:
    """Receives run progress; the CLI draws a rich progress bar from it."""

    def on_start(self, total_requests: int) -> None:
        """The run starts; ``total_requests`` includes warmup requests."""

    def on_request_done(self, request_id: int) -> None:
        """A request finished (called from the engine's thread)."""

    def on_end(self) -> None:
        """Capture is over; analysis and writing follow."""


def host_info() -> dict[str, Any]:
    """Machine facts for the manifest."""
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None:
        info["torch"] = torch_mod.__version__
        info["torch_threads"] = torch_mod.get_num_threads()
        info["cuda_available"] = bool(torch_mod.cuda.is_available())
    return info


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Ignore a second Ctrl-C while the captured data is being written."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _model_from_hf_config(path: str, dtype: str | None) -> dict[str, Any] | None:
    """ModelSpec fields of a local HF model, in the dtype it runs in (logits: last position)."""
    from perfscope.analysis.modelspec import ModelSpec

    try:
        spec = ModelSpec.from_hf_config(path)
    except PerfscopeError:
        return None
    if dtype:
        short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
        spec = spec.with_dtypes(weight_dtype=short, kv_dtype=short, act_dtype=short)
    return {**spec.to_dict(), "lm_head_all_positions": False}


def _serve_distributed(
    opts: RunOptions,
    eopts: EngineOptions,
    specs: list[Any],
    recorder: Recorder,
    clock: MonotonicClock,
) -> Any:
    """The run's requests served from Ray actors (``--ray``) instead of this process."""
    from dataclasses import asdict

    from perfscope.profiler.distributed import parse_ray_target, plan_for, run_distributed

    if opts.engine.split(":", 1)[0] not in ("openai", "python"):
        raise PerfscopeError(
            "--ray spreads per-request engines (openai:, python:) over load actors; "
            f"{opts.engine!r} batches in one process"
        )
    load = opts.load
    plan = plan_for(
        specs, load.mode, load.rate, load.arrival, load.burstiness, load.seed, load.duration_s
    )
    return run_distributed(
        opts.engine,
        asdict(eopts),
        plan,
        recorder,
        clock.origin_perf_counter_ns,
        parse_ray_target(opts.ray),
        concurrency=load.concurrency,
    )


def execute_run(
    opts: RunOptions,
    progress: ProgressHook | None = None,
    *,
    engine_factory: Callable[[str, EngineOptions], Engine] = create_engine,
) -> RunOutcome:
    """Run the workload on the engine and store the run; raises UsageError on bad input
    before anything is written. An engine failure or Ctrl-C still leaves a readable run
    (status ``failed`` / ``interrupted``) with everything captured so far."""
    progress = progress or ProgressHook()
    # A new prompt salt per run (unless a seed asked for an exact repeat): no server can
    # answer a rerun from its prefix cache.
    opts = dataclasses.replace(opts, workload=with_fresh_salt(opts.workload))
    specs = build_workload(opts.workload)
    opts.load.validate()
    longest = max(s.prompt_tokens + s.max_output_tokens for s in specs)
    eopts = opts.engine_options
    eopts = EngineOptions(
        **{
            **eopts.__dict__,
            "max_seq_len": max(eopts.max_seq_len, longest),
            "longest_request_tokens": longest,
            "extra": {"prompt_salt": str(opts.workload.prompt_salt), **eopts.extra},
        }
    )
    engine = engine_factory(opts.engine, eopts)
    info = engine.info()
    if info.model is None and info.config.get("hf_config"):
        info.model = _model_from_hf_config(str(info.config["hf_config"]), info.dtype)
    clock = MonotonicClock()
    telemetry: TelemetrySession | None = None
    try:
        database = load_database()  # once per run: resolution here, projections later
        hardware = resolve_hardware(info.to_dict(), opts.hw, database=database)
        if opts.nvtx is not None:
            nvtx_ranges.set_enabled(opts.nvtx)
        if opts.telemetry.enabled:
            tcfg = opts.telemetry
            if str(info.device or "").startswith("cuda") and not tcfg.cuda_memory:
                tcfg = TelemetryConfig(**{**tcfg.__dict__, "cuda_memory": True})
            # Before the first request: it samples the idle baseline first.
            telemetry = start_telemetry(clock, tcfg)
    except BaseException:
        engine.close()
        raise

    root = opts.runs_dir or default_runs_root()
    run_dir = new_run_dir(root, opts.name or info.kind, clock.started_at)
    manifest: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "run_id": run_dir.name,
        "name": opts.name or info.kind,
        "perfscope_version": __version__,
        "command": opts.command or sys.argv,
        "started_at": clock.started_at.isoformat(),
        # Raw perf_counter_ns (CLOCK_MONOTONIC) at run time 0: lets records be compared with
        # other processes' monotonic stamps (a server's log, a packet capture's clock).
        "clock_origin_perf_counter_ns": clock.origin_perf_counter_ns,
        "ended_at": None,
        "status": "running",
        "engine": info.to_dict(),
        "workload": opts.workload.to_dict(),
        "load": opts.load.to_dict(),
        "slos": opts.slos,
        "hw": opts.hw,
        "hardware": hardware,
        "telemetry": telemetry.manifest_info() if telemetry else {"enabled": False},
        "nvtx": nvtx_ranges.is_enabled(),
        "host": host_info(),
        "errors": [],
    }
    if opts.run_set is not None:
        manifest["run_set"] = dict(opts.run_set)
    if opts.model_spec is not None:
        given = dict(opts.model_spec)
        if manifest["engine"].get("model"):
            given["note"] = "the engine reported its own model; that one is used"
        else:
            manifest["engine"]["model"] = given
        manifest["model_spec"] = given
    write_json_atomic(run_dir / "manifest.json", manifest)

    recorder = Recorder(clock)
    recorder.add_finish_listener(progress.on_request_done)
    inbox = Inbox()
    driver = Driver(specs, opts.load, inbox, recorder)
    status, error = "complete", None
    contention = ContentionMeter(exclude_ports=local_server_ports(opts.engine)).start()
    progress.on_start(len(specs))
    distributed = None
    try:
        with nvtx_ranges.run_range(manifest["run_id"]):
            if opts.ray is not None:
                distributed = _serve_distributed(opts, eopts, specs, recorder, clock)
            else:
                driver.start()
                engine.serve(inbox, recorder)
                driver.join()
        if driver.error is not None:
            raise driver.error
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted by the user (Ctrl-C)"
    except Exception as exc:
        status = "failed"
        error = f"{type(exc).__name__}: {exc}"
    finally:
        driver.stop()
        progress.on_end()
        with _sigint_deferred():
            if status != "complete":
                recorder.fail_unfinished(status)
            manifest["status"] = status
            manifest["ended_at"] = datetime.now(UTC).isoformat()
            manifest["host"]["contention"] = contention.stop()
            if error:
                manifest["errors"].append(error)
            if distributed is not None:
                manifest["distributed"] = distributed.to_dict()
                manifest["errors"].extend(distributed.errors)
            write_table_atomic(run_dir / "requests.parquet", recorder.requests_table())
            write_table_atomic(run_dir / "chunks.parquet", recorder.chunks_table())
            write_table_atomic(run_dir / "steps.parquet", recorder.steps_table())
            if distributed is not None:
                write_table_atomic(run_dir / "actors.parquet", distributed.actors_table())
            if telemetry is not None:
                write_table_atomic(run_dir / "telemetry.parquet", telemetry.stop())
                manifest["telemetry"] = telemetry.manifest_info()
            write_json_atomic(run_dir / "manifest.json", manifest)
            try:
                engine.close()
            except Exception as exc:  # closing must not lose the run
                manifest["errors"].append(f"engine close failed: {exc}")
    with _sigint_deferred():
        summary = analyze_stored(read_run(run_dir), database=database)
    return RunOutcome(path=run_dir, status=status, summary=summary, error=error)
