"""Real ``perfscope`` processes for the reliability tests, and ways to read what they left."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import PERFSCOPE, subprocess_env


def cli(
    *args: str, runs: Path, timeout: float = 240, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``perfscope ARGS`` to the end."""
    return subprocess.run(
        [*PERFSCOPE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(PERFSCOPE_RUNS_DIR=str(runs), **env),
    )


def start_run(runs: Path, *args: str, log: Path | None = None) -> subprocess.Popen[str]:
    """Start ``perfscope run ARGS`` (no progress bar, no report) in the background."""
    extra = {"PERFSCOPE_TEST_LOG": str(log)} if log else {}
    return subprocess.Popen(
        [*PERFSCOPE, "run", *args, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(PERFSCOPE_RUNS_DIR=str(runs), **extra),
    )


def wait_for(cond: Callable[[], bool], timeout: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def logged_ends(log: Path) -> dict[int, float]:
    """request id → wall time its engine call ended (from the engine's own log)."""
    if not log.exists():
        return {}
    out: dict[int, float] = {}
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[int(parts[0])] = float(parts[1])
    return out


def all_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``path`` (root only), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def can_mount() -> bool:
    """True when this process may mount a tmpfs (root in a namespace that allows it)."""
    if not is_root():
        return False
    probe = Path(f"/tmp/perfscope-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    ok = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True
        ).returncode
        == 0
    )
    if ok:
        subprocess.run(["umount", str(probe)], check=False)
    probe.rmdir()
    return ok


def fill(dirpath: Path, leave_bytes: int, name: str = "filler") -> None:
    """Fill the file system of ``dirpath`` until about ``leave_bytes`` are free."""
    st = os.statvfs(dirpath)
    free = st.f_bavail * st.f_frsize
    with open(dirpath / name, "wb") as f:
        f.write(b"\0" * max(0, free - leave_bytes))
