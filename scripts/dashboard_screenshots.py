"""Screenshots of every dashboard page at 1,440 x 900 in the system's headless Chromium.

Serves ``create_app(RUNS_DIR)`` on 127.0.0.1 from a thread and visits each page of the app's
navigation (plus one run's detail page and a comparison of two runs), saving full-page PNGs
and, per page, the elements whose content is wider than their box (text cut off). Needs
``/usr/bin/chromium`` and the ``playwright`` Python package (no browser download).

Run: ``python scripts/dashboard_screenshots.py RUNS_DIR OUT_DIR [--compare A,B] [--run ID]``.
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

#: JavaScript: cells and headers of every table whose text is wider than the cell.
CUT_JS = """
() => Array.from(document.querySelectorAll('th, td:not(.dash-select-cell)'))
  .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
  .map(e => (e.innerText || '').trim().slice(0, 60)
    + ' [' + e.scrollWidth + '>' + e.clientWidth + ']')
"""


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
    args = ap.parse_args()

    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from perfscope.dashboard.app import create_app
    from perfscope.dashboard.pages import PAGES

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
    args.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            ctx = browser.new_context(viewport={"width": 1440, "height": 900})
            page = ctx.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            for name, path in targets:
                page.goto(url + path)
                page.wait_for_load_state("networkidle")
                page.wait_for_timeout(args.wait_ms)
                shot = args.out_dir / f"{name}.png"
                page.screenshot(path=str(shot), full_page=False)
                page.screenshot(path=str(args.out_dir / f"{name}-full.png"), full_page=True)
                cut = page.evaluate(CUT_JS)
                print(f"{name}: {shot} cut={cut[:8]} errors={errors}")
                errors.clear()
            browser.close()
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
