"""Every command that needs a missing optional extra says which, in one line, no traceback.

The extras' modules are hidden in a fresh interpreter (``sys.modules[name] = None`` makes
``import name`` raise ModuleNotFoundError, as on an install without the extra), and each
command is run through :func:`perfscope.cli.main` there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfscope.cli import EXTRA_OF_MODULE, missing_extra_line

_HIDDEN = ("dash", "flask", "waitress", "duckdb", "ray", "transformers", "aiohttp")

_DRIVER = """
import contextlib, io, json, sys
for name in {hidden!r}:
    sys.modules[name] = None
from perfscope.cli import main
out = {{}}
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
    out[" ".join(argv)] = [rc, err.getvalue()]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_each_command_names_the_extra_it_needs_in_one_line(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    runs = str(tmp_path / "runs")
    (tmp_path / "runs").mkdir()
    cases = {
        "dashboard": (["dashboard", "--runs-dir", runs], "dashboard"),
        "index": (["index", "--runs-dir", runs], "index"),
        "query": (["query", "SELECT 1", "--runs-dir", runs], "index"),
        "ls --where": (["ls", "--where", "true", "--runs-dir", runs], "index"),
        "hf run": (["run", f"hf:{model}", "--runs-dir", runs, "--no-progress"], "hf"),
        "ray run": (
            ["run", "python:json:dumps", "--ray", "local:2", "--runs-dir", runs, "--no-progress"],
            "ray",
        ),
        "openai run": (
            ["run", "openai:http://127.0.0.1:9", "--runs-dir", runs, "--no-progress"],
            "openai",
        ),
    }
    argvs = [argv for argv, _ in cases.values()]
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER.format(hidden=_HIDDEN), json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for label, (argv, extra) in cases.items():
        rc, err = got[" ".join(argv)]
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc in (1, 2), (label, rc, err)
        assert f"pip install 'perfscope[{extra}]'" in err, (label, err)
        assert "Traceback" not in err, (label, err)
        assert len(lines) == 1, (label, err)


def test_the_extra_line_names_the_module_and_the_extra() -> None:
    exc = ModuleNotFoundError("No module named 'dash'", name="dash")
    line = missing_extra_line(exc, "dashboard")
    assert line == (
        "error: perfscope dashboard needs dash, from the 'dashboard' extra: "
        "pip install 'perfscope[dashboard]'"
    )


def test_a_module_no_extra_provides_is_not_dressed_up_as_one() -> None:
    assert missing_extra_line(ModuleNotFoundError("x", name="perfscope.nope"), "run") is None


def test_every_mapped_extra_is_declared_in_pyproject() -> None:
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    for extra in set(EXTRA_OF_MODULE.values()):
        assert f"\n{extra} = [" in text, extra
