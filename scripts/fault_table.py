#!/usr/bin/env python
"""Print the table "fault | before | after | data kept" of tests/reliability/.

Each test there carries ``@pytest.mark.fault(fault=..., before=..., after=..., kept=...)``;
this reads the markers with ``ast`` (no test runs, nothing imported) and prints one markdown
row per test, in file and source order, with the test it comes from.

    python scripts/fault_table.py                  # the table, on stdout
    python scripts/fault_table.py --write docs/reliability.md   # replace the table there

``--write`` replaces what lies between the two marker comments of the file (``BEGIN`` and
``END`` below); the rest of the page is left as it is.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "reliability"
FIELDS = ("fault", "before", "after", "kept")
BEGIN = "<!-- fault table: begin (scripts/fault_table.py --write docs/reliability.md) -->"
END = "<!-- fault table: end -->"


@dataclass(frozen=True)
class FaultRow:
    """One reliability test's marker: where it is and its four fields (empty if missing)."""

    module: str
    test: str
    fault: str
    before: str
    after: str
    kept: str

    def missing(self) -> list[str]:
        """The fields that are absent or blank."""
        return [f for f in FIELDS if not getattr(self, f).strip()]


def _is_fault_marker(node: ast.expr) -> bool:
    """True for ``pytest.mark.fault(...)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "fault"
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "mark"
    )


def _text(node: ast.expr) -> str:
    """A marker field's value: a string literal (implicit concatenation folds into one)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    raise ValueError(f"line {node.lineno}: a fault marker field must be a string literal")


def rows_of(path: Path) -> list[FaultRow]:
    """Every ``test_*`` function of one module, with its marker's fields ('' where none)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[FaultRow] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if not node.name.startswith("test_"):
            continue
        fields = dict.fromkeys(FIELDS, "")
        for dec in node.decorator_list:
            if _is_fault_marker(dec):
                assert isinstance(dec, ast.Call)
                for kw in dec.keywords:
                    if kw.arg in fields:
                        fields[kw.arg] = _text(kw.value)
        out.append(FaultRow(path.name, node.name, **fields))
    return out


def collect(suite: Path = SUITE) -> list[FaultRow]:
    """Every test of the reliability suite, in file and source order."""
    rows: list[FaultRow] = []
    for path in sorted(suite.glob("test_*.py")):
        rows.extend(rows_of(path))
    return rows


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(rows: list[FaultRow]) -> str:
    """The markdown table, one row per test, the test named under its fault."""
    lines = ["| fault | before | after | data kept |", "|---|---|---|---|"]
    for r in rows:
        where = f"<br>`{r.module}::{r.test}`"
        lines.append(
            f"| {_cell(r.fault)}{where} | {_cell(r.before)} | {_cell(r.after)} | {_cell(r.kept)} |"
        )
    return "\n".join(lines) + "\n"


def replace_table(page: str, new_table: str) -> str:
    """``page`` with the text between BEGIN and END replaced by ``new_table``."""
    if BEGIN not in page or END not in page:
        raise ValueError(f"the page has no {BEGIN!r} ... {END!r} block")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{new_table}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", type=Path, help="replace the table block in this page")
    args = parser.parse_args(argv)
    rows = collect()
    bad = [f"{r.module}::{r.test}: {', '.join(r.missing())}" for r in rows if r.missing()]
    if bad:
        print("fault markers missing fields:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    text = table(rows)
    if args.write is None:
        sys.stdout.write(text)
        return 0
    page = args.write.read_text(encoding="utf-8")
    args.write.write_text(replace_table(page, text), encoding="utf-8")
    print(f"{args.write}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
