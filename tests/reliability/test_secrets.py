"""Credentials typed into the URL or passed as engine options never reach a file or a line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reliability.helpers import all_files, cli

SECRETS = ("S3CR3T-url", "S3CR3T-opt", "S3CR3T-tok", "S3CR3T-hdr", "S3CR3T-body")


def _assert_clean(run_dir: Path, *texts: str) -> None:
    for f in all_files(run_dir):
        data = f.read_bytes()
        for s in SECRETS:
            assert s.encode() not in data, (f.name, s)
    for t in texts:
        for s in SECRETS:
            assert s not in t, s


@pytest.mark.fault(
    fault="credentials given as `--engine-opt`",
    before="not recorded (guard older than issue 26)",
    after="`api_key=***` in the manifest's command; other options kept",
    kept="the run, its report and CSV export",
)
def test_python_engine_options_that_look_like_credentials_are_redacted(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    res = cli(
        "run",
        "python:logged_engines:half_fail",
        "--requests",
        "4",
        "--output-len",
        "4",
        "--no-progress",
        "--engine-opt",
        "api_key=S3CR3T-opt",
        "--engine-opt",
        "hf_token=S3CR3T-tok",
        "--engine-opt",
        "Authorization=Bearer S3CR3T-hdr",
        "--engine-opt",
        "temperature=0",
        runs=runs,
    )
    assert res.returncode == 0, res.stderr
    (run_dir,) = list(runs.iterdir())
    assert (run_dir / "report.html").exists()
    exp = cli("export", "--format", "json", "-o", "-", runs=runs)
    csv = cli("export", "--format", "csv", "-o", str(tmp_path / "csv"), runs=runs)
    assert csv.returncode == 0, csv.stderr
    show = cli("show", "--json", runs=runs)
    _assert_clean(run_dir, res.stdout, res.stderr, exp.stdout, show.stdout, show.stderr)
    _assert_clean(tmp_path / "csv")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "api_key=***" in manifest["command"] and "temperature=0" in manifest["command"]


@pytest.mark.fault(
    fault="credentials in the URL's userinfo and in `--extra-body`",
    before="not recorded (guard older than issue 26)",
    after="`user:***@` in the manifest; no secret in any file",
    kept="the run folder and its report",
)
def test_url_userinfo_and_extra_body_secrets_are_redacted(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    # Nothing listens on port 9 (discard): every request fails, which is what we want here.
    res = cli(
        "run",
        "openai:http://user:S3CR3T-url@127.0.0.1:9/v1",
        "--model",
        "m",
        "--no-preflight",
        "--requests",
        "2",
        "--output-len",
        "4",
        "--no-progress",
        "--timeout",
        "5",
        "--extra-body",
        '{"api_key": "S3CR3T-body", "temperature": 0}',
        "--engine-opt",
        "api_key=S3CR3T-opt",
        runs=runs,
    )
    assert res.returncode == 3, res.stderr  # nothing succeeded
    (run_dir,) = list(runs.iterdir())
    ls = cli("ls", "--json", runs=runs)
    rep = cli("report", "-o", str(tmp_path / "r.html"), runs=runs)
    assert rep.returncode == 0, rep.stderr
    _assert_clean(run_dir, res.stdout, res.stderr, ls.stdout, rep.stdout)
    _assert_clean(tmp_path, "")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "user:***@127.0.0.1" in manifest["engine"]["uri"]
