"""A summary.json written before the roofline became typed records loads and is written back
byte for byte (the stored format does not move when the records gain fields).

``tests/data/summaries`` holds summaries of ``tests/data/runs/v1`` written by perfscope at
commit a18d637 (before the typed roofline): against its own device (``v2-steps``), as a
what-if on an H100 (``v2-what-if``) and without its steps (``v2-timeline``, the estimate
from the request timeline). They are never modified.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from perfscope.analysis import analyze
from perfscope.analysis.summary import (
    Contention,
    OperatorClassRoofline,
    Record,
    RooflineWhatIf,
    Summary,
)
from perfscope.profiler.store import read_run, write_json_atomic
from tests.conftest import DATA

STORED = sorted((DATA / "summaries").glob("v2-*.json"))


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_a_stored_summary_is_written_back_byte_for_byte(path: Path, tmp_path: Path) -> None:
    summary = Summary.from_dict(json.loads(path.read_text()))
    out = tmp_path / "summary.json"
    write_json_atomic(out, summary.to_dict())
    assert out.read_bytes() == path.read_bytes()


def test_the_stored_roofline_reads_into_records_not_extra_keys() -> None:
    steps = Summary.from_dict(json.loads((DATA / "summaries" / "v2-steps.json").read_text()))
    decode = steps.roofline.decode
    assert not decode.extra and not decode.ceilings.extra and not steps.roofline.extra
    assert decode.classes is not None
    assert isinstance(decode.classes["weight_gemms"], OperatorClassRoofline)
    assert decode.gap_s is not None and decode.what_if is None
    what_if = Summary.from_dict(json.loads((DATA / "summaries" / "v2-what-if.json").read_text()))
    assert what_if.roofline.what_if == RooflineWhatIf(measured_on="l4", target="h100-sxm5-80gb")
    assert what_if.roofline.decode.what_if is True and what_if.roofline.decode.mfu is None
    # Keys perfscope writes itself are fields, not ``extra``.
    assert what_if.hardware.measured_on == "l4" and not what_if.hardware.extra
    assert steps.contention is not None and steps.contention.loadavg_1m is not None
    assert not steps.contention.extra


def test_a_field_added_later_is_written_back_only_where_the_file_had_it() -> None:
    """``helper_pids``, ``helper_cpu_s`` and ``excluded_s`` came after ``loadavg_1m``: a
    summary stored between them keeps its bytes, a record built now writes all four."""
    stored = {"window_s": 1.0, "cpu_count": 2, "contended": False, "loadavg_1m": 0.5}
    read = Contention.from_dict(stored)
    assert read.loadavg_1m == 0.5 and not read.extra
    written = read.to_dict()
    assert "loadavg_1m" in written
    assert not {"helper_pids", "helper_cpu_s", "excluded_s"} & set(written)
    assert Contention(window_s=1.0).to_dict()["helper_cpu_s"] is None


def _extras(node: Any, path: str = "summary") -> list[str]:
    """Where in a record tree keys were kept in ``extra`` (path and keys)."""
    if isinstance(node, Record):
        out = [f"{path}: {sorted(node.extra)}"] if node.extra else []
        for name in node.field_names():
            out += _extras(getattr(node, name), f"{path}.{name}")
        return out
    if isinstance(node, Mapping):
        return [e for k, v in node.items() for e in _extras(v, f"{path}[{k}]")]
    if isinstance(node, tuple | list):
        return [e for i, v in enumerate(node) for e in _extras(v, f"{path}[{i}]")]
    return []


@dataclass
class _Records:
    """A stored run's records with another manifest (the RunRecords protocol)."""

    manifest: dict[str, Any]
    requests: pd.DataFrame
    chunks: pd.DataFrame
    steps: pd.DataFrame
    telemetry: pd.DataFrame


@pytest.mark.parametrize("device", [None, "h100-sxm5-80gb"])
def test_every_key_perfscope_writes_is_a_field_not_extra(device: str | None) -> None:
    """``extra`` only round-trips keys this perfscope does not know: a run analysed now (on
    its own device and as a what-if, as one block of ``run --repeat --vs`` with a cluster's
    contention record) and the stored summaries keep nothing there."""
    run = read_run(DATA / "runs" / "v1")
    fresh = analyze(run, device=device)
    assert _extras(fresh) == []
    manifest = dict(run.manifest)
    manifest["run_set"] = {
        "experiment": "20260101-000000-abcd",
        "seed": 7,
        "repeat": 4,
        "interleaved": True,
        "arms": ["a", "b"],
        "id": "20260101-000000-abcd-A",
        "label": "a",
        "index": 1,
        "block": 1,
        "position": 0,
        "order": "AB",
    }
    host = dict(manifest["host"])
    host["contention"] = {
        **host["contention"],
        "helper_pids": [12, 13],
        "helper_cpu_s": 0.4,
        "excluded_s": 1.5,
    }
    manifest["host"] = host
    block = analyze(_Records(manifest, run.requests, run.chunks, run.steps, run.telemetry))
    assert _extras(block) == []
    assert block.run_set is not None and block.run_set.position == 0
    # Written as before the fields existed: the old fields, then these in the manifest's order.
    written = block.to_dict()["run_set"]
    assert written == manifest["run_set"]
    assert list(written) == [
        *("id", "label", "index", "repeat", "interleaved"),
        *("experiment", "seed", "arms", "block", "position", "order"),
    ]
    for path in STORED:
        assert _extras(Summary.from_dict(json.loads(path.read_text()))) == [], path.name
