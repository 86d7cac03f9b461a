"""The reference model split across 2 gloo processes (tensor and pipeline parallel) gives
the single process's outputs, and its communication is timed per decode step."""

from __future__ import annotations

import pytest
import torch

from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.parallel import ParallelPlan, predict_parallel
from perfscope.hwdb import resolve_device
from perfscope.profiler.engines.reference.model import ReferenceConfig
from perfscope.profiler.engines.reference.parallel import (
    ParallelJob,
    _fit,
    run_parallel,
    run_parallel_many,
    run_single,
)

#: Small enough that the two processes' torch import is most of the test's time.
CFG = ReferenceConfig(
    n_layers=2, hidden_size=32, n_heads=4, n_kv_heads=2, intermediate_size=64, vocab_size=64
)


def test_tp_and_pp_over_two_gloo_processes_match_the_single_process() -> None:
    job = ParallelJob(CFG, batch=2, prompt_len=5, output_len=4, warmup=1)
    pp2 = ParallelJob(CFG, batch=2, prompt_len=5, output_len=4, warmup=1, microbatches=2)
    ref = run_single(job)
    # fork: the ranks start as copies of this process (no second torch import)
    group = run_parallel_many([("tp", job), ("pp", pp2)], link_reps=2, start_method="fork")
    tp, pp = group.runs
    for run in (tp, pp):
        assert run.tokens == ref.tokens  # greedy tokens identical
        assert len(run.logits) == job.output_len
        for a, b in zip(run.logits, ref.logits, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert len(run.step_s) == job.output_len - 1
        assert len(run.comm_s) == 2  # one list per rank
        assert all(len(c) == job.output_len - 1 for c in run.comm_s)
        assert all(c > 0 for c in run.comm_s[0])
    # TP: 2 all-reduces per block + the vocab-parallel embedding's, and the logits gather:
    # the collectives the cost model counts
    plan = predict_parallel(
        ModelSpec.from_dict(CFG.model_spec()),
        resolve_device("cpu-loopback-gloo"),
        ParallelPlan(tp=2),
        batch=2,
        prompt_len=5,
        output_len=4,
    )
    assert tp.collectives_per_step == plan.collectives_per_step + 1 == 2 * CFG.n_layers + 2
    assert tp.message_bytes == plan.allreduce_bytes_decode
    # the in-step communication splits into the link's part and the wait for the other rank
    link, wait = tp.tp_split_s()
    assert link > 0 and wait >= 0
    assert link + wait == pytest.approx(tp.comm_per_step_s(0), rel=0.5)
    hidden, token = pp.pp_hops_s()
    assert hidden > 0 and token > 0
    # PP with 2 micro-batches: stage 0 receives a token and sends a hidden state per one
    assert pp.collectives_per_step == 4 and pp.microbatches == 2
    assert group.link is not None
    assert group.link.allreduce.latency_s > 0 and group.link.send.bw_bytes_s > 0


def test_a_split_the_model_does_not_allow_is_refused_before_any_process_starts() -> None:
    odd = ReferenceConfig(
        n_layers=1, hidden_size=48, n_heads=3, n_kv_heads=3, intermediate_size=64, vocab_size=64
    )
    with pytest.raises(ValueError, match="n_kv_heads 3 does not divide"):
        run_parallel(ParallelJob(odd), "tp")
    with pytest.raises(ValueError, match="only 1 blocks"):
        run_parallel(ParallelJob(odd), "pp")
    with pytest.raises(ValueError, match="micro-batches"):
        run_parallel(ParallelJob(CFG, batch=3, microbatches=2), "pp")
    with pytest.raises(ValueError, match="use tp or pp"):
        run_parallel(ParallelJob(CFG), "dp")  # type: ignore[arg-type]


def test_link_fit_reads_latency_from_the_smallest_and_bandwidth_from_the_largest() -> None:
    sizes = [4, 1000, 1_000_000]
    # 10 us latency, 1 GB/s: 1 MB takes 1 ms more
    samples = [[10e-6] * 10, [11e-6] * 10, [10e-6 + 1e-3] * 10]
    fit = _fit(sizes, samples)
    assert fit.latency_s == pytest.approx(10e-6)
    assert fit.bw_bytes_s == pytest.approx(1e9)
    assert fit.p10_times_s == pytest.approx((10e-6, 11e-6, 1.01e-3))


def test_the_loopback_entry_gives_the_parallel_what_if_its_link() -> None:
    dev = resolve_device("cpu-loopback-gloo")
    assert dev.scale_up_link() == ("loopback", dev.interconnect_bytes_s["loopback"] / 2)
    r = predict_parallel(
        ModelSpec.from_dict(CFG.model_spec()),
        dev,
        ParallelPlan(tp=2),
        batch=2,
        prompt_len=5,
        output_len=4,
    )
    assert r.link is not None and r.link.name == "loopback"
    assert r.link.latency_s == dev.collective_latency_s["loopback"]
    assert "calibrated" in dev.name.lower()
