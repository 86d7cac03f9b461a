"""Cluster energy (``--ray`` telemetry agents): per-node power and memory, the cluster total,
and the nodes without a power reading named — from real samplers over scripted NVML."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from rich.console import Console

from perfscope.analysis import Summary
from perfscope.analysis.energy import energy_section
from perfscope.analysis.summary import Energy
from perfscope.dashboard.report import _energy_block
from perfscope.dashboard.terminal import energy_table
from perfscope.profiler.clock import ManualClock
from perfscope.profiler.telemetry import TelemetryConfig, start_telemetry
from perfscope.profiler.telemetry.testing import FakeGpu, FakeNvml, PowerSchedule

MS = 1_000_000
WINDOW = (200 * MS, 1200 * MS)  # the measured window: one request, 1 s
TOKENS = 50


def _node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str | None, watts: float | None
) -> pa.Table:
    """One node's samples every 10 ms over 0–1.4 s: a GPU drawing ``watts`` (None: no GPU,
    only the CPU sampler, without RAPL)."""
    clock = ManualClock()
    gpus: list[FakeGpu] = []
    if watts is not None:
        sched = PowerSchedule([(0, watts)])
        gpus = [FakeGpu(power_w=sched.power_w, energy_mj=sched.energy_mj)]
    FakeNvml(gpus, clock.now_ns).install(monkeypatch)
    cfg = TelemetryConfig(
        baseline_s=0.0,
        interval_s=0.05,
        cpu=watts is None,
        powercap_root=tmp_path / "no-rapl",
        node=name,
    )
    s = start_telemetry(clock, cfg, background=False)
    while clock.now_ns() < 1400 * MS:
        clock.advance_ns(10 * MS)
        s.sample_once()
    return s.stop()


def _requests() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": [0],
            "prompt_tokens": [8],
            "t_sent": [WINDOW[0]],
            "t_first_token": [WINDOW[0] + 50 * MS],
            "t_last_token": [WINDOW[1]],
            "output_tokens": [TOKENS],
            "is_warmup": [False],
            "error": [None],
        }
    )


def _section(tele: pa.Table) -> Energy:
    return energy_section(tele.to_pandas(), pd.DataFrame(), _requests(), pd.DataFrame(), {})


@pytest.mark.parametrize(
    ("nodes", "counted"),
    [
        ({"a": 300.0, "b": 200.0}, ["a", "b"]),
        ({"a": 300.0, "b": None}, ["a"]),
    ],
)
def test_energy_per_token_is_the_cluster_total_and_names_nodes_without_power(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    nodes: dict[str, float | None],
    counted: list[str],
) -> None:
    tele = pa.concat_tables([_node(monkeypatch, tmp_path, n, w) for n, w in nodes.items()])
    sec = _section(tele)
    window_s = (WINDOW[1] - WINDOW[0]) / 1e9
    truth = sum(w for w in nodes.values() if w is not None) * window_s
    assert sec.available and sec.source == "gpu"
    assert sec.total_j == pytest.approx(truth, rel=1e-6)
    assert sec.j_per_output_token == pytest.approx(truth / TOKENS, rel=1e-6)
    assert sec.devices == tuple(f"{n}/gpu0" for n in counted)
    cluster = sec.cluster
    assert cluster is not None
    assert list(cluster.nodes) == sorted(nodes)
    assert list(cluster.nodes_with_power) == counted
    missing = [n for n in nodes if n not in counted]
    assert list(cluster.nodes_without_power) == missing
    assert cluster.energy_j == pytest.approx(truth, rel=1e-6)
    per = sec.nodes
    for n, w in nodes.items():
        if w is None:
            assert per[n].energy_j is None and per[n].power_source is None
            assert per[n].gpus == 0
            # Memory is still reported for a node without power (the host's own reading).
            assert per[n].system_mem_used_peak_bytes > 0
        else:
            assert per[n].energy_j == pytest.approx(w * window_s, rel=1e-6)
            assert per[n].avg_power_w == pytest.approx(w, rel=1e-6)
            assert per[n].peak_power_w == pytest.approx(w, rel=1e-6)
            assert per[n].gpu_mem_used_peak_bytes == pytest.approx(20e9)
            assert sec.memory[f"{n}/gpu0"].peak_used_bytes == pytest.approx(20e9)
    note = next(t for t in sec.notes if "cluster total" in t)
    assert f"{len(counted)} of {len(nodes)} nodes" in note
    if missing:
        assert f"no power reading on {missing[0]}" in note

    out = io.StringIO()
    Console(file=out, width=160).print(energy_table(sec))
    text = out.getvalue()
    for n in nodes:
        assert f"node {n}" in text
    assert "cluster (2 nodes)" in text
    assert ("no power" in text) == bool(missing)
    html = _energy_block(Summary(energy=sec))
    assert "Per node" in html and all(f"<td>{n}</td>" in html for n in nodes)
    assert ("no power reading" in html) == bool(missing)


def test_a_single_host_run_has_no_node_breakdown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tele = _node(monkeypatch, tmp_path, None, 300.0)
    assert tele.column("node").null_count == tele.num_rows
    sec = _section(tele)
    assert sec.devices == ("gpu0",)
    assert not sec.nodes and sec.cluster is None
    assert not any("cluster" in n for n in sec.notes)
