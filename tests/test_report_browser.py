"""Open a report in headless Chromium: it draws every figure with no JavaScript error.

The page marks ``<body>`` with ``data-render`` (``ok`` / ``error``, from a ``window.onerror``
hook installed before anything else runs) and ``data-figures-rendered`` once plotly has
drawn; ``--dump-dom`` reads them after the page settles. Console messages are also read
from Chromium's log. The screenshot lands in pytest's temporary folder (the test artifacts).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfscope.dashboard.report import write_report
from perfscope.profiler.store import read_run
from tests.data.runs.builders import EVIL, manual_run, small_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # Chromium, as the dashboard browser tests

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--virtual-time-budget=15000",
    "--enable-logging=stderr",
    "--v=0",
]


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=90,
        )


def console_errors(stderr: str) -> list[str]:
    """Console messages of the page at error level, and uncaught exceptions."""
    return [
        line
        for line in stderr.splitlines()
        if "CONSOLE" in line and ("ERROR" in line.split("CONSOLE")[0] or "Uncaught" in line)
    ]


def body_attrs(dom: str) -> dict[str, str]:
    m = re.search(r"<body([^>]*)>", dom)
    assert m, dom[:500]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        root = tmp_path_factory.mktemp("browser-runs")
        run = manual_run(
            root, name=EVIL, n_requests=12, fail_every=5, error_text=EVIL, model=small_model()
        )
        yield write_report(read_run(run))


def test_report_renders_in_chromium_without_console_errors(report: Path) -> None:
    res = chromium("--dump-dom", report.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    attrs = body_attrs(res.stdout)
    expected = report.read_text(encoding="utf-8").count("data-figure=")
    assert attrs.get("data-render") == "ok", res.stdout[-2000:]
    assert int(attrs["data-figures-rendered"]) == expected > 0
    assert res.stdout.count('class="main-svg"') >= expected  # plotly drew real SVG
    assert console_errors(res.stderr) == []
    assert "alert(" not in "".join(re.findall(r"<script>[^<]*", res.stdout))


def test_a_broken_page_is_detected(report: Path, tmp_path: Path) -> None:
    """The check above can fail: a page that throws is reported as such."""
    broken = tmp_path / "broken.html"
    html = report.read_text(encoding="utf-8")
    broken.write_text(html.replace("</body>", "<script>undefinedFunction();</script></body>"))
    res = chromium("--dump-dom", broken.as_uri())
    assert body_attrs(res.stdout).get("data-render") == "error"
    assert "undefinedFunction" in res.stdout or console_errors(res.stderr)


def test_screenshot_of_the_report(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    res = chromium("--window-size=1280,4000", f"--screenshot={shot}", report.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 50_000  # a drawn page, not a blank one
    print(f"screenshot: {shot}")
