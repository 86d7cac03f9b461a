"""Conclusions stay within the data: projections at the target's speed of light, advice under
the roofline, what-ifs labelled, contention and model specs carried through (issue 14)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfscope.analysis.costmodel import step_costs
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.roofline import phase_roofline
from perfscope.analysis.summary import (
    CONTENTION_WARN_SHARE,
    contention_record,
    run_warnings,
    server_share,
)
from perfscope.cli import main
from perfscope.hwdb import lookup
from perfscope.profiler.contention import ContentionMeter, local_server_ports
from perfscope.profiler.store import read_run
from tests.data.runs.builders import complete_run, manual_run, small_model, synthetic_run

A100 = lookup("a100-sxm4-80gb")


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        yield


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory, cache_env: None) -> Path:
    """A real reference-engine run on this machine's CPU."""
    return complete_run(tmp_path_factory.mktemp("cpu-run"), "--no-report")


@pytest.fixture(scope="module")
def stored_runs(tmp_path_factory: pytest.TempPathFactory, cpu_run: Path) -> list[Path]:
    """Every kind of stored run the test builders make."""
    root = tmp_path_factory.mktemp("stored")
    return [
        cpu_run,
        manual_run(root, model=small_model()),
        manual_run(root, name="nosteps", steps=False, model=small_model()),
        synthetic_run(root, 300, telemetry=False),
    ]


def _json(argv: list[str]) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, (json.loads(out.getvalue()) if code == 0 else {})


def test_a_cpu_runs_projections_use_each_gpus_speed_of_light(cpu_run: Path) -> None:
    summary = read_run(cpu_run).summary
    assert summary is not None
    proj = summary["projections"]
    assert {p["device"]["key"] for p in proj} >= {"l4", "h100-sxm5-80gb"}
    measured_ttft = summary["latency"]["ttft"]["p50"]
    ttfts = []
    for p in proj:
        assert p["assumption"] == "engine range"
        assert "host overhead is not carried" in p["basis"]
        rng = p["range"]
        sol = rng["speed_of_light"]
        # between the compiled and eager ends of the stated range of each GPU's own SOL
        # the compiled end adds the target's kernel launches (hwdb [launch]) to its SOL share
        assert rng["compiled"]["ttft_s"] >= sol["ttft_s"] / 0.7 * (1 - 1e-9)
        # the eager end is eager PyTorch's efficiency plus the target's kernel launches per
        # step (hwdb [launch]); this CPU run's own host time is not among them
        launches = p["overhead_s"]["decode_per_step"]
        dev = lookup(p["device"]["key"])
        assert (launches > 0) == bool(dev.kernel_launch_s)
        assert rng["eager"]["tpot_s"] == pytest.approx(sol["tpot_s"] / 0.2 + launches, rel=1e-6)
        assert p["tpot_s"] <= (sol["tpot_s"] / 0.2 + launches) * (1 + 1e-9)
        # far from the CPU's own timings, which would be the transplanted host overhead
        assert p["ttft_s"] < measured_ttft / 5
        ttfts.append(p["ttft_s"])
    assert len(set(ttfts)) > 1  # not one transplanted number for every device


def test_no_advice_on_a_stored_run_promises_beyond_its_roofline(stored_runs: list[Path]) -> None:
    seen = 0
    for path in stored_runs:
        summary = read_run(path).summary
        assert summary is not None
        device = ((summary.get("hardware") or {}).get("spec") or {}).get("kind")
        for item in summary.get("advice") or []:
            gain = item["projected_gain"]
            if gain.get("bound") is not None:
                seen += 1
                assert gain["value"] <= gain["bound"] * (1 + 1e-6), (path.name, item)
                assert gain["low"] <= gain["value"]
            if device == "cpu":
                assert "CUDA graphs" not in item["technique"], item
    assert seen > 0


def test_overhead_advice_on_a_cpu_run_names_cpu_levers_and_a_range(cpu_run: Path) -> None:
    summary = read_run(cpu_run).summary
    assert summary is not None
    cuts = [a for a in summary["advice"] if a["technique"].startswith("cut ")]
    for a in cuts:
        # "threads" is dropped where a stored threads study on this machine class measured
        # more threads slower (analysis/calibration.json), so only the compile lever is fixed
        assert "torch.compile" in a["technique"]
        g = a["projected_gain"]
        phase = summary["roofline"]["phases"][a["projected_gain"]["metric"].split("_")[0]]
        assert g["bound"] == pytest.approx(1 / phase["efficiency"], rel=1e-2)
        assert "speed of light" in a["assumptions"]


def test_analyze_against_other_hardware_is_a_what_if_without_measured_mfu(
    cpu_run: Path,
) -> None:
    code, summary = _json(["analyze", str(cpu_run), "--hw", "h100-sxm5-80gb", "--json"])
    assert code == 0
    roof = summary["roofline"]
    assert roof["what_if"]["target"] == "h100-sxm5-80gb"
    assert roof["what_if"]["measured_on"] != "h100-sxm5-80gb"
    for phase in roof["phases"].values():
        assert phase["mfu"] is None and phase["mbu"] is None and phase["efficiency"] is None
        assert "what-if" in phase["evidence"]
        assert phase["sol_time_s"] > 0
    assert summary["advice"] == []
    # analysing against its own device again is measured, not a what-if
    code, again = _json(["analyze", str(cpu_run), "--json"])
    assert code == 0 and not again["roofline"].get("what_if")
    assert again["roofline"]["phases"]["decode"]["mfu"] is not None


def test_a_large_batch_decode_with_compute_bound_gemms_and_memory_bound_attention_is_mixed() -> (
    None
):
    spec = ModelSpec.from_preset("llama-3-8b")
    b, ctx = 512, 2048
    arrays = step_costs(spec, np.array([b]), np.array([b]), np.array([b * ctx]))
    costs = {k: float(v.sum()) for k, v in arrays.items()}
    r = phase_roofline(
        "decode",
        model=spec,
        device=A100,
        costs=costs,
        time_s=0.2,
        steps=1,
        tokens=b,
        batch_size_mean=b,
        context_tokens_mean=ctx,
        max_context_tokens=b * (ctx + 1),
    )
    assert r["classes"]["weight_gemms"]["roof"] == "compute"
    assert r["classes"]["attention_kv"]["roof"] == "memory"
    assert r["class_verdict"] == "mixed"
    assert "mixed" in r["evidence"] and "attention/KV memory-bound" in r["evidence"]
    small = step_costs(spec, np.array([1]), np.array([1]), np.array([256]))
    r1 = phase_roofline(
        "decode",
        model=spec,
        device=A100,
        costs={k: float(v.sum()) for k, v in small.items()},
        time_s=0.01,
        steps=1,
        tokens=1,
        batch_size_mean=1,
        context_tokens_mean=256,
        max_context_tokens=257,
    )
    assert r1["class_verdict"] == "memory-bound"


def test_an_overhead_bound_cpu_run_names_where_its_time_goes(cpu_run: Path) -> None:
    summary = read_run(cpu_run).summary
    assert summary is not None
    for phase in summary["roofline"]["phases"].values():
        assert phase["gap_s"] >= 0 and phase["gap_share"] is not None
        assert "By operator class" in phase["evidence"]
        if phase["verdict"] == "overhead-bound":
            assert "Host overhead vs slow kernels" in phase["evidence"]


def test_model_spec_gives_a_python_engine_an_estimated_roofline(
    tmp_path: Path, engines_on_path: Path, cache_env: None
) -> None:
    base = ["run", "python:timed_engines:single_tokens", "--requests", "4", "--output-len", "4"]
    base += ["--no-progress", "--no-report", "--runs-dir", str(tmp_path), "--json"]
    code, summary = _json([*base, "--model-spec", "llama-3-8b", "--hw", "h100-sxm5-80gb"])
    assert code == 0
    roof = summary["roofline"]
    assert roof["available"] and roof["estimated"]
    assert summary["model_spec"]["source"] == "--model-spec llama-3-8b"
    assert "analytic cost model" in summary["model_spec"]["method"]
    # the terminal and the report name the family and every assumption under the roofline
    from rich.console import Console

    from perfscope.cli.render import summary_view
    from perfscope.dashboard.report import render_report
    from perfscope.dashboard.view import as_summary, model_spec_lines

    lines = model_spec_lines(as_summary(summary))
    assert lines[0].startswith("model llama-3-8b from --model-spec llama-3-8b (an estimate")
    assert "family: llama" in lines[1:]
    console = Console(record=True, width=120)
    console.print(summary_view(as_summary(summary)))
    printed = console.export_text()
    assert all(line in printed for line in lines[1:]), printed
    from perfscope.profiler.store import read_run

    page = render_report(read_run(tmp_path / summary["run_id"]))
    assert "family: llama" in page and "from --model-spec llama-3-8b" in page
    code, plain = _json(base)
    assert code == 0 and not plain["roofline"]["available"]
    assert main([*base, "--model-spec", "no-such-model"]) == 2


def test_a_window_too_short_to_measure_gets_no_cpu_share() -> None:
    c = ContentionMeter().start().stop()
    assert c["too_short"] and c["others_share"] is None and c["steal_share"] is None


def test_the_local_server_under_test_is_not_counted_as_another_process() -> None:
    assert local_server_ports("openai:http://127.0.0.1:8123/v1") == (8123,)
    assert local_server_ports("openai:http://localhost/v1") == (80,)
    assert local_server_ports("openai:https://api.example.com/v1") == ()
    assert local_server_ports("reference") == ()
    server = (  # a server and a worker it forked (before listening), both spinning
        "import os, socket, time\n"
        "end = time.time() + 3.0\n"
        "if os.fork() == 0:\n"
        "    while time.time() < end: pass\n"
        "    os._exit(0)\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True)\n"
        "while time.time() < end: pass\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", server], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with_server = ContentionMeter(exclude_ports=(port,)).start()
        plain = ContentionMeter().start()
        time.sleep(1.5)
        a, b = with_server.stop(), plain.stop()
    finally:
        proc.kill()
        proc.wait()
    assert a["server_pids"] == [proc.pid]
    assert a["server_cpu_s"] > 0.2  # the spinning server, set apart (a busy machine gives less)
    # what the plain meter calls "others" includes the server; the other one leaves it out
    assert a["others_cpu_s"] <= b["others_cpu_s"] - 0.8 * a["server_cpu_s"]
    # ... and the run still counts it: a server taking the cores delays the client's stamps
    shared = server_share(a)
    assert shared is not None and shared == pytest.approx(
        a["server_cpu_s"] / (a["window_s"] * a["cpu_count"])
    )
    record = contention_record({"host": {"contention": a}})
    assert record is not None
    assert record.contended == (a["others_share"] + shared > CONTENTION_WARN_SHARE)
    named = [w for w in run_warnings({"host": {"contention": a}}) if "shares this machine" in w]
    assert bool(named) == (shared > CONTENTION_WARN_SHARE)


def test_a_server_that_takes_the_cpu_makes_the_run_contended_and_is_named() -> None:
    c = {"window_s": 2.0, "cpu_count": 2, "others_share": 0.02, "server_cpu_s": 3.2}
    c |= {"server_ports": [8000], "too_short": False}
    record = contention_record({"host": {"contention": c}})
    assert record is not None and record.contended  # 80% of the machine was the server's
    (named,) = [w for w in run_warnings({"host": {"contention": c}}) if "server" in w]
    assert "shares this machine: on port 8000 it used 80% of the CPU capacity" in named
    quiet = c | {"server_cpu_s": 0.1}  # 2.5%: not contended, nothing said
    record = contention_record({"host": {"contention": quiet}})
    assert record is not None and not record.contended
    assert run_warnings({"host": {"contention": quiet}}) == []


def test_contended_runs_are_marked_in_listings_and_grouped_sets_compare_as_sets(
    stored_runs: list[Path],
) -> None:
    from perfscope.dashboard.app.data import contention_marker
    from perfscope.dashboard.compare import compare_tables, group_by_run_set
    from perfscope.dashboard.figures import RunTables

    busy = {"host": {"contention": {"others_share": 0.6, "steal_share": 0.0}}}
    quiet = {"host": {"contention": {"others_share": 0.02, "steal_share": 0.0}}}
    short = {"host": {"contention": {"others_share": None, "too_short": True}}}
    assert contention_marker(busy, None) == "⚠ others 60%"
    assert contention_marker(quiet, None) is None and contention_marker(short, None) is None
    runs = [read_run(p) for p in stored_runs[:2]]
    sums = [dict(r.summary or {}) for r in runs]
    sums[0]["run_set"] = {"id": "s1-A", "label": "A"}
    sums[1]["run_set"] = {"id": "s1-B", "label": "B"}
    extra = dict(sums[0], run_id="again")
    assert group_by_run_set([sums[0], sums[1], extra]) == [[0, 2], [1]]
    tables = [
        RunTables(s, r.requests, r.chunks, r.steps, r.telemetry)
        for s, r in zip(sums, runs, strict=True)
    ]
    tables.append(RunTables(extra, runs[0].requests, runs[0].chunks, runs[0].steps, None))
    result = compare_tables([tables[0], tables[1], tables[2]], ["a1", "b1", "a2"])
    assert result.runs == (("a1", "a2"), ("b1",))
    assert not result.noise_known  # set B has a single run
