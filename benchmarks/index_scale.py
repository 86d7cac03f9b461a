"""How fast the run index answers over many runs (issue: an index over thousands of runs).

Builds N real run directories (one real run's manifest.json, summary.json and Parquet tables,
with varied metrics and states: the index reads every table's footer on a first build), then
measures:

- the first index build (every run read),
- a refresh that finds nothing changed plus one query (what ``perfscope query`` does),
- the same after 1% of the runs changed,
- ``perfscope query`` and ``perfscope ls --where`` end to end as subprocesses (includes Python
  start-up and imports),
- the dashboard's runs-list data (``RunRepository.rows()`` and each row's table record) read
  from the index against the fallback scan (duckdb hidden), on a fresh repository (the first
  page load after the dashboard starts) and on a warm one (every later load or poll).

- the dashboard's runs page under ``--clients`` concurrent clients (a real server on
  127.0.0.1 in its own process; each client opens the runs page, then polls it and turns
  to another page, ``--client-rounds`` times): the latency of every request, p50 and p95.

Run: ``python benchmarks/index_scale.py [--runs 10000] [--repeat 5]``. Prints medians.
``--only dashboard --code /path/to/other/checkout`` serves the dashboard from another
checkout (for before/after timings taken side by side). ``--only compare --code OTHER
--root DIR`` times the first build (in-process, a fresh interpreter each time, its worker
processes included), ``perfscope query`` and ``perfscope ls --limit 5`` from this checkout
and from OTHER alternately (ABBA order), with the load average beside each median, and
checks that both checkouts' indexes hold the same rows.

Before/after numbers at 2,000 and 10,000 runs, taken interleaved with the load beside them,
are in docs/scale.md ("The run index"; the first build's latest, "First build under 5 s":
3.89 s before, 2.63 s after, medians of six each alternately at load 3.0-3.5 on 2 cores).
Every run's tables are files of their own (copies of one real run's), so a first build opens
and reads every footer as it would on real runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_runs(root: Path, n: int, seed: int = 0) -> None:
    """``n`` real run folders: each a copy of one real run (manifest.json, summary.json and
    its Parquet tables, which the index reads footers of), with varied metrics and states.

    Every file is a copy of its own (its own inode and pages, as real runs have; hard links
    would let one footer read serve every run from the page cache).
    """

    from tests.data.runs.builders import manual_run

    template = manual_run(root / "_template", name="tmpl", n_requests=6)
    manifest = json.loads((template / "manifest.json").read_text())
    summary = json.loads((template / "summary.json").read_text())
    tables = sorted(p for p in template.iterdir() if p.suffix == ".parquet")
    rng = random.Random(seed)
    kinds = ["reference", "openai", "hf", "python"]
    states = ["complete"] * 17 + ["failed", "interrupted", "running"]
    for i in range(n):
        run_id = f"20261201-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-bench-{i:05x}"
        d = root / run_id
        d.mkdir()
        for t in tables:
            shutil.copyfile(t, d / t.name)
        manifest["run_id"] = run_id
        manifest["status"] = rng.choice(states)
        manifest["engine"]["kind"] = rng.choice(kinds)
        manifest["started_at"] = f"2026-12-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        summary["latency"]["ttft"]["p99"] = rng.lognormvariate(-2, 1)
        summary["throughput"]["output_tok_s"] = rng.uniform(10, 5000)
        (d / "manifest.json").write_text(json.dumps(manifest))
        (d / "summary.json").write_text(json.dumps(summary))
    shutil.rmtree(root / "_template")


def _timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--root", type=Path, default=None, help="keep the runs here (made once, reused)"
    )
    ap.add_argument("--skip-scan", action="store_true", help="skip the dashboard scan timing")
    ap.add_argument("--clients", type=int, default=20, help="concurrent dashboard clients")
    ap.add_argument("--client-rounds", type=int, default=3, help="page opens per client")
    ap.add_argument(
        "--client-gap", type=float, default=2.0, help="s between a client's rounds (its poll)"
    )
    ap.add_argument(
        "--only", choices=("all", "dashboard", "compare"), default="all", help="run only one part"
    )
    ap.add_argument(
        "--code", type=Path, default=None, help="serve the dashboard from this checkout"
    )
    args = ap.parse_args()
    if args.only == "dashboard":
        if args.root is None:
            ap.error("--only dashboard needs --root (a folder of runs)")
        dashboard_clients(args.root, args.clients, args.client_rounds, args.code, args.client_gap)
        return
    if args.only == "compare":
        if args.root is None or args.code is None:
            ap.error("--only compare needs --root (a folder of runs) and --code (a checkout)")
        args.root.mkdir(parents=True, exist_ok=True)
        if not any(p.is_dir() for p in args.root.iterdir()):
            make_runs(args.root, args.runs)
        compare_checkouts(args.root, args.code, args.repeat)
        return

    from perfscope.api.index import open_index

    sql = (
        "SELECT engine_kind, count(*), median(ttft_p99_s), max(output_tok_s) FROM runs "
        "WHERE state = 'complete' GROUP BY 1 ORDER BY 1"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        if not any(p.is_dir() for p in root.iterdir()):
            t_make = _timed(lambda: make_runs(root, args.runs))
            print(f"made {args.runs} runs in {t_make:.1f} s")
        (root / ".perfscope-index.duckdb").unlink(missing_ok=True)

        def build() -> None:
            with open_index(root, rebuild=True):
                pass

        t_build = _timed(build)
        print(f"first build (all runs read):          {t_build:.2f} s")

        def refresh_and_query() -> None:
            with open_index(root) as index:
                index.query(sql)

        times = [_timed(refresh_and_query) for _ in range(args.repeat)]
        print(f"refresh (nothing changed) + query:    median {statistics.median(times):.3f} s")

        runs = sorted(p for p in root.iterdir() if p.is_dir())
        times = []
        for _ in range(args.repeat):
            for p in random.sample(runs, max(1, len(runs) // 100)):
                s = json.loads((p / "summary.json").read_text())
                s["latency"]["ttft"]["p99"] = random.random()
                (p / "summary.json").write_text(json.dumps(s))
            times.append(_timed(refresh_and_query))
        print(f"refresh (1% changed) + query:         median {statistics.median(times):.3f} s")

        exe = [sys.executable, "-m", "perfscope"]
        for label, argv in (
            ("perfscope query (subprocess)", ["query", sql]),
            ("perfscope ls --where (subprocess)", ["ls", "--where", "ttft_p99_s > 0.5"]),
            ("perfscope ls --limit 5 (subprocess)", ["ls", "--limit", "5"]),
            ("perfscope --version (start-up only)", ["--version"]),
        ):
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                subprocess.run(
                    [*exe, *argv, *(["--runs-dir", str(root)] if argv[0] != "--version" else [])],
                    check=True,
                    capture_output=True,
                )
                times.append(time.perf_counter() - t0)
            print(f"{label + ':':38s}median {statistics.median(times):.3f} s")

        dashboard_list(root, args.repeat, ("index",) if args.skip_scan else ("index", "scan"))
        dashboard_clients(root, args.clients, args.client_rounds, args.code, args.client_gap)


#: Imports ``perfscope`` from the checkout ``$PERFSCOPE_CODE`` (folders mapped as setup.py
#: maps them): a ``sitecustomize`` on ``PYTHONPATH``, so the index's worker processes
#: (``python -m perfscope.profiler.run_index``) run that checkout's code too.
_SITECUSTOMIZE = """
import importlib.abc, importlib.util, os, sys
code = os.environ.get("PERFSCOPE_CODE")
if code:
    dirs = {"perfscope": "perfscope", "perfscope.profiler": "profiler", "perfscope.hwdb": "hwdb",
            "perfscope.analysis": "analysis", "perfscope.dashboard": "dashboard"}

    class Checkout(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name in dirs:
                init = f"{code}/{dirs[name]}/__init__.py"
                return importlib.util.spec_from_file_location(
                    name, init, submodule_search_locations=[f"{code}/{dirs[name]}"])
            return None

    sys.meta_path.insert(0, Checkout())
"""

#: One first build in a fresh interpreter: prints its seconds, then the rows it holds
#: pickled to ``argv[2]``.
_FIRST_BUILD = r"""
import pickle, sys, time
from pathlib import Path
root = Path(sys.argv[1])
(root / ".perfscope-index.duckdb").unlink(missing_ok=True)
from perfscope.api.index import open_index
t0 = time.perf_counter()
with open_index(root, rebuild=True) as index:
    took = time.perf_counter() - t0
    _, rows = index.query("SELECT * FROM runs ORDER BY run_id")
print(took)
with open(sys.argv[2], "wb") as fh:
    pickle.dump(rows, fh)
"""


def _checkout_env(tmp: str, code: Path) -> dict[str, str]:
    """An environment whose Python processes import ``perfscope`` from the checkout ``code``
    (:data:`_SITECUSTOMIZE`, written into the folder ``tmp``)."""
    (Path(tmp) / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return dict(os.environ, PYTHONPATH=tmp, PERFSCOPE_CODE=str(code.resolve()))


def compare_checkouts(root: Path, other: Path, repeat: int) -> None:
    """First build, ``perfscope query`` and ``perfscope ls --limit 5`` from the checkout
    ``other`` ("before") and this one ("after"), alternately, ``repeat`` times each (ABBA);
    prints medians, ranges and the 1-minute load average over each series."""
    import pickle

    sql = (
        "SELECT engine_kind, count(*), median(ttft_p99_s), max(output_tok_s) FROM runs "
        "WHERE state = 'complete' GROUP BY 1 ORDER BY 1"
    )
    with tempfile.TemporaryDirectory() as tmp:
        envs = {"before": _checkout_env(tmp, other), "after": _checkout_env(tmp, ROOT)}

        def series(label: str, argv: list[str]) -> dict[str, list[float]]:
            times: dict[str, list[float]] = {k: [] for k in envs}
            outputs: dict[str, set[str]] = {k: set() for k in envs}
            loads: list[float] = []
            for i in range(repeat):
                for side in list(envs) if i % 2 == 0 else list(envs)[::-1]:
                    t0 = time.perf_counter()
                    out = subprocess.run(
                        argv + ([str(Path(tmp) / f"{side}.pkl")] if argv[1] == "-c" else []),
                        env=envs[side],
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                    took = time.perf_counter() - t0
                    outputs[side].add(out if argv[1] != "-c" else "")
                    times[side].append(float(out.split()[0]) if argv[1] == "-c" else took)
                    loads.append(os.getloadavg()[0])
            for side, v in times.items():
                print(
                    f"{label} {side}:".ljust(38) + f"median {statistics.median(v):.3f} s "
                    f"[{min(v):.3f}-{max(v):.3f}] n={len(v)}, load {min(loads):.1f}-"
                    f"{max(loads):.1f}"
                )
            if argv[1] != "-c":
                print(f"{label}: output identical: {outputs['before'] == outputs['after']}")
            return times

        series("first build", [sys.executable, "-c", _FIRST_BUILD, str(root)])
        with open(Path(tmp) / "before.pkl", "rb") as fh:
            before = pickle.load(fh)
        with open(Path(tmp) / "after.pkl", "rb") as fh:
            after = pickle.load(fh)
        print(f"rows: {len(before)} before, {len(after)} after, identical: {before == after}")
        cli = [sys.executable, "-m", "perfscope"]
        series("perfscope query", [*cli, "query", sql, "--runs-dir", str(root)])
        series("perfscope ls --limit 5", [*cli, "ls", "--limit", "5", "--runs-dir", str(root)])


def _list_once(repo: object) -> int:
    rows = repo.rows()  # type: ignore[attr-defined]
    return len([r.to_record() for r in rows])


def dashboard_list(root: Path, repeat: int, sources: tuple[str, ...]) -> None:
    """Runs-list page data: the index against the scan it replaces, medians of ``repeat``."""
    from perfscope.dashboard.app.data import RunRepository

    results: dict[str, float] = {}
    for source in sources:
        saved = sys.modules.get("duckdb")
        if source == "scan":
            sys.modules["duckdb"] = None  # type: ignore[assignment]  # import raises
        try:
            cold, warm = [], []
            for _ in range(repeat):
                repo = RunRepository(root)
                cold.append(_timed(functools.partial(_list_once, repo)))
                warm.append(_timed(functools.partial(_list_once, repo)))
                assert repo.listing_source == source, repo.listing_source
        finally:
            if saved is not None:
                sys.modules["duckdb"] = saved
            else:
                sys.modules.pop("duckdb", None)
        results[f"{source} cold"] = statistics.median(cold)
        results[f"{source} warm"] = statistics.median(warm)
        print(
            f"dashboard runs list, {source}, fresh app:".ljust(38)
            + f"median {results[f'{source} cold']:.3f} s"
        )
        print(
            f"dashboard runs list, {source}, warm app:".ljust(38)
            + f"median {results[f'{source} warm']:.3f} s"
        )
    for kind in ("cold", "warm") if "scan" in sources else ():
        ratio = results[f"scan {kind}"] / results[f"index {kind}"]
        print(f"scan / index, {kind}:".ljust(38) + f"{ratio:.1f}x")


#: The dashboard server's process: the app over ``argv[1]`` on 127.0.0.1:``argv[2]`` (run
#: with :func:`_checkout_env` to import it from another checkout).
_SERVER = r"""
import sys
root, port = sys.argv[1], int(sys.argv[2])
from perfscope.dashboard.app import create_app, serve
print(__import__("perfscope.dashboard.app").__file__, flush=True)
serve(create_app(root), "127.0.0.1", port)
"""


def _post_json(conn: object, path: str, body: dict[str, object]) -> tuple[int, bytes]:
    data = json.dumps(body).encode()
    conn.request(  # type: ignore[attr-defined]
        "POST", path, body=data, headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()  # type: ignore[attr-defined]
    return int(resp.status), bytes(resp.read())


def _callback_body(deps: list[dict[str, object]], output: str, values: dict[str, object]) -> dict:
    """The request the browser sends for the callback whose outputs include ``output``,
    with ``values`` ("id.prop" -> value; the rest None)."""
    dep = next(d for d in deps if output in str(d["output"]))
    key = str(dep["output"])
    parts = key.strip(".").split("...") if key.startswith("..") else [key]
    outs = [{"id": o.split(".")[0], "property": o.split(".", 1)[1]} for o in parts]

    def spec(items: object) -> list[dict[str, object]]:
        return [
            {
                "id": i["id"],
                "property": i["property"],
                "value": values.get(f"{i['id']}.{i['property']}"),
            }
            for i in items  # type: ignore[attr-defined]
        ]

    inputs = spec(dep["inputs"])
    return {
        "output": key,
        "outputs": outs if len(outs) > 1 else outs[0],
        "inputs": inputs,
        "state": spec(dep["state"]),
        "changedPropIds": [f"{i['id']}.{i['property']}" for i in inputs[:1]],
    }


def dashboard_clients(
    root: Path, clients: int, rounds: int, code: Path | None, gap_s: float = 2.0
) -> None:
    """``clients`` concurrent clients of a real dashboard server over ``root``: each opens
    the runs page (the router's callback, which sends the table) and then asks for the
    table again as its poll does, on a page of its own, ``rounds`` times, ``gap_s`` apart
    (the clients start spread over one gap). Prints p50/p95 of every request's latency and
    the bytes a page open sends."""
    import http.client
    import socket
    import threading

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="perfscope-bench-")
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(root), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_checkout_env(tmp, code) if code is not None else None,
    )
    try:
        assert server.stdout is not None
        print(f"dashboard served from {server.stdout.readline().strip()}")
        deadline = time.monotonic() + 120
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                conn.request("GET", "/_dash-dependencies")
                deps = json.loads(conn.getresponse().read())
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        # One page open first: the index refreshed once, as a dashboard that has run a while.
        warm = _callback_body(deps, "page-content.children", {"url.pathname": "/"})
        status, first = _post_json(conn, "/_dash-update-component", warm)
        assert status == 200, status
        conn.close()
        times: list[float] = []
        sizes: list[int] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            time.sleep(gap_s * k / clients)
            try:
                for r in range(rounds):
                    if r:
                        time.sleep(gap_s)
                    page = (k + r) % 3
                    for body in (
                        _callback_body(deps, "page-content.children", {"url.pathname": "/"}),
                        _callback_body(
                            deps,
                            "runs-table.data",
                            {
                                "runs-poll.n_intervals": r + 1,
                                "runs-table.page_current": page,
                                "runs-table.page_size": 50,
                            },
                        ),
                    ):
                        t0 = time.perf_counter()
                        status, raw = _post_json(c, "/_dash-update-component", body)
                        dt = time.perf_counter() - t0
                        with lock:
                            times.append(dt)
                            sizes.append(len(raw))
                        assert status in (200, 204), status
            finally:
                c.close()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        wall = time.perf_counter() - t0
        q = statistics.quantiles(times, n=20)
        print(
            f"dashboard, {clients} clients x {rounds} rounds ({len(times)} requests, "
            f"{wall:.1f} s): p50 {statistics.median(times):.3f} s, p95 {q[18]:.3f} s, "
            f"page open {len(first) / 1e6:.2f} MB"
        )
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
