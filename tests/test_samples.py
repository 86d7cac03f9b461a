"""The samples users copy actually run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PERFSCOPE, ROOT, subprocess_env

SAMPLES = ROOT / "samples"


def test_manual_api_sample_stores_an_analysed_run(runs_dir: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "custom_engine_manual", SAMPLES / "custom_engine_manual.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = module.main(str(runs_dir))
    assert run.status == "complete"
    assert run.counts.completed == 4
    assert run.counts.output_tokens == 64
    assert run.summary["steps"]["decode"]["count"] == 60


def test_python_engine_sample_runs_through_the_cli(tmp_path: Path) -> None:
    res = subprocess.run(
        [
            *PERFSCOPE,
            "run",
            "python:python_engine:generate",
            "--requests",
            "6",
            "--output-len",
            "9",
            "--mode",
            "online",
            "--concurrency",
            "3",
            "--json",
            "--no-progress",
        ],
        cwd=SAMPLES,
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(PERFSCOPE_RUNS_DIR=str(tmp_path)),
    )
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["counts"]["completed"] == 6
    # first chunk 1 token, then chunks of 4, 4: three chunks, two gaps per request
    assert s["latency"]["itl"]["count"] == 12
    # every gap is one chunk of 4 tokens; a sleep never ends early (how late it ends is the
    # machine's load, not perfscope's business)
    lat = s["latency"]
    assert lat["itl"]["p50"] == pytest.approx(4 * lat["itl_per_token"]["p50"])
    assert lat["tpot"]["p50"] >= 0.004 * 0.99


def test_openai_server_sample_profiles_a_server_through_perfscope_run() -> None:
    from tests.test_openai_scripted import scripted_server

    spec = importlib.util.spec_from_file_location("openai_server", SAMPLES / "openai_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with scripted_server("--ttft", "0.02", "--itl", "0.005") as url:
        run = module.main(url, "scripted", requests=4)
    assert run.status == "complete"
    assert run.counts.completed == 4
    assert run.manifest["load"]["rate"] == 4.0
    assert run.manifest["slos"] == {"ttft": 0.5, "tpot": 0.1}
