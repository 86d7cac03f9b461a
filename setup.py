"""Package discovery for the five top-level folders that map into one ``perfscope`` namespace.

pyproject.toml holds all metadata; only the package list is computed here, so a new
subpackage (any folder with an ``__init__.py``) ships without anyone editing a list. A
hand-kept list once left ``perfscope.pytest_plugin`` out of the wheel while the
``pytest11`` entry point still named it (docs/architecture.md, "Packaging").
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = {
    "perfscope": "perfscope",
    "perfscope.profiler": "profiler",
    "perfscope.hwdb": "hwdb",
    "perfscope.analysis": "analysis",
    "perfscope.dashboard": "dashboard",
}


def find_packages() -> list[str]:
    """Every folder under a mapped root that holds an ``__init__.py``, as a dotted name."""
    found: list[str] = []
    for name, folder in PACKAGE_DIR.items():
        base = ROOT / folder
        for init in sorted(base.rglob("__init__.py")):
            rel = init.parent.relative_to(base)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            found.append(".".join((name, *rel.parts)) if rel.parts else name)
    return found


setup(package_dir=PACKAGE_DIR, packages=find_packages())
