"""Terminal output fits the terminal: at 80, 120 and 200 columns no identifier and no number
is cut, narrow terminals get stacked blocks, and no number is in exponent notation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from perfscope._render import runs_table, summary_view
from perfscope.cli import build_parser
from perfscope.profiler.store import read_run
from tests.test_cli import FAST, _cli

WIDTHS = (80, 120, 200)
EXPONENT = re.compile(r"(?<![\w-])\d+(\.\d+)?[eE][+-]?\d+\b")  # not a run id's hex


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("width-runs")
    res = _cli("run", *FAST, "--no-report", "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    (path,) = list(runs.iterdir())
    return path


def _text(renderable: object, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def _cli_text(argv: list[str], width: int) -> str:
    args = build_parser().parse_args(argv)
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    assert args.handler(args, console) == 0
    return console.export_text()


def _assert_fits(text: str, width: int, whole: list[str]) -> None:
    assert "…" not in text, "a cell was cut"
    assert max(len(line) for line in text.splitlines()) <= width
    assert not EXPONENT.search(text), EXPONENT.search(text)
    for word in whole:
        assert word in text, f"{word!r} is not printed whole at {width} columns"


@pytest.mark.parametrize("width", WIDTHS)
def test_run_summary_prints_every_identifier_and_number_whole(run_dir: Path, width: int) -> None:
    stored = read_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    text = _text(summary_view(summary, run_dir), width)
    verdicts = [p["verdict"] for p in summary["roofline"]["phases"].values()]
    devices = [p["device"]["key"] for p in summary.get("projections") or []]
    _assert_fits(text, width, [stored.manifest["run_id"], *verdicts, *devices])
    for row in ("TTFT", "TPOT", "E2E"):
        assert row in text


def test_a_narrow_terminal_gets_stacked_blocks_not_a_squeezed_table(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    narrow = _text(summary_view(summary, run_dir), 80)
    wide = _text(summary_view(summary, run_dir), 200)
    # The roofline's 13 columns do not fit 80 columns: one block per phase, field by field.
    assert re.search(r"^prefill\s*$", narrow, re.M)
    assert re.search(r"^\s+steps \d+ · time ", narrow, re.M)
    assert re.search(r"^\s+phase\s+steps\s+time\s+FLOPs", wide, re.M)


@pytest.mark.parametrize("width", WIDTHS)
def test_ls_prints_whole_run_ids(run_dir: Path, width: int) -> None:
    stored = read_run(run_dir, tables=False)
    text = _text(runs_table([(run_dir, stored.manifest, stored.summary)]), width)
    _assert_fits(text, width, [run_dir.name, "complete"])


@pytest.mark.parametrize("width", WIDTHS)
def test_hw_list_prints_whole_keys_and_numbers(width: int) -> None:
    text = _cli_text(["hw", "list"], width)
    _assert_fits(text, width, ["a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "TB/s"])


@pytest.mark.parametrize("width", WIDTHS)
def test_hw_show_prints_each_source_once(width: int) -> None:
    text = _cli_text(["hw", "show", "a100-sxm4-80gb"], width)
    _assert_fits(text, width, ["a100-sxm4-80gb"])
    refs = re.findall(r"^\[(\d+)\] (.+)$", text, re.M)
    assert refs, "the sources are listed once, numbered"
    assert len({src for _, src in refs}) == len(refs)
    assert text.count("dense.bf16") == 1  # the field table is printed once


@pytest.mark.parametrize("width", WIDTHS)
def test_roofline_prints_whole_verdicts_and_device_keys(width: int) -> None:
    argv = ["roofline", "--model", "llama-3-8b", "--hw", "a100-sxm4-80gb,h100-sxm5-80gb"]
    text = _cli_text([*argv, "--batch", "8"], width)
    _assert_fits(text, width, ["a100-sxm4-80gb", "h100-sxm5-80gb", "memory-bound"])
    assert "prefill included" in text
