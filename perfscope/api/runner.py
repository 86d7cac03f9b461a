"""``perfscope run`` as a library call: workload → driver → engine → recorder → run store.

Durability (docs/architecture.md): records stream into segment files during the run (a background
flusher, every :data:`FLUSH_INTERVAL_S`), the manifest carries the writer's pid, host and a
heartbeat, SIGTERM/SIGHUP stop the run as Ctrl-C does, and a failed write (disk full) stops
capture, keeps what was flushed and raises one :class:`~perfscope.errors.StorageError`.
At the end the tables are compacted into Parquet and the segments removed.
"""

from __future__ import annotations

import _thread
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
from pathlib import Path
from typing import Any

from perfscope import __version__
from perfscope.analysis import Summary
from perfscope.api.analyze import analyze_stored
from perfscope.errors import PerfscopeError, StorageError, UsageError
from perfscope.hwdb import load_database, resolve_hardware
from perfscope.profiler import nvtx_ranges
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.cluster_telemetry import ClusterTelemetry
from perfscope.profiler.contention import ContentionMeter, local_server_ports
from perfscope.profiler.driver import Driver, LoadConfig
from perfscope.profiler.engines.base import Engine, EngineOptions, Inbox, create_engine
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import Manifest
from perfscope.profiler.redact import redact_argv, redact_text
from perfscope.profiler.segments import DEFAULT_FLUSH_INTERVAL_S, SegmentFlusher
from perfscope.profiler.server_metrics import ServerMetricsConfig, start_server_metrics
from perfscope.profiler.store import RunWriter, StoredRun, default_runs_root
from perfscope.profiler.telemetry import TelemetryConfig, TelemetrySession, start_telemetry
from perfscope.profiler.workload import WorkloadConfig, build_workload, with_fresh_salt

__all__ = [
    "FLUSH_INTERVAL_S",
    "ProgressHook",
    "RunOptions",
    "RunOutcome",
    "Terminated",
    "execute_run",
    "host_info",
    "stop_signals_as_interrupt",
]

#: Seconds between segment flushes (and heartbeats): what a SIGKILL can lose at most.
FLUSH_INTERVAL_S = DEFAULT_FLUSH_INTERVAL_S


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
            ``auto``); ``None`` = this process alone. Telemetry then comes from one agent
            per cluster node (``node`` column), not from this process.
        ray_autoscale: with ``ray``, add load actors (up to this many in all) when one's
            event-loop lag grows past the threshold; ``None`` = warn only.
        server_metrics: scraping of the server's Prometheus endpoint (``auto``: an HTTP
            engine's ``/metrics`` when it answers).
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
    ray_autoscale: int | None = None
    server_metrics: ServerMetricsConfig = field(default_factory=ServerMetricsConfig)
    run_set: dict[str, Any] | None = None
    model_spec: dict[str, Any] | None = None


@dataclass
class RunOutcome:
    """Where the run went and how it ended (``complete``, ``interrupted``, ``failed``)."""

    path: Path
    status: str
    summary: Summary
    error: str | None = None
    succeeded: int = -1
    #: The run as stored, read once after capture (its ``summary`` the one just written):
    #: the caller's report reads this instead of the directory again.
    stored: StoredRun | None = None

    @property
    def exit_code(self) -> int:
        """What ``perfscope run`` exits with: 0 complete (some requests may have failed:
        they are reported), 1 interrupted or failed with data kept, 3 no measured request
        succeeded, 4 partial (a ``--ray`` load actor was lost: its in-flight requests were
        not measured)."""
        if self.status == "complete":
            return 0
        if self.status == "partial":
            return 4
        if self.status != "interrupted" and self.succeeded == 0:
            return 3
        return 1


class ProgressHook:
    """Receives run progress; the CLI draws a rich progress bar from it."""

    def on_start(self, total_requests: int) -> None:
        """The run starts; ``total_requests`` includes warmup requests."""

    def on_watch(self, recorder: Recorder, total_output_tokens: int) -> None:
        """Called just before :meth:`on_start` with the run's recorder (a live view polls
        :meth:`Recorder.live_counts`) and the most output tokens the workload asks for."""

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


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: handled as Ctrl-C (flush, finalise, ``interrupted``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def signame(self) -> str:
        return signal.Signals(self.signum).name


#: Signals that stop a run the way Ctrl-C does.
STOP_SIGNALS: tuple[int, ...] = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s
)


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


@contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise :class:`Terminated` (a KeyboardInterrupt)
    in the main thread, so ``timeout``, ``docker stop`` and a closed terminal stop a run
    as cleanly as Ctrl-C. Elsewhere than the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_terminated) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold off Ctrl-C, SIGTERM and SIGHUP while the captured data is being written; a
    stop signal that arrived meanwhile is raised (as KeyboardInterrupt) once it is written."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def note(signum: int, _frame: Any) -> None:
        received.append(signum)

    sigs = (signal.SIGINT, *STOP_SIGNALS)
    previous = {s: signal.signal(s, signal.SIG_IGN if s == signal.SIGINT else note) for s in sigs}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        raise Terminated(received[0])


def _no_success_error(recorder: Recorder) -> tuple[int, str | None]:
    """(successful measured requests, the run's error when there are none)."""
    table = recorder.requests_table()
    measured = [
        e
        for e, w in zip(
            table.column("error").to_pylist(), table.column("is_warmup").to_pylist(), strict=True
        )
        if not w
    ]
    ok = sum(1 for e in measured if e is None)
    if ok or not measured:
        return ok, None if measured else "no measured request was sent"
    first = next(e for e in measured if e is not None)
    return 0, (
        f"no measured request succeeded ({len(measured)} of {len(measured)} failed; "
        f"first error: {first})"
    )


def _model_from_hf_config(
    path: str, dtype: str | None, *, mla_absorbed: bool = True
) -> dict[str, Any] | None:
    """ModelSpec fields of a local HF model, in the dtype it runs in (logits: last position).

    ``mla_absorbed`` is the engine's own statement of how it runs multi-head latent
    attention: ``True`` for serving engines that absorb the up-projections (vLLM, SGLang),
    ``False`` for HF transformers, which expands the latent for every attended token.
    """
    from dataclasses import replace

    from perfscope.analysis.modelspec import ModelSpec

    try:
        spec = ModelSpec.from_hf_config(path)
    except PerfscopeError:
        return None
    if spec.is_mla and spec.mla_absorbed != mla_absorbed:
        spec = replace(spec, mla_absorbed=mla_absorbed)
    if dtype:
        short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
        spec = spec.with_dtypes(weight_dtype=short, kv_dtype=short, act_dtype=short)
    return {**spec.to_dict(), "lm_head_all_positions": False}


def _check_local_model(engine: str) -> None:
    """Refuse a ``vllm:PATH`` model whose architecture the cost model does not know, before
    vLLM spends minutes starting: its roofline would have no model to measure against."""
    scheme, _, path = engine.partition(":")
    if scheme.strip().lower() != "vllm" or not (Path(path).expanduser() / "config.json").is_file():
        return  # the engine itself names a missing folder
    from perfscope.analysis.modelspec import ModelSpec

    try:
        ModelSpec.from_hf_config(Path(path).expanduser())
    except UsageError as exc:
        raise UsageError(
            f"vllm engine: perfscope cannot model {path}: {exc} (the roofline needs the "
            "model's shape)"
        ) from exc


def _serve_distributed(
    opts: RunOptions,
    eopts: EngineOptions,
    specs: list[Any],
    recorder: Recorder,
    clock: MonotonicClock,
    result_out: list[Any],
    contention: ContentionMeter,
) -> Any:
    """The run's requests served from Ray actors (``--ray``) instead of this process."""
    from dataclasses import asdict

    from perfscope.profiler.distributed import parse_ray_target, plan_for, run_distributed

    def serving(pids: set[int]) -> None:
        # Contention from when the actors serve, perfscope's own processes left out.
        contention.restart()
        contention.add_own(pids)

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
        autoscale_max=opts.ray_autoscale,
        result_out=result_out,
        on_serving=serving,
    )


def _check_ray_engine(engine: str) -> None:
    """``--ray`` serves per-request engines only: refuse the others before anything runs."""
    if engine.split(":", 1)[0] not in ("openai", "python"):
        raise UsageError(
            "--ray spreads per-request engines (openai:, python:) over load actors; "
            f"{engine!r} batches in one process: drop --ray for it"
        )


def _start_cluster_telemetry(
    opts: RunOptions, tcfg: TelemetryConfig, clock: MonotonicClock
) -> tuple[Any, bool]:
    """``--ray``: connect to the cluster first and start one telemetry agent per node.
    Returns the session and whether this call started Ray (then the run shuts it down)."""
    from perfscope.profiler.cluster_telemetry import ClusterTelemetry
    from perfscope.profiler.distributed import connect, disconnect, parse_ray_target

    started = connect(parse_ray_target(opts.ray))
    try:
        import ray

        return ClusterTelemetry(ray, tcfg, clock.origin_perf_counter_ns).start(), started
    except BaseException:
        if started:
            disconnect()
        raise


def _release_ray(started: bool) -> None:
    if started:
        from perfscope.profiler.distributed import disconnect

        disconnect()


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
    if opts.ray is not None:
        _check_ray_engine(opts.engine)
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
    _check_local_model(opts.engine)
    engine = engine_factory(opts.engine, eopts)
    info = engine.info()
    # A server's model (openai:) is known from its config: --engine-opt hf_config=PATH.
    hf_config = info.config.get("hf_config") or eopts.extra.get("hf_config")
    if info.model is None and hf_config:
        info.model = _model_from_hf_config(
            str(hf_config),
            info.dtype,
            mla_absorbed=bool(info.config.get("mla_absorbed", True)),
        )
    spec_cfg = info.config.get("speculative")
    if isinstance(spec_cfg, dict) and spec_cfg.get("draft_hf_config"):
        # hf: assisted generation: the draft's passes are costed with its own config.
        spec_cfg["draft_model"] = _model_from_hf_config(
            str(spec_cfg["draft_hf_config"]), info.dtype
        )
    clock = MonotonicClock()
    telemetry: TelemetrySession | ClusterTelemetry | None = None
    ray_started = False
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
            if opts.ray is not None:
                telemetry, ray_started = _start_cluster_telemetry(opts, tcfg, clock)
            else:
                telemetry = start_telemetry(clock, tcfg)
    except BaseException:
        engine.close()
        raise

    root = opts.runs_dir or default_runs_root()
    interval = FLUSH_INTERVAL_S
    try:
        manifest = Manifest(
            name=opts.name or info.kind,
            perfscope_version=__version__,
            command=redact_argv(opts.command or sys.argv),
            started_at=clock.started_at.isoformat(),
            # Raw perf_counter_ns (CLOCK_MONOTONIC) at run time 0: lets records be compared
            # with other processes' monotonic stamps (a server's log, a packet capture's clock).
            clock_origin_perf_counter_ns=clock.origin_perf_counter_ns,
            engine=info.to_dict(),  # redacted when written (RunWriter)
            workload=opts.workload.to_dict(),
            load=opts.load.to_dict(),
            slos=opts.slos,
            hw=opts.hw,
            hardware=hardware,
            telemetry=telemetry.manifest_info() if telemetry else {"enabled": False},
            nvtx=nvtx_ranges.is_enabled(),
            host=host_info(),
            request_timeout_s=eopts.request_timeout_s,
            run_set=dict(opts.run_set) if opts.run_set is not None else None,
        )
        if opts.model_spec is not None:
            given = dict(opts.model_spec)
            if manifest.engine.get("model"):
                given["note"] = "the engine reported its own model; that one is used"
            else:
                manifest.engine["model"] = given
            manifest.model_spec = given
        mwriter = RunWriter.create(root, manifest, clock.started_at, interval)
        run_dir = mwriter.path
    except BaseException:
        if telemetry is not None:
            telemetry.stop()
        _release_ray(ray_started)
        engine.close()
        raise

    recorder = Recorder(clock)
    recorder.add_finish_listener(progress.on_request_done)
    inbox = Inbox()
    driver = Driver(specs, opts.load, inbox, recorder)
    in_main = threading.current_thread() is threading.main_thread()

    def stop_capture(exc: StorageError) -> None:
        # A write failed (disk full): stop the run as Ctrl-C would, keep what is on disk.
        driver.stop()
        if in_main:
            _thread.interrupt_main()

    flusher = SegmentFlusher(
        run_dir,
        recorder,
        telemetry=_telemetry_source(telemetry),
        heartbeat=mwriter.heartbeat,
        on_error=stop_capture,
        interval_s=interval,
        request_timeout_s=eopts.request_timeout_s,
    )
    status, error = "complete", None
    storage: StorageError | None = None
    contention = ContentionMeter(exclude_ports=local_server_ports(opts.engine)).start()
    succeeded = 0
    distributed = None
    dist_out: list[Any] = []  # the Ray section, even when serving is interrupted
    # Hook: the server's own metrics, start snapshot before the first request.
    scraper, manifest.server_metrics = start_server_metrics(
        opts.server_metrics, opts.engine, clock.now_ns
    )
    with stop_signals_as_interrupt():
        flusher.start()
        progress.on_watch(recorder, sum(s.max_output_tokens for s in specs))
        progress.on_start(len(specs))
        try:
            with nvtx_ranges.run_range(manifest.run_id):
                if opts.ray is not None:
                    distributed = _serve_distributed(
                        opts, eopts, specs, recorder, clock, dist_out, contention
                    )
                else:
                    driver.start()
                    engine.serve(inbox, recorder)
                    driver.join()
            if driver.error is not None:
                raise driver.error
        except KeyboardInterrupt as exc:
            status = "interrupted"
            if isinstance(exc, Terminated):
                error = f"interrupted by {exc.signame}"
            else:
                error = "interrupted by the user (Ctrl-C)"
        except Exception as exc:
            status = "failed"
            error = redact_text(f"{type(exc).__name__}: {exc}")
        finally:
            driver.stop()
            progress.on_end()
            distributed = distributed or (dist_out[0] if dist_out else None)
            if status == "complete" and distributed is not None and distributed.partial:
                status, loss = "partial", distributed.loss
                error = (
                    f"partial: {loss.lost_actors} of {len(distributed.actors)} load actors "
                    f"lost; {loss.in_flight} request(s) in flight and {loss.never_sent} never "
                    "sent were recorded as failed"
                )
            with _sigint_deferred():
                if flusher.error is not None:
                    status, error = "failed", f"{flusher.error}; capture stopped"
                if status != "complete":
                    recorder.fail_unfinished(status)
                try:
                    engine.close()
                except Exception as exc:  # closing must not lose the run
                    manifest.errors.append(redact_text(f"engine close failed: {exc}"))
                tele_table = telemetry.stop() if telemetry is not None else None
                storage = flusher.close()
                succeeded, no_success = _no_success_error(recorder)
                if no_success is not None and status == "complete":
                    status, error = "failed", no_success
                sm_table = None
                if scraper is not None:
                    sm_table = scraper.stop()
                    manifest.server_metrics = {
                        **(manifest.server_metrics or {}),
                        **scraper.manifest_info(),
                    }
                if storage is None:
                    storage = mwriter.compact(
                        {
                            "requests": recorder.requests_table(),
                            "chunks": recorder.chunks_table(),
                            "steps": recorder.steps_table(),
                            "telemetry": tele_table,
                            "server_metrics": sm_table,
                            "actors": distributed.actors_table() if distributed else None,
                        }
                    )
                manifest.host["contention"] = contention.stop()
                if error:
                    manifest.errors.append(error)
                if distributed is not None:
                    manifest.distributed = distributed.to_dict()
                    manifest.errors.extend(distributed.errors)
                    manifest.warnings.extend(distributed.warnings)
                if isinstance(telemetry, ClusterTelemetry):
                    manifest.errors.extend(telemetry.errors)
                _release_ray(ray_started)
                manifest.warnings.extend(
                    f"{n} {text}" for text, n in sorted(recorder.warnings.items())
                )
                if telemetry is not None:
                    manifest.telemetry = telemetry.manifest_info()
                written = mwriter.finish(status)
                storage = storage or written
    if storage is not None:
        raise StorageError(
            f"{storage}; the run stopped and what was flushed is kept in {run_dir}",
            path=storage.path,
            errno=storage.errno,
        )
    with _sigint_deferred():
        stored = mwriter.stored()  # the one read: analysis and the caller's report share it
        summary = analyze_stored(stored, database=database)
    return RunOutcome(
        path=run_dir,
        status=status,
        summary=summary,
        error=error,
        succeeded=succeeded,
        stored=stored,  # analyze_stored set its summary
    )


def _telemetry_source(
    telemetry: TelemetrySession | ClusterTelemetry | None,
) -> Callable[[int], Any] | None:
    """What the segment flusher reads new samples from: a local session by time, the
    cluster's agents by arrival (nodes report at their own pace)."""
    if telemetry is None:
        return None
    if isinstance(telemetry, ClusterTelemetry):
        cluster = telemetry
        return lambda _after_t: cluster.take_new()
    return telemetry.snapshot
