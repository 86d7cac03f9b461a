"""Every study sample in ``samples/studies`` runs in its smoke mode (tiny model, seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "studies"
SCRIPTS = sorted(p for p in SAMPLES.glob("*.py") if not p.name.startswith("_"))
#: Samples that are not a ``perfscope.study`` (no knob of one engine): the header their
#: table prints and the folder under ``--runs-dir`` their record goes to.
OWN_RECORD = {"parallel": ("| measured comm per step ms |", "parallel")}
#: Smokes too slow for the suite, with the test that covers their path instead.
SKIP_SMOKE = {
    "rerun_stored": "a driver of the other samples (it takes study names); their smokes cover it",
    "compile": "torch.compile's dynamo trace takes about a minute here even with the eager "
    "backend; test_reference_paged_heads_compile.py checks the compiled path",
    "parallel_decoding": "three runs take 20-35 s here; test_parallel_decoding.py checks "
    "lookahead and Medusa decoding and the decoding knob, speculative.py's smoke the study path",
}
#: Samples whose write-ups state each setting's torch threads per process: setting -> threads.
#: (Their records once ran with the default threads while the write-ups said one.)
THREADS = {
    "replicas": {"1": 1, "2": 1},
    "disaggregation": {"off": 1, "on": 1},
    "replicas_threads": {"1": 2, "2": 1},
}


def _threads_by_setting(runs_dir: Path) -> dict[str, set[int]]:
    """Setting label (from the run folder's name, ``...-<setting>-<suffix>``) -> the
    ``torch_threads`` its runs' manifests record."""
    out: dict[str, set[int]] = {}
    for manifest in runs_dir.glob("*/manifest.json"):
        setting = manifest.parent.name.rsplit("-", 2)[1]
        config = json.loads(manifest.read_text())["engine"]["config"]
        out.setdefault(setting, set()).add(int(config["torch_threads"]))
    return out


def test_every_sample_has_a_write_up() -> None:
    assert len(SCRIPTS) >= 10
    missing = [p.name for p in SCRIPTS if not p.with_suffix(".md").exists()]
    assert missing == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_sample_smoke_run_prints_its_measured_table(script: Path, tmp_path: Path) -> None:
    if script.stem in SKIP_SMOKE:
        pytest.skip(SKIP_SMOKE[script.stem])
    out = subprocess.run(
        [sys.executable, str(script), "--smoke", "--runs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=SAMPLES,
        # the session's cache (tests/conftest.py): one CPU calibration and one trained tiny
        # model for every smoke, as a user's cache would hold
        env=subprocess_env(),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    header, folder = OWN_RECORD.get(script.stem, ("| measured ratio |", "studies"))
    assert header in out.stdout
    assert list((tmp_path / folder).glob("*.json"))
    if script.stem in THREADS:
        want = {setting: {n} for setting, n in THREADS[script.stem].items()}
        assert _threads_by_setting(tmp_path) == want
