"""Check perfscope's GPU telemetry on a real NVIDIA GPU and print what it saw.

Run on a machine with an NVIDIA driver and a CUDA build of PyTorch:

    python scripts/gpu_check.py [--preset 1b] [--requests 32] [--prompt-len 1024] \
        [--output-len 128] [--batch-size 16] [--interval 0.05] [--json OUT.json]

It prints, each part independent of the others (a failing part prints its traceback and the
script goes on):

1. NVML: driver, GPUs, which fields each GPU supports (and why not), power method, limits;
2. sensor timing: how often the energy counter and the instant power field change value when
   polled back to back (cf. zeus ``infer_counter_update_period``), and what each NVML call costs;
3. a short reference-engine workload on CUDA with telemetry (NVML + torch memory + GPM) and
   NVTX ranges on, joined by ``analysis.energy``: energy method, J/token, power during prefill
   vs decode against the power limit, memory, measured DRAM bandwidth per phase, and the
   counter-vs-integrated difference.

Exit code 0 when every part ran, 1 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

RESULTS: dict[str, Any] = {}
FAILED: list[str] = []


def part(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run a part, print a traceback on failure and carry on."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            print(f"\n=== {name} ===", flush=True)
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            except Exception:
                traceback.print_exc()
                FAILED.append(name)
                print(f"--- {name}: FAILED", flush=True)
                return None
            print(f"--- {name}: ok ({time.perf_counter() - t0:.1f} s)", flush=True)
            return out

        return wrapper

    return deco


@part("1. NVML devices and fields")
def check_nvml(interval: float) -> dict[str, Any]:
    from perfscope.profiler.clock import MonotonicClock
    from perfscope.profiler.telemetry import TelemetryConfig, start_telemetry

    session = start_telemetry(
        MonotonicClock(),
        TelemetryConfig(interval_s=interval, baseline_s=0.0, cpu=False),
        background=False,
    )
    session.sample_once()
    table = session.stop()
    info: dict[str, Any] = session.manifest_info()
    gpu = info["gpu"]
    print(f"driver {gpu.get('driver_version')}  NVML {gpu.get('nvml_version')}")
    if not gpu["available"]:
        print(info.get("gpu_unavailable"))
        raise RuntimeError("no GPU telemetry")
    for name, d in gpu["devices"].items():
        print(
            f"{name}: {d.get('device_name')} ({d.get('architecture')}), uuid {d.get('uuid')}, "
            f"bus {d.get('pci_bus_id')}, matched by {d.get('matched_by')}"
        )
        print(
            f"  power method {d.get('power_method')}; limit {d.get('power_limit_w')} W "
            f"(default {d.get('default_power_limit_w')} W); max clocks SM "
            f"{d.get('max_sm_clock_mhz')} / mem {d.get('max_mem_clock_mhz')} MHz; "
            f"memory {d.get('mem_total_bytes', 0) / 1e9:.1f} GB; MIG {d.get('mig_enabled')}"
        )
        for field, how in d["supported"].items():
            print(f"  supported   {field:12s} {how}")
        for field, why in d["unsupported"].items():
            print(f"  unsupported {field:12s} {why}")
    print(table.to_pandas().drop(columns=["t"]).dropna(axis=1, how="all").to_string())
    RESULTS["nvml"] = info
    return info


@part("2. sensor update periods and NVML call cost")
def check_timing(seconds: float) -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        fid = [(pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_POWER_SCOPE_GPU)]

        def energy() -> float:
            return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(h))

        def instant() -> float:
            v = pynvml.nvmlDeviceGetFieldValues(h, fid)[0]
            return float(v.value.uiVal) if v.nvmlReturn == pynvml.NVML_SUCCESS else float("nan")

        def average() -> float:
            return float(pynvml.nvmlDeviceGetPowerUsage(h))

        timing: dict[str, Any] = {}
        for name, fn in (("energy_counter", energy), ("power_instant", instant),
                         ("power_usage", average)):  # fmt: skip
            try:
                fn()
            except pynvml.NVMLError as exc:
                print(f"{name}: not supported ({exc})")
                continue
            changes: list[float] = []
            last = fn()
            t_end = time.perf_counter() + seconds
            n = 0
            t_calls = 0.0
            while time.perf_counter() < t_end:
                c0 = time.perf_counter()
                v = fn()
                t_calls += time.perf_counter() - c0
                n += 1
                if v != last:
                    changes.append(c0)
                    last = v
            gaps = [b - a for a, b in itertools.pairwise(changes)]
            gaps.sort()
            med = gaps[len(gaps) // 2] if gaps else None
            timing[name] = {
                "polls": n,
                "call_us": 1e6 * t_calls / max(n, 1),
                "changes": len(changes),
                "median_update_period_s": med,
                "min_update_period_s": gaps[0] if gaps else None,
            }
            print(
                f"{name:15s} {n} polls, {1e6 * t_calls / max(n, 1):.1f} µs/call, "
                f"value changed {len(changes)}×, median period "
                f"{med * 1e3 if med else float('nan'):.1f} ms"
            )
        costs: dict[str, float] = {}
        calls: dict[str, Callable[[], Any]] = {
            "nvmlDeviceGetMemoryInfo_v2": lambda: pynvml.nvmlDeviceGetMemoryInfo(
                h, version=pynvml.nvmlMemory_v2
            ),
            "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
            "nvmlDeviceGetClockInfo": lambda: pynvml.nvmlDeviceGetClockInfo(
                h, pynvml.NVML_CLOCK_SM
            ),
            "nvmlDeviceGetTemperatureV": lambda: pynvml.nvmlDeviceGetTemperatureV(
                h, pynvml.NVML_TEMPERATURE_GPU
            ),
            "nvmlDeviceGetCurrentClocksEventReasons": lambda: (
                pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            ),
        }
        for name, fn in calls.items():
            try:
                fn()
                c0 = time.perf_counter()
                for _ in range(200):
                    fn()
                costs[name] = (time.perf_counter() - c0) / 200 * 1e6
                print(f"{name:40s} {costs[name]:8.1f} µs/call")
            except pynvml.NVMLError as exc:
                print(f"{name:40s} not supported ({exc})")
        RESULTS["timing"] = {"periods": timing, "call_us": costs}
    finally:
        pynvml.nvmlShutdown()


@part("3. reference engine on CUDA with telemetry and NVTX")
def check_workload(args: argparse.Namespace) -> None:
    import torch
    from rich.console import Console

    from perfscope.analysis.energy import energy_section
    from perfscope.dashboard.terminal import energy_table
    from perfscope.profiler import nvtx_ranges
    from perfscope.profiler.clock import MonotonicClock
    from perfscope.profiler.driver import Driver, LoadConfig
    from perfscope.profiler.engines.base import EngineOptions, Inbox, create_engine
    from perfscope.profiler.recorder import Recorder
    from perfscope.profiler.telemetry import TelemetryConfig, start_telemetry
    from perfscope.profiler.workload import LengthDist, WorkloadConfig, build_workload

    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} has no CUDA here")
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
              f"{torch.cuda.get_device_name(0)}")  # fmt: skip
    print(f"NVTX tool attached: {nvtx_ranges.tool_attached()}")
    nvtx_ranges.set_enabled(True)

    specs = build_workload(
        WorkloadConfig(
            requests=args.requests,
            prompt_len=LengthDist("constant", args.prompt_len),
            output_len=LengthDist("constant", args.output_len),
            warmup=2,
        )
    )
    engine = create_engine(
        "reference",
        EngineOptions(
            model_preset=args.preset,
            batch_size=args.batch_size,
            device=args.device,
            max_seq_len=args.prompt_len + args.output_len,
        ),
    )
    print(f"engine: {engine.info().config.get('n_params', 0) / 1e9:.2f} B params, "
          f"{engine.info().dtype}")  # fmt: skip
    clock = MonotonicClock()
    session = start_telemetry(
        clock,
        TelemetryConfig(
            interval_s=args.interval,
            baseline_s=args.baseline,
            cuda_memory=args.device.startswith("cuda"),
        ),
    )
    recorder = Recorder(clock)
    inbox = Inbox()
    driver = Driver(specs, LoadConfig(), inbox, recorder)
    t0 = time.perf_counter()
    try:
        with nvtx_ranges.run_range("gpu_check"):
            driver.start()
            engine.serve(inbox, recorder)
            driver.join()
    finally:
        table = session.stop()
        engine.close()
    wall = time.perf_counter() - t0
    info = session.manifest_info()
    tele = table.to_pandas()
    steps = recorder.steps_table().to_pandas()
    requests = recorder.requests_table().to_pandas()
    chunks = recorder.chunks_table().to_pandas()
    print(
        f"served {len(requests)} requests in {wall:.2f} s; {len(steps)} steps; "
        f"{len(tele)} telemetry rows; sampler cost {info['sampler_cost']}"
    )
    print(f"idle baseline: {info['idle_baseline']}")
    kinds = steps.groupby("kind")["t_end"].count().to_dict() if len(steps) else {}
    med = (
        ((steps["t_end"] - steps["t_start"]).groupby(steps["kind"]).median() / 1e6).to_dict()
        if len(steps)
        else {}
    )
    print(f"steps per kind {kinds}; median step ms {med}")
    sec = energy_section(tele, steps, requests, chunks, info)
    Console(width=140).print(energy_table(sec))
    for name in ("prefill", "decode"):
        if name in sec.phases:
            p = sec.phases[name]
            print(f"{name}: {p.avg_power_w} W average over {p.time_s} s, {p.j_per_token} J/token")
    print(
        f"method {sec.method}; counter vs integrated {sec.counter_vs_integrated_pct} %; "
        f"counter period from data {sec.counter_update_period_s} s"
    )
    RESULTS["workload"] = {"energy": sec.to_dict(), "telemetry": info, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Check perfscope GPU telemetry on this machine.")
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--baseline", type=float, default=1.0, help="idle baseline seconds")
    ap.add_argument("--poll-seconds", type=float, default=2.0, help="per sensor, part 2")
    ap.add_argument("--json", default=None, help="write everything seen to this JSON file")
    args = ap.parse_args(argv)

    check_nvml(args.interval)
    check_timing(args.poll_seconds)
    check_workload(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(RESULTS, f, indent=2, default=str)
        print(f"\nwrote {args.json}")
    print("\nFAILED: " + ", ".join(FAILED) if FAILED else "\nall parts ran")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
