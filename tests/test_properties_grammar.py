"""Property tests of what users type (hypothesis): the assertion grammar (through the public
``perfscope.check`` / ``perfscope.expect``), durations and SLOs, length distributions and the
CLI's argument converters. Valid input means what it says; any other input is refused with
the module's own error, never a stray exception.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import operator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import perfscope
from perfscope.analysis.slo import format_duration, parse_duration, parse_slos
from perfscope.cli import _argtypes
from perfscope.errors import PerfscopeError, SLOError, WorkloadError
from perfscope.profiler.workload import MAX_LENGTH, parse_length

SETTINGS = settings(max_examples=60, deadline=None)
OPS = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
NEGATION = {"<": ">=", ">=": "<", ">": "<=", "<=": ">", "==": "!=", "!=": "=="}
UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def _summary(ttft_p99: float, attainment: float = 0.9) -> dict[str, Any]:
    return {
        "latency": {"ttft": {"count": 10, "p50": ttft_p99 / 2, "p99": ttft_p99}},
        "goodput": {"attainment": attainment},
        "throughput": {"output_tok_s": 1000.0},
    }


def _passes(summary: dict[str, Any], text: str) -> bool:
    try:
        perfscope.check(summary, text)
    except AssertionError:
        return False
    return True


positive = st.floats(1e-6, 1e4, allow_nan=False, allow_infinity=False)


@given(positive, positive, st.sampled_from(sorted(OPS)), st.sampled_from(sorted(UNITS)))
@SETTINGS
def test_check_compares_the_number_it_was_given(
    value_s: float, limit: float, op: str, unit: str
) -> None:
    want = OPS[op](value_s, float(repr(limit)) * UNITS[unit])
    assert _passes(_summary(value_s), f"ttft.p99 {op} {limit!r}{unit}") is want


@given(positive, positive, st.sampled_from(sorted(OPS)))
@SETTINGS
def test_an_assertion_and_its_negation_never_both_pass(
    value_s: float, limit: float, op: str
) -> None:
    s = _summary(value_s)
    a = _passes(s, f"ttft.p99 {op} {limit!r}ms")
    b = _passes(s, f"ttft.p99 {NEGATION[op]} {limit!r}ms")
    assert a != b


@given(positive, positive, st.sampled_from(["<", "<=", ">", ">="]))
@SETTINGS
def test_expect_agrees_with_check(value_s: float, limit: float, op: str) -> None:
    s = _summary(value_s)
    ref = perfscope.expect(s).ttft.p99
    try:
        OPS[op](ref, f"{limit!r}ms")
        got = True
    except AssertionError:
        got = False
    assert got is _passes(s, f"ttft.p99 {op} {limit!r}ms")


@given(st.floats(0, 1), st.floats(0, 100))
@SETTINGS
def test_percent_limits_are_fractions(attainment: float, pct: float) -> None:
    want = attainment >= float(repr(pct)) / 100.0
    assert _passes(_summary(0.1, attainment), f"goodput.attainment >= {pct!r}%") is want


metric_like = st.from_regex(r"[A-Za-z_.][A-Za-z0-9_.]{0,20}", fullmatch=True)
value_like = st.from_regex(r"[-+0-9.eE%a-zµ/ ]{0,12}", fullmatch=True)
assertion_like = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda m, o, v: f"{m} {o} {v}",
        metric_like,
        st.sampled_from([*OPS, "=", "=>", "<<", ""]),
        value_like,
    ),
)


@given(assertion_like)
@SETTINGS
def test_any_assertion_text_passes_fails_or_is_refused_cleanly(text: str) -> None:
    with contextlib.suppress(PerfscopeError, AssertionError, LookupError):
        perfscope.check(_summary(0.1), text)


@pytest.mark.parametrize("limit", ["1e400ms", "1e400", "-1e400%"])
def test_a_limit_that_is_not_finite_is_refused(limit: str) -> None:
    # It would overflow to inf, and an assertion against inf can never fail.
    with pytest.raises(SLOError, match="too large"):
        perfscope.check(_summary(0.1), f"ttft.p99 < {limit}")


# ---------------------------------------------------------------------- durations and SLOs


@given(st.floats(1e-9, 1e9), st.sampled_from(sorted(UNITS)), st.sampled_from(["", " ", "  "]))
@SETTINGS
def test_durations_parse_to_seconds(number: float, unit: str, gap: str) -> None:
    text = f" {number!r}{gap}{unit} "
    assert parse_duration(text) == float(repr(number)) * UNITS[unit]


@given(st.floats(1e-9, 1e7))
@SETTINGS
def test_formatted_durations_read_back(seconds: float) -> None:
    # Shown with 4 significant digits (whole seconds from 1000 s).
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=5e-4)


@given(st.text(max_size=30))
@SETTINGS
def test_any_duration_text_is_read_or_refused_with_slo_error(text: str) -> None:
    try:
        v = parse_duration(text)
    except SLOError:
        return
    assert math.isfinite(v) and v >= 0


@given(st.lists(st.text(max_size=20), max_size=4))
@SETTINGS
def test_any_slo_list_is_read_or_refused_with_slo_error(items: list[str]) -> None:
    try:
        slos = parse_slos(items)
    except SLOError:
        return
    assert all(math.isfinite(v) and v > 0 for v in slos.values())


@pytest.mark.parametrize("text", ["1e400s", "9" * 400 + "ms"])
def test_a_duration_that_overflows_is_refused(text: str) -> None:
    with pytest.raises(SLOError, match="too large"):
        parse_duration(text)
    with pytest.raises(SLOError):
        parse_slos([f"ttft={text}"])


# ---------------------------------------------------------------------- length distributions


@given(st.text(max_size=30))
@SETTINGS
def test_any_length_text_is_read_or_refused_with_workload_error(text: str) -> None:
    try:
        dist = parse_length(text)
    except WorkloadError:
        return
    sample = dist.sample(np.random.default_rng(0), 50)
    assert sample.min() >= 1 and sample.max() <= max(dist.max, 1)
    assert dist.max <= MAX_LENGTH


length_spec = st.one_of(
    st.integers(-5, 2 * MAX_LENGTH).map(str),
    st.builds(
        lambda k, a, b: f"{k}:{a}:{b}",
        st.sampled_from(["uniform", "normal", "UNIFORM", "gamma"]),
        st.one_of(st.integers(-5, 2 * MAX_LENGTH), st.sampled_from(["nan", "inf", "1e300"])),
        st.one_of(st.integers(-5, 2 * MAX_LENGTH), st.sampled_from(["nan", "inf", "-1"])),
    ),
)


@given(length_spec)
@SETTINGS
def test_length_distributions_sample_inside_their_declared_range(text: str) -> None:
    try:
        dist = parse_length(text)
    except WorkloadError:
        return
    sample = dist.sample(np.random.default_rng(1), 200)
    assert sample.dtype == np.int64
    assert sample.min() >= 1 and sample.max() <= dist.max <= MAX_LENGTH


# ---------------------------------------------------------------------- CLI converters

CONVERTERS = [
    _argtypes.positive_int,
    _argtypes.nonneg_int,
    _argtypes.number,
    _argtypes.key_value,
    _argtypes.request_count,
    _argtypes.device,
    _argtypes.runs_dir,
]


@given(st.sampled_from(CONVERTERS), st.text(max_size=25))
@SETTINGS
def test_cli_converters_accept_or_raise_argument_type_error(conv: Any, text: str) -> None:
    message = "accepted"
    try:
        conv(text)
    except argparse.ArgumentTypeError as exc:
        message = str(exc)  # argparse prints it as the one-line error
    assert message


@given(st.integers(-(10**12), 10**12))
@SETTINGS
def test_integer_converters_keep_their_bounds(n: int) -> None:
    for conv, lo, hi in (
        (_argtypes.positive_int, 1, None),
        (_argtypes.nonneg_int, 0, None),
        (_argtypes.request_count, 1, _argtypes.MAX_REQUESTS),
    ):
        ok = n >= lo and (hi is None or n <= hi)
        try:
            assert conv(str(n)) == n and ok
        except argparse.ArgumentTypeError:
            assert not ok


@given(st.text(min_size=1, max_size=10).filter(lambda k: "=" not in k and k.strip()), st.text())
@SETTINGS
def test_key_value_splits_at_the_first_equals_sign(key: str, value: str) -> None:
    assert _argtypes.key_value(f"{key}={value}") == (key.strip(), value.strip())
