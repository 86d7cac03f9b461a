"""``perfscope roofline``: predictions from the cost model and the hardware database."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from perfscope.cli import roofline as _cli_roofline
from perfscope.errors import UnknownDeviceError, UsageError

pytest.importorskip("perfscope.hwdb._resolve")

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def _run(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="perfscope")
    _cli_roofline.register(parser.add_subparsers())
    args = parser.parse_args(["roofline", *argv])
    buf = io.StringIO()
    rc = args.handler(args, Console(file=buf, width=160))
    return rc, buf.getvalue()


def test_llama2_7b_on_a100_prints_sensible_numbers() -> None:
    argv = "--model llama-2-7b --hw a100-sxm4-80gb --batch 1 --prompt-len 512 --output-len 128"
    rc, out = _run(argv.split())
    assert rc == 0
    assert "a100-sxm4-80gb" in out
    assert "datasheet" in out
    assert "21.7 ms" in out  # TTFT: 6.77 TFLOP at 312 TFLOP/s
    assert "6.63 ms" in out  # TPOT: 13.5 GB at 2039 GB/s
    assert "compute-bound" in out
    assert "memory-bound" in out
    assert "speed of light" in out


def test_json_for_several_devices(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _ = _run(
        ["--model", "llama-3-8b", "--hw", "a100-sxm4-80gb,h100-sxm5-80gb", "--batch", "8", "--json"]
    )
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["n_kv_heads"] == 8
    a100, h100 = data["predictions"]
    assert (a100["device"]["key"], h100["device"]["key"]) == ("a100-sxm4-80gb", "h100-sxm5-80gb")
    for p in (a100, h100):
        assert set(p) >= {"ttft_s", "tpot_s", "throughput_tok_s", "memory", "max_batch"}
        assert p["decode"]["bound"] == "memory-bound"
        assert p["speed_of_light"] is True
    assert h100["tpot_s"] < a100["tpot_s"]
    assert a100["memory"]["kv_cache_bytes"] == 8 * 640 * 131072


def test_config_file_with_quantised_weights_and_fp8_kv(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(CONFIGS / "mixtral-moe" / "config.json")
    _run(
        ["--model", cfg, "--hw", "h100-sxm5-80gb", "--dtype", "int4", "--kv-dtype", "fp8", "--json"]
    )
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["n_experts"] == 4
    assert data["model"]["weight_dtype"] == "int4"
    assert data["model"]["kv_bytes_per_element"] == 1.0
    assert data["predictions"][0]["dtypes"] == {
        "weights": "int4",
        "kv_cache": "fp8",
        "compute": "bf16",
    }


def test_efficiency_derates_and_explicit_shape_needs_no_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shape = "--layers 32 --hidden-size 4096 --heads 32 --intermediate-size 11008 --vocab-size 32000"
    base = [*shape.split(), "--hw", "a100-sxm4-80gb", "--json"]
    _run(base)
    sol = json.loads(capsys.readouterr().out)["predictions"][0]
    _run([*base, "--efficiency", "0.5"])
    half = json.loads(capsys.readouterr().out)["predictions"][0]
    assert half["tpot_s"] == pytest.approx(2 * sol["tpot_s"])
    assert half["speed_of_light"] is False
    # same shape as the Llama-2-7B preset
    _run(["--model", "llama-2-7b", "--hw", "a100-sxm4-80gb", "--json"])
    preset = json.loads(capsys.readouterr().out)["predictions"][0]
    assert sol["tpot_s"] == pytest.approx(preset["tpot_s"])


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--model", "llama-2-7b", "--hw", "a100-sxm4-80gb", "--batch", "0"], "--batch"),
        (
            ["--model", "llama-2-7b", "--hw", "a100-sxm4-80gb", "--efficiency", "1.5"],
            "--efficiency",
        ),
        (["--hw", "a100-sxm4-80gb"], "--model"),
        (["--model", "no-such-model", "--hw", "a100-sxm4-80gb"], "neither a preset"),
        (["--model", "llama-2-7b", "--hw", "a100-sxm4-80gb", "--dtype", "fp7"], "unknown dtype"),
    ],
)
def test_bad_input_is_a_usage_error(argv: list[str], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        _run(argv)


def test_unknown_device_is_a_usage_error() -> None:
    with pytest.raises(UnknownDeviceError):
        _run(["--model", "gpt2", "--hw", "no-such-gpu-9000"])


def test_through_main_when_registered(capsys: pytest.CaptureFixture[str]) -> None:
    from perfscope import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "roofline" not in sub.choices:
        pytest.skip("perfscope.cli does not register the roofline command yet")
    rc = cli.main(["roofline", "--model", "gpt2", "--hw", "a100-sxm4-80gb", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["model"]["name"] == "gpt2"
    assert cli.main(["roofline", "--model", "gpt2", "--hw", "a100-sxm4-80gb", "--batch", "0"]) == 2
