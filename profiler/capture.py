"""Capture as a stage: a plan, an engine and the resolved hardware in, a stored run out.

Two callers share it (docs/architecture.md, Capture): ``perfscope run`` (and sweeps, studies,
``--repeat``) calls :func:`plan_capture` then :func:`capture`, which drives the workload
through the engine; the manual API (``perfscope.profile()``) records by hand and uses
:class:`RunCapture`, the run's lifecycle on disk, directly. Either way the result is a
:class:`CapturedRun` that carries the run as stored, read back once, for analysis and the
report alike.

Durability: records stream into segment files during the run (a background flusher, every
:data:`FLUSH_INTERVAL_S`), the manifest carries the writer's pid, host and a heartbeat,
SIGTERM/SIGHUP stop the run as Ctrl-C does (:mod:`perfscope.profiler.signals`), and a failed
write (disk full) stops capture, keeps what was flushed and raises one
:class:`~perfscope.errors.StorageError`. At the end every table is compacted into Parquet
through the store's :class:`~perfscope.profiler.store.RunWriter` (its table list and schema
checks) and the segments removed.
"""

from __future__ import annotations

import _thread
import dataclasses
import os
import platform
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.errors import StorageError, UsageError
from perfscope.profiler import nvtx_ranges
from perfscope.profiler.clock import Clock, MonotonicClock
from perfscope.profiler.cluster_telemetry import ClusterTelemetry
from perfscope.profiler.contention import ContentionMeter, local_server_ports
from perfscope.profiler.driver import Driver, LoadConfig
from perfscope.profiler.engines.base import Engine, EngineInfo, EngineOptions, Inbox
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import Manifest, RequestSpec
from perfscope.profiler.redact import redact_argv, redact_text
from perfscope.profiler.segments import DEFAULT_FLUSH_INTERVAL_S, SegmentFlusher
from perfscope.profiler.server_metrics import ServerMetricsConfig, start_server_metrics
from perfscope.profiler.signals import Terminated, stop_signals_as_interrupt, stop_signals_deferred
from perfscope.profiler.store import RunWriter, StoredRun, default_runs_root
from perfscope.profiler.telemetry import TelemetryConfig, TelemetrySession, start_telemetry
from perfscope.profiler.workload import WorkloadConfig, build_workload, with_fresh_salt

if TYPE_CHECKING:
    import pyarrow as pa

    from perfscope.profiler.distributed import DistributedResult

__all__ = [
    "FLUSH_INTERVAL_S",
    "CapturePlan",
    "CapturedRun",
    "ProgressHook",
    "RunCapture",
    "RunOptions",
    "capture",
    "host_info",
    "plan_capture",
    "ray_resources",
    "run_manifest",
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
        ray_resources: with ``ray``, what each load actor asks Ray for (``{"loadgen": 1}``:
            only on nodes started with that resource); empty = zero CPUs, any node.
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
    ray_resources: dict[str, float] = field(default_factory=dict)
    server_metrics: ServerMetricsConfig = field(default_factory=ServerMetricsConfig)
    run_set: dict[str, Any] | None = None
    model_spec: dict[str, Any] | None = None


@dataclass(frozen=True)
class CapturePlan:
    """What :func:`capture` runs, checked and sized (:func:`plan_capture`).

    Attributes:
        options: the run options, with this run's prompt salt.
        specs: the requests to send, warmup first.
        engine_options: the options the engine is created with: its context sized to the
            longest request (prompt plus output tokens), the prompt salt in ``extra``.
        perfscope_version: written into the manifest.
    """

    options: RunOptions
    specs: list[RequestSpec]
    engine_options: EngineOptions
    perfscope_version: str | None = None

    @property
    def total_output_tokens(self) -> int:
        """The most output tokens the workload asks for (all requests together)."""
        return sum(s.max_output_tokens for s in self.specs)


@dataclass(frozen=True)
class CapturedRun:
    """A captured run, stored: where it went, how it ended, the run as read back once.

    Attributes:
        path: the run directory.
        status: ``complete``, ``interrupted``, ``failed`` or ``partial``.
        stored: the run as the store reads it (no summary yet: analysis follows).
        manifest: the final manifest as written.
        error: why the run is not complete (``None`` when it is).
        succeeded: measured requests that finished without an error.
    """

    path: Path
    status: str
    stored: StoredRun
    manifest: Manifest
    error: str | None = None
    succeeded: int = 0


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


def run_manifest(
    name: str,
    clock: Clock,
    *,
    perfscope_version: str | None,
    command: Sequence[str] | None = None,
) -> Manifest:
    """The part of a new run's manifest every capture writes: who (name, version, the
    command line with secrets redacted), when (start time; the raw ``perf_counter_ns`` at
    run time 0, when the clock is monotonic) and where (:func:`host_info`). The caller sets
    the rest (engine, workload, load, ...)."""
    return Manifest(
        name=name,
        perfscope_version=perfscope_version,
        command=redact_argv(list(command or sys.argv)),
        started_at=clock.started_at.isoformat(),
        # Raw perf_counter_ns (CLOCK_MONOTONIC) at run time 0: lets records be compared
        # with other processes' monotonic stamps (a server's log, a packet capture's clock).
        clock_origin_perf_counter_ns=getattr(clock, "origin_perf_counter_ns", None),
        host=host_info(),
    )


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


class RunCapture:
    """One run being captured, on disk: the lifecycle both callers share.

    :meth:`begin` creates the run directory with its ``running`` manifest (the store's
    :class:`~perfscope.profiler.store.RunWriter`) and the segment flusher (records copied
    into segment files every :data:`FLUSH_INTERVAL_S`, each flush refreshing the manifest's
    heartbeat); :meth:`start` starts flushing; :meth:`end` stops it, compacts every table
    through the writer, writes the final manifest and reads the run back once.

    Attributes:
        path: the run directory.
        manifest: the run's manifest (capture fills it in as the run goes).
        recorder: where the run's records accumulate.
    """

    def __init__(self, writer: RunWriter, recorder: Recorder, flusher: SegmentFlusher) -> None:
        self._writer = writer
        self._flusher = flusher
        self.recorder = recorder

    @classmethod
    def begin(
        cls,
        root: Path,
        manifest: Manifest,
        recorder: Recorder,
        *,
        started_at: datetime,
        telemetry: Callable[[int], pa.Table] | None = None,
        on_error: Callable[[StorageError], None] | None = None,
        request_timeout_s: float | None = None,
        interval_s: float = FLUSH_INTERVAL_S,
    ) -> RunCapture:
        """A new run directory under ``root`` (named after ``manifest.name`` and
        ``started_at``) with its ``running`` manifest; flushing starts with :meth:`start`.

        Args:
            telemetry: where the flusher reads new telemetry samples from (ns after).
            on_error: called once, from the flusher's thread, when a write fails.
            request_timeout_s: requests open longer than this (s) after being sent fail.
            interval_s: seconds between flushes (and heartbeats).

        Raises:
            StorageError: the directory or the manifest cannot be written.
        """
        writer = RunWriter.create(root, manifest, started_at, interval_s)
        flusher = SegmentFlusher(
            writer.path,
            recorder,
            telemetry=telemetry,
            heartbeat=writer.heartbeat,
            on_error=on_error,
            interval_s=interval_s,
            request_timeout_s=request_timeout_s,
        )
        return cls(writer, recorder, flusher)

    @property
    def path(self) -> Path:
        return self._writer.path

    @property
    def manifest(self) -> Manifest:
        return self._writer.manifest

    @property
    def flush_error(self) -> StorageError | None:
        """The write error that stopped flushing, if one did."""
        return self._flusher.error

    def start(self) -> RunCapture:
        """Start flushing segments (and the heartbeat)."""
        self._flusher.start()
        return self

    def end(
        self,
        status: str,
        error: str | None = None,
        *,
        tables: Mapping[str, pa.Table | None] | None = None,
        annotate: Callable[[Manifest], None] | None = None,
        require_success: bool = False,
    ) -> CapturedRun:
        """Finish the run on disk and read it back once.

        In order: unfinished requests fail with ``status``; flushing stops (the last
        segment written, no heartbeat after it); the recorder's tables and ``tables`` (the
        store's other tables by name, ``None`` skips one) are compacted into Parquet, unless
        a segment write failed (then the run is ``failed`` and the segments are its data);
        ``error``, then ``annotate(manifest)``'s additions, then the recorder's warnings go
        into the manifest, which is written with the final status.

        Args:
            require_success: a run whose measured requests all failed (or that sent none)
                ends ``failed`` with a sentence saying so (``perfscope run``).

        Raises:
            StorageError: a write failed; what was flushed is kept in the run directory.
        """
        recorder = self.recorder
        if status != "complete":
            recorder.fail_unfinished(status)
        storage = self._flusher.close()
        succeeded, no_success = _no_success_error(recorder)
        if storage is not None:
            status, error = "failed", f"{storage}; capture stopped"
        else:
            storage = self._writer.compact(
                {
                    "requests": recorder.requests_table(),
                    "chunks": recorder.chunks_table(),
                    "steps": recorder.steps_table(),
                    **(tables or {}),
                }
            )
        if require_success and no_success is not None and status == "complete":
            status, error = "failed", no_success
        # The flusher's thread has stopped: no heartbeat races these updates.
        m = self.manifest
        if error:
            m.errors.append(error)
        if annotate is not None:
            annotate(m)
        m.warnings.extend(f"{n} {text}" for text, n in sorted(recorder.warnings.items()))
        written = self._writer.finish(status)
        storage = storage or written
        if storage is not None:
            raise StorageError(
                f"{storage}; the run stopped and what was flushed is kept in {self.path}",
                path=storage.path,
                errno=storage.errno,
            )
        return CapturedRun(
            path=self.path,
            status=status,
            stored=self._writer.stored(),
            manifest=m,
            error=error,
            succeeded=succeeded,
        )


# --------------------------------------------------------------------------- perfscope run


def plan_capture(opts: RunOptions, *, perfscope_version: str | None = None) -> CapturePlan:
    """Check and size a run before anything starts: a new prompt salt per run (unless a
    seed asked for an exact repeat: no server can answer a rerun from its prefix cache),
    the requests built, the load checked, the engine's context sized to the longest request.

    Raises:
        UsageError: bad input (nothing has been written or started).
    """
    opts = dataclasses.replace(opts, workload=with_fresh_salt(opts.workload))
    if opts.ray is not None:
        _check_ray_engine(opts.engine)
    specs = build_workload(opts.workload)
    opts.load.validate()
    longest = max(s.prompt_tokens + s.max_output_tokens for s in specs)
    eopts = opts.engine_options
    eopts = dataclasses.replace(
        eopts,
        max_seq_len=max(eopts.max_seq_len, longest),
        longest_request_tokens=longest,
        extra={"prompt_salt": str(opts.workload.prompt_salt), **eopts.extra},
    )
    return CapturePlan(opts, specs, eopts, perfscope_version)


def _check_ray_engine(engine: str) -> None:
    """``--ray`` serves per-request engines only: refuse the others before anything runs."""
    if engine.split(":", 1)[0] not in ("openai", "python"):
        raise UsageError(
            "--ray spreads per-request engines (openai:, python:) over load actors; "
            f"{engine!r} batches in one process: drop --ray for it"
        )


def capture(
    plan: CapturePlan,
    engine: Engine,
    hardware: dict[str, Any] | None,
    *,
    info: EngineInfo | None = None,
    progress: ProgressHook | None = None,
) -> CapturedRun:
    """Run ``plan``'s workload on ``engine`` and store the run; the engine is closed when
    this returns or raises.

    Args:
        hardware: the device the run is analysed against, as resolved for the manifest
            (``{"spec": ..., "resolved_from": ...}``).
        info: the engine's info as the caller completed it (a model from its HF config);
            default ``engine.info()``.
        progress: told of the run's progress (the CLI's progress bar).

    An engine failure or Ctrl-C (SIGTERM, SIGHUP) still leaves a readable run (status
    ``failed`` / ``interrupted``) with everything captured so far.

    Raises:
        StorageError: a write failed (disk full); what was flushed is kept.
    """
    opts, eopts, specs = plan.options, plan.engine_options, plan.specs
    progress = progress or ProgressHook()
    info = info or engine.info()
    clock = MonotonicClock()
    telemetry: TelemetrySession | ClusterTelemetry | None = None
    ray_started = False
    try:
        if opts.nvtx is not None:
            nvtx_ranges.set_enabled(opts.nvtx)
        telemetry, ray_started = _start_telemetry(opts, info, clock)
    except BaseException:
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

    try:
        run = RunCapture.begin(
            opts.runs_dir or default_runs_root(),
            _manifest(plan, info, hardware, clock, telemetry),
            recorder,
            started_at=clock.started_at,
            telemetry=_telemetry_source(telemetry),
            on_error=stop_capture,
            request_timeout_s=eopts.request_timeout_s,
        )
    except BaseException:
        if telemetry is not None:
            telemetry.stop()
        _release_ray(ray_started)
        engine.close()
        raise

    manifest = run.manifest
    status, error = "complete", None
    contention = ContentionMeter(exclude_ports=local_server_ports(opts.engine)).start()
    distributed: DistributedResult | None = None
    dist_out: list[DistributedResult] = []  # the Ray section, even when serving is interrupted
    # Hook: the server's own metrics, start snapshot before the first request.
    scraper, manifest.server_metrics = start_server_metrics(
        opts.server_metrics, opts.engine, clock.now_ns
    )
    with stop_signals_as_interrupt():
        run.start()
        progress.on_watch(recorder, plan.total_output_tokens)
        progress.on_start(len(specs))
        try:
            with nvtx_ranges.run_range(manifest.run_id):
                if opts.ray is not None:
                    distributed = _serve_distributed(plan, recorder, clock, dist_out, contention)
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
            with stop_signals_deferred():
                if run.flush_error is not None:
                    status, error = "failed", f"{run.flush_error}; capture stopped"
                if status != "complete":
                    recorder.fail_unfinished(status)
                try:
                    engine.close()
                except Exception as exc:  # closing must not lose the run
                    manifest.errors.append(redact_text(f"engine close failed: {exc}"))
                tele_table = telemetry.stop() if telemetry is not None else None
                sm_table = scraper.stop() if scraper is not None else None
                served = distributed

                def annotate(m: Manifest) -> None:
                    if scraper is not None:
                        m.server_metrics = {**(m.server_metrics or {}), **scraper.manifest_info()}
                    m.host["contention"] = contention.stop()
                    if served is not None:
                        m.distributed = served.to_dict()
                        m.errors.extend(served.errors)
                        m.warnings.extend(served.warnings)
                    if isinstance(telemetry, ClusterTelemetry):
                        m.errors.extend(telemetry.errors)
                    if telemetry is not None:
                        m.telemetry = telemetry.manifest_info()
                    if isinstance(m.engine.get("config", {}).get("client"), dict):
                        # An openai: run's prompts may repeat an earlier run's: its TTFT is
                        # compared with that run's (read-only) before the summary words it.
                        from perfscope.profiler.engines.openai.repeat import note_previous_run

                        try:
                            note_previous_run(run.path, m, recorder.requests_table())
                        except Exception as exc:  # a failed comparison must not lose the run
                            m.errors.append(redact_text(f"same-prompts TTFT comparison: {exc}"))

                try:
                    captured = run.end(
                        status,
                        error,
                        tables={
                            "telemetry": tele_table,
                            "server_metrics": sm_table,
                            "actors": served.actors_table() if served else None,
                        },
                        annotate=annotate,
                        require_success=True,
                    )
                finally:
                    _release_ray(ray_started)
    return captured


def _manifest(
    plan: CapturePlan,
    info: EngineInfo,
    hardware: dict[str, Any] | None,
    clock: MonotonicClock,
    telemetry: TelemetrySession | ClusterTelemetry | None,
) -> Manifest:
    """The ``running`` manifest of a ``perfscope run``."""
    opts = plan.options
    manifest = dataclasses.replace(
        run_manifest(
            opts.name or info.kind,
            clock,
            perfscope_version=plan.perfscope_version,
            command=opts.command,
        ),
        engine=info.to_dict(),  # redacted when written (RunWriter)
        workload=opts.workload.to_dict(),
        load=opts.load.to_dict(),
        slos=opts.slos,
        hw=opts.hw,
        hardware=hardware,
        telemetry=telemetry.manifest_info() if telemetry else {"enabled": False},
        nvtx=nvtx_ranges.is_enabled(),
        request_timeout_s=plan.engine_options.request_timeout_s,
        run_set=dict(opts.run_set) if opts.run_set is not None else None,
    )
    if opts.model_spec is not None:
        given = dict(opts.model_spec)
        if manifest.engine.get("model"):
            given["note"] = "the engine reported its own model; that one is used"
        else:
            manifest.engine["model"] = given
        manifest.model_spec = given
    return manifest


def _start_telemetry(
    opts: RunOptions, info: EngineInfo, clock: MonotonicClock
) -> tuple[TelemetrySession | ClusterTelemetry | None, bool]:
    """Hardware sampling for the run, started before the first request (it samples the idle
    baseline first): this process's session, or with ``--ray`` one agent per cluster node.
    Returns the session (``None`` when off) and whether this call started Ray.

    With ``--ray`` the cluster is joined (or started) here either way, before the run folder
    exists: a cluster that cannot be reached is a one-line error, not a failed run."""
    if not opts.telemetry.enabled:
        if opts.ray is not None:
            from perfscope.profiler.distributed import connect, parse_ray_target

            return None, connect(parse_ray_target(opts.ray))
        return None, False
    tcfg = opts.telemetry
    if str(info.device or "").startswith("cuda") and not tcfg.cuda_memory:
        tcfg = dataclasses.replace(tcfg, cuda_memory=True)
    if opts.ray is not None:
        return _start_cluster_telemetry(opts, tcfg, clock)
    return start_telemetry(clock, tcfg), False


def _start_cluster_telemetry(
    opts: RunOptions, tcfg: TelemetryConfig, clock: MonotonicClock
) -> tuple[ClusterTelemetry, bool]:
    """``--ray``: connect to the cluster first and start one telemetry agent per node.
    Returns the session and whether this call started Ray (then the run shuts it down)."""
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


def _serve_distributed(
    plan: CapturePlan,
    recorder: Recorder,
    clock: MonotonicClock,
    result_out: list[DistributedResult],
    contention: ContentionMeter,
) -> DistributedResult:
    """The run's requests served from Ray actors (``--ray``) instead of this process."""
    from perfscope.profiler.distributed import parse_ray_target, plan_for, run_distributed

    def serving(pids: set[int]) -> None:
        # Contention from when the actors serve, perfscope's own processes left out.
        contention.restart()
        contention.add_own(pids)

    opts, load = plan.options, plan.options.load
    offsets = plan_for(
        plan.specs, load.mode, load.rate, load.arrival, load.burstiness, load.seed, load.duration_s
    )
    return run_distributed(
        opts.engine,
        dataclasses.asdict(plan.engine_options),
        offsets,
        recorder,
        clock.origin_perf_counter_ns,
        parse_ray_target(opts.ray),
        concurrency=load.concurrency,
        autoscale_max=opts.ray_autoscale,
        result_out=result_out,
        on_serving=serving,
        resources=opts.ray_resources,
    )


def ray_resources(value: str | Mapping[str, Any], what: str) -> dict[str, float]:
    """``--ray-resources`` read into what each load actor asks Ray for (see
    :func:`perfscope.profiler.distributed.parse_ray_resources`; UsageError when malformed)."""
    from perfscope.profiler.distributed import parse_ray_resources

    return parse_ray_resources(value, what)


def _telemetry_source(
    telemetry: TelemetrySession | ClusterTelemetry | None,
) -> Callable[[int], pa.Table] | None:
    """What the segment flusher reads new samples from: a local session by time, the
    cluster's agents by arrival (nodes report at their own pace)."""
    if telemetry is None:
        return None
    if isinstance(telemetry, ClusterTelemetry):
        cluster = telemetry
        return lambda _after_t: cluster.take_new()
    return telemetry.snapshot
