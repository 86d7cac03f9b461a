"""Exports: Perfetto/Chrome trace JSON validates; CSV and JSON hold the run's numbers."""

from __future__ import annotations

import gzip
import io
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.metrics import per_request
from perfscope.cli import main
from perfscope.dashboard import exporters
from perfscope.dashboard.exporters import pack_lanes, perfetto_trace, requests_frame
from perfscope.profiler.store import StoredRun, read_run
from tests.data.runs.builders import EVIL, manual_run, small_model, synthetic_run

PHASES = {"X", "B", "E", "i", "I", "C", "M", "s", "t", "f", "b", "n", "e"}


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        yield


@pytest.fixture(scope="module")
def steps_run(tmp_path_factory: pytest.TempPathFactory, cache_env: None) -> StoredRun:
    root = tmp_path_factory.mktemp("export-runs")
    return read_run(
        manual_run(
            root, n_requests=10, concurrency=4, fail_every=5, error_text=EVIL, model=small_model()
        )
    )


@pytest.fixture(scope="module")
def http_run(tmp_path_factory: pytest.TempPathFactory, cache_env: None) -> StoredRun:
    return read_run(synthetic_run(tmp_path_factory.mktemp("export-http"), 500))


def validate_trace(trace: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Check a trace as Perfetto's JSON importer reads it; returns X slices per track."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    events = trace["traceEvents"]
    named_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_tids = {
        (e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        assert isinstance(e["name"], str) and e["name"]
        if e["ph"] == "M":
            assert isinstance(e["args"]["name"], str)
            continue
        assert e["pid"] in named_pids, f"process {e['pid']} has no name"
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], int | float) and e["dur"] >= 0, e
            assert (e["pid"], e["tid"]) in named_tids, f"thread {e['tid']} has no name"
            tracks[(e["pid"], e["tid"])].append(e)
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, int | float) for v in e["args"].values()), e
        elif e["ph"] in ("i", "I"):
            assert e.get("s", "t") in ("t", "p", "g")
    # Slices on one track must nest (Perfetto converts µs to integer ns on import).
    for key, slices in tracks.items():
        spans = sorted(
            (
                (round(s["ts"] * 1000), round((s["ts"] + s["dur"]) * 1000), s["name"])
                for s in slices
            ),
            key=lambda x: (x[0], -x[1]),
        )
        stack: list[tuple[int, int, str]] = []
        for a, b, name in spans:
            while stack and stack[-1][1] <= a:
                stack.pop()
            if stack:
                assert b <= stack[-1][1], f"{name} [{a}, {b}] overlaps {stack[-1]} on {key}"
            stack.append((a, b, name))
    return tracks


def test_perfetto_trace_validates_and_nests(steps_run: StoredRun) -> None:
    trace = perfetto_trace(steps_run)
    tracks = validate_trace(trace)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert any(n.startswith("requests (") for n in names)
    assert any(n.startswith("engine") for n in names)
    assert "forward passes" in names
    # Every request has exactly one request slice, with its phases nested inside.
    req_slices = [s for v in tracks.values() for s in v if s["cat"] == "request"]
    assert len(req_slices) == len(steps_run.requests)
    kinds = {s["name"] for v in tracks.values() for s in v}
    assert {"queue", "prefill", "decode"} <= kinds
    # Steps: one slice per step on the engine process.
    steps = [s for v in tracks.values() for s in v if s["cat"] == "step"]
    assert len(steps) == len(steps_run.steps)


def test_the_validator_rejects_partly_overlapping_slices(steps_run: StoredRun) -> None:
    trace = perfetto_trace(steps_run)
    events = trace["traceEvents"]
    first = next(e for e in events if e.get("cat") == "request")
    events.append({**first, "name": "bad", "ts": first["ts"] + first["dur"] / 2})
    with pytest.raises(AssertionError, match="overlaps"):
        validate_trace(trace)


def test_perfetto_times_are_microseconds(steps_run: StoredRun) -> None:
    trace = perfetto_trace(steps_run)
    r = steps_run.requests.set_index("request_id")
    for e in trace["traceEvents"]:
        if e.get("cat") == "request":
            rid = e["args"]["request_id"]
            assert e["ts"] == pytest.approx(r.at[rid, "t_sent"] / 1000.0)
        if e.get("cat") == "request.decode":
            rid = e["args"]["request_id"]
            dur_ns = r.at[rid, "t_last_token"] - r.at[rid, "t_first_token"]
            assert e["dur"] == pytest.approx(dur_ns / 1000.0)
    tokens = [e for e in trace["traceEvents"] if e.get("cat") == "token"]
    assert len(tokens) == len(steps_run.chunks)
    assert {e["ts"] for e in tokens} == {t / 1000.0 for t in steps_run.chunks["t"]}


def test_token_instants_and_errors_sit_inside_their_request(steps_run: StoredRun) -> None:
    trace = perfetto_trace(steps_run)
    slices = {e["args"]["request_id"]: e for e in trace["traceEvents"] if e.get("cat") == "request"}
    for e in trace["traceEvents"]:
        if e.get("cat") in ("token", "error"):
            s = slices[e["args"]["request_id"]]
            assert (e["pid"], e["tid"]) == (s["pid"], s["tid"])
            assert s["ts"] <= e["ts"] <= s["ts"] + s["dur"] + 1e-3
    errors = [e for e in trace["traceEvents"] if e.get("cat") == "error"]
    assert len(errors) == int(steps_run.requests["error"].notna().sum())
    assert any(EVIL in e["args"]["error"] for e in errors)


def test_http_run_trace_has_lanes_counters_and_telemetry(http_run: StoredRun) -> None:
    trace = perfetto_trace(http_run)
    validate_trace(trace)
    other = trace["otherData"]
    assert other["request_lanes"] > 1 and other["step_lanes"] == 0
    assert other["telemetry_devices"] == ["gpu0"]
    power = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "gpu0"]
    assert len(power) == len(http_run.telemetry)
    assert {"power_w", "energy_j", "util_pct"} <= set(power[0]["args"])
    active = [e["args"]["count"] for e in trace["traceEvents"] if e["name"] == "active requests"]
    assert min(active) >= 0 and active[-1] == 0


def test_pack_lanes_uses_the_fewest_lanes_without_overlap() -> None:
    rng = np.random.default_rng(1)
    starts = rng.integers(0, 1000, 300)
    ends = starts + rng.integers(0, 100, 300)
    lanes = pack_lanes(starts, ends)
    for lane in np.unique(lanes):
        idx = np.argsort(starts[lanes == lane])
        s, e = starts[lanes == lane][idx], ends[lanes == lane][idx]
        assert np.all(s[1:] >= e[:-1])
    # The fewest lanes = the largest number of intervals open at one instant.
    events = sorted(
        [(int(a), 1) for a in starts] + [(int(b), -1) for b in ends], key=lambda x: (x[0], x[1])
    )
    depth = max(np.cumsum([d for _, d in events]))
    assert lanes.max() + 1 == depth


def test_csv_export_holds_requests_and_summary(
    steps_run: StoredRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(steps_run.path), "--format", "csv", "-o", str(tmp_path)]) == 0
    req = pd.read_csv(tmp_path / "requests.csv")
    assert len(req) == len(steps_run.requests)
    pr = per_request(steps_run.requests.sort_values("request_id"))
    assert req["ttft_s"].to_numpy() == pytest.approx(pr["ttft"].to_numpy(), nan_ok=True)
    assert req["error"].dropna().str.contains("alert").all()
    summ = pd.read_csv(tmp_path / "summary.csv").set_index("key")["value"]
    assert float(summ["latency.ttft.p50"]) == pytest.approx(
        steps_run.summary["latency"]["ttft"]["p50"]
    )  # type: ignore[index]
    assert "wrote" in capsys.readouterr().out


def test_csv_text_cannot_start_a_spreadsheet_formula() -> None:
    df = pd.DataFrame(
        {
            "request_id": [0],
            "prompt_tokens": [1],
            "max_output_tokens": [1],
            "t_scheduled": [0],
            "t_sent": [None],
            "t_first_token": [None],
            "t_last_token": [None],
            "output_tokens": [0],
            "error": ["=HYPERLINK(1)"],
            "is_warmup": [False],
        }
    )
    assert requests_frame(df)["error"][0] == "'=HYPERLINK(1)"


def test_perfetto_and_json_exports_through_the_cli(
    http_run: StoredRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gz = tmp_path / "t.json.gz"
    assert main(["export", str(http_run.path), "--format", "perfetto", "-o", str(gz)]) == 0
    validate_trace(json.loads(gzip.decompress(gz.read_bytes())))
    assert main(["export", str(http_run.path), "--format", "perfetto"]) == 0
    validate_trace(json.loads((http_run.path / "trace.json").read_text()))
    capsys.readouterr()
    assert main(["export", str(http_run.path), "--format", "json", "-o", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "perfscope.export/1"
    assert len(data["requests"]) == len(http_run.requests)
    assert data["summary"]["counts"] == http_run.summary["counts"]  # type: ignore[index]
    assert main(["export", str(http_run.path), "--format", "csv", "-o", "-"]) == 2


@pytest.mark.parametrize("batch", [1, 7, 100_000])
def test_streamed_trace_is_the_in_memory_trace(
    steps_run: StoredRun, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exporters, "_STREAM_BATCH", batch)
    buf = io.BytesIO()
    n = exporters.stream_perfetto(steps_run, buf)
    assert n == len(buf.getvalue())
    assert json.loads(buf.getvalue()) == perfetto_trace(steps_run)


def test_perfetto_to_stdout_streams_valid_json(
    http_run: StoredRun, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    assert main(["export", str(http_run.path), "--format", "perfetto", "-o", "-"]) == 0
    trace = json.loads(capsysbinary.readouterr().out)
    validate_trace(trace)
    assert trace == perfetto_trace(http_run)


def test_a_ray_runs_csv_and_trace_name_the_actor_and_host_of_each_request() -> None:
    """``--ray`` runs carry ``actor``/``host`` per request; the CSV gets both columns (to
    group latency by) and each Perfetto request slice both args. Runs without them keep
    their CSV columns as before."""
    base = {
        "prompt_tokens": 1,
        "max_output_tokens": 1,
        "t_scheduled": 0,
        "t_sent": 1,
        "t_first_token": 2,
        "t_last_token": 2,
        "output_tokens": 1,
        "error": None,
        "is_warmup": False,
    }
    placed = pd.DataFrame(
        [
            {**base, "request_id": 0, "actor": 0, "host": "node-a"},
            {**base, "request_id": 1, "actor": 1, "host": "=node-b"},
        ]
    )
    frame = requests_frame(placed)
    assert frame["actor"].tolist() == [0, 1]
    assert frame["host"].tolist() == ["node-a", "'=node-b"]
    single = placed.assign(actor=None, host=None)
    assert "actor" not in requests_frame(single) and "host" not in requests_frame(single)

    from types import SimpleNamespace

    run = SimpleNamespace(
        requests=placed,
        chunks=pd.DataFrame({"request_id": [], "t": [], "n_tokens": [], "index": []}),
        steps=pd.DataFrame(),
        telemetry=pd.DataFrame(),
        manifest={},
        summary=None,
        path=Path("run"),
    )
    trace = perfetto_trace(run)
    slices = [e for e in trace["traceEvents"] if e.get("cat") == "request"]
    assert [(e["args"]["actor"], e["args"]["host"]) for e in slices] == [
        (0, "node-a"),
        (1, "=node-b"),
    ]
