"""Study: tensor and pipeline parallelism for real, the reference model split across 2
processes with torch.distributed (gloo over 127.0.0.1), against the single process and
against the cost model's communication term for the same hardware entry
(``cpu-loopback-gloo`` in hwdb, its link calibrated by ``--calibrate``).

Run: `python samples/studies/parallel.py` (a few minutes on 2 cores) or `--smoke`
(seconds after the processes start). `--calibrate` measures the loopback link (ping-pong
and all-reduce over gloo) and prints the lines for the hwdb entry. The write-up with the
measured tables is `parallel.md`.

Every setting runs one process per rank with 1 torch thread (the single process too), so
TP/PP use twice the cores of the baseline. Each round runs every setting once: the single
process and one process group (TP, PP, PP with 2 micro-batches, rotated), the single first
in even rounds and last in odd ones; each figure is the median over rounds of the per-run
median decode step.

`--save [DIR]` also stores the measurement as a `perfscope.study/1` record (knob
`parallel`, settings single / tp=2 / pp=2; default DIR `samples/studies/results`), the
effects paired by round and judged by the experiment module, each next to the parallel
what-if's projection (:func:`study_record`), so `perfscope advisor calibrate` reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from perfscope.analysis.experiment import judge_metric, level_text
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.parallel import ParallelPlan, ParallelPrediction, predict_parallel
from perfscope.analysis.study import Study, build_study
from perfscope.hwdb import resolve_device
from perfscope.hwdb.calibrate import machine_fingerprint
from perfscope.profiler.store import write_json_atomic

if TYPE_CHECKING:  # torch: imported where a run needs it, not by the tables' renderer
    from perfscope.profiler.engines.reference.parallel import ParallelJob, ParallelRun

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


#: The settings the stored study holds, by the name the Markdown table uses.
STUDY_SETTINGS = {"single (1 process)": "single", "TP=2": "tp=2", "PP=2, 1 micro-batch": "pp=2"}


def _run_summary(run: ParallelRun, job: ParallelJob) -> dict[str, object]:
    """The metrics of one run as a study reads them: TTFT = the prefill, TPOT = the median
    decode step, output tokens/s over the prefill and every decode step."""
    e2e = run.prefill_s + sum(run.step_s)
    return {
        "latency": {"ttft": {"p50": run.prefill_s}, "tpot": {"p50": run.tpot_s}},
        "throughput": {"output_tok_s": job.batch * job.output_len / e2e if e2e > 0 else None},
    }


def _ratios(
    spec: ModelSpec,
    dev: object,
    job: ParallelJob,
    plan: ParallelPlan,
    eff: tuple[float, float],
    link: tuple[float, float] | None = None,
) -> dict[str, float]:
    """TTFT, TPOT and throughput of ``plan`` by the parallel what-if, the prefill at
    ``eff[0]`` and the decode at ``eff[1]`` of speed of light; ``link`` (bandwidth B/s,
    latency s): the link as measured beside the runs instead of the hwdb entry's."""
    kw: dict[str, object] = {
        "batch": job.batch,
        "prompt_len": job.prompt_len,
        "output_len": job.output_len,
    }
    if link is not None:
        kw.update(link_bw_bytes_s=link[0], collective_latency_s=link[1])
    pre = predict_parallel(spec, dev, plan, efficiency=eff[0], link=LINK, **kw)  # type: ignore[arg-type]
    dec = predict_parallel(spec, dev, plan, efficiency=eff[1], link=LINK, **kw)  # type: ignore[arg-type]
    e2e = pre.ttft_s + (job.output_len - 1) * dec.tpot_s
    return {
        "ttft_s": pre.ttft_s,
        "tpot_s": dec.tpot_s,
        "throughput_tok_s": job.batch * job.output_len / e2e,
    }


def study_record(
    rounds: list[dict[str, ParallelRun]],
    order: list[tuple[int, int]],
    job: ParallelJob,
    *,
    created_at: str,
    load: tuple[float, float],
    link: tuple[float, float] | None = None,
) -> Study:
    """The measurement as a ``perfscope.study/1`` record: per round one run of each of
    :data:`STUDY_SETTINGS`, effects paired by round (the experiment module's rule, TPOT
    primary), each setting next to the parallel what-if on ``cpu-loopback-gloo`` derated to
    the single process's measured efficiency (prefill and decode apart, from the single
    runs only: the projection never sees a TP or PP run), and its speed of light. ``link``
    (bandwidth B/s, latency s): the loopback link as calibrated in the last round's process
    group, under the runs' load (a measurement of the link, not of a TP or PP run); the
    hwdb entry's otherwise."""
    names = list(STUDY_SETTINGS)
    runs = [
        (r, i, f"round-{r + 1}-{STUDY_SETTINGS[n]}", _run_summary(rounds[r][n], job))
        for r, i in order
        for n in [names[i]]
    ]
    st = build_study(
        "parallel",
        list(STUDY_SETTINGS.values()),
        len(rounds),
        runs,
        batches=[job.batch] * len(names),
        prompt_len=job.prompt_len,
        output_len=job.output_len,
        args={
            "engine": "reference",
            "model_preset": None,
            "model_overrides": job.cfg.to_dict(),
            "batch_size": job.batch,
            "prompt_len": job.prompt_len,
            "output_len": job.output_len,
            "warmup": job.warmup,
            "engine_options": {"threads": str(job.threads), "device": DEVICE},
        },
        created_at=created_at,
        queueing=False,
    )
    dev = resolve_device(DEVICE)
    spec = ModelSpec.from_dict(job.cfg.model_spec())
    single = [rounds[r]["single (1 process)"] for r in range(len(rounds))]
    sol1 = _ratios(spec, dev, job, ParallelPlan(), (1.0, 1.0))
    eff = (
        sol1["ttft_s"] / statistics.median(x.prefill_s for x in single),
        sol1["tpot_s"] / statistics.median(x.tpot_s for x in single),
    )
    plans = {"tp=2": ParallelPlan(tp=2), "pp=2": ParallelPlan(pp=2, microbatches=1, in_flight=1)}
    base, base_sol = _ratios(spec, dev, job, ParallelPlan(), eff), sol1
    keys = {"ttft_p50_s": "ttft_s", "tpot_p50_s": "tpot_s", "output_tok_s": "throughput_tok_s"}
    settings = [st.settings[0]]
    for s in st.settings[1:]:
        cand = _ratios(spec, dev, job, plans[s.value], eff, link)
        sol = _ratios(spec, dev, job, plans[s.value], (1.0, 1.0), link)
        ratios = {k: cand[k] / base[k] for k in cand}
        projection = {
            "ratios": ratios,
            "sol_ratios": {k: sol[k] / base_sol[k] for k in sol},
            "baseline": base,
            "candidate": cand,
            "basis": (
                f"the parallel what-if (analysis/parallel.py) on {DEVICE}, "
                + (
                    f"the link calibrated beside the runs ({link[0] / 1e9:.3g} GB/s, "
                    f"{link[1] * 1e6:.3g} us a collective) and the entry's wait"
                    if link is not None
                    else "its link and wait from the hwdb entry"
                )
                + f", compute derated to the single process's measured efficiency: prefill "
                f"{eff[0]:.3g}, decode {eff[1]:.3g} of speed of light"
            ),
        }
        effects = []
        for e in s.effects:
            key = keys.get(e.metric)
            proj = ratios[key] if key else None
            err = proj / e.change.ratio - 1.0 if proj is not None and e.change.ratio else None
            effects.append(replace(e, projected_ratio=proj, error=err))
        settings.append(replace(s, projection=projection, effects=effects))
    fp = machine_fingerprint("cpu")
    return replace(
        st,
        settings=settings,
        machine={
            "cpu_model": fp.get("cpu_model") or "",
            "cores": fp.get("cores"),
            "gpu_model": None,
            "engine": "reference",
        },
        notes=[
            *st.notes,
            f"load average {load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} cores; 1 torch "
            "thread per process, so TP and PP use twice the single process's cores",
            "rounds: the single process and one process group (TP, PP, PP with 2 "
            "micro-batches) per round, the single first in even rounds, last in odd ones",
        ],
    )


def _measured_comm(setting: str, run: ParallelRun) -> float:
    """One run's communication per decode step as the main table measures it (NaN when the
    setting overlaps it with compute)."""
    if setting.startswith("TP"):
        return run.comm_per_step_s(0)
    if setting.endswith("1 micro-batch"):
        return run.pp_critical_comm_s
    return float("nan")


def effects_of(
    singles: list[ParallelRun], groups: dict[str, tuple[list[ParallelRun], float, float]]
) -> list[dict[str, object]]:
    """Each split's TPOT against the single process as the experiment module judges it
    (Mann-Whitney over the runs: the single runs come before the group's, so runs are not
    paired) and its measured communication per step over the runs next to the model's term,
    as the record's ``effects`` (:func:`effects_markdown` renders them)."""
    out: list[dict[str, object]] = []
    for name, (rs, model_comm, live_comm) in groups.items():
        ch = judge_metric(
            [r.tpot_s for r in singles], [r.tpot_s for r in rs], "lower", metric="tpot_s"
        )
        comm = sorted(c for c in (_measured_comm(name, r) for r in rs) if c == c)
        out.append(
            {
                "setting": name,
                "tpot_ratio": ch.ratio,
                "ci": ch.ci,
                "ci_level": ch.ci_level,
                "verdict": ch.verdict,
                "method": ch.method,
                "comm_per_run_s": comm,
                "model_comm_s": live_comm if live_comm == live_comm else model_comm,
            }
        )
    return out


# ----------------------------------------------------------------- the record's tables
# What the script prints and what ``scripts/rerender_study_tables.py`` writes into a
# ``parallel-tables`` block of the write-up: both render a ``perfscope.parallel-study/1``
# record (the dict the script stores) with these functions, and nothing else.


def _ms(v: float) -> str:
    return "–" if v != v else f"{v * 1e3:.3f}"


def _error(model: float, measured: float) -> str:
    if model == 0 or measured != measured or model != model or measured <= 0:
        return "–"
    return f"{(model - measured) / measured:+.0%}"


def describe(record: Mapping[str, Any]) -> str:
    """The model, workload, repeats and load of a record, in one line."""
    job, m = record["job"], record["machine"]
    cfg = job["cfg"]
    load = m.get("load") or [[float("nan")], [float("nan")]]
    return (
        f"model {cfg['n_layers']} blocks, d {cfg['hidden_size']}, {cfg['n_heads']}/"
        f"{cfg['n_kv_heads']} heads, MLP {cfg['intermediate_size']}, vocab {cfg['vocab_size']}, "
        f"{cfg['dtype']}; batch {job['batch']}, prompt {job['prompt_len']}, output "
        f"{job['output_len']}, {job['warmup']} warm-up steps, {job['threads']} thread(s) per "
        f"process; {record['repeat']} repeat(s); load average {load[0][0]:.1f} -> "
        f"{load[1][0]:.1f} on {m.get('cores')} cores"
    )


def main_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-setting table of a record's ``rows`` (medians over repeats, seconds) and the
    note on its error columns. A record written before the script split the model's wait
    term (rows without ``model_wait_s``) gets the table that script printed: no wait
    columns, its link-part error the whole model term against the TP link part or the PP
    hidden-state hop alone, and a note that says so."""
    split = all("model_wait_s" in r for r in rows)
    cols = [
        "setting",
        "TPOT p50 ms",
        "vs single",
        "in comm calls per step, rank 0 / 1 ms",
        "compute per step, rank 0 / 1 ms",
        "measured comm per step ms",
        "of which link (both ranks in) ms",
        "of which waiting for the other rank ms",
        "PP token hop back ms",
        "model comm term ms (hwdb entry)",
        "model comm term ms (link measured now)",
        *(["of which the model's wait ms"] if split else []),
        "error vs measured comm",
        "error vs link part",
        *(["error of the wait"] if split else []),
        "collectives per step",
        "greedy tokens equal",
        "max abs / rel logit diff",
    ]
    out = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    base = rows[0]["tpot_s"]
    for r in rows:
        live, hwdb = r["model_comm_live_s"], r["model_comm_s"]
        now = live if live == live else hwdb
        tp = str(r["setting"]).startswith("TP")
        wait_model = r.get("model_wait_s", 0.0)
        if split:  # like for like: TP, the model less its wait against the link part; PP,
            # both hops the model counts (hidden state out, token back) against both measured
            link_model = now - wait_model if tp else now
            link_meas = r["link_s"] if tp else r["link_s"] + r["token_hop_s"]
        else:
            link_model, link_meas = now, r["link_s"]
        cells = [
            str(r["setting"]),
            _ms(r["tpot_s"]),
            f"{r['tpot_s'] / base:.2f}x",
            f"{_ms(r['comm_rank0_s'])} / {_ms(r['comm_rank1_s'])}",
            f"{_ms(r['compute_rank0_s'])} / {_ms(r['compute_rank1_s'])}",
            _ms(r["measured_comm_s"]),
            _ms(r["link_s"]),
            _ms(r["wait_s"]),
            _ms(r["token_hop_s"]),
            _ms(hwdb),
            _ms(live),
            *([_ms(wait_model)] if split else []),
            _error(now, r["measured_comm_s"]),
            _error(link_model, link_meas),
            *([_error(wait_model, r["wait_s"]) if tp else "–"] if split else []),
            str(r["collectives"]),
            str(r["tokens_equal"]),
            f"{r['max_abs_logit_diff']:.2g} / {r['max_rel_logit_diff']:.2g}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        "(errors: the model with the link measured now, or the hwdb entry's when none was "
        "measured, against the measurement; "
        + (
            "link part: TP, the model less its wait term against the collectives' time once "
            "both ranks are in; PP, the model's two hops against the hidden-state hop plus the "
            "token hop back; the wait: TP, the model's wait term against the measured wait "
            "for the other rank)"
            if split
            else "this record predates the split of the model's wait term (its rows hold no "
            "`model_wait_s`): its link-part error is the whole model term against the TP "
            "link part, or against the PP hidden-state hop alone, as the script then "
            "printed it)"
        )
    )
    return out


def measured_lines(record: Mapping[str, Any]) -> list[str]:
    """The TP collectives' in-step cost and the link as measured in the same group."""
    out = []
    tp = next((r for r in record["rows"] if str(r["setting"]).startswith("TP")), None)
    if tp is not None:
        per_coll = tp["comm_rank0_s"] / max(int(tp["collectives"]), 1)
        out.append(f"- TP measured: {per_coll * 1e6:.1f} us per collective inside a decode step")
    link = record.get("link")
    if link is not None:
        for what, key in (("send", "send"), ("2-rank all-reduce", "allreduce")):
            fit = link[key]
            out.append(
                f"- link measured in the same group, {what}: latency "
                f"{fit['latency_s'] * 1e6:.1f} us, {fit['bw_bytes_s'] / 1e9:.3g} GB/s per "
                f"direction; p10 of the smallest message {fit['p10_times_s'][0] * 1e6:.1f} us"
            )
    return out


def effects_markdown(effects: Sequence[Mapping[str, Any]]) -> list[str]:
    """The record's ``effects``: each split's TPOT against the single process as judged,
    and its measured communication per step over the runs against the model's term."""
    out = [
        "| setting | TPOT vs single: ratio, interval | verdict | measured comm per step ms: "
        "median [min, max] over runs | model comm term ms | error of the model at the median "
        "[at the max, at the min] |",
        "|---|---|---|---|---|---|",
    ]
    for e in effects:
        name, ratio, ci = e["setting"], e["tpot_ratio"], e["ci"]
        interval = (
            "n/a (too few runs)"
            if ci is None
            else f"[{ci[0]:.3f}, {ci[1]:.3f}]"
            + ("" if e.get("ci_level") is None else f" at {level_text(e['ci_level'])}")
        )
        cell = "–" if ratio is None else f"{ratio:.2f}x {interval}"
        model, comm = e["model_comm_s"], e["comm_per_run_s"]
        if not comm:
            out.append(f"| {name} | {cell} | {e['verdict']} | (overlapped) | {_ms(model)} | – |")
            continue
        med = statistics.median(comm)
        cover = 1 - 2 * 0.5 ** len(comm)  # chance that [min, max] of n runs holds the median
        out.append(
            f"| {name} | {cell} | {e['verdict']} | {med * 1e3:.3f} [{comm[0] * 1e3:.3f}, "
            f"{comm[-1] * 1e3:.3f}] ({100 * cover:.0f}% for the median, {len(comm)} runs) "
            f"| {_ms(model)} | {model / med - 1:+.0%} [{model / comm[-1] - 1:+.0%}, "
            f"{model / comm[0] - 1:+.0%}] |"
        )
    return out


def record_markdown(record: Mapping[str, Any]) -> list[str]:
    """A ``perfscope.parallel-study/1`` record's tables: the per-setting table, the measured
    link, and (records since 2026-12-05 23:23) the effects table."""
    out = [*main_table(record["rows"]), "", *measured_lines(record)]
    if record.get("effects"):
        out += ["", *effects_markdown(record["effects"])]
    return out


def main() -> None:
    from perfscope.profiler.engines.reference.model import PRESETS
    from perfscope.profiler.engines.reference.parallel import (
        ParallelJob,
        calibrate_loopback,
        run_parallel_many,
        run_single,
    )

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 1 repeat")
    ap.add_argument("--calibrate", action="store_true", help="measure the loopback link")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model shape")
    ap.add_argument("--runs-dir", default=None, help="write the record under DIR/parallel/")
    ap.add_argument(
        "--save",
        nargs="?",
        const="samples/studies/results",
        default=None,
        help="also store a perfscope.study/1 record in DIR (samples/studies/results)",
    )
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
    kinds: list[tuple[str, Literal["tp", "pp"], ParallelJob]] = [
        ("TP=2", "tp", job),
        ("PP=2, 1 micro-batch", "pp", job),
        ("PP=2, 2 micro-batches", "pp", pp2),
    ]
    singles: list[ParallelRun] = []
    runs: list[ParallelRun] = []
    by_round: list[dict[str, ParallelRun]] = []
    order: list[tuple[int, int]] = []
    link_cal = None
    for rnd in range(repeat):
        turn = kinds[rnd % 3 :] + kinds[: rnd % 3]
        last = rnd == repeat - 1
        got: dict[str, ParallelRun] = {}
        if rnd % 2 == 0:
            got["single (1 process)"] = run_single(job)
        # fork: the ranks start as copies of this process (this script holds no threads);
        # the link is calibrated in the last round's group, under the runs' load
        group = run_parallel_many(
            [(m, j) for _, m, j in turn],
            link_reps=(2 if a.smoke else 30) if last else 0,
            start_method="fork",
        )
        got.update({name: r for (name, _, _), r in zip(turn, group.runs, strict=True)})
        if rnd % 2 == 1:
            got["single (1 process)"] = run_single(job)
        link_cal = group.link or link_cal
        singles.append(got["single (1 process)"])
        runs.extend(group.runs)
        by_round.append(got)
        names = list(STUDY_SETTINGS)
        seq = ["single (1 process)"] + [n for n, _, _ in turn]
        if rnd % 2 == 1:
            seq = seq[1:] + seq[:1]
        order.extend((rnd, names.index(n)) for n in seq if n in STUDY_SETTINGS)
    load1 = os.getloadavg()
    ref = singles[0]

    dev = resolve_device(DEVICE)
    spec = ModelSpec.from_dict(cfg.model_spec())
    bw = lat = None
    if link_cal is not None:  # the link as measured in the last group, under this load
        bw, lat = link_cal.allreduce.bw_bytes_s, link_cal.allreduce.latency_s

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

    record: dict[str, Any] = {
        "schema": "perfscope.parallel-study/1",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cores": os.cpu_count(), "load": [load0, load1]},
        "job": {**asdict(job), "cfg": cfg.to_dict()},
        "repeat": repeat,
        "device": DEVICE,
        "rows": [asdict(r) for r in rows],
        "link": None if link_cal is None else asdict(link_cal),
        "effects": effects_of(singles, groups),
    }
    print(f"preset {a.preset}: {describe(record)}\n")
    print("\n".join(main_table(record["rows"])))
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
    print("\n".join(measured_lines(record)))
    print("\n" + "\n".join(effects_markdown(record["effects"])))
    out_dir = Path(a.runs_dir or tempfile.mkdtemp(prefix="perfscope-parallel-")) / "parallel"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = out_dir / f"{stamp}-parallel{'-smoke' if a.smoke else ''}.json"
    path.write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    print(f"- record: `{path}`")
    if a.save is not None:
        st = study_record(
            by_round,
            order,
            job,
            created_at=record["created_at"],
            load=(load0[0], load1[0]),
            link=None if bw is None or lat is None else (bw, lat),
        )
        target = Path(a.save) / f"{stamp}-study-parallel{'-smoke' if a.smoke else ''}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(target, replace(st, path=str(target)).to_dict())
        print(f"- study record: `{target}`")
        for s in st.settings[1:]:
            for e in s.effects:
                if e.metric in ("ttft_p50_s", "tpot_p50_s", "output_tok_s"):
                    print(
                        f"  - {s.value} {e.metric}: measured {e.change.ratio:.3g}x "
                        f"{e.change.interval_text()}, projected {e.projected_ratio:.3g}x"
                    )


if __name__ == "__main__":
    main()
