"""Storage dtypes: bytes per element, bytes per quantised weight, the matmul dtype."""

from __future__ import annotations

from perfscope.errors import UsageError
from perfscope.hwdb.spec import normalize_dtype

#: Bytes per element of each storage dtype (``int4`` packs two values per byte).
DTYPE_BYTES: dict[str, float] = {
    "fp64": 8.0,
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,
    "int3": 0.375,
    "int2": 0.25,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (``bf16`` → 2, ``int4`` → 0.5).

    Raises:
        UsageError: unknown dtype.
    """
    key = normalize_dtype(dtype)
    try:
        return DTYPE_BYTES[key]
    except KeyError:
        raise UsageError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}") from None


def weight_bytes_per_param(
    dtype: str, *, group_size: int | None = None, scale_bytes: float = 2.0
) -> float:
    """Stored bytes per weight, quantisation scales included.

    ``int4`` defaults to group-wise scales over 128 weights (GPTQ/AWQ style): one fp16
    scale per group adds ``2/128`` bytes, so 0.515625 B/param. ``int8`` defaults to
    per-channel scales, which are negligible (1.0 B/param). Pass ``group_size`` to
    override either; float dtypes ignore it.
    """
    key = normalize_dtype(dtype)
    base = dtype_bytes(key)
    if key == "int4" and group_size is None:
        group_size = 128
    if key in ("int4", "int8", "int3", "int2") and group_size:
        return base + scale_bytes / group_size
    return base


def compute_dtype_for(weight_dtype: str) -> str:
    """The matmul dtype an engine uses with weights stored as ``weight_dtype``.

    Float weights compute in their own dtype; ``fp8`` weights use fp8 matmuls (W8A8);
    int8/int4 weights are weight-only quantisation and dequantise into bf16 (W8A16, W4A16).
    """
    key = normalize_dtype(weight_dtype)
    if key in ("int8", "int4", "int3", "int2", "fp4"):
        return "bf16"
    return key
