"""Study: tensor and pipeline parallelism for real, the reference model split across 2
processes with torch.distributed (gloo over 127.0.0.1), against the single process and
against the cost model's communication term for the same hardware entry
(``cpu-loopback-gloo`` in hwdb, its link calibrated by ``--calibrate``).

Run: `python samples/studies/parallel.py` (a few minutes on 2 cores) or `--smoke`
(seconds after the processes start). `--calibrate` measures the loopback link (ping-pong
and all-reduce over gloo) and prints the lines for the hwdb entry. The write-up with the
measured tables is `parallel.md`.

Every setting runs one process per rank with 1 torch thread (the single process too), so
TP/PP use twice the cores of the baseline. Repeats are interleaved (single, TP, PP, ...) and
each figure is the median over repeats of the per-run median decode step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from perfscope.analysis.experiment import judge_metric
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.parallel import ParallelPlan, ParallelPrediction, predict_parallel
from perfscope.hwdb import resolve_device
from perfscope.profiler.engines.reference.model import PRESETS
from perfscope.profiler.engines.reference.parallel import (
    ParallelJob,
    ParallelRun,
    calibrate_loopback,
    run_parallel_many,
    run_single,
)

DEVICE = "cpu-loopback-gloo"
LINK = "loopback"


@dataclass(frozen=True)
class Row:
    """One setting, medians over repeats (seconds)."""

    setting: str
    tpot_s: float
    comm_rank0_s: float
    comm_rank1_s: float
    compute_rank0_s: float
    compute_rank1_s: float
    measured_comm_s: float
    link_s: float
    wait_s: float
    token_hop_s: float
    model_comm_s: float
    model_comm_live_s: float
    model_wait_s: float
    collectives: int
    tokens_equal: bool
    max_abs_logit_diff: float
    max_rel_logit_diff: float


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _compare(run: ParallelRun, ref: ParallelRun) -> tuple[bool, float, float]:
    diffs = [float((a - b).abs().max()) for a, b in zip(run.logits, ref.logits, strict=True)]
    scale = max(float(b.abs().max()) for b in ref.logits)
    return run.tokens == ref.tokens, max(diffs), max(diffs) / scale


def _measured_comm(setting: str, run: ParallelRun) -> float:
    """One run's communication per decode step as the main table measures it (NaN when the
    setting overlaps it with compute)."""
    if setting.startswith("TP"):
        return run.comm_per_step_s(0)
    if setting.endswith("1 micro-batch"):
        return run.pp_critical_comm_s
    return float("nan")


def effects_table(
    singles: list[ParallelRun], groups: dict[str, tuple[list[ParallelRun], float, float]]
) -> list[dict[str, object]]:
    """Print each split's TPOT against the single process as the experiment module judges it
    (Mann-Whitney over the runs: the single runs come before the group's, so runs are not
    paired) and its measured communication per step over the runs next to the model's term;
    return the same as records."""
    print(
        "\n| setting | TPOT vs single: ratio, interval | verdict | measured comm per step ms: "
        "median [min, max] over runs | model comm term ms | error of the model at the median "
        "[at the max, at the min] |\n|---|---|---|---|---|---|"
    )
    out: list[dict[str, object]] = []
    for name, (rs, model_comm, live_comm) in groups.items():
        ch = judge_metric(
            [r.tpot_s for r in singles], [r.tpot_s for r in rs], "lower", metric="tpot_s"
        )
        comm = sorted(c for c in (_measured_comm(name, r) for r in rs) if c == c)
        model = live_comm if live_comm == live_comm else model_comm
        row: dict[str, object] = {
            "setting": name,
            "tpot_ratio": ch.ratio,
            "ci": ch.ci,
            "ci_level": ch.ci_level,
            "verdict": ch.verdict,
            "method": ch.method,
            "comm_per_run_s": comm,
            "model_comm_s": model,
        }
        out.append(row)
        ratio = "–" if ch.ratio is None else f"{ch.ratio:.2f}x {ch.interval_text()}"
        if not comm:
            print(f"| {name} | {ratio} | {ch.verdict} | (overlapped) | {model * 1e3:.3f} | – |")
            continue
        med = statistics.median(comm)
        cover = 1 - 2 * 0.5 ** len(comm)  # chance that [min, max] of n runs holds the median
        print(
            f"| {name} | {ratio} | {ch.verdict} | {med * 1e3:.3f} [{comm[0] * 1e3:.3f}, "
            f"{comm[-1] * 1e3:.3f}] ({100 * cover:.0f}% for the median, {len(comm)} runs) "
            f"| {model * 1e3:.3f} | {model / med - 1:+.0%} [{model / comm[-1] - 1:+.0%}, "
            f"{model / comm[0] - 1:+.0%}] |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 1 repeat")
    ap.add_argument("--calibrate", action="store_true", help="measure the loopback link")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model shape")
    ap.add_argument("--runs-dir", default=None, help="write the record under DIR/parallel/")
    a = ap.parse_args()

    if a.calibrate:
        c = calibrate_loopback(reps=40)
        when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        host = f"{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
        print(f"# calibrated {when} on {host}")
        for name, fit in (("send", c.send), ("all-reduce", c.allreduce)):
            print(
                f"# {name}: latency {fit.latency_s * 1e6:.1f} us, "
                f"{fit.bw_bytes_s / 1e9:.3f} GB/s per direction; medians "
                + ", ".join(
                    f"{s} B {t * 1e6:.0f} us"
                    for s, t in zip(fit.sizes_bytes, fit.times_s, strict=True)
                )
            )
        print(
            f'{LINK} = {{ value = {2 * c.allreduce.bw_bytes_s / 1e9:.3f}, unit = "GB/s" }}'
            f'\n{LINK}_latency = {{ value = {c.allreduce.latency_s * 1e6:.1f}, unit = "us" }}'
        )
        return

    cfg = PRESETS[a.preset]
    if a.smoke:
        job = ParallelJob(cfg, batch=2, prompt_len=8, output_len=6, warmup=1)
        repeat = 1
    else:
        job = ParallelJob(cfg, batch=4, prompt_len=32, output_len=32, warmup=3)
        repeat = a.repeat
    pp2 = ParallelJob(**{**asdict(job), "cfg": cfg, "microbatches": 2})
    load0 = os.getloadavg()
    singles = [run_single(job) for _ in range(repeat)]
    plan: list[tuple[Literal["tp", "pp"], ParallelJob]] = [
        ("tp", job),
        ("pp", job),
        ("pp", pp2),
    ] * repeat
    # fork: the ranks start as copies of this process (this script holds no threads)
    group = run_parallel_many(plan, link_reps=2 if a.smoke else 30, start_method="fork")
    runs = group.runs
    load1 = os.getloadavg()
    ref = singles[0]

    dev = resolve_device(DEVICE)
    spec = ModelSpec.from_dict(cfg.model_spec())
    bw = lat = None
    if group.link is not None:  # the link as measured in this group, under this load
        bw, lat = group.link.allreduce.bw_bytes_s, group.link.allreduce.latency_s

    def one(plan: ParallelPlan, batch: int, live: bool) -> ParallelPrediction:
        return predict_parallel(
            spec,
            dev,
            plan,
            batch=batch,
            prompt_len=job.prompt_len,
            output_len=job.output_len,
            link=LINK,
            link_bw_bytes_s=bw if live else None,
            collective_latency_s=lat if live else None,
        )

    def models(live: bool) -> tuple[float, float, float, ParallelPrediction]:
        tp = one(ParallelPlan(tp=2), job.batch, live)
        pp = one(ParallelPlan(pp=2, in_flight=1), job.batch, live)
        pp2 = one(ParallelPlan(pp=2, in_flight=2), job.batch // 2, live)
        return tp.tp_comm_decode_s, pp.pp_comm_decode_s, pp2.pp_comm_decode_s, tp

    tp_c, pp_c, pp2_c, tp_model = models(False)
    live_c = models(True)[:3] if bw is not None else (float("nan"),) * 3
    # the TP term's wait for the slowest rank (from the device file, not the live link)
    tp_wait = tp_model.tp_wait_decode_s

    rows: list[Row] = []
    rows.append(
        Row(
            "single (1 process)",
            _med([r.tpot_s for r in singles]),
            0.0,
            0.0,
            _med([r.tpot_s for r in singles]),
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0,
            True,
            0.0,
            0.0,
        )
    )
    groups = {
        "TP=2": ([r for r in runs if r.mode == "tp"], tp_c, live_c[0]),
        "PP=2, 1 micro-batch": (
            [r for r in runs if r.mode == "pp" and r.microbatches == 1],
            pp_c,
            live_c[1],
        ),
        "PP=2, 2 micro-batches": (
            [r for r in runs if r.mode == "pp" and r.microbatches == 2],
            pp2_c,
            live_c[2],
        ),
    }
    for name, (rs, model_comm, live_comm) in groups.items():
        eq = [_compare(r, ref) for r in rs]
        if name == "TP=2":
            measured = _med([r.comm_per_step_s(0) for r in rs])
        elif name.endswith("1 micro-batch"):
            measured = _med([r.pp_critical_comm_s for r in rs])
        else:  # overlapped: the sends' own time is not separable; blocked time shown
            measured = float("nan")
        if name == "TP=2":
            link = _med([r.tp_split_s()[0] for r in rs])
            wait = _med([r.tp_split_s()[1] for r in rs])
            token = float("nan")
        else:
            link = _med([r.pp_hops_s()[0] for r in rs])
            token = _med([r.pp_hops_s()[1] for r in rs])
            wait = float("nan")
        rows.append(
            Row(
                name,
                _med([r.tpot_s for r in rs]),
                _med([r.comm_per_step_s(0) for r in rs]),
                _med([r.comm_per_step_s(1) for r in rs]),
                _med([r.compute_per_step_s(0) for r in rs]),
                _med([r.compute_per_step_s(1) for r in rs]),
                measured,
                link,
                wait,
                token,
                model_comm,
                live_comm,
                tp_wait if name == "TP=2" else 0.0,
                rs[0].collectives_per_step,
                all(e[0] for e in eq),
                max(e[1] for e in eq),
                max(e[2] for e in eq),
            )
        )

    def ms(v: float) -> str:
        return "–" if v != v else f"{v * 1e3:.3f}"

    base = rows[0].tpot_s
    print(
        f"model {a.preset} ({cfg.n_layers} blocks, d {cfg.hidden_size}, vocab {cfg.vocab_size}), "
        f"batch {job.batch}, prompt {job.prompt_len}, output {job.output_len}, "
        f"{repeat} repeat(s), 1 thread per process; load average {load0[0]:.1f} -> "
        f"{load1[0]:.1f} on {os.cpu_count()} cores\n"
    )
    print(
        "| setting | TPOT p50 ms | vs single | in comm calls per step, rank 0 / 1 ms "
        "| compute per step, rank 0 / 1 ms | measured comm per step ms "
        "| of which link (both ranks in) ms | of which waiting for the other rank ms "
        "| PP token hop back ms | model comm term ms (hwdb entry) "
        "| model comm term ms (link measured now) | of which the model's wait ms "
        "| error vs measured comm | error vs link part | error of the wait "
        "| collectives per step | greedy tokens equal | max abs / rel logit diff |"
    )
    print("|---" * 18 + "|")

    def error(model: float, measured: float) -> str:
        if model == 0 or measured != measured or model != model or measured <= 0:
            return "–"
        return f"{(model - measured) / measured:+.0%}"

    for r in rows:
        now = r.model_comm_live_s if r.model_comm_live_s == r.model_comm_live_s else r.model_comm_s
        # like for like: TP, the model less its wait against the link part; PP, both hops
        # the model counts (hidden state out, token back) against both measured hops
        tp = r.setting.startswith("TP")
        link_model = now - r.model_wait_s if tp else now
        link_meas = r.link_s if tp else r.link_s + r.token_hop_s
        print(
            f"| {r.setting} | {ms(r.tpot_s)} | {r.tpot_s / base:.2f}x "
            f"| {ms(r.comm_rank0_s)} / {ms(r.comm_rank1_s)} "
            f"| {ms(r.compute_rank0_s)} / {ms(r.compute_rank1_s)} | {ms(r.measured_comm_s)} "
            f"| {ms(r.link_s)} | {ms(r.wait_s)} | {ms(r.token_hop_s)} "
            f"| {ms(r.model_comm_s)} | {ms(r.model_comm_live_s)} | {ms(r.model_wait_s)} "
            f"| {error(now, r.measured_comm_s)} | {error(link_model, link_meas)} "
            f"| {error(r.model_wait_s, r.wait_s) if tp else '–'} "
            f"| {r.collectives} | {r.tokens_equal} "
            f"| {r.max_abs_logit_diff:.2g} / {r.max_rel_logit_diff:.2g} |"
        )
    print(
        "\n(errors: the model with the link measured now, or the hwdb entry's when none was "
        "measured, against the measurement; link part: TP, the model less its wait term "
        "against the collectives' time once both ranks are in; PP, the model's two hops "
        "against the hidden-state hop plus the token hop back; the wait: TP, the model's wait "
        "term against the measured wait for the other rank)"
    )
    lk = tp_model.link
    if lk is not None:
        print(
            f"\n- link: {lk.name}, {lk.bw_bytes_s / 1e9:.3g} GB/s per direction, "
            f"{lk.latency_s * 1e6:.3g} us per collective ({lk.source})"
        )
    print(
        f"- TP model: {tp_model.collectives_per_step} all-reduces of "
        f"{tp_model.allreduce_bytes_decode:.0f} B + a logits gather per step"
    )
    per_coll = _med([r.comm_per_step_s(0) for r in groups["TP=2"][0]]) / max(
        groups["TP=2"][0][0].collectives_per_step, 1
    )
    print(f"- TP measured: {per_coll * 1e6:.1f} us per collective inside a decode step")
    if group.link is not None:
        for what, fit in (("send", group.link.send), ("2-rank all-reduce", group.link.allreduce)):
            print(
                f"- link measured in the same group, {what}: latency {fit.latency_s * 1e6:.1f} us,"
                f" {fit.bw_bytes_s / 1e9:.3g} GB/s per direction; p10 of the smallest message "
                f"{fit.p10_times_s[0] * 1e6:.1f} us"
            )
    effects = effects_table(singles, groups)
    record = {
        "schema": "perfscope.parallel-study/1",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cores": os.cpu_count(), "load": [load0, load1]},
        "job": {**asdict(job), "cfg": cfg.to_dict()},
        "repeat": repeat,
        "device": DEVICE,
        "rows": [asdict(r) for r in rows],
        "effects": effects,
        "link": None if group.link is None else asdict(group.link),
    }
    out_dir = Path(a.runs_dir or tempfile.mkdtemp(prefix="perfscope-parallel-")) / "parallel"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = out_dir / f"{stamp}-parallel{'-smoke' if a.smoke else ''}.json"
    path.write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    print(f"- record: `{path}`")


if __name__ == "__main__":
    main()
