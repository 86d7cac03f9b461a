"""The walk of one ``perfscope run``: which stages it crosses and how often it touches disk.

Runs ``perfscope run`` on the reference engine in this process (a small preset and a few
requests, in a temporary runs folder) and reports, for capture and for what follows it:

- every file opened under the run's folder (an audit hook on ``open``), by name and mode;
- every Parquet read (``pyarrow.parquet.read_table`` / ``ParquetFile``);
- how often the summary crossed between record and dict (``Summary.from_dict`` / ``to_dict``);
- the chain of perfscope frames (module:function) at three points: the store writing the
  requests table, ``analysis.analyze`` and the terminal summary, which is "the hops".

It measures counts, not time, so a busy machine does not change its answer. Usage::

    python benchmarks/request_walk.py [--preset tiny] [--requests 8]

docs/architecture.md ("The walk of one run") quotes its output.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from perfscope.analysis import pipeline
from perfscope.analysis.summary import Summary
from perfscope.profiler import capture as capture_mod
from perfscope.profiler import store

PHASE = ["before"]
OPENS: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
PARQUET_READS: collections.Counter[str] = collections.Counter()
CROSSINGS: collections.Counter[str] = collections.Counter()
CHAINS: dict[str, list[str]] = {}
RUNS_DIR: list[Path] = []


def _chain() -> list[str]:
    """The perfscope frames on the stack, outermost first, as ``module:function``."""
    out = []
    for frame in traceback.extract_stack()[:-2]:
        parts = Path(frame.filename).parts
        for root in ("perfscope", "profiler", "analysis", "dashboard", "hwdb"):
            if root in parts and "benchmarks" not in parts:
                rel = Path(*parts[parts.index(root) :]).with_suffix("")
                out.append(f"{'.'.join(rel.parts)}:{frame.name}")
                break
    return out


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not RUNS_DIR or not isinstance(args[0], str | Path):
        return
    path = Path(args[0])
    with contextlib.suppress(ValueError):
        rel = path.resolve().relative_to(RUNS_DIR[0].resolve())
        mode = args[1] if isinstance(args[1], str) else "r"
        kind = "write" if any(c in mode for c in "wax+") else "read"
        OPENS[PHASE[0]][f"{kind} {Path(*rel.parts[1:]) if len(rel.parts) > 1 else rel}"] += 1


def _wrap(owner: Any, name: str, label: str, action: Callable[[], None]) -> None:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        action()
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)
    del label


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    def parquet_read() -> None:
        PARQUET_READS[PHASE[0]] += 1
        if PHASE[0] == "after capture":
            CHAINS.setdefault(f"Parquet read {PARQUET_READS[PHASE[0]]} after capture", _chain())

    _wrap(pq, "read_table", "read_table", parquet_read)
    _wrap(pq, "ParquetFile", "ParquetFile", parquet_read)
    def from_dict() -> None:
        CROSSINGS.update([f"{PHASE[0]} from_dict"])
        CHAINS.setdefault(f"Summary.from_dict ({PHASE[0]})", _chain())

    _wrap(Summary, "from_dict", "from_dict", from_dict)
    _wrap(Summary, "to_dict", "to_dict", lambda: CROSSINGS.update([f"{PHASE[0]} to_dict"]))
    _wrap(pipeline, "analyze", "analyze", lambda: CHAINS.setdefault("analyze", _chain()))

    original_write = store.write_table_atomic

    def write(*args: Any, **kwargs: Any) -> Any:
        if "requests" in str(args[0] if args else kwargs.get("path", "")):
            CHAINS.setdefault("store writes the requests table", _chain())
        return original_write(*args, **kwargs)

    store.write_table_atomic = write  # type: ignore[assignment]

    original_capture = capture_mod.capture

    def capture(*args: Any, **kwargs: Any) -> Any:
        PHASE[0] = "capture"
        try:
            return original_capture(*args, **kwargs)
        finally:
            PHASE[0] = "after capture"

    capture_mod.capture = capture  # type: ignore[assignment]
    sys.addaudithook(_audit)
    yield


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--requests", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, instrumented():
        RUNS_DIR.append(Path(tmp))
        from perfscope.api import runner
        from perfscope.cli import main as cli_main
        from perfscope.cli import render

        runner.capture = capture_mod.capture  # the runner imported the name before the wrap
        original_view = render.summary_view

        def view(*args: Any, **kwargs: Any) -> Any:
            CHAINS.setdefault("terminal summary", _chain())
            return original_view(*args, **kwargs)

        render.summary_view = view  # type: ignore[assignment]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli_main(
                [
                    "run",
                    "--model-preset",
                    a.preset,
                    "--requests",
                    str(a.requests),
                    "--runs-dir",
                    tmp,
                ]
            )
    print(f"perfscope run exited {code}")
    for phase, opens in OPENS.items():
        reads = sum(v for k, v in opens.items() if k.startswith("read"))
        writes = sum(v for k, v in opens.items() if k.startswith("write"))
        print(f"\n{phase}: {reads} file reads, {writes} file writes in the run folder")
        for k, v in sorted(opens.items()):
            print(f"  {v:3d}  {k}")
    print(f"\nParquet reads: {dict(PARQUET_READS)}")
    print(f"Summary record<->dict crossings: {dict(CROSSINGS)}")
    for what, chain in CHAINS.items():
        print(f"\n{what}: {len(chain)} perfscope frames")
        for c in chain:
            print(f"  {c}")


if __name__ == "__main__":
    main()
