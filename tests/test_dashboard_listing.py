"""The dashboard's runs list from the run index, honest SLO cells, the configuration diff,
short labels and the roofline explorer's own-device roofs (real runs, real Dash app)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfscope.dashboard.app.data import RunRepository
from perfscope.dashboard.compare import config_diff, short_labels
from perfscope.profiler.run_index import INDEX_FILE
from perfscope.profiler.store import write_json_atomic
from tests.conftest import ROOT
from tests.data.runs.builders import complete_run, manual_run, run_without_slos

duckdb = pytest.importorskip("duckdb")


class Runs:
    def __init__(self, root: Path) -> None:
        self.root = root
        common = ("--hw", "epyc-9654", "--requests", "12")
        self.alpha = complete_run(root, *common, "--name", "alpha")
        self.beta = complete_run(root, *common, "--name", "beta", "--batch-size", "2")
        self.no_slo = run_without_slos(root, "--name", "noslo")
        self.gpu = run_without_slos(root, "--name", "ongpu", "--hw", "h100-sxm5-80gb")
        self.no_model = manual_run(root, name="nomodel", n_requests=3)
        self.broken = root / "20990101-000000-broken-0000"
        self.broken.mkdir()
        (self.broken / "manifest.json").write_text("{not json", encoding="utf-8")
        (root / "leftover-folder").mkdir()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        yield Runs(tmp_path_factory.mktemp("listing-runs"))


# ---------------------------------------------------------------------- the index


def test_the_runs_list_reads_the_index_and_matches_a_scan(runs: Runs) -> None:
    repo = RunRepository(runs.root)
    listed = repo.rows()
    assert repo.listing_source == "index" and repo.listing_note is None
    assert (runs.root / INDEX_FILE).is_file()
    # Directories the index does not hold (no manifest) are still listed, as broken.
    ids = [r.run_id for r in listed]
    assert "leftover-folder" in ids and ids == repo.run_ids()
    scanned = {i: repo.row(i) for i in ids}
    for row in listed:
        a, b = dataclasses.asdict(row), dataclasses.asdict(scanned[row.run_id])
        if row.state == "broken":
            assert b["state"] == "broken" and a["problem"]
            continue
        a["started_at"], b["started_at"] = a["started_at"][:19], b["started_at"][:19]
        assert a == b, row.run_id


def test_the_runs_list_follows_a_changed_summary(runs: Runs, tmp_path: Path) -> None:
    root = tmp_path / "r"
    run = manual_run(root, name="one", n_requests=3)
    repo = RunRepository(root)
    (first,) = repo.rows()
    summary = json.loads((run / "summary.json").read_text())
    summary["latency"]["ttft"]["p50"] = 12.5
    time.sleep(0.01)
    write_json_atomic(run / "summary.json", summary)
    (again,) = repo.rows()
    assert first.ttft_p50_s != 12.5 and again.ttft_p50_s == 12.5
    assert repo.listing_source == "index"


def test_without_duckdb_the_page_says_the_list_is_a_scan(runs: Runs) -> None:
    code = (
        "import sys, json; sys.modules['duckdb'] = None\n"
        "from pathlib import Path\n"
        "from perfscope.dashboard.app import create_app\n"
        "from tests.test_dashboard_app import route\n"
        f"app = create_app(Path({str(runs.root)!r}))\n"
        "print('200'); print(json.dumps(route(app.server.test_client(), '/')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=True,
    )
    status, body = out.stdout.split("\n", 1)
    assert status == "200", out.stderr[-2000:]
    assert "duckdb is not installed: the list is a scan of every run folder" in body
    assert runs.alpha.name in body


# ---------------------------------------------------------------------- SLO cells


def test_a_run_without_slos_shows_no_slos_never_an_attainment(runs: Runs) -> None:
    rows = {r.run_id: r for r in RunRepository(runs.root).rows()}
    no_slo = rows[runs.no_slo.name]
    assert no_slo.slo_count == 0
    assert no_slo.slo_attainment is None and no_slo.goodput_req_s is None
    rec = no_slo.to_record()
    assert rec["slo_pct"] == "no SLOs" and rec["goodput_req_s"] == "no SLOs"
    with_slo = rows[runs.alpha.name].to_record()
    assert isinstance(with_slo["slo_pct"], float) and 0 <= with_slo["slo_pct"] <= 100
    # The index itself stores no attainment for a run judged by no SLO.
    from perfscope.api.index import open_index

    with open_index(runs.root) as index:
        _, got = index.query(
            "SELECT slo_count, attainment, goodput_req_s FROM runs WHERE run_id = ?",
            [runs.no_slo.name],
        )
    assert got == [(0, None, None)]


# ---------------------------------------------------------------------- compare


def _manifest(path: Path) -> dict[str, Any]:
    m: dict[str, Any] = json.loads((path / "manifest.json").read_text())
    return m


def test_config_diff_names_only_the_fields_that_differ(runs: Runs) -> None:
    diff = config_diff([_manifest(runs.alpha), _manifest(runs.beta)])
    assert [(d.group, d.field, d.values) for d in diff] == [
        ("batch", "engine.config.batch_size", ("4", "2"))
    ]
    assert config_diff([_manifest(runs.alpha), _manifest(runs.alpha)]) == []
    groups = {d.group for d in config_diff([_manifest(runs.alpha), _manifest(runs.gpu)])}
    assert {"device", "SLOs", "workload"} <= groups


def test_short_labels_drop_the_start_stamp_and_stay_unique() -> None:
    assert short_labels(["20261201-130321-alpha-050b", "20261201-130322-beta-d2de"]) == [
        "alpha-050b",
        "beta-d2de",
    ]
    same = ["20261201-130321-x-0001", "20261202-130321-x-0001"]
    assert short_labels(same) == same
    assert short_labels(["leftover"]) == ["leftover"]


def test_compare_page_shows_the_config_diff_and_short_legends(runs: Runs) -> None:
    from perfscope.dashboard.app import create_app
    from tests.test_dashboard_app import dash_call, find

    app = create_app(runs.root)
    client = app.server.test_client()
    ids = [runs.alpha.name, runs.beta.name]
    out = dash_call(
        client,
        ["compare-body.children"],
        {"compare-runs.value": ids, "compare-baseline.value": ids[0]},
    )
    assert out is not None
    body = out["compare-body"]["children"]
    table = find(body, "compare-config")
    assert table is not None
    assert [r["field"] for r in table["data"]] == ["engine.config.batch_size"]
    assert [c["name"] for c in table["columns"]][2:] == short_labels(ids)
    fig = find(body, "compare-fig-metrics")
    names = {t.get("name") for t in fig["figure"]["data"]}  # type: ignore[index]
    assert names == set(short_labels(ids))
    # Every metric cell says something: a value, or why there is none.
    metrics = find(body, "compare-table")
    assert metrics is not None
    assert all(str(v).strip() for row in metrics["data"] for v in row.values())
    same = dash_call(
        client,
        ["compare-body.children"],
        {"compare-runs.value": [ids[0], ids[0] + "x"], "compare-baseline.value": ids[0]},
    )
    assert same is not None  # one unknown id: left out with a message, no crash


# ---------------------------------------------------------------------- explorer


def test_explorer_lists_only_runs_with_a_model_spec(runs: Runs) -> None:
    from perfscope.dashboard.app import create_app
    from perfscope.dashboard.app.pages.roofline import model_options

    app = create_app(runs.root)
    ctx = app.server.extensions["perfscope"]
    values = {o["value"] for o in model_options(ctx)}
    assert f"run:{runs.alpha.name}" in values
    assert f"run:{runs.no_model.name}" not in values  # no model shape recorded
    assert not any(runs.broken.name in v for v in values)


def test_measured_points_sit_under_their_own_devices_roof(runs: Runs) -> None:
    from perfscope.dashboard.app import create_app
    from perfscope.dashboard.app.pages.roofline import _measured_points, explore, explorer_figure

    app = create_app(runs.root)
    ctx = app.server.extensions["perfscope"]
    _, preds = explore(
        ctx,
        "llama-3-8b",
        ["h100-sxm5-80gb"],
        batch=8,
        prompt_len=1024,
        output_len=64,
        dtype="bf16",
        kv_dtype="bf16",
    )
    measured = _measured_points(ctx, [runs.alpha.name, runs.gpu.name])
    fig = explorer_figure(preds, measured).to_dict()
    roofs = [t for t in fig["data"] if (t.get("meta") or {}).get("kind") == "measured-roof"]
    assert {r["meta"]["device"] for r in roofs} == {"epyc-9654", "h100-sxm5-80gb"}
    summary = json.loads((runs.alpha / "summary.json").read_text())
    cpu_peak = summary["roofline"]["ceilings"]["peak_flops"]
    cpu_roof = next(r for r in roofs if r["meta"]["device"] == "epyc-9654")
    assert max(cpu_roof["y"]) == pytest.approx(cpu_peak)
    assert "epyc-9654" not in {p.projection.device.key for p in preds}  # drawn for the run alone
    points = [t for t in fig["data"] if (t.get("meta") or {}).get("kind") == "measured"]
    assert {p["meta"]["run"] for p in points} == {runs.alpha.name, runs.gpu.name}
    for p in points:
        assert p["cliponaxis"] is False  # labels are never cut at the plot's edge
        if p.get("text"):
            assert runs.alpha.name not in p["text"][0]  # short label, not the full id


def test_explorer_error_shows_a_message_not_an_empty_grid(runs: Runs) -> None:
    from perfscope.dashboard.app import create_app
    from tests.test_dashboard_app import dash_call

    app = create_app(runs.root)
    client = app.server.test_client()
    out = dash_call(
        client,
        [
            "roofline-fig.figure",
            "roofline-table.data",
            "roofline-summary.children",
            "roofline-notes.children",
        ],
        {
            "roofline-model.value": f"run:{runs.no_model.name}",
            "roofline-devices.value": ["h100-sxm5-80gb"],
            "roofline-batch.value": 3,
            "roofline-prompt.value": 10,
            "roofline-output.value": 8,
            "roofline-dtype.value": 1,
            "roofline-kv-dtype.value": 1,
            "roofline-runs.value": [],
        },
    )
    assert out is not None
    layout = out["roofline-fig"]["figure"]["layout"]
    assert layout["xaxis"]["visible"] is False and layout["yaxis"]["visible"] is False
    assert "recorded no model shape" in layout["annotations"][0]["text"]


# ---------------------------------------------------------------------- contention


def test_a_contended_run_is_marked_next_to_its_state(runs: Runs, tmp_path: Path) -> None:
    from perfscope.dashboard.app import create_app
    from tests.data.runs.builders import set_manifest
    from tests.test_dashboard_app import find, route

    root = tmp_path / "c"
    quiet = manual_run(root, name="quiet", n_requests=3)
    busy = manual_run(root, name="busy", n_requests=3)
    shares = {"window_s": 5.0, "cpu_count": 2, "others_share": 0.63, "steal_share": 0.0}
    set_manifest(busy, host__contention=shares)
    rows = {r.run_id: r for r in RunRepository(root).rows()}
    assert rows[busy.name].contention == "⚠ others 63%"
    assert rows[quiet.name].contention is None
    table = find(route(create_app(root).server.test_client(), "/"), "runs-table")
    assert table is not None
    ids = [c["id"] for c in table["columns"]]
    assert ids.index("contention") == ids.index("outcome") + 1  # before the metrics
    cells = {r["run_id"]: r["contention"] for r in table["data"]}
    assert cells == {busy.name: "⚠ others 63%", quiet.name: ""}


def test_study_and_sweep_folders_are_never_listed_as_runs(tmp_path: Path) -> None:
    from perfscope.dashboard.app.data import RunRepository
    from perfscope.profiler.store import list_runs, scan_runs

    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "20260101-000000-batch-size.json").write_text("{}")
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "sweep.json").write_text("{}")
    assert list_runs(tmp_path) == [] and scan_runs(tmp_path) == []
    assert RunRepository(tmp_path).run_ids() == []


# ---------------------------------------------------------------------- server-side paging


def test_the_runs_table_pages_sorts_and_filters_on_the_server_and_keeps_picks_across_pages(
    tmp_path: Path,
) -> None:
    from perfscope.dashboard.app import create_app
    from perfscope.dashboard.app.pages.runs import PAGE_SIZE
    from tests.data.runs.builders import copy_run
    from tests.test_dashboard_app import RUNS_TABLE_OUTPUTS, dash_call, find, route

    template = manual_run(tmp_path / "t", name="tmpl", n_requests=3)
    root = tmp_path / "runs"
    root.mkdir()
    n = 2 * PAGE_SIZE + 7
    for i in range(n):
        run = copy_run(template, root, f"20261201-10{i // 60:02d}{i % 60:02d}-r-{i:04d}")
        summary = json.loads((run / "summary.json").read_text())
        summary["throughput"]["output_tok_s"] = float(1000 + (i * 37) % n)
        (run / "summary.json").write_text(json.dumps(summary))
    client = create_app(root).server.test_client()
    table = find(route(client, "/"), "runs-table")
    assert table is not None
    # The browser gets one page, newest first, and knows how many there are.
    assert len(table["data"]) == PAGE_SIZE and table["page_count"] == 3
    assert table["data"][0]["run_id"].endswith(f"-{n - 1:04d}")
    assert table["page_action"] == table["sort_action"] == table["filter_action"] == "custom"
    outputs = RUNS_TABLE_OUTPUTS

    def ask(**inputs: Any) -> dict[str, Any]:
        values = {"runs-table.page_current": 0, "runs-table.page_size": PAGE_SIZE}
        values.update({f"runs-table.{k}": v for k, v in inputs.items()})
        picked = {"runs-selection.data": ["20261201-100001-r-0001"]}
        out = dash_call(client, outputs, values, picked, changed=["runs-table.page_current"])
        assert out is not None
        return out

    last = ask(page_current=2)
    assert len(last["runs-table"]["data"]) == n - 2 * PAGE_SIZE
    assert last["runs-table"]["data"][-1]["run_id"] == "20261201-100000-r-0000"
    # The run picked on another page is marked where it shows.
    (sel,) = last["runs-table"]["selected_rows"]
    assert last["runs-table"]["data"][sel]["run_id"] == "20261201-100001-r-0001"
    ranked = ask(sort_by=[{"column_id": "output_tok_s", "direction": "asc"}])["runs-table"]
    tok = [r["output_tok_s"] for r in ranked["data"]]
    assert tok == sorted(tok) and tok[0] == 1000.0  # the smallest of all pages comes first
    filtered = ask(filter_query="{output_tok_s} >= 1100 && {link} contains r-00")
    rows = filtered["runs-table"]["data"]
    assert rows and all(r["output_tok_s"] >= 1100 for r in rows)
    assert filtered["runs-table"]["page_count"] == 1
    assert filtered["runs-count"]["children"].endswith(f"{len(rows)} match the filter")
    # Picks on one page stay when another page's picks change.
    keep = dash_call(
        client,
        ["runs-selection.data"],
        {"runs-table.selected_row_ids": ["20261201-100105-r-0065"]},
        {
            "runs-table.data": [*ranked["data"][:3], {"id": "20261201-100105-r-0065"}],
            "runs-selection.data": ["20261201-100001-r-0001"],
        },
    )
    assert keep is not None
    assert keep["runs-selection"]["data"] == ["20261201-100001-r-0001", "20261201-100105-r-0065"]
