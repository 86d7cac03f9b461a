"""After capture, `perfscope run` reads nothing back: the analysis, the terminal summary and the
report take the run as capture read it once, and the summary record as the analysis built it.

A real reference run in this process; only counting wrappers around the Parquet reader and the
summary's dict conversions (benchmarks/request_walk.py prints the same walk in full)."""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from perfscope.analysis.summary import Summary
from perfscope.api import runner
from perfscope.cli import main


def _counting(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, seen: Counter[str], phase: list[str]
) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen[f"{phase[0]} {name}"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def test_a_run_is_read_once_at_capture_and_never_again_for_its_summary_and_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: Counter[str] = Counter()
    phase = ["capture"]
    real_capture = runner.capture

    def capture(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_capture(*args, **kwargs)
        finally:
            phase[0] = "after"

    monkeypatch.setattr(runner, "capture", capture)
    for name in ("read_table", "ParquetFile"):
        _counting(monkeypatch, pq, name, seen, phase)
    _counting(monkeypatch, Summary, "from_dict", seen, phase)
    _counting(monkeypatch, Summary, "to_dict", seen, phase)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            [
                "run",
                "--model-preset",
                "tiny",
                "--requests",
                "4",
                "--prompt-len",
                "8",
                "--output-len",
                "4",
                "--no-progress",
                "--runs-dir",
                str(tmp_path),
            ]
        )
    assert code == 0
    (run_dir,) = (p for p in tmp_path.iterdir() if p.is_dir())
    assert (run_dir / "report.html").is_file() and (run_dir / "summary.json").is_file()
    assert "TTFT includes queueing" in out.getvalue()  # the batch caveat, from memory
    assert seen["capture read_table"] >= 4  # the store reads the compacted tables once
    after = {k: v for k, v in seen.items() if k.startswith("after")}
    # summary.json is written once; nothing is read or converted back
    assert after == {"after to_dict": 1}
