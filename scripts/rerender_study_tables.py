"""Re-render the tables of the study write-ups (``samples/studies/*.md``) from their stored
records (``samples/studies/results/``), so no figure in a write-up is copied by hand.

A write-up names its record in a generated block::

    <!-- study-tables: 20261205-234456-study-batch-size.json -->
    ... (everything here is generated: the record, its workload, its notes, its tables)
    <!-- /study-tables -->

(a record in a folder of ``results/`` is named by its path under it, e.g.
``replicas_threads/20261206-003139-replicas-threads.json``), and the block is re-rendered
from that record: a line naming the record, the machine
class and the workload it ran, then the settings, effects, extra and quality tables and the
record's notes that :func:`samples.studies._common.markdown` renders. A quality block::

    <!-- study-quality: quant/20261206-033706-quality.json -->
    ... (generated: the record, the model and evaluation set, the quality table)
    <!-- /study-quality -->

is re-rendered from a quality record (``results/<sample>/<time>-quality.json``, written by
a sample's ``--quality-only --save``) by :func:`samples.studies._common.quality_markdown`,
with a sentence on how the speed record of the write-up's last ``study-tables`` block above
it was measured (random or trained weights, from that record's options). A parallel block::

    <!-- parallel-tables: parallel/20261205-232238-parallel.json -->
    ... (generated: the record, its model, workload and load, its tables)
    <!-- /parallel-tables -->

is re-rendered from a ``perfscope.parallel-study/1`` record (what ``parallel.py`` stores
under ``results/parallel/``, named by its path under ``results/``) by the functions the
script prints its own tables with (``samples/studies/parallel.py``: :func:`describe`,
:func:`record_markdown`). Every write-up
presents its stored records through such blocks (one per record); prose and any table
outside them (a table of runs that were never stored) are left alone. Usage::

    python scripts/rerender_study_tables.py [--check]

``--check`` rewrites nothing and exits 1 if a table differs, or a block names a record that
is not in ``results/`` (or names it by any other path than the one under ``results/``; a
quality block: a record not under it; a parallel block: also a record of another schema).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "samples" / "studies"
RESULTS = STUDIES / "results"
OPEN = re.compile(r"^<!-- study-tables: (\S+) -->$")
CLOSE = "<!-- /study-tables -->"
QOPEN = re.compile(r"^<!-- study-quality: (\S+) -->$")
QCLOSE = "<!-- /study-quality -->"
POPEN = re.compile(r"^<!-- parallel-tables: (\S+) -->$")
PCLOSE = "<!-- /parallel-tables -->"
PARALLEL_SCHEMA = "perfscope.parallel-study/1"

#: Workload options a block names when the record has them: record key → words.
_WORKLOAD = (
    ("model_preset", "model"),
    ("requests", "requests"),
    ("prompt_len", "prompt tokens"),
    ("output_len", "output tokens"),
    ("batch_size", "batch"),
    ("scheduler", "scheduler"),
    ("rate", "rate req/s"),
    ("concurrency", "concurrency"),
    ("warmup", "warmup requests"),
)


def _common() -> Any:
    if str(STUDIES) not in sys.path:
        sys.path.insert(0, str(STUDIES))
    import _common  # type: ignore[import-not-found]

    return _common


def _markdown() -> Any:
    return _common().markdown


def quality_block(name: str, speed_record: str | None) -> list[str]:
    """The lines between a quality block's markers for ``results/<name>``; ``speed_record``:
    the record of the write-up's speed tables (its options say which weights it ran)."""
    from perfscope.analysis.study import read_study

    common = _common()
    record = common.read_quality(RESULTS / name)
    speed = None
    if speed_record is not None:
        opts = read_study(RESULTS / speed_record).args.get("engine_options") or {}
        weights = opts.get("weights")
        how = (
            "with random weights (speed does not depend on their values)"
            if not weights
            else "with trained weights (weights=trained)"
            if weights == "trained"
            else f"with weights={Path(str(weights)).name}"
        )
        speed = (
            f"Speed (record `{speed_record}`, the tables above) was measured separately, "
            f"{how}; this record ran no speed run."
        )
    return [
        f"Quality record `samples/studies/results/{name}` (created {record['created_at']}).",
        "",
        *common.quality_markdown(record, speed).splitlines(),
    ]


def _parallel() -> Any:
    """``samples/studies/parallel.py`` as a module (its renderer imports no torch)."""
    import importlib.util

    if "_parallel_study" in sys.modules:
        return sys.modules["_parallel_study"]
    spec = importlib.util.spec_from_file_location("_parallel_study", STUDIES / "parallel.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_parallel_study"] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def parallel_block(name: str) -> list[str]:
    """The lines between a parallel block's markers for the ``perfscope.parallel-study/1``
    record ``results/<name>``: a line naming the record, its model, workload and load, then
    the tables ``parallel.py`` prints for it. Another schema stops the script with one line."""
    import json

    path = record_path(name)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SystemExit(f"{name}: not a JSON record ({exc})") from None
    if not isinstance(record, dict) or record.get("schema") != PARALLEL_SCHEMA:
        raise SystemExit(f"{name}: not a {PARALLEL_SCHEMA} record")
    par = _parallel()
    return [
        f"Record `samples/studies/results/{name}` ({PARALLEL_SCHEMA}, written by "
        f"`parallel.py`; created {record.get('created_at') or 'unknown'}; device "
        f"{record.get('device')}): {par.describe(record)}.",
        "",
        *par.record_markdown(record),
    ]


def record_path(name: str) -> Path:
    """The stored record a block names: ``name`` is its path under ``results/`` (a file
    name, or ``folder/file`` for a record kept in a folder there); anything else, or a record
    that is not there, stops the script with one line."""
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts or rel.suffix != ".json":
        raise SystemExit(f"{name}: name a record by its path under {RESULTS}")
    path = RESULTS / rel
    if not path.is_file():
        raise SystemExit(f"{name}: no such record in {RESULTS}; name a stored one")
    return path


def generated_block(name: str) -> list[str]:
    """The lines between a block's markers for the record ``results/<name>``."""
    from perfscope.analysis.calibration import MachineClass
    from perfscope.analysis.study import read_study

    st = read_study(record_path(name))
    args = st.args
    work = [f"{words} {args[k]}" for k, words in _WORKLOAD if args.get(k) not in (None, "")]
    opts = dict(args.get("engine_options") or {})
    threads = opts.pop("threads", None)
    if threads:
        work.append(f"{threads} intra-op thread(s)")
    if opts:
        work.append("engine options " + ", ".join(f"{k}={v}" for k, v in sorted(opts.items())))
    # The dataset: the study's args name it since 2026-12-06; older records only in the
    # runs' workload section.
    load = ((st.baseline.inputs or {}).get("workload") or {}) if st.settings else {}
    if args.get("dataset"):
        load = args
    if isinstance(load, dict) and load.get("dataset"):
        shape = [f"{k} {load[k]}" for k in ("prefix_len", "turns") if load.get(k)]
        work.append(f"dataset {load['dataset']}" + (f" ({', '.join(shape)})" if shape else ""))
    extra = {
        k: v
        for k, v in args.items()
        if v not in (None, "", {}, [])
        and k not in {k for k, _ in _WORKLOAD}
        and k not in ("engine", "seed", "engine_options", "mode", "dataset", "prefix_len", "turns")
    }
    if extra:
        work.append(", ".join(f"{k} {v}" for k, v in sorted(extra.items())))
    machine = MachineClass.from_dict(st.machine).describe() if st.machine else "not recorded"
    out = [
        f"Record `samples/studies/results/{name}` (created {st.created_at or 'unknown'}; "
        f"machine class: {machine}): {st.knob} = {', '.join(st.values)}, {st.repeat} "
        f"interleaved rounds, effects paired by round; workload: {'; '.join(work)}.",
        "",
        *_markdown()(st).splitlines(),
    ]
    return out


def rerender(text: str) -> str:
    """``text`` with every generated block re-rendered."""
    lines = text.splitlines()
    out: list[str] = []
    speed_record: str | None = None
    i = 0
    while i < len(lines):
        ln = lines[i]
        opened = OPEN.match(ln)
        if opened is not None:
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == CLOSE), None)
            if end is None:
                raise SystemExit(f"a study-tables block opened at line {i + 1} is never closed")
            name = opened.group(1)
            out += [ln, *generated_block(name), CLOSE]
            speed_record = name
            i = end + 1
            continue
        quality = QOPEN.match(ln)
        if quality is not None:
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == QCLOSE), None)
            if end is None:
                raise SystemExit(f"a study-quality block opened at line {i + 1} is never closed")
            qname = quality.group(1)
            path = (RESULTS / qname).resolve()
            if not path.is_relative_to(RESULTS.resolve()) or not path.is_file():
                raise SystemExit(f"{qname}: no such quality record under {RESULTS}")
            out += [ln, *quality_block(qname, speed_record), QCLOSE]
            i = end + 1
            continue
        par = POPEN.match(ln)
        if par is not None:
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == PCLOSE), None)
            if end is None:
                raise SystemExit(f"a parallel-tables block opened at line {i + 1} is never closed")
            out += [ln, *parallel_block(par.group(1)), PCLOSE]
            i = end + 1
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
