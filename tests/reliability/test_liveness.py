"""The manifest's liveness record decides running vs crashed; ``latest`` skips live runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from perfscope.api.runner import RunOptions, execute_run
from perfscope.profiler.driver import LoadConfig
from perfscope.profiler.engines.base import EngineInfo, EngineOptions, Inbox
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.store import liveness_record, resolve_run_path, run_state, scan_runs
from perfscope.profiler.telemetry import TelemetryConfig
from perfscope.profiler.workload import LengthDist, WorkloadConfig
from tests.reliability.helpers import cli


def _manifest(process: dict[str, object] | None) -> dict[str, object]:
    m: dict[str, object] = {"status": "running", "run_id": "x", "errors": []}
    if process is not None:
        m["process"] = process
    return m


def test_a_live_writer_reads_as_running_and_a_dead_one_as_crashed() -> None:
    assert run_state(_manifest(liveness_record(0.5))).state == "running"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid is free
    dead = {**liveness_record(0.5), "pid": child.pid, "start_ticks": None}
    state = run_state(_manifest(dead))
    assert state.state == "crashed" and f"process {child.pid}" in state.reason


def test_a_reused_pid_does_not_pass_for_the_writer() -> None:
    rec = liveness_record(0.5)
    rec["start_ticks"] = int(rec["start_ticks"] or 0) + 12345  # "started at another time"
    assert run_state(_manifest(rec)).state == "crashed"


def test_another_hosts_run_is_crashed_only_once_its_heartbeat_is_stale() -> None:
    other = {**liveness_record(0.5), "host": "elsewhere-" + socket.gethostname()}
    assert run_state(_manifest(other)).state == "running"
    stale = {**other, "heartbeat_unix": time.time() - 3600}
    s = run_state(_manifest(stale))
    assert s.state == "crashed" and "no heartbeat" in s.reason


def test_a_running_manifest_without_liveness_reads_as_crashed() -> None:
    s = run_state(_manifest(None))
    assert s.state == "crashed" and "no live process" in s.reason


def test_latest_skips_a_run_still_being_written(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    res = cli(
        "run",
        "python:logged_engines:half_fail",
        "--requests",
        "4",
        "--output-len",
        "4",
        "--no-progress",
        "--no-report",
        runs=runs,
    )
    assert res.returncode == 0, res.stderr
    (done,) = list(runs.iterdir())
    live = runs / "29991231-235959-python-ffff"
    live.mkdir()
    # Written "by" this test process, which is alive: a run in progress.
    (live / "manifest.json").write_text(
        json.dumps({**_manifest(liveness_record(0.5)), "run_id": live.name})
    )
    assert resolve_run_path("latest", runs) == done
    states = {e.run_id: e.state for e in scan_runs(runs)}
    assert states == {done.name: "complete", live.name: "running"}
    ls = {e["run_id"]: e for e in json.loads(cli("ls", "--json", runs=runs).stdout)}
    assert ls[live.name]["state"] == "running"
    assert f"process {os.getpid()}" in ls[live.name]["reason"]


class _CloseFails:
    """A per-request engine whose close() raises (the run must still record it)."""

    def info(self) -> EngineInfo:
        return EngineInfo(uri="closefails", kind="closefails")

    def serve(self, inbox: Inbox, recorder: Recorder) -> None:
        while True:
            sub = inbox.get(timeout_s=0.2)
            if sub is None:
                if inbox.finished:
                    return
                continue
            sub.handle.tokens(sub.spec.max_output_tokens)
            sub.handle.finish()

    def close(self) -> None:
        raise RuntimeError("GPU context already gone")


def test_an_engine_close_failure_is_written_to_the_manifest(runs_dir: Path) -> None:
    out = execute_run(
        RunOptions(
            engine="closefails",
            workload=WorkloadConfig(requests=3, output_len=LengthDist("constant", 4)),
            load=LoadConfig(mode="batch"),
            telemetry=TelemetryConfig(enabled=False),
            runs_dir=runs_dir,
        ),
        engine_factory=lambda uri, opts: _CloseFails(),
    )
    assert out.status == "complete" and out.exit_code == 0
    manifest = json.loads((out.path / "manifest.json").read_text())
    assert "engine close failed: GPU context already gone" in manifest["errors"]
    assert manifest["process"]["exited"] is True
    assert not (out.path / "segments").exists()


_ = EngineOptions  # the factory signature takes (uri, EngineOptions)
