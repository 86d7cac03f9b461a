"""docs/reliability.md's fault table is built from the markers of tests/reliability/ and
cannot go stale: every test there has its four fields, and the page shows exactly them."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.conftest import ROOT


def _fault_table() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fault_table", ROOT / "scripts" / "fault_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_reliability_test_has_the_four_fault_fields_filled() -> None:
    ft = _fault_table()
    rows = ft.collect()
    assert len(rows) >= 60
    missing = [f"{r.module}::{r.test}: {r.missing()}" for r in rows if r.missing()]
    assert not missing, missing
    # ast sees module-level functions only: a test class would escape the table.
    for path in sorted((ROOT / "tests" / "reliability").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
        assert not [c for c in classes if c.startswith("Test")], (path.name, classes)


def test_the_docs_table_is_the_one_the_markers_give() -> None:
    ft = _fault_table()
    page = (ROOT / "docs" / "reliability.md").read_text()
    assert ft.replace_table(page, ft.table(ft.collect())) == page, (
        "docs/reliability.md is stale: run scripts/fault_table.py --write docs/reliability.md"
    )


def test_a_test_without_a_marker_or_with_a_blank_field_is_named(tmp_path: Path) -> None:
    ft = _fault_table()
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.fault(fault='f', before='b', after='a', kept='k')\n"
        "def test_full(): pass\n\n"
        "@pytest.mark.fault(fault='f', before=' ', after='a')\n"
        "def test_blank(): pass\n\n"
        "def test_bare(): pass\n\n"
        "def helper(): pass\n"
    )
    rows = {r.test: r.missing() for r in ft.collect(tmp_path)}
    assert rows == {
        "test_full": [],
        "test_blank": ["before", "kept"],
        "test_bare": ["fault", "before", "after", "kept"],
    }
    assert "| f<br>`test_x.py::test_full` | b | a | k |" in ft.table(ft.collect(tmp_path))
