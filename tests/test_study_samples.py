"""Every study sample in ``samples/studies`` runs in its smoke mode (tiny model, seconds)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "studies"
if str(SAMPLES) not in sys.path:  # the samples' shared driver (_common.py)
    sys.path.insert(0, str(SAMPLES))
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


def _smoke(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``script --smoke ARGS`` run from the samples folder; it must succeed."""
    out = subprocess.run(
        [sys.executable, str(script), "--smoke", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=SAMPLES,
        # the session's cache (tests/conftest.py): one CPU calibration and one trained tiny
        # model for every smoke, as a user's cache would hold
        env=subprocess_env(),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_every_sample_has_a_write_up() -> None:
    assert len(SCRIPTS) >= 10
    missing = [p.name for p in SCRIPTS if not p.with_suffix(".md").exists()]
    assert missing == []


@pytest.mark.slow  # 4-7 s a sample at load 3.5-5 (batch_size 7.2 s, quant 4.1 s), 22 samples
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_sample_smoke_run_prints_its_measured_table(script: Path, tmp_path: Path) -> None:
    if script.stem in SKIP_SMOKE:
        pytest.skip(SKIP_SMOKE[script.stem])
    out = _smoke(script, "--runs-dir", str(tmp_path))
    header, folder = OWN_RECORD.get(script.stem, ("| measured ratio |", "studies"))
    assert header in out.stdout
    assert list((tmp_path / folder).glob("*.json"))
    if script.stem in THREADS:
        want = {setting: {n} for setting, n in THREADS[script.stem].items()}
        assert _threads_by_setting(tmp_path) == want


def test_the_parallel_study_is_stored_as_a_study_the_calibration_reads(tmp_path: Path) -> None:
    """``parallel.py --save`` stores a ``perfscope.study/1`` record (single, tp=2, pp=2,
    paired by round) whose effects carry the parallel what-if's projection, and the
    calibration turns it into tensor- and pipeline-parallel entries of this machine."""
    from perfscope.analysis.calibration import build_calibration
    from perfscope.analysis.study import read_study

    saved = tmp_path / "saved"
    _smoke(SAMPLES / "parallel.py", "--runs-dir", str(tmp_path), "--save", str(saved))
    (path,) = saved.glob("*.json")
    st = read_study(path)
    assert st.knob == "parallel" and st.values == ["single", "tp=2", "pp=2"]
    assert all(len(s.runs) == 1 for s in st.settings)
    entries = build_calibration([(path, st)])
    assert {e.technique for e in entries} == {"tensor-parallel", "pipeline-parallel"}
    tpot = [e for e in entries if e.metric == "tpot_p50_s"]
    assert len(tpot) == 2 and all(e.projected_ratio and e.sol_ratio for e in tpot)
    assert all(e.machine.cores and e.machine.engine == "reference" for e in entries)
    assert "efficiency" in st.settings[1].projection["basis"]


def test_write_up_tables_are_generated_from_their_stored_records() -> None:
    """No hand-copied figure: every write-up with a ``study-tables`` block names a record in
    ``results/`` and its tables are what that record renders today (the script's --check);
    a block naming a missing record is refused in one line."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "rerender_study_tables", SAMPLES.parents[1] / "scripts" / "rerender_study_tables.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    blocks = 0
    for md in sorted(SAMPLES.glob("*.md")):
        text = md.read_text(encoding="utf-8")
        assert mod.rerender(text) == text, f"{md.name}: stale tables (run the script)"
        blocks += text.count("<!-- study-tables: ")
    assert blocks >= 16
    with pytest.raises(SystemExit, match="no such record"):
        mod.rerender(
            "<!-- study-tables: 19990101-000000-study-none.json -->\n<!-- /study-tables -->\n"
        )
    with pytest.raises(SystemExit, match="no such quality record"):
        mod.rerender("<!-- study-quality: quant/none.json -->\n<!-- /study-quality -->\n")


def test_parallel_write_up_tables_are_generated_from_its_parallel_records() -> None:
    """``parallel.md`` shows every ``perfscope.parallel-study/1`` record of
    ``results/parallel/`` through a ``parallel-tables`` block, rendered by ``parallel.py``'s own
    table functions; a hand-edited figure in one is stale, and a block naming a missing
    record, a path outside ``results/`` or a record of another schema is refused in one line."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "rerender_study_tables", SAMPLES.parents[1] / "scripts" / "rerender_study_tables.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (SAMPLES / "parallel.md").read_text(encoding="utf-8")
    named = re.findall(r"^<!-- parallel-tables: (\S+) -->$", text, flags=re.M)
    stored = sorted(f"parallel/{p.name}" for p in (SAMPLES / "results" / "parallel").glob("*.json"))
    assert sorted(named) == stored
    assert mod.rerender(text) == text
    # a figure edited by hand inside a block (the 03:56 run's TP TPOT) makes it stale
    row = "| TP=2 | 66.310 | 4.77x |"
    assert text.count(row) == 1
    edited = text.replace(row, "| TP=2 | 60.310 | 4.77x |")
    assert mod.rerender(edited) != edited and mod.rerender(edited) == text
    for bad, why in (
        ("parallel/19990101-000000-parallel.json", "no such record"),
        ("../parallel.md", "under"),
        ("parallel/../../parallel.json", "under"),
        ("20261205-235956-study-parallel.json", "not a perfscope.parallel-study/1"),
    ):
        with pytest.raises(SystemExit, match=why):
            mod.rerender(f"<!-- parallel-tables: {bad} -->\n<!-- /parallel-tables -->\n")


#: The studies whose write-ups show a quality table from a stored quality record.
QUALITY = ("quant", "kv_dtype", "sparsity", "prune_layers", "distill")


@pytest.mark.parametrize("stem", QUALITY)
def test_write_up_quality_tables_are_their_stored_records(stem: str) -> None:
    """Each of these write-ups has one ``study-quality`` block naming a record in
    ``results/<stem>/`` of a model trained on the corpus, and every row of its table is that
    record's setting with its agreement and perplexities (the stale check above compares
    the whole block; this names what the block must hold)."""
    import re

    from _common import read_quality  # type: ignore[import-not-found]

    text = (SAMPLES / f"{stem}.md").read_text(encoding="utf-8")
    (name,) = re.findall(r"^<!-- study-quality: (\S+) -->$", text, flags=re.M)
    assert name.startswith(f"{stem}/")
    record = read_quality(SAMPLES / "results" / name)
    assert record["settings"][0]["model"]["weights"] == "trained"
    assert "no quality figure" not in text
    block = text.split(f"<!-- study-quality: {name} -->")[1].split("<!-- /study-quality -->")[0]
    assert "trained on the synthetic corpus" in block
    assert f"{record['evaluation']['sequences']} held-out sequences" in block
    assert "measured separately" in block
    for st in record["settings"]:
        q = st["quality"]
        row = (
            f"| {st['value']} | {q['top1_agreement']:.3f} | {q['candidate_perplexity']:.3f} "
            f"| {q['reference_perplexity']:.3f} |"
        )
        assert row in block.splitlines()
    assert record["settings"][0]["quality"]["top1_agreement"] == 1.0
    assert all(st["quality"]["top1_agreement"] < 1.0 for st in record["settings"][1:])


def test_quality_only_smoke_stores_a_record_the_write_ups_render(tmp_path: Path) -> None:
    """``--smoke --quality-only --save DIR`` runs no speed run (no runs folder), stores
    ``DIR/quant/<time>-quality.json`` and prints the table the write-up block renders."""
    from _common import quality_markdown, read_quality

    out = _smoke(
        SAMPLES / "quant.py",
        "--quality-only",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--save",
        str(tmp_path / "saved"),
    )
    assert not (tmp_path / "runs").exists()
    (path,) = (tmp_path / "saved" / "quant").glob("*-quality.json")
    record = read_quality(path)
    assert record["values"] == ["none", "int8"]
    assert record["settings"][0]["model"]["weights"] == "random"  # the smoke's weights
    assert quality_markdown(record) in out.stdout
