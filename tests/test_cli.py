"""`perfscope run/show/ls/analyze` end to end, in a subprocess, as a user runs them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import PERFSCOPE, subprocess_env

SUMMARY_KEYS = {
    "schema",
    "run_id",
    "name",
    "status",
    "started_at",
    "perfscope_version",
    "engine",
    "workload",
    "load",
    "counts",
    "window_s",
    "latency",
    "throughput",
    "goodput",
    "driver_lag",
    "errors",
    "steps",
    "model",
}
FAST = [
    "--model-preset",
    "tiny",
    "--requests",
    "6",
    "--prompt-len",
    "16",
    "--output-len",
    "8",
    "--batch-size",
    "4",
    "--no-progress",
]


def _cli(*args: str, runs: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PERFSCOPE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(PERFSCOPE_RUNS_DIR=str(runs)),
    )


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    runs = tmp_path_factory.mktemp("cli-runs")
    res = _cli("run", *FAST, "--slo", "ttft=10s", "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    (run_dir,) = list(runs.iterdir())
    return runs, run_dir, summary


def test_run_writes_a_complete_run_directory_with_every_summary_field(
    stored_run: tuple[Path, Path, dict],
) -> None:
    _, run_dir, summary = stored_run
    assert set(summary) >= SUMMARY_KEYS
    assert summary["status"] == "complete"
    assert summary["counts"]["completed"] == 6
    assert summary["counts"]["output_tokens"] == 6 * 8
    for name in (
        "manifest.json",
        "requests.parquet",
        "chunks.parquet",
        "steps.parquet",
        "summary.json",
    ):
        assert (run_dir / name).is_file(), name
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["engine"]["model"]["n_layers"] == 2
    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert set(steps["kind"]) == {"prefill", "decode"}
    assert (steps["t_end"] >= steps["t_start"]).all()
    chunks = pd.read_parquet(run_dir / "chunks.parquet")
    assert chunks["n_tokens"].sum() == 6 * 8
    assert not list(run_dir.glob(".*"))  # no temp files left behind


def test_analyze_reproduces_the_stored_numbers(stored_run: tuple[Path, Path, dict]) -> None:
    runs, run_dir, summary = stored_run
    res = _cli("analyze", str(run_dir), "--json", runs=runs)
    assert res.returncode == 0, res.stderr
    again = json.loads(res.stdout)
    for key in ("counts", "latency", "throughput", "goodput", "steps", "window_s"):
        assert again[key] == summary[key], key


def test_analyze_with_new_slos_changes_only_goodput(stored_run: tuple[Path, Path, dict]) -> None:
    runs, run_dir, summary = stored_run
    res = _cli("analyze", str(run_dir), "--slo", "ttft=1ns", "--json", runs=runs)
    again = json.loads(res.stdout)
    assert again["goodput"]["attainment"] == 0.0
    assert again["latency"] == summary["latency"]
    # restore the original summary for the other tests
    _cli("analyze", str(run_dir), "--slo", "ttft=10s", runs=runs)


def test_show_prints_the_summary_table(stored_run: tuple[Path, Path, dict]) -> None:
    runs, run_dir, summary = stored_run
    res = _cli("show", run_dir.name, runs=runs)
    assert res.returncode == 0, res.stderr
    for text in (
        "TTFT",
        "TPOT",
        "output tokens/s",
        "SLO attainment",
        "decode",
        "prefill",
        summary["run_id"],
    ):
        assert text in res.stdout


def test_ls_lists_runs_newest_first_with_key_metrics(stored_run: tuple[Path, Path, dict]) -> None:
    runs, run_dir, _ = stored_run
    res = _cli("ls", runs=runs)
    assert res.returncode == 0, res.stderr
    assert run_dir.name in res.stdout
    assert "complete" in res.stdout
    data = json.loads(_cli("ls", "--json", runs=runs).stdout)
    assert data[0]["run_id"] == run_dir.name


def test_run_table_output_has_latency_and_throughput(tmp_path: Path) -> None:
    res = _cli("run", *FAST, runs=tmp_path)
    assert res.returncode == 0, res.stderr
    # Each latency cell carries its own unit, chosen by magnitude (catalogue formatting).
    assert "Latency" in res.stdout
    assert re.search(r"TTFT\s+\d+\s+[\d.,]+ (ms|s|µs)", res.stdout)
    assert "output tokens/s" in res.stdout
    assert "run directory:" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "nosuch:engine"], "unknown engine 'nosuch:engine'"),
        (["run", "python:no_such_module_xyz:fn"], "cannot import module"),
        (["run", "--slo", "ttft=fast"], "cannot read duration 'fast'"),
        (["run", "--slo", "speed=1s"], "unknown SLO metric 'speed'"),
        (["run", "--mode", "online", "--rate", "-3"], "--rate must be a positive"),
        (["run", "--prompts", "/nonexistent/prompts.jsonl"], "does not exist"),
        (["run", "--prompt-len", "uniform:9:2"], "uniform needs"),
        (["run", "--mode", "online"], "needs --rate R or --concurrency N"),
        (["run", "--requests", "0"], "must be at least 1"),
        (["show", "/nonexistent/run"], "does not exist"),
        (["analyze", "/tmp"], "is not a perfscope run"),
    ],
)
def test_bad_input_gives_a_one_line_error_and_exit_code_2(
    args: list[str], message: str, tmp_path: Path
) -> None:
    res = _cli(*args, runs=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_run_with_python_engine_records_failures_and_goes_on(tmp_path: Path) -> None:
    res = _cli(
        "run",
        "python:timed_engines:flaky",
        "--requests",
        "9",
        "--output-len",
        "4",
        "--no-progress",
        "--json",
        runs=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["counts"]["failed"] == 3
    assert s["counts"]["completed"] == 6
    assert s["errors"] == [{"error": "ConnectionResetError: server went away", "count": 3}]
