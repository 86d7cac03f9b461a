"""``--engine-opt`` keys an engine does not read are refused, never silently ignored."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perfscope.errors import UsageError
from perfscope.profiler.engines.base import EngineOptions, check_options
from perfscope.profiler.engines.hf import HF_OPTIONS, HFEngine
from perfscope.profiler.engines.reference.engine import REFERENCE_OPTIONS, ReferenceEngine
from perfscope.profiler.engines.vllm_engine import VLLM_OPTIONS, VllmEngine

ENGINES = Path(__file__).resolve().parents[1] / "profiler" / "engines"
REFERENCE_SRC = ENGINES / "reference"
#: The ways the reference package reads an option: ``extra.get("k")``, ``extra["k"]``,
#: ``option_int(extra, "k")`` and the other ``option_*``/``_whole`` readers, ``"k" in extra``.
READS = re.compile(
    r'extra(?:\.get\(|\[)"(\w+)"|(?:option_\w+|_whole)\(\s*(?:options\.)?extra,\s*"(\w+)"'
    r'|"(\w+)" in extra'
)


@pytest.mark.parametrize(
    ("sources", "accepted"),
    [
        (sorted(REFERENCE_SRC.glob("*.py")), REFERENCE_OPTIONS),
        ([ENGINES / "hf.py"], HF_OPTIONS),
        ([ENGINES / "vllm_engine.py"], VLLM_OPTIONS),
    ],
    ids=["reference", "hf", "vllm"],
)
def test_every_option_an_engine_reads_is_in_its_accepted_list(
    sources: list[Path], accepted: tuple[str, ...]
) -> None:
    read = {
        next(g for g in m.groups() if g)
        for path in sources
        for m in READS.finditer(path.read_text())
    }
    assert read, "the scan found no option reads: the pattern is out of date"
    assert read <= set(accepted), sorted(read - set(accepted))


@pytest.mark.parametrize("engine", [HFEngine, VllmEngine], ids=["hf", "vllm"])
def test_hf_and_vllm_refuse_an_unknown_option_before_loading_anything(
    engine: type, tmp_path: Path
) -> None:
    # The folder does not even hold a model: the option is refused first, in one line.
    with pytest.raises(UsageError) as err:
        engine(f"x:{tmp_path}", EngineOptions(extra={"attn": "sdpa", "dtype": "float16"}))
    text = str(err.value)
    assert "attn" in text and "dtype -> the --dtype flag" in text and "\n" not in text


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
