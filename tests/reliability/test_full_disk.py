"""A full disk before, during and after capture: one line, exit 1, flushed data kept, no temp
files. A real tmpfs when this process may mount one; a patched writer otherwise (and always)."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest

from perfscope.api.runner import RunOptions, execute_run
from perfscope.errors import StorageError
from perfscope.profiler import segments
from perfscope.profiler.driver import LoadConfig
from perfscope.profiler.store import read_run, scan_runs
from perfscope.profiler.telemetry import TelemetryConfig
from perfscope.profiler.workload import LengthDist, WorkloadConfig
from tests.reliability.helpers import all_files, can_mount, cli, fill, tmpfs

needs_mount = pytest.mark.skipif(not can_mount(), reason="needs root to mount a tmpfs")

BIG_RUN = (
    "run",
    "python:logged_engines:burst",
    "--requests",
    "3000",
    "--output-len",
    "64",
    "--mode",
    "online",
    "--concurrency",
    "8",
    "--no-progress",
    "--no-telemetry",
)


def _one_error_line(stderr: str, *words: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr, stderr
    hits = [ln for ln in lines if ln.startswith("error:")]
    assert len(hits) == 1, stderr
    for w in words:
        assert w in hits[0], hits[0]


@needs_mount
@pytest.mark.fault(
    fault="the disk fills during the run (real tmpfs)",
    before="not recorded (guard older than issue 26)",
    after="capture stops, exit 1, run `failed`/`crashed` with a reason",
    kept="more than 10 flushed requests with all 64 tokens; no `.tmp` files",
)
def test_disk_filling_during_the_run_stops_capture_and_keeps_what_was_flushed(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "disk", "3m") as disk:
        runs = disk / "runs"
        runs.mkdir()
        fill(disk, leave_bytes=400_000)
        res = cli(*BIG_RUN, runs=runs)
        assert res.returncode == 1, res.stderr
        _one_error_line(res.stderr, "disk is full", "what was flushed is kept")
        (run_dir,) = list(runs.iterdir())
        assert not [p for p in all_files(run_dir) if p.name.endswith(".tmp")]
        run = read_run(run_dir)
        ok = run.requests[run.requests["error"].isna()]
        assert len(ok) > 10  # what was flushed before the disk filled is there
        assert (ok["output_tokens"] == 64).all()
        assert run.state.state in ("failed", "crashed")
        (entry,) = scan_runs(runs)
        assert entry.state in ("failed", "crashed") and entry.reason


@needs_mount
@pytest.mark.fault(
    fault="the disk is full before the run starts",
    before="not recorded (guard older than issue 26)",
    after="one line, exit 1",
    kept="nothing captured yet; no half-made run folder",
)
def test_full_disk_before_the_run_is_one_line_and_leaves_no_run(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "256k") as disk:
        runs = disk / "runs"
        runs.mkdir()
        fill(disk, leave_bytes=0)
        res = cli(*BIG_RUN, runs=runs)
        assert res.returncode == 1, res.stderr
        _one_error_line(res.stderr, "cannot write", "disk is full")
        assert list(runs.iterdir()) == []


@needs_mount
@pytest.mark.fault(
    fault="the disk is full when `report`/`export` write",
    before="not recorded (guard older than issue 26)",
    after="exit 1 with an `error:` line, no traceback",
    kept="the run; no temporary file left on the full disk",
)
def test_full_disk_at_report_time_leaves_no_temp_file(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    res = cli(
        "run",
        "python:logged_engines:burst",
        "--requests",
        "4",
        "--output-len",
        "4",
        "--no-progress",
        "--no-report",
        runs=runs,
    )
    assert res.returncode == 0, res.stderr
    with tmpfs(tmp_path / "disk", "256k") as disk:
        fill(disk, leave_bytes=20_000)
        rep = cli("report", "latest", "-o", str(disk / "report.html"), runs=runs)
        assert rep.returncode == 1, rep.stderr
        _one_error_line(rep.stderr, "report.html", "disk is full")
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
        fill(disk, leave_bytes=0, name="filler2")
        exp = cli("export", "latest", "--format", "json", "-o", str(disk / "x.json"), runs=runs)
        assert exp.returncode == 1 and "Traceback" not in exp.stderr, exp.stderr
        assert "error:" in exp.stderr
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "filler2"]


@pytest.mark.fault(
    fault="a segment write hits ENOSPC (patched writer, no root needed)",
    before="not recorded (guard older than issue 26)",
    after="the run stops; manifest `failed` naming `disk is full`",
    kept="the flushed segments (part of the 400 requests); no `.tmp` files",
)
def test_a_failing_segment_write_stops_the_run_in_process(
    runs_dir: Path, engines_on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same path without root: the segment writer's third write hits ENOSPC."""
    real_write = segments._Stream.write
    calls = {"n": 0}

    def write(self: segments._Stream, batch: object) -> None:
        calls["n"] += 1
        if calls["n"] > 6:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real_write(self, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(segments._Stream, "write", write)
    opts = RunOptions(
        engine="python:logged_engines:logged_stream",
        workload=WorkloadConfig(requests=400, output_len=LengthDist("constant", 5)),
        load=LoadConfig(mode="online", concurrency=4),
        telemetry=TelemetryConfig(enabled=False),
        runs_dir=runs_dir,
    )
    with pytest.raises(StorageError, match="disk is full") as info:
        execute_run(opts)
    assert "what was flushed is kept" in str(info.value)
    (run_dir,) = list(runs_dir.iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert any("disk is full" in e for e in manifest["errors"])
    assert not (run_dir / "requests.parquet").exists()  # segments are the record
    run = read_run(run_dir)
    assert run.from_segments and 0 < len(run.requests) < 400
    assert not [p for p in all_files(run_dir) if p.name.endswith(".tmp")]
    shutil.rmtree(run_dir)
