"""``quantization_config`` read as JSON: numbers and blocks are narrowed, malformed ones refused."""

from __future__ import annotations

import pytest

from perfscope.analysis.modelspec.quant import _dtypes_from_config, quant_layout
from perfscope.errors import UsageError


def test_an_fp8_block_and_gptq_numbers_read_as_they_did() -> None:
    fp8 = quant_layout(
        {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    )
    assert (
        fp8 is not None and fp8.group_size == 128 * 128 and fp8.scale_bytes_per_param == 4.0 / 16384
    )
    gptq = quant_layout(
        {"quantization_config": {"quant_method": "gptq", "bits": "4", "group_size": 64}}
    )
    assert gptq is not None and gptq.bits == 4.0 and gptq.group_size == 64
    assert quant_layout({"quantization_config": "gptq"}) is None  # not an object: no layout


def test_a_malformed_quantization_config_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="bits is \\[4\\], not a number"):
        quant_layout({"quantization_config": {"quant_method": "gptq", "bits": [4]}})
    with pytest.raises(UsageError, match="weight_block_size is 128, not \\[rows, cols\\]"):
        quant_layout({"quantization_config": {"quant_method": "fp8", "weight_block_size": 128}})


def test_compressed_tensors_activations_that_are_not_an_object_leave_compute_at_bf16() -> None:
    group = {"weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}
    cfg = {
        "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": group}}
    }
    dtypes = _dtypes_from_config(cfg)
    assert dtypes["weight_dtype"] == "int8" and dtypes["act_dtype"] == "bf16"
    group["input_activations"] = {"num_bits": 8}
    assert _dtypes_from_config(cfg)["act_dtype"] == "int8"
