"""``perfscope analyze --hw X`` keeps the run's stored summary (and its advice) and writes
the analysis against X beside it; ``--save`` replaces it."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from perfscope.cli import main
from tests.data.runs.builders import complete_run


@pytest.mark.slow
def test_analyze_against_another_device_writes_beside_the_stored_summary(tmp_path: Path) -> None:
    run = complete_run(tmp_path, "--hw", "epyc-9654", "--no-telemetry")
    stored = (run / "summary.json").read_bytes()
    assert json.loads(stored)["advice"], "the run's own analysis has advice to lose"
    with contextlib.redirect_stdout(None):  # type: ignore[type-var]
        assert main(["analyze", str(run), "--hw", "h100-sxm5-80gb"]) == 0
    assert (run / "summary.json").read_bytes() == stored
    beside = json.loads((run / "summary.hw-h100-sxm5-80gb.json").read_text())
    assert beside["hardware"]["spec"]["key"] == "h100-sxm5-80gb"
    with contextlib.redirect_stdout(None):  # type: ignore[type-var]
        assert main(["analyze", str(run), "--hw", "h100-sxm5-80gb", "--save"]) == 0
    replaced = json.loads((run / "summary.json").read_text())
    assert replaced["hardware"]["spec"]["key"] == "h100-sxm5-80gb"
