"""The Dash dashboard at callback level: Flask's test client against Dash's own endpoints.

Every page is routed through the app's router callback (``POST /_dash-update-component``
with the URL), and every page callback is invoked the way the browser invokes it. The runs
are made by perfscope in the test: two real ``perfscope run`` runs of the reference engine,
an interrupted manual run, a large synthetic run, plus broken directories and a sweep.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfscope.analysis.sweep import summarize_sweep, sweep_point
from perfscope.dashboard.app import create_app, is_loopback
from perfscope.dashboard.app.data import InvalidRunIdError, RunRepository, validate_run_id
from perfscope.dashboard.figures import run_figures
from perfscope.errors import RunNotFoundError
from perfscope.profiler.store import read_run, write_json_atomic
from tests.data.runs.builders import EVIL, complete_run, manual_run, small_model, synthetic_run

# ---------------------------------------------------------------------- fixtures


class Runs:
    """The runs directory every test here reads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # 12 requests per run: enough measured requests for every compared metric.
        common = ("--hw", "epyc-9654", "--requests", "12")
        self.alpha = complete_run(root, *common, "--name", "alpha")
        self.beta = complete_run(root, *common, "--name", "beta", "--batch-size", "2")
        self.interrupted = manual_run(
            root, name=EVIL, n_requests=6, interrupt=True, model=small_model()
        )
        self.broken = root / "20990101-000000-broken-0000"
        self.broken.mkdir()
        (self.broken / "manifest.json").write_text("{not json", encoding="utf-8")
        self.empty = root / "leftover-folder"
        self.empty.mkdir()
        self.sweep_id = "20260101-000000-sweep"
        points = [
            sweep_point(rate, json.loads((p / "summary.json").read_text()), str(p))
            for rate, p in ((1.0, self.alpha), (2.0, self.beta))
        ]
        summary = summarize_sweep("rate", points, {"ttft": 2.0})
        (root / "sweeps").mkdir()
        write_json_atomic(root / "sweeps" / f"{self.sweep_id}.json", summary.to_dict())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        yield Runs(tmp_path_factory.mktemp("dash-runs"))


@pytest.fixture(scope="module")
def app(runs: Runs) -> Any:
    return create_app(runs.root, poll_interval_s=0.5)


@pytest.fixture
def client(app: Any) -> Any:
    return app.server.test_client()


# ---------------------------------------------------------------------- Dash protocol


def _output_key(outputs: list[str]) -> str:
    return outputs[0] if len(outputs) == 1 else ".." + "...".join(outputs) + ".."


def dash_call(
    client: Any,
    outputs: list[str],
    inputs: dict[str, Any],
    state: dict[str, Any] | None = None,
    *,
    changed: list[str] | None = None,
) -> dict[str, Any] | None:
    """Invoke one callback as the renderer does; ``None`` when it updates nothing (204).

    ``inputs``/``state`` map ``"id.prop"`` to values; the callback is looked up in
    ``/_dash-dependencies`` so its full input and state lists are sent in order.
    """
    key = _output_key(outputs)
    deps = client.get("/_dash-dependencies").get_json()
    # Outputs shared by several callbacks (allow_duplicate) carry an "@hash" suffix.
    dep = next((d for d in deps if re.sub(r"@[0-9a-f]+", "", d["output"]) == key), None)
    assert dep is not None, f"no callback for {key}; have {[d['output'] for d in deps]}"
    key = dep["output"]
    parts = key.strip(".").split("...") if key.startswith("..") else [key]
    state = state or {}

    def spec(items: list[dict[str, Any]], values: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {
                "id": i["id"],
                "property": i["property"],
                "value": values.get(f"{i['id']}.{i['property']}"),
            }
            for i in items
        ]

    outs = [{"id": o.split(".")[0], "property": o.split(".", 1)[1]} for o in parts]
    body = {
        "output": key,
        "outputs": outs if len(outs) > 1 else outs[0],
        "inputs": spec(dep["inputs"], inputs),
        "state": spec(dep["state"], state),
        "changedPropIds": changed or list(inputs),
    }
    resp = client.post("/_dash-update-component", json=body)
    if resp.status_code == 204:
        return None
    assert resp.status_code == 200, resp.get_data(as_text=True)[:2000]
    data: dict[str, Any] = resp.get_json()["response"]
    return data or None  # every output was no_update


#: The outputs of the runs table's callback (its poll, page, sort and filter).
RUNS_TABLE_OUTPUTS = [
    "runs-table.data",
    "runs-table.tooltip_data",
    "runs-table.selected_rows",
    "runs-count.children",
    "runs-table.page_count",
    "runs-table.page_current",
]


def route(client: Any, pathname: str, search: str = "") -> Any:
    """The page the router builds for a URL (the layout tree as JSON)."""
    out = dash_call(
        client, ["page-content.children"], {"url.pathname": pathname, "url.search": search}
    )
    assert out is not None
    return out["page-content"]["children"]


def find(tree: Any, component_id: str) -> dict[str, Any] | None:
    """The component with ``id`` in a serialised layout tree."""
    if isinstance(tree, dict):
        props = tree.get("props")
        if isinstance(props, dict):
            if props.get("id") == component_id:
                return props
            return find(props.get("children"), component_id)
        return None
    if isinstance(tree, list):
        for item in tree:
            hit = find(item, component_id)
            if hit is not None:
                return hit
    return None


def ids_in(tree: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(tree, dict) and isinstance(tree.get("props"), dict):
        if isinstance(tree["props"].get("id"), str):
            out.add(tree["props"]["id"])
        out |= ids_in(tree["props"].get("children"))
    elif isinstance(tree, list):
        for item in tree:
            out |= ids_in(item)
    return out


def texts(tree: Any) -> str:
    """All text children of a layout tree, joined."""
    if isinstance(tree, str):
        return tree
    if isinstance(tree, dict) and isinstance(tree.get("props"), dict):
        return texts(tree["props"].get("children"))
    if isinstance(tree, list):
        return " ".join(texts(t) for t in tree)
    return ""


# ---------------------------------------------------------------------- app and runs page


def test_index_layout_and_dependencies_are_served(client: Any) -> None:
    assert client.get("/").status_code == 200
    layout = client.get("/_dash-layout").get_json()
    assert {"url", "page-content"} <= ids_in(layout)
    assert client.get("/_dash-dependencies").status_code == 200


def test_runs_page_lists_every_directory_and_marks_broken_and_partial(
    client: Any, runs: Runs
) -> None:
    page = route(client, "/")
    table = find(page, "runs-table")
    assert table is not None
    rows = {r["run_id"]: r for r in table["data"]}
    assert set(rows) == {
        runs.alpha.name,
        runs.beta.name,
        runs.interrupted.name,
        runs.broken.name,
        runs.empty.name,
    }
    assert "sweeps" not in rows  # perfscope sweep's folder is not a run
    assert rows[runs.alpha.name]["state"] == "ok"
    assert rows[runs.interrupted.name]["state"] == "partial"
    assert rows[runs.interrupted.name]["status"].startswith("interrupted")
    assert rows[runs.broken.name]["state"] == "broken"
    assert "manifest.json" in rows[runs.broken.name]["status"]
    assert rows[runs.empty.name]["status"] == "broken: no manifest.json"
    summary = json.loads((runs.alpha / "summary.json").read_text())
    alpha = rows[runs.alpha.name]
    assert alpha["ttft_p50_ms"] == pytest.approx(summary["latency"]["ttft"]["p50"] * 1e3, rel=1e-2)
    assert alpha["output_tok_s"] == pytest.approx(summary["throughput"]["output_tok_s"], rel=1e-3)
    assert alpha["hardware"].startswith("AMD EPYC 9654")
    assert alpha["engine"] == "reference"
    assert alpha["link"] == f"[{runs.alpha.name}](/run/{runs.alpha.name})"
    # The run name is user text: it reaches the browser as data, never as markup.
    assert rows[runs.interrupted.name]["name"] == EVIL


def test_runs_poll_shows_new_runs_and_keeps_the_selection(
    client: Any, runs: Runs, tmp_path: Path
) -> None:
    page = route(client, "/")
    data = find(page, "runs-table")["data"]  # type: ignore[index]
    outputs = RUNS_TABLE_OUTPUTS
    state = {"runs-table.data": data, "runs-selection.data": [runs.beta.name]}
    first = {"runs-table.page_current": 0, "runs-table.page_size": 50}
    poll = {**first, "runs-poll.n_intervals": 1}
    assert dash_call(client, outputs, poll, state, changed=["runs-poll.n_intervals"]) is None
    new = manual_run(runs.root, name="late", n_requests=3, model=small_model())
    try:
        poll = {**first, "runs-poll.n_intervals": 2}
        out = dash_call(client, outputs, poll, state, changed=["runs-poll.n_intervals"])
        assert out is not None
        rows = out["runs-table"]["data"]
        assert new.name in [r["run_id"] for r in rows]
        (sel,) = out["runs-table"]["selected_rows"]
        assert rows[sel]["run_id"] == runs.beta.name
        assert out["runs-count"]["children"].startswith("6 run directories")
    finally:
        for f in new.iterdir():
            f.unlink()
        new.rmdir()


def test_selecting_runs_builds_the_compare_link(client: Any, runs: Runs) -> None:
    outputs = ["runs-compare-link.href", "runs-compare-link.children", "runs-compare-link.style"]
    picked = [runs.alpha.name, runs.beta.name]
    out = dash_call(client, outputs, {"runs-selection.data": picked})
    assert out is not None
    assert out["runs-compare-link"]["href"] == f"/compare?runs={runs.alpha.name},{runs.beta.name}"
    assert out["runs-compare-link"]["children"] == "Compare 2 selected runs"
    one = dash_call(client, outputs, {"runs-selection.data": [runs.alpha.name]})
    assert one is not None and one["runs-compare-link"]["href"] == f"/run/{runs.alpha.name}"


# ---------------------------------------------------------------------- run detail


def test_run_detail_shows_every_report_figure(client: Any, runs: Runs) -> None:
    page = route(client, f"/run/{runs.alpha.name}")
    specs = run_figures(read_run(runs.alpha))  # the report's own figure list
    present = ids_in(page)
    for spec in specs:
        if spec.figure is not None:
            graph = find(page, f"detail-fig-{spec.key}")
            assert graph is not None, spec.key
            assert graph["figure"]["data"], spec.key
        else:
            assert spec.missing and spec.missing in texts(page)
    assert {"detail-requests", "detail-metrics", "detail-run-id"} <= present
    assert runs.alpha.name in texts(page)


def test_run_detail_words_the_advice_and_the_batch_queueing_as_the_report_does(
    client: Any, runs: Runs
) -> None:
    page = route(client, f"/run/{runs.alpha.name}")
    summary = read_run(runs.alpha, tables=False).summary
    advice = summary["advice"]
    assert advice, "the tiny reference run gets advice"
    found = find(page, "detail-advice")
    assert found is not None
    block = texts(found["children"])
    for a in advice:  # every suggestion's technique and the reason it applies, in words
        assert a["technique"] in block and a["why"] in block
    assert "calibration: " in block or "assumes: " in block
    # a batch-mode run: its TTFT is mostly the wait for a slot, said beside the numbers
    queue = find(page, "detail-queueing")
    assert queue is not None and "TTFT includes queueing" in texts(queue["children"])
    assert "queue p50" in texts(queue["children"])


def test_broken_and_partial_runs_render_as_pages_not_crashes(client: Any, runs: Runs) -> None:
    broken = route(client, f"/run/{runs.broken.name}")
    assert "cannot be shown" in texts(broken)
    assert find(broken, "detail-requests") is None
    partial = route(client, f"/run/{runs.interrupted.name}")
    assert find(partial, "detail-fig-timeline") is not None
    assert "interrupted" in texts(partial)


def test_zooming_the_timeline_moves_the_throughput_axis_and_back(client: Any, runs: Runs) -> None:
    page = route(client, f"/run/{runs.alpha.name}")
    axes = find(page, "detail-axes")["data"]  # type: ignore[index]
    to_throughput = ["detail-fig-throughput.figure", "detail-range-text.children"]
    out = dash_call(
        client,
        to_throughput,
        {"detail-fig-timeline.relayoutData": {"xaxis.range[0]": 0.01, "xaxis.range[1]": 0.02}},
        {"detail-axes.data": axes},
    )
    assert out is not None
    ops = out["detail-fig-throughput"]["figure"]["operations"]
    ranges = {tuple(o["location"]): o["params"]["value"] for o in ops}
    for ax in axes["throughput"]:
        assert ranges[("layout", ax, "range")] == [0.01, 0.02]
        assert ranges[("layout", ax, "autorange")] is False
    assert out["detail-range-text"]["children"].startswith("time range 0.010 s")
    # A reset (double-click) on the throughput figure resets the timeline.
    back = dash_call(
        client,
        ["detail-fig-timeline.figure", "detail-range-text.children"],
        {"detail-fig-throughput.relayoutData": {"xaxis.autorange": True}},
        {"detail-axes.data": axes},
    )
    assert back is not None
    ops = back["detail-fig-timeline"]["figure"]["operations"]
    assert {
        "location": ["layout", "xaxis", "autorange"],
        "params": {"value": True},
        "operation": "Assign",
    } in ops
    # A y-only zoom, or a resize, changes nothing.
    for event in ({"yaxis.range[0]": 1, "yaxis.range[1]": 2}, {"autosize": True}):
        assert (
            dash_call(
                client,
                to_throughput,
                {"detail-fig-timeline.relayoutData": event},
                {"detail-axes.data": axes},
            )
            is None
        )


def test_request_table_pages_and_sorts_on_the_server(client: Any, runs: Runs) -> None:
    route(client, f"/run/{runs.alpha.name}")
    out = dash_call(
        client,
        ["detail-requests.data"],
        {
            "detail-requests.page_current": 0,
            "detail-requests.page_size": 5,
            "detail-requests.sort_by": [{"column_id": "ttft_ms", "direction": "desc"}],
        },
        {"detail-run-id.data": runs.alpha.name},
    )
    assert out is not None
    rows = out["detail-requests"]["data"]
    assert len(rows) == 5
    assert all(r["error"] == "" for r in rows)  # completed requests: empty, not "nan"
    ttfts = [r["ttft_ms"] for r in rows]
    assert ttfts == sorted(ttfts, reverse=True)
    req = read_run(runs.alpha).requests
    worst = (req["t_first_token"] - req["t_sent"]).max() * 1e-6
    assert ttfts[0] == pytest.approx(worst, abs=1e-3)
    page2 = dash_call(
        client,
        ["detail-requests.data"],
        {
            "detail-requests.page_current": 1,
            "detail-requests.page_size": 5,
            "detail-requests.sort_by": [],
        },
        {"detail-run-id.data": runs.alpha.name},
    )
    assert page2 is not None
    assert [r["request_id"] for r in page2["detail-requests"]["data"]] == [5, 6, 7, 8, 9]


def test_drill_down_draws_one_requests_token_arrivals(client: Any, runs: Runs) -> None:
    out = dash_call(
        client,
        ["detail-request-view.children"],
        {"detail-requests.active_cell": {"row": 0, "column": 0, "row_id": 3}},
        {"detail-run-id.data": runs.alpha.name},
    )
    assert out is not None
    fig = out["detail-request-view"]["children"]["props"]["figure"]
    stored = read_run(runs.alpha)
    n_out = int(stored.requests.set_index("request_id").loc[3, "output_tokens"])
    tokens = fig["data"][0]["y"]
    last = tokens[-1] if isinstance(tokens, list) else None
    if last is None:  # plotly may send numpy arrays as base64 typed arrays
        import base64

        import numpy as np

        last = int(np.frombuffer(base64.b64decode(tokens["bdata"]), dtype=tokens["dtype"])[-1])
    assert last == n_out
    assert "Request 3" in fig["layout"]["title"]["text"]
    missing = dash_call(
        client,
        ["detail-request-view.children"],
        {"detail-requests.active_cell": {"row": 0, "column": 0, "row_id": 999}},
        {"detail-run-id.data": runs.alpha.name},
    )
    assert missing is not None and "not in this run" in texts(
        missing["detail-request-view"]["children"]
    )


# ---------------------------------------------------------------------- compare


def test_compare_page_overlays_runs_with_ratios_and_intervals(client: Any, runs: Runs) -> None:
    page = route(client, "/compare", f"?runs={runs.alpha.name},{runs.beta.name}")
    assert find(page, "compare-runs")["value"] == [runs.alpha.name, runs.beta.name]  # type: ignore[index]
    out = dash_call(
        client,
        ["compare-body.children"],
        {
            "compare-runs.value": [runs.alpha.name, runs.beta.name],
            "compare-baseline.value": runs.alpha.name,
        },
    )
    assert out is not None
    body = out["compare-body"]["children"]
    table = find(body, "compare-table")
    assert table is not None
    by_metric = {r["metric"]: r for r in table["data"]}
    assert {"TTFT p50", "TPOT p50", "output tokens/s"} <= set(by_metric)
    ttft = by_metric["TTFT p50"]
    # two single runs: a ratio, but no interval and no better/worse claim
    assert ttft["r1"].endswith("x") and ttft["ci1"] == "n/a (too few runs)"
    assert ttft["c1"] == "no detectable change" and ttft["n1"] == "none (too few runs)"
    assert "noise unknown" in texts(body)
    names = [c["name"] for c in table["columns"]]
    # Headers carry the short run label (no timestamp prefix); a blank CI says why.
    assert names[1] == f"baseline: {runs.alpha.name.split('-', 2)[2]}"
    for row in table["data"]:
        assert row["ci1"] and row["c1"], row
    link = find(body, "compare-roofline-link")
    assert link is not None
    assert link["href"] == f"/roofline?runs={runs.alpha.name},{runs.beta.name}"
    for gid in ("compare-fig-metrics", "compare-fig-cdf", "compare-fig-throughput"):
        assert find(body, gid)["figure"]["data"]  # type: ignore[index]
    # Pinning the other run as baseline flips the ratio.
    flipped = dash_call(
        client,
        ["compare-body.children"],
        {
            "compare-runs.value": [runs.alpha.name, runs.beta.name],
            "compare-baseline.value": runs.beta.name,
        },
    )
    assert flipped is not None
    table2 = find(flipped["compare-body"]["children"], "compare-table")
    assert table2["columns"][1]["name"] == f"baseline: {runs.beta.name.split('-', 2)[2]}"  # type: ignore[index]
    r1 = float(ttft["r1"].rstrip("x"))
    r2 = float({r["metric"]: r for r in table2["data"]}["TTFT p50"]["r1"].rstrip("x"))  # type: ignore[index]
    assert r1 * r2 == pytest.approx(1.0, rel=0.01)


def test_compare_baseline_follows_the_run_selection(client: Any, runs: Runs) -> None:
    out = dash_call(
        client,
        ["compare-baseline.options", "compare-baseline.value"],
        {"compare-runs.value": [runs.beta.name, runs.alpha.name]},
        {"compare-baseline.value": "not-selected-anymore"},
    )
    assert out is not None
    assert out["compare-baseline"]["value"] == runs.beta.name


def test_compare_leaves_out_broken_runs_with_a_message(client: Any, runs: Runs) -> None:
    out = dash_call(
        client,
        ["compare-body.children"],
        {
            "compare-runs.value": [runs.alpha.name, runs.broken.name],
            "compare-baseline.value": runs.alpha.name,
        },
    )
    assert out is not None
    text = texts(out["compare-body"]["children"])
    assert "left out" in text and "Pick two or more runs" in text


# ---------------------------------------------------------------------- sweeps


def test_sweeps_page_draws_curves_of_the_stored_sweep(client: Any, runs: Runs) -> None:
    page = route(client, "/sweeps")
    assert find(page, "sweeps-select")["value"] == runs.sweep_id  # type: ignore[index]
    curve = find(page, "sweeps-fig-curve")["figure"]  # type: ignore[index]
    names = [t.get("name") for t in curve["data"]]
    assert "TTFT p50" in names and "E2E p99" in names
    goodput = find(page, "sweeps-fig-goodput")["figure"]  # type: ignore[index]
    assert {"achieved req/s", "goodput req/s", "SLO attainment %"} <= {
        t.get("name") for t in goodput["data"]
    }
    points = find(page, "sweeps-points")["data"]  # type: ignore[index]
    assert [p["offered"] for p in points] == ["1", "2"]  # formatted by the catalogue
    assert points[0]["run"] == f"[{runs.alpha.name}](/run/{runs.alpha.name})"
    assert all(re.fullmatch(r"[\d.,]+ (s|ms|µs)|n/a", p["ttft_p50"]) for p in points), points
    bad = dash_call(client, ["sweeps-body.children"], {"sweeps-select.value": "../../etc/passwd"})
    assert bad is not None and "invalid sweep id" in texts(bad["sweeps-body"]["children"])


# ---------------------------------------------------------------------- roofline explorer


ROOFLINE_OUT = [
    "roofline-fig.figure",
    "roofline-table.data",
    "roofline-summary.children",
    "roofline-notes.children",
]


def _explore(client: Any, **changes: Any) -> dict[str, Any]:
    values = {
        "roofline-model.value": "llama-3-8b",
        "roofline-devices.value": ["h100-sxm5-80gb", "a100-sxm4-80gb"],
        "roofline-batch.value": 0,
        "roofline-prompt.value": 10,
        "roofline-output.value": 8,
        "roofline-dtype.value": 1,
        "roofline-kv-dtype.value": 1,
        "roofline-runs.value": [],
    }
    values.update({f"roofline-{k.replace('_', '-')}.value": v for k, v in changes.items()})
    out = dash_call(client, ROOFLINE_OUT, values)
    assert out is not None
    return out


def test_roofline_explorer_predicts_per_device_and_updates_with_sliders(client: Any) -> None:
    page = route(client, "/roofline")
    assert {"roofline-batch", "roofline-prompt", "roofline-dtype", "roofline-kv-dtype"} <= ids_in(
        page
    )
    one = _explore(client, batch=0)
    rows = one["roofline-table"]["data"]
    assert {(r["device"], r["phase"]) for r in rows} == {
        (d, p) for d in ("h100-sxm5-80gb", "a100-sxm4-80gb") for p in ("prefill", "decode")
    }
    dec = {r["device"]: r for r in rows if r["phase"] == "decode"}
    assert dec["h100-sxm5-80gb"]["bound"] == "memory-bound"
    # Same bytes, faster memory: H100 (3.35 TB/s) decodes faster than A100 (2.04 TB/s).
    assert dec["h100-sxm5-80gb"]["tpot_ms"] < dec["a100-sxm4-80gb"]["tpot_ms"]
    big = _explore(client, batch=8)  # 256 sequences
    dec_big = {r["device"]: r for r in big["roofline-table"]["data"] if r["phase"] == "decode"}
    assert dec_big["h100-sxm5-80gb"]["intensity"] > 20 * dec["h100-sxm5-80gb"]["intensity"]
    assert "batch 256" in big["roofline-summary"]["children"]
    fp8 = _explore(client, dtype=3, kv_dtype=3)
    dec_fp8 = {r["device"]: r for r in fp8["roofline-table"]["data"] if r["phase"] == "decode"}
    assert dec_fp8["h100-sxm5-80gb"]["tpot_ms"] < dec["h100-sxm5-80gb"]["tpot_ms"]
    predicted = [
        t for t in one["roofline-fig"]["figure"]["data"] if (t.get("meta") or {}).get("kind")
    ]
    assert len(predicted) == 4


def test_roofline_explorer_uses_a_runs_model_and_overlays_measured_points(
    client: Any, runs: Runs
) -> None:
    page = route(client, "/roofline", f"?runs={runs.alpha.name},{runs.broken.name}")
    assert find(page, "roofline-runs")["value"] == [runs.alpha.name]  # type: ignore[index]
    out = _explore(client, model=f"run:{runs.alpha.name}", runs=[runs.alpha.name])
    assert out["roofline-summary"]["children"].startswith("reference:")
    measured = [
        t
        for t in out["roofline-fig"]["figure"]["data"]
        if (t.get("meta") or {}).get("kind") == "measured"
    ]
    summary = json.loads((runs.alpha / "summary.json").read_text())
    phases = summary["roofline"]["phases"]
    assert {t["meta"]["phase"] for t in measured} == set(phases)
    bad = _explore(client, model="no-such-model")
    assert "unknown model preset" in texts(bad["roofline-notes"]["children"])


# ---------------------------------------------------------------------- hardware


def test_hardware_page_lists_the_database_with_sources(client: Any) -> None:
    page = route(client, "/hardware")
    table = find(page, "hw-table")
    assert table is not None
    keys = {r["key"] for r in table["data"]}
    assert {"h100-sxm5-80gb", "mi300x", "l4"} <= keys
    h100 = next(r for r in table["data"] if r["key"] == "h100-sxm5-80gb")
    assert h100["bw_gb_s"] == 3350 and h100["bf16_tflops"] == pytest.approx(989.4)
    out = dash_call(
        client,
        ["hw-detail.children"],
        {"hw-table.active_cell": {"row": 0, "column": 0, "row_id": "h100-sxm5-80gb"}},
    )
    assert out is not None
    detail = out["hw-detail"]["children"]
    text = texts(detail)
    assert "dense.bf16" in text and "989.4 TFLOPS" in text
    assert "sparse: never used as a denominator" in text
    assert "resources.nvidia.com" in json.dumps(detail)


# ---------------------------------------------------------------------- security


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("/run/../../etc/passwd", 400),
        ("/run/..%2F..%2Fetc%2Fpasswd", 400),
        ("/run/%2Fetc%2Fpasswd", 400),
        ("/run/.hidden", 400),
        ("/run/no-such-run", 404),
        ("/compare?runs=../secret", 400),
        ("/compare?runs=a,/etc/passwd", 400),
        ("/compare?runs=missing-1,missing-2", 404),
        ("/api/runs/..%2F..%2Fetc%2Fpasswd/summary.json", 400),
        ("/api/runs/no-such-run/summary.json", 404),
        ("/api/runs/x/../../manifest.json", 400),
        ("/api/anything-else", 404),
        ("/_dash-component-suites/dash/..%2F..%2F..%2Fetc%2Fpasswd", 400),
        ("/_dash-component-suites/dash/not-a-file.js", 404),
        ("/assets/..%2F..%2Fpyproject.toml", 400),
    ],
)
def test_traversal_and_bad_run_ids_get_errors_not_files(client: Any, url: str, status: int) -> None:
    resp = client.get(url)
    assert resp.status_code == status, (url, resp.status_code)
    body = resp.get_data(as_text=True)
    assert "root:" not in body and "[project]" not in body and "perfscope.manifest" not in body


def test_summary_api_serves_only_run_summaries(client: Any, runs: Runs) -> None:
    resp = client.get(f"/api/runs/{runs.alpha.name}/summary.json")
    assert resp.status_code == 200
    assert resp.get_json() == json.loads((runs.alpha / "summary.json").read_text())
    assert client.get(f"/api/runs/{runs.broken.name}/summary.json").status_code == 404
    listing = client.get("/api/runs").get_json()
    assert {r["run_id"] for r in listing} >= {runs.alpha.name, runs.broken.name}


def test_symlink_out_of_the_runs_dir_is_rejected(runs: Runs, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "manifest.json").write_text("{}")
    link = runs.root / "20990101-000000-link-0000"
    link.symlink_to(outside, target_is_directory=True)
    try:
        with pytest.raises(InvalidRunIdError):
            validate_run_id(runs.root, link.name)
        client = create_app(runs.root).server.test_client()
        assert client.get(f"/run/{link.name}").status_code == 400
    finally:
        link.unlink()


@pytest.mark.parametrize(
    "bad", ["..", "../x", "/etc/passwd", "a/b", "a\\b", ".hidden", "", "x" * 300, None, 3]
)
def test_validate_run_id_rejects_anything_but_a_plain_name(runs: Runs, bad: Any) -> None:
    with pytest.raises(InvalidRunIdError):
        validate_run_id(runs.root, bad)


def test_validate_run_id_accepts_runs_and_reports_missing_ones(runs: Runs) -> None:
    assert validate_run_id(runs.root, runs.alpha.name) == runs.root / runs.alpha.name
    with pytest.raises(RunNotFoundError):
        validate_run_id(runs.root, "20990101-000000-missing-0000")


# ---------------------------------------------------------------------- engineering


def test_two_apps_share_no_state(runs: Runs, tmp_path: Path) -> None:
    other_root = tmp_path / "other"
    other = manual_run(other_root, name="other", n_requests=3)
    a = create_app(runs.root)
    b = create_app(other_root)
    assert len(a.callback_map) == len(b.callback_map)  # no callbacks leaked between apps

    def listed(app: Any) -> set[str]:
        table = find(route(app.server.test_client(), "/"), "runs-table")
        assert table is not None
        return {r["run_id"] for r in table["data"]}

    rows_a, rows_b = listed(a), listed(b)
    assert rows_b == {other.name}
    assert other.name not in rows_a
    assert a.server.extensions["perfscope"] is not b.server.extensions["perfscope"]
    assert a.config.suppress_callback_exceptions
    assert not a.server.debug


def test_repository_rereads_a_run_only_when_its_files_change(runs: Runs, tmp_path: Path) -> None:
    root = tmp_path / "r"
    run = manual_run(root, name="one", n_requests=3)
    repo = RunRepository(root)
    first = repo.row(run.name)
    assert repo.row(run.name) is first  # cached
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["status"] = "failed"
    manifest["errors"] = ["engine crashed"]
    time.sleep(0.01)
    write_json_atomic(run / "manifest.json", manifest)
    again = repo.row(run.name)
    assert again is not first
    assert again.state == "partial" and again.problem == "engine crashed"
    loaded = repo.load(run.name)
    assert repo.load(run.name) is loaded
    (run / "summary.json").unlink()
    fresh = repo.load(run.name)
    assert fresh is not loaded and fresh.summary_computed
    assert fresh.summary["counts"]["completed"] == 3


def test_large_run_detail_page_builds_with_its_timeline_and_stays_small(tmp_path: Path) -> None:
    # How fast it builds is measured by benchmarks/timing_targets.py (dashboard).
    root = tmp_path / "big"
    run = synthetic_run(root, 10_000)
    client = create_app(root).server.test_client()
    page = route(client, f"/run/{run.name}")
    again = route(client, f"/run/{run.name}")
    size = len(json.dumps(page))
    assert find(page, "detail-fig-timeline") is not None
    assert json.dumps(again) == json.dumps(page)
    assert size < 3_000_000


# ---------------------------------------------------------------------- CLI


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")


def test_cli_dashboard_serves_the_runs_dir(runs: Runs) -> None:
    import subprocess
    import urllib.request

    from tests.conftest import PERFSCOPE, subprocess_env

    port = _free_port()
    proc = subprocess.Popen(
        [*PERFSCOPE, "dashboard", "--runs-dir", str(runs.root), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        deadline = time.monotonic() + 60
        body = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.3)
        assert runs.alpha.name in body, "the dashboard did not answer"
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert f"http://127.0.0.1:{port}/" in out
    assert "warning" not in err


def test_cli_dashboard_warns_for_a_public_address_and_reports_bind_errors(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    from perfscope.cli import main

    # 192.0.2.1 (TEST-NET-1) is not on this machine: the bind fails before serving.
    code = main(
        [
            "dashboard",
            "--runs-dir",
            str(runs.root),
            "--host",
            "192.0.2.1",
            "--port",
            str(_free_port()),
        ]
    )
    # Read as words: the console wraps its lines at whatever width the terminal reports.
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert "warning" in err and "no authentication" in err
    assert "error: cannot listen on 192.0.2.1" in err


def test_cli_dashboard_rejects_bad_arguments(runs: Runs, tmp_path: Path) -> None:
    from perfscope.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["dashboard", "--port", "70000"])
    assert exc.value.code == 2
    f = tmp_path / "file"
    f.write_text("")
    # A file as the runs dir is refused while parsing the arguments (exit 2, one line).
    with pytest.raises(SystemExit) as exc:
        main(["dashboard", "--runs-dir", str(f)])
    assert exc.value.code == 2
    assert os.environ.get("PERFSCOPE_RUNS_DIR")  # the conftest isolation is in place


def test_the_runs_table_opens_with_the_reason_column_only_when_a_run_has_a_reason() -> None:
    from perfscope.dashboard.app.pages.runs import COLUMNS, HIDDEN_BY_DEFAULT, hidden_columns

    ok = {"link": "a", "problem": "", "sweep": None, "j_per_token": 0.25}
    assert hidden_columns([ok]) == ["engine", "name", "sweep", "problem"]
    broken = {
        "link": "b",
        "problem": "manifest.json: not JSON",
        "sweep": "s1",
        "j_per_token": "n/a",
    }
    assert hidden_columns([ok, broken]) == ["engine", "name"]
    assert set(HIDDEN_BY_DEFAULT) <= {c for c, _, _ in COLUMNS}


def test_the_energy_column_opens_hidden_when_no_listed_run_has_a_reading() -> None:
    from perfscope.dashboard.app.pages.runs import hidden_columns

    # A broken run's "n/a" is not a reading; neither is a run without a meter (None).
    unmetered = [{"link": "a", "j_per_token": None}, {"link": "b", "j_per_token": "n/a"}]
    assert "j_per_token" in hidden_columns(unmetered)
    assert "j_per_token" not in hidden_columns([*unmetered, {"link": "c", "j_per_token": 0.1}])
