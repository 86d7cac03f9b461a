"""``--ray``: load generation from Ray actors on a local cluster, merged into one run.

The cluster is real (Ray worker processes on this machine); the server is the scripted SSE
server, whose own log of when it wrote each chunk is the truth for the clock merge.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from perfscope.api.runner import RunOptions, RunOutcome, execute_run
from perfscope.profiler.driver import LoadConfig
from perfscope.profiler.engines.base import EngineOptions
from perfscope.profiler.store import read_run
from perfscope.profiler.telemetry import TelemetryConfig
from perfscope.profiler.workload import WorkloadConfig, parse_length
from tests.test_openai_scripted import scripted_server, server_log

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One local Ray cluster for the module (starting one takes 10-30 s here)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    from tests.data.engines.ray_engines import FINISH_LOG_ENV

    # Workers inherit it: the truth of which requests a killed actor had finished.
    os.environ[FINISH_LOG_ENV] = str(tmp_path_factory.mktemp("finish") / "finished.log")
    ray.init(
        num_cpus=4,
        resources={"loadgen": 8},  # what a load node offers (--ray-resources loadgen=1)
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        # Every worker samples one scripted GPU through the pynvml binding layer (no GPU here).
        runtime_env={"worker_process_setup_hook": "tests.data.ray_fake_nvml.install"},
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with scripted_server("--ttft", "0.03", "--itl", "0.01") as url:
        yield url


def _run(tmp_path: Path, engine: str, **kw: Any) -> Path:
    """One run into ``tmp_path``; its directory."""
    return Path(_execute(tmp_path, engine, **kw).path)


def _execute(
    tmp_path: Path,
    engine: str,
    *,
    ray_target: str | None,
    telemetry: TelemetryConfig | None = None,
    autoscale: int | None = None,
    ray_resources: dict[str, float] | None = None,
    **work: object,
) -> RunOutcome:
    """One run into ``tmp_path`` (an online load unless ``work`` says otherwise)."""
    prompts = work.pop("prompts", None)
    opts = RunOptions(
        engine=engine,
        workload=WorkloadConfig(
            requests=int(work.pop("requests", 24)),
            prompt_len=parse_length(8),
            output_len=parse_length(int(work.pop("output_len", 12))),  # type: ignore[call-overload]
            prompts_file=Path(prompts) if prompts else None,  # type: ignore[arg-type]
        ),
        load=LoadConfig(mode="online", **work),  # type: ignore[arg-type]
        engine_options=EngineOptions(extra={"model": "m"} if engine.startswith("openai") else {}),
        runs_dir=tmp_path,
        ray=ray_target,
        ray_autoscale=autoscale,
        ray_resources=ray_resources or {},
        telemetry=telemetry or TelemetryConfig(enabled=False),
    )
    return execute_run(opts)


def test_a_ray_run_measures_what_a_single_process_run_measures(
    cluster: None, server: str, tmp_path: Path
) -> None:
    single = read_run(_run(tmp_path, f"openai:{server}", ray_target=None, rate=20.0))
    # The actors ask for a resource only load nodes offer (--ray-resources loadgen=1).
    spread = read_run(
        _run(
            tmp_path,
            f"openai:{server}",
            ray_target="local:2",
            rate=20.0,
            ray_resources={"loadgen": 1},
        )
    )
    for run in (single, spread):
        assert run.status == "complete"
        assert run.requests["error"].isna().all()
    assert len(spread.requests) == len(single.requests) == 24
    assert spread.requests["output_tokens"].sum() == single.requests["output_tokens"].sum()
    assert len(spread.chunks) == len(single.chunks)
    # The same arrival plan (same seed): scheduled times agree to well under a millisecond
    # once both are taken relative to their first request.
    sched = [
        r.requests.sort_values("request_id")["t_scheduled"].to_numpy() for r in (single, spread)
    ]
    plan_a, plan_b = (s - s[0] for s in sched)
    assert np.max(np.abs(plan_a - plan_b)) < 2e6
    for metric in ("ttft", "tpot"):
        a, b = (_per_request(r, metric) for r in (single, spread))
        # The tolerance is the runs' own noise: four standard errors of the difference of
        # two medians (1.2533 sigma / sqrt(n) each), never under 1 ms.
        se = [1.2533 * float(np.std(x, ddof=1)) / np.sqrt(len(x)) for x in (a, b)]
        tol = max(1e-3, 4.0 * float(np.hypot(*se)))
        assert abs(np.median(a) - np.median(b)) < tol, (metric, np.median(a), np.median(b), tol)
    dist = spread.manifest["distributed"]
    assert [a["requests"] for a in dist["actors"]] == [12, 12]
    actors = (
        __import__("pyarrow.parquet", fromlist=["x"])
        .read_table(spread.path / "actors.parquet")
        .to_pandas()
    )
    assert sorted(actors["request_id"]) == sorted(spread.requests["request_id"])
    assert set(actors["actor"]) == {0, 1}
    _assert_placed_as_actors_table(spread)
    # A single-process run has no load actor: its rows leave the columns null.
    assert single.requests["actor"].isna().all() and single.requests["host"].isna().all()
    assert all(a["same_clock"] and a["lost"] is None for a in dist["actors"])
    assert dist["clock_uncertainty_ns"] == 0
    # Placement: what each actor asked for, the nodes that could hold it, and what Ray
    # itself assigned each actor (read inside the actor).
    nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]
    assert dist["placement"] == {
        "resources": {"loadgen": 1.0},
        "rule": "resources",
        "avoided_server": None,
        "eligible_nodes": nodes,
    }
    assert [a["resources"].get("loadgen") for a in dist["actors"]] == [1.0, 1.0]
    assert all(a["node"] in nodes for a in dist["actors"])


def _assert_placed_as_actors_table(run: Any) -> None:
    """Every request row of ``run`` names the actor and host that served it, as
    ``actors.parquet`` and the manifest's actor reports do."""
    req = run.requests
    assert req["actor"].notna().all() and req["host"].notna().all(), req[["actor", "host"]]
    actors = pd.read_parquet(run.path / "actors.parquet").set_index("request_id")
    mine = req.set_index("request_id").loc[actors.index]
    assert len(mine) == len(req)
    assert (mine["actor"].astype(int) == actors["actor"].astype(int)).all()
    assert (mine["host"] == actors["host"]).all()
    hosts = {a["index"]: a["host"] for a in run.manifest["distributed"]["actors"]}
    assert [hosts[int(a)] for a in req["actor"]] == req["host"].tolist()


def test_a_ray_resource_no_node_offers_is_refused_in_one_line_before_any_actor_starts(
    cluster: None,
) -> None:
    import time

    from perfscope.errors import UsageError
    from perfscope.profiler.clock import MonotonicClock
    from perfscope.profiler.distributed import DistributedResult, RayTarget, run_distributed
    from perfscope.profiler.recorder import Recorder

    kept: list[DistributedResult] = []
    started = time.monotonic()
    with pytest.raises(UsageError) as err:
        run_distributed(
            "python:tests.data.engines.ray_engines:steady",
            {},
            [],
            Recorder(MonotonicClock()),
            0,
            RayTarget(None, 1),
            result_out=kept,
            resources={"gpufree": 1},
        )
    # Ray would leave the actors pending for ever; this says why at once. In a run, the
    # run fails with this line and the Ray section records the placement asked for.
    assert time.monotonic() - started < 5
    msg = str(err.value)
    assert "no live node of the cluster offers that" in msg and "\n" not in msg, msg
    assert "gpufree" in msg and "loadgen" in msg and "ray start --resources" in msg
    assert kept[0].actors == [] and kept[0].to_dict()["placement"]["resources"] == {"gpufree": 1}


def test_ray_resources_are_read_as_name_amount_pairs_or_refused_in_one_line() -> None:
    from perfscope.errors import UsageError
    from perfscope.profiler.distributed import parse_ray_resources

    assert parse_ray_resources("loadgen=1, CPU=0.5") == {"loadgen": 1.0, "CPU": 0.5}
    assert parse_ray_resources("node:10.0.0.5=0.01") == {"node:10.0.0.5": 0.01}
    # The placement rule rides along as an entry of its own.
    assert parse_ray_resources("loadgen=1,not-server") == {"loadgen": 1.0, "not-server": 1.0}
    for bad, says in (
        ("loadgen", "write NAME=AMOUNT"),
        ("loadgen=0", "must be a positive amount"),
        ("loadgen=1.5", "whole above 1"),
        ("loadgen=x", "must be a positive amount"),
        ("a=1,a=2", "given twice"),
        ("9x=1", "not a Ray resource name"),
    ):
        with pytest.raises(UsageError, match=says) as err:
            parse_ray_resources(bad)
        assert "\n" not in str(err.value)


def test_not_server_keeps_actors_off_the_servers_machine_or_refuses_in_one_line(
    cluster: None, server: str
) -> None:
    """The one local node is the server's machine (the server is on loopback): the rule
    refuses at once, naming it; a server elsewhere leaves that node eligible; an engine
    without a server has nothing to keep off."""
    import time

    from perfscope.errors import UsageError
    from perfscope.profiler.clock import MonotonicClock
    from perfscope.profiler.distributed import (
        DistributedResult,
        RayTarget,
        off_server_nodes,
        run_distributed,
    )
    from perfscope.profiler.distributed.target import _local_addresses
    from perfscope.profiler.recorder import Recorder

    nodes = ray.nodes()
    here = _local_addresses()
    (node,) = [n for n in nodes if n["Alive"]]
    assert off_server_nodes(nodes, {"127.0.0.1"}, here) == ([], [node])
    assert off_server_nodes(nodes, {"203.0.113.7"}, here) == ([node], [])  # TEST-NET-3
    for engine, says in (
        (f"openai:{server}", "no live node off the server's machine (127.0.0.1)"),
        ("python:tests.data.engines.ray_engines:steady", "names no server"),
    ):
        kept: list[DistributedResult] = []
        started = time.monotonic()
        with pytest.raises(UsageError, match=re.escape(says)) as err:
            run_distributed(
                engine,
                {},
                [],
                Recorder(MonotonicClock()),
                0,
                RayTarget(None, 1),
                result_out=kept,
                resources={"not-server": 1.0},
            )
        assert time.monotonic() - started < 5 and "\n" not in str(err.value)
        assert kept[0].actors == [] and kept[0].resources == {}


def _per_request(run: object, metric: str) -> np.ndarray:
    r = run.requests  # type: ignore[attr-defined]
    if metric == "ttft":
        return ((r["t_first_token"] - r["t_sent"]) / 1e9).to_numpy()
    return ((r["t_last_token"] - r["t_first_token"]) / (r["output_tokens"] - 1) / 1e9).to_numpy()


def test_merged_stamps_agree_with_the_servers_own_write_times(
    cluster: None, server: str, tmp_path: Path
) -> None:
    n = 24
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"id=ray{i} words"}) + "\n" for i in range(n)))
    server_log(server)  # clear
    path = _run(
        tmp_path,
        f"openai:{server}",
        ray_target="local:2",
        concurrency=4,
        requests=n,
        prompts=prompts,
    )
    log = server_log(server)
    run = read_run(path)
    dist = run.manifest["distributed"]
    origin = dist["origin_perf_counter_ns"]
    actor_of = dict(zip(run.requests["request_id"], range(n), strict=False))
    per_actor: dict[int, list[float]] = {0: [], 1: []}
    for rid, g in run.chunks.sort_values(["request_id", "t"]).groupby("request_id"):
        writes = np.asarray(log[f"ray{rid}"]["writes"], dtype=np.int64)
        stamps = g["t"].to_numpy() + origin  # back to raw perf_counter_ns
        assert len(stamps) == len(writes)
        err_ms = (stamps - writes) / 1e6
        # Aligned records can never show a chunk before the server wrote it.
        assert err_ms.min() > -0.5, (rid, err_ms)
        per_actor[int(rid) % 2].extend(err_ms.tolist())
    assert actor_of  # every request stored
    medians = {a: float(np.median(v)) for a, v in per_actor.items()}
    # The receive stamps are a fraction of a millisecond after the writes for both actors.
    assert all(m < 2.0 for m in medians.values()), medians
    assert abs(medians[0] - medians[1]) < 1.0, medians


def test_a_sigkilled_actor_loses_only_its_in_flight_requests_and_the_run_reads_partial(
    cluster: None, tmp_path: Path
) -> None:
    from perfscope.api.index import open_index
    from tests.data.engines.ray_engines import FINISH_LOG_ENV, KILL_AT

    log = Path(os.environ[FINISH_LOG_ENV])
    log.unlink(missing_ok=True)
    outcome = _execute(
        tmp_path,
        "python:tests.data.engines.ray_engines:dies_at",
        ray_target="local:2",
        rate=10.0,
        requests=40,
        output_len=8,
    )
    assert (outcome.status, outcome.exit_code) == ("partial", 4)
    run = read_run(outcome.path)
    assert run.manifest["status"] == "partial" and run.state.state == "partial"
    dist = run.manifest["distributed"]
    lost = [a for a in dist["actors"] if a["lost"]]
    assert len(lost) == 1 and dist["partial"] is True, dist
    req = run.requests
    # Nothing vanished: every planned request is in the table, finished or failed with why.
    assert len(req) == 40
    actors = pd.read_parquet(run.path / "actors.parquet")
    share = set(actors.loc[actors["actor"] == lost[0]["index"], "request_id"])
    assert KILL_AT in share and len(share) == 20
    failed = req[req["error"].notna()]
    # Each row names its actor, the lost actor's failed ones included.
    _assert_placed_as_actors_table(run)
    assert set(req.loc[req["actor"] == lost[0]["index"], "request_id"]) == share
    # The requests the lost actor finished before the kill were kept (the engine's own log
    # is the truth); what it had in flight or never sent failed.
    notes = dict(line.split() for line in log.read_text().splitlines())
    t_kill = float(notes.pop("kill"))
    finished = {int(rid): float(t) for rid, t in notes.items()}
    kept = set(req.loc[req["error"].isna(), "request_id"]) & share
    assert kept <= set(finished) & share and KILL_AT not in kept
    # Pushed as they finish, each push acknowledged: nothing the actor finished 0.1 s
    # before its death is lost (collected by a 0.2 s poll, up to three were).
    settled = {rid for rid, t in finished.items() if rid in share and t < t_kill - 0.1}
    assert settled and settled <= kept, (sorted(settled - kept), t_kill)
    assert set(failed["request_id"]) == share - kept
    assert lost[0]["completed"] == len(kept)
    loss = dist["loss"]
    assert loss["lost_actors"] == 1 and loss["unfinished"] == 0
    assert loss["in_flight"] + loss["never_sent"] == len(failed) == 20 - len(kept)
    assert loss["in_flight"] >= 1  # the request that killed it, at least, was in flight
    assert failed["error"].str.contains("load actor").all(), failed["error"].tolist()
    assert any(
        w.startswith("partial run: 1 of 2 load actors were lost") for w in run.summary["warnings"]
    )
    with open_index(tmp_path) as index:
        _, rows = index.query(
            "SELECT state, status, ray_actors, ray_lost_actors, ray_lost_in_flight, "
            "ray_never_sent FROM runs"
        )
    assert rows == [("partial", "partial", 2, 1, loss["in_flight"], loss["never_sent"])]
    # The dashboard's runs table says partial too (from the index, and from a scan).
    from perfscope.dashboard.app.data import RunRepository
    from perfscope.dashboard.app.pages.runs import _state

    (row,) = RunRepository(tmp_path).rows()
    assert (row.state, row.status, _state(row)) == ("partial", "partial", "partial")
    assert row.problem is not None and "load actor" in row.problem
    scanned = RunRepository(tmp_path).row(outcome.path.name)
    assert (scanned.state, scanned.status) == ("partial", "partial")


def test_a_partial_ray_run_fails_the_perfscope_fixture_and_api_with_its_status(
    cluster: None, tmp_path: Path
) -> None:
    """What a pytest test sees (the ``perfscope`` fixture's ``run`` is ``perfscope.run``):
    the run is not returned as a success; the error names the status and the stored run."""
    import perfscope
    from perfscope.errors import EngineError

    with pytest.raises(EngineError, match=r"partial: .*load actor") as caught:
        perfscope.run(
            "python:tests.data.engines.ray_engines:dies_at",
            ray="local:2",
            requests=30,
            rate=10.0,
            prompt_len=8,
            output_len=8,
            warmup=0,
            telemetry=False,
            server_metrics=None,
            runs_dir=tmp_path,
        )
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert str(path) in str(caught.value)
    assert read_run(path).manifest["status"] == "partial"


# --- telemetry agents, one per node ---------------------------------------------------------


def test_a_ray_run_samples_every_node_through_an_agent_and_aligns_its_clock(
    cluster: None, tmp_path: Path
) -> None:
    from tests.data.ray_fake_nvml import POWER_W

    path = _run(
        tmp_path,
        "python:tests.data.engines.ray_engines:steady",
        ray_target="local:2",
        telemetry=TelemetryConfig(interval_s=0.05, baseline_s=0.3),
        rate=20.0,
        requests=24,
        output_len=8,
    )
    run = read_run(path)
    assert run.status == "complete"
    tele = run.telemetry
    node = ray.nodes()[0]["NodeManagerHostname"]
    assert set(tele["node"]) == {node}
    assert set(tele["device"]) == {"gpu0", "cpu"}
    info = run.manifest["telemetry"]
    assert info["backend"] == "ray" and info["driver_node"] == node
    agent = info["nodes"][node]["agent"]
    assert agent["same_clock"] and agent["lost"] is None and agent["rows"] == len(tele)
    # The scripted GPU reads the agent's own raw perf_counter_ns as its temperature: each
    # merged row, put back on the raw clock, sits within the sampling round that read it.
    # A round is shorter than the sampling interval (50 ms) unless the machine stalls the
    # agent; a wrong alignment would be off by a clock origin (seconds), not milliseconds.
    gpu = tele[tele["device"] == "gpu0"]
    origin = run.manifest["clock_origin_perf_counter_ns"]
    skew_ms = (gpu["t"].to_numpy() + origin - gpu["temp_c"].to_numpy()) / 1e6
    assert np.median(np.abs(skew_ms)) < 20.0, skew_ms
    assert np.abs(skew_ms).max() < 50.0, skew_ms
    # Samples cover the measured window (the idle baseline before, a last sample after).
    req = run.requests
    assert gpu["t"].min() < req["t_sent"].min() and gpu["t"].max() > req["t_last_token"].max()
    energy = run.summary["energy"]
    assert energy["available"] and energy["source"] == "gpu"
    window = energy["window_s"]
    assert energy["total_j"] == pytest.approx(POWER_W * window, rel=0.03)
    assert energy["j_per_output_token"] == pytest.approx(
        energy["total_j"] / req["output_tokens"].sum(), rel=1e-9
    )
    assert energy["cluster"]["energy_j"] == pytest.approx(energy["total_j"])
    assert energy["nodes"][node]["power_source"] == "gpu"
    assert energy["cluster"]["nodes_without_power"] == []
    assert any("cluster total of 1 of 1 nodes" in n for n in energy["notes"]), energy["notes"]
    # The trace export keeps each node's devices apart.
    from perfscope.dashboard.exporters import perfetto_trace

    devices = perfetto_trace(run)["otherData"]["telemetry_devices"]
    assert devices == [f"{node}/cpu", f"{node}/gpu0"]


@pytest.mark.parametrize("names", [["node-a"], ["node-a", "node-b"]])
def test_node_agents_merge_into_one_table_and_a_cluster_total(
    cluster: None, names: list[str]
) -> None:
    """The per-node path with the node list given: a local cluster has one node, so each
    named "node" is an agent pinned to it (its own process, sampler and clock exchange)."""
    import time

    import pyarrow as pa

    from perfscope.analysis.energy import energy_section
    from perfscope.profiler.cluster_telemetry import ClusterTelemetry, NodeTarget
    from tests.data.ray_fake_nvml import POWER_W

    real = ray.nodes()[0]["NodeID"]
    origin = time.perf_counter_ns()
    tele = ClusterTelemetry(
        ray,
        TelemetryConfig(interval_s=0.05, baseline_s=0.0, cpu=False),
        origin,
        nodes=[NodeTarget(real, n) for n in names],
        poll_interval_s=0.2,
    ).start()
    increments = []
    t_end = time.monotonic() + 1.5
    while time.monotonic() < t_end:
        time.sleep(0.3)
        increments.append(tele.take_new())
    merged = tele.stop()
    increments.append(tele.take_new())
    streamed = pa.concat_tables(increments)
    # Everything the agents sent reached the flusher's increments once, and nothing else.
    assert streamed.num_rows == merged.num_rows
    assert sorted(streamed.column("t").to_pylist()) == sorted(merged.column("t").to_pylist())
    frame = merged.to_pandas()
    assert sorted(set(frame["node"])) == names
    info = tele.manifest_info()
    assert sorted(info["nodes"]) == names and info["devices"] == [f"{n}/gpu0" for n in names]
    # A synthetic request over the span every node sampled: the cluster total is every
    # node's GPU.
    span = frame.groupby("node")["t"].agg(["min", "max"])
    w0, w1 = int(span["min"].max()) + 100_000_000, int(span["max"].min()) - 100_000_000
    assert w1 - w0 > 500_000_000, span
    requests = pd.DataFrame(
        {
            "request_id": [0],
            "t_sent": [w0],
            "t_first_token": [w0],
            "t_last_token": [w1],
            "output_tokens": [10],
            "prompt_tokens": [8],
            "is_warmup": [False],
            "error": [None],
        }
    )
    sec = energy_section(frame, pd.DataFrame(), requests, pd.DataFrame(), info)
    window_s = (w1 - w0) / 1e9
    assert sec.total_j == pytest.approx(len(names) * POWER_W * window_s, rel=0.03)
    assert sec.j_per_output_token == pytest.approx(sec.total_j / 10)
    assert sorted(sec.nodes) == names
    for n in names:
        assert sec.nodes[n].energy_j == pytest.approx(POWER_W * window_s, rel=0.03)
    assert sec.cluster.energy_j == pytest.approx(sec.total_j)


def test_a_lost_telemetry_agent_is_reported_and_its_samples_are_kept(cluster: None) -> None:
    import signal
    import time

    from perfscope.profiler.cluster_telemetry import ClusterTelemetry, NodeTarget

    real = ray.nodes()[0]["NodeID"]
    tele = ClusterTelemetry(
        ray,
        TelemetryConfig(interval_s=0.05, baseline_s=0.0, cpu=False),
        time.perf_counter_ns(),
        nodes=[NodeTarget(real, "node-a"), NodeTarget(real, "node-b")],
        poll_interval_s=0.2,
    ).start()
    # Kill node-b's agent once the driver has received some of its samples (the first
    # poll of a fresh actor can take a second on a loaded machine).
    deadline = time.monotonic() + 30
    while tele.manifest_info()["nodes"]["node-b"]["agent"]["rows"] < 5:
        assert time.monotonic() < deadline, "node-b's agent sent no samples in 30 s"
        time.sleep(0.1)
    agent_b = tele.manifest_info()["nodes"]["node-b"]["agent"]
    os.kill(agent_b["pid"], signal.SIGKILL)
    time.sleep(1.0)
    frame = tele.stop().to_pandas()
    info = tele.manifest_info()
    assert info["nodes"]["node-b"]["agent"]["lost"].startswith("telemetry agent on node node-b")
    assert info["nodes"]["node-a"]["agent"]["lost"] is None
    assert any("node-b lost" in e for e in info["errors"]), info["errors"]
    rows = frame.groupby("node")["t"].agg(["count", "max"])
    # What node-b sent before it died stays; node-a kept sampling after.
    assert rows.loc["node-b", "count"] >= agent_b["rows"] >= 5
    assert rows.loc["node-a", "max"] > rows.loc["node-b", "max"] + 0.5e9
    from perfscope.analysis.summary import run_warnings

    warned = run_warnings({"telemetry": info})
    assert len(warned) == 1 and warned[0].startswith("1 of 2 telemetry agents were lost")


# --- autoscale --------------------------------------------------------------------------------


def _hog_run(tmp_path: Path, autoscale: int | None, requests: int = 48) -> Any:
    return read_run(
        _run(
            tmp_path,
            "python:tests.data.engines.ray_engines:gil_hog_on_even",
            ray_target="local:2",
            autoscale=autoscale,
            rate=6.0,
            requests=requests,
            output_len=3,
        )
    )


def test_a_lagging_actor_gets_a_new_actor_for_its_requests_not_yet_sent(
    cluster: None, tmp_path: Path
) -> None:
    # 16 s of schedule: beside two busy loops a new actor took 9 s to start, and only the
    # requests planned after that can move.
    run = _hog_run(tmp_path, autoscale=4, requests=96)
    assert run.status == "complete"
    req = run.requests
    assert len(req) == 96 and req["error"].isna().all()
    dist = run.manifest["distributed"]
    auto = dist["autoscale"]
    assert auto["enabled"] and auto["max_actors"] == 4
    # Actor 0 serves the even requests, whose tokens hold its GIL: its lag crosses the
    # threshold. (On a loaded machine actor 1 may cross it too; the cap leaves room.)
    mine = [d for d in auto["decisions"] if d["actor"] == 0]
    assert mine and mine[0]["action"] == "added", auto["decisions"]
    d = mine[0]
    j = d["new_actor"]
    assert j == d["actors_before"] >= 2 and d["actors_after"] == j + 1
    assert d["moved_requests"] > 0 and d["start_s"] > 0
    assert dist["actors"][j]["added_at_s"] >= d["t_s"] + d["start_s"] * 0.9
    assert d["lag_p99_s"] > d["threshold_s"] >= 1e-3
    assert 3 <= len(dist["actors"]) <= 4 and dist["actors"][j]["added_at_s"] is not None
    actors = (
        __import__("pyarrow.parquet", fromlist=["x"])
        .read_table(run.path / "actors.parquet")
        .to_pandas()
    )
    # Every request was served once, and the new actor's are actor 0's (even) ones.
    assert sorted(actors["request_id"]) == list(range(96))
    moved = actors[actors["actor"] == j]["request_id"]
    assert 0 < len(moved) <= d["moved_requests"] and (moved % 2 == 0).all()
    _assert_placed_as_actors_table(run)  # a moved request names the actor that served it
    # They were planned after the decision: none was sent before the new actor existed.
    sent = req.set_index("request_id").loc[moved.to_list(), "t_sent"] / 1e9
    assert (sent > dist["actors"][j]["added_at_s"]).all()
    assert any(f"--ray-autoscale added actor {j}" in w for w in run.summary["warnings"])


@pytest.mark.parametrize(("autoscale", "action"), [(None, "warned"), (2, "at cap")])
def test_a_lagging_actor_without_room_to_grow_is_a_warning_and_no_actor_is_added(
    cluster: None, tmp_path: Path, autoscale: int | None, action: str
) -> None:
    run = _hog_run(tmp_path, autoscale=autoscale)
    assert run.requests["error"].isna().all()
    dist = run.manifest["distributed"]
    assert len(dist["actors"]) == 2
    decisions = dist["autoscale"]["decisions"]
    assert any(d["actor"] == 0 and d["action"] == action for d in decisions), decisions
    assert all(d["actors_after"] == 2 and d["new_actor"] is None for d in decisions)
    warned = [w for w in run.summary["warnings"] if "load actor 0's event-loop lag" in w]
    hint = "--ray-autoscale MAX" if autoscale is None else "cap of 2 actors was reached"
    assert warned and hint in warned[0], run.summary["warnings"]


# --- the CLI's private cluster: signals, SIGKILL, beside a `ray start` cluster ---------------


def _cluster_procs(tmp: str) -> list[int]:
    """Processes of the Ray cluster kept in ``tmp`` (named on their command line or logging
    into it)."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                hit = tmp.encode() in f.read()
            hit = hit or any(os.readlink(f"/proc/{p}/fd/{fd}").startswith(tmp) for fd in "12")
        except OSError:
            continue
        if hit:
            found.append(int(p))
    return found


def _listening_addresses(pids: set[int]) -> set[str]:
    """The local addresses the TCP sockets of ``pids`` listen on."""
    import psutil

    out: set[str] = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for c in psutil.Process(pid).net_connections("tcp"):
                if c.status == psutil.CONN_LISTEN:
                    out.add(c.laddr.ip)
    return out


def _start_cli_run(tmp_path: Path, *extra: str) -> tuple[Any, str]:
    """``perfscope run --ray`` (two actors) in a subprocess, once its load actor serves; returns
    the process and its private cluster's temp dir."""
    import subprocess
    import sys
    import time

    from perfscope.profiler.distributed import PRIVATE_DIR_PREFIX

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perfscope",
            "run",
            "python:tests.data.engines.ray_engines:steady",
            "--requests",
            "400",
            "--rate",
            "4",
            "--ray",
            *extra,
            "--runs-dir",
            str(tmp_path),
            "--no-progress",
            "--no-telemetry",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr.txt").open("w"),  # a pipe nobody reads could fill
        text=True,
    )
    deadline = time.monotonic() + 240
    tmp = None
    while time.monotonic() < deadline and proc.poll() is None:
        dirs = [d for d in os.listdir("/tmp") if d.startswith(f"{PRIVATE_DIR_PREFIX}{proc.pid}-")]
        tmp = f"/tmp/{dirs[0]}" if dirs else None
        runs = list(tmp_path.glob("*/segments"))
        if tmp and runs and any(f.stat().st_size for f in runs[0].iterdir()):
            break  # the cluster is up and requests are being flushed
        time.sleep(0.5)
    if proc.poll() is not None or tmp is None:
        proc.kill()  # never leave it running behind a failed test
        proc.wait()
        raise AssertionError(
            f"the run did not start serving: {(tmp_path / 'stderr.txt').read_text()}"
        )
    time.sleep(2.0)  # a few more requests finish
    return proc, tmp


def _gone_within(tmp: str, seconds: float) -> list[int]:
    import time

    deadline = time.monotonic() + seconds
    while (left := _cluster_procs(tmp)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signalled_ray_run_keeps_its_ray_records_and_names_the_signal(
    tmp_path: Path, sig: str
) -> None:
    import signal

    proc, tmp = _start_cli_run(tmp_path)
    proc.send_signal(getattr(signal, sig))
    assert proc.wait(timeout=240) == 1
    run = read_run(next(p for p in tmp_path.iterdir() if p.is_dir()))
    assert run.manifest["status"] == "interrupted", (tmp_path / "stderr.txt").read_text()
    named = "SIGTERM" if sig == "SIGTERM" else "Ctrl-C"
    assert any(named in e for e in run.manifest["errors"]), run.manifest["errors"]
    dist = run.manifest["distributed"]
    assert dist["backend"] == "ray" and len(dist["actors"]) == 2  # bare --ray: two actors
    assert dist["loss"]["unfinished"] > 0
    actors = pd.read_parquet(run.path / "actors.parquet")
    assert set(actors["request_id"]) == set(run.requests["request_id"])
    _assert_placed_as_actors_table(run)  # the unfinished ones too
    assert run.requests["error"].isna().sum() >= 1  # what finished before the signal is kept
    assert _gone_within(tmp, 5.0) == []


def test_a_sigkilled_driver_leaves_no_ray_process_after_5_s(tmp_path: Path) -> None:
    import signal
    import time

    proc, tmp = _start_cli_run(tmp_path)
    assert _cluster_procs(tmp)
    # The private cluster listens on loopback only (Ray bound every interface before).
    listening = _listening_addresses({proc.pid, *_cluster_procs(tmp)})
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    t_killed = time.monotonic()
    left = _gone_within(tmp, 5.0)
    assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]
    while os.path.exists(tmp) and time.monotonic() - t_killed < 5.0:
        time.sleep(0.1)
    assert not os.path.exists(tmp)  # the reaper removed the cluster's temp dir too
    # No actors.parquet: the requests read from the segments name their actor and host.
    import socket

    run = read_run(next(p for p in tmp_path.iterdir() if p.is_dir()))
    assert run.state.state == "crashed" and "requests" in run.from_segments
    assert not (run.path / "actors.parquet").exists()
    req = run.requests
    assert len(req) > 0 and set(req["actor"].astype(int)) <= {0, 1}, req[["actor", "host"]]
    assert (req["host"] == socket.gethostname()).all()


def _steady_run(runs: Path, ray: str, env: dict[str, str], **more_env: str) -> Any:
    """``perfscope run`` of four steady requests with ``--ray RAY`` (bare when empty), to
    its end."""
    import subprocess
    import sys

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "perfscope",
            "run",
            "python:tests.data.engines.ray_engines:steady",
            *("--requests", "4", "--rate", "4", "--ray", *([ray] if ray else [])),
            *("--runs-dir", str(runs), "--no-progress", "--no-telemetry"),
        ],
        env={**env, **more_env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_bare_ray_starts_a_private_cluster_beside_a_ray_start_cluster_and_joins_it_by_address(
    tmp_path: Path,
) -> None:
    import shutil
    import signal
    import socket
    import subprocess
    import sys
    import tempfile

    theirs = tempfile.mkdtemp(prefix="perfscope-test-raystart-", dir="/tmp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    head = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",  # the `ray` command, from this interpreter's Ray
        "start",
        "--head",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={theirs}",
        "--num-cpus=1",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    try:
        subprocess.run(head, env=env, check=True, capture_output=True, timeout=240)
        # The worst case: this shell points Ray at the other cluster.
        env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        done = _steady_run(tmp_path, "", env)
        assert done.returncode == 0, done.stderr
        run = read_run(next(p for p in tmp_path.iterdir() if p.is_dir()))
        dist = run.manifest["distributed"]
        assert dist["address"] is None and len(dist["actors"]) == 2
        assert run.requests["error"].isna().all() and len(run.requests) == 4
        assert _cluster_procs(theirs), "the ray start cluster must still run"
        # Joining that cluster works too, with the token its head made (Ray 2.60 heads
        # require one; RAY_AUTH_MODE=token reads ~/.ray/auth_token, as docs/scale.md says).
        joined = _steady_run(tmp_path / "joined", f"127.0.0.1:{port}#1", env, RAY_AUTH_MODE="token")
        assert joined.returncode == 0, joined.stderr[-2000:]
        run = read_run(next((tmp_path / "joined").iterdir()))
        dist = run.manifest["distributed"]
        assert dist["address"] == f"127.0.0.1:{port}" and len(dist["actors"]) == 1
        assert run.requests["error"].isna().all() and len(run.requests) == 4
    finally:
        for pid in _cluster_procs(theirs):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(theirs, ignore_errors=True)


def test_bare_ray_means_a_private_cluster_and_a_refused_join_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from perfscope.profiler.distributed import RayTarget, _connect_error, parse_ray_target

    assert parse_ray_target("local") == parse_ray_target(None) == RayTarget(None, 2)
    assert parse_ray_target("auto#3") == RayTarget("auto", 3)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    for text in ("UNAUTHENTICATED: bad token", "Failed to connect to GCS within 60 seconds"):
        msg = _connect_error(RayTarget("10.0.0.9:6379", 2), RuntimeError(text + "\nmore"))
        assert msg.startswith("--ray: cannot reach 10.0.0.9:6379: ") and "\n" not in msg
        assert "RAY_AUTH_MODE=token" in msg
