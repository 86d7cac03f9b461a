"""The Dash app: a web server over a runs directory (``perfscope dashboard``).

The only part of ``dashboard/`` that imports ``dash``: :mod:`.server` builds the app and
guards its requests, :mod:`.pages` holds one module per page, :mod:`.data` reads the runs
directory for them. The report, figures, exporters and terminal tables beside this package
are presentation that needs no web server (docs/architecture.md, "Presentation").
"""

from __future__ import annotations

from perfscope.dashboard.app.server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    allow_host,
    create_app,
    host_allowed,
    is_loopback,
    serve,
)

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "allow_host",
    "create_app",
    "host_allowed",
    "is_loopback",
    "serve",
]
