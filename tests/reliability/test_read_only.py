"""Reading never writes: every read command works on a read-only runs folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.reliability.helpers import can_mount, cli, is_root, tmpfs


@contextmanager
def read_only_runs(tmp_path: Path) -> Iterator[Path]:
    """Two finished runs (summary.json removed) in a folder nobody may write to."""
    src = tmp_path / "src"
    for _ in range(2):
        res = cli(
            "run",
            "python:logged_engines:half_fail",
            "--requests",
            "6",
            "--output-len",
            "4",
            "--no-progress",
            "--no-report",
            runs=src,
        )
        assert res.returncode == 0, res.stderr
    for run in src.iterdir():
        (run / "summary.json").unlink()
    if can_mount():
        with tmpfs(tmp_path / "ro", "16m") as disk:
            shutil.copytree(src, disk / "runs")
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
            yield disk / "runs"
    elif not is_root():
        for p in [src, *src.rglob("*")]:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield src
        finally:
            for p in [src, *src.rglob("*")]:
                p.chmod(0o755 if p.is_dir() else 0o644)
    else:
        pytest.skip("root without mount: cannot make a folder read-only")


@pytest.mark.fault(
    fault="a read-only runs folder",
    before="not recorded (guard older than issue 26)",
    after="show, analyze (`not saved`, said) and report elsewhere all work",
    kept="the runs folder unchanged (no summary written into it)",
)
@pytest.mark.slow  # about 8 s on a quiet 2-core machine
def test_read_commands_work_on_a_read_only_runs_folder(tmp_path: Path) -> None:
    with read_only_runs(tmp_path) as runs:
        with pytest.raises(OSError, match=r"Read-only|Permission"):
            (runs / "probe").write_text("x")  # it really is read-only
        a, b = sorted(p.name for p in runs.iterdir())
        show = cli("show", a, "--json", runs=runs)
        assert show.returncode == 0, show.stderr
        assert json.loads(show.stdout)["counts"]["completed"] == 3
        assert not (runs / a / "summary.json").exists()

        ana = cli("analyze", a, "--json", runs=runs)
        assert ana.returncode == 0, ana.stderr
        assert "not saved" in ana.stderr and "read-only" in ana.stderr

        out = tmp_path / "out"
        out.mkdir()
        rep = cli("report", a, "-o", str(out / "a.html"), runs=runs)
        assert rep.returncode == 0, rep.stderr
        assert (out / "a.html").stat().st_size > 1000
        rep_in = cli("report", a, runs=runs)  # into the run directory: cannot
        assert rep_in.returncode == 1
        assert rep_in.stderr.startswith("error: cannot write") and "read-only" in rep_in.stderr

        exp = cli("export", a, "--format", "json", "-o", "-", runs=runs)
        assert exp.returncode == 0, exp.stderr
        perf = cli("export", a, "--format", "perfetto", "-o", str(out / "t.json"), runs=runs)
        assert perf.returncode == 0, perf.stderr

        cmp_ = cli("compare", a, b, "--json", runs=runs)
        assert cmp_.returncode == 0, cmp_.stderr
        ls = cli("ls", "--json", runs=runs)
        assert [e["state"] for e in json.loads(ls.stdout)] == ["complete", "complete"]

        from perfscope.dashboard.app.data import RunRepository

        repo = RunRepository(runs)
        loaded = repo.load(a)
        assert loaded.summary_computed and loaded.summary["counts"]["completed"] == 3
        assert sorted(os.listdir(runs / a)) == sorted(os.listdir(runs / b))
        assert "summary.json" not in os.listdir(runs / a)
