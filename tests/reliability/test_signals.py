"""SIGTERM, SIGHUP, SIGINT and SIGKILL on a real ``perfscope run`` at a random moment."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from perfscope.profiler.store import read_run
from tests.conftest import PERFSCOPE, subprocess_env
from tests.reliability.helpers import cli, logged_ends, start_run, wait_for

RUN_ARGS = (
    "python:logged_engines:logged_stream",
    "--requests",
    "5000",
    "--output-len",
    "10",
    "--mode",
    "online",
    "--concurrency",
    "4",
    "--no-telemetry",
)


def _started(runs: Path, log: Path) -> Path:
    wait_for(lambda: bool(list(runs.glob("*/manifest.json"))), what="the run to start")
    wait_for(lambda: log.exists(), what="a first request to finish")
    (run_dir,) = list(runs.iterdir())
    return run_dir


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.fault(
    fault="SIGTERM or SIGHUP at a random moment",
    before="not recorded (guard older than issue 26)",
    after="stops like Ctrl-C: exit 1, `interrupted by SIG...`",
    kept="every request that ended before the signal, with 10 tokens",
)
def test_sigterm_and_sighup_stop_the_run_like_ctrl_c(tmp_path: Path, sig: signal.Signals) -> None:
    runs, log = tmp_path / "runs", tmp_path / "ends.log"
    proc = start_run(runs, *RUN_ARGS, "--no-report", log=log)
    run_dir = _started(runs, log)
    time.sleep(random.uniform(0.5, 2.5))
    t_sig = time.time()
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert f"interrupted by {sig.name}" in err and "Traceback" not in err
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert f"interrupted by {sig.name}" in manifest["errors"]
    assert not (run_dir / "segments").exists()  # compacted, segments removed
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    ok = reqs[reqs["error"].isna()]
    ended = logged_ends(log)
    before = {rid for rid, t in ended.items() if t < t_sig}
    assert before and before <= set(ok["request_id"])
    assert (ok["output_tokens"] == 10).all()
    assert set(reqs.loc[reqs["error"].notna(), "error"]) <= {"interrupted"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"


@pytest.mark.fault(
    fault="Ctrl-C twice",
    before="not recorded (guard older than issue 26)",
    after="exit 1, `interrupted`, no traceback",
    kept="requests.parquet written; no temporary files",
)
def test_sigint_twice_still_writes_everything(tmp_path: Path) -> None:
    runs, log = tmp_path / "runs", tmp_path / "ends.log"
    proc = start_run(runs, *RUN_ARGS, log=log)
    run_dir = _started(runs, log)
    time.sleep(random.uniform(0.5, 1.5))
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # the impatient second Ctrl-C
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "interrupted"
    assert len(pd.read_parquet(run_dir / "requests.parquet")) > 0
    assert not list(run_dir.glob(".*.tmp"))


@pytest.mark.fault(
    fault="SIGKILL at a random moment",
    before="not recorded (guard older than issue 26)",
    after="the run reads `crashed` and partial",
    kept="every request completed a second before the kill, with 10 tokens",
)
def test_sigkill_keeps_every_request_completed_a_second_before(tmp_path: Path) -> None:
    runs, log = tmp_path / "runs", tmp_path / "ends.log"
    proc = start_run(runs, *RUN_ARGS, log=log)
    run_dir = _started(runs, log)
    time.sleep(random.uniform(1.0, 4.0))
    t_kill = time.time()
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "requests.parquet").exists()  # nothing was compacted: segments only

    run = read_run(run_dir)
    assert run.state.state == "crashed"
    assert run.manifest["status"] == "crashed" and run.partial
    ended = logged_ends(log)
    due = {rid for rid, t in ended.items() if t < t_kill - 1.0}
    assert len(due) >= 4
    ok = run.requests[run.requests["error"].isna()].set_index("request_id")
    missing = due - set(ok.index)
    assert not missing, f"{len(missing)} requests completed >1 s before the kill were lost"
    assert (ok.loc[sorted(due), "output_tokens"] == 10).all()
    per_req = run.chunks.groupby("request_id")["n_tokens"].sum()
    assert (per_req.loc[sorted(due)] == 10).all()


@pytest.mark.fault(
    fault="a SIGKILLed run read by ls, show and report",
    before="not recorded (guard older than issue 26)",
    after="`crashed` everywhere with a partial warning; nothing writes into it",
    kept="its completed requests, counted",
)
@pytest.mark.slow  # about 6 s on a quiet 2-core machine
def test_a_killed_run_reads_as_crashed_everywhere_and_nothing_writes_into_it(
    tmp_path: Path,
) -> None:
    runs, log = tmp_path / "runs", tmp_path / "ends.log"
    proc = start_run(runs, *RUN_ARGS, log=log)
    run_dir = _started(runs, log)
    time.sleep(1.5)
    proc.kill()
    proc.communicate(timeout=60)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))

    ls = cli("ls", "--json", runs=runs)
    assert ls.returncode == 0, ls.stderr
    (entry,) = json.loads(ls.stdout)
    assert entry["state"] == "crashed" and "is gone" in entry["reason"]
    table = cli("ls", runs=runs)
    assert "crashed" in table.stdout and "gone" in table.stdout

    show = cli("show", "latest", "--json", runs=runs)
    assert show.returncode == 0, show.stderr
    summary = json.loads(show.stdout)
    assert summary["status"] == "crashed"
    assert summary["counts"]["completed"] > 0
    assert any("crashed" in w and "partial" in w for w in summary["warnings"])
    assert "crashed" in show.stderr and "partial" in show.stderr

    analyze = cli("analyze", "--json", runs=runs)
    assert analyze.returncode == 0 and json.loads(analyze.stdout)["status"] == "crashed"
    report = cli("report", "-o", str(tmp_path / "r.html"), runs=runs)
    assert report.returncode == 0, report.stderr
    assert "crashed" in (tmp_path / "r.html").read_text()
    export = cli("export", "--format", "json", "-o", "-", runs=runs)
    assert export.returncode == 0, export.stderr
    assert '"crashed"' in export.stdout

    after = sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    assert after == before  # reading never writes (no summary.json appeared)

    from perfscope.dashboard.app.data import RunRepository

    (row,) = RunRepository(runs).rows()
    assert row.status == "crashed" and row.state == "partial" and "gone" in (row.problem or "")


@pytest.mark.fault(
    fault="SIGKILL while telemetry is sampled",
    before="not recorded (guard older than issue 26)",
    after="telemetry read back from the segments",
    kept="20 or more CPU samples, times increasing",
)
def test_sigkill_keeps_the_telemetry_flushed_during_the_run(tmp_path: Path) -> None:
    runs, log = tmp_path / "runs", tmp_path / "ends.log"
    args = [a for a in RUN_ARGS if a != "--no-telemetry"]
    proc = start_run(runs, *args, "--telemetry-interval", "20ms", log=log)
    run_dir = _started(runs, log)
    time.sleep(2.0)
    proc.kill()
    proc.communicate(timeout=60)
    run = read_run(run_dir)
    assert "telemetry" in run.from_segments
    cpu = run.telemetry[run.telemetry["device"] == "cpu"]
    assert len(cpu) >= 20  # 20 ms sampling for > 1.5 s, flushed every 0.5 s
    assert cpu["t"].is_monotonic_increasing and cpu["t"].is_unique


@pytest.mark.fault(
    fault="Ctrl-C mid-run",
    before="not recorded (guard older than issue 26)",
    after="exit 1, status `interrupted`",
    kept="4 or more completed requests with all 10 tokens; the rest `interrupted`",
)
def test_sigint_mid_run_keeps_completed_requests_and_exits_1(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            *PERFSCOPE,
            "run",
            "python:timed_engines:slow_stream",
            "--requests",
            "200",
            "--output-len",
            "10",
            "--mode",
            "online",
            "--concurrency",
            "2",
            "--no-progress",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(PERFSCOPE_RUNS_DIR=str(tmp_path)),
    )
    deadline = time.monotonic() + 60
    # Wait for the manifest (the run has started), then for some requests to finish.
    while not list(tmp_path.glob("*/manifest.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "interrupted" in err
    (run_dir,) = list(tmp_path.iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    completed = reqs[reqs["error"].isna()]
    assert len(completed) >= 4
    assert (completed["output_tokens"] == 10).all()
    assert set(reqs.loc[reqs["error"].notna(), "error"]) <= {"interrupted"}
    summary = json.loads(out)
    assert summary["status"] == "interrupted"
    assert summary["counts"]["completed"] == len(completed)
