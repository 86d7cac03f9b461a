"""The dashboard in a real headless Chromium (Debian ``chromium``), driven by Playwright.

The app serves runs made by perfscope in the test (two ``perfscope run`` runs, a broken
directory, a 10,000-request synthetic run) from a daemon thread on 127.0.0.1. Every page is
checked for console errors; screenshots land in pytest's temporary folder (printed), which
CI keeps as the test artifacts. No ``playwright install`` download: the system Chromium is
launched by path.
"""

from __future__ import annotations

import logging
import re
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.data.runs.builders import EVIL, complete_run, run_without_slos, synthetic_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # Chromium: 62 s for 10 tests at load 3

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
TIMEOUT_MS = 30_000

if not CHROMIUM.exists():
    pytest.skip(
        "no /usr/bin/chromium (Debian: apt-get install chromium chromium-driver; "
        ".ci/run installs it)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")


class Site:
    """The served app and the runs behind it."""

    def __init__(
        self, root: Path, url: str, big: Path, alpha: Path, beta: Path, no_slo: Path
    ) -> None:
        self.root = root
        self.url = url
        self.big = big
        self.alpha = alpha
        self.beta = beta
        self.no_slo = no_slo
        self.broken = root / "20990101-000000-broken-0000"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    from werkzeug.serving import make_server

    from perfscope.dashboard.app import create_app

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        root = tmp_path_factory.mktemp("browser-dash-runs")
        common = ("--hw", "epyc-9654", "--requests", "12")
        alpha = complete_run(root, *common, "--name", "alpha")
        beta = complete_run(root, *common, "--name", "beta", "--batch-size", "2")
        big = synthetic_run(root, 10_000, name="big")
        no_slo = run_without_slos(root, "--hw", "epyc-9654", "--name", "noslo")
        broken = root / "20990101-000000-broken-0000"
        broken.mkdir()
        (broken / "manifest.json").write_text("{truncated", encoding="utf-8")
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        app = create_app(root, poll_interval_s=1.0)
        port = _free_port()
        server = make_server("127.0.0.1", port, app.server, threaded=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield Site(root, f"http://127.0.0.1:{port}", big, alpha, beta, no_slo)
        finally:
            server.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard-screenshots")


class Page:
    """A browser tab that records console errors and uncaught exceptions."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.errors: list[str] = []
        self.page.on(
            "console",
            lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None,
        )
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def shot(self, shots: Path, name: str) -> Path:
        path = shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        sys.stderr.write(f"\nscreenshot: {path}\n")
        return path


@pytest.fixture
def tab(browser: Any) -> Iterator[Page]:
    p = Page(browser)
    try:
        yield p
    finally:
        p.context.close()


def _cell_locator(page: Any, run_id: str, column: str) -> Any:
    """The runs table's cell of ``run_id`` in ``column``, as a locator (re-resolved on use)."""
    row = page.locator(
        "#runs-table tr", has=page.locator(f"td[data-dash-column=link] >> text={run_id}")
    )
    return row.locator(f"td[data-dash-column={column}]")


def _cell(page: Any, run_id: str, column: str) -> str:
    text: str = _cell_locator(page, run_id, column).inner_text()
    return text


def _expect_cell(page: Any, run_id: str, column: str, pattern: str) -> None:
    """Wait until the cell's text matches ``pattern`` (a regex): the runs table re-renders on
    every poll, and a read between two renders sees a row the page has not filled yet (the
    cause of this test's flakes), so wait on the page's own state instead of reading once."""
    sync_api.expect(_cell_locator(page, run_id, column)).to_have_text(re.compile(pattern))


# ---------------------------------------------------------------------- tests


def test_runs_page_shows_the_runs_and_the_broken_one(site: Site, tab: Page, shots: Path) -> None:
    page = tab.page
    t0 = time.perf_counter()
    page.goto(site.url + "/")
    page.wait_for_selector(f"#runs-table td[data-dash-column=link] >> text={site.alpha.name}")
    load = time.perf_counter() - t0
    # State and status are one short column; the reason of a broken run has its own.
    for run in (site.alpha, site.beta, site.big):
        _expect_cell(page, run.name, "outcome", r"^complete$")
    _expect_cell(page, site.broken.name, "outcome", r"^broken")
    _expect_cell(page, site.broken.name, "problem", r"manifest\.json")
    # New runs appear without a reload (the page polls the directory).
    late = complete_run(site.root, "--hw", "epyc-9654", "--name", "late")
    page.wait_for_selector(f"#runs-table td[data-dash-column=link] >> text={late.name}")
    tab.shot(shots, "runs")
    sys.stderr.write(f"runs page load: {load:.2f} s\n")
    assert not tab.errors, tab.errors


def test_selecting_two_runs_shows_the_comparison(site: Site, tab: Page, shots: Path) -> None:
    page = tab.page
    page.goto(site.url + "/")
    for run in (site.alpha, site.beta):
        row = page.locator(
            "#runs-table tr", has=page.locator(f"td[data-dash-column=link] >> text={run.name}")
        )
        row.locator("input[type=checkbox]").check()
    link = page.locator("#runs-compare-link")
    sync_api.expect(link).to_have_text("Compare 2 selected runs")
    t0 = time.perf_counter()
    link.click()
    page.wait_for_selector("#compare-fig-cdf .main-svg")
    page.wait_for_selector("#compare-table td[data-dash-column=metric] >> text=TTFT p50")
    load = time.perf_counter() - t0
    assert "/compare?runs=" in page.url
    table = page.locator("#compare-table").inner_text()
    # ratios, and for single runs no interval but the reason why
    assert "baseline" in table and "x" in table and "too few runs" in table
    assert page.locator("#compare-fig-metrics .main-svg").count() >= 1
    tab.shot(shots, "compare")
    sys.stderr.write(f"compare page (2 runs): {load:.2f} s after the click\n")
    assert not tab.errors, tab.errors


#: The 10,000-request page's first draw: under 30 s in the quiet CI runs (which passed with
#: a 30 s wait), 52 s at load average 6-7 on the same 2 cores (2026-12-02). Its speed is not
#: asserted here (a timed test on a shared machine measures the load); the time is printed,
#: and the wait allows the busy case.
BIG_PAGE_TIMEOUT_MS = 240_000


def test_large_run_detail_draws_every_figure_with_linked_time_axes(
    site: Site, tab: Page, shots: Path
) -> None:
    page = tab.page
    page.set_default_timeout(BIG_PAGE_TIMEOUT_MS)
    t0 = time.perf_counter()
    page.goto(f"{site.url}/run/{site.big.name}")
    page.wait_for_selector("#detail-fig-timeline .main-svg")
    page.wait_for_selector("#detail-fig-throughput .main-svg")
    page.wait_for_selector("#detail-fig-latency .main-svg")
    page.wait_for_selector("#detail-requests td[data-dash-column=request_id]")
    load = time.perf_counter() - t0
    sys.stderr.write(f"10,000-request run detail page, all figures drawn: {load:.2f} s\n")
    # Zoom the timeline to 10-20 s; the throughput/telemetry figure follows. Late resize
    # events of the freshly drawn page can overtake the first zoom's callback (Dash keeps
    # only the newest answer of a callback), so the zoom is repeated until it sticks, as a
    # user would; one try normally suffices.
    for _attempt in range(5):
        page.evaluate(
            """() => {
                const gd = document.querySelector('#detail-fig-timeline .js-plotly-plot');
                return window.Plotly.relayout(gd, {'xaxis.range[0]': 10, 'xaxis.range[1]': 20});
            }"""
        )
        try:
            page.wait_for_function(
                """() => {
                    const gd = document.querySelector('#detail-fig-throughput .js-plotly-plot');
                    const r = gd && gd._fullLayout.xaxis.range;
                    return r && Math.abs(r[0] - 10) < 1e-6 && Math.abs(r[1] - 20) < 1e-6;
                }""",
                timeout=4000,
            )
            break
        except sync_api.TimeoutError:
            page.evaluate(
                """() => window.Plotly.relayout(
                    document.querySelector('#detail-fig-timeline .js-plotly-plot'),
                    {'xaxis.autorange': true})"""
            )
    else:
        pytest.fail("the throughput figure never followed the timeline's zoom")
    sync_api.expect(page.locator("#detail-range-text")).to_contain_text("10.000 s")
    # Drill down into one request.
    page.locator("#detail-requests td[data-dash-column=request_id]").first.click()
    page.wait_for_selector("#detail-request-fig .main-svg")
    tab.shot(shots, "run-detail-10k")
    assert not tab.errors, tab.errors


def test_roofline_explorer_updates_when_a_slider_moves(site: Site, tab: Page, shots: Path) -> None:
    page = tab.page
    page.goto(site.url + "/roofline")
    page.wait_for_selector("#roofline-fig .main-svg")
    summary = page.locator("#roofline-summary")
    sync_api.expect(summary).to_contain_text("batch 8")
    cell = page.locator(
        "#roofline-table tr", has=page.locator("td[data-dash-column=phase] >> text=decode")
    ).first.locator("td[data-dash-column=tpot_ms]")
    before = cell.inner_text()
    thumb = page.locator("#roofline-batch [role=slider]")
    thumb.focus()
    for _ in range(3):
        thumb.press("ArrowRight")
    sync_api.expect(summary).to_contain_text("batch 64")
    sync_api.expect(cell).not_to_have_text(before)
    tab.shot(shots, "roofline-explorer")
    assert not tab.errors, tab.errors


def test_other_pages_load_without_errors(site: Site, tab: Page, shots: Path) -> None:
    page = tab.page
    page.goto(site.url + "/hardware")
    page.wait_for_selector("#hw-table td[data-dash-column=key] >> text=h100-sxm5-80gb")
    page.locator("#hw-table td[data-dash-column=key] >> text=h100-sxm5-80gb").click()
    sync_api.expect(page.locator("#hw-detail")).to_contain_text("dense.bf16")
    tab.shot(shots, "hardware")
    page.goto(site.url + "/sweeps")
    sync_api.expect(page.locator("main")).to_contain_text("No sweeps")
    page.goto(f"{site.url}/run/{site.broken.name}")
    sync_api.expect(page.locator("main")).to_contain_text("cannot be shown")
    tab.shot(shots, "broken-run")
    assert not tab.errors, tab.errors


def test_user_text_is_not_executed(site: Site, tab: Page, tmp_path: Path) -> None:
    run = complete_run(site.root, "--hw", "epyc-9654", "--name", "xss")
    import json

    manifest = json.loads((run / "manifest.json").read_text())
    manifest["name"] = EVIL
    (run / "manifest.json").write_text(json.dumps(manifest))
    page = tab.page
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.goto(site.url + "/")
    page.wait_for_selector(f"#runs-table td[data-dash-column=link] >> text={run.name}")
    # The name column starts hidden (the table fits the window); show it as a user would.
    page.locator("#runs-table .show-hide").click()
    page.locator("#runs-table .show-hide-menu-item", has_text="name").locator("input").check()
    assert EVIL in _cell(page, run.name, "name")
    assert not dialogs
    shutil.rmtree(run)


# ------------------------------------------------------------- 1,440 px: nothing cut

WIDE = {"width": 1440, "height": 900}

#: Elements of ``selector`` whose content is wider than their box (text cut off), as
#: ``text [scrollWidth>clientWidth]``.
_CUT_JS = """
(selector) => Array.from(document.querySelectorAll(selector))
  .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
  .map(e => (e.innerText || '').trim() + ' [' + e.scrollWidth + '>' + e.clientWidth + ']')
"""


@pytest.fixture
def wide(browser: Any) -> Iterator[Page]:
    p = Page(browser)
    p.context.close()
    p.context = browser.new_context(viewport=WIDE)
    p.page = p.context.new_page()
    p.page.set_default_timeout(TIMEOUT_MS)
    p.page.on("pageerror", lambda e: p.errors.append(f"uncaught: {e}"))
    try:
        yield p
    finally:
        p.context.close()


def _right_edges(page: Any, selector: str) -> dict[str, float]:
    edges: dict[str, float] = page.evaluate(
        "(s) => Object.fromEntries(Array.from(document.querySelectorAll(s))"
        ".map(e => [e.innerText.trim(), e.getBoundingClientRect().right]))",
        selector,
    )
    return edges


def test_runs_list_at_1440_px_fits_shows_every_metric_and_says_no_slos(
    site: Site, wide: Page, shots: Path
) -> None:
    page = wide.page
    page.goto(site.url + "/")
    page.wait_for_selector(f"#runs-table td[data-dash-column=link] >> text={site.no_slo.name}")
    _expect_cell(page, site.no_slo.name, "slo_pct", r"^no SLOs$")
    _expect_cell(page, site.no_slo.name, "goodput_req_s", r"^no SLOs$")
    _expect_cell(page, site.alpha.name, "slo_pct", r"%$")
    sync_api.expect(page.locator("#runs-count")).to_contain_text("from the run index")
    headers = _right_edges(page, "#runs-table th.dash-header")
    for name in ("TTFT p50", "TPOT p50", "output tok/s", "SLO met", "MFU prefill", "J/token"):
        assert headers[name] <= WIDE["width"], (name, headers)
    cut = page.evaluate(_CUT_JS, "#runs-table th.dash-header, #runs-table td.dash-cell")
    assert cut == []
    # The whole table fits (text wraps; engine, name and unused columns start hidden), and
    # the hidden ones are a click away.
    box = page.evaluate(
        "() => { const e = document.querySelector('#runs-table .dash-spreadsheet-container');"
        " return [e.scrollWidth, e.clientWidth]; }"
    )
    assert box[0] <= box[1] + 1, box
    sync_api.expect(page.get_by_role("button", name="Toggle Columns")).to_be_visible()
    wide.shot(shots, "runs-1440")
    assert not wide.errors, wide.errors


def test_hardware_table_at_1440_px_cuts_no_header_and_fits(
    site: Site, wide: Page, shots: Path
) -> None:
    page = wide.page
    page.goto(site.url + "/hardware")
    page.wait_for_selector("#hw-table td[data-dash-column=key] >> text=h100-sxm5-80gb")
    assert page.evaluate(_CUT_JS, "#hw-table th.dash-header, #hw-table td.dash-cell") == []
    edges = _right_edges(page, "#hw-table th.dash-header")
    assert max(edges.values()) <= WIDE["width"], edges
    assert {"mem BW GB/s", "refs"} <= {k.replace("\n", " ") for k in edges}
    wide.shot(shots, "hardware-1440")
    assert not wide.errors, wide.errors


def test_compare_legends_use_short_labels_and_the_config_diff_shows(
    site: Site, wide: Page, shots: Path
) -> None:
    page = wide.page
    page.goto(f"{site.url}/compare?runs={site.alpha.name},{site.beta.name}")
    page.wait_for_selector("#compare-fig-metrics .legendtext")
    legends = page.locator("#compare-fig-metrics .legendtext").all_text_contents()
    assert legends and all(len(t) <= 24 for t in legends), legends
    assert not any(t.startswith("2026") for t in legends), legends
    config = page.locator("#compare-config").inner_text()
    assert "engine.config.batch_size" in config
    table = page.locator("#compare-table").inner_text()
    assert "too few runs" in table  # the blank interval says why
    wide.shot(shots, "compare-1440")
    assert not wide.errors, wide.errors


def test_explorer_labels_stay_inside_the_plot(site: Site, wide: Page, shots: Path) -> None:
    page = wide.page
    page.goto(f"{site.url}/roofline?runs={site.alpha.name},{site.beta.name}")
    page.wait_for_selector("#roofline-fig .textpoint text")
    out = page.evaluate(
        "() => { const svg = document.querySelector('#roofline-fig .main-svg')"
        ".getBoundingClientRect();"
        " return Array.from(document.querySelectorAll('#roofline-fig .textpoint text'))"
        ".map(t => { const b = t.getBoundingClientRect();"
        " return [t.textContent, b.left >= svg.left && b.right <= svg.right"
        " && b.top >= svg.top && b.bottom <= svg.bottom]; }); }"
    )
    assert out and all(inside for _, inside in out), out
    assert all(not text.startswith("2026") for text, _ in out), out
    legend = page.locator("#roofline-fig .legendtext").all_text_contents()
    assert any("roof" in t and "own device" in t for t in legend), legend
    wide.shot(shots, "explorer-1440")
    assert not wide.errors, wide.errors
