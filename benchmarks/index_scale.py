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

Run: ``python benchmarks/index_scale.py [--runs 10000] [--repeat 5]``. Prints medians.

Before/after numbers at 2,000 and 10,000 runs, taken interleaved with the load beside them,
are in docs/scale.md ("The run index"). Every run's tables are files of their own (copies of
one real run's), so a first build opens and reads every footer as it would on real runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
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
    import shutil

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
    args = ap.parse_args()

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


def _list_once(repo: object) -> int:
    rows = repo.rows()  # type: ignore[attr-defined]
    return len([r.to_record() for r in rows])


def dashboard_list(root: Path, repeat: int, sources: tuple[str, ...]) -> None:
    """Runs-list page data: the index against the scan it replaces, medians of ``repeat``."""
    from perfscope.dashboard.data import RunRepository

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


if __name__ == "__main__":
    main()
