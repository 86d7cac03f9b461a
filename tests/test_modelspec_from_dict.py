"""``ModelSpec.from_dict`` narrows each JSON value to its field's type, or refuses it."""

from __future__ import annotations

import pytest

from perfscope.analysis.modelspec import ModelSpec
from perfscope.errors import UsageError


def test_a_stored_model_reads_back_equal_with_json_spellings_of_its_numbers() -> None:
    spec = ModelSpec.from_preset("gemma-2-9b")
    data = spec.to_dict()
    assert ModelSpec.from_dict(data) == spec
    data |= {"n_layers": float(spec.n_layers), "weight_bytes_per_param": 2, "newer_key": 1}
    assert ModelSpec.from_dict(data) == spec  # 42.0 layers, 2 bytes, an unknown key ignored


def test_a_value_of_another_json_type_is_refused_in_one_line() -> None:
    data = ModelSpec.from_preset("llama-3-8b").to_dict()
    with pytest.raises(UsageError, match="model field n_layers is '32', expected int"):
        ModelSpec.from_dict({**data, "n_layers": "32"})
    with pytest.raises(UsageError, match="model field layer_windows is 4096, expected tuple"):
        ModelSpec.from_dict({**data, "layer_windows": 4096})
