"""The perfscope dashboard: a Dash app over a runs directory (``perfscope dashboard``).

:func:`create_app` builds a fresh app every call: its data (:class:`RunRepository`), its
pages and its callbacks (``app.callback`` inside the factory) belong to that app only.
Pages are registered programmatically in a router of our own rather than with
``dash.register_page``, whose registry is process-global and would leak pages from one app
into the next.

Security: the server binds 127.0.0.1 unless told otherwise (:func:`serve` warns for any
other address), runs without debug mode, and takes run ids from URLs only after
:func:`perfscope.dashboard.app.data.validate_run_id`; a bad id gets a 400/404 response from
the server before any page is built. Requests whose ``Host`` header names anything but a
loopback name or the bound address are refused (403), so a DNS-rebinding page in the
user's browser cannot read the runs. Every file read is resolved inside the runs root
(:mod:`perfscope.dashboard.app.data`), and a callback that fails answers with a message in the
page, never a 500.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote

import dash
from dash import Input, NoUpdate, Output, dcc, html
from dash.development.base_component import Component
from flask import Flask, Response

from perfscope.dashboard.app.data import (
    RUN_ID_PATTERN,
    InvalidRunIdError,
    RunRepository,
    validate_run_id,
)
from perfscope.dashboard.app.pages import PAGES
from perfscope.dashboard.app.pages._common import (
    DashboardContext,
    Page,
    PageRequest,
    Style,
    error_box,
)
from perfscope.errors import PerfscopeError, RunNotFoundError, UsageError

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "allow_host",
    "create_app",
    "host_allowed",
    "is_loopback",
    "serve",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050

_log = logging.getLogger("perfscope.dashboard")
_API_ENDPOINTS = frozenset({"perfscope_api_runs", "perfscope_api_summary"})
#: ``app.server.config`` key of the set of extra host names the server answers to.
_ALLOWED_HOSTS = "PERFSCOPE_ALLOWED_HOSTS"

_NAV_STYLE: Style = {
    "display": "flex",
    "gap": "18px",
    "alignItems": "baseline",
    "padding": "10px 16px",
    "background": "#1f2d3d",
    "color": "#fff",
}


def _nav(pages: Sequence[Page]) -> html.Nav:
    links: list[Component] = [html.Strong("perfscope", style={"fontSize": "18px"})]
    for p in pages:
        if p.nav:
            links.append(
                dcc.Link(p.title, href=p.path, id=f"nav-{p.key}", style={"color": "#cfe3ff"})
            )
    return html.Nav(links, style=_NAV_STYLE)


def _match(pages: Sequence[Page], pathname: str) -> tuple[Page, str] | None:
    path = pathname or "/"
    for p in pages:
        if p.prefix and path.startswith(p.path):
            return p, path[len(p.path) :]
    for p in pages:
        if not p.prefix and (path == p.path or path.rstrip("/") == p.path.rstrip("/")):
            return p, ""
    if path in ("", "/runs", "/runs/"):
        return next(p for p in pages if p.key == "runs"), ""
    return None


def _well_formed(run_id: str) -> bool:
    return bool(RUN_ID_PATTERN.fullmatch(run_id)) and ".." not in run_id


def _guard_requests(server: Flask, dctx: DashboardContext) -> None:
    """Reject bad run ids in page URLs and the JSON API before Dash sees them."""
    from flask import abort, jsonify, request

    def check(run_id: str) -> None:
        try:
            validate_run_id(dctx.runs_dir, run_id)
        except InvalidRunIdError:
            abort(400, description="invalid run id")
        except RunNotFoundError:
            abort(404, description="no such run")

    @server.before_request
    def _check_host() -> None:
        if not host_allowed(request.host, server.config[_ALLOWED_HOSTS]):
            abort(403, description="this dashboard answers only to localhost and its address")

    @server.before_request
    def _validate_run_urls() -> None:
        path = request.path
        if ".." in path.split("/") or "\\" in path or "\x00" in path:
            abort(400, description="invalid path")
        if path.startswith("/api/") and request.endpoint not in _API_ENDPOINTS:
            abort(404, description="no such API endpoint")
        if path.startswith("/run/"):
            check(unquote(path[len("/run/") :]).strip("/"))
        elif path.rstrip("/") == "/compare":
            ids = [r.strip() for v in request.args.getlist("runs") for r in v.split(",")]
            ids += [b for b in request.args.getlist("baseline") if b]
            ids = [i for i in ids if i]
            # Every id well-formed first (400), then every run present (404).
            if any(not _well_formed(i) for i in ids):
                abort(400, description="invalid run id")
            for rid in ids:
                check(rid)

    @server.route("/api/runs", endpoint="perfscope_api_runs")
    def _api_runs() -> Response:
        return jsonify([r.to_record() for r in dctx.repo.rows()])

    @server.route("/api/runs/<run_id>/summary.json", endpoint="perfscope_api_summary")
    def _api_summary(run_id: str) -> Response:
        check(run_id)
        summary = dctx.repo.summary(run_id)
        if summary is None:
            abort(404, description="this run has no summary.json")
        return jsonify(summary)


def create_app(
    runs_dir: Path | str,
    *,
    poll_interval_s: float = 2.0,
    hwdb_dirs: Sequence[Path | str] = (),
    max_loaded_runs: int = 6,
    allowed_hosts: Sequence[str] = (),
) -> dash.Dash:
    """A new dashboard app over ``runs_dir``.

    Args:
        runs_dir: root folder of run directories (it may not exist yet).
        poll_interval_s: how often the runs page rescans the folder, in seconds.
        hwdb_dirs: user overlay directories for the hardware database.
        max_loaded_runs: runs whose tables stay in memory (least recently used go first).
        allowed_hosts: host names or addresses the server answers to besides the loopback
            names (:func:`serve` adds the address it binds).

    Returns:
        The Dash app; ``app.server`` is its Flask (WSGI) app. Serve it with :func:`serve`.
    """
    if poll_interval_s <= 0:
        raise UsageError(f"poll interval must be positive, got {poll_interval_s}")
    dctx = DashboardContext(
        repo=RunRepository(Path(runs_dir), max_loaded=max_loaded_runs),
        poll_interval_s=poll_interval_s,
        hwdb_dirs=tuple(Path(d) for d in hwdb_dirs),
    )
    app = dash.Dash(
        __name__,
        title="perfscope",
        update_title="",  # keep the title while callbacks run
        pages_folder="",
        use_pages=False,
        suppress_callback_exceptions=True,
        serve_locally=True,
        include_assets_files=False,
        on_error=_callback_error,
    )
    app.server.config[_ALLOWED_HOSTS] = set()
    for h in allowed_hosts:
        allow_host(app, h)
    pages = list(PAGES)
    app.layout = html.Div(
        [
            dcc.Location(id="url", refresh=False),
            _nav(pages),
            html.Main(id="page-content", style={"padding": "8px 20px"}),
        ],
        style={"fontFamily": "sans-serif", "background": "#fafafa", "minHeight": "100vh"},
    )

    @app.callback(
        Output("page-content", "children"),
        Input("url", "pathname"),
        Input("url", "search"),
    )
    def route(pathname: str | None, search: str | None) -> Component:
        found = _match(pages, pathname or "/")
        if found is None:
            return error_box(f"no page at {pathname!r}", title="Not found")
        page, rest = found
        try:
            return page.layout(dctx, PageRequest.parse(unquote(rest), search))
        except PerfscopeError as exc:
            return error_box(str(exc))
        except Exception as exc:  # one broken page must not take the app down
            _log.exception("page %s failed", page.key)
            return error_box(f"{type(exc).__name__}: {exc}", title=f"{page.title} page failed")

    for page in pages:
        page.register(app, dctx)
    _guard_requests(app.server, dctx)
    # Unknown files under /_dash-component-suites/ are a 404, not a 500 with a traceback.
    app.server.register_error_handler(
        dash.exceptions.DependencyException, lambda _exc: ("not found", 404)
    )
    app.server.extensions["perfscope"] = dctx
    return app


def _callback_error(exc: Exception) -> Component | NoUpdate | list[Component | NoUpdate]:
    """A failed callback answers with a message where it fills a container, and leaves
    every other output as it was (instead of Dash's 500)."""
    if isinstance(exc, PerfscopeError):
        text = str(exc)
    else:
        _log.error("callback failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        text = f"this view failed ({type(exc).__name__}); the server log has the details"
    outputs = dash.callback_context.outputs_list
    if isinstance(outputs, dict):
        return error_box(text) if outputs.get("property") == "children" else dash.no_update
    return [
        error_box(text)
        if isinstance(o, dict) and o.get("property") == "children"
        else dash.no_update
        for o in outputs
    ]


def _host_name(header: str) -> str:
    """The name in a ``Host`` header, without port, brackets or a trailing dot, lowercased."""
    h = header.strip().lower()
    if h.startswith("["):
        h = h[1 : h.find("]")] if "]" in h else h[1:]
    elif h.count(":") == 1:
        h = h.rsplit(":", 1)[0]
    return h.rstrip(".")


def host_allowed(header: str, extra: set[str] | frozenset[str] = frozenset()) -> bool:
    """Whether a request's ``Host`` header names this server: a loopback name or address,
    or one of ``extra`` (the bound address and names given to :func:`allow_host`)."""
    name = _host_name(header)
    return bool(name) and (is_loopback(name) or name in extra)


def allow_host(app: dash.Dash, host: str) -> None:
    """Let ``app`` answer requests whose ``Host`` is ``host``. A wildcard bind address
    (``0.0.0.0``, ``::``) allows this machine's name and addresses instead."""
    allowed: set[str] = app.server.config.setdefault(_ALLOWED_HOSTS, set())
    name = _host_name(host)
    if name in ("0.0.0.0", "::", ""):
        import socket

        names = {socket.gethostname(), socket.getfqdn()}
        for n in list(names):
            with contextlib.suppress(OSError):
                names.update(str(a[4][0]) for a in socket.getaddrinfo(n, None))
        allowed.update(_host_name(n) for n in names if n)
    else:
        allowed.add(name)


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(app: dash.Dash, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve the app with waitress, a production WSGI server, in this thread (blocks).

    No development-server warning and no log line per request or callback (waitress logs
    only its start and errors). Without waitress installed, Flask's development server is
    the fallback, with its request log silenced. ``host`` is always passed explicitly, so a
    stray ``HOST`` environment variable never rebinds the server; it is added to the names
    the server answers to.
    """
    allow_host(app, host)
    try:
        from waitress import serve as waitress_serve
    except ImportError:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        app.run(host=host, port=port, debug=False, use_reloader=False)
        return
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "task queue depth" chatter
    waitress_serve(app.server, host=host, port=port, threads=8, ident="perfscope")
