"""A process using the manual API (``perfscope.profile``) that is killed keeps what it
captured: the same segments and liveness record as ``perfscope run``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perfscope.profiler.store import read_run
from tests.conftest import subprocess_env
from tests.reliability.helpers import cli, wait_for

# Six requests of 5 tokens each, then a marker file, then a long wait inside the block.
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import perfscope

    runs, marker = sys.argv[1], Path(sys.argv[2])
    with perfscope.profile(name="manual-kill", runs_dir=runs) as p:
        for i in range(6):
            with p.request(prompt_tokens=8, max_output_tokens=5) as r:
                for _ in range(5):
                    time.sleep(0.002)
                    r.tokens(1)
        marker.write_text(str(time.time()))
        time.sleep(120)
    """
)


@pytest.mark.fault(
    fault="a manual-API (`perfscope.profile`) process killed by SIGKILL",
    before="not recorded (guard older than issue 26)",
    after="the run reads `crashed` and partial; `show` works",
    kept="all 6 requests with 5 tokens each, and their chunks",
)
def test_a_manual_api_process_killed_by_sigkill_keeps_its_requests(tmp_path: Path) -> None:
    runs, marker = tmp_path / "runs", tmp_path / "done"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(runs), str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        wait_for(marker.exists, timeout=120, what="the child's six requests")
        (run_dir,) = list(runs.iterdir())
        running = json.loads((run_dir / "manifest.json").read_text())
        assert running["status"] == "running"
        assert running["process"]["pid"] == proc.pid
        time.sleep(1.5)  # three flush intervals: the last request is on disk
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "requests.parquet").exists()  # never compacted: segments only

    run = read_run(run_dir)
    assert run.state.state == "crashed" and run.partial
    ok = run.requests[run.requests["error"].isna()]
    assert sorted(ok["request_id"]) == list(range(6))
    assert (ok["output_tokens"] == 5).all()
    assert (run.chunks.groupby("request_id")["n_tokens"].sum() == 5).all()

    show = cli("show", run_dir.name, "--json", runs=runs)
    assert show.returncode == 0, show.stderr
    summary = json.loads(show.stdout)
    assert summary["status"] == "crashed"
    assert summary["counts"]["completed"] == 6
    assert "crashed" in show.stderr and "partial" in show.stderr


@pytest.mark.fault(
    fault="a manual-API run that ends normally (the control case)",
    before="not recorded (guard older than issue 26)",
    after="`complete`, segments removed",
    kept="the final tables",
)
def test_a_manual_run_that_ends_normally_leaves_no_segments(tmp_path: Path) -> None:
    import perfscope

    with perfscope.profile(name="manual-ok", runs_dir=tmp_path) as p:
        assert p.path is not None and (p.path / "segments").is_dir()
        with p.request(prompt_tokens=4, max_output_tokens=3) as r:
            r.tokens(3)
    assert p.path is not None
    assert not (p.path / "segments").exists()
    manifest = json.loads((p.path / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["process"]["exited"] is True
    assert p.run.path == p.path
