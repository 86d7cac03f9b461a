"""The dashboard's pages, in navigation order.

Each module exposes ``PAGE`` (:class:`perfscope.dashboard.app.pages._common.Page`); the app
factory routes URLs to them and lets each register its callbacks on the app it builds.
"""

from __future__ import annotations

from perfscope.dashboard.app.pages import (
    compare,
    hardware,
    roofline,
    run_detail,
    runs,
    studies,
    sweeps,
)
from perfscope.dashboard.app.pages._common import Page

__all__ = ["PAGES"]

PAGES: tuple[Page, ...] = (
    runs.PAGE,
    run_detail.PAGE,
    compare.PAGE,
    sweeps.PAGE,
    studies.PAGE,
    roofline.PAGE,
    hardware.PAGE,
)
