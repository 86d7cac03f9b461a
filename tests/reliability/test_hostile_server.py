"""A hostile or broken OpenAI-compatible server cannot crash a run or poison its files.

Each test runs the real ``perfscope run openai:...`` process against a real loopback server
that misbehaves on chosen requests, then reads the run folder back and asserts what was
kept: every other request, complete, with the run ``complete`` (not ``crashed``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from perfscope.profiler.store import read_run
from tests.reliability.helpers import cli
from tests.reliability.hostile import BOUNDED_RUN, base_url, hostile_server


def _run(url: str, runs: Path, n: int, *extra: str) -> tuple[int, str, Path]:
    res = cli(
        "run",
        f"openai:{url}",
        "--model",
        "m",
        "--requests",
        str(n),
        *BOUNDED_RUN,
        *extra,
        runs=runs,
        timeout=240,
    )
    dirs = [p for p in runs.iterdir() if p.is_dir()] if runs.exists() else []
    assert len(dirs) == 1, (res.stdout, res.stderr)
    return res.returncode, res.stdout + res.stderr, dirs[0]


def _requests(run_dir: Path) -> pd.DataFrame:
    run = read_run(run_dir)
    return run.requests.sort_values("request_id").reset_index(drop=True)


@pytest.mark.fault(
    fault="usage counts of 10^30, 2^64 and -3 from the server",
    before=(
        "OverflowError traceback in the flusher, manifest stuck `running`, requests lost (issue 26)"
    ),
    after="each such request fails naming the field and value; the run ends",
    kept="every request row; the good ones with 5 tokens; int64 columns representable",
)
def test_impossible_usage_counts_fail_their_request_and_the_run_goes_on(tmp_path: Path) -> None:
    modes = ["ok", "huge_completion", "ok", "u64_prompt", "negative", "ok", "two_choices", "ok"]
    with hostile_server(modes) as srv:
        _rc, out, run_dir = _run(base_url(srv), tmp_path / "runs", len(modes))
    assert "Traceback" not in out and "OverflowError" not in out, out
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] != "running", "the run must end, not read as crashed"
    req = _requests(run_dir)
    assert len(req) == len(modes), "every request kept, the bad ones failed"
    # The server serves behaviours in arrival order; the request ids it met are not known
    # here, so each behaviour's error must appear exactly as often as it was served.
    assert srv.served == modes
    errors = [e for e in req["error"] if isinstance(e, str)]
    ok = req[req["error"].isna()]
    assert len(ok) == modes.count("ok") and (ok["output_tokens"] == 5).all()

    def count(*words: str) -> int:
        return sum(all(w in e for w in words) for e in errors)

    assert count("usage.completion_tokens", "(31 digits)") == 1, errors
    assert count("usage.prompt_tokens", "18446744073709551616") == 1, errors
    assert count("usage.completion_tokens", "(-3;") == 1, errors
    assert count("choice index 1", "n > 1") == 1, errors
    assert len(errors) == 4, errors
    # The stored counts are all representable (nothing poisoned the int64 columns).
    assert int(req["output_tokens"].max()) <= 5
    assert int(req["prompt_tokens"].max()) < 2**31


@pytest.mark.fault(
    fault="the manual API records a count beyond int64",
    before="the whole flush window lost (issue 26)",
    after="that cell null, its error naming field and value",
    kept="all 3 rows, in the segments and in the final tables",
)
def test_flusher_keeps_a_row_whose_value_does_not_fit_and_names_it(tmp_path: Path) -> None:
    """The manual API can hand the recorder anything; the segment flusher and the final
    tables keep every row (the bad cell null, the error naming field and value)."""
    from perfscope.profiler.clock import MonotonicClock
    from perfscope.profiler.recorder import Recorder
    from perfscope.profiler.records import RequestSpec
    from perfscope.profiler.segments import SegmentFlusher, read_segments

    rec = Recorder(MonotonicClock())
    flusher = SegmentFlusher(tmp_path, rec, interval_s=3600)
    handles = [rec.add_request(RequestSpec(i, 8, 4)) for i in range(3)]
    for i, h in enumerate(handles):
        h.sent()
        h.tokens(2)
        h.set_output_tokens(10**30 if i == 1 else 2)
        h.finish()
    assert flusher.flush(), flusher.error
    assert flusher.close() is None
    segs = read_segments(tmp_path)
    assert segs is not None
    seg = segs.tables["requests"].to_pandas().sort_values("request_id")
    assert list(seg["request_id"]) == [0, 1, 2], "no row dropped"
    assert seg["output_tokens"].isna().tolist() == [False, True, False]
    assert "output_tokens=" in seg["error"].iloc[1] and "does not fit int64" in seg["error"].iloc[1]
    final = rec.requests_table().to_pandas().sort_values("request_id")
    assert len(final) == 3 and pd.isna(final["output_tokens"].iloc[1])


@pytest.mark.fault(
    fault="a segment write fails mid-run",
    before="the flusher advanced before the write succeeded: rows lost (issue 26)",
    after="its position stays; the next flush writes the rows",
    kept="the rows the failed write did not store",
)
def test_flusher_does_not_advance_past_rows_a_failed_write_did_not_store(tmp_path: Path) -> None:
    from perfscope.profiler.clock import MonotonicClock
    from perfscope.profiler.recorder import Recorder
    from perfscope.profiler.records import RequestSpec
    from perfscope.profiler.segments import SegmentFlusher

    rec = Recorder(MonotonicClock())
    flusher = SegmentFlusher(tmp_path, rec, interval_s=3600)
    calls = {"n": 0}
    stream = flusher._streams["requests"]
    original = stream.write

    def failing_once(batch: pa.RecordBatch) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise pa.ArrowInvalid("simulated conversion failure")  # not an OSError
        original(batch)

    stream.write = failing_once  # type: ignore[method-assign]
    h = rec.add_request(RequestSpec(0, 8, 4))
    h.sent()
    h.tokens(1)
    h.finish()
    with pytest.raises(pa.ArrowInvalid):
        flusher._flush_locked()
    assert flusher._pos["registered"] == 0, "advanced before the write succeeded"
    assert flusher.flush()
    flusher.close()
    with ipc.open_stream(pa.OSFile(str(tmp_path / "segments" / "requests.arrows"))) as r:
        table = r.read_all()
    assert table.num_rows >= 1 and 0 in table.column("request_id").to_pylist()


@pytest.mark.fault(
    fault="a segment file with another table's schema",
    before="KeyError traceback in show/export/analyze/report; dashboard `page failed` (issue 26)",
    after="a note naming the file and its schema; exit 0",
    kept="the run's other tables (that table read as empty)",
)
def test_segment_file_with_another_tables_schema_is_reported_not_a_keyerror(
    tmp_path: Path,
) -> None:
    modes = ["ok"]
    with hostile_server(modes) as srv:
        rc, out, run_dir = _run(base_url(srv), tmp_path / "runs", 2)
    assert rc == 0, out
    seg = run_dir / "segments"
    seg.mkdir(exist_ok=True)
    # A telemetry-shaped stream where the requests stream belongs.
    other = pa.table({"t": [1, 2], "device": ["cpu", "cpu"], "watts": [1.0, 2.0]})
    with pa.OSFile(str(seg / "requests.arrows"), "wb") as f, ipc.new_stream(f, other.schema) as w:
        w.write_table(other)
    from perfscope.profiler.segments import read_segments

    segs = read_segments(run_dir)
    assert segs is not None
    assert any("requests.arrows" in n and "schema" in n for n in segs.notes), segs.notes
    assert segs.tables["requests"].num_rows == 0
    for cmd in (("show",), ("export", "--format", "json", "-o", str(tmp_path / "e.json"))):
        res = cli(*cmd, str(run_dir), runs=tmp_path / "runs")
        assert "KeyError" not in res.stderr + res.stdout, res.stderr
        assert "Traceback" not in res.stderr, res.stderr


@pytest.mark.fault(
    fault="a runaway SSE line, a huge error body, a redirect, a bad chunked encoding",
    before=(
        "100 MB line: 128 s, 719 MB; bodies read whole; redirect followed silently; bad chunking "
        "reported as 400 (issue 26)"
    ),
    after="each fails only its own request, with a named error (never `HTTP 400`)",
    kept="every request row; the 3 good ones whole (5 tokens each)",
)
def test_runaway_lines_bodies_redirects_and_bad_chunking_fail_only_their_request(
    tmp_path: Path,
) -> None:
    modes = ["ok", "long_line", "ok", "huge_error_body", "redirect", "bad_chunked", "ok"]
    with hostile_server(modes, huge_bytes=24 << 20) as srv:
        _rc, out, run_dir = _run(base_url(srv), tmp_path / "runs", len(modes))
    assert "Traceback" not in out, out
    assert srv.served == modes
    req = _requests(run_dir)
    assert len(req) == len(modes)
    ok = req[req["error"].isna()]
    assert len(ok) == 3 and (ok["output_tokens"] == 5).all(), "the good requests are kept"
    errors = [e for e in req["error"] if isinstance(e, str)]

    def one(*words: str) -> None:
        assert sum(all(w in e for w in words) for e in errors) == 1, (words, errors)

    one("stream line over 4,194,304 bytes", "sse_line_cap")
    one("HTTP 500", "body cut at 1,048,576 bytes")
    one("HTTP 307 redirect to", "/elsewhere/v1/completions", "follow_redirects=1")
    one("transport error", "chunked")
    assert not any("HTTP 400" in e for e in errors), errors  # not a byte count


@pytest.mark.fault(
    fault="a 20 MB SSE line split over 4 KiB reads",
    before="the buffer concatenated on every read (quadratic) (issue 26)",
    after="parsed in under 30 s (linear, with a 100x margin)",
    kept="the whole line, its length checked",
)
def test_sse_parser_is_linear_in_a_line_split_over_many_reads() -> None:
    """20 MB in 4 KiB reads: re-concatenating the buffer per read copies ~50 GB (minutes);
    the parser joins each line once. The bound is two orders of magnitude above linear."""
    import time

    from perfscope.profiler.engines.openai.sse import SSELineTooLongError, SSEParser

    body = b'data: {"x":"' + b"a" * (20 << 20) + b'"}\n\n'
    parser = SSEParser(max_line_bytes=64 << 20)
    t0 = time.perf_counter()
    got: list[str] = []
    for i in range(0, len(body), 4096):
        got += parser.feed(body[i : i + 4096])
    elapsed = time.perf_counter() - t0
    assert len(got) == 1 and len(got[0]) == len(body) - 8
    assert elapsed < 30, f"{elapsed:.1f} s for 20 MB"
    capped = SSEParser(max_line_bytes=1 << 20)
    with pytest.raises(SSELineTooLongError, match="over 1,048,576 bytes"):
        for i in range(0, len(body), 4096):
            capped.feed(body[i : i + 4096])
