"""What the dashboard reads from JSON it did not make (a summary.json on disk, a browser's
callback arguments, a run index row) is narrowed value by value: a value of the wrong shape
is skipped or read as absent, never a crash."""

from __future__ import annotations

import json
from pathlib import Path

from perfscope.dashboard.app.data import RunRepository, _row_from_index
from perfscope.dashboard.app.pages._common import DashboardContext, SortKey, sort_keys
from perfscope.dashboard.app.pages.roofline import _measured_points, explorer_figure
from perfscope.dashboard.app.pages.run_detail import linked_range
from perfscope.dashboard.app.pages.runs import sort_records


def _run(root: Path, run_id: str, summary: object) -> str:
    path = root / run_id
    path.mkdir()
    (path / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return run_id


def test_measured_points_skip_roofline_sections_of_the_wrong_shape(tmp_path: Path) -> None:
    ids = [
        _run(tmp_path, "20260101-000000-list-0000", [1, 2]),
        _run(tmp_path, "20260101-000001-text-0000", {"roofline": "yes"}),
        _run(
            tmp_path,
            "20260101-000002-mixed-0000",
            {
                "roofline": {
                    "available": True,
                    "ceilings": ["not", "an", "object"],
                    "device": {"name": 3, "key": "epyc-9654"},
                    "phases": {
                        "prefill": "fast",
                        "decode": {"intensity": "high", "achieved_flops_s": 1e12},
                        "mixed": {"intensity": 10, "achieved_flops_s": 2e12, "mfu": "n/a"},
                    },
                }
            },
        ),
    ]
    ctx = DashboardContext(repo=RunRepository(tmp_path))
    (point,) = _measured_points(ctx, ids)
    assert (point.run, point.phase) == (ids[2], "mixed")
    assert (point.intensity, point.achieved_flops_s) == (10.0, 2e12)
    assert point.mfu is None and point.device is None and point.device_key == "epyc-9654"
    assert point.peak_flops is None  # no ceilings: the point is drawn without a roof
    fig = explorer_figure([], [point]).to_dict()
    kinds = [(t.get("meta") or {}).get("kind") for t in fig["data"]]
    assert kinds == ["measured"]


def test_sort_keys_skip_entries_that_name_no_column() -> None:
    sent = [
        {"column_id": "a", "direction": "desc"},
        "a",
        {"column_id": ["b"]},
        {"direction": "asc"},
        {"column_id": "c"},
    ]
    assert sort_keys(sent) == [SortKey("a", descending=True), SortKey("c")]
    assert sort_keys("ttft") == [] and sort_keys(None) == []
    rows = [{"a": 1.0}, {"a": None}, {"a": 3.0}]
    assert sort_records(rows, [{"column_id": "a", "direction": "desc"}, 7]) == [
        {"a": 3.0},
        {"a": 1.0},
        {"a": None},
    ]
    assert sort_records(rows, {"column_id": "a"}) == rows


def test_linked_range_reads_numbers_and_refuses_anything_else() -> None:
    assert linked_range({"xaxis.range": [2, "1.5"]}) == (1.5, 2.0)
    assert linked_range({"xaxis2.range[0]": 0.5, "xaxis2.range[1]": 1}) == (0.5, 1.0)
    assert linked_range({"xaxis.range": ["a", 1]}) is None
    assert linked_range({"xaxis.range": [True, 2]}) is None
    assert linked_range({"xaxis.range": [{"x": 1}, [2]]}) is None
    assert linked_range({"xaxis.range": [1, 2, 3], "xaxis.autorange": True}) == "auto"


def _index_row(**changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "run_id": "20260101-000000-a-0000",
        "state": "complete",
        "problem": None,
        "status": "complete",
        "has_summary": True,
        "last_error": None,
        "name": "a",
        "engine_uri": "http://localhost:8000",
        "engine_kind": "openai",
        "model": "llama",
        "analysed_model": None,
        "model_preset": None,
        "hardware": "epyc-9654",
        "hardware_name": "AMD EPYC 9654",
        "started_at_text": "2026-01-01T00:00:00",
        "requests": 12,
        "ttft_p50_s": 0.25,
        "ttft_p99_s": 0.5,
        "tpot_p50_s": 0.01,
        "output_tok_s": 900.0,
        "goodput_req_s": 2.0,
        "attainment": 0.9,
        "prefill_mfu": 0.4,
        "decode_mbu": 0.6,
        "j_per_output_token": 0.2,
        "energy_available": True,
        "sweep_id": None,
        "roofline_available": True,
        "contended": False,
        "others_cpu_share": 0.01,
        "steal_cpu_share": 0.0,
        "slo_count": 2,
        "model_layers": 32,
    }
    row.update(changes)
    return row


def test_an_index_value_of_the_wrong_type_reads_as_absent() -> None:
    good = _row_from_index(_index_row())
    assert (good.state, good.requests, good.ttft_p50_s, good.slo_count) == ("ok", 12, 0.25, 2)
    odd = _row_from_index(
        _index_row(ttft_p50_s="fast", requests=12.5, name=7, slo_count=True, model_preset=3)
    )
    assert odd.ttft_p50_s is None and odd.requests is None and odd.slo_count is None
    assert odd.name is None and odd.model == "llama"
    assert odd.ttft_p99_s == 0.5  # the other values are read as before


def test_a_hardware_cell_that_is_not_an_object_picks_no_device(tmp_path: Path) -> None:
    from perfscope.dashboard.app import create_app
    from tests.test_dashboard_app import dash_call

    client = create_app(tmp_path).server.test_client()
    for cell in (["h100-sxm5-80gb"], "h100-sxm5-80gb", 3):
        out = dash_call(client, ["hw-detail.children"], {"hw-table.active_cell": cell})
        assert out is not None
        assert "Click a device" in json.dumps(out["hw-detail"]["children"])


def test_the_compare_dropdowns_keep_only_run_ids(tmp_path: Path) -> None:
    from perfscope.dashboard.app import create_app
    from perfscope.dashboard.app.pages.compare import picked_runs
    from tests.test_dashboard_app import dash_call

    assert picked_runs(["a", ["b"], {"c": 1}, 7, "d"]) == ["a", "d"]
    assert picked_runs("not-a-list") == [] and picked_runs(None) == []
    client = create_app(tmp_path).server.test_client()
    out = dash_call(
        client,
        ["compare-baseline.options", "compare-baseline.value"],
        {"compare-runs.value": [["x"], "a", "b"]},
        {"compare-baseline.value": {"not": "an id"}},
    )
    assert out is not None
    assert out["compare-baseline"]["options"] == [
        {"label": "a", "value": "a"},
        {"label": "b", "value": "b"},
    ]
    assert out["compare-baseline"]["value"] == "a"
