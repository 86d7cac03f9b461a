"""The experiment module: balanced order, paired robust intervals, multiplicity, power."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from perfscope.analysis.experiment import (
    BETTER,
    MIN_BLOCKS,
    NO_CHANGE,
    WORSE,
    benjamini_hochberg,
    block_order,
    blocks_needed,
    detectable_change,
    holm,
    judge_experiment,
    judge_metric,
    mann_whitney_interval,
    signed_rank_interval,
)


@given(st.integers(1, 6), st.integers(0, 30), st.integers(0, 2**32))
def test_every_block_runs_each_arm_once_and_the_seed_fixes_the_order(
    arms: int, blocks: int, seed: int
) -> None:
    order = block_order(arms, blocks, seed)
    assert len(order) == blocks
    assert all(sorted(b) == list(range(arms)) for b in order)
    assert order == block_order(arms, blocks, seed)


@given(st.integers(0, 40), st.integers(0, 2**32))
def test_two_arms_alternate_abba_so_each_goes_first_equally_often(blocks: int, seed: int) -> None:
    order = block_order(2, blocks, seed)
    firsts = sum(b[0] == 0 for b in order)
    assert abs(firsts - (blocks - firsts)) <= 1
    assert all(order[i] != order[i + 1] for i in range(blocks - 1))


@settings(max_examples=60)
@given(
    st.lists(st.floats(-1, 1, allow_nan=False), min_size=MIN_BLOCKS, max_size=25),
    st.floats(-2, 2, allow_nan=False),
)
def test_the_signed_rank_interval_holds_its_estimate_and_moves_with_a_shift(
    d: list[float], shift: float
) -> None:
    est, ci, _ = signed_rank_interval(d)
    assert ci is not None and ci[0] <= est <= ci[1]
    est2, ci2, _ = signed_rank_interval([x + shift for x in d])
    assert math.isclose(est2, est + shift, abs_tol=1e-9)
    assert ci2 is not None and math.isclose(ci2[0], ci[0] + shift, abs_tol=1e-9)


def test_fewer_than_six_blocks_give_no_interval_and_no_claim() -> None:
    _, ci, p = signed_rank_interval([0.3, 0.31, 0.29, 0.3, 0.32])
    assert ci is None and p > 0.05
    ch = judge_metric([1.0] * 5, [1.3, 1.31, 1.29, 1.3, 1.32], "lower", paired=True)
    assert ch.verdict == NO_CHANGE and ch.detectable is None
    assert "need 6+" in ch.detectable_text()


def test_a_wild_run_neither_flags_an_identical_pair_nor_blows_the_interval_up() -> None:
    rng = random.Random(7)
    a = [0.010 * rng.lognormvariate(0, 0.08) for _ in range(10)]
    b = [x * rng.lognormvariate(0, 0.05) for x in a]
    b[4] *= 50
    ch = judge_metric(a, b, "lower", paired=True, ids=[f"blk{i}" for i in range(10)])
    assert ch.verdict == NO_CHANGE
    assert ch.ci is not None and ch.ci[0] > 0.8 and ch.ci[1] < 1.5
    assert ch.outliers == ("blk4",)


def test_a_thirty_percent_slowdown_over_eight_blocks_is_worse_with_its_detectable_change() -> None:
    rng = random.Random(3)
    a = [0.010 * rng.lognormvariate(0, 0.15) for _ in range(8)]
    b = [x * 1.3 * rng.lognormvariate(0, 0.05) for x in a]
    ch = judge_metric(a, b, "lower", paired=True)
    assert ch.verdict == WORSE
    assert ch.ci is not None and ch.ci[0] > 1.0
    assert ch.detectable is not None and ch.detectable < 0.3
    assert judge_metric(b, a, "lower", paired=True).verdict == BETTER
    assert judge_metric(a, b, "higher", paired=True).verdict == BETTER


def test_unpaired_sets_of_three_never_claim_a_change() -> None:
    ch = judge_metric([0.015, 0.016, 0.014], [0.026, 0.027, 0.025], "lower")
    assert ch.verdict == NO_CHANGE and ch.ci is None
    _, ci, p = mann_whitney_interval([1.0, 2, 3, 4], [5.0, 6, 7, 8])
    assert ci is not None and p < 0.05


def test_holm_steps_down_until_the_first_failure() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    assert holm([0.001, 0.012, 0.02], 0.05) == [True, True, True]


def test_benjamini_hochberg_steps_up_to_the_largest_passing_rank() -> None:
    assert benjamini_hochberg([0.01, 0.04, 0.03, 0.005], 0.05) == [True, True, True, True]
    assert benjamini_hochberg([0.01, 0.2, 0.03, 0.04], 0.05) == [True, False, False, False]
    assert benjamini_hochberg([0.031] * 13, 0.05) == [True] * 13


def _aa_family(rng: random.Random, blocks: int, k: int) -> dict[str, tuple[list[float], ...]]:
    """``k`` metrics sharing each run's load (correlated), identical arms."""
    out: dict[str, tuple[list[float], ...]] = {}
    loads = [(rng.lognormvariate(0, 0.1), rng.lognormvariate(0, 0.1)) for _ in range(blocks)]
    for j in range(k):
        a = [la * rng.lognormvariate(0, 0.05) for la, _ in loads]
        b = [lb * rng.lognormvariate(0, 0.05) for _, lb in loads]
        out[f"m{j}"] = (a, b)
    return out


def test_the_family_wise_false_alarm_rate_of_identical_arms_stays_near_five_percent() -> None:
    rng = random.Random(11)
    trials, alarms = 300, 0
    for _ in range(trials):
        fam = _aa_family(rng, 8, 12)
        exp = judge_experiment({k: (a, b, "lower") for k, (a, b) in fam.items()}, "m0", paired=True)
        alarms += any(c.verdict != NO_CHANGE for c in exp.changes)
    # 5% nominal; binomial SD at 300 trials is 1.3 points.
    assert alarms / trials <= 0.08


def test_a_secondary_is_judged_after_correction_and_the_primary_leads() -> None:
    rng = random.Random(5)
    a = [rng.lognormvariate(0, 0.05) for _ in range(12)]
    fam = {
        "tpot": (a, [x * 1.5 for x in a], "lower"),
        "ttft": (a, [x * rng.lognormvariate(0, 0.05) for x in a], "lower"),
        "tput": (a, [x / 1.5 for x in a], "higher"),
    }
    exp = judge_experiment(fam, "tpot", paired=True)
    assert exp.primary == "tpot" and exp.lead.primary and exp.lead.verdict == WORSE
    verdicts = {c.metric: c.verdict for c in exp.changes}
    assert verdicts == {"tpot": WORSE, "ttft": NO_CHANGE, "tput": WORSE}
    assert "Benjamini–Hochberg" in exp.correction
    assert exp.headline().startswith("tpot: worse (1.500x [")


def test_balanced_order_cancels_a_position_effect_and_reports_it() -> None:
    rng = random.Random(2)
    order = block_order(2, 16, 4)
    a, b, second = [], [], []
    for blk in order:
        vals = {}
        for pos, arm in enumerate(blk):
            vals[arm] = 0.01 * rng.lognormvariate(0, 0.03) * (1.15 if pos == 1 else 1.0)
        a.append(vals[0])
        b.append(vals[1])
        second.append(blk[1] == 1)
    exp = judge_experiment({"tpot": (a, b, "lower")}, "tpot", paired=True, candidate_second=second)
    assert exp.lead.verdict == NO_CHANGE
    assert exp.lead.ratio is not None and abs(math.log(exp.lead.ratio)) < 0.05
    assert exp.position is not None and exp.position.present
    assert any("position effect" in n for n in exp.notes)


def test_blocks_needed_shrink_with_noise_and_match_the_detectable_change() -> None:
    assert blocks_needed(0.02, 0.05) == MIN_BLOCKS
    assert blocks_needed(0.2, 0.05) > blocks_needed(0.1, 0.05) > MIN_BLOCKS
    d6 = detectable_change(0.1, 6)
    d20 = detectable_change(0.1, 20)
    assert d6 is not None and d20 is not None and d20 < d6
    assert detectable_change(0.1, 5) is None


def test_metrics_that_can_be_zero_compare_as_relative_differences() -> None:
    ch = judge_metric([0.0] * 8, [0.0] * 8, "higher", paired=True)
    assert ch.verdict == NO_CHANGE and ch.ratio == 1.0
    ch = judge_metric([1.0, 0.0] * 4, [1.0, 0.0] * 4, "higher", paired=True)
    assert ch.verdict == NO_CHANGE
