"""`perfscope sweep` and the sweep analysis: curve, knee, max_goodput_rate."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from perfscope.analysis.sweep import SweepPoint, SweepSummary, find_knee, summarize_sweep
from perfscope.api.run import auto_rates
from perfscope.cli.sweep import register
from tests.test_openai_scripted import scripted_server


def test_knee_is_the_last_point_before_latency_climbs() -> None:
    x = [2, 4, 6, 8, 10, 12]
    y = [0.10, 0.10, 0.11, 0.12, 0.40, 1.50]
    assert find_knee(x, y) == 3
    assert find_knee(x, [0.1] * 6) is None  # flat: no knee in range
    assert find_knee([1, 2], [0.1, 1.0]) is None  # too few points


def test_max_goodput_rate_is_the_highest_rate_with_90_percent_attainment() -> None:
    pts = [
        SweepPoint(offered=r, attainment=a, req_s=r, output_tok_s=10 * r, e2e_p50=e)
        for r, a, e in [(1, 1.0, 0.1), (2, 0.95, 0.1), (4, 0.9, 0.12), (8, 0.5, 0.9)]
    ]
    s = summarize_sweep("rate", pts, {"ttft": 0.2})
    assert s.max_goodput_rate == 4 and s.max_goodput == 4
    assert s.first_failing == 8
    assert s.knee is not None and s.knee.point.offered == 4 and s.knee.metric == "e2e_p50"
    assert summarize_sweep("rate", pts, {}).max_goodput_rate is None
    # The stored form: the knee is its point's object with the metric first, and only the
    # kind's max-goodput key is written.
    data = s.to_dict()
    assert list(data["knee"])[:2] == ["metric", "offered"]
    assert "max_goodput_rate" in data and "max_goodput_concurrency" not in data
    assert SweepSummary.from_dict(data) == s


def test_auto_rates_reach_past_saturation() -> None:
    assert auto_rates(10.0, 4) == [3.0, 6.0, 9.0, 12.0]


def _sweep(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["sweep", *argv])
    out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out):
        rc = args.handler(args, Console(file=io.StringIO(), width=120))
    return rc, out.getvalue()


@pytest.mark.slow  # about 22 s on a quiet 2-core machine
def test_sweep_finds_the_knee_of_a_server_with_limited_capacity(tmp_path: Path) -> None:
    # 4 streams at once, each ~0.1 s: capacity ~40 req/s. Rates past it queue (TTFT grows).
    with scripted_server("--max-concurrent", "4", "--ttft", "0.02", "--itl", "0.01") as url:
        rc, out = _sweep(
            [
                f"openai:{url}",
                "--rates",
                "5,10,20,30,60,90",
                "--requests",
                "40",
                "--output-len",
                "8",
                "--slo",
                "ttft=60ms",
                "--runs-dir",
                str(tmp_path),
                "--json",
            ]
        )
    assert rc == 0
    s = json.loads(out)
    assert [p["offered"] for p in s["points"]] == [5, 10, 20, 30, 60, 90]
    assert all(p["completed"] == 40 for p in s["points"])
    assert s["knee"] is not None and 20 <= s["knee"]["offered"] <= 60
    assert s["max_goodput_rate"] is not None and 10 <= s["max_goodput_rate"] <= 60
    # Past the knee, TTFT is queueing: far above the scripted 20 ms.
    assert s["points"][-1]["ttft_p99"] > 0.1
    assert Path(s["path"]).is_file()


def test_auto_sweep_probes_then_runs_points_and_prints_a_table(tmp_path: Path) -> None:
    with scripted_server("--max-concurrent", "4", "--ttft", "0.01", "--itl", "0.005") as url:
        parser = argparse.ArgumentParser()
        register(parser.add_subparsers())
        args = parser.parse_args(
            [
                "sweep",
                f"openai:{url}",
                "--points",
                "3",
                "--requests",
                "16",
                "--output-len",
                "4",
                "--runs-dir",
                str(tmp_path),
            ]
        )
        buf = io.StringIO()
        rc = args.handler(args, Console(file=buf, width=160))
    assert rc == 0
    text = buf.getvalue()
    assert "sweep (rate)" in text and "max_goodput_rate: give --slo" in text
    (saved,) = list((tmp_path / "sweeps").iterdir())
    s = json.loads(saved.read_text())
    assert s["probe"]["req_s"] > 0 and len(s["points"]) == 3


def test_sweep_rejects_bad_lists() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["sweep", "openai:x", "--rates", "1,-2"])


def test_a_reference_sweep_takes_the_model_preset_and_batch_size(tmp_path: Path) -> None:
    from perfscope.cli import main
    from perfscope.profiler.store import list_runs, read_run

    argv = ["sweep", "reference", "--model-preset", "tiny", "--batch-size", "2", "--rates", "50"]
    argv += ["--requests", "2", "--output-len", "2", "--runs-dir", str(tmp_path), "--json"]
    assert main(argv) == 0
    (point,) = list_runs(tmp_path)
    config = read_run(point, tables=False).manifest["engine"]["config"]
    assert config["preset"] == "tiny" and config["batch_size"] == 2
