"""``n > 1``: several choices per request are never merged into one request's token times.

A request body asking for ``n=2`` is refused in one line before any request is sent; a server
that streams a second choice unasked fails that request naming ``n > 1``, and every other
request is kept whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfscope.cli import main
from perfscope.profiler.store import read_run
from tests.reliability.hostile import BOUNDED_RUN, base_url, hostile_server

RUN = ("--model", "m", *BOUNDED_RUN)


def _run(url: str, runs: Path, n_requests: int, *extra: str) -> int:
    """``perfscope run openai:URL`` in this process (the server is a thread here)."""
    return main(
        [
            "run",
            f"openai:{url}",
            "--requests",
            str(n_requests),
            *RUN,
            *extra,
            "--runs-dir",
            str(runs),
        ]
    )


@pytest.mark.parametrize("n", ["2", "0", "true"])
@pytest.mark.fault(
    fault="`--extra-body` asks for `n` = 2 (or 0, or true)",
    before=(
        "every request sent with n=2, each failed at choice index 1; run failed, exit 3 (this "
        "branch, 2026-12-02)"
    ),
    after="one-line usage error naming n, exit 2, no request sent",
    kept="nothing captured to lose: no request sent, no run folder made",
)
def test_a_request_body_asking_for_several_choices_is_refused_before_any_request(
    tmp_path: Path, n: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    with hostile_server(["honour_n"]) as srv:
        rc = _run(base_url(srv), runs, 3, "--extra-body", f'{{"temperature": 0, "n": {n}}}')
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert f"--extra-body n={n}" in err and "one choice per request" in err, err
    assert srv.bodies == [], "no request reached the server"
    assert not runs.exists() or not any(runs.iterdir()), "no half-made run folder"


@pytest.mark.fault(
    fault="a server streams a second choice (index 1) unasked",
    before=(
        "choices merged into one stream without a word (issue 26); fixed to fail the request "
        "before this branch"
    ),
    after="that request fails naming `n > 1`; the run completes; `n: 1` is sent as asked",
    kept="every request row; the other 3 whole (5 tokens each)",
)
def test_a_second_choice_streamed_unasked_fails_its_request_and_keeps_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    modes = ["ok", "two_choices_unasked", "ok", "ok"]
    runs = tmp_path / "runs"
    with hostile_server(modes) as srv:
        # n=1 is what every request asks for anyway: it is sent, not refused.
        rc = _run(base_url(srv), runs, len(modes), "--extra-body", '{"n": 1}')
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "Traceback" not in out.out + out.err
    assert srv.served == modes and [b.get("n") for b in srv.bodies] == [1] * len(modes)
    (run_dir,) = list(runs.iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete", manifest["status"]
    req = read_run(run_dir).requests
    assert len(req) == len(modes), "every request kept"
    errors = [e for e in req["error"] if isinstance(e, str)]
    assert len(errors) == 1 and "choice index 1" in errors[0] and "n > 1" in errors[0], errors
    ok = req[req["error"].isna()]
    # The good requests are whole: none of the second choice's text was merged into them.
    assert len(ok) == 3 and (ok["output_tokens"] == 5).all()
