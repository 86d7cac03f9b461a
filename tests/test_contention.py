"""Runs say when other processes competed for the CPU while they were measured."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

import pytest

from perfscope.analysis.summary import run_warnings
from perfscope.profiler.contention import ContentionMeter

SPIN = "import time; end = time.time() + 2.0\nwhile time.time() < end: pass"


def test_cpu_used_by_other_processes_is_measured() -> None:
    meter = ContentionMeter().start()
    # Detached through a shell so they are not our children: a child's CPU time counts as
    # the run's own (engines may spawn workers), a stranger's does not. They stop by
    # themselves after 2 s.
    spin = f"{sys.executable} -c {shlex.quote(SPIN)} &"
    subprocess.run(["sh", "-c", spin + spin], check=True)
    time.sleep(1.5)
    c = meter.stop()
    assert c["window_s"] == pytest.approx(1.5, abs=0.5)
    # Two spinning processes on this machine's cores: well over the warning threshold,
    # while this (sleeping) process used almost nothing.
    assert c["others_share"] > 0.3
    assert c["own_cpu_s"] < 0.5
    assert run_warnings({"host": {"contention": c}})


def test_warnings_only_when_the_share_is_large() -> None:
    quiet = {
        "others_share": 0.02,
        "steal_share": 0.0,
        "others_cpu_s": 0.1,
        "window_s": 5.0,
        "cpu_count": 2,
    }
    busy = {**quiet, "others_share": 0.6, "others_cpu_s": 6.0}
    assert run_warnings({"host": {"contention": quiet}}) == []
    (msg,) = run_warnings({"host": {"contention": busy}})
    assert "other processes used 60%" in msg
    assert run_warnings({}) == []


def test_perfscopes_own_helpers_and_start_up_are_not_counted_as_others() -> None:
    meter = ContentionMeter().start()
    time.sleep(0.3)  # "start-up": left out by restart()
    meter.restart()
    # A stand-in load actor, detached (not our child, so not our own CPU time already).
    out = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c {shlex.quote(SPIN)} >/dev/null 2>&1 & echo $!"],
        check=True,
        capture_output=True,
        text=True,
    )
    pid = int(out.stdout.strip())
    meter.add_own([pid])
    time.sleep(1.5)
    c = meter.stop()
    assert c["helper_pids"] == [pid]
    assert c["excluded_s"] == pytest.approx(0.3, abs=0.25)
    # The helper spun through the whole window; its CPU is counted apart, never as "others".
    assert c["helper_cpu_s"] is not None and c["helper_cpu_s"] > 0.0
    # /proc/stat counts in ticks of 10 ms per CPU and the window is read a moment apart from
    # them: on a machine that others keep busy the bound is met only to within a few ticks.
    ticks = 0.01 * (c["cpu_count"] + 2)
    room = c["window_s"] * c["cpu_count"] - c["helper_cpu_s"]
    assert c["others_cpu_s"] <= max(0.0, room) + ticks
