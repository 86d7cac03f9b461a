"""The wheel ships what it registers: build the sdist and wheel, compare the wheel with the
tree, install it (no editable finder) into a fresh venv and use it there: pytest with the
plugin active, ``perfscope run``, ``perfscope report``, and an import of every module.

A hand-kept package list once left ``perfscope.pytest_plugin`` out of the wheel while its
``pytest11`` entry point still named it: every pytest run in an environment with that wheel
stopped at plugin loading. CI installs editable, so only a test like this one can see it.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: Source folder → the dotted package it installs as (setup.py's PACKAGE_DIR).
ROOTS = {
    "perfscope": "perfscope",
    "profiler": "perfscope/profiler",
    "hwdb": "perfscope/hwdb",
    "analysis": "perfscope/analysis",
    "dashboard": "perfscope/dashboard",
}
#: pyproject.toml's package-data, as (source folder, glob).
PACKAGE_DATA = [
    ("perfscope", "py.typed"),
    ("hwdb", "devices/*.toml"),
    ("analysis", "*.json"),
    ("dashboard", "assets/*.css"),
    ("dashboard", "assets/*.js"),
    ("dashboard", "assets/*.txt"),
]


def _skip(rel: Path) -> bool:
    return any(p.startswith(".") or p == "__pycache__" for p in rel.parts)


def tree_package_files() -> set[str]:
    """Every file the wheel must hold, as its path inside the wheel: every ``.py`` under
    the five roots (a module in a folder without ``__init__.py`` counts: it would be lost)
    and the declared package data."""
    want: set[str] = set()
    for folder, dest in ROOTS.items():
        base = ROOT / folder
        for py in base.rglob("*.py"):
            rel = py.relative_to(base)
            if not _skip(rel):
                want.add(f"{dest}/{rel.as_posix()}")
    for folder, pattern in PACKAGE_DATA:
        for f in (ROOT / folder).glob(pattern):
            want.add(f"{ROOTS[folder]}/{f.relative_to(ROOT / folder).as_posix()}")
    return want


def _copy_source(dest: Path) -> None:
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for folder in ROOTS:
        shutil.copytree(
            ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", ".*")
        )


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{argv[:3]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _third_party_paths() -> list[str]:
    """The current interpreter's site directories (their packages are the deps), without
    running their ``.pth`` files: those hold the editable finder that would import the
    worktree instead of the wheel."""
    dirs = [*site.getsitepackages(), *(p for p in sys.path if p.endswith("site-packages"))]
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("pkg")
    src = work / "src"
    src.mkdir()
    _copy_source(src)
    dist = work / "dist"
    dist.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    names = []
    for kind in ("sdist", "wheel"):  # one process each: setuptools keeps state in between
        script = (
            "from setuptools import build_meta as b; import sys; "
            f"print(b.build_{kind}(sys.argv[1]))"
        )
        out = _run([sys.executable, "-c", script, str(dist)], cwd=src, env=env)
        names.append(out.strip().splitlines()[-1])
    sdist_name, wheel_name = names
    assert (dist / wheel_name).is_file() and (dist / sdist_name).is_file(), sorted(dist.iterdir())
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work, env=env)
    vpy = venv / "bin" / "python"
    purelib = _run(
        [str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=work,
        env=env,
    ).strip()
    lines = "".join(f"import sys; sys.path.append({d!r})\n" for d in _third_party_paths())
    Path(purelib, "zz_perfscope_test_deps.pth").write_text(lines)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(vpy),
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            str(dist / wheel_name),
        ],
        cwd=work,
        env=env,
    )
    return {"sdist": dist / sdist_name, "wheel": dist / wheel_name, "venv": venv, "work": work}


def _venv_env(built: dict[str, Path], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(
        PATH=f"{built['venv'] / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        **extra,
    )
    return env


@pytest.mark.fault(
    fault="the wheel lacks a package it registers",
    before="no `pytest_plugin/` in the wheel: every pytest run stopped (issue 26)",
    after="every package file of the tree in the wheel; both entry points",
    kept="a build check: no run data involved",
)
def test_wheel_holds_every_package_file_of_the_tree(built: dict[str, Path]) -> None:
    with zipfile.ZipFile(built["wheel"]) as z:
        names = {n for n in z.namelist() if ".dist-info/" not in n}
        entry_points = next(
            z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")
        )
    want = tree_package_files()
    missing, extra = sorted(want - names), sorted(names - want)
    listing = Path(built["work"], "wheel-vs-tree.json")
    listing.write_text(json.dumps({"wheel": sorted(names), "missing": missing, "extra": extra}))
    assert not missing, f"in the tree, not in the wheel: {missing}"
    assert not extra, f"in the wheel, not in the tree: {extra}"
    assert "perfscope/pytest_plugin/__init__.py" in names
    assert "perfscope = perfscope.pytest_plugin" in entry_points
    assert "perfscope = perfscope.cli:main" in entry_points


@pytest.mark.fault(
    fault="the sdist lacks sources or build files",
    before="not recorded (guard older than issue 26)",
    after="sources and build files present",
    kept="a build check: no run data involved",
)
def test_sdist_holds_the_sources_and_the_build_files(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for must in (
        "setup.py",
        "pyproject.toml",
        "perfscope/pytest_plugin/__init__.py",
        "profiler/engines/openai/sse.py",
        "hwdb/devices",
    ):
        assert any(n == must or n.startswith(must + "/") for n in names), must


@pytest.mark.fault(
    fault="an installed wheel that imports from the tree",
    before="CI installed editable, so nothing saw a missing package (issue 26)",
    after="imports come from the venv; every module imports",
    kept="a build check: no run data involved",
)
def test_installed_wheel_imports_from_itself_and_every_module_imports(
    built: dict[str, Path],
) -> None:
    script = textwrap.dedent(
        """
        import importlib, json, pkgutil, sys
        import perfscope
        bad, skipped, n = [], [], 0
        for m in pkgutil.walk_packages(perfscope.__path__, "perfscope."):
            if m.name.endswith(".__main__"):
                continue  # importing it runs the CLI
            n += 1
            try:
                importlib.import_module(m.name)
            except ModuleNotFoundError as e:
                if (e.name or "").startswith("perfscope"):
                    bad.append(f"{m.name}: {e}")
                else:
                    skipped.append(f"{m.name}: optional {e.name}")
            except Exception as e:
                bad.append(f"{m.name}: {type(e).__name__}: {e}")
        print(json.dumps({"file": perfscope.__file__, "bad": bad, "skipped": skipped,
                          "n": n}))
        """
    )
    out = _run(
        [str(built["venv"] / "bin" / "python"), "-c", script], built["work"], _venv_env(built)
    )
    got = json.loads(out.strip().splitlines()[-1])
    assert got["file"].startswith(str(built["venv"])), f"imported {got['file']}, not the wheel"
    assert not got["bad"], got["bad"]
    assert got["n"] > 50


@pytest.mark.fault(
    fault="pytest, `run` and `report` from an installed wheel",
    before='`Error while loading plugin "pytest11"` in every pytest run (issue 26)',
    after="1 passed with the plugin active; run and report work",
    kept="the run and its report (> 10 kB)",
)
def test_pytest_with_the_plugin_active_and_run_and_report_work_from_the_wheel(
    built: dict[str, Path], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "test_tiny.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.perfscope(slo={"ttft.p99": "60s"})
            def test_tiny_model_answers(perfscope):
                run = perfscope.run("reference", model_preset="tiny", requests=2)
                perfscope.expect(run).ttft.p99 < "60s"
            """
        )
    )
    # the session's calibration cache (tests/conftest.py): the wheel's code reads the same
    # cache format, and a second CPU calibration here would only cost minutes
    env = _venv_env(
        built, PERFSCOPE_RUNS_DIR=str(runs), PERFSCOPE_CACHE_DIR=os.environ["PERFSCOPE_CACHE_DIR"]
    )
    vpy = str(built["venv"] / "bin" / "python")
    out = _run(
        [vpy, "-m", "pytest", "-q", "--strict-markers", "-p", "no:cacheprovider", "test_tiny.py"],
        proj,
        env,
    )
    assert "1 passed" in out, out
    perfscope = str(built["venv"] / "bin" / "perfscope")
    _run(
        [
            perfscope,
            "run",
            "--model-preset",
            "tiny",
            "--requests",
            "2",
            "--no-progress",
            "--no-report",
        ],
        tmp_path,
        env,
    )
    out = _run([perfscope, "report", "latest", "--json"], tmp_path, env)
    report = Path(json.loads(out)["path"])
    assert report.is_file() and report.stat().st_size > 10_000
