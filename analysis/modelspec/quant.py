"""Quantised checkpoint layouts (``quantization_config``) and the dtypes a config implies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from perfscope.analysis.modelspec.dtypes import DTYPE_BYTES, compute_dtype_for
from perfscope.analysis.modelspec.hf_config import _first_of, _int_of
from perfscope.errors import UsageError
from perfscope.hwdb.spec import normalize_dtype
from perfscope.jsontypes import JsonObject, JsonValue, json_object


@dataclass(frozen=True)
class QuantLayout:
    """How a checkpoint stores its weights, as read from ``quantization_config``.

    Attributes:
        method: ``quant_method`` (``gptq``, ``awq``, ``bitsandbytes``, ``fp8``,
            ``compressed-tensors``), empty for an unquantised checkpoint.
        weight_dtype: storage dtype of the quantised matrices.
        compute_dtype: matmul dtype (``bf16`` for weight-only W4A16/W8A16, ``fp8``/``int8``
            for W8A8).
        bits: bits per quantised weight.
        group_size: weights per scale (0 = per channel / per tensor: negligible scales).
        scale_bytes_per_param: scale bytes per weight (fp16 per group: ``2/group``).
        zero_bytes_per_param: zero-point bytes per weight (asymmetric: ``bits/8/group``).
        index_bytes_per_input: bytes per input feature of each quantised linear (GPTQ
            ``g_idx``, int32).
        unquantized_bytes_per_param: width of the matrices kept in 16 bits (embedding,
            lm_head, router), from ``torch_dtype``.
        lm_head: the lm_head is quantised too (GPTQ ``"lm_head": true``).
    """

    method: str
    weight_dtype: str
    compute_dtype: str
    bits: float
    group_size: int
    scale_bytes_per_param: float
    zero_bytes_per_param: float
    index_bytes_per_input: float
    unquantized_bytes_per_param: float
    lm_head: bool = False


def _bits_dtype(bits: float, kind: str = "int") -> str:
    if kind == "float":
        return "fp8" if bits == 8 else "fp4"
    return {8: "int8", 4: "int4", 3: "int3", 2: "int2"}.get(int(bits), "int4")


def _num(value: JsonValue, what: str) -> float:
    """A number of ``quantization_config`` (a JSON number or a numeric string)."""
    if not isinstance(value, bool) and isinstance(value, int | float | str):
        try:
            return float(value)
        except ValueError:
            pass
    raise UsageError(f"quantization_config {what} is {value!r}, not a number")


def _block(value: JsonValue, what: str) -> int:
    """Weights per scale of a ``[rows, cols]`` block (0 when not given)."""
    if not value:
        return 0
    if isinstance(value, list) and len(value) >= 2:
        return int(_num(value[0], what)) * int(_num(value[1], what))
    raise UsageError(f"quantization_config {what} is {value!r}, not [rows, cols]")


def quant_layout(cfg: JsonObject) -> QuantLayout | None:
    """The storage layout of ``cfg["quantization_config"]``, or ``None`` when absent.

    Byte accounting per method (the checkpoint's tensors, as the loaders allocate them):

    - ``gptq``: packed ``bits`` per weight, fp16 ``scales`` and packed ``qzeros`` per group
      of ``group_size`` inputs (``-1`` = per channel), an int32 ``g_idx`` per input feature.
    - ``awq``: packed weights, fp16 scales and packed zeros (``zero_point``) per group.
    - ``bitsandbytes``: 4-bit NF4/FP4 in blocks of 64 with an fp32 absmax each (double
      quantisation: an 8-bit absmax plus one fp32 per 256 blocks); 8-bit LLM.int8 with an
      fp32 scale per output row (negligible, not counted).
    - ``fp8``: fp8 weights with an fp32 scale per ``weight_block_size`` block (or per tensor).
    - ``compressed-tensors``: the first config group's ``weights`` (``num_bits``, ``type``,
      ``strategy``, ``group_size``, ``symmetric``, ``actorder``); scales at the checkpoint's
      16-bit width.

    Embedding and lm_head stay 16-bit in every method (GPTQ/AWQ quantise only the blocks'
    linears, bitsandbytes skips ``lm_head``, FP8/compressed-tensors list it in ``ignore``),
    except a GPTQ config with ``"lm_head": true``, whose lm_head is quantised as the blocks.
    """
    q = json_object(cfg.get("quantization_config"))
    if q is None:
        return None
    raw = normalize_dtype(str(_first_of(cfg, "torch_dtype", "dtype", default="float16")))
    b16 = 4.0 if raw == "fp32" else 2.0
    method = str(q.get("quant_method", "")).lower().replace("_", "-")
    if method == "bitsandbytes" or q.get("load_in_4bit") or q.get("load_in_8bit"):
        if q.get("load_in_4bit") or q.get("_load_in_4bit"):
            double = bool(q.get("bnb_4bit_use_double_quant"))
            scale = 1.0 / 64 + 4.0 / (64 * 256) if double else 4.0 / 64
            return QuantLayout("bitsandbytes", "int4", "bf16", 4, 64, scale, 0.0, 0.0, b16)
        return QuantLayout("bitsandbytes", "int8", "int8", 8, 0, 0.0, 0.0, 0.0, b16)
    if method in ("gptq", "awq"):
        bits = _num(q.get("bits") or q.get("w_bit") or 4, "bits")
        group = _int_of(q, "group_size", "q_group_size", default=128)
        group = max(group, 0)  # -1 = per output channel
        scale = 2.0 / group if group else 0.0
        has_zero = method == "gptq" or bool(q.get("zero_point", True))
        zero = bits / 8 / group if group and has_zero else 0.0
        index = 4.0 if method == "gptq" else 0.0
        return QuantLayout(
            method,
            _bits_dtype(bits),
            "bf16",
            bits,
            group,
            scale,
            zero,
            index,
            b16,
            lm_head=bool(q.get("lm_head", False)),
        )
    if method in ("fp8", "fbgemm-fp8", "finegrained-fp8"):
        group = _block(q.get("weight_block_size"), "weight_block_size")
        scale = 4.0 / group if group else 0.0
        return QuantLayout("fp8", "fp8", "fp8", 8, group, scale, 0.0, 0.0, b16)
    if method == "compressed-tensors":
        groups = json_object(q.get("config_groups")) or {}
        first = json_object(next(iter(groups.values()), None)) or {}
        w = json_object(first.get("weights")) or {}
        acts = json_object(first.get("input_activations"))
        bits = _num(w.get("num_bits", 8), "weights num_bits")
        kind = str(w.get("type", "int"))
        strategy = str(w.get("strategy", "channel"))
        group = int(_num(w.get("group_size") or 0, "group_size")) if strategy == "group" else 0
        if strategy == "block" and w.get("block_structure"):
            group = _block(w["block_structure"], "block_structure")
        scale = b16 / group if group else 0.0
        zero = bits / 8 / group if group and not w.get("symmetric", True) else 0.0
        index = 4.0 if w.get("actorder") else 0.0
        wd = _bits_dtype(bits, kind)
        act_bits = int(_num(acts.get("num_bits", 16), "input_activations num_bits")) if acts else 16
        compute = wd if act_bits <= 8 else "bf16"
        return QuantLayout("compressed-tensors", wd, compute, bits, group, scale, zero, index, b16)
    raise UsageError(
        f"quantization_config quant_method {method or '(none)'!r} is not one perfscope can "
        "count (gptq, awq, bitsandbytes, fp8, compressed-tensors): give --weight-dtype to "
        "describe the weights instead"
    )


class ConfigDtypes(TypedDict, total=False):
    """The dtype fields of a :class:`~perfscope.analysis.modelspec.ModelSpec` a config implies
    (bytes per parameter or element); the ``quant_*`` ones and ``unquantized_bytes_per_param``
    only for a quantised checkpoint (:class:`QuantLayout`)."""

    weight_dtype: str
    weight_bytes_per_param: float
    act_dtype: str
    act_bytes_per_element: float
    kv_dtype: str
    kv_bytes_per_element: float
    quant_method: str
    quant_group_size: int
    quant_zero_bytes_per_param: float
    quant_index_bytes_per_input: float
    unquantized_bytes_per_param: float
    quant_lm_head: bool


def _dtypes_from_config(cfg: JsonObject) -> ConfigDtypes:
    raw = _first_of(cfg, "torch_dtype", "dtype", default="bfloat16")
    w = normalize_dtype(str(raw))
    if w not in DTYPE_BYTES:
        w = "bf16"
    layout = quant_layout(cfg)
    act = compute_dtype_for(w) if layout is None else layout.compute_dtype
    act_bytes = max(DTYPE_BYTES[act], 2.0) if act != "fp32" else 4.0
    out: ConfigDtypes = {
        "weight_dtype": w,
        "weight_bytes_per_param": DTYPE_BYTES[w],
        "act_dtype": act,
        "act_bytes_per_element": act_bytes,
        "kv_dtype": act if act not in ("fp8", "int8") else "bf16",
        "kv_bytes_per_element": act_bytes if act not in ("fp8", "int8") else 2.0,
    }
    if layout is not None:
        out["weight_dtype"] = layout.weight_dtype
        out["weight_bytes_per_param"] = layout.bits / 8 + layout.scale_bytes_per_param
        out["quant_method"] = layout.method
        out["quant_group_size"] = layout.group_size
        out["quant_zero_bytes_per_param"] = layout.zero_bytes_per_param
        out["quant_index_bytes_per_input"] = layout.index_bytes_per_input
        out["unquantized_bytes_per_param"] = layout.unquantized_bytes_per_param
        out["quant_lm_head"] = layout.lm_head
    return out
