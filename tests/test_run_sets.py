"""Repeated runs (``perfscope run --repeat N --vs ENGINE``) compared by their run-to-run noise,
with real python: engines whose timing is known."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from perfscope.cli import main
from perfscope.profiler.store import list_runs, read_run

KEY_METRICS = ("latency.ttft.p50", "latency.tpot.p50", "latency.e2e.p50")


def _run_pair(root: Path, a: str, b: str, repeat: int = 3) -> dict[str, Any]:
    argv = [
        "run",
        f"python:timed_engines:{a}",
        "--vs",
        f"python:timed_engines:{b}",
        "--repeat",
        str(repeat),
        "--requests",
        "4",
        "--output-len",
        "6",
        "--concurrency",
        "1",
        "--no-progress",
        "--no-report",
        "--json",
        "--runs-dir",
        str(root),
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def _rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in result["metrics"]}


def _recompare(result: dict[str, Any], root: Path, confidence: str) -> dict[str, Any]:
    out = io.StringIO()
    sets = [",".join(g) for g in result["runs"]]
    with contextlib.redirect_stdout(out):
        code = main(
            ["compare", *sets, "--runs-dir", str(root), "--confidence", confidence, "--json"]
        )
    assert code == 0
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


def test_a_30_percent_slower_python_engine_is_called_worse(
    tmp_path: Path, engines_on_path: Path
) -> None:
    result = _run_pair(tmp_path, "single_tokens", "slower_tokens")
    assert result["noise_known"] and [len(g) for g in result["runs"]] == [3, 3]
    # interleaved A B A B: run ids alternate between the sets in time
    stamps = sorted(
        list_runs(tmp_path), key=lambda p: read_run(p, tables=False).manifest["started_at"]
    )
    sets = [read_run(p, tables=False).manifest["run_set"]["id"][-1] for p in stamps]
    assert sets == ["A", "B"] * 3
    rows = _rows(result)
    for key in KEY_METRICS:
        assert rows[key]["change"][1] == "worse", (key, rows[key])
        assert rows[key]["ratios"][1] == pytest.approx(1.3, rel=0.12)
    # the same sets through 'perfscope compare' give the same verdicts
    again = _rows(_recompare(result, tmp_path, "0.95"))
    assert all(again[k]["change"][1] == "worse" for k in KEY_METRICS)


def test_identical_python_engines_repeated_show_no_significant_change(
    tmp_path: Path, engines_on_path: Path
) -> None:
    result = _run_pair(tmp_path, "single_tokens", "same_tokens")
    # 99% confidence: a false alarm on one of these metrics has probability <= 1%
    rows = _rows(_recompare(result, tmp_path, "0.99"))
    for key in KEY_METRICS:
        assert rows[key]["change"][1] == "no significant change", (key, rows[key])
        assert rows[key]["noise"][1] is not None
