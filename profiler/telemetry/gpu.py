"""NVIDIA GPU sampling through NVML: device matching, field probing, per-sample reads.

Each field is probed once when the sampler opens. A field that answers NotSupported or
NoPermission is recorded as unsupported (with the reason) and never called again; a field that
starts failing mid-run is counted and, after ``_MAX_CONSECUTIVE_FAILURES`` failures in a row,
disabled the same way. Units on the wire are NVML's (mW, mJ, bytes, %, MHz, °C); rows are SI
(W, J, bytes).

Power comes from ``NVML_FI_DEV_POWER_INSTANT`` where the driver supports it, else from
``nvmlDeviceGetPowerUsage``, which on Ampere (except GA100) and newer is a 1 s average
(cuda-bindings ``device_get_power_usage``); the method used is recorded per device.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfscope.errors import NVMLError, UsageError
from perfscope.profiler.telemetry.nvml import (
    UNSUPPORTED_ERRORS,
    NVMLGpuLostError,
    NvmlLibrary,
    NVMLNotSupportedError,
    call,
    pynvml_module,
)

__all__ = [
    "THROTTLE_REASONS",
    "GpuSampler",
    "GpuTarget",
    "resolve_gpus",
]

_MAX_CONSECUTIVE_FAILURES = 5

# NVML clock-event reasons (nvmlClocksEventReason*). GpuIdle, ApplicationsClocksSetting,
# SyncBoost and DisplayClockSetting are not throttling; the others lower clocks below what
# the workload asked for.
THROTTLE_REASONS: dict[str, int] = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}

# Field ids / constants (nvidia-ml-py 13.615.71); read from pynvml when present.
_FI_POWER_INSTANT = 186
_POWER_SCOPE_GPU = 0
_MEMORY_V2 = 0x02000028
_CLOCK_SM = 1
_CLOCK_MEM = 2
_TEMPERATURE_GPU = 0
_ARCH_VOLTA = 5
_ARCH_AMPERE = 7
_ARCH_HOPPER = 9
_ARCH_NAMES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}
_GPM_METRICS: dict[str, int] = {
    "sm_util_pct": 2,
    "sm_occupancy_pct": 3,
    "tensor_util_pct": 5,
    "dram_bw_util_pct": 10,
}


def _const(name: str, default: int) -> int:
    try:
        return int(getattr(pynvml_module(), name, default))
    except NVMLError:
        return default


@dataclass
class GpuTarget:
    """One GPU to sample: its perfscope name, NVML handle and how it was matched."""

    name: str
    cuda_index: int | None
    nvml_index: int
    handle: Any
    uuid: str
    pci_bus_id: str
    matched_by: str


def _norm_uuid(u: str) -> str:
    u = u.strip().lower()
    return u if u.startswith(("gpu-", "mig-")) else f"gpu-{u}"


def _parse_bus_id(bus: str) -> tuple[int, int, int] | None:
    """``"00000000:3B:00.0"`` → (domain, bus, device); None when unparsable."""
    try:
        head, _, _func = bus.strip().partition(".")
        parts = head.split(":")
        if len(parts) == 3:
            return int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
        if len(parts) == 2:
            return 0, int(parts[0], 16), int(parts[1], 16)
    except ValueError:
        return None
    return None


@dataclass
class _NvmlDev:
    index: int
    handle: Any
    uuid: str
    bus: str


def _cuda_identities() -> list[tuple[int, str | None, tuple[int, int, int] | None]] | None:
    """(cuda index, uuid, pci) for every CUDA device this process sees, via torch.

    Returns None when torch or a CUDA runtime is not in use in this process.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        out: list[tuple[int, str | None, tuple[int, int, int] | None]] = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            uuid = getattr(props, "uuid", None)
            pci: tuple[int, int, int] | None = None
            if hasattr(props, "pci_bus_id"):
                pci = (
                    int(getattr(props, "pci_domain_id", 0)),
                    int(props.pci_bus_id),
                    int(getattr(props, "pci_device_id", 0)),
                )
            out.append((i, _norm_uuid(str(uuid)) if uuid is not None else None, pci))
        return out
    except Exception:
        return None


def resolve_gpus(
    lib: NvmlLibrary, requested: list[int] | None, *, use_cuda_runtime: bool
) -> tuple[list[GpuTarget], list[str]]:
    """Match the GPUs this process uses (CUDA order) to NVML handles by UUID / PCI bus id.

    Args:
        lib: an initialised NVML library.
        requested: CUDA device indices to sample (``--gpus 0,1``); None = all visible.
        use_cuda_runtime: ask torch for the CUDA devices' UUID/PCI ids (local CUDA engines).
            Otherwise the visible set follows ``CUDA_VISIBLE_DEVICES`` over NVML devices in
            PCI bus order (CUDA's ``PCI_BUS_ID`` order), without initialising CUDA here.

    Returns:
        The targets and human-readable notes about the matching.
    """
    notes: list[str] = []
    devs: list[_NvmlDev] = []
    for i in range(lib.device_count()):
        h = lib.handle(i)
        try:
            uuid = lib.text(call("nvmlDeviceGetUUID", h)).strip()
        except NVMLError:
            uuid = ""
        try:
            bus = lib.text(call("nvmlDeviceGetPciInfo", h).busId)
        except NVMLError:
            bus = ""
        devs.append(_NvmlDev(i, h, uuid, bus))
    by_uuid = {_norm_uuid(d.uuid): d for d in devs if d.uuid}
    by_pci = {p: d for d in devs if (p := _parse_bus_id(d.bus)) is not None}

    visible: list[tuple[int | None, _NvmlDev, str]] = []
    cuda = _cuda_identities() if use_cuda_runtime else None
    if cuda is not None:
        for idx, cuda_uuid, pci in cuda:
            if cuda_uuid is not None and cuda_uuid in by_uuid:
                visible.append((idx, by_uuid[cuda_uuid], "uuid"))
            elif pci is not None and pci in by_pci:
                visible.append((idx, by_pci[pci], "pci_bus_id"))
            else:
                notes.append(
                    f"CUDA device {idx} matched no NVML device (uuid {cuda_uuid}, pci {pci})"
                )
    else:
        ordered = sorted(devs, key=lambda d: _parse_bus_id(d.bus) or (1 << 30, d.index, 0))
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd is None:
            visible = [(i, d, "pci_bus_order") for i, d in enumerate(ordered)]
        else:
            for pos, tok in enumerate(t.strip() for t in cvd.split(",")):
                if not tok:
                    break
                if tok.lower().startswith("mig-"):
                    notes.append(f"CUDA_VISIBLE_DEVICES entry {tok} is a MIG instance: skipped")
                    continue
                if tok.isdigit():
                    k = int(tok)
                    if k >= len(ordered):
                        break  # CUDA stops at the first invalid entry
                    visible.append((pos, ordered[k], "pci_bus_order"))
                    continue
                match = [d for d in devs if _norm_uuid(d.uuid).startswith(_norm_uuid(tok))]
                if len(match) != 1:
                    break
                visible.append((pos, match[0], "uuid"))
        if visible:
            notes.append(
                "GPUs matched to CUDA indices by PCI bus order and CUDA_VISIBLE_DEVICES "
                "(no CUDA runtime in this process to ask for UUIDs)"
            )

    if requested is not None:
        avail = {idx: (d, how) for idx, d, how in visible if idx is not None}
        chosen: list[tuple[int | None, _NvmlDev, str]] = []
        for r in requested:
            if r not in avail:
                names = ", ".join(f"gpu{i}" for i in sorted(avail)) or "none"
                raise UsageError(
                    f"--gpus {','.join(map(str, requested))}: GPU {r} is not visible to this "
                    f"process (visible: {names}); give CUDA device indices as seen by the engine"
                )
            d, how = avail[r]
            chosen.append((r, d, how))
        visible = chosen

    targets = [
        GpuTarget(
            name=f"gpu{idx if idx is not None else d.index}",
            cuda_index=idx,
            nvml_index=d.index,
            handle=d.handle,
            uuid=d.uuid,
            pci_bus_id=d.bus,
            matched_by=how,
        )
        for idx, d, how in visible
    ]
    return targets, notes


@dataclass
class _Field:
    """One per-sample NVML read, filling one or more columns."""

    name: str
    columns: tuple[str, ...]
    read: Callable[[], tuple[float | None, ...]]
    failures: int = 0
    errors: int = 0
    enabled: bool = True


@dataclass
class GpuSampler:
    """Samples one GPU. Create with :meth:`open`; call :meth:`sample` from the sampler thread."""

    target: GpuTarget
    fields: list[_Field] = field(default_factory=list)
    supported: dict[str, str] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)
    static: dict[str, Any] = field(default_factory=dict)
    power_method: str | None = None
    lost: str | None = None
    zero_power_readings: int = 0
    _energy_last_mj: int | None = None
    _energy_acc_mj: int = 0
    counter_resets: int = 0
    _gpm_samples: list[Any] = field(default_factory=list)
    _gpm_ready: bool = False

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, target: GpuTarget, *, gpm: bool = True) -> GpuSampler:
        """Read the static facts of ``target`` and probe every per-sample field once."""
        s = cls(target=target)
        s._read_static()
        s._probe_power()
        s._probe_energy()
        s._probe_memory()
        s._probe_simple(
            "utilization",
            ("util_pct", "mem_util_pct"),
            lambda: s._utilization(),
        )
        h = target.handle
        sm, mem = _const("NVML_CLOCK_SM", _CLOCK_SM), _const("NVML_CLOCK_MEM", _CLOCK_MEM)
        s._probe_simple(
            "sm_clock", ("sm_clock_mhz",), lambda: (float(call("nvmlDeviceGetClockInfo", h, sm)),)
        )
        s._probe_simple(
            "mem_clock",
            ("mem_clock_mhz",),
            lambda: (float(call("nvmlDeviceGetClockInfo", h, mem)),),
        )
        s._probe_temperature()
        s._probe_throttle()
        if gpm:
            s._probe_gpm()
        else:
            s.unsupported["gpm"] = "disabled"
        return s

    def _record_unsupported(self, name: str, exc: BaseException) -> None:
        self.unsupported[name] = str(exc)

    def _probe(
        self, name: str, columns: tuple[str, ...], read: Callable[[], Any], how: str
    ) -> bool:
        try:
            read()
        except UNSUPPORTED_ERRORS as exc:
            self._record_unsupported(name, exc)
            return False
        except NVMLError as exc:
            # e.g. "System is not in ready state" (a generic NVMLError) on some H100 PCIe.
            self._record_unsupported(name, exc)
            return False
        self.fields.append(_Field(name, columns, read))
        self.supported[name] = how
        return True

    def _probe_simple(
        self, name: str, columns: tuple[str, ...], read: Callable[[], tuple[float | None, ...]]
    ) -> None:
        self._probe(name, columns, read, "yes")

    def _read_static(self) -> None:
        h = self.target.handle
        st = self.static
        st["name"] = self.target.name
        st["cuda_index"] = self.target.cuda_index
        st["nvml_index"] = self.target.nvml_index
        st["uuid"] = self.target.uuid
        st["pci_bus_id"] = self.target.pci_bus_id
        st["matched_by"] = self.target.matched_by

        def get(key: str, fn: Callable[[], Any]) -> None:
            try:
                st[key] = fn()
            except NVMLError as exc:
                st[key] = None
                self.unsupported[f"static:{key}"] = str(exc)

        get("device_name", lambda: NvmlLibrary.text(call("nvmlDeviceGetName", h)))
        get("architecture_id", lambda: int(call("nvmlDeviceGetArchitecture", h)))
        arch = st.get("architecture_id")
        st["architecture"] = _ARCH_NAMES.get(arch, "unknown") if isinstance(arch, int) else None
        get("power_limit_w", lambda: call("nvmlDeviceGetEnforcedPowerLimit", h) / 1000.0)
        get(
            "power_management_limit_w",
            lambda: call("nvmlDeviceGetPowerManagementLimit", h) / 1000.0,
        )
        get(
            "default_power_limit_w",
            lambda: call("nvmlDeviceGetPowerManagementDefaultLimit", h) / 1000.0,
        )
        sm, mem = _const("NVML_CLOCK_SM", _CLOCK_SM), _const("NVML_CLOCK_MEM", _CLOCK_MEM)
        get("max_sm_clock_mhz", lambda: float(call("nvmlDeviceGetMaxClockInfo", h, sm)))
        get("max_mem_clock_mhz", lambda: float(call("nvmlDeviceGetMaxClockInfo", h, mem)))
        get("mem_total_bytes", lambda: float(self._memory_info().total))
        try:
            current, _pending = call("nvmlDeviceGetMigMode", h)
            st["mig_enabled"] = bool(current)
        except NVMLError:
            st["mig_enabled"] = None
        if st.get("mig_enabled"):
            st["mig_note"] = "MIG is on: power and energy are for the whole board, not a slice"

    def _probe_power(self) -> None:
        h = self.target.handle
        fid = _const("NVML_FI_DEV_POWER_INSTANT", _FI_POWER_INSTANT)
        scope = _const("NVML_POWER_SCOPE_GPU", _POWER_SCOPE_GPU)
        success = _const("NVML_SUCCESS", 0)

        def instant() -> tuple[float | None]:
            v = call("nvmlDeviceGetFieldValues", h, [(fid, scope)])[0]
            if int(v.nvmlReturn) != success:
                raise NVMLNotSupportedError(
                    f"NVML_FI_DEV_POWER_INSTANT returned code {int(v.nvmlReturn)}",
                    code=int(v.nvmlReturn),
                )
            return (self._power(float(v.value.uiVal)),)

        def usage() -> tuple[float | None]:
            return (self._power(float(call("nvmlDeviceGetPowerUsage", h))),)

        if self._probe("power", ("power_w",), instant, "NVML_FI_DEV_POWER_INSTANT"):
            self.power_method = "instant"
            return
        instant_reason = self.unsupported.pop("power", "")
        if self._probe("power", ("power_w",), usage, "nvmlDeviceGetPowerUsage"):
            arch = self.static.get("architecture_id")
            averaged = isinstance(arch, int) and arch >= _ARCH_AMPERE
            self.power_method = "power_usage_1s_average" if averaged else "power_usage"
            self.supported["power"] = (
                "nvmlDeviceGetPowerUsage"
                + (" (1 s average on Ampere and newer, except GA100)" if averaged else "")
                + f"; instant field unsupported: {instant_reason}"
            )
        else:
            self.unsupported["power"] = (
                f"instant field: {instant_reason}; nvmlDeviceGetPowerUsage: "
                f"{self.unsupported.get('power', '')}"
            )

    def _power(self, mw: float) -> float | None:
        # Polled too fast, NVML can answer 0 mW (zeus power.py); a real GPU never draws 0 W.
        if mw <= 0:
            self.zero_power_readings += 1
            return None
        return mw / 1000.0

    def _probe_energy(self) -> None:
        h = self.target.handle

        def read() -> tuple[float | None]:
            raw = int(call("nvmlDeviceGetTotalEnergyConsumption", h))
            last = self._energy_last_mj
            if last is not None:
                delta = raw - last
                if delta < 0:
                    # The counter went back: the driver reloaded and restarted it from 0.
                    self.counter_resets += 1
                    delta = raw
                self._energy_acc_mj += delta
            self._energy_last_mj = raw
            return (self._energy_acc_mj / 1000.0,)

        self._probe("energy", ("energy_j",), read, "nvmlDeviceGetTotalEnergyConsumption")
        # The probe's read is the zero point: energy_j counts from the sampler's start.
        self._energy_acc_mj = 0

    def _memory_info(self) -> Any:
        h = self.target.handle
        try:
            return call("nvmlDeviceGetMemoryInfo", h, version=_const("nvmlMemory_v2", _MEMORY_V2))
        except UNSUPPORTED_ERRORS:
            return call("nvmlDeviceGetMemoryInfo", h)

    def _probe_memory(self) -> None:
        h = self.target.handle
        v2 = _const("nvmlMemory_v2", _MEMORY_V2)

        def read_v2() -> tuple[float | None]:
            return (float(call("nvmlDeviceGetMemoryInfo", h, version=v2).used),)

        def read_v1() -> tuple[float | None]:
            return (float(call("nvmlDeviceGetMemoryInfo", h).used),)

        if self._probe("memory", ("mem_used_bytes",), read_v2, "nvmlDeviceGetMemoryInfo v2"):
            return
        v2_reason = self.unsupported.pop("memory", "")
        if self._probe("memory", ("mem_used_bytes",), read_v1, "nvmlDeviceGetMemoryInfo v1"):
            self.supported["memory"] += f" (v2 unsupported: {v2_reason}; used includes reserved)"

    def _utilization(self) -> tuple[float | None, float | None]:
        u = call("nvmlDeviceGetUtilizationRates", self.target.handle)
        return float(u.gpu), float(u.memory)

    def _probe_temperature(self) -> None:
        h = self.target.handle
        sensor = _const("NVML_TEMPERATURE_GPU", _TEMPERATURE_GPU)

        def read_v() -> tuple[float | None]:
            return (float(call("nvmlDeviceGetTemperatureV", h, sensor)),)

        def read_old() -> tuple[float | None]:
            return (float(call("nvmlDeviceGetTemperature", h, sensor)),)

        if self._probe("temperature", ("temp_c",), read_v, "nvmlDeviceGetTemperatureV"):
            return
        reason = self.unsupported.pop("temperature", "")
        if not self._probe("temperature", ("temp_c",), read_old, "nvmlDeviceGetTemperature"):
            self.unsupported["temperature"] = f"{reason}; {self.unsupported['temperature']}"

    def _probe_throttle(self) -> None:
        h = self.target.handle

        def read_new() -> tuple[float | None]:
            return (float(call("nvmlDeviceGetCurrentClocksEventReasons", h)),)

        def read_old() -> tuple[float | None]:
            return (float(call("nvmlDeviceGetCurrentClocksThrottleReasons", h)),)

        if self._probe(
            "throttle", ("throttle",), read_new, "nvmlDeviceGetCurrentClocksEventReasons"
        ):
            return
        reason = self.unsupported.pop("throttle", "")
        if not self._probe(
            "throttle", ("throttle",), read_old, "nvmlDeviceGetCurrentClocksThrottleReasons"
        ):
            self.unsupported["throttle"] = f"{reason}; {self.unsupported['throttle']}"

    # -- GPM (Hopper and newer) ----------------------------------------------------------------

    def _probe_gpm(self) -> None:
        h = self.target.handle
        arch = self.static.get("architecture_id")
        if isinstance(arch, int) and arch < _ARCH_HOPPER:
            self.unsupported["gpm"] = (
                f"GPM needs Hopper or newer (this GPU: {self.static.get('architecture')})"
            )
            return
        try:
            support = call("nvmlGpmQueryDeviceSupport", h)
            if not int(support.isSupportedDevice):
                self.unsupported["gpm"] = "nvmlGpmQueryDeviceSupport: device not supported"
                return
            self._gpm_samples = [call("nvmlGpmSampleAlloc"), call("nvmlGpmSampleAlloc")]
            call("nvmlGpmSampleGet", h, self._gpm_samples[0])
            self._gpm_ready = True
        except NVMLError as exc:
            self.unsupported["gpm"] = str(exc)
            self.close()
            return
        columns = tuple(_GPM_METRICS)
        self.fields.append(_Field("gpm", columns, self._read_gpm))
        self.supported["gpm"] = "nvmlGpmMetricsGet (" + ", ".join(columns) + ")"

    def _read_gpm(self) -> tuple[float | None, ...]:
        nv = pynvml_module()
        h = self.target.handle
        prev, cur = self._gpm_samples
        call("nvmlGpmSampleGet", h, cur)
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = _const("NVML_GPM_METRICS_GET_VERSION", 1)
        mg.numMetrics = len(_GPM_METRICS)
        mg.sample1 = prev
        mg.sample2 = cur
        for i, metric_id in enumerate(_GPM_METRICS.values()):
            mg.metrics[i].metricId = metric_id
        call("nvmlGpmMetricsGet", mg)
        self._gpm_samples = [cur, prev]
        success = _const("NVML_SUCCESS", 0)
        out: list[float | None] = []
        for i in range(len(_GPM_METRICS)):
            m = mg.metrics[i]
            out.append(float(m.value) if int(m.nvmlReturn) == success else None)
        return tuple(out)

    def close(self) -> None:
        """Free GPM samples (safe to call twice)."""
        samples, self._gpm_samples = self._gpm_samples, []
        self._gpm_ready = False
        for s in samples:
            with contextlib.suppress(NVMLError):
                call("nvmlGpmSampleFree", s)

    # -- sampling ----------------------------------------------------------------------------

    def sample(self, row: np.ndarray, col_index: Callable[[str], int]) -> None:
        """Fill ``row`` (NaN = null) with one reading of every supported field."""
        if self.lost is not None:
            return
        for f in self.fields:
            if not f.enabled:
                continue
            try:
                values = f.read()
            except NVMLGpuLostError as exc:
                self.lost = str(exc)
                return
            except NVMLError as exc:
                f.errors += 1
                f.failures += 1
                if f.failures >= _MAX_CONSECUTIVE_FAILURES:
                    f.enabled = False
                    self.supported.pop(f.name, None)
                    self.unsupported[f.name] = (
                        f"stopped after {f.failures} consecutive failures: {exc}"
                    )
                continue
            f.failures = 0
            for col, v in zip(f.columns, values, strict=True):
                if v is not None:
                    row[col_index(col)] = v

    def info(self) -> dict[str, Any]:
        """JSON-ready description for the manifest."""
        d: dict[str, Any] = dict(self.static)
        d["power_method"] = self.power_method
        d["energy_counter"] = "energy" in self.supported
        d["supported"] = dict(self.supported)
        d["unsupported"] = dict(self.unsupported)
        errors = {f.name: f.errors for f in self.fields if f.errors}
        if errors:
            d["read_errors"] = errors
        if self.zero_power_readings:
            d["zero_power_readings_dropped"] = self.zero_power_readings
        if self.counter_resets:
            d["energy_counter_resets"] = self.counter_resets
        if self.lost:
            d["lost"] = self.lost
        return d
