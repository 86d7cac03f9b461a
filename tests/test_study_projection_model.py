"""Study projections from the baseline's fitted cost model, with the load's queueing.

The fitted host terms move with the change (fewer layers pay fewer per-layer host costs, a
larger batch pays its per-row costs), a per-layer term one model shape cannot separate is
split out of per step by a stated rule, and a load with more requests than slots waits for
them (continuous batching simulated with the projected steps). No engine runs here.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.overhead import (
    KERNELS_OUTSIDE_LAYERS,
    KERNELS_PER_LAYER,
    OverheadFit,
    fitted_times,
    roof_times,
)
from perfscope.analysis.queueing import Load, simulate
from perfscope.analysis.study import project_change
from perfscope.hwdb.spec import DeviceSpec

ROOT = Path(__file__).resolve().parents[1]
CPU = DeviceSpec(
    key="test-cpu-calibrated",
    name="Test CPU (calibrated)",
    vendor="amd",
    kind="cpu",
    peak_flops={"fp32": 1e11, "bf16": 1e11, "fp16": 1e11},
    mem_bw_bytes_s=1e12,
    mem_bytes=64e9,
    cache_bytes=32e6,
    source="calibrated",
)
TINY = dataclasses.replace(ModelSpec.from_preset("llama-3-8b"), n_layers=4, hidden_size=128)
#: A host-dominated CPU engine: 1 ms per layer per step, 0.2 ms per row, 0.1 ms per step.
HOST = OverheadFit(
    roof_scale=1.0,
    per_layer_s=1e-3,
    per_sequence_s=2e-4,
    per_token_s=0.0,
    per_step_s=1e-4,
    device=CPU.key,
    platform="cpu",
)


def _summary(model: ModelSpec, load: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "hardware": {"spec": CPU.to_dict()},
        "roofline": {"available": True, "phases": {}},
        "model": model.to_dict(),
    }
    if load is not None:
        out["load"], out["workload"] = load, {"requests": 8}
    return out


def test_layer_pruning_projects_the_per_layer_host_time_it_saves() -> None:
    two = dataclasses.replace(TINY, n_layers=2)
    fitted = project_change(
        _summary(TINY), _summary(two), batch=(1, 1), prompt_len=16, output_len=8, fit=HOST
    )
    derated = project_change(
        _summary(TINY), _summary(two), batch=(1, 1), prompt_len=16, output_len=8
    )
    assert fitted is not None and derated is not None
    a = fitted_times(HOST, TINY, CPU, batch=1, prompt_len=16, output_len=8)
    b = fitted_times(HOST, two, CPU, batch=1, prompt_len=16, output_len=8)
    assert fitted["ratios"]["tpot_s"] == pytest.approx(b.tpot_s / a.tpot_s)
    # host-bound: half the layers is close to half the time, not the roofline's tiny change
    assert 0.5 < fitted["ratios"]["tpot_s"] < 0.6
    assert "fitted cost model" in fitted["basis"]
    assert fitted["overhead_fit"]["per_layer_s"] == HOST.per_layer_s


def test_a_larger_batch_pays_its_fitted_per_row_cost() -> None:
    p = project_change(
        _summary(TINY), _summary(TINY), batch=(1, 8), prompt_len=16, output_len=8, fit=HOST
    )
    assert p is not None
    a = fitted_times(HOST, TINY, CPU, batch=1, prompt_len=16, output_len=8)
    b = fitted_times(HOST, TINY, CPU, batch=8, prompt_len=16, output_len=8)
    assert b.decode_host_s - a.decode_host_s == pytest.approx(7 * HOST.per_sequence_s)
    assert p["ratios"]["tpot_s"] == pytest.approx(b.tpot_s / a.tpot_s)
    assert p["ratios"]["tpot_s"] > 1.2  # seven more rows of 0.2 ms on a ~4 ms step


def test_a_per_layer_term_one_shape_cannot_separate_is_split_by_the_ops_rule() -> None:
    folded = dataclasses.replace(HOST, per_layer_s=0.0, per_step_s=4.1e-3, folded=("per layer",))
    split = folded.split_layers(4)
    share = KERNELS_PER_LAYER * 4 / (KERNELS_PER_LAYER * 4 + KERNELS_OUTSIDE_LAYERS)
    assert split.per_layer_s * 4 == pytest.approx(4.1e-3 * share)
    assert split.per_layer_s * 4 + split.per_step_s == pytest.approx(4.1e-3)  # same baseline
    assert "per layer" not in split.folded and "an assumption" in split.notes[-1]
    assert HOST.split_layers(4) is HOST  # fitted per layer: left alone


def test_a_burst_on_one_slot_waits_in_waves_and_eight_slots_do_not() -> None:
    burst = Load(mode="batch", requests=8)
    one = simulate(burst, slots=1, prefill_s=lambda k: 0.01, decode_s=lambda b: 0.002, output_len=5)
    service = 0.01 + 4 * 0.002
    # request i gets its first token at i x service + prefill; the median of eight
    assert one.ttft_p50_s == pytest.approx(3.5 * service + 0.01)
    assert one.throughput_tok_s == pytest.approx(8 * 5 / (8 * service))
    eight = simulate(
        burst, slots=8, prefill_s=lambda k: 0.01, decode_s=lambda b: 0.002, output_len=5
    )
    assert eight.ttft_p50_s == pytest.approx(0.01) and eight.queue_p50_s == 0.0
    assert eight.tpot_p50_s == pytest.approx(0.002) and eight.batch_mean == 8


def test_open_and_closed_loops_queue_only_beyond_their_slots() -> None:
    slow = Load(mode="online", requests=6, rate=1.0)  # one request a second, 18 ms each
    t = simulate(slow, slots=4, prefill_s=lambda k: 0.01, decode_s=lambda b: 0.002, output_len=5)
    assert t.ttft_p50_s == pytest.approx(0.01) and t.batch_mean == 1
    assert t.throughput_tok_s == pytest.approx(6 * 5 / (5.0 + 0.018))
    users = Load(mode="online", requests=8, concurrency=4)
    two = simulate(users, slots=2, prefill_s=lambda k: 0.01, decode_s=lambda b: 0.002, output_len=5)
    four = simulate(
        users, slots=4, prefill_s=lambda k: 0.01, decode_s=lambda b: 0.002, output_len=5
    )
    assert four.queue_p50_s == 0.0 and four.ttft_p50_s == pytest.approx(0.01)
    # four users on two slots: half the requests wait one service for a slot
    assert two.queue_p50_s > 0.0 and two.ttft_p50_s > four.ttft_p50_s


def test_the_load_is_read_from_the_run_summary() -> None:
    assert Load.from_summary({"load": {"mode": "batch"}, "workload": {"requests": 8}}) == Load(
        "batch", 8
    )
    rate = Load.from_summary(
        {"load": {"mode": "online", "rate": 5, "arrival": "poisson"}, "workload": {"requests": 4}}
    )
    assert rate is not None and rate.rate == 5.0 and rate.describe().startswith("4 requests at 5")
    assert Load.from_summary({"load": {"mode": "online"}, "workload": {"requests": 4}}) is None
    assert (
        Load.from_summary({"load": {"mode": "batch"}, "workload": {"requests": 4, "trace": "t"}})
        is None
    )


def test_batching_a_burst_projects_the_queueing_it_removes_from_ttft() -> None:
    burst = {"mode": "batch", "rate": None, "concurrency": None}
    base, cand = _summary(TINY, burst), _summary(TINY, burst)
    loads = (Load.from_summary(base), Load.from_summary(cand))
    queued = project_change(
        base, cand, batch=(1, 8), prompt_len=16, output_len=8, fit=HOST, loads=loads
    )
    alone = project_change(base, cand, batch=(1, 8), prompt_len=16, output_len=8, fit=HOST)
    assert queued is not None and alone is not None
    # without queueing batch 8's prefill of eight prompts is slower than one prompt's;
    # with it, batch 1's median request waits for three and a half others first
    assert alone["ratios"]["ttft_s"] > 1.0
    assert [q["queue_p50_s"] > 0 for q in queued["queue"]] == [True, False]
    assert "continuous batching" in queued["basis"]
    a = fitted_times(HOST, TINY, CPU, batch=1, prompt_len=16, output_len=8)
    b = fitted_times(HOST, TINY, CPU, batch=8, prompt_len=16, output_len=8)
    waited = statistics.median(i * a.e2e_s + a.ttft_s for i in range(8))
    assert queued["baseline"]["ttft_s"] == pytest.approx(waited)
    assert queued["ratios"]["ttft_s"] == pytest.approx(b.ttft_s / waited)
    assert queued["ratios"]["ttft_s"] < 0.5


def test_a_projection_says_how_far_it_was_checked_or_that_it_was_not() -> None:
    from perfscope.analysis.calibration import MachineClass, load_calibration, projection_check

    entries = load_calibration()
    here = next(e.machine for e in entries if e.significant and e.error is not None)
    checked = projection_check(here, entries)
    sig = sorted(
        abs(float(e.error))
        for e in entries
        if e.machine.matches(here) and e.significant and e.error is not None
    )
    assert checked.startswith(f"checked on {here.describe()}: median |error| ")
    assert f"{100 * statistics.median(sig):.0f}% over {len(sig)} significant" in checked
    gpu = MachineClass("AMD EPYC", 2, "NVIDIA H100 80GB HBM3", "reference")
    assert projection_check(gpu, entries).startswith("unchecked: no stored study")


def test_a_saved_study_names_its_runs_by_id_and_no_temporary_folder() -> None:
    from perfscope.api.study import load_study, portable_study

    stored = sorted(
        p for p in (ROOT / "samples" / "studies" / "results").glob("*.json") if "layers" in p.name
    )[0]
    s = load_study(stored)
    moved = dataclasses.replace(
        s,
        settings=[
            dataclasses.replace(
                st, runs=[dataclasses.replace(r, run=f"/tmp/x/{r.run}") for r in st.runs]
            )
            for st in s.settings
        ],
    )
    out = portable_study(moved, "results/a.json")
    assert out.path == "results/a.json"
    assert [r.run for st in out.settings for r in st.runs] == [
        r.run for st in s.settings for r in st.runs
    ]
    assert all("/" not in r.run for st in out.settings for r in st.runs)


def test_dynamic_int8_prices_the_re_quantised_inputs_of_every_token() -> None:
    """int8 weights read a quarter of the fp32 bytes, but dynamic quantisation writes an
    int8 copy of every linear's fp32 input per token (5 bytes an element): the fitted
    projection adds those bytes to each step's roofline, per token, so a bandwidth-bound
    step gains less than the weights alone promise."""
    from perfscope.analysis.overhead import quantisation_bytes

    slow = dataclasses.replace(CPU, mem_bw_bytes_s=1e9)  # bandwidth-bound, host-free steps
    fit = dataclasses.replace(HOST, per_layer_s=0.0, per_sequence_s=0.0, per_step_s=0.0)
    fit = dataclasses.replace(fit, device=slow.key)
    int8 = dataclasses.replace(TINY, weight_dtype="int8", weight_bytes_per_param=1.0)

    def summary(m: ModelSpec) -> dict[str, Any]:
        return {**_summary(m), "hardware": {"spec": slow.to_dict()}}

    kw: dict[str, Any] = {"batch": (8, 8), "prompt_len": 16, "output_len": 8, "fit": fit}
    bare = project_change(summary(TINY), summary(int8), **kw)
    priced = project_change(summary(TINY), summary(int8), quant=("none", "int8"), **kw)
    assert bare is not None and priced is not None
    per_token = quantisation_bytes(int8, "int8", 1.0)
    plain = fitted_times(fit, int8, slow, batch=8, prompt_len=16, output_len=8)
    extra = 8 * per_token / slow.mem_bw_bytes_s  # eight rows a decode step
    assert priced["candidate"]["tpot_s"] == pytest.approx(plain.tpot_s + extra, rel=1e-6)
    assert priced["ratios"]["tpot_s"] > bare["ratios"]["tpot_s"]
    assert priced["baseline"] == bare["baseline"]  # fp32 weights: nothing re-quantised


def test_more_threads_than_the_other_load_leaves_free_cores_is_not_projected() -> None:
    """Two intra-op threads on a 2-core machine whose other load used 1.7 cores wait for a
    core at every parallel op: no projection (it would say 1x; 15-34x slower was measured),
    while the same change on an idle machine keeps its projection."""
    from perfscope.analysis.study import free_cores, oversubscribed_threads

    def run(others_cpu_s: float) -> dict[str, Any]:
        return {"contention": {"cpu_count": 2, "others_cpu_s": others_cpu_s, "window_s": 1.0}}

    loaded = [run(1.6), run(1.7), run(1.8)]
    assert free_cores(loaded) == pytest.approx(0.3)
    why = oversubscribed_threads("1", "2", loaded)
    assert why is not None and "2 threads on 0.3 free cores" in why
    assert oversubscribed_threads("1", "2", [run(0.1)]) is None  # 1.9 free: projected
    assert oversubscribed_threads("2", "1", loaded) is None  # fewer threads: projected
    assert oversubscribed_threads("1", "2", [{}]) is None  # not measured: projected as before


def test_speculative_passes_are_timed_by_the_fitted_model_of_the_baseline() -> None:
    """A host-bound engine: a 1-layer draft pass costs its one layer's host time, not the
    derated roofline's near-1 ratio; the verify pass of K + 1 tokens a row is a decode step
    plus its prefill work; the projection multiplies the speedup at the assumed acceptance
    into TPOT and throughput."""
    from perfscope.analysis.whatif import ASSUMED_ACCEPTANCE, speculative_speedup

    draft = dataclasses.replace(TINY, n_layers=1)
    fit = dataclasses.replace(HOST, prefill_scale=1.0)
    cand = {
        **_summary(TINY),
        "speculative": {"num_speculative_tokens": 2, "draft_model": draft.to_dict()},
    }
    p = project_change(_summary(TINY), cand, batch=(1, 1), prompt_len=16, output_len=8, fit=fit)
    assert p is not None
    before = p["speculative"]["before_run"]
    one, ctx = np.array([1.0]), np.array([16 + 8 / 2])  # one row at the mean context
    step = {
        m.n_layers: float(fit.step_time(roof_times(m, CPU, one, one, ctx), m.n_layers, 1, 1)[0])
        for m in (TINY, draft)
    }
    assert before["cost_ratio_fitted"] == pytest.approx(step[1] / step[4])
    assert before["cost_ratio_fitted"] < 0.4  # the derated roofline's ratio is near 1
    assert 1.0 < before["verify_cost_fitted"] < 1.5  # a decode step + 3 tokens' work
    gain = speculative_speedup(
        ASSUMED_ACCEPTANCE, 2, before["cost_ratio_fitted"], before["verify_cost_fitted"]
    )
    assert before["fitted"] == pytest.approx(gain)
    assert p["ratios"]["tpot_s"] == pytest.approx(1.0 / gain, rel=1e-6)
    assert p["ratios"]["throughput_tok_s"] == pytest.approx(gain, rel=1e-6)


def test_a_kv_budget_caps_the_projected_batch_by_what_it_holds_paged_or_not() -> None:
    """A 1 MB KV budget for the tiny model at max_seq_len 512 holds one contiguous sequence
    but 61 blocks of 16 tokens: twelve sequences of 80 tokens paged. The study projects
    each setting at that many sequences, not at the batch size both ask for."""
    from perfscope.api.run import RunArgs
    from perfscope.api.study import _batch, kv_capacity

    opts = {"kv_budget_mb": 1.0, "kv_block_tokens": 16, "max_seq_len": 512}
    off = RunArgs(model_preset="tiny", batch_size=32, engine_options={**opts, "kv_paged": "off"})
    on = dataclasses.replace(off, engine_options={**opts, "kv_paged": "on"})
    assert kv_capacity(off, 80) == 1
    assert kv_capacity(on, 80) == 61 // 5 == 12
    assert (_batch(off, 24, 80), _batch(on, 24, 80)) == (1, 12)
    assert _batch(dataclasses.replace(off, engine_options={}), 24, 80) == 24  # no budget


def test_measured_kernel_calls_add_their_difference_to_every_projected_step() -> None:
    """A candidate whose linears were timed 50 us slower per layer plus 2 us per row, and
    whose cache read 1 ns slower per element: each projected step is the baseline's work
    plus exactly that difference. Its narrower weights are not priced again by the
    roofline (the timed calls ran them); its speed of light stays its own roofline."""
    from perfscope.analysis.overhead import PassCosts

    passes = PassCosts(linears_s=50e-6, linears_per_row_s=2e-6, kv_read_per_element_s=1e-9)
    int8 = dataclasses.replace(TINY, weight_dtype="int8", weight_bytes_per_param=1.0)
    kw: dict[str, Any] = {"batch": (8, 8), "prompt_len": 16, "output_len": 8, "fit": HOST}
    p = project_change(_summary(TINY), _summary(int8), passes=passes, **kw)
    bare = project_change(_summary(TINY), _summary(int8), **kw)
    assert p is not None and bare is not None
    base = fitted_times(HOST, TINY, CPU, batch=8, prompt_len=16, output_len=8)
    spans = 16 + np.arange(7) + 1  # each decode step reads the cache up to its position
    read = 8 * spans * TINY.n_kv_heads * TINY.head_dim * 1e-9
    decode = TINY.n_layers * (50e-6 + 2e-6 * 8 + read)
    assert p["candidate"]["tpot_s"] == pytest.approx(base.tpot_s + float(np.mean(decode)))
    prefill = TINY.n_layers * (
        50e-6 + 2e-6 * 8 * 16 + 8 * 16 * TINY.n_kv_heads * TINY.head_dim * 1e-9
    )
    assert p["candidate"]["ttft_s"] == pytest.approx(base.ttft_s + prefill)
    assert p["ratios"]["tpot_s"] > 1.0 >= bare["ratios"]["tpot_s"]
    assert p["sol_ratios"] == bare["sol_ratios"]
    assert p["passes"]["linears_s"] == 50e-6 and "measured against the baseline" in p["basis"]


def _timed_on_one_thread(candidate: Any, **kw: Any) -> Any:
    """:func:`measure_passes` of the tiny preset, fp32 baseline against ``candidate``, on
    one intra-op thread (as the studies run), in short timings."""
    import torch

    from perfscope.profiler.engines.reference.model import PRESETS
    from perfscope.profiler.engines.reference.passes import PassSetting, measure_passes

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure_passes(PRESETS["tiny"], PassSetting(), candidate, budget_s=0.005, **kw)
    finally:
        torch.set_num_threads(before)


def test_the_engines_own_quantised_cache_read_is_timed_slower_than_a_view() -> None:
    """Real calls of the reference model, as the engine builds them: an fp8 cache is cast
    back (a table lookup) on every read, which a float cache's view is not; the linears,
    the same in both settings, are not timed at all."""
    from perfscope.profiler.engines.reference.passes import PassSetting

    t = _timed_on_one_thread(
        PassSetting(kv_dtype="fp8"), rows=[1, 8], spans=[(8, 64), (8, 256)], rounds=3
    )
    assert t.linears_s == (0.0, 0.0) and t.head_s == (0.0, 0.0)
    assert all(r > 0 for r in t.kv_read_s)
    assert t.kv_elements == (8 * 2 * 64 * 32, 8 * 2 * 256 * 32)
    assert t.threads == 1 and t.rounds == 3
    assert t.decode_s > 0 and t.prefill_s > 0  # the baseline's own steps, timed alone


def test_timed_calls_are_stretched_as_the_fitted_steps_are_over_the_same_steps_alone() -> None:
    """The baseline's decode step took 3x in the engine (its fit) what the same step took
    timed alone, its prefill 2x: the candidate's extra calls, timed alone, are stretched
    alike (the load's share of the CPU lengthens them too)."""
    from perfscope.analysis.overhead import PassCosts

    at_d = fitted_times(HOST, TINY, CPU, batch=8, prompt_len=19, output_len=2)
    at_p = fitted_times(HOST, TINY, CPU, batch=8, prompt_len=16, output_len=2)
    passes = PassCosts(
        linears_s=50e-6,
        decode_rows=8,
        decode_span=20,
        isolated_decode_s=at_d.tpot_s / 3,
        prefill_rows=8,
        prefill_tokens=16,
        isolated_prefill_s=at_p.ttft_s / 2,
    )
    assert passes.stretch(HOST, TINY, CPU) == pytest.approx((3.0, 2.0))
    base = fitted_times(HOST, TINY, CPU, batch=8, prompt_len=16, output_len=8)
    cand = fitted_times(HOST, TINY, CPU, batch=8, prompt_len=16, output_len=8, passes=passes)
    assert cand.tpot_s - base.tpot_s == pytest.approx(3 * TINY.n_layers * 50e-6)
    assert cand.ttft_s - base.ttft_s == pytest.approx(2 * TINY.n_layers * 50e-6)
    untimed = PassCosts(linears_s=50e-6)  # nothing timed alone: no stretch
    assert untimed.stretch(HOST, TINY, CPU) == (1.0, 1.0)


def test_a_row_cost_one_batch_cannot_show_is_taken_from_the_model_timed_at_both_batches() -> None:
    """Every baseline step had one row, so the fit folded per sequence into per step and a
    larger batch would project no per-row cost. The baseline model's decode step timed
    alone at 1 and 12 rows gives the cost of a row, stretched as the engine's steps are;
    the baseline's own steps are predicted as before."""
    from perfscope.analysis.overhead import PassCosts

    one_batch = dataclasses.replace(
        HOST, per_sequence_s=0.0, per_step_s=3e-4, folded=("per sequence", "per token")
    )
    at1 = fitted_times(one_batch, TINY, CPU, batch=1, prompt_len=19, output_len=2)
    passes = PassCosts(
        decode_rows=1,
        decode_span=20,
        isolated_decode_s=at1.tpot_s / 2,  # the engine's step is 2x the model's alone
        more_rows=12,
        isolated_more_rows_s=at1.tpot_s / 2 + 11 * 1e-4,  # 0.1 ms a row alone
    )
    assert not passes.times_calls and passes.isolated_per_row_s == pytest.approx(1e-4)
    kw: dict[str, Any] = {"batch": (1, 12), "prompt_len": 16, "output_len": 8, "fit": one_batch}
    flat = project_change(_summary(TINY), _summary(TINY), **kw)
    priced = project_change(_summary(TINY), _summary(TINY), passes=passes, **kw)
    assert flat is not None and priced is not None
    assert priced["baseline"]["tpot_s"] == pytest.approx(flat["baseline"]["tpot_s"])
    grown = priced["candidate"]["tpot_s"] - flat["candidate"]["tpot_s"]
    assert grown == pytest.approx(11 * 2 * 1e-4)  # 11 more rows at 0.1 ms, stretched 2x
    fit = priced["overhead_fit"]
    assert fit["per_sequence_s"] == pytest.approx(2e-4) and "a row" in fit["notes"][-1]


def test_a_dtype_change_times_the_whole_step_at_both_dtypes() -> None:
    """Every op of a step changes with the dtype (norms, attention, the cache), so the
    whole decode step and prefill are timed at both, per layer, on the line through the
    decode's and the prefill's rows; nothing is left to the cache's own terms."""
    from perfscope.profiler.engines.reference.passes import PassSetting

    t = _timed_on_one_thread(
        PassSetting(dtype="bfloat16"),
        rows=[1, 2],
        spans=[(2, 8)],
        decode=(2, 12),
        prefill=(2, 8),
        rounds=2,
    )
    assert t.rows == (2, 16) and len(t.linears_s) == 2
    assert t.kv_read_s == () and t.kv_write_s == () and t.head_s == (0.0, 0.0)
    assert t.decode == (2, 12) and t.decode_s > 0 and t.prefill_s > 0


def test_a_token_budget_splits_each_prompt_into_chunks_that_each_pay_a_step() -> None:
    """One request of a 100-token prompt and 3 output tokens, steps of 1 ms plus 10 us a
    token: without a budget one prefill pass (2 ms) then two decode steps; with a 32-token
    budget four chunk steps (32 + 32 + 32 + 4 tokens) before the first token, so TTFT pays
    the per-step cost four times while the prompt's work is the same."""
    from perfscope.analysis.study import simulate_budget

    def step(rows: int, chunk: int, chunks: int) -> float:
        return 1e-3 + 1e-5 * (rows + chunk)

    one = Load(mode="batch", requests=1)
    kw: dict[str, Any] = {"slots": 4, "step_s": step, "prompt_len": 100, "output_len": 3}
    whole = simulate_budget(one, budget=None, **kw)
    chunked = simulate_budget(one, budget=32, **kw)
    assert whole.ttft_p50_s == pytest.approx(1e-3 + 100e-5)
    assert chunked.ttft_p50_s == pytest.approx(4e-3 + 100e-5)
    assert whole.tpot_p50_s == pytest.approx(chunked.tpot_p50_s) == pytest.approx(1e-3 + 1e-5)
    # four closed-loop users: decode rows take their budget first, so prompts fill slower
    users = Load(mode="online", requests=8, concurrency=4)
    assert (
        simulate_budget(users, budget=8, **kw).ttft_p50_s
        > simulate_budget(users, budget=None, **kw).ttft_p50_s
    )
