"""``--ray``: load generation from Ray actors on a local cluster, merged into one run.

The cluster is real (Ray worker processes on this machine); the server is the scripted SSE
server, whose own log of when it wrote each chunk is the truth for the clock merge.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from perfscope._runner import RunOptions, execute_run
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
def cluster() -> Iterator[None]:
    """One local Ray cluster for the module (starting one takes 10-30 s here)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with scripted_server("--ttft", "0.03", "--itl", "0.01") as url:
        yield url


def _run(tmp_path: Path, engine: str, *, ray_target: str | None, **work: object) -> Path:
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
        telemetry=TelemetryConfig(enabled=False),
    )
    return execute_run(opts).path


def test_a_ray_run_measures_what_a_single_process_run_measures(
    cluster: None, server: str, tmp_path: Path
) -> None:
    single = read_run(_run(tmp_path, f"openai:{server}", ray_target=None, rate=20.0))
    spread = read_run(_run(tmp_path, f"openai:{server}", ray_target="local:2", rate=20.0))
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
        assert abs(np.median(a) - np.median(b)) < 3e-3, (metric, np.median(a), np.median(b))
    dist = spread.manifest["distributed"]
    assert [a["requests"] for a in dist["actors"]] == [12, 12]
    actors = (
        __import__("pyarrow.parquet", fromlist=["x"])
        .read_table(spread.path / "actors.parquet")
        .to_pandas()
    )
    assert sorted(actors["request_id"]) == sorted(spread.requests["request_id"])
    assert set(actors["actor"]) == {0, 1}
    assert all(a["same_clock"] and a["lost"] is None for a in dist["actors"])
    assert dist["clock_uncertainty_ns"] == 0


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


def test_a_killed_actor_is_reported_and_its_finished_requests_are_kept(
    cluster: None, tmp_path: Path
) -> None:
    path = _run(
        tmp_path,
        "python:tests.data.engines.ray_engines:dies_at",
        ray_target="local:2",
        rate=10.0,
        requests=40,
        output_len=8,
    )
    run = read_run(path)
    dist = run.manifest["distributed"]
    lost = [a for a in dist["actors"] if a["lost"]]
    assert len(lost) == 1, dist
    assert "lost" in " ".join(run.manifest["errors"])
    req = run.requests
    # Nothing vanished: every planned request is in the table, finished or failed with why.
    assert len(req) == 40
    failed = req[req["error"].notna()]
    assert failed["error"].str.contains("load actor").all(), failed["error"].tolist()
    # The lost actor's requests that finished well before the kill were kept.
    kept = lost[0]["completed"]
    assert kept >= 3, lost[0]
    assert any(
        w.startswith("partial run: 1 of 2 load actors were lost") for w in run.summary["warnings"]
    )
    assert len(req[req["error"].isna()]) == 40 - len(failed) >= 20 + kept - 1
