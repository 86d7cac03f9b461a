"""Screenshots of every dashboard page and the HTML report at 1280, 1440 and 1920 px wide.

Serves ``create_app(RUNS_DIR)`` on 127.0.0.1 from a thread and visits each page of the app's
navigation (plus one run's detail page and a comparison of two runs, and ``--report`` files),
at every ``--widths`` (900 px high), saving ``NAME-WIDTH.png`` (the first screen) and
``NAME-WIDTH-full.png`` (the whole page), and printing per page the elements whose content is
wider than their box (text cut off) and whether the page itself scrolls sideways. Needs
``/usr/bin/chromium`` and the ``playwright`` Python package (no browser download). The PNGs
are for looking at, not for the repository.

Run: ``python scripts/dashboard_screenshots.py RUNS_DIR OUT_DIR [--compare A,B] [--run ID]
[--report RUN_DIR/report.html] [--widths 1280,1440,1920]``.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]

#: JavaScript: cells and headers of every table whose text is wider than the cell, and
#: tables that scroll sideways inside their box (their last columns are out of sight).
CUT_JS = """
() => Array.from(document.querySelectorAll('th, td:not(.dash-select-cell)'))
  .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
  .map(e => (e.innerText || '').trim().slice(0, 60)
    + ' [' + e.scrollWidth + '>' + e.clientWidth + ']')
  .concat(Array.from(document.querySelectorAll('.dash-spreadsheet-container'))
    .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
    .map(e => 'table #' + (e.closest('[id]') || {id: '?'}).id + ' scrolls sideways ['
      + e.scrollWidth + '>' + e.clientWidth + ']'))
"""

#: JavaScript: true once no Dash component is loading and the page's own content is drawn
#: (an empty page's "pick two or more runs" counts: it is what that page shows); the
#: report, which is not a Dash page, once its text is there.
READY_JS = """
() => {
  if (document.querySelector('[data-dash-is-loading="true"], ._dash-loading')) return false;
  const main = document.querySelector('#page-content');  // a Dash page; else the report
  const text = (main || document.body).innerText.replace(/\\s+/g, ' ').trim();
  return text.length > (main ? 40 : 200);
}
"""

#: JavaScript: how many px the page is wider than the window (0: no sideways scrolling).
SIDEWAYS_JS = "() => Math.max(0, document.documentElement.scrollWidth - window.innerWidth)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--compare", default=None, help="two or more run ids, comma-separated")
    ap.add_argument("--run", default=None, help="the run whose detail page is shot")
    ap.add_argument("--wait-ms", type=int, default=2500, help="settle time per page")
    ap.add_argument(
        "--widths", default="1280,1440,1920", help="viewport widths in px (default 1280,1440,1920)"
    )
    ap.add_argument(
        "--report", action="append", default=[], type=Path, help="an HTML report to shoot too"
    )
    ap.add_argument(
        "--pages",
        default=None,
        help="only these pages, comma-separated keys (runs,compare,...; default every page)",
    )
    args = ap.parse_args()

    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from perfscope.dashboard.app import create_app
    from perfscope.dashboard.app.pages import PAGES

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = create_app(args.runs_dir, poll_interval_s=60.0)
    port = _free_port()
    server = make_server("127.0.0.1", port, app.server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    # The run page needs an id (--run); every other page of the navigation as it is.
    targets = [(p.key, p.path) for p in PAGES if "<" not in p.path and p.key != "run"]
    if args.run:
        targets.append(("run-detail", f"/run/{args.run}"))
    if args.compare:
        targets.append(("compare-runs", f"/compare?runs={args.compare}"))
        targets.append(("roofline-overlay", f"/roofline?runs={args.compare}"))
    if args.pages:
        keep = set(args.pages.split(","))
        targets = [(name, path) for name, path in targets if name in keep]
    pages = [(name, url + path) for name, path in targets]
    pages += [(f"report-{r.parent.name}", r.resolve().as_uri()) for r in args.report]
    widths = [int(w) for w in args.widths.split(",")]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    problems = 0
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            errors: list[str] = []
            for width in widths:
                ctx = browser.new_context(viewport={"width": width, "height": 900})
                page = ctx.new_page()
                page.on("pageerror", lambda e: errors.append(str(e)))
                for name, address in pages:
                    page.goto(address)
                    page.wait_for_load_state("networkidle")
                    # Wait on the page's own state: Dash done loading and content drawn.
                    try:
                        page.wait_for_function(READY_JS, timeout=60_000)
                    except PlaywrightTimeout:
                        print(f"{name} @ {width}px: still loading after 60 s")
                    page.wait_for_timeout(args.wait_ms)
                    shot = args.out_dir / f"{name}-{width}.png"
                    page.screenshot(path=str(shot), full_page=False)
                    page.screenshot(
                        path=str(args.out_dir / f"{name}-{width}-full.png"), full_page=True
                    )
                    cut = page.evaluate(CUT_JS)
                    sideways = page.evaluate(SIDEWAYS_JS)
                    problems += bool(cut) + bool(sideways) + bool(errors)
                    print(
                        f"{name} @ {width}px: {shot.name} cut={cut[:8]} "
                        f"page wider than the window by {sideways} px; errors={errors}"
                    )
                    errors.clear()
                ctx.close()
            browser.close()
    finally:
        server.shutdown()
    print(f"{problems} problem(s) over {len(pages)} pages x {len(widths)} widths")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
