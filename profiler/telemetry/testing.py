"""A scripted fake of NVML at the ``pynvml`` binding layer, for tests without a GPU.

Like zeus's tests, this replaces the functions of the real ``pynvml`` module (nvidia-ml-py), so
the code under test runs unchanged down to the binding call. Values are functions of the run
clock, so a test can script power, the energy counter, memory and unsupported fields and know
the exact truth the samplers should report.

::

    fake = FakeNvml([FakeGpu(power_w=lambda t: 300.0)], clock.now_ns)
    fake.install(monkeypatch)
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Protocol

__all__ = ["FakeGpu", "FakeNvml", "PowerSchedule"]


class _Patcher(Protocol):
    def setattr(self, target: Any, name: str, value: Any) -> None: ...


@dataclass
class PowerSchedule:
    """Piecewise-constant power: ``steps`` = [(t_start_ns, watts), ...] sorted by time.

    ``energy_mj(t)`` is its exact integral from time 0 (the fake's counter), ``power_w(t)`` the
    power at ``t``. Before the first step the power is ``steps[0]``'s.
    """

    steps: list[tuple[int, float]]
    offset_mj: int = 123_456_789  # the counter counts since the driver loaded, not from 0

    def power_w(self, t_ns: int) -> float:
        w = self.steps[0][1]
        for start, watts in self.steps:
            if t_ns >= start:
                w = watts
        return w

    def energy_j(self, t_ns: int) -> float:
        """Exact energy from time 0 to ``t_ns`` (J)."""
        total = 0.0
        for i, (start, watts) in enumerate(self.steps):
            end = self.steps[i + 1][0] if i + 1 < len(self.steps) else None
            a = max(start, 0) if i else 0
            b = t_ns if end is None else min(end, t_ns)
            if b > a:
                total += watts * (b - a) / 1e9
        return total

    def energy_mj(self, t_ns: int) -> int:
        return self.offset_mj + round(self.energy_j(t_ns) * 1000)


def _const(v: float) -> Callable[[int], float]:
    return lambda _t: v


@dataclass
class FakeGpu:
    """One scripted GPU. Callables take the run time in ns.

    ``unsupported`` names what answers NVML_ERROR_NOT_SUPPORTED: pynvml function names (e.g.
    ``"nvmlDeviceGetTotalEnergyConsumption"``) or ``"power_instant"`` (the field value),
    ``"memory_v2"``, ``"gpm"``. ``fail_after`` maps a function name to a call count after which
    it starts raising NVML_ERROR_UNKNOWN (a field that breaks mid-run).
    """

    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:0B:00.0"
    architecture: int = 9  # Hopper
    power_w: Callable[[int], float] = field(default_factory=lambda: _const(100.0))
    energy_mj: Callable[[int], int] | None = None
    mem_used_bytes: Callable[[int], float] = field(default_factory=lambda: _const(20e9))
    mem_total_bytes: float = 141e9
    util_gpu: Callable[[int], float] = field(default_factory=lambda: _const(50.0))
    util_mem: Callable[[int], float] = field(default_factory=lambda: _const(30.0))
    sm_clock_mhz: Callable[[int], float] = field(default_factory=lambda: _const(1980.0))
    mem_clock_mhz: Callable[[int], float] = field(default_factory=lambda: _const(3201.0))
    temp_c: Callable[[int], float] = field(default_factory=lambda: _const(45.0))
    throttle: Callable[[int], int] = field(default_factory=lambda: lambda _t: 0)
    gpm: dict[int, Callable[[int], float]] = field(default_factory=dict)
    power_limit_mw: int = 700_000
    default_power_limit_mw: int = 700_000
    max_sm_clock_mhz: int = 1980
    max_mem_clock_mhz: int = 3201
    mig_enabled: bool = False
    unsupported: set[str] = field(default_factory=set)
    fail_after: dict[str, int] = field(default_factory=dict)
    lost_after_s: float | None = None


class FakeNvml:
    """Installs scripted GPUs into the ``pynvml`` module.

    Attributes:
        calls: how many times each pynvml function was called.
        init_calls / shutdown_calls: ``nvmlInit`` / ``nvmlShutdown`` counts.
    """

    def __init__(self, gpus: list[FakeGpu], now_ns: Callable[[], int]) -> None:
        import pynvml

        self.nv = pynvml
        self.gpus = gpus
        self.now_ns = now_ns
        self.calls: collections.Counter[str] = collections.Counter()
        self.init_calls = 0
        self.shutdown_calls = 0
        self._gpm_last_t: dict[int, int] = {}

    # -- helpers -----------------------------------------------------------------------------

    def _err(self, code: int) -> Exception:
        return self.nv.NVMLError(code)  # type: ignore[no-any-return]

    def _check(self, gpu: FakeGpu, fn: str) -> None:
        self.calls[fn] += 1
        if fn in gpu.unsupported:
            raise self._err(self.nv.NVML_ERROR_NOT_SUPPORTED)
        limit = gpu.fail_after.get(fn)
        if limit is not None and self.calls[fn] > limit:
            raise self._err(self.nv.NVML_ERROR_UNKNOWN)
        if gpu.lost_after_s is not None and self.now_ns() >= gpu.lost_after_s * 1e9:
            raise self._err(self.nv.NVML_ERROR_GPU_IS_LOST)

    # -- the fake functions --------------------------------------------------------------------

    def install(self, patcher: _Patcher) -> None:
        """Replace the NVML functions on ``pynvml`` (use pytest's ``monkeypatch``)."""
        nv = self.nv
        fake = self

        def init(*_a: Any) -> None:
            fake.init_calls += 1

        def shutdown() -> None:
            fake.shutdown_calls += 1

        def count() -> int:
            return len(fake.gpus)

        def handle(i: int) -> FakeGpu:
            if not 0 <= i < len(fake.gpus):
                raise fake._err(nv.NVML_ERROR_INVALID_ARGUMENT)
            return fake.gpus[i]

        def simple(fn: str, getter: Callable[[FakeGpu], Any]) -> Callable[..., Any]:
            def f(h: FakeGpu, *args: Any, **kwargs: Any) -> Any:
                fake._check(h, fn)
                return getter(h)

            return f

        def clock_info(fn: str, cur: bool) -> Callable[..., float]:
            def f(h: FakeGpu, kind: int) -> float:
                fake._check(h, fn)
                t = fake.now_ns()
                if kind == nv.NVML_CLOCK_SM:
                    return h.sm_clock_mhz(t) if cur else h.max_sm_clock_mhz
                return h.mem_clock_mhz(t) if cur else h.max_mem_clock_mhz

            return f

        def memory_info(h: FakeGpu, version: int | None = None) -> SimpleNamespace:
            fake._check(h, "nvmlDeviceGetMemoryInfo")
            if version and "memory_v2" in h.unsupported:
                raise fake._err(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
            used = h.mem_used_bytes(fake.now_ns())
            return SimpleNamespace(
                total=int(h.mem_total_bytes),
                reserved=0,
                used=int(used),
                free=int(h.mem_total_bytes - used),
            )

        def field_values(h: FakeGpu, ids: list[Any]) -> list[SimpleNamespace]:
            fake._check(h, "nvmlDeviceGetFieldValues")
            out = []
            for fid in ids:
                fid_num = fid[0] if isinstance(fid, tuple) else fid
                ok = (
                    fid_num == nv.NVML_FI_DEV_POWER_INSTANT and "power_instant" not in h.unsupported
                )
                mw = round(h.power_w(fake.now_ns()) * 1000) if ok else 0
                out.append(
                    SimpleNamespace(
                        fieldId=fid_num,
                        nvmlReturn=nv.NVML_SUCCESS if ok else nv.NVML_ERROR_NOT_SUPPORTED,
                        value=SimpleNamespace(uiVal=mw),
                        timestamp=0,
                        latencyUsec=0,
                    )
                )
            return out

        def power_usage(h: FakeGpu) -> int:
            fake._check(h, "nvmlDeviceGetPowerUsage")
            return round(h.power_w(fake.now_ns()) * 1000)

        def energy(h: FakeGpu) -> int:
            fake._check(h, "nvmlDeviceGetTotalEnergyConsumption")
            if h.energy_mj is None:
                raise fake._err(nv.NVML_ERROR_NOT_SUPPORTED)
            return int(h.energy_mj(fake.now_ns()))

        def utilization(h: FakeGpu) -> SimpleNamespace:
            fake._check(h, "nvmlDeviceGetUtilizationRates")
            t = fake.now_ns()
            return SimpleNamespace(gpu=int(h.util_gpu(t)), memory=int(h.util_mem(t)))

        def temperature(fn: str) -> Callable[..., int]:
            def f(h: FakeGpu, sensor: int) -> int:
                fake._check(h, fn)
                return int(h.temp_c(fake.now_ns()))

            return f

        def throttle(fn: str) -> Callable[..., int]:
            def f(h: FakeGpu) -> int:
                fake._check(h, fn)
                return int(h.throttle(fake.now_ns()))

            return f

        def gpm_support(h: FakeGpu) -> SimpleNamespace:
            fake._check(h, "nvmlGpmQueryDeviceSupport")
            return SimpleNamespace(version=1, isSupportedDevice=0 if "gpm" in h.unsupported else 1)

        def gpm_alloc() -> Any:
            fake.calls["nvmlGpmSampleAlloc"] += 1
            return nv.c_nvmlGpmSample_t()

        def gpm_free(_s: Any) -> None:
            fake.calls["nvmlGpmSampleFree"] += 1

        def gpm_sample_get(h: FakeGpu, s: Any) -> Any:
            fake._check(h, "nvmlGpmSampleGet")
            fake._gpm_last_t[id(h)] = fake.now_ns()
            return s

        def gpm_metrics_get(mg: Any) -> Any:
            # The fake cannot tell which GPU the opaque samples belong to; GPM values are
            # scripted per GPU but evaluated at the latest sample time of any GPU.
            fake.calls["nvmlGpmMetricsGet"] += 1
            t = max(fake._gpm_last_t.values(), default=fake.now_ns())
            scripts: dict[int, Callable[[int], float]] = {}
            for g in fake.gpus:
                scripts.update(g.gpm)
            for i in range(mg.numMetrics):
                m = mg.metrics[i]
                fn = scripts.get(int(m.metricId))
                if fn is None:
                    m.nvmlReturn = nv.NVML_ERROR_NOT_SUPPORTED
                else:
                    m.nvmlReturn = nv.NVML_SUCCESS
                    m.value = float(fn(t))
            return mg

        def mig_mode(h: FakeGpu) -> list[int]:
            fake._check(h, "nvmlDeviceGetMigMode")
            return [int(h.mig_enabled), int(h.mig_enabled)]

        funcs: dict[str, Callable[..., Any]] = {
            "nvmlInit": init,
            "nvmlInitWithFlags": init,
            "nvmlShutdown": shutdown,
            "nvmlSystemGetDriverVersion": lambda: "999.99",
            "nvmlSystemGetNVMLVersion": lambda: "13.999.99",
            "nvmlDeviceGetCount": count,
            "nvmlDeviceGetHandleByIndex": handle,
            "nvmlDeviceGetUUID": simple("nvmlDeviceGetUUID", lambda h: h.uuid),
            "nvmlDeviceGetPciInfo": simple(
                "nvmlDeviceGetPciInfo", lambda h: SimpleNamespace(busId=h.bus_id)
            ),
            "nvmlDeviceGetName": simple("nvmlDeviceGetName", lambda h: h.name),
            "nvmlDeviceGetArchitecture": simple(
                "nvmlDeviceGetArchitecture", lambda h: h.architecture
            ),
            "nvmlDeviceGetEnforcedPowerLimit": simple(
                "nvmlDeviceGetEnforcedPowerLimit", lambda h: h.power_limit_mw
            ),
            "nvmlDeviceGetPowerManagementLimit": simple(
                "nvmlDeviceGetPowerManagementLimit", lambda h: h.power_limit_mw
            ),
            "nvmlDeviceGetPowerManagementDefaultLimit": simple(
                "nvmlDeviceGetPowerManagementDefaultLimit", lambda h: h.default_power_limit_mw
            ),
            "nvmlDeviceGetMaxClockInfo": clock_info("nvmlDeviceGetMaxClockInfo", cur=False),
            "nvmlDeviceGetClockInfo": clock_info("nvmlDeviceGetClockInfo", cur=True),
            "nvmlDeviceGetMemoryInfo": memory_info,
            "nvmlDeviceGetMigMode": mig_mode,
            "nvmlDeviceGetFieldValues": field_values,
            "nvmlDeviceGetPowerUsage": power_usage,
            "nvmlDeviceGetTotalEnergyConsumption": energy,
            "nvmlDeviceGetUtilizationRates": utilization,
            "nvmlDeviceGetTemperatureV": temperature("nvmlDeviceGetTemperatureV"),
            "nvmlDeviceGetTemperature": temperature("nvmlDeviceGetTemperature"),
            "nvmlDeviceGetCurrentClocksEventReasons": throttle(
                "nvmlDeviceGetCurrentClocksEventReasons"
            ),
            "nvmlDeviceGetCurrentClocksThrottleReasons": throttle(
                "nvmlDeviceGetCurrentClocksThrottleReasons"
            ),
            "nvmlGpmQueryDeviceSupport": gpm_support,
            "nvmlGpmSampleAlloc": gpm_alloc,
            "nvmlGpmSampleFree": gpm_free,
            "nvmlGpmSampleGet": gpm_sample_get,
            "nvmlGpmMetricsGet": gpm_metrics_get,
        }
        for name, fn in funcs.items():
            patcher.setattr(nv, name, fn)
