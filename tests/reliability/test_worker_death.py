"""``--engine-opt workers=2``: a worker process killed mid-run does not end the run with an
empty ``EOFError``; its requests in flight fail naming the worker, the rest complete."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from perfscope.profiler.store import read_run
from tests.reliability.helpers import start_run, wait_for
from tests.reliability.hostile import base_url, hostile_server

pytestmark = pytest.mark.slow


def _workers(pid: int) -> list[psutil.Process]:
    out = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "multiprocessing" in " ".join(child.cmdline()) and "spawn_main" in " ".join(
                child.cmdline()
            ):
                out.append(child)
        except psutil.Error:
            continue
    return out


@pytest.mark.fault(
    fault="a `workers=2` worker process SIGKILLed mid-run",
    before="the run ended with an empty `EOFError: ` (issue 26)",
    after="its requests fail naming the pid and `died (signal 9)`",
    kept="every request row; the others complete with 5 tokens",
)
def test_a_killed_worker_fails_only_its_requests_and_is_named(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    n = 8
    with hostile_server(["slow"]) as srv:
        proc = start_run(
            runs,
            f"openai:{base_url(srv)}",
            "--model", "m", "--no-preflight", "--warmup", "0",
            "--requests", str(n), "--concurrency", "4", "--output-len", "5",
            "--timeout", "60", "--no-report", "--engine-opt", "workers=2",
        )  # fmt: skip
        try:
            wait_for(lambda: len(srv.served) >= 2, timeout=180, what="requests in flight")
            workers = _workers(proc.pid)
            assert len(workers) == 2, workers
            os.kill(workers[0].pid, signal.SIGKILL)
            killed = workers[0].pid
            out, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = out + err
    assert "EOFError" not in text and "Traceback" not in text, text[-3000:]
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    req = read_run(run_dir).requests
    assert len(req) == n, "every request recorded"
    lost = [e for e in req["error"] if isinstance(e, str)]
    assert lost, "the killed worker had requests in flight"
    assert all(f"pid {killed}" in e and "died (signal 9)" in e for e in lost), lost
    assert all("perfscope-openai-worker-" in e for e in lost)
    ok = req[req["error"].isna()]
    assert len(ok) >= 1 and (ok["output_tokens"] == 5).all(), "the live worker's requests kept"
