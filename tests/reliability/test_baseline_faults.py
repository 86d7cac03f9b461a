"""A damaged pytest baseline (valid JSON, wrong-typed fields) is a usage error, never a
traceback or a pytest ``INTERNALERROR``."""

from __future__ import annotations

import json

import pytest

# The outer session imports what pytester's in-process runs need (tests/test_pytest_plugin.py).
from tests.test_pytest_plugin import FAKE_ENGINE, TWO_TESTS

pytest_plugins = ["pytester"]


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makepyfile(fake_engine=FAKE_ENGINE)
    pytester.syspathinsert()
    monkeypatch.setenv("FAKE_DELAY_MS", "4")
    return pytester


@pytest.mark.fault(
    fault="a pytest baseline of valid JSON with wrong-typed fields",
    before="traceback and pytest INTERNALERROR (issue 26)",
    after="usage error naming the field (`.value should be a number`)",
    kept="nothing captured yet: refused before any test runs",
)
def test_a_baseline_with_wrong_typed_fields_is_a_usage_error_not_an_internal_error(
    suite: pytest.Pytester,
) -> None:
    from perfscope.pytest_plugin._baseline import BASELINE_SCHEMA

    storage = suite.path / ".perfscope" / "baselines"
    storage.mkdir(parents=True)
    bad = {"schema": BASELINE_SCHEMA, "tests": {"t": {"metrics": {"tpot.p50": {"value": "x"}}}}}
    (storage / "base.json").write_text(json.dumps(bad))
    suite.makepyfile(test_one=TWO_TESTS.format(a="a", b="b"))
    result = suite.runpytest("--perfscope-compare", "base")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*baseline*is damaged*.value should be a number*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
