"""The dashboard's studies page: a real study made by ``perfscope.study`` on the reference
engine, served by a real Dash app on 127.0.0.1 and read in the real headless Chromium.

Checked: the list names every stored study (an unreadable one with its reason), the chosen
study shows its per-setting table, the effects with interval, projection and error exactly
as the stored record has them, the roofline and the metric curves against the knob; a bad
study id is refused and a run path outside the runs directory is never read.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import perfscope
from perfscope.analysis.study import Study, read_study

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage"]
TIMEOUT_MS = 60_000
FAST: dict[str, Any] = {
    "model_preset": "tiny",
    "requests": 3,
    "warmup": 0,
    "prompt_len": 8,
    "output_len": 4,
    "telemetry": False,
    "seed": 0,
}


class Site:
    def __init__(self, root: Path, url: str, study: Study) -> None:
        self.root = root
        self.url = url
        self.study = study
        self.study_id = Path(str(study.path)).stem


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
        root = tmp_path_factory.mktemp("studies-runs")
        study = perfscope.study(
            "batch-size", [1, 2], repeat=2, runs_dir=root, hw="epyc-9654", **FAST
        )
        (root / "studies" / "20990101-000000-broken.json").write_text("{trunc", encoding="utf-8")
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        app = create_app(root, poll_interval_s=1.0)
        port = _free_port()
        server = make_server("127.0.0.1", port, app.server, threaded=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield Site(root, f"http://127.0.0.1:{port}", study)
        finally:
            server.shutdown()


def test_studies_are_listed_and_read_only_inside_the_runs_directory(
    site: Site, tmp_path: Path
) -> None:
    from perfscope.dashboard.app.data import InvalidRunIdError, RunRepository
    from perfscope.dashboard.app.pages._common import DashboardContext
    from perfscope.dashboard.app.pages.studies import list_studies, load_study
    from perfscope.errors import RunNotFoundError

    dctx = DashboardContext(repo=RunRepository(site.root))
    listed = {s.study_id: s for s in list_studies(dctx)}
    assert listed[site.study_id].knob == "batch-size"
    assert listed[site.study_id].values == ("1", "2")
    assert listed[site.study_id].repeat == 2
    assert "unreadable" in str(listed["20990101-000000-broken"].error)
    assert load_study(dctx, site.study_id) == read_study(str(site.study.path))
    for bad in ("../x", "a/b", "x" * 300):
        with pytest.raises(InvalidRunIdError):
            load_study(dctx, bad)
    with pytest.raises(RunNotFoundError, match="no study"):
        load_study(dctx, "20990101-000000-none")

    # A study that names a run outside the runs directory: the page never reads it.
    outside = tmp_path / "outside-run"
    outside.mkdir()
    (outside / "summary.json").write_text('{"roofline": {"available": true}}', encoding="utf-8")
    data = json.loads(Path(str(site.study.path)).read_text())
    for s in data["settings"]:
        for r in s["runs"]:
            r["run"] = str(outside)
    root2 = tmp_path / "runs2"
    (root2 / "studies").mkdir(parents=True)
    (root2 / "studies" / "20990101-000000-elsewhere.json").write_text(json.dumps(data))
    from perfscope.dashboard.app.pages.studies import study_body

    body = json.dumps(
        study_body(
            DashboardContext(repo=RunRepository(root2)), "20990101-000000-elsewhere"
        ).to_plotly_json(),
        default=str,
    )
    assert "not in this runs directory" in body
    assert "no run of this study has a roofline" in body


sync_api: Any = None
if CHROMIUM.exists():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if sync_api is None:
        pytest.skip("no /usr/bin/chromium (Debian: apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.mark.browser
def test_studies_page_shows_the_table_effects_and_curves_in_chromium(
    site: Site, browser: Any, tmp_path: Path
) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    try:
        page.goto(site.url + "/")
        page.click("#nav-studies")
        page.wait_for_selector(f"#studies-list >> text={site.study_id}")
        sync_api.expect(page.locator("#studies-list")).to_contain_text("20990101-000000-broken")
        sync_api.expect(page.locator("#studies-list")).to_contain_text("unreadable")

        page.goto(f"{site.url}/studies?study={site.study_id}")
        page.wait_for_selector("#studies-settings td[data-dash-column=value]")
        sync_api.expect(page.locator("#studies-facts")).to_contain_text("knob batch-size")
        values = page.locator("#studies-settings td[data-dash-column=value]").all_inner_texts()
        assert values == ["1", "2"]
        tok_s = page.locator("#studies-settings td[data-dash-column=output_tok_s]").first
        sync_api.expect(tok_s).to_contain_text("tokens/s")
        # The effects table shows the stored record's numbers, row by row.
        cand = site.study.settings[1]
        shown = page.locator("#studies-effects tbody tr").all_inner_texts()
        tpot = next(e for e in cand.effects if e.metric == "tpot_p50_s")
        row = next(r for r in shown if "TPOT p50" in r)
        assert tpot.change.ratio is not None and f"{tpot.change.ratio:.3f}x" in row
        # Two repeats a setting are below the experiment module's floor (6 blocks): no interval,
        # and the row says so rather than showing one.
        if tpot.change.ci is not None:
            assert f"[{tpot.change.ci[0]:.3f}, {tpot.change.ci[1]:.3f}]" in row
        else:
            assert "noise unknown" in row or "too few" in row or "n/a" in row
        assert tpot.projected_ratio is not None and f"{tpot.projected_ratio:.3f}x" in row
        assert tpot.error is not None and f"{100 * tpot.error:+.0f}%" in row
        # The roofline with every setting and a curve per metric against the knob.
        for gid in ("study-roofline", "study-tpot_p50_s", "study-output_tok_s"):
            page.wait_for_selector(f"#{gid} .main-svg")
        legend = page.locator("#study-roofline .legendtext").all_text_contents()
        assert any("batch-size=1" in t for t in legend)
        assert any("batch-size=2" in t for t in legend)
        curve = page.locator("#study-tpot_p50_s .legendtext").all_text_contents()
        assert any("measured" in t for t in curve)
        assert any("projection" in t for t in curve)
        # A run link leads to the run's own page.
        link = page.locator("#studies-settings td[data-dash-column=runs] a").first
        href = link.get_attribute("href")
        assert href is not None and href.startswith("/run/")
        shot = tmp_path / "studies.png"
        page.screenshot(path=str(shot), full_page=True)
        sys.stderr.write(f"\nscreenshot: {shot}\n")

        page.goto(f"{site.url}/studies?study=..%2Fescape")
        sync_api.expect(page.locator("main")).to_contain_text("invalid study id")
        assert not errors, errors
    finally:
        context.close()
