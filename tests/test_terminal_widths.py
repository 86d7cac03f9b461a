"""Terminal output fits the terminal: at 80, 120 and 200 columns no identifier and no number
is cut, narrow terminals get stacked blocks, and no number is in exponent notation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from perfscope.analysis import Summary
from perfscope.cli import build_parser
from perfscope.cli.render import runs_table, summary_view
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
    text = _text(summary_view(Summary.from_dict(summary), run_dir), width)
    verdicts = [p["verdict"] for p in summary["roofline"]["phases"].values()]
    devices = [p["device"]["key"] for p in summary.get("projections") or []]
    _assert_fits(text, width, [stored.manifest["run_id"], *verdicts, *devices])
    for row in ("TTFT", "TPOT", "E2E"):
        assert row in text


def test_a_narrow_terminal_gets_stacked_blocks_not_a_squeezed_table(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    narrow = _text(summary_view(Summary.from_dict(summary), run_dir), 80)
    wide = _text(summary_view(Summary.from_dict(summary), run_dir), 200)
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
    # Both devices hold the same weights and KV cache: one line, not a column each.
    assert text.count("16.1 GB") == 1 and "every row:" in text
    # Neither device is checked by a stored study: said once, naming both, no host CPU.
    flat = " ".join(text.split())
    assert flat.count("unchecked:") == 1 and "unknown CPU" not in flat
    assert "NVIDIA A100" in flat and "NVIDIA H100" in flat


@pytest.fixture(scope="module")
def two_runs(run_dir: Path) -> tuple[Path, Path]:
    """The module's run and one more in the same runs folder (for compare)."""
    runs = run_dir.parent
    res = _cli("run", *FAST, "--no-report", "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    (other,) = [p for p in runs.iterdir() if p.is_dir() and p != run_dir]
    return run_dir, other


@pytest.mark.parametrize("width", WIDTHS)
def test_show_prints_every_identifier_and_number_whole(run_dir: Path, width: int) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    text = _cli_text(["show", run_dir.name, "--runs-dir", str(run_dir.parent)], width)
    verdicts = [p["verdict"] for p in summary["roofline"]["phases"].values()]
    devices = [p["device"]["key"] for p in summary.get("projections") or []]
    _assert_fits(text, width, [run_dir.name, *verdicts, *devices, "TTFT", "E2E"])


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_prints_whole_labels_ratios_and_changes(
    two_runs: tuple[Path, Path], width: int
) -> None:
    a, b = two_runs
    argv = ["compare", a.name, b.name, "--runs-dir", str(a.parent)]
    text = _cli_text(argv, width)
    _assert_fits(text, width, [a.name, b.name, "TTFT p50", "noise unknown"])
    assert re.search(r"\d\.\d{3}x", text), "a ratio is printed whole"
    # Single runs: the interval, noise and change are the same in every row: said once.
    assert text.count("every row:") == 1
    prose = " ".join(text.split())  # captions wrap at spaces
    assert prose.count("interval: n/a (too few runs)") == 1


@pytest.fixture(scope="module")
def sweep_summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from tests.test_openai_scripted import scripted_server

    runs = tmp_path_factory.mktemp("width-sweep")
    with scripted_server("--max-concurrent", "4", "--ttft", "0.01", "--itl", "0.005") as url:
        argv = ["sweep", f"openai:{url}", "--rates", "5,20,80", "--requests", "8"]
        argv += ["--output-len", "4", "--slo", "ttft=50ms", "--runs-dir", str(runs), "--json"]
        args = build_parser().parse_args(argv)
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert args.handler(args, Console(file=io.StringIO(), width=120)) == 0
    summary: dict[str, object] = json.loads(out.getvalue())
    return summary


@pytest.mark.parametrize("width", WIDTHS)
def test_sweep_prints_whole_rates_and_metrics(sweep_summary: dict[str, object], width: int) -> None:
    from perfscope.analysis.sweep import SweepSummary
    from perfscope.cli.sweep import sweep_table

    text = _text(sweep_table(SweepSummary.from_dict(sweep_summary)), width)
    _assert_fits(text, width, ["sweep (rate)", "max_goodput_rate", "80"])
    assert "TTFT p50" in text or "TTFT" in text


@pytest.fixture(scope="module")
def study_result(tmp_path_factory: pytest.TempPathFactory) -> object:
    from perfscope.api.study import study_with
    from perfscope.cli.options import run_args

    runs = tmp_path_factory.mktemp("width-study")
    argv = ["study", "batch-size", "--values", "1,4", "--model-preset", "tiny"]
    argv += ["--requests", "4", "--prompt-len", "16", "--output-len", "4"]
    argv += ["--no-telemetry", "--runs-dir", str(runs)]
    args = build_parser().parse_args(argv)
    return study_with(run_args(args), args.knob, args.values, repeat=1, log=lambda line: None)


@pytest.mark.parametrize("width", WIDTHS)
def test_study_prints_whole_settings_verdicts_and_effects(study_result: object, width: int) -> None:
    from perfscope.cli.study import effects_table, study_table

    study = study_result
    text = _text(study_table(study), width) + _text(effects_table(study), width)  # type: ignore[arg-type]
    verdicts = [
        v.verdict
        for s in study.settings  # type: ignore[attr-defined]
        for r in s.runs[:1]
        for v in r.phases.values()
    ]
    _assert_fits(text, width, ["batch-size", *verdicts, "measured"])


def test_ls_is_a_table_at_120_columns_without_an_empty_reason_column(run_dir: Path) -> None:
    stored = read_run(run_dir, tables=False)
    rows = [(run_dir, stored.manifest, stored.summary)]
    text = _text(runs_table(rows, states=[("complete", None)]), 120)
    assert re.search(r"^\s*run\s+status\s+engine\s+requests", text, re.M), text
    assert "reason" not in text
    with_reason = _text(runs_table(rows, states=[("crashed", "process 1 is gone")]), 200)
    assert re.search(r"\breason\s*$", with_reason.splitlines()[0]) and "is gone" in with_reason
