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


def _run_pair(root: Path, a: str, b: str, repeat: int = 6, *extra: str) -> dict[str, Any]:
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
        "--order-seed",
        "3",
        *extra,
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


@pytest.mark.slow  # about 9 s on a quiet 2-core machine
def test_a_30_percent_slower_python_engine_is_called_worse(
    tmp_path: Path, engines_on_path: Path
) -> None:
    result = _run_pair(tmp_path, "single_tokens", "slower_tokens", 8)
    assert result["noise_known"] and [len(g) for g in result["runs"]] == [8, 8]
    assert result["paired"] == [True] and result["experiment"]["seed"] == 3
    # balanced blocks AB BA AB ...: each block's order is in its runs' manifests
    manifests = sorted(
        (read_run(p, tables=False).manifest for p in list_runs(tmp_path)),
        key=lambda m: m["started_at"],
    )
    sets = "".join(m["run_set"]["id"][-1] for m in manifests)
    assert sets in ("ABBA" * 4, "BAAB" * 4)
    assert all(m["run_set"]["order"] in ("AB", "BA") for m in manifests)
    assert [m["run_set"]["position"] for m in manifests] == [0, 1] * 8
    rows = _rows(result)
    assert result["metrics"][0]["key"] == "latency.tpot.p50"
    for key in KEY_METRICS:
        assert rows[key]["change"][1] == "worse", (key, rows[key])
        assert rows[key]["ratios"][1] == pytest.approx(1.3, rel=0.12)
    assert result["headlines"][0].startswith("TPOT p50: worse")
    # the same sets, named by their run-set ids, through 'perfscope compare': same verdicts
    out = io.StringIO()
    exp = result["experiment"]["id"]
    with contextlib.redirect_stdout(out):
        code = main(["compare", f"{exp}-A", f"{exp}-B", "--runs-dir", str(tmp_path), "--json"])
    assert code == 0
    again = _rows(json.loads(out.getvalue()))
    assert all(again[k]["change"][1] == "worse" for k in KEY_METRICS)


@pytest.mark.slow  # about 8 s on a quiet 2-core machine
def test_identical_python_engines_repeated_show_no_significant_change(
    tmp_path: Path, engines_on_path: Path
) -> None:
    result = _run_pair(tmp_path, "single_tokens", "same_tokens", 8)
    # 99% confidence: a false alarm on any metric has probability <= 1%
    rows = _rows(_recompare(result, tmp_path, "0.99"))
    for row in rows.values():
        assert row["change"][1] in ("no detectable change", "n/a"), row
    for key in KEY_METRICS:
        # at 99% a signed-rank interval needs 8 blocks: a block left out as an outlier (a
        # burst of load on a shared machine) leaves 7, and then no interval exists; the
        # row must then name the outlier block rather than state a noise it cannot know
        row = rows[key]
        assert row["noise"][1] is not None or row["outliers"][1], row
    # the primary states what it could have detected; secondaries, at the corrected
    # level, need more blocks (said as "none" in the table)
    primary = rows["latency.tpot.p50"]
    assert primary["detectable"][1] is not None or primary["outliers"][1], primary


@pytest.mark.slow  # about 7 s on a quiet 2-core machine
def test_precision_adds_blocks_until_the_interval_is_narrow_and_says_why_it_stopped(
    tmp_path: Path, engines_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _run_pair(
        tmp_path, "single_tokens", "slower_tokens", 2, "--precision", "20%", "--max-repeats", "9"
    )
    blocks = result["experiment"]["blocks"]
    assert 6 <= blocks <= 9  # at least 6 blocks, at most --max-repeats
    err = capsys.readouterr().err
    assert "target ±20%" in err  # the live view shows the interval after each block
    assert (
        "reached ±" in result["experiment"]["stop"] or "max-repeats" in result["experiment"]["stop"]
    )


def test_a_lone_run_set_ends_with_its_median_and_spread_and_an_id_compare_takes(
    tmp_path: Path, engines_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "run",
        "python:timed_engines:single_tokens",
        "--repeat",
        "3",
        "--requests",
        "3",
        "--output-len",
        "4",
        "--no-progress",
        "--no-report",
        "--runs-dir",
        str(tmp_path),
        "--warmup-runs",
        "1",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "TPOT p50: median" in out and "run to run" in out
    set_id = out.split("run set ", 1)[1].split(":", 1)[0]
    manifests = [read_run(p, tables=False).manifest for p in list_runs(tmp_path)]
    assert sum(bool(m["run_set"].get("warmup")) for m in manifests) == 1
    assert main(["compare", set_id, set_id.replace("-A", "-A"), "--runs-dir", str(tmp_path)]) == 2


def test_compare_names_two_run_sets_of_one_engine_and_what_differs(
    tmp_path: Path, engines_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    set_ids = []
    for output_len in ("4", "6"):
        argv = ["run", "python:timed_engines:single_tokens", "--repeat", "2", "--requests", "3"]
        argv += ["--output-len", output_len, "--no-progress", "--no-report"]
        assert main([*argv, "--runs-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        set_ids.append(out.split("run set ", 1)[1].split(":", 1)[0])
    assert main(["compare", *set_ids, "--runs-dir", str(tmp_path)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # captions wrap at spaces
    # Both sides named by what they are: the same engine, told apart by their set ids.
    label = "python:timed_engines:single_tokens"
    assert f"baseline = {label} (2 runs, set {set_ids[0]})" in text, text
    assert f"other = {label} (2 runs, set {set_ids[1]})" in text, text
    assert "run 1" not in text
    assert "configurations differ in workload.output_len: 4 | 6" in text
