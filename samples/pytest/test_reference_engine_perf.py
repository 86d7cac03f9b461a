"""Performance tests for perfscope's built-in reference engine: a CI gate you can copy.

Run them like any test suite; perfscope's pytest plugin comes with the package::

    pytest samples/pytest                              # the SLOs below must hold
    pytest samples/pytest --perfscope-save main        # store a baseline (on main)
    pytest samples/pytest --perfscope-compare main \\
        --perfscope-fail tpot.p50:15% --perfscope-fail throughput.output_tok_s:15%

The limits are loose on purpose: they hold for the tiny model even on a busy 2-core CPU
runner shared with other jobs. On your engine, set them from its SLOs and let the
baseline comparison catch smaller regressions.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from perfscope.profiler.engines.reference import PRESETS, ReferenceModel
from perfscope.pytest_plugin import PerfscopeFixture

#: The reference model at its smallest, on the CPU, with two warm-up requests per run so
#: the first-call overheads of PyTorch stay out of the numbers.
TINY: dict[str, Any] = {
    "model_preset": "tiny",
    "device": "cpu",
    "prompt_len": 64,
    "output_len": 16,
    "warmup": 2,
}


def test_chat_latency_stays_interactive(perfscope: PerfscopeFixture) -> None:
    run = perfscope.run("reference", requests=8, batch_size=4, **TINY)

    assert perfscope.expect(run).ttft.p99 < "5s"
    assert perfscope.expect(run).tpot.p50 < "500ms"
    assert perfscope.expect(run).counts.failed == 0


def test_batch_serving_completes_every_request_at_speed(perfscope: PerfscopeFixture) -> None:
    run = perfscope.run("reference", requests=8, batch_size=8, **TINY)

    perfscope.check(
        run,
        "counts.completed == 8",
        "throughput.output_tok_s > 10 tok/s",
        "e2e.p99 < 10s",
    )


@pytest.mark.perfscope(slo={"ttft.p99": "5s", "goodput.attainment": "75%"})
def test_online_traffic_meets_its_slos(perfscope: PerfscopeFixture) -> None:
    # Poisson arrivals at 20 requests/s; a request is "good" when its TTFT and TPOT both
    # meet the per-request SLOs. The marker checks the run when the test body ends.
    perfscope.run("reference", requests=8, rate=20.0, slos={"ttft": "2s", "tpot": "500ms"}, **TINY)


@pytest.mark.perfscope(repeat=3, stat="bound")
def test_decode_speed_holds_with_95_percent_confidence(perfscope: PerfscopeFixture) -> None:
    # Three repeats; the assertion uses the one-sided upper 95% bound of the mean, so a
    # lucky run cannot make it pass.
    runs = perfscope.run("reference", requests=4, batch_size=4, **TINY)

    assert perfscope.expect(runs).tpot.p50 < "500ms"


def test_batching_is_not_slower_than_one_at_a_time(perfscope: PerfscopeFixture) -> None:
    # Four runs of each (the fewest from which the comparison can measure how noisy the
    # machine is): it fails only when batch 8 is slower than batch 1 by more than that noise.
    workload = {**TINY, "requests": 6, "output_len": 32}
    one = perfscope.run("reference", batch_size=1, repeat=4, name="batch-1", **workload)
    eight = perfscope.run("reference", batch_size=8, repeat=4, name="batch-8", **workload)

    perfscope.assert_no_regression(one, eight, "throughput.output_tok_s", "e2e.p50")


def test_hand_instrumented_decode_loop(perfscope: PerfscopeFixture) -> None:
    # Your own serving loop, instrumented with the manual API: every forward pass is a
    # step and every token is reported as it is produced.
    cfg = PRESETS["tiny"]
    model = ReferenceModel.build(cfg, seed=0)
    cache = model.new_cache(1, 128)
    gen = torch.Generator().manual_seed(0)
    with perfscope.profile("reference-by-hand") as p:
        for _ in range(4):
            prompt = torch.randint(0, cfg.vocab_size, (1, 32), generator=gen)
            with p.request(prompt_tokens=32, max_output_tokens=16) as r:
                with p.step("prefill", batch_size=1, new_tokens=32):
                    token = model.prefill(prompt, cache).argmax(-1)
                r.tokens(1)
                lengths = torch.tensor([32])
                for _ in range(15):
                    with p.step("decode", batch_size=1, new_tokens=1, context_tokens=32):
                        token = model.decode(token, cache, lengths).argmax(-1)
                    lengths += 1
                    r.tokens(1)

    perfscope.check(p.run, "steps.decode.count == 60", "tpot.p50 < 100ms", "ttft.p99 < 1s")


def test_decode_roofline(perfscope: PerfscopeFixture) -> None:
    run = perfscope.run("reference", requests=8, batch_size=8, **TINY)
    roofline = run.summary.roofline
    if not roofline.available:
        pytest.skip(f"no roofline for this run: {roofline.reason or 'not analysed'}")

    # A decode step reads every weight once: it moves bytes, so some bandwidth is used.
    perfscope.check(run, "decode.mbu > 0", "decode.mfu < 100%")
