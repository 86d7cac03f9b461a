"""The manifest's liveness record decides running vs crashed; ``latest`` skips live runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfscope.api.runner import RunOptions, execute_run
from perfscope.profiler.driver import LoadConfig
from perfscope.profiler.engines.base import EngineInfo, EngineOptions, Inbox
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.store import liveness_record, resolve_run_path, run_state, scan_runs
from perfscope.profiler.telemetry import TelemetryConfig
from perfscope.profiler.workload import LengthDist, WorkloadConfig
from tests.reliability.helpers import cli, wait_for


def _manifest(process: dict[str, object] | None) -> dict[str, object]:
    m: dict[str, object] = {"status": "running", "run_id": "x", "errors": []}
    if process is not None:
        m["process"] = process
    return m


@pytest.mark.fault(
    fault="the writer process is alive, then dies",
    before="not recorded (guard older than issue 26)",
    after="`running` while alive, `crashed` naming the pid after",
    kept="a judgement only: nothing is written",
)
def test_a_live_writer_reads_as_running_and_a_dead_one_as_crashed() -> None:
    assert run_state(_manifest(liveness_record(0.5))).state == "running"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid is free
    dead = {**liveness_record(0.5), "pid": child.pid, "start_ticks": None}
    state = run_state(_manifest(dead))
    assert state.state == "crashed" and f"process {child.pid}" in state.reason


@pytest.mark.fault(
    fault="the writer's pid reused by another process",
    before="not recorded (guard older than issue 26)",
    after="`crashed` (the process is not the writer)",
    kept="a judgement only: nothing is written",
)
def test_a_reused_pid_does_not_pass_for_the_writer() -> None:
    rec = liveness_record(0.5)
    rec["start_ticks"] = int(rec["start_ticks"] or 0) + 12345  # "started at another time"
    assert run_state(_manifest(rec)).state == "crashed"


#: A real run writer (the store's RunWriter, beating every 0.1 s) in a process that says it
#: is another host and whose wall clock is off by argv[2] seconds.
_REMOTE_WRITER = """
import socket, sys, time
from datetime import UTC, datetime
from pathlib import Path

skew, real_time = float(sys.argv[2]), time.time
time.time = lambda: real_time() + skew
socket.gethostname = lambda: "elsewhere-" + sys.argv[3]
from perfscope.profiler.records import Manifest
from perfscope.profiler.store import RunWriter

w = RunWriter.create(Path(sys.argv[1]), Manifest(name="remote"), datetime.now(UTC), 0.1)
print(w.path, flush=True)
while True:
    time.sleep(0.1)
    w.heartbeat()
"""


def _remote_writer(runs: Path, skew_s: float) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _REMOTE_WRITER, str(runs), str(skew_s), socket.gethostname()],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def _read(run: Path) -> dict[str, object]:
    for _ in range(50):  # the writer replaces the file atomically; a read never sees half
        m = json.loads((run / "manifest.json").read_text())
        if isinstance(m, dict):
            return m
    raise AssertionError("no manifest")


def _seq(run: Path) -> int:
    proc = _read(run)["process"]
    assert isinstance(proc, dict)
    return int(proc["heartbeat_seq"])


@pytest.mark.fault(
    fault="another host's run, its wall clock skewed",
    before="a dead run read `running` for hours (issue 26)",
    after="judged by the heartbeat's sequence and this host's monotonic clock",
    kept="a judgement only: nothing is written",
)
def test_another_hosts_run_is_judged_by_its_heartbeat_sequence_not_its_skewed_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfscope.profiler import store

    monkeypatch.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "_WATCHED", {})
    runs = tmp_path / "runs"
    runs.mkdir()
    # Alive with a clock 3 h behind (wall clocks said crashed), dead with one 3 h ahead
    # (wall clocks said running for 3 h).
    alive, alive_run = _remote_writer(runs, -3 * 3600)
    dead, dead_run = _remote_writer(runs, 3 * 3600)
    try:
        wait_for(lambda: _seq(dead_run) >= 2 and _seq(alive_run) >= 2, 30, "heartbeats")
        dead.kill()
        dead.wait()
        window = 1.0
        first = {r: run_state(_read(r), stale_after_s=window) for r in (alive_run, dead_run)}
        for s in first.values():  # a first look cannot know: it says so
            assert s.state == "running" and "heartbeat not confirmed yet" in s.reason, s
        # A one-shot reader in another process remembers this look (the user's cache).
        monkeypatch.setattr(store, "_WATCHED", {})
        time.sleep(window + 0.5)
        alive_now = run_state(_read(alive_run), stale_after_s=window)
        assert alive_now.state == "running" and "advancing" in alive_now.reason, alive_now
        dead_now = run_state(_read(dead_run), stale_after_s=window)
        assert dead_now.state == "crashed", dead_now
        assert "has not advanced for" in dead_now.reason and "elsewhere-" in dead_now.reason
        # The listing's window is 60 s: until then it says what it knows, not "crashed".
        listed = {e.path: e for e in scan_runs(runs)}
        assert listed[dead_run].state == "running"
        assert "not confirmed yet" in str(listed[dead_run].reason)
        assert "unchanged for" in str(listed[dead_run].reason)
    finally:
        alive.kill()
        dead.kill()
        alive.wait()


@pytest.mark.fault(
    fault="a `running` manifest with no liveness record",
    before="not recorded (guard older than issue 26)",
    after="`crashed`, `no live process`",
    kept="a judgement only: nothing is written",
)
def test_a_running_manifest_without_liveness_reads_as_crashed() -> None:
    s = run_state(_manifest(None))
    assert s.state == "crashed" and "no live process" in s.reason


@pytest.mark.fault(
    fault="`latest` while another run is still being written",
    before="not recorded (guard older than issue 26)",
    after="`latest` is the complete run; `ls` shows the live one `running`",
    kept="both runs listed",
)
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


@pytest.mark.fault(
    fault="the engine's close raises",
    before="not recorded (guard older than issue 26)",
    after="the error in the manifest; run `complete`, exit 0",
    kept="the complete run; no segments left",
)
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
