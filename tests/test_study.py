"""``perfscope study``: interleaved settings, intervals from repeats, the JSON record, the
CLI's errors, and the reference-engine knobs and training utility a study relies on."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

import perfscope
from perfscope.analysis.study import Study
from perfscope.api.study import load_study
from perfscope.errors import UsageError
from tests.conftest import PERFSCOPE, subprocess_env

FAST = {
    "model_preset": "tiny",
    "requests": 3,
    "warmup": 0,
    "prompt_len": 8,
    "output_len": 4,
    "telemetry": False,
    "seed": 0,
}


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory: pytest.TempPathFactory) -> Study:
    runs = tmp_path_factory.mktemp("study-runs")
    return perfscope.study("batch-size", [1, 2], repeat=2, runs_dir=runs, **FAST)


def test_settings_run_interleaved_and_the_order_is_recorded(two_by_two: Study) -> None:
    s = two_by_two
    # balanced rounds: each round runs both settings, in alternating order (AB then BA)
    assert [r for r, _ in s.order] == [0, 0, 1, 1]
    firsts = [s.order[0][1], s.order[2][1]]
    assert sorted(firsts) == [0, 1] and {i for _, i in s.order[:2]} == {0, 1}
    by_order = sorted(
        (r for st in s.settings for r in st.runs),
        key=lambda r: r.order,
    )
    assert [(r.round, r.setting) for r in by_order] == s.order
    # the machine's load over the study is in its notes (a claim carries its conditions)
    assert any(n.startswith("1-minute load average ") for n in s.notes)
    for st, want in zip(s.settings, (1, 2), strict=True):
        for r in st.runs:
            manifest = json.loads((Path(r.run) / "manifest.json").read_text())
            assert manifest["engine"]["config"]["batch_size"] == want


def test_repeats_give_intervals_next_to_the_projection(two_by_two: Study) -> None:
    e = two_by_two.effect("2", "tpot_p50_s")
    assert e is not None
    assert e.change.n == (2, 2) and e.change.paired
    # two rounds cannot show a change at 95% without assuming normal noise: said, not claimed
    assert e.change.ci is None and e.change.verdict == "no detectable change"
    assert e.change.detectable is None and e.change.ratio is not None
    assert e.projected_ratio is not None and e.projected_ratio > 0
    assert math.isclose(e.error, e.projected_ratio / e.change.ratio - 1.0)
    assert two_by_two.effect("1", "tpot_p50_s") is None


def test_study_json_round_trips(two_by_two: Study) -> None:
    path = Path(two_by_two.path)
    assert path.parent.name == "studies"
    data = json.loads(path.read_text())
    assert data["schema"] == "perfscope.study/1"
    back = load_study(path)
    assert back.to_dict() == two_by_two.to_dict()
    assert back == two_by_two


def test_a_single_repeat_says_noise_unknown_and_memory_follows_the_kv_heads(
    tmp_path: Path,
) -> None:
    s = perfscope.study("kv-heads", "4,1", repeat=1, runs_dir=tmp_path, **FAST)
    e = s.effect("1", "ttft_p50_s")
    assert e is not None and e.change.ci is None and e.change.verdict == "no detectable change"
    assert any("noise unknown" in n for n in s.notes)
    kv = [st.memory["kv_cache_bytes"] for st in s.settings]
    assert kv[1] / kv[0] == pytest.approx(0.25)
    assert s.settings[1].memory["weights_bytes"] < s.settings[0].memory["weights_bytes"]


def test_adaptive_rounds_stop_at_the_time_budget_and_say_the_precision_reached(
    tmp_path: Path,
) -> None:
    """With a precision target the rounds go on until it is met or the budget would be
    overrun; a budget one round overruns stops after that round, and the note says why and
    what interval was reached."""
    quick = {**FAST, "requests": 2, "output_len": 2}
    s = perfscope.study(
        "batch-size", [1, 2], repeat=1, precision=0.05, budget_s=1e-3, runs_dir=tmp_path, **quick
    )
    assert s.repeat == 1 and [r for r, _ in s.order] == [0, 0]
    (note,) = [n for n in s.notes if n.startswith("adaptive rounds")]
    assert "budget of 0.001 s after 1 rounds" in note and "(target ±5%)" in note
    assert "interval unknown" in note  # one round gives no interval yet
    with pytest.raises(UsageError, match="precision must be positive"):
        perfscope.study("batch-size", [1, 2], precision=0, runs_dir=tmp_path, **FAST)


def test_unknown_knobs_and_values_are_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown knob 'warp'"):
        perfscope.study("warp", "1,2", runs_dir=tmp_path, **FAST)
    with pytest.raises(UsageError, match="quant value 'int3'"):
        perfscope.study("quant", "none,int3", runs_dir=tmp_path, **FAST)
    with pytest.raises(UsageError, match="at least two values"):
        perfscope.study("dtype", "float32", runs_dir=tmp_path, **FAST)
    assert not (tmp_path / "studies").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["study", "warp", "--values", "1,2"], "unknown knob 'warp'"),
        (["study", "batch-size", "--values", "1,x"], "batch-size value 'x'"),
        (["study", "kv-heads", "--values", "4,3", "--model-preset", "tiny"], "not divisible"),
    ],
)
def test_cli_gives_one_line_errors(tmp_path: Path, argv: list[str], message: str) -> None:
    out = subprocess.run(
        [*PERFSCOPE, *argv, "--runs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not (tmp_path / "studies").exists()


def test_cli_prints_the_study_json_and_writes_the_report(tmp_path: Path) -> None:
    report = tmp_path / "study.html"
    out = subprocess.run(
        [
            *PERFSCOPE,
            "study",
            "attention",
            "--values",
            "explicit,sdpa",
            "--repeat",
            "1",
            "--model-preset",
            "tiny",
            "--requests",
            "2",
            "--warmup",
            "0",
            "--prompt-len",
            "8",
            "--output-len",
            "4",
            "--no-telemetry",
            "--runs-dir",
            str(tmp_path),
            "--json",
            "-o",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema"] == "perfscope.study/1" and data["knob"] == "attention"
    assert [s["value"] for s in data["settings"]] == ["explicit", "sdpa"]
    html = report.read_text()
    assert 'id="fig-study-roofline"' in html and 'id="fig-study-tpot_p50_s"' in html


# --------------------------------------------------------------------------- engine knobs


def test_sdpa_and_explicit_attention_give_the_same_logits() -> None:
    from perfscope.profiler.engines.reference.model import PRESETS, ReferenceModel

    m = ReferenceModel.build(PRESETS["tiny"], seed=3)
    tokens = torch.randint(1, 100, (2, 12))
    a = m.prefill(tokens, m.new_cache(2, 32))
    m.set_attention("sdpa")
    b_ = m.prefill(tokens, m.new_cache(2, 32))
    torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-4)


def test_recomputing_without_a_kv_cache_matches_cached_decode(tmp_path: Path) -> None:
    common = {**FAST, "requests": 2, "output_len": 6, "runs_dir": tmp_path}
    on = perfscope.run("reference", **common)
    off = perfscope.run("reference", kv_cache="off", **common)
    assert off.manifest["engine"]["config"]["kv_cache"] is False
    assert off.counts["output_tokens"] == on.counts["output_tokens"] == 12
    # What the recompute path relies on: a full pass over the sequence gives the logits
    # the cached decode step gives.
    from perfscope.profiler.engines.reference.model import PRESETS, ReferenceModel

    m = ReferenceModel.build(PRESETS["tiny"], seed=1)
    seq = torch.randint(1, 100, (1, 9))
    cache = m.new_cache(1, 16)
    m.prefill(seq[:, :8], cache)
    step = m.decode(seq[:, 8], cache, torch.tensor([8]))
    full = m.prefill(seq, m.new_cache(1, 16))
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)


def test_threads_option_sets_torch_threads_for_the_engine_and_restores_them() -> None:
    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.engines.reference.engine import ReferenceEngine

    before = torch.get_num_threads()
    eng = ReferenceEngine(
        "reference", EngineOptions(model_preset="tiny", device="cpu", extra={"threads": "1"})
    )
    assert torch.get_num_threads() == 1 and eng.info().config["torch_threads"] == 1
    eng.close()
    assert torch.get_num_threads() == before
    with pytest.raises(UsageError, match="threads"):
        ReferenceEngine("reference", EngineOptions(model_preset="tiny", extra={"threads": "0"}))


def test_int8_weights_are_reported_to_the_cost_model_and_stay_close() -> None:
    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.engines.reference.engine import ReferenceEngine
    from perfscope.profiler.engines.reference.train import quality

    def engine(quant: str) -> ReferenceEngine:
        opts = EngineOptions(model_preset="tiny", device="cpu", extra={"quant": quant})
        return ReferenceEngine("reference", opts)

    base = engine("none")
    for mode in ("int8", "int8-wo"):
        q = engine(mode)
        spec = q.info().model
        assert spec["weight_dtype"] == "int8" and spec["weight_bytes_per_param"] == 1.0
        # random weights: agreement is only a sanity bound, not a quality claim
        assert quality(base.model, q.model, n=4)["top1_agreement"] > 0.5


def test_training_is_cached_per_configuration_and_pruned_weights_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.engines.reference.engine import ReferenceEngine
    from perfscope.profiler.engines.reference.train import TrainConfig, quality, train

    monkeypatch.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path))
    cfg = TrainConfig(steps=3, batch=2, seq_len=8)
    first = train(cfg)
    assert not first.from_cache and first.path.is_relative_to(tmp_path)
    again = train(cfg)
    assert again.from_cache and again.path == first.path
    assert train(TrainConfig(steps=4, batch=2, seq_len=8)).path != first.path
    state = torch.load(first.path, weights_only=True)
    pruned = ReferenceEngine(
        "reference",
        EngineOptions(
            model_preset="tiny",
            device="cpu",
            model_overrides={"n_layers": 1},
            extra={"weights": str(first.path)},
        ),
    )
    torch.testing.assert_close(pruned.model.blocks[0].wq.weight, state["blocks.0.wq.weight"])
    assert len(pruned.model.blocks) == 1
    full = ReferenceEngine(
        "reference",
        EngineOptions(model_preset="tiny", device="cpu", extra={"weights": str(first.path)}),
    )
    same = quality(full.model, full.model, n=4)
    assert same["top1_agreement"] == 1.0
    assert same["reference_perplexity"] == same["candidate_perplexity"]


def test_recompute_is_projected_as_a_prefill_per_step(tmp_path: Path) -> None:
    from perfscope.analysis.study import project_change

    run = perfscope.run("reference", runs_dir=tmp_path, **{**FAST, "output_len": 8})
    summary = run.summary.to_dict()
    same = project_change(summary, summary, batch=(3, 3), prompt_len=8, output_len=8)
    off = project_change(
        summary, summary, batch=(3, 3), prompt_len=8, output_len=8, kv_cache=(True, False)
    )
    assert same is not None and off is not None
    assert same["ratios"]["tpot_s"] == pytest.approx(1.0)
    # At speed of light recompute is strictly more work per token. The derated projection
    # keeps the baseline's measured per-step overhead, which on a busy machine can hide the
    # extra work entirely (then exactly 1.0): it must never project recompute as faster.
    assert off["sol_ratios"]["tpot_s"] > 1.0
    assert off["ratios"]["tpot_s"] >= 1.0 - 1e-9
    # The case that broke it: decode held back by 50 ms of host work per step, prefill at its
    # roof. Recompute timed at the prefill's derating once came out 184x faster than the
    # cached decode it replaces; a step without a cache is never less work than one with it.
    skewed = json.loads(json.dumps(summary))
    phases = skewed["roofline"]["phases"]
    phases["decode"].update(
        verdict="overhead-bound",
        time_s=(phases["decode"]["sol_time_s"] or 0.0) + 0.05 * phases["decode"]["steps"],
    )
    phases["prefill"].update(verdict="compute-bound", efficiency=1.0)
    skewed_off = project_change(
        skewed, skewed, batch=(3, 3), prompt_len=8, output_len=8, kv_cache=(True, False)
    )
    assert skewed_off is not None and skewed_off["ratios"]["tpot_s"] >= 1.0 - 1e-9


def test_a_study_measures_no_goodput_for_runs_without_slos() -> None:
    from perfscope.analysis.study import run_metrics

    no_slos = run_metrics({"goodput": {"slos": {}, "goodput_req_s": 3.0, "attainment": 1.0}})
    assert no_slos["goodput_req_s"] is None and no_slos["attainment"] is None
    judged = run_metrics({"goodput": {"slos": {"ttft": 0.2}, "goodput_req_s": 3.0}})
    assert judged["goodput_req_s"] == 3.0


@pytest.mark.parametrize(("policy", "said"), [(None, "unset (spinning)"), ("PASSIVE", "PASSIVE")])
def test_a_threads_study_records_how_its_openmp_threads_waited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str | None, said: str
) -> None:
    """Two threads that spin and two that sleep measure different things on a busy machine:
    the study says which it measured, and the note survives re-deriving the record."""
    from perfscope.analysis.study import read_study, rederive_study

    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    quick = {**FAST, "requests": 2, "output_len": 2}
    s = perfscope.study("threads", [1, 2], repeat=1, runs_dir=tmp_path, **quick)
    (note,) = [n for n in s.notes if n.startswith("OpenMP wait policy")]
    assert said in note and ("spinning threads measure" in note) == (policy is None)
    assert s.path is not None
    assert note in rederive_study(read_study(s.path)).notes
    # One thread has no partner to wait for: a one-thread batch-size study says nothing.
    other = perfscope.study("batch-size", [1, 2], repeat=1, runs_dir=tmp_path, threads=1, **quick)
    assert not [n for n in other.notes if n.startswith("OpenMP")]


def test_every_field_knob_sets_its_run_argument_and_a_load_knob_makes_the_load_online() -> None:
    from perfscope.api.run import RunArgs
    from perfscope.api.study import KNOBS, _apply

    base = RunArgs(mode="batch", engine_options={"max_batched_tokens": "64"})
    text = {"scheduler": "static", "dtype": "bf16", "model-preset": "tiny"}
    got = {}
    for name, knob in KNOBS.items():
        if knob.kind == "field":
            changed = _apply(base, knob, knob.parse(text.get(name, "4")))
            got[name] = (getattr(changed, knob.target), changed.mode)
    assert got == {
        "batch-size": (4, "batch"),
        "scheduler": ("static", "batch"),
        "dtype": ("bfloat16", "batch"),
        "concurrency": (4, "online"),
        "rate": (4.0, "online"),
        "model-preset": ("tiny", "batch"),
    }
    assert _apply(base, KNOBS["kv-heads"], 2).model_overrides == {"n_kv_heads": 2}
    unlimited = _apply(base, KNOBS["max-batched-tokens"], KNOBS["max-batched-tokens"].parse("off"))
    assert "max_batched_tokens" not in unlimited.engine_options


def test_a_study_column_reads_the_catalogue_metric_it_names_and_judges_in_its_direction() -> None:
    from perfscope.analysis.catalogue import metric
    from perfscope.analysis.study import METRICS, run_metrics
    from perfscope.analysis.study.record import STUDY_COLUMNS

    summary = json.loads((Path(__file__).parent / "data/runs/v1/summary.json").read_text())
    summary["energy"] = {"j_per_output_token": 0.25}
    measured = run_metrics(summary)
    assert set(METRICS) == set(STUDY_COLUMNS)
    for column, (name, _) in STUDY_COLUMNS.items():
        m = metric(name)
        assert measured[column] is not None and measured[column] == m.value(summary), column
        assert METRICS[column][0] == m.better, column
