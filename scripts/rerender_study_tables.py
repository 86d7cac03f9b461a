"""Re-render the effects tables of the study write-ups (``samples/studies/*.md``) from their
stored records (``samples/studies/results/``), so each table shows what perfscope shows
today: the interval its verdict was tested at, with its level named.

Each effects table (its header names ``| measured ratio |``) is replaced by the table
:func:`samples.studies._common.markdown` renders for the record named on the next
``- study file: `...` `` line below it. Prose is left alone. Usage::

    python scripts/rerender_study_tables.py [--check]

``--check`` rewrites nothing and exits 1 if a table differs.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "samples" / "studies"
FILE = re.compile(r"^- study file: `([^`]+)`")


def _effects_block(md: str) -> list[str]:
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if "| measured ratio |" in ln)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def rerender(text: str) -> str:
    """``text`` with every effects table re-rendered from its record."""
    if str(STUDIES) not in sys.path:
        sys.path.insert(0, str(STUDIES))
    from _common import markdown  # type: ignore[import-not-found]

    from perfscope.analysis.study import read_study

    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        ln = lines[i]
        if "| measured ratio |" in ln and ln.startswith("|"):
            end = i
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            record = next((m.group(1) for m in map(FILE.match, lines[end:]) if m is not None), None)
            path = None if record is None else STUDIES / "results" / Path(record).name
            if path is None or not path.exists():
                out.extend(lines[i:end])
            else:
                out.extend(_effects_block(markdown(read_study(path))))
            i = end
            continue
        out.append(ln)
        i += 1
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="report differences, write nothing")
    args = ap.parse_args()
    stale = []
    for md in sorted(STUDIES.glob("*.md")):
        old = md.read_text(encoding="utf-8")
        new = rerender(old)
        if new != old:
            stale.append(md.name)
            if not args.check:
                md.write_text(new, encoding="utf-8")
    print(("stale: " if args.check else "re-rendered: ") + (", ".join(stale) or "none"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
