"""``perfscope study`` on the ``hf:`` and ``openai:`` engines, and the one table of which
knob applies to which engine family.

Smoke size: a two-layer Llama built here from a config (nothing downloaded) and the
scripted SSE server of the openai tests, a few requests per run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import perfscope
from perfscope.api.study import APPLIES, KNOBS, engine_family, knobs_for
from perfscope.errors import UsageError
from tests.conftest import PERFSCOPE, subprocess_env
from tests.test_openai_scripted import scripted_server

transformers = pytest.importorskip("transformers")


SMALL: dict[str, Any] = {
    "requests": 2,
    "warmup": 0,
    "prompt_len": 8,
    "output_len": 4,
    "telemetry": False,
    "seed": 0,
}


def _config(run: str) -> dict[str, Any]:
    manifest = json.loads((Path(run) / "manifest.json").read_text())
    cfg: dict[str, Any] = manifest["engine"]["config"]
    return cfg


def _summary(run: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(run) / "summary.json").read_text())
    return data


def test_every_knob_has_one_row_in_the_engine_table() -> None:
    assert set(APPLIES) == set(KNOBS)
    assert knobs_for("hf:/models/x") == ["batch-size", "dtype", "concurrency", "rate", "attention"]
    assert knobs_for("openai:http://127.0.0.1:1/v1") == [
        "concurrency",
        "rate",
        "max-tokens",
        "connection",
    ]
    assert set(knobs_for("reference")) == set(KNOBS) - {"max-tokens", "connection"}
    assert engine_family(lambda prompt: iter(())) == "python"
    assert knobs_for(lambda prompt: iter(())) == ["concurrency", "rate"]


def test_hf_study_of_dtype_loads_each_dtype_and_projects_the_change(
    tiny_llama: Path, tmp_path: Path
) -> None:
    s = perfscope.study(
        "dtype",
        "fp32,bf16",
        engine=f"hf:{tiny_llama}",
        repeat=2,
        runs_dir=tmp_path,
        hw="epyc-9654",
        **SMALL,
    )
    assert s.values == ["fp32", "bf16"] and s.args["engine"].startswith("hf:")
    for st, want in zip(s.settings, ("float32", "bfloat16"), strict=True):
        assert len(st.runs) == 2
        for r in st.runs:
            manifest = json.loads((Path(r.run) / "manifest.json").read_text())
            assert manifest["engine"]["dtype"] == want
            assert _summary(r.run)["counts"]["completed"] == 2
    # bf16 weights are half the bytes by the cost model; the what-if projects the change.
    w = [st.memory["weights_bytes"] for st in s.settings]
    assert w[1] == pytest.approx(w[0] / 2)
    e = s.effect("bf16", "tpot_p50_s")
    # two blocks a side: the paired design can state no 95% interval from two pairs, so
    # none is claimed and the change is not called (the experiment could not see it)
    assert e is not None and e.change.n == (2, 2) and e.change.ci is None
    assert e.change.verdict == "no detectable change"
    assert e.projected_ratio is not None and e.projected_ratio > 0


def test_hf_study_of_attention_runs_sdpa_and_eager(tiny_llama: Path, tmp_path: Path) -> None:
    s = perfscope.study(
        "attention",
        "sdpa,eager",
        engine=f"hf:{tiny_llama}",
        repeat=1,
        runs_dir=tmp_path,
        **SMALL,
    )
    got = [_config(st.runs[0].run)["attention"] for st in s.settings]
    assert got == ["sdpa", "eager"]
    assert any("noise unknown" in n for n in s.notes)


def test_hf_engine_refuses_an_unknown_attention(tiny_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"attention='flash-9'.*sdpa or eager"):
        perfscope.run(engine=f"hf:{tiny_llama}", runs_dir=tmp_path, attention="flash-9", **SMALL)


@pytest.fixture(scope="module")
def server() -> Any:
    with scripted_server("--ttft", "0.005", "--itl", "0.002") as url:
        yield url


def test_openai_study_of_max_tokens_sends_each_setting(server: str, tmp_path: Path) -> None:
    s = perfscope.study(
        "max-tokens",
        [3, 6],
        engine=f"openai:{server}",
        repeat=2,
        runs_dir=tmp_path,
        **{**SMALL, "requests": 3},
    )
    for st, n in zip(s.settings, (3, 6), strict=True):
        for r in st.runs:
            assert _summary(r.run)["counts"]["output_tokens"] == 3 * n
    e = s.effect("6", "output_tok_s")
    assert e is not None and e.change.n == (2, 2) and e.change.ratio is not None


def test_openai_study_of_concurrency_through_the_cli(server: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            *PERFSCOPE,
            "study",
            "concurrency",
            "--values",
            "1,3",
            "--repeat",
            "2",
            "--engine",
            f"openai:{server}",
            "--requests",
            "4",
            "--warmup",
            "0",
            "--prompt-len",
            "8",
            "--output-len",
            "4",
            "--no-telemetry",
            "--runs-dir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["knob"] == "concurrency" and data["args"]["engine"].startswith("openai:")
    for st, users in zip(data["settings"], (1, 3), strict=True):
        for r in st["runs"]:
            manifest = json.loads((Path(r["run"]) / "manifest.json").read_text())
            assert manifest["load"]["concurrency"] == users
            assert _summary(r["run"])["counts"]["completed"] == 4


@pytest.mark.parametrize(
    ("knob", "engine", "message"),
    [
        (
            "kv-heads",
            "hf:{model}",
            "knob 'kv-heads' does not apply to the hf: engine: use one of batch-size, "
            "dtype, concurrency, rate, attention",
        ),
        (
            "batch-size",
            "openai:http://127.0.0.1:9/v1",
            "knob 'batch-size' does not apply to the openai: engine: use one of "
            "concurrency, rate, max-tokens, connection",
        ),
        (
            "max-tokens",
            "reference",
            "knob 'max-tokens' does not apply to the reference engine",
        ),
    ],
)
def test_a_knob_that_does_not_apply_is_refused_in_one_line(
    knob: str, engine: str, message: str, tiny_llama: Path, tmp_path: Path
) -> None:
    out = subprocess.run(
        [
            *PERFSCOPE,
            "study",
            knob,
            "--values",
            "1,2",
            "--engine",
            engine.format(model=tiny_llama),
            "--runs-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "studies").exists()
