"""perfscope.run() and perfscope.sweep(): the one library entry point for a run, and the
option assembly that the CLI, the sweep and the pytest fixture share."""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import perfscope
from perfscope.api.run import RunArgs, plan
from perfscope.cli import build_parser
from perfscope.cli.options import run_args
from perfscope.cli.sweep import register
from perfscope.errors import EngineError, UsageError
from perfscope.profiler.engines.base import EngineInfo, Inbox
from perfscope.profiler.recorder import Recorder
from tests.conftest import ROOT

TINY: dict[str, Any] = {"model_preset": "tiny", "device": "cpu", "telemetry": False}


def three_tokens(max_tokens: int) -> Iterator[int]:
    """A python: engine: one token per chunk, as many as asked."""
    yield from [1] * max_tokens


class _BrokenEngine:
    """An Engine whose serve() fails after the first request started."""

    def info(self) -> EngineInfo:
        return EngineInfo(uri="broken:", kind="broken")

    def serve(self, inbox: Inbox, recorder: Recorder) -> None:
        raise RuntimeError("the GPU fell off the bus")

    def close(self) -> None:
        pass


def test_run_returns_the_stored_analysed_run(runs_dir: Path) -> None:
    run = perfscope.run(
        "reference", requests=4, prompt_len=8, output_len=4, runs_dir=runs_dir, **TINY
    )
    assert isinstance(run, perfscope.Run)
    assert run.status == "complete"
    assert run.path.parent == runs_dir
    assert run.counts.completed == 4
    assert run.counts.output_tokens == 16
    assert run.manifest["load"]["mode"] == "batch"
    assert perfscope.load_run(run.path).summary == run.summary


def test_a_callable_engine_runs_online_and_records_its_slos(runs_dir: Path) -> None:
    run = perfscope.run(
        three_tokens,
        requests=5,
        output_len=3,
        concurrency=2,
        slos={"ttft": "2s", "tpot": 0.5},
        runs_dir=runs_dir,
        telemetry=False,
    )
    assert run.manifest["engine"]["uri"].endswith(":three_tokens")
    assert run.manifest["load"]["mode"] == "online"
    assert run.manifest["load"]["concurrency"] == 2
    assert run.manifest["slos"] == {"ttft": 2.0, "tpot": 0.5}
    assert run.counts.output_tokens == 15


def test_a_model_spec_gives_a_callable_engine_an_estimated_roofline(runs_dir: Path) -> None:
    run = perfscope.run(
        three_tokens,
        requests=4,
        output_len=3,
        model_spec="llama-3-8b",
        hw="h100-sxm5-80gb",
        runs_dir=runs_dir,
        telemetry=False,
    )
    assert run.summary["model_spec"]["source"] == "model_spec llama-3-8b"
    assert run.manifest["engine"]["model"]["name"] == run.summary["model_spec"]["name"]
    assert run.summary["roofline"]["available"] and run.summary["roofline"]["estimated"]
    with pytest.raises(UsageError, match="model_spec no-such-model"):
        perfscope.run(three_tokens, requests=2, model_spec="no-such-model", runs_dir=runs_dir)


def test_an_engine_failure_raises_and_keeps_the_captured_run(runs_dir: Path) -> None:
    with pytest.raises(EngineError, match="the GPU fell off the bus") as info:
        perfscope.run(_BrokenEngine(), requests=2, runs_dir=runs_dir, telemetry=False)
    (kept,) = list(runs_dir.iterdir())
    assert str(kept) in str(info.value)
    assert perfscope.load_run(kept).status == "failed"


def test_a_rate_or_a_concurrency_implies_online_arrivals() -> None:
    assert plan(RunArgs()).options.load.mode == "batch"
    assert plan(RunArgs(rate=4)).options.load.mode == "online"
    assert plan(RunArgs(concurrency=3)).options.load.mode == "online"
    # as `perfscope run --mode batch --rate 4` always has
    assert plan(RunArgs(mode="batch", rate=4)).options.load.mode == "online"
    with pytest.raises(UsageError, match="needs --rate R or --concurrency N"):
        plan(RunArgs(mode="online"))


def test_a_duration_sizes_the_request_pool_and_a_warmup_duration_the_warmup() -> None:
    o = plan(RunArgs(rate=2.0, duration="10s", warmup_duration=5)).options
    assert o.workload.requests == math.ceil(20 + 5 * math.sqrt(20) + 10)
    assert o.workload.warmup == math.ceil(10 + 5 * math.sqrt(10) + 10)
    assert o.load.duration_s == 10.0
    assert o.load.warmup_s == 5.0
    closed = plan(RunArgs(concurrency=3, duration=1.0)).options
    assert closed.workload.requests == 600
    assert plan(RunArgs(requests=7, rate=2.0, duration=10)).options.workload.requests == 7
    assert plan(RunArgs()).options.workload.requests == 48
    assert plan(RunArgs(prompts="p.jsonl")).options.workload.requests is None


def test_durations_take_seconds_or_units_and_slos_are_stored_in_seconds() -> None:
    o = plan(
        RunArgs(
            batch_timeout="50ms",
            telemetry_interval=0.1,
            slos={"TTFT": "200ms", "tpot": 0.05},
        )
    ).options
    assert o.engine_options.batch_timeout_s == pytest.approx(0.05)
    assert o.telemetry.interval_s == pytest.approx(0.1)
    assert o.slos == {"ttft": pytest.approx(0.2), "tpot": 0.05}


def test_engine_specific_options_become_text_and_engine_fields_stay_typed() -> None:
    o = plan(
        RunArgs(
            engine="openai:http://127.0.0.1:9/v1",
            engine_options={
                "model": "m",
                "ignore_eos": False,
                "extra_body": {"temperature": 0},
                "max_seq_len": 4096,
            },
            tokenizer="tok.json",
            output_len=32,
        )
    ).options
    assert o.engine_options.extra == {
        "model": "m",
        "ignore_eos": "false",
        "extra_body": '{"temperature": 0}',
        "tokenizer": "tok.json",
    }
    assert o.engine_options.max_seq_len == 4096
    # openai servers need text: synthetic prompts unless a prompts file or dataset is given
    assert o.workload.dataset == "synthetic"
    assert o.workload.output_len_given is True
    assert plan(RunArgs(engine="reference")).options.workload.dataset is None


def test_engine_options_that_name_an_engine_field_are_read_as_that_field_or_refused() -> None:
    """``--engine-opt`` values are text: a field's value is read as the field holds it (a
    whole number, seconds), a wrong one is refused in one line before anything runs, and a
    field the run's own arguments set is named by that argument."""
    o = plan(
        RunArgs(
            engine_options={
                "max_seq_len": "512",
                "request_timeout_s": "30s",
                "batch_timeout_s": 0.01,
            }
        )
    ).options.engine_options
    assert o.max_seq_len == 512
    assert o.request_timeout_s == pytest.approx(30.0)
    assert o.batch_timeout_s == pytest.approx(0.01)
    assert o.extra == {}
    with pytest.raises(UsageError, match="engine option max_seq_len must be a whole number"):
        plan(RunArgs(engine_options={"max_seq_len": "long"}))
    with pytest.raises(UsageError, match="engine option batch_size is an argument of the run"):
        plan(RunArgs(engine_options={"batch_size": "4"}))
    with pytest.raises(UsageError, match="engine option extra must be a mapping"):
        plan(RunArgs(engine_options={"extra": "x=1"}))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requests": 0}, "requests must be at least 1, got 0"),
        ({"requests": 2.5}, "requests must be a whole number"),
        ({"rate": -1}, "--rate must be a positive number"),
        ({"rate": "fast"}, "rate must be a number"),
        ({"concurrency": 1.5}, "concurrency must be a whole number"),
        ({"scheduler": "fifo"}, "scheduler must be one of continuous, static"),
        ({"dtype": "fp8"}, "dtype must be one of float32, bfloat16, float16"),
        ({"batch_timeout": "soon"}, "cannot read duration 'soon'"),
        ({"slos": {"latency": "1s"}}, "unknown SLO metric 'latency'"),
        ({"slos": {"ttft": -1}}, "SLO ttft must be a positive number"),
        ({"prompt_len": "uniform:9:2"}, "prompt_len 'uniform:9:2': uniform needs"),
        ({"gpus": "0,0"}, "a GPU is listed twice"),
    ],
)
def test_bad_arguments_raise_a_one_line_usage_error_before_anything_runs(
    runs_dir: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(UsageError, match=re.escape(message)) as info:
        perfscope.run("reference", runs_dir=runs_dir, **TINY, **kwargs)
    assert "\n" not in str(info.value)
    assert list(runs_dir.iterdir()) == []


def test_an_engine_that_is_no_engine_is_a_usage_error(runs_dir: Path) -> None:
    with pytest.raises(UsageError, match="engine must be a URI string, a callable"):
        perfscope.run(42, runs_dir=runs_dir)


def _cli_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_the_cli_and_the_library_assemble_the_same_run() -> None:
    argv = [
        "run",
        "python:mod:fn",
        "--requests",
        "9",
        "--prompt-len",
        "uniform:8:16",
        "--rate",
        "3",
        "--arrival",
        "gamma",
        "--burstiness",
        "0.5",
        "--batch-size",
        "4",
        "--batch-timeout",
        "20ms",
        "--layers",
        "2",
        "--slo",
        "ttft=200ms",
        "--engine-opt",
        "flavour=x",
        "--telemetry-interval",
        "100ms",
        "--no-telemetry",
        "--seed",
        "3",
    ]
    cli = plan(run_args(_cli_args(argv))).options
    lib = plan(
        RunArgs(
            engine="python:mod:fn",
            requests=9,
            prompt_len="uniform:8:16",
            rate=3,
            arrival="gamma",
            burstiness=0.5,
            batch_size=4,
            batch_timeout="20ms",
            model_overrides={"n_layers": 2},
            slos={"ttft": "200ms"},
            engine_options={"flavour": "x"},
            telemetry_interval="100ms",
            telemetry=False,
            seed=3,
        )
    ).options
    for part in ("engine", "workload", "load", "engine_options", "slos", "telemetry"):
        assert getattr(cli, part) == getattr(lib, part), part
    # only the CLI names its flags in messages
    with pytest.raises(UsageError, match="--prompt-len 'uniform:9:2'"):
        plan(run_args(_cli_args(["run", "--prompt-len", "uniform:9:2"])))


def test_the_sweep_command_builds_its_points_from_the_same_arguments() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["sweep", "python:mod:fn", "--requests", "5", "--output-len", "3"])
    base = run_args(args)
    assert (base.requests, base.output_len, base.name) == (5, "3", "sweep")
    assert plan(base).options.engine_options.batch_size == 8


def test_sweep_makes_one_run_per_rate_and_writes_the_curve(runs_dir: Path) -> None:
    lines: list[str] = []
    result = perfscope.sweep(
        three_tokens,
        rates=[50, 100],
        requests=4,
        prompt_len=4,
        output_len=3,
        slos={"ttft": "5s"},
        runs_dir=runs_dir,
        telemetry=False,
        log=lines.append,
    )
    assert isinstance(result, perfscope.Sweep)
    assert result.kind == "rate"
    assert result.failed == 0
    assert [p.offered for p in result.points] == [50, 100]
    assert result.max_goodput == 100
    assert json.loads(result.path.read_text())["points"] == [p.to_dict() for p in result.points]
    for rate, run_dir in zip((50, 100), result.runs, strict=True):
        manifest = perfscope.load_run(run_dir).manifest
        assert manifest["load"]["rate"] == rate
        assert manifest["name"] == f"sweep-r{rate}"
    assert lines == ["sweep: rate 50 ...", "sweep: rate 100 ..."]


def test_sweep_refuses_options_it_sets_per_point(runs_dir: Path) -> None:
    with pytest.raises(UsageError, match="sweep\\(\\) sets rate itself"):
        perfscope.sweep(three_tokens, rates=[1], rate=5, runs_dir=runs_dir)
    with pytest.raises(UsageError, match="either rates or concurrencies"):
        perfscope.sweep(three_tokens, rates=[1], concurrencies=[2], runs_dir=runs_dir)
    assert list(runs_dir.iterdir()) == []


def _readme_run_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Run from Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_readme_run_example_works(runs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFSCOPE_RUNS_DIR", str(runs_dir))
    namespace: dict[str, Any] = {}
    exec(compile(_readme_run_example(), "README.md", "exec"), namespace)
    run = namespace["run"]
    assert run.status == "complete"
    assert run.path.parent == runs_dir
