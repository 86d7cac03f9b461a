"""The telemetry session: one background thread sampling every device on the run's clock."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from perfscope.errors import NVMLError, UsageError
from perfscope.profiler.clock import Clock
from perfscope.profiler.telemetry.buffer import SampleBuffer
from perfscope.profiler.telemetry.cpu import (
    DEFAULT_POWERCAP_ROOT,
    CpuSampler,
    TorchCudaMemory,
)
from perfscope.profiler.telemetry.gpu import GpuSampler, resolve_gpus
from perfscope.profiler.telemetry.nvml import (
    NVMLDriverNotLoadedError,
    NvmlLibrary,
    NVMLLibraryNotFoundError,
)

__all__ = [
    "MIN_INTERVAL_S",
    "TelemetryConfig",
    "TelemetrySession",
    "parse_gpus",
    "start_telemetry",
]

#: The fastest sampling interval perfscope accepts. The fastest NVIDIA power sensors update
#: every ~20 ms (V100, P100); A100/H100 every ~100 ms with a ~25 ms window (Yang et al.,
#: GPU_Power_Benchmark). Polling faster only repeats values, and NVML then sporadically answers
#: NotSupported or 0 W (zeus power.py).
MIN_INTERVAL_S = 0.02


@dataclass
class TelemetryConfig:
    """What to sample and how often.

    Attributes:
        interval_s: seconds between samples (``--telemetry-interval``; ≥ ``MIN_INTERVAL_S``).
        gpus: CUDA device indices to sample (``--gpus 0,1``); None = every visible GPU.
        enabled: False turns every sampler off (the session then records nothing).
        baseline_s: seconds of idle sampling before the run, for the idle baseline power
            (0 = none). Skipped when no device has a power sensor.
        cuda_memory: also sample PyTorch's CUDA allocator (local CUDA engines); also lets the
            sampler ask the CUDA runtime for device UUIDs to match GPUs exactly.
        gpm: sample NVML GPM counters (Hopper and newer) when supported.
        cpu: sample the host (process RSS, CPU use, system memory, RAPL).
        max_rows: bound on buffered rows; beyond it the buffer keeps every second round and
            the interval doubles.
        powercap_root: where RAPL zones live (tests point it at a fake sysfs tree).
        node: the cluster node this session samples, written into every row's ``node``
            column (a ``--ray`` run's telemetry agents); None on a single-host run.
    """

    interval_s: float = 0.05
    gpus: list[int] | None = None
    enabled: bool = True
    baseline_s: float = 1.0
    cuda_memory: bool = False
    gpm: bool = True
    cpu: bool = True
    max_rows: int = 1_000_000
    powercap_root: Path = field(default_factory=lambda: DEFAULT_POWERCAP_ROOT)
    node: str | None = None

    def validate(self) -> None:
        """Raise :class:`UsageError` for settings that cannot give meaningful samples."""
        if self.interval_s < MIN_INTERVAL_S:
            raise UsageError(
                f"--telemetry-interval {self.interval_s * 1000:g} ms is below "
                f"{MIN_INTERVAL_S * 1000:g} ms, the fastest update period of NVIDIA power "
                "sensors (V100/P100 ~20 ms; A100/H100 ~100 ms): faster polling only repeats "
                "values and makes NVML answer NotSupported or 0 W. Use 0.02 s or more "
                "(default 0.05 s)."
            )
        if self.baseline_s < 0:
            raise UsageError("the idle baseline duration cannot be negative")
        if self.gpus is not None and any(g < 0 for g in self.gpus):
            raise UsageError("--gpus takes CUDA device indices ≥ 0, e.g. --gpus 0,1")


def parse_gpus(text: str | None) -> list[int] | None:
    """Parse ``--gpus`` (``"0,1"``; empty or ``"all"`` = every visible GPU)."""
    if text is None or text.strip().lower() in ("", "all"):
        return None
    out: list[int] = []
    for tok in text.split(","):
        tok = tok.strip()
        if not tok.isdigit():
            raise UsageError(
                f"--gpus {text!r}: expected comma-separated CUDA device indices such as 0,1"
            )
        out.append(int(tok))
    if len(set(out)) != len(out):
        raise UsageError(f"--gpus {text!r}: a GPU is listed twice")
    return out


class TelemetrySession:
    """Samples GPUs (NVML) and the host in a background thread on the run's clock.

    Start with :func:`start_telemetry`. Samples go to a bounded in-memory buffer; :meth:`stop`
    returns them as a ``TELEMETRY_SCHEMA`` table (the run store writes ``telemetry.parquet``),
    :meth:`snapshot` returns what is buffered so far (to flush on interrupt).
    """

    def __init__(self, clock: Clock, config: TelemetryConfig) -> None:
        self.clock = clock
        self.config = config
        self._buffer = SampleBuffer(config.max_rows, node=config.node)
        self._col = self._buffer.column_index
        self._interval_s = config.interval_s
        self._nvml: NvmlLibrary | None = None
        self._gpus: list[GpuSampler] = []
        self._gpu_reason: str | None = None
        self._gpu_notes: list[str] = []
        self._cpu: CpuSampler | None = None
        self._torch_mem: TorchCudaMemory | None = None
        self._thread: threading.Thread | None = None
        self._stop_evt = threading.Event()
        self._sample_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._result: pa.Table | None = None
        self._rounds = 0
        self._cost_ns_total = 0
        self._cost_ns_max = 0
        self._cpu_ns_total = 0
        self._t_first: int | None = None
        self._t_last: int | None = None
        self._errors: list[str] = []
        self._error_count = 0
        self._baseline: dict[str, Any] = {}
        self._status = "not started"

    # -- lifecycle ---------------------------------------------------------------------------

    def _open(self) -> None:
        cfg = self.config
        if not cfg.enabled:
            self._gpu_reason = "telemetry disabled"
            return
        self._open_gpus()
        if cfg.cpu:
            self._cpu = CpuSampler.open(cfg.powercap_root)
        if cfg.cuda_memory:
            tm = TorchCudaMemory()
            self._torch_mem = tm if tm.usable else None

    def _open_gpus(self) -> None:
        lib = NvmlLibrary()
        try:
            lib.init()
        except NVMLLibraryNotFoundError:
            self._gpu_reason = "NVML library not found (no NVIDIA driver on this machine)"
            return
        except NVMLDriverNotLoadedError:
            self._gpu_reason = "the NVIDIA kernel driver is not loaded"
            return
        except NVMLError as exc:
            self._gpu_reason = f"nvmlInit failed: {exc}"
            return
        self._nvml = lib
        try:
            targets, notes = resolve_gpus(
                lib, self.config.gpus, use_cuda_runtime=self.config.cuda_memory
            )
        except UsageError:
            lib.shutdown()
            self._nvml = None
            raise
        except NVMLError as exc:
            self._gpu_reason = f"listing GPUs failed: {exc}"
            return
        self._gpu_notes.extend(notes)
        if not targets:
            self._gpu_reason = "no NVIDIA GPU is visible to this process"
            return
        for t in targets:
            try:
                self._gpus.append(GpuSampler.open(t, gpm=self.config.gpm))
            except NVMLError as exc:
                self._gpu_notes.append(f"{t.name}: could not open ({exc})")
        if not self._gpus:
            self._gpu_reason = "no GPU could be opened: " + "; ".join(self._gpu_notes)

    def _start(self, background: bool) -> None:
        try:
            self._open()
            self._status = "running"
            if not self.config.enabled:
                return
            self.sample_once()
            if self.config.baseline_s > 0:
                self._take_baseline()
            if background:
                self._thread = threading.Thread(
                    target=self._run, name="perfscope-telemetry", daemon=True
                )
                self._thread.start()
        except BaseException:
            self.stop()
            raise

    def _run(self) -> None:
        next_t = time.perf_counter() + self._interval_s
        while not self._stop_evt.is_set():
            delay = next_t - time.perf_counter()
            if delay > 0 and self._stop_evt.wait(delay):
                break
            try:
                self.sample_once()
            except Exception as exc:  # keep sampling; never take the engine down
                self._error_count += 1
                if len(self._errors) < 5:
                    self._errors.append(f"{type(exc).__name__}: {exc}")
            next_t += self._interval_s
            now = time.perf_counter()
            if next_t < now:  # fell behind (e.g. a slow NVML call): skip, do not burst
                next_t = now + self._interval_s

    def stop(self) -> pa.Table:
        """Stop sampling, take a last sample, release NVML and return every sample.

        Safe to call twice (returns the same table) and after a KeyboardInterrupt.
        """
        with self._state_lock:
            if self._result is not None:
                return self._result
            self._stop_evt.set()
            if self._thread is not None:
                self._thread.join(timeout=max(2.0, 5 * self._interval_s))
            # A last sample so the run's end is covered (unless one was just taken).
            if self._status == "running" and self.clock.now_ns() != self._t_last:
                try:
                    self.sample_once()
                except Exception as exc:
                    self._errors.append(f"final sample: {type(exc).__name__}: {exc}")
            for g in self._gpus:
                g.close()
            if self._nvml is not None:
                self._nvml.shutdown()
            self._result = self._buffer.to_table()
            self._status = "stopped"
            return self._result

    def snapshot(self, after_t: int | None = None) -> pa.Table:
        """Everything buffered so far (TELEMETRY_SCHEMA), without stopping; with
        ``after_t`` (ns since the run's start) only the samples taken after it."""
        return self._buffer.to_table(after_t)

    @property
    def running(self) -> bool:
        """True while the session is sampling."""
        return self._status == "running"

    # -- sampling ----------------------------------------------------------------------------

    def sample_once(self) -> None:
        """Take one sample of every device now (the thread calls this every interval).

        Each row's ``t`` is the midpoint of that device's reads on the run clock.
        """
        with self._sample_lock:
            c0 = time.perf_counter_ns()
            cpu0 = time.thread_time_ns()
            buf, col, clock = self._buffer, self._col, self.clock
            rows: list[tuple[int, str, np.ndarray]] = []
            for g in self._gpus:
                if g.lost is not None:
                    continue
                row = buf.empty_row()
                t0 = clock.now_ns()
                g.sample(row, col)
                if self._torch_mem is not None and g.target.cuda_index is not None:
                    self._torch_mem.sample(g.target.cuda_index, row, col)
                t1 = clock.now_ns()
                if g.lost is None:
                    rows.append(((t0 + t1) // 2, g.target.name, row))
            if self._cpu is not None:
                row = buf.empty_row()
                t0 = clock.now_ns()
                self._cpu.sample(t0, row, col)
                t1 = clock.now_ns()
                rows.append(((t0 + t1) // 2, "cpu", row))
            if not rows:
                return
            if buf.append_round(rows):
                self._interval_s *= 2
            self._rounds += 1
            t = rows[0][0]
            if self._t_first is None:
                self._t_first = t
            self._t_last = t
            self._cpu_ns_total += time.thread_time_ns() - cpu0
            cost = time.perf_counter_ns() - c0
            self._cost_ns_total += cost
            self._cost_ns_max = max(self._cost_ns_max, cost)

    def _has_power_sensor(self) -> bool:
        gpu_power = any("power" in g.supported or "energy" in g.supported for g in self._gpus)
        return gpu_power or (self._cpu is not None and self._cpu.rapl.available)

    def _take_baseline(self) -> None:
        if not self._has_power_sensor():
            self._baseline = {"skipped": "no device has a power sensor"}
            return
        clock = self.clock
        interval_ns = int(self._interval_s * 1e9)
        t0 = clock.now_ns()
        end = t0 + int(self.config.baseline_s * 1e9)
        while clock.now_ns() < end:
            clock.sleep_until_ns(min(end, clock.now_ns() + interval_ns))
            self.sample_once()
        t1 = clock.now_ns()
        table = self._buffer.to_table()
        per_device: dict[str, dict[str, Any]] = {}
        devices = table.column("device").to_pylist()
        ts = np.asarray(table.column("t").to_numpy(zero_copy_only=False))
        energy = table.column("energy_j").to_numpy(zero_copy_only=False)
        power = table.column("power_w").to_numpy(zero_copy_only=False)
        for dev in dict.fromkeys(devices):
            m = np.array([d == dev for d in devices])
            e, p, tt = energy[m], power[m], ts[m]
            ok_e = ~np.isnan(e)
            if ok_e.sum() >= 2 and tt[ok_e][-1] > tt[ok_e][0]:
                te, ee = tt[ok_e], e[ok_e]
                w = (ee[-1] - ee[0]) / ((te[-1] - te[0]) / 1e9)
                per_device[dev] = {"power_w": float(w), "method": "counter"}
            elif (~np.isnan(p)).any():
                per_device[dev] = {
                    "power_w": float(np.nanmean(p)),
                    "method": "mean_power",
                }
        self._baseline = {
            "window_ns": [int(t0), int(t1)],
            "window_s": (t1 - t0) / 1e9,
            "per_device": per_device,
        }

    # -- description -------------------------------------------------------------------------

    def devices(self) -> list[str]:
        """Names of the sampled devices (``gpu0`` …, ``cpu``)."""
        names = [g.target.name for g in self._gpus]
        if self._cpu is not None:
            names.append("cpu")
        return names

    def manifest_info(self) -> dict[str, Any]:
        """JSON-ready facts about this session for the run manifest."""
        gpu_devices = {g.target.name: g.info() for g in self._gpus}
        gpu: dict[str, Any] = {
            "available": bool(self._gpus),
            "reason": self._gpu_reason,
            "devices": gpu_devices,
            "notes": list(self._gpu_notes),
        }
        if self._nvml is not None:
            gpu["driver_version"] = self._nvml.driver_version
            gpu["nvml_version"] = self._nvml.nvml_version
        elapsed = (
            (self._t_last - self._t_first) if self._t_first is not None and self._t_last else 0
        )
        info: dict[str, Any] = {
            "enabled": self.config.enabled,
            "status": self._status,
            "clock": "run-relative ns, same clock as the token events",
            "interval_s": self.config.interval_s,
            "effective_interval_s": self._interval_s,
            "devices": self.devices(),
            "gpu": gpu,
            "power_method": {n: d.get("power_method") for n, d in gpu_devices.items()},
            "energy_counter": {n: d.get("energy_counter") for n, d in gpu_devices.items()},
            "power_limits_w": {n: d.get("power_limit_w") for n, d in gpu_devices.items()},
            "default_power_limits_w": {
                n: d.get("default_power_limit_w") for n, d in gpu_devices.items()
            },
            "max_clocks_mhz": {
                n: {"sm": d.get("max_sm_clock_mhz"), "mem": d.get("max_mem_clock_mhz")}
                for n, d in gpu_devices.items()
            },
            "mem_total_bytes": {n: d.get("mem_total_bytes") for n, d in gpu_devices.items()},
            "torch_cuda_memory": self._torch_mem is not None,
            "rounds": self._rounds,
            "rows": len(self._buffer),
            "decimations": self._buffer.decimations,
            # wall_*: time inside a sampling round, including waits for the GIL and the driver;
            # cpu_*: CPU time the sampler itself used (its real cost to the host).
            "sampler_cost": {
                "wall_mean_us": (self._cost_ns_total / self._rounds / 1e3)
                if self._rounds
                else None,
                "wall_max_us": self._cost_ns_max / 1e3 if self._rounds else None,
                "cpu_mean_us": (self._cpu_ns_total / self._rounds / 1e3) if self._rounds else None,
                "cpu_share_of_one_core_pct": (
                    (100.0 * self._cpu_ns_total / elapsed) if elapsed > 0 else None
                ),
            },
        }
        if not self._gpus:
            info["gpu_unavailable"] = f"gpu telemetry unavailable: {self._gpu_reason}"
        if self._cpu is not None:
            cpu_info = self._cpu.info()
            info["cpu"] = cpu_info
            info["mem_total_bytes"]["cpu"] = cpu_info["mem_total_bytes"]
            if not self._cpu.rapl.available:
                info["cpu_energy_unavailable"] = f"cpu energy unavailable: {self._cpu.rapl.reason}"
        baseline = self._baseline
        info["idle_baseline"] = baseline
        info["idle_baseline_w"] = {
            dev: d["power_w"] for dev, d in baseline.get("per_device", {}).items()
        }
        if self._error_count:
            info["sampler_errors"] = {"count": self._error_count, "first": self._errors}
        return info


def start_telemetry(
    clock: Clock, config: TelemetryConfig, *, background: bool = True
) -> TelemetrySession:
    """Open every sampler, take the idle baseline, and start the sampling thread.

    Args:
        clock: the run's clock; every sample's ``t`` is ``clock.now_ns()``.
        config: what to sample; validated here (:class:`UsageError` on bad settings).
        background: False leaves the thread off so a caller (tests) drives
            :meth:`TelemetrySession.sample_once` itself.

    NVML being absent is not an error: GPU telemetry is then reported as unavailable with the
    reason (``manifest_info()["gpu_unavailable"]``) and the CPU sampler still runs.
    """
    config.validate()
    session = TelemetrySession(clock, config)
    session._start(background)
    return session
