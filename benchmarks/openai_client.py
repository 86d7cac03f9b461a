"""Client timestamp error and CPU cost per streamed token of the openai: engine.

Runs the scripted SSE server (tests/data/openai/sse_server.py) in its own process and
streams to it at 1, 16, 64 and 256 concurrent streams. The server logs the CLOCK_MONOTONIC
time at which each request's last byte reached its event loop and just before it writes each
chunk; the error of a client stamp is (client stamp - server write time), the same clock on
Linux, and the TTFT error is (client TTFT) - (server's first write - server's receipt).
CPU per token is this process's CPU time over tokens. Runs with any perfscope version (the
one importable by the interpreter that runs it), so before/after compare on one server.
``--httpx`` also measures a minimal httpx streaming client with the same SSE parser (the
comparison behind the choice of aiohttp).

    .venv/bin/python benchmarks/openai_client.py [--tokens 40] [--itl 0.02] [--httpx]
        [--workers N] [--streams 1,16,64,256]

(With ``--workers`` > 1 the CPU per token counts only the parent process.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.driver import Driver, LoadConfig
from perfscope.profiler.engines.base import EngineOptions, Inbox, create_engine
from perfscope.profiler.engines.openai.sse import SSEParser
from perfscope.profiler.recorder import Recorder
from perfscope.profiler.records import RequestSpec

SERVER = Path(__file__).resolve().parent.parent / "tests" / "data" / "openai" / "sse_server.py"


def _log(base: str) -> dict[str, dict[str, list[int]]]:
    with urllib.request.urlopen(base.removesuffix("/v1") + "/_log", timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _stats(errors_ms: np.ndarray) -> str:
    p50, p99, mx = np.percentile(errors_ms, [50, 99, 100])
    return f"p50 {p50:.3f}  p99 {p99:.3f}  max {mx:.3f}"


def bench_engine(url: str, streams: int, tokens: int, workers: int = 1) -> dict[str, float]:
    specs = [RequestSpec(i, 8, tokens, prompt=f"id=b{streams}x{i}") for i in range(streams)]
    _log(url)
    extra = {"workers": str(workers)} if workers > 1 else {}
    engine = create_engine(f"openai:{url}", EngineOptions(extra=extra))
    clock = MonotonicClock()
    rec = Recorder(clock)
    inbox = Inbox()
    driver = Driver(specs, LoadConfig(mode="online", concurrency=streams), inbox, rec)
    cpu0 = time.process_time()
    driver.start()
    engine.serve(inbox, rec)
    cpu = time.process_time() - cpu0
    engine.close()
    log = _log(url)
    chunks = rec.chunks_table().to_pandas().sort_values(["request_id", "t"])
    req = rec.requests_table().to_pandas().set_index("request_id")
    errs, itl_errs, ttft_errs, send_errs = [], [], [], []
    for spec in specs:
        truth = log[f"b{streams}x{spec.request_id}"]
        w = np.asarray(truth["writes"]) - clock.origin_perf_counter_ns
        t = chunks[chunks["request_id"] == spec.request_id]["t"].to_numpy()
        errs.append(t - w)
        itl_errs.append(np.diff(t) - np.diff(w))
        ttft = req.loc[spec.request_id, "t_first_token"] - req.loc[spec.request_id, "t_sent"]
        ttft_errs.append(ttft - (truth["writes"][0] - truth["recv"]))
        send_errs.append(
            truth["recv"] - clock.origin_perf_counter_ns - req.loc[spec.request_id, "t_sent"]
        )
    e = np.concatenate(errs) / 1e6
    ie = np.abs(np.concatenate(itl_errs)) / 1e6
    n_tok = int(chunks["n_tokens"].sum())
    client = engine.info().config["client"]
    return {
        "streams": streams,
        "stamp_err_ms": e,
        "itl_err_ms": ie,
        "ttft_err_ms": np.asarray(ttft_errs, dtype=float) / 1e6,
        "send_err_ms": np.asarray(send_errs, dtype=float) / 1e6,
        "cpu_us_per_token": cpu / n_tok * 1e6,
        "loop_lag_p99_ms": (client["loop_lag_s"]["p99"] or 0) * 1e3,
        "saturated": client["saturated"],
        "stamp_delay_p99_ms": ((client.get("stamp_delay_s") or {}).get("p99") or 0) * 1e3,
    }


async def _httpx_one(client: object, url: str, body: bytes, stamps: list[int]) -> None:
    import httpx

    assert isinstance(client, httpx.AsyncClient)
    parser = SSEParser()
    async with client.stream("POST", url, content=body) as resp:
        async for data in resp.aiter_raw():
            t = time.perf_counter_ns()
            for payload in parser.feed(data):
                if payload != "[DONE]":
                    obj = json.loads(payload)
                    if obj.get("choices") and obj["choices"][0].get("text"):
                        stamps.append(t)


def bench_httpx(url: str, streams: int, tokens: int) -> dict[str, float]:
    import httpx

    _log(url)
    stamps: dict[int, list[int]] = {i: [] for i in range(streams)}

    async def run() -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=None, limits=limits) as client:
            await asyncio.gather(
                *(
                    _httpx_one(
                        client,
                        url + "/completions",
                        json.dumps(
                            {
                                "model": "m",
                                "prompt": f"id=h{streams}x{i}",
                                "max_tokens": tokens,
                                "stream": True,
                            }
                        ).encode(),
                        stamps[i],
                    )
                    for i in range(streams)
                )
            )

    cpu0 = time.process_time()
    asyncio.run(run())
    cpu = time.process_time() - cpu0
    log = _log(url)
    e = (
        np.concatenate(
            [np.asarray(stamps[i]) - np.asarray(log[f"h{streams}x{i}"]["writes"]) for i in stamps]
        )
        / 1e6
    )
    return {
        "streams": streams,
        "stamp_err_ms": e,
        "cpu_us_per_token": cpu / (streams * tokens) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--itl", type=float, default=0.02)
    ap.add_argument("--streams", default="1,16,64,256")
    ap.add_argument("--httpx", action="store_true")
    ap.add_argument(
        "--workers", type=int, default=1, help="worker processes sharing the streams (1)"
    )
    a = ap.parse_args()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--ttft", "0.02", "--itl", str(a.itl)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = f"http://127.0.0.1:{int(proc.stdout.readline().split()[1])}/v1"
    try:
        for n in (int(x) for x in a.streams.split(",")):
            r = (
                bench_engine(url, n, a.tokens, a.workers)
                if a.workers > 1
                else bench_engine(url, n, a.tokens)
            )
            te = r["ttft_err_ms"]
            print(
                f"TTFT error {n:4d} streams (ms): p50 {np.percentile(te, 50):+.2f}  "
                f"p95 {np.percentile(te, 95):+.2f}  mean {te.mean():+.2f}; of it, server "
                f"receipt - t_sent p50 {np.percentile(r['send_err_ms'], 50):+.2f} p95 "
                f"{np.percentile(r['send_err_ms'], 95):+.2f}"
            )
            print(
                f"aiohttp engine  {n:4d} streams: stamp - server write (ms) "
                f"{_stats(r['stamp_err_ms'])}; "
                f"|ITL err| p99 {np.percentile(r['itl_err_ms'], 99):.3f} ms; "
                f"CPU {r['cpu_us_per_token']:.1f} us/token; "
                f"loop lag p99 {r['loop_lag_p99_ms']:.2f} ms; own stamp delay p99 "
                f"{r['stamp_delay_p99_ms']:.2f} ms"
                f"{' (saturated)' if r['saturated'] else ''}"
            )
            if a.httpx:
                h = bench_httpx(url, n, a.tokens)
                print(
                    f"httpx minimal   {n:4d} streams: stamp - server write (ms) "
                    f"{_stats(h['stamp_err_ms'])}; CPU {h['cpu_us_per_token']:.1f} us/token"
                )
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
