"""One flag vocabulary across run, sweep and roofline: vLLM-bench aliases, dtype spellings,
help for every flag, "did you mean" for typos and help for a bare command group."""

from __future__ import annotations

import argparse

import pytest

from perfscope.cli import build_parser, main


def test_vllm_bench_names_are_aliases_of_the_run_flags() -> None:
    args = build_parser().parse_args(
        [
            "run",
            "--num-prompts",
            "5",
            "--request-rate",
            "2.5",
            "--max-concurrency",
            "3",
            "--random-input-len",
            "16",
            "--random-output-len",
            "8",
        ]
    )
    assert (args.requests, args.rate, args.concurrency) == (5, 2.5, 3)
    assert (args.prompt_len, args.output_len) == ("16", "8")


def test_shape_and_dtype_names_are_the_same_in_run_and_roofline() -> None:
    parser = build_parser()
    for dtype, torch_name in (("bf16", "bfloat16"), ("float16", "float16"), ("fp32", "float32")):
        run = parser.parse_args(
            ["run", "--hidden-size", "64", "--vocab-size", "99", "--dtype", dtype]
        )
        assert (run.shape_hidden_size, run.shape_vocab_size, run.dtype) == (64, 99, torch_name)
    old = parser.parse_args(["run", "--hidden", "32", "--vocab", "50", "--mlp", "128"])
    assert (old.shape_hidden_size, old.shape_vocab_size, old.shape_intermediate_size) == (
        32,
        50,
        128,
    )
    roof = parser.parse_args(["roofline", "--hidden", "64", "--vocab", "99", "--dtype", "float32"])
    assert (roof.hidden_size, roof.vocab_size, roof.dtype) == (64, 99, "float32")


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                out += _subparsers(sub)
    return out


def test_every_flag_of_run_sweep_and_roofline_has_help_and_no_help_shows_percent_signs() -> None:
    for parser in _subparsers(build_parser()):
        text = parser.format_help()
        assert "%%" not in text, parser.prog
        if parser.prog.split()[-1] not in ("run", "sweep", "roofline"):
            continue
        for action in parser._actions:
            if action.option_strings and action.help != argparse.SUPPRESS:
                assert action.help, (parser.prog, action.option_strings)


def test_a_mistyped_flag_or_command_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, hint, where in (
        (["run", "--reqests", "3"], "did you mean --requests?", "perfscope run --help"),
        (["rn"], "did you mean 'run'?", "perfscope --help"),
        (["hw", "lst"], "did you mean 'list'?", "perfscope hw --help"),
        (["run", "--mode", "bach"], "did you mean 'batch'?", "perfscope run --help"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and hint in err and where in err, err


def test_a_bare_command_group_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hw"]) == 0
    out = capsys.readouterr().out
    assert "usage: perfscope hw" in out and "calibrate" in out
