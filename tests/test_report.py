"""The HTML report: renders for every kind of run, parses, escapes, stays small."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from perfscope.cli import main
from perfscope.dashboard.report import render_report, write_report
from perfscope.profiler.store import read_run
from tests.data.runs.builders import (
    EVIL,
    complete_run,
    manual_run,
    set_manifest,
    small_model,
    synthetic_run,
)

VOID = {"meta", "link", "br", "hr", "img", "input", "col", "area", "base", "wbr", "source"}
SECTIONS = ("run", "headline", "verdicts", "figures", "advice", "requests", "environment")


class _Checker(HTMLParser):
    """Fails on a closing tag that does not match the open one; collects scripts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.ids: set[str] = set()
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._script_attrs: dict[str, str | None] | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            assert a["id"] not in self.ids, f"duplicate id {a['id']}"
            self.ids.add(str(a["id"]))
        if tag == "script":
            self._script_attrs = a
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-3:]}"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self._script_attrs is not None and self.stack and self.stack[-1] == "script":
            self.scripts.append((self._script_attrs, data))
            self._script_attrs = None
        elif not (self.stack and self.stack[-1] in ("script", "style")):
            self.text.append(data)


def parse(html: str) -> _Checker:
    checker = _Checker()
    checker.feed(html)
    checker.close()
    assert checker.stack == [], f"unclosed tags: {checker.stack}"
    return checker


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Module fixtures run before the per-test isolation: keep the calibration cache in the
    session's temp folder, never in the home directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, cache_env: None) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report-runs")
    out = {
        "complete": complete_run(root),
        "interrupted": manual_run(root, name="interrupted", interrupt=True, model=small_model()),
        "errors": manual_run(root, name=EVIL, fail_every=3, error_text=EVIL, model=small_model()),
        "http": manual_run(root, name="http", steps=False),
        "synthetic10k": synthetic_run(root, 10_000),
    }
    # User strings in every place a report shows them: run name (above), model path,
    # prompts file, server error texts (above and in the run's errors).
    set_manifest(
        out["errors"],
        engine__uri=f"hf:/models/{EVIL}",
        engine__model__name=f"/models/{EVIL}",
        workload__prompts_file=f"/data/{EVIL}.jsonl",
        workload__prompt=f"say {EVIL}",
        errors=[f"engine: {EVIL}"],
    )
    return out


def test_perfscope_run_writes_report_html_next_to_the_run(runs: dict[str, Path]) -> None:
    path = runs["complete"] / "report.html"
    assert path.is_file()
    html = path.read_text(encoding="utf-8")
    checker = parse(html)
    for section in SECTIONS:
        assert section in checker.ids, section
    # The default report stays small enough to mail: the basic plotly bundle (~1.2 MB)
    # instead of the full one (~4.8 MB), with the run's data.
    assert path.stat().st_size < 1_500_000


def test_run_with_no_report_writes_none(tmp_path: Path) -> None:
    path = complete_run(tmp_path, "--no-report")
    assert not (path / "report.html").exists()
    assert (path / "summary.json").is_file()


@pytest.mark.parametrize("kind", ["complete", "interrupted", "errors", "http", "synthetic10k"])
def test_report_renders_and_parses_for_every_kind_of_run(runs: dict[str, Path], kind: str) -> None:
    run = read_run(runs[kind])
    html = render_report(run)
    checker = parse(html)
    for section in SECTIONS:
        assert section in checker.ids, (kind, section)
    text = " ".join(checker.text)
    status = run.manifest["status"]
    assert status in text
    # plotly.js is inlined exactly once (its basic bundle: every figure is a scatter or a
    # bar); figures are JSON blocks drawn by one script.
    assert len(re.findall(r"\* plotly\.js (\(basic - minified\) )?v\d", html)) == 1
    assert "plotly.js (basic - minified)" in html
    json_blocks = [d for a, d in checker.scripts if a.get("type") == "application/json"]
    assert json_blocks, kind
    for block in json_blocks:
        fig = json.loads(block)
        assert "data" in fig and "layout" in fig
    assert len(json_blocks) == html.count("data-figure=")


def test_measurement_warnings_are_shown_escaped(runs: dict[str, Path]) -> None:
    run = read_run(runs["complete"])
    assert run.summary is not None
    run.summary["warnings"] = [f"other processes used 60% of the CPU {EVIL}"]
    html = render_report(run)
    assert "Warning: other processes used 60% of the CPU" in " ".join(parse(html).text)
    assert "<script>alert" not in html


def test_interrupted_and_failed_requests_are_flagged(runs: dict[str, Path]) -> None:
    html = render_report(read_run(runs["interrupted"]))
    assert 'class="banner' in html and "<b>interrupted</b>" in html
    run = read_run(runs["errors"])
    text = " ".join(parse(render_report(run)).text)
    assert f"{run.summary['counts']['failed']:,} request(s) failed" in text
    assert f"RuntimeError: {EVIL}" in text  # shown, as text


def test_http_run_says_what_is_not_available(runs: dict[str, Path]) -> None:
    run = read_run(runs["http"])
    assert run.steps.empty and run.telemetry.empty
    text = " ".join(parse(render_report(run)).text)
    assert "roofline not available: no model spec" in text
    assert "Not available" in text  # verdicts / energy
    assert "MFU / MBU" in text and "no roofline" in text


def test_every_user_string_is_escaped(runs: dict[str, Path]) -> None:
    run = read_run(runs["errors"])
    html = render_report(run)
    checker = parse(html)
    # The payload never appears as markup: not in the page, not inside any script block.
    assert "<script>alert" not in html
    for attrs, data in checker.scripts:
        assert "alert(" not in data or attrs.get("type") == "application/json"
        if attrs.get("type") == "application/json":
            assert "<" not in data
    text = " ".join(checker.text)
    for where in (
        f"engine: {EVIL}",  # run errors
        f"hf:/models/{EVIL}",  # model path / engine URI
        f"/data/{EVIL}.jsonl",  # prompts file
        f"say {EVIL}",  # prompt
        EVIL,  # run name (title and header)
    ):
        assert where in text, where
    title = re.search(r"<title>(.*?)</title>", html, re.S)
    assert title and "&lt;script&gt;" in title.group(1)
    assert "&quot;x&#x27;&quot;" in html  # both quote kinds escaped


def test_headline_numbers_are_static_html_equal_to_the_summary(runs: dict[str, Path]) -> None:
    run = read_run(runs["synthetic10k"])
    html = render_report(run)
    s = run.summary
    assert s is not None
    for key in ("ttft", "tpot", "e2e"):
        p50 = s["latency"][key]["p50"]
        cell = re.search(rf"data-key='{key}\.p50'>([^<]*)<", html)
        assert cell is not None
        # The table shows ms with 3 significant digits.
        assert cell.group(1) == f"{p50 * 1e3:.3g} ms"


def test_report_sizes_stay_under_6_mb(runs: dict[str, Path], tmp_path: Path) -> None:
    small = synthetic_run(tmp_path, 1_000, name="thousand")
    size_1k = write_report(read_run(small)).stat().st_size
    size_10k = write_report(read_run(runs["synthetic10k"])).stat().st_size
    print(f"report size: 1,000 requests {size_1k:,} B; 10,000 requests {size_10k:,} B")
    assert size_1k < 6_000_000
    assert size_10k < 6_000_000


def test_request_table_shows_the_first_n_with_a_note(runs: dict[str, Path]) -> None:
    html = render_report(read_run(runs["synthetic10k"]), max_requests=25)
    table = re.search(r"<table id='request-table'>.*?</table>", html, re.S)
    assert table is not None
    assert table.group(0).count("<tr>") == 1 + 25
    assert "Showing the first 25 of 10,000 requests" in html
    assert "perfscope export RUN --format csv" in html


def test_report_command_writes_the_file_and_prints_its_size(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(runs["http"]), "-o", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info == {"path": str(out), "bytes": out.stat().st_size}
    parse(out.read_text(encoding="utf-8"))


def test_report_command_through_register(runs: dict[str, Path], tmp_path: Path) -> None:
    import argparse

    from perfscope.cli import report as _cli_report

    parser = argparse.ArgumentParser()
    _cli_report.register(parser.add_subparsers())
    args = parser.parse_args(["report", str(runs["interrupted"]), "-o", str(tmp_path)])
    buf = io.StringIO()
    assert args.handler(args, Console(file=buf, width=120)) == 0
    assert (tmp_path / "report.html").is_file()
    assert "report:" in buf.getvalue()


def test_report_of_a_missing_run_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does not exist" in err


def test_a_report_derives_the_per_request_rows_once(
    runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request table and the latency figure share one derivation of the rows."""
    from perfscope.analysis import compare, metrics

    calls: list[int] = []
    real = metrics.per_request

    def counted(requests: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(requests))
        return real(requests, *args, **kwargs)

    monkeypatch.setattr(metrics, "per_request", counted)  # the view imports it when it draws
    monkeypatch.setattr(compare, "per_request", counted)
    html = render_report(read_run(runs["complete"]))
    assert "id='request-table'" in html and 'id="fig-latency"' in html
    assert len(calls) == 1


def test_a_report_of_the_default_run_size_is_at_most_1_5_mb(tmp_path: Path) -> None:
    """48 requests (the default run's count) with telemetry: the partial plotly bundle and
    compact figure data keep the file within 1.5 MB, figures still drawn offline."""
    run = synthetic_run(tmp_path, 48, name="default-size")
    out = write_report(read_run(run))
    size = out.stat().st_size
    print(f"report of 48 requests: {size:,} B")
    assert size <= 1_500_000
    assert "Plotly" in out.read_text()  # inlined: works offline


def test_the_environment_states_cpu_contention_in_words_not_json(
    runs: dict[str, Path],
) -> None:
    html = render_report(read_run(runs["complete"]))
    env = re.search(r'<section id="environment">.*?</section>', html, re.S)
    assert env is not None
    assert "CPU contention" in env.group(0)
    assert "others_share" not in env.group(0) and "{" not in env.group(0)
