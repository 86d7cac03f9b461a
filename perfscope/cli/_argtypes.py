"""argparse ``type=`` converters shared by the command modules.

Each raises ``argparse.ArgumentTypeError`` with a message that names what was expected, so
argparse reports a one-line usage error (exit code 2).
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

__all__ = [
    "MAX_REQUESTS",
    "TORCH_DTYPES",
    "add_runs_dir",
    "device",
    "key_value",
    "nonneg_int",
    "number",
    "positive_int",
    "positive_number",
    "request_count",
    "runs_dir",
    "torch_dtype",
]

#: Most requests one run may plan: each costs a few hundred bytes of workload and records
#: before anything is sent, so a mistyped count must not try to allocate gigabytes.
MAX_REQUESTS = 10_000_000


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def nonneg_int(text: str) -> int:
    """A whole number of at least 0."""
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def number(text: str) -> float:
    """Any float (range checks belong to the option's own validation)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive_number(text: str) -> float:
    """A finite number above 0 (seconds, a gamma shape)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return v


def key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` → ``(KEY, VALUE)``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def request_count(text: str) -> int:
    """A request count between 1 and :data:`MAX_REQUESTS`."""
    v = positive_int(text)
    if v > MAX_REQUESTS:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_REQUESTS:,} requests per run, got {v:,}: "
            "split the load into several runs or bound it with --duration"
        )
    return v


_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|mps(:\d+)?)$")


def device(text: str) -> str:
    """A torch device an engine can run on: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``."""
    v = text.strip().lower()
    if not _DEVICE.match(v):
        raise argparse.ArgumentTypeError(
            f"unknown device {text!r}: use cpu, cuda, cuda:N or mps "
            "(remote servers pick their own device)"
        )
    return v


def runs_dir(text: str) -> Path:
    """A runs root folder: not empty, and not an existing file."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "must name a folder, got an empty string (omit it for $PERFSCOPE_RUNS_DIR or "
            "./perfscope-runs)"
        )
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    return p


#: Short dtype spellings (the vocabulary of every command) → the torch names engines take.
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def torch_dtype(text: str) -> str:
    """``fp32``/``bf16``/``fp16`` (or ``float32``/``bfloat16``/``float16``) → the torch name."""
    t = text.strip().lower().removeprefix("torch.")
    if t in TORCH_DTYPES:
        return TORCH_DTYPES[t]
    if t in TORCH_DTYPES.values():
        return t
    raise argparse.ArgumentTypeError(
        f"expected fp32, bf16 or fp16 (or float32, bfloat16, float16), got {text!r}"
    )


def add_runs_dir(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The ``--runs-dir`` flag every command that reads or writes runs takes."""
    p.add_argument(
        "--runs-dir",
        type=runs_dir,
        default=None,
        help="root folder of runs (default: $PERFSCOPE_RUNS_DIR or ./perfscope-runs)",
    )
