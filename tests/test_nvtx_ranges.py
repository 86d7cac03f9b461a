"""perfscope's NVTX ranges: off without a tool, switchable, right domain/colours/nesting."""

from __future__ import annotations

from typing import Any

import pytest

from perfscope.profiler import nvtx_ranges as nr


class _RecordingDomain:
    """Stands in for the NVTX domain an attached tool (Nsight Systems) would provide."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.depth = 0

    def get_category_id(self, name: str) -> int:
        return {"run": 1, "request": 2, "step": 3}[name]

    def push_range(self, attributes: Any = None, **kw: Any) -> None:
        self.depth += 1
        self.events.append(("push", kw))

    def pop_range(self) -> None:
        self.depth -= 1
        self.events.append(("pop", None))


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> _RecordingDomain:
    dom = _RecordingDomain()
    monkeypatch.setattr(nr, "_domain", dom)
    monkeypatch.setattr(nr, "_categories", {})
    monkeypatch.setattr(nr, "_enabled", None)
    return dom


def test_ranges_are_off_without_a_tool_attached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    monkeypatch.setattr(nr, "_enabled", None)
    assert nr.tool_attached() is False
    assert nr.is_enabled() is False
    assert nr.push_step("decode", 1) is False
    with nr.step_range("decode", 1), nr.request_range(3, "prefill"), nr.run_range("r"):
        pass


def test_enabled_ranges_nest_with_phase_colours_and_payload(recording: _RecordingDomain) -> None:
    nr.set_enabled(True)
    with nr.run_range("run-1"):
        with nr.request_range(7, "prefill"), nr.step_range("prefill", 0):
            assert recording.depth == 3
        with nr.step_range("decode", 1):
            pass
    assert recording.depth == 0
    pushes = [kw for kind, kw in recording.events if kind == "push"]
    assert pushes[0] == {"message": "run run-1", "color": nr.PHASE_COLORS["run"], "category": 1}
    assert pushes[1]["message"] == "request 7 prefill"
    assert pushes[1]["category"] == 2
    assert pushes[2] == {
        "message": "prefill",
        "color": nr.PHASE_COLORS["prefill"],
        "category": 3,
        "payload": 0,
    }
    assert pushes[3]["color"] == nr.PHASE_COLORS["decode"]
    assert pushes[3]["payload"] == 1
    assert nr.PHASE_COLORS["prefill"] != nr.PHASE_COLORS["decode"]


def test_range_is_popped_when_the_step_raises(recording: _RecordingDomain) -> None:
    nr.set_enabled(True)
    with pytest.raises(RuntimeError), nr.step_range("decode", 5):
        raise RuntimeError("engine failed")
    assert recording.depth == 0


def test_push_pop_functions_pair_up(recording: _RecordingDomain) -> None:
    nr.set_enabled(True)
    if nr.push_step("mixed", 3):
        nr.pop_range()
    if nr.push_request(1, "decode"):
        nr.pop_range()
    assert recording.depth == 0
    assert len(recording.events) == 4
    nr.set_enabled(False)
    assert nr.push_step("decode", 4) is False
    assert len(recording.events) == 4


def test_enabled_without_a_tool_goes_through_the_real_nvtx_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nr, "_domain", None)
    monkeypatch.setattr(nr, "_categories", {})
    nr.set_enabled(True)
    try:
        with nr.run_range("x"), nr.step_range("decode", 1):
            pass
    finally:
        nr.set_enabled(False)


def test_disabled_ranges_never_reach_the_nvtx_domain(recording: _RecordingDomain) -> None:
    # What they cost per call is measured by benchmarks/timing_targets.py (nvtx).
    nr.set_enabled(False)
    for i in range(1000):
        with nr.step_range("decode", i), nr.request_range(i, "decode"), nr.run_range("r"):
            pass
    assert recording.events == []
