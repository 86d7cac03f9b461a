"""The manifest as the stages after capture read it: one typed, frozen view of manifest.json
(``analysis/manifest.py``); the public ``Run.manifest`` stays the dict it always was."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import perfscope
from perfscope.analysis import analyze
from perfscope.analysis.manifest import RunManifest, manifest_view
from perfscope.dashboard.compare import config_diff
from perfscope.profiler.store import read_run
from tests.data.runs.builders import synthetic_run


def test_a_stored_runs_manifest_reads_typed_and_the_public_run_keeps_the_dict(
    tmp_path: Path,
) -> None:
    path = synthetic_run(tmp_path, 50, telemetry=False)
    stored = read_run(path)
    m = RunManifest.from_dict(stored.manifest)
    assert m.run_id == path.name and m.status == "complete"
    assert m.engine.kind == "openai" and m.engine.model is not None
    assert m.device_key == "h100-sxm5-80gb"
    assert (m.host.python, m.host.platform) == ("3.11", "synthetic")
    assert m.slos == stored.manifest["slos"]
    assert m.source is stored.manifest  # the object as read, for path walks
    assert manifest_view(m) is m
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.status = "failed"  # type: ignore[misc]
    assert isinstance(perfscope.load_run(path).manifest, dict)
    # the analysis reads the view: its summary carries the manifest's identity
    summary = analyze(stored)
    assert (summary.run_id, summary.engine.uri) == (m.run_id, m.engine.uri)


def test_a_manifest_value_of_the_wrong_json_type_reads_as_absent() -> None:
    m = RunManifest.from_dict(
        {
            "engine": {"uri": "openai:x", "config": {"client": "http", "batch_size": 8}},
            "warnings": ["slow start", 3],
            "telemetry": "off",
            "host": {"contention": {"others_share": 0.5}, "hostname": "h"},
            "distributed": {"actors": [{"lost": "node died"}, {"send_lag_p99_s": 0.01}]},
            "sweep": {"id": "s1"},
        }
    )
    assert m.engine.config.client is None and m.engine.config.batch_size == 8
    assert m.warnings == ("slow start",)
    assert m.telemetry is None
    assert m.host.contention == {"others_share": 0.5} and m.host.hostname == "h"
    assert m.distributed is not None
    assert [a.lost for a in m.distributed.actors] == ["node died", None]
    assert m.sweep_id == "s1"


def test_the_config_diff_of_typed_manifests_says_absent_for_a_field_one_run_lacks() -> None:
    a = {"engine": {"uri": "ref", "config": {"batch_size": 4}}}
    b = {"engine": {"uri": "ref", "config": {}}}
    typed = config_diff([RunManifest.from_dict(a), RunManifest.from_dict(b)])
    assert typed == config_diff([a, b])
    assert [(d.field, d.values) for d in typed] == [("engine.config.batch_size", ("4", "absent"))]
    assert json.dumps(RunManifest.from_dict(a).source) == json.dumps(a)
