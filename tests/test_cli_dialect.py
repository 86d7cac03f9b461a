"""vLLM-bench, guidellm and AIPerf flags: aliases where they mean the same, pointers where
not, and "did you mean" only for flags that are really close."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from perfscope.cli import build_parser, infinite_rate_as_mode, main
from perfscope.cli.dialect import ALIASES, POINTERS, RATE_TYPES, rewrite_aliases, suggest
from perfscope.cli.parser import Parser

DOC = Path(__file__).parents[1] / "docs" / "flags.md"


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("flag", "unwanted"),
    [
        ("--percentile-metrics", "--server-metrics"),
        ("--goodput", "--gpus"),
        ("--backend", "--trace"),
    ],
)
def test_foreign_flags_get_a_pointer_not_a_misleading_suggestion(
    flag: str, unwanted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _error(["run", flag, "x"], capsys)
    assert "not a perfscope flag" in err and "did you mean" not in err
    assert f"did you mean {unwanted}" not in err


def test_guidellm_rate_type_sweep_points_to_perfscope_sweep(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "perfscope sweep" in _error(["run", "--rate-type", "sweep"], capsys)
    assert "--mode batch" in _error(["run", "--rate-type=throughput"], capsys)


def test_a_typo_still_gets_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert "did you mean --warmup?" in _error(["run", "--warmpu", "2"], capsys)
    assert "did you mean --concurrency?" in _error(["run", "--concurency", "2"], capsys)


def test_suggestions_need_real_similarity() -> None:
    known = ["--server-metrics", "--gpus", "--trace", "--warmup", "--requests"]
    assert suggest("--percentile-metrics", known) is None
    assert suggest("--goodput", known) is None
    assert suggest("--backend", known) is None
    assert suggest("--reqests", known) == "--requests"


def test_same_meaning_flags_are_accepted_as_aliases() -> None:
    parser = build_parser()
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "run"
    ]
    argv = ["--max-requests", "7", "--max-seconds=30", "--random-seed", "3"]
    rewritten = ["run", *rewrite_aliases(argv, "run", set(run._option_string_actions))]
    args = parser.parse_args(rewritten)
    assert args.requests == 7 and args.duration == 30 and args.seed == 3


def test_aliases_leave_flags_the_command_already_has_alone() -> None:
    assert rewrite_aliases(["--requests", "3"], "run", {"--requests"}) == ["--requests", "3"]
    assert rewrite_aliases(["--max-requests", "3"], "show", set()) == ["--max-requests", "3"]


@pytest.mark.parametrize(
    ("concurrency", "mode", "note"),
    [(None, "batch", "--mode batch"), (4, "online", "--concurrency 4")],
)
def test_request_rate_inf_is_batch_mode_or_a_closed_loop(
    concurrency: int | None, mode: str, note: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Parser, "argv", ["run", "--request-rate", "inf"])
    args = argparse.Namespace(rate=float("inf"), concurrency=concurrency, mode="online")
    said = infinite_rate_as_mode(args)
    assert said is not None and note in said
    assert args.rate is None and args.mode == mode
    finite = argparse.Namespace(rate=8.0, concurrency=None, mode="online")
    assert infinite_rate_as_mode(finite) is None and finite.rate == 8.0
    monkeypatch.setattr(Parser, "argv", ["run", "--rate", "inf"])
    own = argparse.Namespace(rate=float("inf"), concurrency=None, mode="online")
    assert infinite_rate_as_mode(own) is None  # perfscope's --rate inf stays refused


def test_a_prefix_of_a_flag_is_not_taken_for_it(capsys: pytest.CaptureFixture[str]) -> None:
    # guidellm's --data must not become perfscope's --dataset by prefix matching.
    assert "guidellm's --data" in _error(["run", "--data", "prompt_tokens=8"], capsys)


def test_docs_flags_md_lists_every_alias_and_pointer() -> None:
    text = DOC.read_text()
    for a in ALIASES:
        assert f"| `{a.flag}` |" in text and f"`{a.ours}`" in text, a.flag
    for flag in POINTERS:
        assert f"| `{flag}` |" in text, flag
    for kind in RATE_TYPES:
        assert f"| `{kind}` |" in text, kind
