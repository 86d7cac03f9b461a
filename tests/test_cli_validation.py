"""Bad command-line input is refused with one line, exit code 2, before anything is allocated.

Each case runs the real ``perfscope`` entry point (``main``) in-process and checks that stderr
holds exactly one line starting with ``error:``, with no traceback, and that no run folder
was created. One case per kind also runs as a real subprocess.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfscope.cli import main
from perfscope.errors import UsageError, WorkloadError
from perfscope.profiler.driver import LoadConfig, arrival_offsets_ns
from perfscope.profiler.engines.reference.engine import check_memory, memory_needed
from perfscope.profiler.engines.reference.model import PRESETS
from perfscope.profiler.workload import WorkloadConfig, build_workload

RUN = ["run", "--model-preset", "tiny", "--requests", "2", "--prompt-len", "4"]
RUN += ["--output-len", "2", "--no-progress", "--no-report", "--no-telemetry"]


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.fixture
def afile(tmp_path: Path) -> Path:
    p = tmp_path / "not-a-folder"
    p.write_text("x")
    return p


CASES: list[tuple[str, list[str], str]] = [
    ("runs-dir names a file", [*RUN, "--runs-dir", "{afile}"], "is a file, not a folder"),
    ("runs-dir empty", [*RUN, "--runs-dir", ""], "must name a folder"),
    ("device tpu", [*RUN, "--device", "tpu"], "unknown device 'tpu'"),
    ("hidden 1e9", [*RUN, "--hidden", "1000000000"], "GB is available"),
    (
        "deep and wide model",
        [*RUN, "--layers", "4096", "--hidden", "65536", "--heads", "64", "--kv-heads", "8"],
        "GB is available",
    ),
    ("kv cache too big", [*RUN, "--batch-size", "100000000"], "KV cache"),
    ("requests 1e9", [*RUN, "--requests", "1000000000"], "at most 10,000,000 requests"),
    ("warmup 1e9", [*RUN, "--warmup", "1000000000"], "more than the 10,000,000"),
    ("rate 1e-300", [*RUN, "--rate", "1e-300"], "lowest rate"),
    ("rate inf", [*RUN, "--rate", "inf"], "positive number"),
    ("rate nan", [*RUN, "--rate", "nan"], "positive number"),
    (
        "burstiness 1e-300",
        [*RUN, "--rate", "5", "--arrival", "gamma", "--burstiness", "1e-300"],
        "burstiness",
    ),
    ("analyze runs-dir file", ["analyze", "x", "--runs-dir", "{afile}"], "is a file"),
    ("show runs-dir empty", ["show", "--runs-dir", ""], "must name a folder"),
    ("ls runs-dir file", ["ls", "--runs-dir", "{afile}"], "is a file"),
    ("report runs-dir file", ["report", "--runs-dir", "{afile}"], "is a file"),
    ("export runs-dir empty", ["export", "--format", "csv", "--runs-dir", ""], "must name"),
    ("dashboard runs-dir file", ["dashboard", "--runs-dir", "{afile}"], "is a file"),
    (
        "sweep runs-dir file",
        ["sweep", "openai:http://127.0.0.1:9/v1", "--runs-dir", "{afile}"],
        "is a file",
    ),
    (
        "sweep rate 1e-300",
        ["sweep", "openai:http://127.0.0.1:9/v1", "--rates", "1e-300"],
        "lowest rate",
    ),
    (
        "sweep requests 1e9",
        ["sweep", "openai:http://127.0.0.1:9/v1", "--requests", "1000000000"],
        "at most",
    ),
    ("calibrate device tpu", ["hw", "calibrate", "--device", "tpu"], "unknown device"),
    ("ray-autoscale without ray", [*RUN, "--ray-autoscale", "4"], "--ray-autoscale needs --ray"),
    ("ray with a batching engine", [*RUN, "--ray", "local:2"], "batches in one process"),
    ("engine-opt that is a flag", [*RUN, "--engine-opt", "preset=tiny"], "--model-preset flag"),
    ("engine-opt misspelt", [*RUN, "--engine-opt", "thread=2"], "thread -> threads?"),
]


@pytest.mark.parametrize(("argv", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str],
    needle: str,
    afile: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERFSCOPE_RUNS_DIR", str(tmp_path / "runs"))
    argv = [a.replace("{afile}", str(afile)) for a in argv]
    code, err = _cli(argv, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert needle in lines[0]
    assert "Traceback" not in err
    # Nothing was written: no runs root, and the current folder holds only the fixture file.
    assert not (tmp_path / "runs").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [afile.name]


@pytest.mark.parametrize(
    "extra",
    [["--runs-dir", ""], ["--device", "tpu"], ["--hidden", "1000000000"]],
    ids=["runs-dir-empty", "device-tpu", "hidden-1e9"],
)
def test_bad_input_in_a_real_process(extra: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "perfscope", *RUN, *extra],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("error: ")
    assert list(tmp_path.iterdir()) == []


def test_library_refuses_a_rate_below_one_a_day() -> None:
    with pytest.raises(WorkloadError, match="lowest rate"):
        LoadConfig(mode="online", rate=1e-300).validate()


def test_arrivals_that_overflow_the_clock_are_refused() -> None:
    # 10 M requests at one a day: about 27,000 years of planned arrivals.
    load = LoadConfig(mode="online", rate=1.0 / 86_400, arrival="constant")
    with pytest.raises(WorkloadError, match="beyond what a run can span"):
        arrival_offsets_ns(load, 10_000_000)
    ok = arrival_offsets_ns(LoadConfig(mode="online", rate=1.0 / 86_400), 100)
    assert ok.dtype == np.int64 and np.all(np.diff(ok) >= 0)


def test_build_workload_refuses_a_billion_requests_before_sampling() -> None:
    with pytest.raises(WorkloadError, match="10,000,000"):
        build_workload(WorkloadConfig(requests=1_000_000_000))


def test_memory_estimate_counts_weights_and_kv_cache() -> None:
    cfg = PRESETS["tiny"].with_overrides(dtype="float32")
    build, weights, kv = memory_needed(cfg, slots=4, max_len=64)
    assert weights == build == 4 * cfg.n_params()
    assert kv == 2 * cfg.n_layers * 4 * cfg.n_kv_heads * 64 * cfg.head_dim * 4
    import torch

    check_memory(cfg, 4, 64, torch.device("cpu"))  # the tiny model fits
    huge = cfg.with_overrides(n_layers=100_000)
    with pytest.raises(UsageError, match="parameters"):
        check_memory(huge, 4, 64, torch.device("cpu"))
