"""The in-memory record of one device's ceilings, in SI base units.

This is the contract between the hardware database (which loads TOML files written in
datasheet units) and the analysis (roofline, MFU/MBU, what-if). Everything here is SI:
FLOP/s, bytes, bytes/s, watts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

__all__ = ["DTYPES", "CeilingSource", "DeviceSpec", "normalize_dtype"]

#: dtype names used as keys of :attr:`DeviceSpec.peak_flops` (dense peaks only).
DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")

#: ``datasheet``: vendor figures; ``calibrated``: measured on this machine;
#: ``estimate``: derived by us (e.g. clocks x units) where no datasheet figure exists.
CeilingSource = Literal["datasheet", "calibrated", "estimate"]


@dataclass(frozen=True)
class DeviceSpec:
    """Ceilings and facts about one accelerator or CPU.

    Attributes:
        key: stable lowercase identifier, e.g. ``"h100-sxm5-80gb"``.
        name: display name, e.g. ``"NVIDIA H100 SXM5 80GB"``.
        vendor: ``"nvidia"``, ``"amd"``, ``"google"``, ``"intel"``, ``"apple"``, ...
        kind: ``"gpu" | "tpu" | "npu" | "cpu" | "soc"``.
        peak_flops: dense peak throughput per dtype in FLOP/s (or OP/s for int dtypes).
            Sparse figures are never stored here.
        mem_bytes: device memory capacity in bytes (``None`` when not applicable).
        mem_bw_bytes_s: peak DRAM/HBM bandwidth in bytes/s.
        cache_bytes: last-level on-chip cache/SRAM size in bytes (L2 on NVIDIA GPUs, LLC on CPUs).
        cache_bw_bytes_s: bandwidth of that cache level in bytes/s, when published or measured.
        tdp_w: board/package power limit in watts.
        mem_usable_bytes: memory the device really exposes to software (``nvidia-smi``
            ``memory.total``, e.g. 81559 MiB on an "80 GB" H100), when known; ``mem_bytes``
            stays the datasheet figure.
        interconnect_bytes_s: total bidirectional bandwidth per device of each scale-up or
            host link (``nvlink``, ``infinity_fabric``, ``ici``, ``pcie``), bytes/s.
        collective_latency_s: latency of one small collective (all-reduce) per link, s.
        collective_wait_s: measured wait for the slowest rank at each synchronising
            collective per link, s (``<link>_wait`` in the file; absent: not measured).
        kernel_launch_s: host cost of launching one kernel on the device (driver and runtime
            calls, without the kernel's own run time), s; ``None`` when the file gives none.
        source: where the ceilings come from (see :data:`CeilingSource`).
        aliases: other names and exact NVML/driver strings that resolve to this device.
        extra: every other field of the TOML file, already converted to SI, for display.
    """

    key: str
    name: str
    vendor: str
    kind: str
    peak_flops: dict[str, float]
    mem_bw_bytes_s: float
    mem_bytes: float | None = None
    cache_bytes: float | None = None
    cache_bw_bytes_s: float | None = None
    tdp_w: float | None = None
    mem_usable_bytes: float | None = None
    interconnect_bytes_s: dict[str, float] = field(default_factory=dict)
    collective_latency_s: dict[str, float] = field(default_factory=dict)
    collective_wait_s: dict[str, float] = field(default_factory=dict)
    kernel_launch_s: float | None = None
    source: CeilingSource = "datasheet"
    aliases: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (SI units), as stored in a run's manifest."""
        d = asdict(self)
        d["aliases"] = list(self.aliases)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceSpec:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        kw["aliases"] = tuple(kw.get("aliases", ()))
        kw["peak_flops"] = {str(k): float(v) for k, v in (kw.get("peak_flops") or {}).items()}
        for name in ("interconnect_bytes_s", "collective_latency_s", "collective_wait_s"):
            kw[name] = {str(k): float(v) for k, v in (kw.get(name) or {}).items()}
        return cls(**kw)

    def peak_flops_for(self, dtype: str) -> float | None:
        """Dense peak FLOP/s for ``dtype`` (``"bf16"``, ``"float32"``, ...), or ``None``.

        torch-style names (``float32``, ``bfloat16``, ``float16``) are accepted. ``fp32``
        falls back to nothing else: a missing figure stays missing rather than borrowed.
        """
        return self.peak_flops.get(normalize_dtype(dtype))

    def scale_up_link(self, name: str | None = None) -> tuple[str, float] | None:
        """The link tensor parallelism would use: ``(name, bytes/s per direction)``.

        ``name`` picks one (``nvlink``, ``pcie``, ...); otherwise the fastest scale-up link
        (NVLink, Infinity Fabric, ICI), else PCIe. Files give bidirectional totals, so the
        per-direction figure is half. ``None`` when the device lists no such link.
        """
        links = self.interconnect_bytes_s
        if name is not None:
            bw = links.get(name)
            return (name, bw / 2) if bw else None
        scale_up = {k: v for k, v in links.items() if k != "pcie"}
        pick = max(scale_up.items(), key=lambda kv: kv[1]) if scale_up else None
        if pick is None and links.get("pcie"):
            pick = ("pcie", links["pcie"])
        return (pick[0], pick[1] / 2) if pick else None

    def ridge_point(self, dtype: str) -> float | None:
        """FLOP per byte at which compute and DRAM bandwidth ceilings meet."""
        peak = self.peak_flops_for(dtype)
        if peak is None or self.mem_bw_bytes_s <= 0:
            return None
        return peak / self.mem_bw_bytes_s


#: Spellings of dtypes (torch, numpy, Hugging Face configs, quantisation shorthands) → the
#: short keys of :data:`DTYPES` and of the analysis' bytes-per-element table.
_DTYPE_ALIASES = {
    "float64": "fp64",
    "double": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "tensorfloat32": "tf32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2": "fp8",
    "float8_e5m2fnuz": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "w8": "int8",
    "w4": "int4",
    "nf4": "int4",
    # Hugging Face ``torch_dtype: auto``: checkpoints saying so are in practice bf16.
    "auto": "bf16",
}


def normalize_dtype(dtype: str) -> str:
    """Map torch/numpy/HF dtype spellings (``torch.bfloat16``, ``float16``, ``fp8_e4m3``) to
    the short keys of :data:`DTYPES` (``bf16``, ``fp16``, ``fp8``); unknown names pass through
    lowercased. The one dtype normalisation of perfscope: the analysis uses it too."""
    d = dtype.strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(d, d)
