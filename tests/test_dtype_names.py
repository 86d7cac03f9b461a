"""One dtype normalisation for the hardware database and the analysis."""

from __future__ import annotations

import pytest

from perfscope.analysis.modelspec import dtype_bytes
from perfscope.analysis.modelspec import normalize_dtype as analysis_normalize
from perfscope.hwdb import lookup, normalize_dtype


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("fp8_e4m3", "fp8"),
        ("float8_e4m3fn", "fp8"),
        ("torch.bfloat16", "bf16"),
        (" Float16 ", "fp16"),
        ("tensorfloat32", "tf32"),
        ("w4", "int4"),
    ],
)
def test_every_spelling_maps_to_the_same_key_in_hwdb_and_analysis(name: str, key: str) -> None:
    assert normalize_dtype(name) == key
    assert analysis_normalize(name) == key


def test_fp8_e4m3_finds_the_fp8_peak_of_a_device() -> None:
    spec = lookup("h100-sxm5-80gb")
    assert spec.peak_flops_for("fp8_e4m3") == spec.peak_flops["fp8"]
    assert dtype_bytes("fp8_e4m3") == 1.0
