"""The public surface and the dependency direction, read from the code itself.

Pinned surfaces (as httpx pins ``httpx.__all__``): a name added to or dropped from a public
facade is a deliberate change to this file. Dependency direction (docs/architecture.md): the
front door ``perfscope`` → ``dashboard`` → ``analysis`` → ``hwdb``; ``profiler`` and ``hwdb``
import only the ground floor (``perfscope.errors``, ``perfscope.units``) and themselves;
``analysis`` no presentation library; nothing outside ``perfscope/`` imports the front
door's rooms (``perfscope.api``, ``perfscope.cli``, ``perfscope.checks``) or a private
``perfscope._*`` module.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

PUBLIC: dict[str, set[str]] = {
    "perfscope": {
        "PerfAssertionError",
        "Profile",
        "ProgressHook",
        "Run",
        "RunSet",
        "Sweep",
        "__version__",
        "assert_no_regression",
        "check",
        "compare_runs",
        "expect",
        "load_run",
        "profile",
        "run",
        "save_study",
        "study",
        "study_quality",  # a study's quality hook alone, no runs (issue 28)
        "sweep",
    },
    "perfscope.profiler": {
        "Clock",
        "Engine",
        "EngineInfo",
        "EngineOptions",
        "Inbox",
        "LengthDist",
        "LoadConfig",
        "ManualClock",
        "MonotonicClock",
        "PerRequestEngine",
        "Recorder",
        "RequestHandle",
        "RequestRecord",
        "RequestSpec",
        "StoredRun",
        "Submission",
        "TelemetryConfig",
        "WorkloadConfig",
        "create_engine",
        "default_runs_root",
        "list_runs",
        "read_run",
        "register_engine",
    },
    "perfscope.hwdb": {
        "BUILTIN_DIR",
        "DTYPES",
        "ENV_CACHE_DIR",
        "ENV_HWDB",
        "CalibrationResult",
        "CeilingSource",
        "DetectedDevice",
        "DeviceFileError",
        "DeviceSpec",
        "Entry",
        "HardwareDatabase",
        "Quantity",
        "cache_dir_default",
        "cached_calibration",
        "calibrate",
        "detect_local_device",
        "load_database",
        "lookup",
        "normalize_dtype",
        "normalize_name",
        "resolve_device",
        "resolve_hardware",
        "spec_to_dict",
    },
    "perfscope.analysis": {"RunRecords", "Summary", "analyze"},
    "perfscope.units": {"MISSING", "UNITS", "Kind", "factor_of", "units_of"},
    "perfscope.dashboard": {
        "create_app",
        "serve",
        "write_csv",
        "write_json",
        "write_perfetto",
        "write_report",
    },
    "perfscope.pytest_plugin": {"KEY_METRICS", "PerfscopeFixture", "perfscope"},
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_surface_is_pinned_and_every_name_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(mod.__all__) == PUBLIC[module]
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name
    with pytest.raises(AttributeError):
        _ = mod.no_such_name


def test_importing_the_facades_loads_no_heavy_library() -> None:
    code = (
        "import sys, perfscope, perfscope.profiler, perfscope.hwdb, perfscope.analysis, "
        "perfscope.dashboard; "
        "print(sorted(m for m in ('torch', 'pandas', 'pyarrow', 'plotly', 'dash', 'rich') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- imports

#: repository folder → the package it is imported as (``None``: not a package)
FOLDERS = {
    "perfscope": "perfscope",
    "profiler": "perfscope.profiler",
    "hwdb": "perfscope.hwdb",
    "analysis": "perfscope.analysis",
    "dashboard": "perfscope.dashboard",
    "samples": None,
}
PRESENTATION = ("rich", "plotly", "dash")


def _module_name(folder: str, path: Path) -> str | None:
    package = FOLDERS[folder]
    if package is None:
        return None
    rel = path.relative_to(ROOT / folder).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([package, *parts])


def imports_of(folder: str) -> list[tuple[str, str]]:
    """``(file, imported module)`` for every import in ``folder`` (function-level and
    ``TYPE_CHECKING`` ones included); ``from pkg import name`` counts as ``pkg.name``."""
    out: list[tuple[str, str]] = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        here = _module_name(folder, path)
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        rel_file = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [(rel_file, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    assert here is not None, f"relative import outside a package: {rel_file}"
                    pkg = here.split(".") if is_pkg else here.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join([*pkg, *([base] if base else [])])
                out += [(rel_file, f"{base}.{a.name}") for a in node.names]
    return out


def _ours(name: str) -> bool:
    return name == "perfscope" or name.startswith("perfscope.")


def _allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


#: Modules every stage may import: the errors and the one unit table.
GROUND_FLOOR = ("perfscope.errors", "perfscope.units", "perfscope.jsontypes")

#: the front door's rooms: behind :mod:`perfscope`'s public names, for the front door only
ROOMS = ("api", "cli", "checks")


def _private_front_door(name: str) -> bool:
    """``perfscope._x`` or a module of one of the front door's rooms (``perfscope.api.run``,
    ``perfscope.cli.render``, ...); ``__version__`` and ``perfscope.errors`` are public."""
    parts = name.split(".")
    return (
        parts[0] == "perfscope"
        and len(parts) > 1
        and ((parts[1].startswith("_") and not parts[1].startswith("__")) or parts[1] in ROOMS)
    )


def test_the_import_reader_sees_every_kind_of_import() -> None:
    seen = set(imports_of("perfscope"))
    # module level, inside a function, under TYPE_CHECKING
    assert ("perfscope/cli/__init__.py", "perfscope.errors.UsageError") in seen
    assert ("perfscope/cli/run.py", "perfscope.cli.render.summary_view") in seen
    assert ("perfscope/__init__.py", "perfscope.api.run.run") in seen
    assert _private_front_door("perfscope.cli.render.summary_view")
    assert not _private_front_door("perfscope.__version__")


@pytest.mark.parametrize("component", ["profiler", "hwdb"])
def test_capture_and_the_hardware_database_import_only_errors_and_themselves(
    component: str,
) -> None:
    own = f"perfscope.{component}"
    bad = [
        (f, m)
        for f, m in imports_of(component)
        if _ours(m) and not _allowed(m, (own, *GROUND_FLOOR))
    ]
    assert bad == []


def test_analysis_imports_only_the_hardware_database_and_errors() -> None:
    allowed = ("perfscope.analysis", "perfscope.hwdb", *GROUND_FLOOR)
    bad = [(f, m) for f, m in imports_of("analysis") if _ours(m) and not _allowed(m, allowed)]
    assert bad == []


def test_analysis_imports_no_presentation_library() -> None:
    bad = [(f, m) for f, m in imports_of("analysis") if m.split(".")[0] in PRESENTATION]
    assert bad == []


def test_the_dashboard_imports_no_private_front_door_module() -> None:
    bad = [(f, m) for f, m in imports_of("dashboard") if _private_front_door(m)]
    assert bad == []


def test_the_dashboard_never_imports_the_front_door_or_capture_engines() -> None:
    bad = [
        (f, m)
        for f, m in imports_of("dashboard")
        if _ours(m)
        and not _private_front_door(m)  # (the test above)
        and not _allowed(
            m,
            (
                "perfscope.dashboard",
                "perfscope.analysis",
                "perfscope.hwdb",
                *GROUND_FLOOR,
                "perfscope.profiler.store",
                "perfscope.profiler.run_index",
                "perfscope.profiler.output",  # the one writer for every -o path
            ),
        )
    ]
    assert bad == []


#: The Dash app: the ``dashboard/app/`` subpackage (server, pages, their data layer). Everything
#: else in ``dashboard/`` (the report, figures, exporters, terminal tables, view helpers) is
#: presentation that a command, the report or a test uses without a web server.
DASH_APP = ("dashboard/app/",)


def test_presentation_never_imports_dash_or_the_dash_app() -> None:
    """The report, figures, exporters and terminal tables stand apart from the Dash app: none
    imports ``dash`` or the app's modules (the package ``__init__`` only names the app's entry
    points, loaded on first use)."""
    app_modules = ("perfscope.dashboard.app",)
    bad = [
        (f, m)
        for f, m in imports_of("dashboard")
        if not f.startswith(DASH_APP)
        and f != "dashboard/__init__.py"
        and (m.split(".")[0] == "dash" or m.startswith(app_modules))
    ]
    assert bad == []
    # The app does reach them: the pin is not vacuous.
    assert any(
        f.startswith(DASH_APP) and m.split(".")[0] == "dash" for f, m in imports_of("dashboard")
    )


def test_samples_use_only_public_names() -> None:
    bad = [(f, m) for f, m in imports_of("samples") if _private_front_door(m)]
    assert bad == []


# --------------------------------------------------------------------------- one of each

#: The package's source folders (what ``pip install perfscope`` ships).
PACKAGE_FOLDERS = ("perfscope", "profiler", "hwdb", "analysis", "dashboard")

#: A second dotted getter: a private helper that walks a summary by key path.
GETTER_PATTERNS = (r"^\s*def _get\(", r"^\s*def _dig\(", r"^\s*def get_path\(")
#: A second unit table: a table keyed by unit text (``"ms": ("seconds", 1e-3)``,
#: ``"ms": 1e-3``) or a module-level ``UNITS``/``_UNITS`` table.
UNIT_TABLE_PATTERNS = (
    r"""["']ms["']\s*:\s*[(\d]""",
    r"^_?UNITS\s*(?::[^=]*)?=",
)
#: A second atomic writer: a temp file moved over its target.
ATOMIC_WRITER_PATTERNS = (r"\bos\.replace\(", r"\bos\.rename\(", r"\btmp\w*\.replace\(")

#: The one place each may live. The unit table is on the ground floor, shared by the hardware
#: database and the catalogue; the hardware database keeps its calibration-cache writer:
#: ``hwdb`` may import only the ground floor (the test above), not the run store.
ONE_PLACE = {
    "getter": set[str](),
    "unit table": {"perfscope/units.py"},
    "atomic writer": {"profiler/store.py", "hwdb/calibrate.py"},
}


def _matches(patterns: tuple[str, ...]) -> list[str]:
    compiled = [re.compile(p, re.MULTILINE) for p in patterns]
    out: list[str] = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            rel = str(path.relative_to(ROOT))
            out += [f"{rel}: {c.pattern}" for c in compiled if c.search(text)]
    return out


def _outside(found: list[str], allowed: set[str]) -> list[str]:
    return [f for f in found if f.split(": ", 1)[0] not in allowed]


def test_the_catalogue_getter_is_the_only_dotted_getter() -> None:
    assert _outside(_matches(GETTER_PATTERNS), ONE_PLACE["getter"]) == []


def test_the_ground_floor_holds_the_only_unit_table() -> None:
    found = _matches(UNIT_TABLE_PATTERNS)
    assert any(f.startswith("perfscope/units.py") for f in found)  # the patterns see it
    assert _outside(found, ONE_PLACE["unit table"]) == []


def test_the_run_store_holds_the_only_atomic_writer() -> None:
    found = _matches(ATOMIC_WRITER_PATTERNS)
    assert any(f.startswith("profiler/store.py") for f in found)  # the patterns see it
    assert _outside(found, ONE_PLACE["atomic writer"]) == []


# --------------------------------------------------------------------------- typed records


def _all_subclasses(cls: type) -> list[type]:
    out: list[type] = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


def test_no_record_falls_back_to_attributes_it_does_not_declare() -> None:
    from perfscope.analysis.summary import Record
    from perfscope.profiler.records import Manifest

    importlib.import_module("perfscope.analysis")  # every section's record is defined
    records = [Record, *_all_subclasses(Record), Manifest]
    assert len(records) > 30  # the walk sees the summary's records
    bad = [
        c.__qualname__
        for c in records
        for k in c.__mro__
        if k is not object and "__getattr__" in vars(k)
    ]
    assert bad == []


def test_every_analysis_section_returns_its_record() -> None:
    """A section is built as its record (``Energy``, ``Roofline``, ...), never as a dict that
    ``Summary.from_dict`` converts at the end: every ``*_section`` function of the analysis
    is annotated to return a ``Record`` (or ``None`` where a run may lack the section)."""
    import inspect
    import pkgutil

    import perfscope.analysis as analysis
    from perfscope.analysis.summary import Record

    sections: dict[str, list[Any]] = {}
    for info in pkgutil.walk_packages(analysis.__path__, "perfscope.analysis."):
        mod = importlib.import_module(info.name)
        for name, fn in vars(mod).items():
            if (
                name.endswith("_section")
                and inspect.isfunction(fn)
                and fn.__module__ == mod.__name__
            ):
                # The annotation's text (the modules use postponed annotations): each arm of
                # the union, resolved in the section's module.
                arms = str(inspect.signature(fn).return_annotation).split("|")
                sections[f"{mod.__name__}.{name}"] = [
                    getattr(mod, a.strip(), a.strip()) for a in arms if a.strip() != "None"
                ]
    assert len(sections) >= 6  # energy, roofline, server metrics, prompt cache, client, spec
    bad = {
        k: arms
        for k, arms in sections.items()
        if not arms or not all(isinstance(a, type) and issubclass(a, Record) for a in arms)
    }
    assert bad == {}


def test_the_summary_is_a_record_not_a_mapping() -> None:
    from collections.abc import Mapping

    from perfscope.analysis import Summary

    assert not issubclass(Summary, Mapping)


#: ``dict[str, Any]`` written in these folders at most this often (a ceiling that only goes
#: down): typed records cross the stages, not JSON-shaped dicts. 350 before issue 24; 346
#: after its typed summary, 379 once the experiment, calibration, wire and hardening work
#: of the same stop landed beside it (docs/architecture.md names the next sections to type);
#: 375 once capture became its own stage (``profiler/capture.py``); 363 once the analysis and
#: the dashboard read the manifest through its typed view (``analysis/manifest.py``); 364 with
#: the study projection work merged beside it; 332 once the roofline section, the advisor's
#: and the what-if's reading of it, the speculative and client sections became records
#: (``PhaseRoofline`` and its parts) and the index's CLI paths lost their dicts, with the
#: state-space families' reader beside them (331 with the runs page's read-only mappings);
#: 308 once the energy section became its record (``analysis/energy/``: curves, attribution,
#: devices, the section); 290 once the server-metrics and prompt-cache sections did too; 289
#: once the analysis built its hardware section as the record; 273 once a comparison of run
#: sets became a record (``Comparison``) that the terminal table, the HTML page and the
#: dashboard's compare page read; 246 once the exporters' run protocol extended RunRecords and
#: the pytest plugin's baseline (machine, commit, tests, key metrics) became records; 243
#: once a RunSet's median summary became a Summary (no attribute view over dicts left); 229
#: once a sweep's summary became records (``SweepSummary``, ``SweepPoint``, ``SweepKnee``);
#: 228 once ``compute_metrics`` returned its record and ``analyze`` built the Summary itself;
#: 222 once the comparison read typed summaries as they are; 219 once run --repeat kept its
#: runs' summaries typed; 217 once the projections table took the Projection records; 197
#: with the modelspec package's readers taking read-only mappings merged beside them; 192
#: once the advisor built its suggestions as the summary's ``Advice`` records; 170 once the
#: what-if's ``predict``/``project_run`` returned ``Projection`` records and ``run_derating``
#: its ``Derating``; 163 once the study kept ``Projection`` records through its projection
#: and its speculative projection became records (``SpeculativeBefore``/``After``); 158 once
#: a study's ``args``, ``machine`` and each setting's ``projection`` and ``quality`` became
#: read-only mappings; 0 once the rest were typed (stop 39): Perfetto events and Dash props as
#: TypedDicts, the Dash pages' points and predictions as records, projections' workload and
#: ceilings as records, and JSON at the edges as :mod:`perfscope.jsontypes` (narrowed on read).
DICT_ANY_CEILING = 0
#: The read-only spelling of the same untyped object, counted apart so it too only goes down:
#: 169 when the dict ceiling reached 0 began (stop 39), 161 after it, 103 once the model-spec
#: readers and the manifest view narrowed theirs, 74 once the study's
#: readers narrowed their JSON (stop 40).
MAPPING_ANY_CEILING = 74
DICT_ANY_FOLDERS = ("analysis", "dashboard", "perfscope")


@pytest.mark.parametrize(
    ("spelling", "ceiling"),
    [("dict[str, Any]", DICT_ANY_CEILING), ("Mapping[str, Any]", MAPPING_ANY_CEILING)],
)
def test_untyped_dicts_stay_under_their_ceiling(spelling: str, ceiling: int) -> None:
    counts = {
        folder: sum(
            p.read_text(encoding="utf-8").count(spelling) for p in (ROOT / folder).rglob("*.py")
        )
        for folder in DICT_ANY_FOLDERS
    }
    assert sum(counts.values()) <= ceiling, counts


def test_no_alias_hides_an_untyped_dict() -> None:
    """The ceiling counts the spelling: a name bound to ``dict[str, Any]`` (or a mapping of
    ``Any``) would hide the same untyped dict under another word. JSON at the edges is typed
    with :mod:`perfscope.jsontypes`, whose values must be narrowed before use."""
    alias = re.compile(
        r"^\s*\w+\s*(?::\s*TypeAlias\s*)?=\s*\"?(?:dict|Mapping|MutableMapping)\[str, Any\]"
    )
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for folder in DICT_ANY_FOLDERS
        for p in (ROOT / folder).rglob("*.py")
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if alias.match(line)
    ]
    assert found == []


#: Writing a Parquet file: the store's RunWriter (every table checked against its schema).
PARQUET_WRITE_PATTERNS = (r"\bpq\.write_table\(", r"\.to_parquet\(", r"\bwrite_table_atomic\(")


def test_every_parquet_table_is_written_through_the_store() -> None:
    found = [
        f for f in _matches(PARQUET_WRITE_PATTERNS) if not f.endswith("def write_table_atomic(")
    ]
    assert any(f.startswith("profiler/store.py") for f in found)  # the patterns see it
    assert _outside(found, {"profiler/store.py"}) == []


#: Capture's moving parts: the front door calls the capture stage (``profiler.capture``:
#: ``plan_capture``, ``capture``, ``RunCapture``), which wires these; it never wires them itself.
CAPTURE_INTERNALS = (
    "perfscope.profiler.store.RunWriter",
    "perfscope.profiler.segments.SegmentFlusher",
    "perfscope.profiler.driver.Driver",
    "perfscope.profiler.telemetry.start_telemetry",
    "perfscope.profiler.server_metrics.start_server_metrics",
    "perfscope.profiler.contention",
    "perfscope.profiler.cluster_telemetry",
    "perfscope.profiler.distributed",
    "perfscope.profiler.nvtx_ranges",
)


def test_the_front_door_leaves_the_run_lifecycle_to_the_capture_stage() -> None:
    seen = set(imports_of("profiler"))
    assert (
        "profiler/capture.py",
        "perfscope.profiler.store.RunWriter",
    ) in seen  # the reader sees it
    bad = [(f, m) for f, m in imports_of("perfscope") if _allowed(m, CAPTURE_INTERNALS)]
    assert bad == []


def test_the_store_lists_every_table_a_run_directory_holds() -> None:
    from perfscope.profiler.store import stored_table_names

    assert set(stored_table_names()) == {
        "requests",
        "chunks",
        "steps",
        "telemetry",
        "server_metrics",
        "actors",
    }


def test_docstrings_cite_documents_in_the_repository() -> None:
    assert (ROOT / "docs" / "architecture.md").is_file()
    assert _matches((r"DESIGN\.md",)) == []


# --------------------------------------------------------------------------- one change rule


def _summaries(tpot_s: list[float], name: str) -> list[Any]:
    """Run summaries (typed records, as analysis returns them) with these TPOT medians."""
    from perfscope.analysis.summary import Distribution, Latency, Summary, Throughput

    return [
        Summary(
            run_id=f"{name}{i}",
            name=name,
            latency=Latency(tpot=Distribution(p50=t, p90=t * 1.2), e2e=Distribution(p50=t * 50)),
            throughput=Throughput(output_tok_s=1 / t),
        )
        for i, t in enumerate(tpot_s)
    ]


def test_compare_run_vs_the_pytest_gate_and_study_judge_change_by_judge_metric(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One change-detection rule: ``perfscope compare`` and ``run --vs`` (both through
    ``dashboard.compare.compare_sets``), the pytest baseline gate and a study's effects all
    reach :func:`perfscope.analysis.experiment.judge_metric`; none judges by its own test."""
    import pandas as pd

    from perfscope.analysis import experiment
    from perfscope.analysis.study import build_study
    from perfscope.dashboard.compare import compare_sets
    from perfscope.dashboard.figures import RunTables
    from perfscope.pytest_plugin._baseline import KeyMetric, compare_metrics

    # the callers: compare and --vs call compare_sets (read from the code, not a grep)
    seen = set(imports_of("perfscope"))
    assert ("perfscope/cli/report.py", "perfscope.dashboard.compare.compare_sets") in seen
    assert ("perfscope/api/repeat.py", "perfscope.dashboard.compare.compare_sets") in seen

    rule = experiment.judge_metric
    calls: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> experiment.SetChange:
        calls.append(str(kwargs.get("metric", "")))
        return rule(*args, **kwargs)

    bound = [
        m
        for name, m in list(sys.modules.items())
        if _ours(name) and getattr(m, "judge_metric", None) is rule
    ]
    assert experiment in bound
    for m in bound:  # every binding of the rule (modules import it by name)
        monkeypatch.setattr(m, "judge_metric", counted)

    def judged(what: str) -> None:
        assert calls, f"{what} judged change without judge_metric"
        calls.clear()

    base = _summaries([0.010, 0.011, 0.0105, 0.0102, 0.0108], "a")
    slow = _summaries([0.020, 0.021, 0.0205, 0.0202, 0.0208], "b")
    empty = pd.DataFrame()
    tables = [[RunTables(s, empty, empty, empty, empty) for s in g] for g in (base, slow)]
    result = compare_sets(tables)
    assert result.primary_row.change[1] == experiment.WORSE
    judged("compare / run --vs")

    def tpot(value: float, samples: tuple[float, ...]) -> dict[str, KeyMetric]:
        return {
            "tpot": KeyMetric(
                path="latency.tpot.p50", direction="lower", value=value, samples=samples
            )
        }

    gate = compare_metrics(
        "test_x",
        tpot(0.02, (0.02, 0.021, 0.0205, 0.0202)),
        tpot(0.01, (0.01, 0.011, 0.0105, 0.0102)),
        [],
        gate_all=True,
    )
    assert gate[0].verdict == "regressed"
    judged("the pytest gate")

    runs = [
        (r, k, f"run-{r}-{k}", s.to_dict())
        for r, pair in enumerate(zip(base, slow, strict=True))
        for k, s in enumerate(pair)
    ]
    build_study("batch-size", ["1", "2"], 3, runs, batches=[1, 2], prompt_len=64, output_len=8)
    judged("a study")
