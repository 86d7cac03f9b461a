"""Torch engines pick intra-op threads from the CPUs they may really use, never spinning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfscope.profiler.engines.threads import (
    cgroup_cpu_limit,
    choose_threads,
    prefer_passive_wait,
    usable_cpus,
)


def test_a_cgroup_v2_quota_caps_the_usable_cpus(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == pytest.approx(1.5)
    assert usable_cpus(tmp_path) == 1  # 1.5 CPUs of quota: one whole CPU, never two


def test_no_cgroup_quota_leaves_the_affinity_mask(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    assert usable_cpus(tmp_path) == len(os.sched_getaffinity(0))


def test_a_cgroup_v1_quota_is_read_too(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path) == pytest.approx(2.0)


def test_busy_cpus_take_threads_away_but_never_the_last_one() -> None:
    usable = usable_cpus()
    assert choose_threads(None, busy_cpus=0).threads == usable
    assert choose_threads(None, busy_cpus=usable + 5).threads == 1
    choice = choose_threads(None, busy_cpus=usable + 5)
    assert choice.source == "auto" and "usable CPU" in choice.rule


def test_an_explicit_thread_count_wins_over_the_rule() -> None:
    choice = choose_threads(3, busy_cpus=100)
    assert choice.threads == 3 and choice.rule == "--threads 3"


def test_the_command_line_makes_openmp_wait_passively(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = (
        "import os, sys; from perfscope.cli import main; "
        f"main(['ls', '--runs-dir', {str(tmp_path)!r}]); "
        "print(os.environ['OMP_WAIT_POLICY'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[-1] == "PASSIVE"


def test_a_users_wait_policy_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    prefer_passive_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_reference_engine_records_the_chosen_threads_in_its_config() -> None:
    import torch

    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.engines.reference import ReferenceEngine

    before = torch.get_num_threads()
    eng = ReferenceEngine("reference", EngineOptions(model_preset="tiny", device="cpu"))
    try:
        cfg = eng.info().config
        assert 1 <= cfg["torch_threads"] <= usable_cpus()
        assert str(cfg["threads_rule"]).startswith("auto:")
    finally:
        eng.close()
    assert torch.get_num_threads() == before
    eng = ReferenceEngine(
        "reference", EngineOptions(model_preset="tiny", device="cpu", extra={"threads": "1"})
    )
    try:
        assert eng.info().config["threads_rule"] == "--threads 1"
    finally:
        eng.close()


def test_threads_flag_reaches_the_engine_options() -> None:
    from perfscope.cli import build_parser

    args = build_parser().parse_args(["run", "--threads", "2", "--engine-opt", "attention=sdpa"])
    assert ("threads", "2") in args.engine_opt and ("attention", "sdpa") in args.engine_opt


@pytest.mark.parametrize(
    ("policy", "others_share", "warned"),
    [(None, 0.6, True), ("PASSIVE", 0.6, False), (None, 0.02, False)],
)
def test_a_contended_run_whose_torch_threads_spun_says_so(
    monkeypatch: pytest.MonkeyPatch, policy: str | None, others_share: float, warned: bool
) -> None:
    from perfscope.analysis.summary import run_warnings
    from perfscope.profiler.engines.base import EngineOptions
    from perfscope.profiler.engines.reference import ReferenceEngine

    # As under the Python API when torch was imported first: the policy stays unset.
    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    eng = ReferenceEngine(
        "reference", EngineOptions(model_preset="tiny", device="cpu", extra={"threads": "2"})
    )
    try:
        config = dict(eng.info().config)
    finally:
        eng.close()
    contention = {"others_share": others_share, "others_cpu_s": 6.0, "window_s": 5.0}
    out = run_warnings({"engine": {"config": config}, "host": {"contention": contention}})
    spun = [w for w in out if "spun while waiting" in w]
    assert bool(spun) == warned, out
    if warned:
        assert "2 OpenMP threads" in spun[0] and "OMP_WAIT_POLICY=PASSIVE" in spun[0]
    # A single thread has no partner to spin for.
    config["torch_threads"] = 1
    out = run_warnings({"engine": {"config": config}, "host": {"contention": contention}})
    assert not [w for w in out if "spun while waiting" in w]
