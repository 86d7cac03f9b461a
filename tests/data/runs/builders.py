"""Run directories for the report, figure, export and comparison tests.

Nothing big is committed: every run is made when the tests need it, in a temporary folder.

- ``complete_run``: a real ``perfscope run`` of the reference engine (tiny model), in-process,
  which also writes report.html.
- ``manual_run``: the manual API with a ``ManualClock`` (exact times): overlapping requests,
  optional steps, failed requests, an interrupted end.
- ``synthetic_run``: a large run written directly as Parquet tables (an HTTP-like engine: no
  steps) with GPU telemetry, then analysed as ``perfscope analyze`` does.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import perfscope
from perfscope.analysis.modelspec import ModelSpec
from perfscope.api.analyze import analyze_stored
from perfscope.cli import main
from perfscope.hwdb import lookup
from perfscope.profiler.clock import ManualClock
from perfscope.profiler.records import (
    CHUNK_SCHEMA,
    REQUEST_SCHEMA,
    STEP_SCHEMA,
    TELEMETRY_SCHEMA,
)
from perfscope.profiler.store import read_run, write_json_atomic, write_table_atomic

MS = 1_000_000
#: A string that breaks out of HTML if it is not escaped.
EVIL = '<script>alert("x\'")</script>&'


def complete_run(root: Path, *extra: str) -> Path:
    """A real reference-engine run (8 requests, tiny model) through ``perfscope run``."""
    argv = [
        "run",
        "--model-preset",
        "tiny",
        "--requests",
        "8",
        "--prompt-len",
        "32",
        "--output-len",
        "8",
        "--batch-size",
        "4",
        "--no-progress",
        "--slo",
        "ttft=2s",
        "--slo",
        "tpot=200ms",
        "--runs-dir",
        str(root),
        *extra,
    ]
    before = set(root.iterdir()) if root.exists() else set()
    with contextlib.redirect_stdout(None):  # type: ignore[type-var]
        code = main(argv)
    assert code == 0, code
    return _the_new_run(root, before)


def _the_new_run(root: Path, before: set[Path]) -> Path:
    """The one run folder that appeared in ``root`` since ``before`` (a dashboard polling
    the same folder may add its own files beside it, such as the run index)."""
    (path,) = {p for p in set(root.iterdir()) - before if (p / "manifest.json").is_file()}
    return path


def run_without_slos(root: Path, *extra: str) -> Path:
    """A real reference-engine run (6 requests, tiny model) with no SLOs."""
    argv = [
        "run",
        "--model-preset",
        "tiny",
        "--requests",
        "6",
        "--prompt-len",
        "16",
        "--output-len",
        "4",
        "--no-progress",
        "--runs-dir",
        str(root),
        *extra,
    ]
    before = set(root.iterdir()) if root.exists() else set()
    with contextlib.redirect_stdout(None):  # type: ignore[type-var]
        code = main(argv)
    assert code == 0, code
    return _the_new_run(root, before)


def small_model() -> dict[str, Any]:
    """The reference engine's tiny shape as ModelSpec fields."""
    return ModelSpec(
        name="small",
        n_layers=2,
        hidden_size=128,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        intermediate_size=352,
        vocab_size=1024,
    ).to_dict()


def manual_run(
    root: Path,
    *,
    name: str = "manual",
    n_requests: int = 6,
    concurrency: int = 3,
    steps: bool = True,
    fail_every: int = 0,
    error_text: str = "server went away",
    interrupt: bool = False,
    model: dict[str, Any] | None = None,
    slos: dict[str, float] | None = None,
) -> Path:
    """Requests in waves of ``concurrency`` overlapping requests, exact times.

    Each request: 30 ms queue+prefill (a prefill step of the wave when ``steps``), then
    7 tokens 10 ms apart (decode steps). ``fail_every=k`` fails every k-th request after its
    first token with ``error_text``; ``interrupt`` stops with Ctrl-C during the last wave.
    """
    clock = ManualClock()
    prof = perfscope.profile(
        name=name, runs_dir=root, clock=clock, model=model, slos=slos or {"ttft": 0.035}
    )
    try:
        with prof as p:
            rid = 0
            for wave in range(0, n_requests, concurrency):
                size = min(concurrency, n_requests - wave)
                with contextlib.ExitStack() as stack:
                    handles = []
                    for _ in range(size):
                        handles.append(stack.enter_context(p.request(prompt_tokens=32)))
                        clock.advance_ns(1 * MS)
                    ids = tuple(range(rid, rid + size))
                    rid += size
                    clock.advance_ns(5 * MS)  # queued
                    if steps:
                        with p.step(
                            "prefill", batch_size=size, new_tokens=32 * size, request_ids=ids
                        ):
                            clock.advance_ns(25 * MS)
                    else:
                        clock.advance_ns(25 * MS)
                    failed: set[int] = set()
                    for h, i in zip(handles, ids, strict=True):
                        h.tokens(1)
                        if fail_every and i % fail_every == fail_every - 1:
                            failed.add(i)
                    for tok in range(7):
                        if interrupt and wave + size >= n_requests and tok == 3:
                            raise KeyboardInterrupt
                        live = [i for i in ids if i not in failed]
                        if steps:
                            with p.step(
                                "decode",
                                batch_size=len(live),
                                new_tokens=len(live),
                                context_tokens=(32 + tok + 1) * len(live),
                                request_ids=tuple(live),
                            ):
                                clock.advance_ns(10 * MS)
                        else:
                            clock.advance_ns(10 * MS)
                        for h, i in zip(handles, ids, strict=True):
                            if i not in failed:
                                h.tokens(1)
                    for h, i in zip(handles, ids, strict=True):
                        if i in failed:
                            h.finish(error=f"RuntimeError: {error_text}")
    except KeyboardInterrupt:
        pass
    assert prof.path is not None
    return prof.path


def set_manifest(path: Path, **changes: Any) -> None:
    """Edit a stored run's manifest (nested keys as ``engine__uri``) and re-analyse it."""
    manifest = json.loads((path / "manifest.json").read_text())
    for key, value in changes.items():
        node = manifest
        parts = key.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    write_json_atomic(path / "manifest.json", manifest)
    analyze_stored(read_run(path))


def synthetic_run(
    root: Path,
    n_requests: int = 10_000,
    *,
    seed: int = 0,
    scale: float = 1.0,
    telemetry: bool = True,
    name: str = "synthetic",
) -> Path:
    """A large HTTP-like run (no steps) written as Parquet, with 1% failed requests and GPU
    telemetry (power and energy counter every 100 ms), analysed against an H100.

    ``scale`` multiplies every latency (to make a slower run for comparisons).
    """
    rng = np.random.default_rng(seed)
    path = root / f"20260101-000000-{name}-{seed:04x}"
    path.mkdir(parents=True)
    n = n_requests
    rate = 50.0  # requests per second
    sched = np.cumsum(rng.exponential(1.0 / rate, n) * 1e9).astype(np.int64)
    sent = sched + rng.integers(50_000, 200_000, n)
    ttft = (rng.lognormal(np.log(0.08), 0.4, n) * scale * 1e9).astype(np.int64)
    out_tok = rng.integers(8, 64, n)
    first = sent + ttft
    # Chunks of 1-3 tokens, 12 ms per token on average.
    per_tok = rng.lognormal(np.log(0.012), 0.2, n) * scale
    chunk_rid, chunk_t, chunk_n, chunk_idx = [], [], [], []
    last = np.empty(n, dtype=np.int64)
    failed = rng.random(n) < 0.01
    for i in range(n):
        remaining = int(out_tok[i])
        t = int(first[i])
        sizes = [1]
        remaining -= 1
        while remaining > 0:
            s = int(min(remaining, rng.integers(1, 4)))
            sizes.append(s)
            remaining -= s
        if failed[i]:
            sizes = sizes[: max(1, len(sizes) // 2)]
        for k, s in enumerate(sizes):
            if k:
                t += int(per_tok[i] * s * 1e9)
            chunk_rid.append(i)
            chunk_t.append(t)
            chunk_n.append(s)
            chunk_idx.append(k)
        last[i] = t
    produced = np.bincount(np.array(chunk_rid), weights=np.array(chunk_n), minlength=n).astype(
        np.int64
    )
    errors = np.array([None] * n, dtype=object)
    errors[failed] = 'HTTP 500: <b>upstream</b> "timeout"'
    requests = pa.table(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "prompt_tokens": rng.integers(64, 512, n).astype(np.int64),
            "max_output_tokens": out_tok.astype(np.int64),
            "t_scheduled": sched,
            "t_sent": sent,
            "t_first_token": first,
            "t_last_token": np.where(failed, None, last).tolist(),
            "output_tokens": produced,
            "error": errors.tolist(),
            "is_warmup": np.zeros(n, dtype=bool),
        },
        schema=REQUEST_SCHEMA,
    )
    chunks = pa.table(
        {
            "request_id": np.array(chunk_rid, dtype=np.int64),
            "t": np.array(chunk_t, dtype=np.int64),
            "n_tokens": np.array(chunk_n, dtype=np.int64),
            "index": np.array(chunk_idx, dtype=np.int64),
        },
        schema=CHUNK_SCHEMA,
    )
    write_table_atomic(path / "requests.parquet", requests)
    write_table_atomic(path / "chunks.parquet", chunks)
    write_table_atomic(path / "steps.parquet", STEP_SCHEMA.empty_table())
    if telemetry:
        t_end = int(last.max())
        ts = np.arange(0, t_end + 100 * MS, 100 * MS, dtype=np.int64)
        power = 350.0 + 100.0 * np.sin(ts / 3e9) + rng.normal(0, 5, ts.size)
        energy = np.concatenate([[0.0], np.cumsum(power[1:] * 0.1)])
        cols: dict[str, Any] = {name: [None] * ts.size for name in TELEMETRY_SCHEMA.names}
        cols.update(
            t=ts,
            device=["gpu0"] * ts.size,
            power_w=power,
            energy_j=energy,
            mem_used_bytes=np.full(ts.size, 60e9),
            util_pct=np.clip(80 + rng.normal(0, 5, ts.size), 0, 100),
            sm_clock_mhz=np.full(ts.size, 1980.0),
        )
        write_table_atomic(path / "telemetry.parquet", pa.table(cols, schema=TELEMETRY_SCHEMA))
    h100 = lookup("h100-sxm5-80gb")
    model = ModelSpec.from_preset("llama-3-8b").to_dict()
    manifest = {
        "schema": "perfscope.manifest/1",
        "run_id": path.name,
        "name": name,
        "perfscope_version": perfscope.__version__,
        "command": ["perfscope", "run", "openai:http://localhost:8000/v1"],
        "started_at": "2026-01-01T00:00:00+00:00",
        "ended_at": "2026-01-01T00:03:20+00:00",
        "status": "complete",
        "engine": {
            "uri": "openai:http://localhost:8000/v1",
            "kind": "openai",
            "model": model,
            "device": None,
            "dtype": None,
            "config": {},
        },
        "workload": {"requests": n, "prompt_len": "uniform:64:512", "output_len": "uniform:8:64"},
        "load": {"mode": "online", "rate": rate, "arrival": "poisson"},
        "slos": {"ttft": 0.15 * scale, "tpot": 0.02 * scale},
        "hw": "h100-sxm5-80gb",
        "hardware": {"spec": h100.to_dict(), "resolved_from": "--hw h100-sxm5-80gb"},
        "host": {"python": "3.11", "platform": "synthetic"},
        "errors": [],
        "telemetry": {"status": "ok", "devices": ["gpu0"] if telemetry else []},
    }
    write_json_atomic(path / "manifest.json", manifest)
    analyze_stored(read_run(path))
    return path


def copy_run(template: Path, root: Path, run_id: str, **manifest_changes: object) -> Path:
    """Copy the run folder ``template`` to ``root/run_id``, its manifest renamed and changed."""
    dest = root / run_id
    shutil.copytree(template, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["run_id"] = run_id
    manifest.update(manifest_changes)
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest
