"""Presentation: figure builders, HTML report, Dash app, exporters.

The names below are the dashboard's public surface; they load on first use (plotly and
dash only when a figure, report or app is asked for).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "create_app",
    "serve",
    "write_csv",
    "write_json",
    "write_perfetto",
    "write_report",
]

if TYPE_CHECKING:
    from perfscope.dashboard.app import create_app, serve
    from perfscope.dashboard.exporters import write_csv, write_json, write_perfetto
    from perfscope.dashboard.report import write_report

_HOME = {
    "create_app": "app",
    "serve": "app",
    "write_csv": "exporters",
    "write_json": "exporters",
    "write_perfetto": "exporters",
    "write_report": "report",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'perfscope.dashboard' has no attribute {name!r}")
    return getattr(importlib.import_module(f"perfscope.dashboard.{home}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
