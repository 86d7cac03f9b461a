"""``--engine-opt`` keys an engine does not read are refused, never silently ignored."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perfscope.errors import UsageError
from perfscope.profiler.engines.base import EngineOptions, check_options
from perfscope.profiler.engines.reference.engine import REFERENCE_OPTIONS, ReferenceEngine

REFERENCE_SRC = Path(__file__).resolve().parents[1] / "profiler" / "engines" / "reference"
#: The ways the reference package reads an option: ``extra.get("k")``, ``extra["k"]``,
#: ``option_int(extra, "k")`` and the other ``option_*``/``_whole`` readers, ``"k" in extra``.
READS = re.compile(
    r'extra(?:\.get\(|\[)"(\w+)"|(?:option_\w+|_whole)\(\s*extra,\s*"(\w+)"|"(\w+)" in extra'
)


def test_every_option_the_reference_engine_reads_is_in_its_accepted_list() -> None:
    read = {
        next(g for g in m.groups() if g)
        for path in REFERENCE_SRC.glob("*.py")
        for m in READS.finditer(path.read_text())
    }
    assert read, "the scan found no option reads: the pattern is out of date"
    assert read <= set(REFERENCE_OPTIONS), sorted(read - set(REFERENCE_OPTIONS))


def test_an_unknown_option_names_the_closest_key_and_a_flag_names_the_flag() -> None:
    with pytest.raises(UsageError) as err:
        ReferenceEngine("reference", EngineOptions(model_preset="tiny", extra={"thread": "1"}))
    assert "thread -> threads?" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UsageError, match="preset -> the --model-preset flag"):
        check_options(
            {"preset": "tiny"}, REFERENCE_OPTIONS, "reference", {"preset": "--model-preset"}
        )


def test_the_capture_stage_s_own_keys_and_known_keys_pass() -> None:
    check_options({"prompt_salt": "3", "threads": "1"}, REFERENCE_OPTIONS, "reference")
