"""Ctrl-C during sampling: the telemetry captured so far is kept."""

from __future__ import annotations

import _thread
import threading
import time

import pytest
import torch

from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.telemetry import TelemetryConfig, start_telemetry


@pytest.mark.fault(
    fault="KeyboardInterrupt while telemetry samples",
    before="not recorded (guard older than issue 26)",
    after="stop returns the table; a second stop is harmless",
    kept="every sample taken (5 or more; stop adds the last)",
)
def test_keyboard_interrupt_during_a_workload_keeps_the_samples() -> None:
    clock = MonotonicClock()
    session = start_telemetry(clock, TelemetryConfig(interval_s=0.02, baseline_s=0.0))
    # Deliver a real KeyboardInterrupt to this (main) thread, as Ctrl-C would.
    timer = threading.Timer(0.4, _thread.interrupt_main)
    timer.start()
    snapshot_rows = -1
    interrupted = False
    a = torch.randn(256, 256)
    try:
        deadline = time.perf_counter() + 10.0
        while time.perf_counter() < deadline:
            a = torch.tanh(a @ a)
    except KeyboardInterrupt:
        # What the run loop does on Ctrl-C: flush what is buffered, then stop.
        interrupted = True
        snapshot_rows = session.snapshot().num_rows
    finally:
        table = session.stop()
    assert interrupted
    timer.cancel()
    assert snapshot_rows >= 5
    assert table.num_rows >= snapshot_rows  # stop adds the final sample, loses nothing
    df = table.to_pandas()
    assert df["t"].max() >= 0.3e9
    assert session.stop() is table  # a second stop (e.g. from a finally) is harmless
    assert not session.running
    assert session.manifest_info()["status"] == "stopped"


@pytest.mark.fault(
    fault="KeyboardInterrupt while the idle baseline is taken",
    before="not recorded (guard older than issue 26)",
    after="NVML shut down as often as it was initialised",
    kept="nothing sampled yet to keep",
)
def test_interrupt_while_taking_the_baseline_releases_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from perfscope.profiler.clock import ManualClock
    from perfscope.profiler.telemetry.testing import FakeGpu, FakeNvml

    clock = ManualClock()
    fake = FakeNvml([FakeGpu(energy_mj=lambda t: t // 10_000)], clock.now_ns)
    fake.install(monkeypatch)
    calls = {"n": 0}
    real_sleep = clock.sleep_until_ns

    def sleep_then_interrupt(t: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        real_sleep(t)

    monkeypatch.setattr(clock, "sleep_until_ns", sleep_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        start_telemetry(clock, TelemetryConfig(baseline_s=1.0, cpu=False), background=False)
    assert fake.init_calls == fake.shutdown_calls == 1
