"""Bad counts, hung engines, all-failed runs: refused or timed out at capture, exit codes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.reliability.helpers import cli


def _run(runs: Path, engine: str, *extra: str, requests: int = 4) -> tuple[int, dict, str]:
    res = cli(
        "run",
        f"python:logged_engines:{engine}",
        "--requests",
        str(requests),
        "--output-len",
        "8",
        "--no-progress",
        "--no-telemetry",
        "--no-report",
        "--json",
        *extra,
        runs=runs,
    )
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout) if res.stdout.strip() else {}, res.stderr


@pytest.mark.parametrize(
    ("engine", "words"),
    [
        ("negative", "negative (-5 tokens)"),
        ("absurd", "implausible (1,000,000,000,000 tokens"),
        ("fractional", "float (2.5), not an integer token count"),
        ("returns_zero", "returned 0 tokens"),
    ],
)
@pytest.mark.fault(
    fault="an engine reports an impossible token count",
    before="not recorded (guard older than issue 26)",
    after="each such request fails naming the count; an all-failed run exits 3",
    kept="every request row, each with its error",
)
def test_a_bad_token_count_fails_its_request_with_a_clear_error(
    tmp_path: Path, engine: str, words: str
) -> None:
    rc, summary, err = _run(tmp_path, engine)
    assert rc == 3, err  # every request failed: no successful measured request
    assert summary["status"] == "failed"
    (run_dir,) = list(tmp_path.iterdir())
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    assert reqs["error"].notna().all()
    assert all(words in e for e in reqs["error"]), reqs["error"].tolist()
    assert "no measured request succeeded" in err
    # Nothing absurd reaches the numbers.
    assert (summary.get("throughput") or {}).get("output_tok_s") in (None, 0, 0.0)


@pytest.mark.fault(
    fault="output counts far beyond max_tokens",
    before="not recorded (guard older than issue 26)",
    after="a summary warning naming how many requests",
    kept="every request (run complete, exit 0)",
)
def test_counts_far_beyond_max_tokens_are_warned_about(tmp_path: Path) -> None:
    rc, summary, err = _run(tmp_path, "too_many")
    assert rc == 0, err
    assert any("far more output tokens than their max_tokens" in w for w in summary["warnings"])
    assert any(w.startswith("4 requests") for w in summary["warnings"])


@pytest.mark.fault(
    fault="a python engine that hangs on some requests",
    before="not recorded (guard older than issue 26)",
    after="`--timeout` fails each hung request after 1 s; the run goes on",
    kept="3 completed requests with 8 tokens each, 3 timed-out rows",
)
def test_a_hung_python_engine_is_timed_out_and_the_run_goes_on(tmp_path: Path) -> None:
    t0 = time.monotonic()
    rc, summary, err = _run(tmp_path, "hangs_on_odd", "--timeout", "1", requests=6)
    elapsed = time.monotonic() - t0
    assert rc == 0, err  # partial failure: exit 0, reported
    assert elapsed < 90  # the hung calls (an hour each) did not hold the run
    (run_dir,) = list(tmp_path.iterdir())
    reqs = pd.read_parquet(run_dir / "requests.parquet").set_index("request_id")
    odd = reqs.loc[[1, 3, 5]]
    even = reqs.loc[[0, 2, 4]]
    assert odd["error"].str.contains("timeout: no end after 1 s").all(), odd["error"].tolist()
    assert even["error"].isna().all() and (even["output_tokens"] == 8).all()
    assert summary["counts"]["failed"] == 3 and summary["counts"]["completed"] == 3
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["request_timeout_s"] == 1.0 and manifest["status"] == "complete"


@pytest.mark.fault(
    fault="the server refuses every request",
    before="not recorded (guard older than issue 26)",
    after="run `failed`, exit 3, the first error named",
    kept="every failed request row and the manifest's errors",
)
def test_a_run_where_every_request_failed_ends_failed_with_exit_3(tmp_path: Path) -> None:
    rc, summary, err = _run(tmp_path, "always_fails")
    assert rc == 3, err
    assert summary["status"] == "failed"
    assert "ConnectionRefusedError: server refused the request" in err
    (run_dir,) = list(tmp_path.iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert "no measured request succeeded (4 of 4 failed" in manifest["errors"][-1]


@pytest.mark.fault(
    fault="an engine that never yields a token",
    before="not recorded (guard older than issue 26)",
    after="exit 3, status `failed`",
    kept="manifest and summary, both `failed`",
)
def test_an_engine_that_never_yields_exits_3(tmp_path: Path) -> None:
    rc, summary, _err = _run(tmp_path, "never_yields")
    assert rc == 3 and summary["status"] == "failed"


@pytest.mark.fault(
    fault="some requests fail",
    before="not recorded (guard older than issue 26)",
    after="exit 0, the failures counted and reported",
    kept="2 completed and 2 failed request rows",
)
def test_partial_failure_stays_exit_0_and_is_reported(tmp_path: Path) -> None:
    rc, summary, err = _run(tmp_path, "half_fail")
    assert rc == 0, err
    assert summary["status"] == "complete"
    assert summary["counts"]["failed"] == 2 and summary["counts"]["completed"] == 2


@pytest.mark.fault(
    fault="a batching engine's queue outlasts `--timeout`",
    before="not recorded (guard older than issue 26)",
    after="late requests fail `timeout: no end after 0.3 s`, no traceback",
    kept="every request row; the timed-out ones stop short of 1,000 tokens",
)
def test_timeout_applies_to_a_batching_engine_too(tmp_path: Path) -> None:
    """The reference engine queues requests (batch size 1): the later ones pass --timeout.

    Sized so that, however fast the machine, the last request cannot finish in time: each
    request decodes 1,000 tokens one step at a time, and the last waits for three others."""
    res = cli(
        "run",
        "reference",
        "--model-preset",
        "tiny",
        "--requests",
        "4",
        "--prompt-len",
        "8",
        "--batch-size",
        "1",
        "--output-len",
        "1000",
        "--timeout",
        "0.3",
        "--no-progress",
        "--no-telemetry",
        "--no-report",
        runs=tmp_path,
    )
    assert res.returncode in (0, 3), res.stderr
    assert "Traceback" not in res.stderr
    (run_dir,) = list(tmp_path.iterdir())
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    errors = reqs["error"].dropna()
    assert len(errors) >= 1
    assert errors.str.startswith("timeout: no end after 0.3 s").all(), errors.tolist()
    # A timed-out request's later tokens were not counted.
    assert (reqs.loc[reqs["error"].notna(), "output_tokens"] < 1000).all()
