"""An ``openai:`` run is a light client: it imports no torch and no engine it does not use,
and its summary says what the client cost (CPU seconds, peak RSS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.test_openai_scripted import scripted_server

#: Modules an ``openai:`` run must never import: the torch stack and the other engines.
FORBIDDEN = (
    "torch",
    "transformers",
    "perfscope.profiler.engines.reference",
    "perfscope.profiler.engines.hf",
    "perfscope.profiler.engines.vllm_engine",
    "perfscope.profiler.engines.python_callable",
)

_PROBE = """
import json, sys
from perfscope.cli import main
rc = main(sys.argv[2:])
json.dump({"rc": rc, "modules": sorted(sys.modules)}, open(sys.argv[1], "w"))
"""


def test_an_openai_run_imports_no_torch_and_no_other_engine(tmp_path: Path) -> None:
    out = tmp_path / "modules.json"
    with scripted_server("--ttft", "0.005", "--itl", "0.002") as url:
        args = ["--requests", "4", "--concurrency", "2", "--prompt-len", "8", "--output-len", "4"]
        args += ["--runs-dir", str(tmp_path / "runs"), "--no-progress", "--no-report"]
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, str(out), "run", f"openai:{url}", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["rc"] == 0
    modules = set(got["modules"])
    assert "perfscope.profiler.engines.openai" in modules  # the probe saw a real run
    imported = sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert imported == [], imported
    # The summary's first screen names the client's own cost.
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("client: "))
    cpu_s = float(line.split()[1])
    rss_mb = float(line.split("peak RSS ")[1].split()[0])
    assert 0.0 < cpu_s < 60.0
    assert 20 < rss_mb < 2000
